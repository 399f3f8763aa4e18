"""RFC 3339 timestamps: one reader and one writer for the whole app.

Kubernetes writes ``metav1.Time`` as RFC 3339 with second precision (``2026-12-03T08:00:00Z``) and
``MicroTime`` with microseconds; ARM writes ISO 8601 with an offset. Both parse here, through
msgspec (which implements RFC 3339), and are remembered in a small bounded cache because the
conditions of a node, and the nodes of a pool, share most of their transition times.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

_CACHE_MAX = 4096
_cache: dict[str, float | None] = {}


def rfc3339_seconds(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp, or None when ``text`` is not one."""
    found = _cache.get(text, _cache)
    if found is not _cache:
        return found  # type: ignore[return-value]
    try:
        moment = msgspec.convert(text, datetime)
        value: float | None = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    except (msgspec.ValidationError, ValueError, OverflowError, TypeError):
        value = None
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()  # a crude bound: the next pages re-fill what they use
    _cache[text] = value
    return value


def parse_time(value: Any) -> float | None:
    """Epoch seconds of a stored or wire timestamp: a number passes through, text is RFC 3339, else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return rfc3339_seconds(str(value))


def iso(ts: float, *, micro: bool = False) -> str:
    """RFC 3339 in UTC with a ``Z``: seconds (``metav1.Time``) or microseconds (``metav1.MicroTime``)."""
    moment = datetime.fromtimestamp(ts, tz=UTC)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

"""What fleetctl prints: tables for people, JSON and YAML for scripts, times in RFC 3339 everywhere.

Output formats follow kubectl's ``-o``: ``table`` (the default: fixed width, long text cut at a word
with "…"), ``wide`` (the same columns and more, nothing cut), ``json`` and ``yaml`` (every field, times
as RFC 3339 UTC strings, keys sorted). No colours: it pipes cleanly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

FORMATS = ("table", "wide", "json", "yaml")


def rfc3339(epoch: float | int | None) -> str:
    """``2026-12-05T01:02:03Z`` (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if epoch else ""


def when(epoch: float | None) -> str:
    return rfc3339(epoch) or "-"


def short(text: Any, limit: int = 60, *, wide: bool = False) -> str:
    """``text`` on one line; cut at a word boundary (with "…") beyond ``limit`` unless ``wide``."""
    value = "" if text is None else " ".join(str(text).split())
    if wide or len(value) <= limit:
        return value
    cut = value[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header], *[[("-" if c in (None, "") else str(c)) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _is_time_key(key: str) -> bool:
    return key == "at" or key.endswith("_at")


def structured(value: Any, key: str = "") -> Any:
    """``value`` for JSON/YAML: epoch seconds under ``*_at`` / ``at`` keys become RFC 3339 strings."""
    if isinstance(value, Mapping):
        return {str(k): structured(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [structured(v) for v in value]
    if _is_time_key(key) and isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return rfc3339(value)
    return value


def as_json(value: Any) -> str:
    return json.dumps(structured(value), indent=2, sort_keys=True, default=str)


def as_yaml(value: Any) -> str:
    import yaml

    return yaml.safe_dump(json.loads(as_json(value)), sort_keys=True, allow_unicode=True).rstrip()


def output(value: Any, fmt: str, text: Callable[[bool], str]) -> str:
    """``value`` in format ``fmt``; ``text(wide)`` draws the table."""
    if fmt == "json":
        return as_json(value)
    if fmt == "yaml":
        return as_yaml(value)
    return text(fmt == "wide")

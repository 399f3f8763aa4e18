"""host.json, read the way the Functions host reads it (queue options, functionTimeout).

Defaults are the documented ones for the Storage queues extension 5.x: batchSize 16 (at most 32),
newBatchThreshold batchSize/2 (what Consumption and Flex use), maxDequeueCount 5, visibilityTimeout
0, maxPollingInterval 1 minute (at least 100 ms), messageEncoding base64.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TIMESPAN = re.compile(r"^(?:(?P<days>\d+)\.)?(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2}(?:\.\d+)?)$")


class HostJsonError(ValueError):
    """host.json holds a value the host would refuse."""


def timespan(value: Any, *, what: str) -> float:
    """Seconds in a .NET TimeSpan string (``[d.]hh:mm:ss[.fff]``); ``-1`` means unbounded."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if text == "-1":
        return -1.0
    match = _TIMESPAN.match(text)
    if not match:
        raise HostJsonError(f"host.json {what} must be a TimeSpan like 00:00:30, got {value!r}")
    days = int(match.group("days") or 0)
    return days * 86400 + int(match.group("h")) * 3600 + int(match.group("m")) * 60 + float(match.group("s"))


@dataclass(frozen=True)
class QueueOptions:
    batch_size: int = 16
    new_batch_threshold: int = 8
    max_dequeue_count: int = 5
    visibility_timeout_s: float = 0.0
    max_polling_interval_s: float = 60.0
    message_encoding: str = "base64"


@dataclass(frozen=True)
class HostConfig:
    queues: QueueOptions = QueueOptions()
    function_timeout_s: float | None = 1800.0  # Flex Consumption's default; None = unbounded


def parse(document: dict[str, Any]) -> HostConfig:
    """Read the parts of host.json the local host honours."""
    if document.get("version") not in (None, "2.0"):
        raise HostJsonError(f"host.json version must be '2.0', got {document.get('version')!r}")
    raw = ((document.get("extensions") or {}).get("queues")) or {}
    batch = int(raw.get("batchSize", 16))
    if not 1 <= batch <= 32:
        raise HostJsonError(f"host.json extensions.queues.batchSize must be 1..32, got {batch}")
    threshold = int(raw.get("newBatchThreshold", batch // 2))
    if threshold < 0:
        raise HostJsonError(f"host.json extensions.queues.newBatchThreshold must be >= 0, got {threshold}")
    max_dequeue = int(raw.get("maxDequeueCount", 5))
    if max_dequeue < 1:
        raise HostJsonError(f"host.json extensions.queues.maxDequeueCount must be >= 1, got {max_dequeue}")
    visibility = timespan(raw.get("visibilityTimeout", "00:00:00"), what="extensions.queues.visibilityTimeout")
    polling = timespan(raw.get("maxPollingInterval", "00:01:00"), what="extensions.queues.maxPollingInterval")
    if polling < 0.1:
        raise HostJsonError("host.json extensions.queues.maxPollingInterval must be at least 00:00:00.100")
    encoding = str(raw.get("messageEncoding", "base64")).lower()
    if encoding not in ("base64", "none"):
        raise HostJsonError(f"host.json extensions.queues.messageEncoding must be base64 or none, got {encoding!r}")
    timeout_raw = document.get("functionTimeout")
    timeout: float | None = 1800.0
    if timeout_raw is not None:
        timeout = timespan(timeout_raw, what="functionTimeout")
        if timeout < 0:
            timeout = None
    return HostConfig(
        queues=QueueOptions(batch_size=batch, new_batch_threshold=threshold, max_dequeue_count=max_dequeue,
                            visibility_timeout_s=max(0.0, visibility), max_polling_interval_s=polling,
                            message_encoding=encoding),
        function_timeout_s=timeout,
    )


def load(path: str | Path | None) -> HostConfig:
    """host.json at ``path`` (defaults when None)."""
    if path is None:
        return HostConfig()
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise HostJsonError(f"{path} is not valid JSON: {error}") from None
    return parse(document)

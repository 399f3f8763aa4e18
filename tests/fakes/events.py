"""EventsPort in memory: keeps what was published, and can be told to fail the next calls."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from typing import Any


class RecordingEvents:
    """EventsPort that keeps what was published (for tests); can be told to fail the next calls."""

    def __init__(self, *, source: str = "/gpu-fleet-steward") -> None:
        self.source = source
        self.published: list[dict[str, Any]] = []
        self.failures: list[Exception] = []
        self._lock = threading.Lock()

    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        with self._lock:
            if self.failures:
                raise self.failures.pop(0)
            self.published.append({"id": id_ or str(uuid.uuid4()), "source": self.source, "type": type_,
                                   "subject": subject, "data": dict(data)})

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.published if e["type"] == type_]

    def types(self) -> list[str]:
        with self._lock:
            return [e["type"] for e in self.published]

    def clear(self) -> None:
        with self._lock:
            self.published.clear()

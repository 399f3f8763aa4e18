"""EventsPort in memory: keeps each CloudEvent it was given, and can be told to fail the next calls."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from typing import Any

SOURCE = "/gpu-fleet-steward"


class RecordingEvents:
    """EventsPort that keeps what was published, as dicts shaped like the CloudEvent the adapter sends
    (``id``, ``source``, ``type``, ``subject``, ``data``); ``failures`` are raised by the next calls, in order."""

    def __init__(self, *, source: str = SOURCE) -> None:
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

    def delivered(self, type_: str) -> list[dict[str, Any]]:
        """The published events of ``type_`` as Event Grid delivers them: CloudEvents 1.0
        (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md), what a handler receives."""
        return [{"specversion": "1.0", **e} for e in self.of_type(type_)]

    def clear(self) -> None:
        with self._lock:
            self.published.clear()

"""The simulator's tiny HTTP layer: one request/response shape shared by every simulated service.

Each service (ARM, the Kubernetes API servers, Event Grid, managed identity, the control API) is a
:class:`Handler`; :mod:`sim.core.server` owns the sockets and TLS and dispatches on the path prefix.
Handlers never touch sockets, so they are tested by calling ``handle`` directly, and a fault (a
delay, a dropped connection) is just a field of the :class:`Response`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit


class Headers(dict[str, str]):
    """Case-insensitive header map (keys stored lower-case)."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__()
        for k, v in dict(items).items():
            self[k] = v

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key.lower(), value)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


@dataclass
class Request:
    method: str
    target: str  # raw request target: path + query
    headers: Headers
    body: bytes = b""
    path: str = ""
    query: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = urlsplit(self.target)
        if not self.path:
            self.path = parts.path
        if not self.query:
            self.query = parse_qs(parts.query, keep_blank_values=True)

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    def json(self) -> Any:
        """The body as JSON; raises ValueError on malformed input (handlers answer 400)."""
        if not self.body:
            return None
        return json.loads(self.body)

    @property
    def bearer(self) -> str | None:
        auth = self.headers.get("authorization") or ""
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return None


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # answer this much later (a slow server)
    drop: bool = False  # close the connection without answering

    @classmethod
    def json(cls, status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        return cls(status=status, body=body, headers=h)

    @classmethod
    def arm_error(cls, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
        """ARM's error shape: ``{"error": {"code": ..., "message": ...}}``."""
        return cls.json(status, {"error": {"code": code, "message": message}}, headers)

    @classmethod
    def aks_error(cls, status: int, code: str, message: str, headers: dict[str, str] | None = None, *,
                  target: str | None = None) -> Response:
        """The AKS resource provider's own error shape, flat: ``{"code", "message", "target"?, "subcode": "",
        "details": null}`` (sim.arm.common.AksError documents the source)."""
        payload: dict[str, Any] = {"code": code, "message": message}
        if target:
            payload["target"] = target
        payload.update({"subcode": "", "details": None})
        return cls.json(status, payload, headers)

    @classmethod
    def kube_status(cls, status: int, reason: str, message: str, details: dict[str, Any] | None = None) -> Response:
        """Kubernetes' ``Status`` object, as the API server answers errors."""
        payload: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": status,
        }
        if details:
            payload["details"] = details
        return cls.json(status, payload)


class Handler(Protocol):
    def handle(self, request: Request) -> Response: ...

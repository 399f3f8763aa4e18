"""The API server's errors: a Status body with the real code, reason, message and details.
"""

from __future__ import annotations

import json
from typing import Any

from sim.core.http import Response


class ApiError(Exception):
    """An error the API server answers with a Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None, list_meta: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details, self.headers = code, reason, message, details, headers
        self.list_meta = list_meta

    def response(self) -> Response:
        r = Response.kube_status(self.code, self.reason, self.message, self.details)
        if self.list_meta:  # Status.metadata is a ListMeta (e.g. the continue token of an expired list)
            payload = json.loads(r.body)
            payload["metadata"] = self.list_meta
            r = Response.json(self.code, payload)
        r.headers.update(self.headers or {})
        return r


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    """404 NotFound for one named object (apimachinery pkg/api/errors NewNotFound)."""
    qual = f"{resource}.{group}" if group else resource
    return ApiError(404, "NotFound", f'{qual} "{name}" not found',
                    {"name": name, "group": group, "kind": resource})


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]], group: str = "") -> ApiError:
    """422 Invalid with one cause per (field, message, reason), as apimachinery NewInvalid builds it."""
    msg = "; ".join(f"{f}: {m}" for f, m, _r in causes)
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {msg}',
                    {"name": name, "group": group, "kind": kind,
                     "causes": [{"reason": r, "message": m, "field": f} for f, m, r in causes]})


def conflict(key: str, name: str, group: str) -> ApiError:
    """409 Conflict for a write with a stale resourceVersion (apimachinery NewConflict, with the
    registry's OptimisticLockErrorMsg)."""
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {key} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": group, "kind": key.split(".", 1)[0]})

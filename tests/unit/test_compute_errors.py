"""shared.adapters.compute maps VM action errors by ARM's error code, never by message text."""

from __future__ import annotations

import json

import pytest

from shared.adapters import compute
from shared.kernel.errors import Conflict, Forbidden, Invalid, NotFound, Throttled, Transient


class _Response:
    def __init__(self, status: int, code: str, message: str = "whatever the text says") -> None:
        self.status_code = status
        self.headers: dict[str, str] = {}
        self.reason = "reason"
        self.content_type = "application/json"
        self._body = json.dumps({"error": {"code": code, "message": message}})

    def text(self, encoding: str | None = None) -> str:
        return self._body

    def body(self) -> bytes:
        return self._body.encode()

    def json(self) -> object:
        return json.loads(self._body)


def _raise(status: int, code: str, message: str = "whatever the text says") -> None:
    from azure.core.exceptions import HttpResponseError

    raise HttpResponseError(message="boom", response=_Response(status, code, message))


CASES = [
    ("lockdown deny assignment", 403, "DenyAssignmentAuthorizationFailed", compute.VmActionDenied),
    ("missing role", 403, "AuthorizationFailed", compute.VmActionDenied),
    ("policy deny", 403, "RequestDisallowedByPolicy", compute.VmActionDenied),
    ("deallocated VM, however worded", 409, "OperationNotAllowed", compute.VmActionImpossible),
    ("another 409 stays a conflict", 409, "Conflict", Conflict),
    ("throttled", 429, "TooManyRequests", Throttled),
    ("server error", 500, "InternalServerError", Transient),
    ("gone", 404, "NotFound", NotFound),
]


@pytest.mark.parametrize(("status", "code", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_vm_action_errors_map_by_code(status: int, code: str, expected: type[Exception]) -> None:
    with pytest.raises(expected) as raised:
        compute._call_compute(lambda: _raise(status, code, "Operation 'restart' is not allowed"), what="restart vm")
    if expected in (compute.VmActionDenied, compute.VmActionImpossible):
        assert raised.value.code == code  # type: ignore[attr-defined]


def test_denied_and_impossible_stay_their_base_types_for_older_callers() -> None:
    assert issubclass(compute.VmActionDenied, Forbidden) and issubclass(compute.VmActionImpossible, Invalid)

"""Kubernetes answers become specific error types by status and Status causes, never by message text.

A 401 is :class:`Unauthorized`, and the client answers it with one fresh token and one more try (a
token revoked early), not more; a 403 whose ``details.causes`` say ``NamespaceTerminating`` (the
NamespaceLifecycle admission plugin) is :class:`NamespaceTerminating`; any other 403 is a plain
:class:`Forbidden` (RBAC), whatever its message says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from shared.adapters.kube.errors import map_kube_error
from shared.kernel.errors import Forbidden, NamespaceTerminating, Unauthorized
from tests.fakes.kube_client import offline_kube_client

kubernetes = pytest.importorskip("kubernetes")

UNAUTHORIZED_401 = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "Unauthorized",
                    "reason": "Unauthorized", "code": 401}
TERMINATING_403 = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'jobs "probe" is forbidden: unable to create new content in namespace gpu-fleet-steward because it '
               "is being terminated",
    "details": {"name": "probe", "kind": "jobs",
                "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                            "message": "namespace gpu-fleet-steward is being terminated"}]}}
# An RBAC refusal whose message happens to mention termination: the cause decides, not the words.
RBAC_403 = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": 'nodes "n1" is forbidden: User "x" cannot patch resource "nodes" (namespace is being terminated)',
            "details": {"name": "n1", "kind": "nodes"}}


def _api_error(status: int, body: Mapping[str, Any]) -> Exception:
    from kubernetes.client.exceptions import ApiException

    error = ApiException(status=status, reason=str(body.get("reason")))
    error.body = json.dumps(body).encode()
    error.headers = {}
    return error


@pytest.mark.parametrize(("status", "body", "expected", "not_expected"), [
    (401, UNAUTHORIZED_401, Unauthorized, NamespaceTerminating),
    (403, TERMINATING_403, NamespaceTerminating, Unauthorized),
], ids=["401", "403-namespace-terminating"])
def test_a_refusal_is_typed_by_status_and_cause(status: int, body: Mapping[str, Any], expected: type,
                                                not_expected: type) -> None:
    mapped = map_kube_error(_api_error(status, body), what="create job probe")
    assert isinstance(mapped, expected) and isinstance(mapped, Forbidden)
    assert not isinstance(mapped, not_expected)


def test_an_rbac_403_is_plain_forbidden_whatever_its_message_says() -> None:
    mapped = map_kube_error(_api_error(403, RBAC_403), what="patch node n1")
    assert type(mapped) is Forbidden


class _Core:
    """``read_node`` answers the queued errors first, then a node; counts the calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def read_node(self, name: str, **_: Any) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)

        class _Raw:
            data = json.dumps({"metadata": {"name": name, "uid": "u1", "resourceVersion": "1"}}).encode()

        return _Raw()


def _client(core: _Core) -> tuple[Any, list[int]]:
    client = offline_kube_client(core=core, retry_attempts=4)
    invalidated: list[int] = []
    client._tokens.invalidate = lambda: invalidated.append(core.calls)
    return client, invalidated


def test_a_401_gets_one_fresh_token_and_one_more_try() -> None:
    core = _Core(_api_error(401, UNAUTHORIZED_401))
    client, invalidated = _client(core)
    node = client.get_node("n1")
    assert node is not None and node.name == "n1"
    assert core.calls == 2 and invalidated == [1]


def test_a_second_401_is_raised_and_a_403_is_never_retried() -> None:
    core = _Core(_api_error(401, UNAUTHORIZED_401), _api_error(401, UNAUTHORIZED_401))
    client, invalidated = _client(core)
    with pytest.raises(Unauthorized):
        client.get_node("n1")
    assert core.calls == 2 and invalidated == [1]

    core = _Core(_api_error(403, RBAC_403))
    client, invalidated = _client(core)
    with pytest.raises(Forbidden):
        client.get_node("n1")
    assert core.calls == 1 and invalidated == []

"""An expired ``continue`` token (410 Expired) restarts a paginated list from scratch.

A real API server keeps a paginated list's revision only until etcd is compacted (every 5 minutes by
default, kube-apiserver ``--etcd-compaction-interval``); a page asked for after that gets 410 with
reason ``Expired`` (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/storage/etcd3/errors.go).
Retrying the same token can never succeed: the list must start again without it. Faked here: the
server's answers (the exact bodies a real server sends), fed to the real ``KubeClient`` page loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from shared.kernel.errors import Transient
from tests.fakes.kube_client import offline_kube_client

EXPIRED_410 = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
    "metadata": {"continue": "eyJydiI6LTF9"},
    "message": "The provided continue parameter is too old to display a consistent list result. You can start a new "
               "list without the continue parameter, or use the continue token in this response to retrieve the "
               "remainder of the results. Continuing with the provided token results in an inconsistent list - "
               "objects that were created, modified, or deleted between the time the first chunk was returned and "
               "now may show up in the list."}


def _api_error(status: int, body: Mapping[str, Any]) -> Exception:
    from kubernetes.client.exceptions import ApiException

    error = ApiException(status=status, reason=str(body.get("reason")))
    error.body = json.dumps(body).encode()
    error.headers = {}
    return error


def _page(kind: str, names: list[str], token: str, rv: str) -> bytes:
    items = [{"metadata": {"name": n, "namespace": "default", "uid": f"uid-{n}-{rv}", "resourceVersion": rv}}
             for n in names]
    return json.dumps({"kind": kind, "metadata": {"continue": token, "resourceVersion": rv}, "items": items}).encode()


class _Server:
    """Answers list pages by continue token; the tokens in ``expire`` get 410 Expired, every time (as on a
    real server: an expired revision never comes back). ``lists[i]`` is what the i-th fresh list sees."""

    def __init__(self, kind: str, *, lists: list[list[str]], page: int, expire: set[str]) -> None:
        self.kind, self.lists, self.page, self.expire = kind, lists, page, expire
        self.requests: list[str] = []
        self.generation = 0  # which of ``lists`` a fresh list (no token) serves next

    def answer(self, token: str) -> bytes:
        self.requests.append(token)
        if token in self.expire:
            raise _api_error(410, EXPIRED_410)
        if not token:
            gen = min(self.generation, len(self.lists) - 1)
            self.generation += 1
            offset = 0
        else:
            gen_s, offset_s = token.split(":")
            gen, offset = int(gen_s), int(offset_s)
        names = self.lists[gen][offset:offset + self.page]
        end = offset + self.page
        next_token = f"{gen}:{end}" if end < len(self.lists[gen]) else ""
        return _page(self.kind, names, next_token, str(1000 + gen))


def _client(*, get_json: Callable[[str, Mapping[str, Any]], bytes] | None = None, core: Any = None) -> Any:
    return offline_kube_client(core=core, get_json=get_json)


def _node_client(server: _Server) -> Any:
    def get_json(path: str, query: Mapping[str, Any]) -> bytes:
        assert path == "/api/v1/nodes"
        return server.answer(str(query.get("continue") or ""))

    return _client(get_json=get_json)


class _Core:
    def __init__(self, server: _Server) -> None:
        self.server = server

    def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
        return _Raw(self.server.answer(kw.get("_continue") or ""))

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
        return _Raw(self.server.answer(kw.get("_continue") or ""))


class _Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data


def test_an_expired_token_restarts_the_node_list_and_hands_over_each_node_once() -> None:
    # the list starts at revision 1000 (n1..n5); the third page's token expires; the new list (revision
    # 1001) has lost n2 and gained n0 and n6
    server = _Server("NodeList", lists=[["n1", "n2", "n3", "n4", "n5"], ["n0", "n1", "n3", "n4", "n5", "n6"]],
                     page=2, expire={"0:4"})
    nodes = list(_node_client(server).list_nodes(page_size=2))
    names = [n.name for n in nodes]
    assert sorted(names) == ["n0", "n1", "n2", "n3", "n4", "n5", "n6"]
    assert len(names) == len(set(names)), "a node handed over before the restart is not handed over again"
    assert server.requests == ["", "0:2", "0:4", "", "1:2", "1:4"], "the restart lists without the old token"
    # the nodes handed over before the restart are the ones seen then (revision 1000), the rest are new
    assert {n.name: n.resource_version for n in nodes}["n1"] == "1000"
    assert {n.name: n.resource_version for n in nodes}["n5"] == "1001"


def test_a_consumer_that_counts_while_it_iterates_counts_each_node_once() -> None:
    # the sweep counts every node it is handed (report.nodes += 1) and evaluates them page by page
    server = _Server("NodeList", lists=[[f"n{i:02d}" for i in range(9)]] * 2, page=3, expire={"0:6"})
    counted = 0
    for _node in _node_client(server).list_nodes(page_size=3):
        counted += 1
    assert counted == 9


def test_an_expired_token_restarts_the_pod_list_from_scratch() -> None:
    server = _Server("PodList", lists=[["a", "b", "c", "d"], ["a", "c", "d", "e"]], page=2, expire={"0:2"})
    pods = _client(core=_Core(server)).list_pods(node_name="n1", page_size=2)
    assert [p.name for p in pods] == ["a", "c", "d", "e"], "one consistent list: the restarted one, nothing older"
    assert server.requests == ["", "0:2", "", "1:2"]


def test_a_list_whose_token_keeps_expiring_gives_up_as_transient_after_bounded_restarts() -> None:
    server = _Server("NodeList", lists=[["n1", "n2", "n3"]], page=1, expire={"0:1"})
    with pytest.raises(Transient, match="expired"):
        list(_node_client(server).list_nodes(page_size=1))
    assert 2 <= server.requests.count("") <= 5, "a bounded number of fresh starts, never a loop"
    assert server.requests.count("0:1") == server.requests.count(""), "the expired token is never retried as is"


def test_a_410_without_a_token_is_not_a_restart_but_a_transient_error() -> None:
    server = _Server("PodList", lists=[["a"]], page=1, expire={""})
    with pytest.raises(Transient):
        _client(core=_Core(server)).list_pods(namespace="default")

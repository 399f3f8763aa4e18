"""The control API (sim/core/control.py) in-process: its endpoint index lists every endpoint it serves, and every
endpoint that takes a ``cluster`` answers an unknown one with the same 404."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.core.control import ControlApi
from sim.core.http import Headers, Request
from sim.model import Fleet, SimClock
from sim.scenario import add_pool


def api() -> ControlApi:
    fleet = Fleet(seed=3, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0), timings={"node_ready_s": 1})
    cluster = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    with fleet.lock:
        add_pool(cluster, {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1})
    fleet.advance(2)
    return ControlApi(fleet)


def call(control: ControlApi, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    raw = b"" if body is None else json.dumps(body).encode()
    resp = control.handle(Request(method, path, Headers({"Content-Type": "application/json"}), raw))
    return resp.status, json.loads(resp.body)


def test_the_index_lists_the_rbac_and_kubelet_endpoints() -> None:
    status, index = call(api(), "GET", "/_sim")
    assert status == 200
    assert {"/_sim/rbac", "/_sim/kubelet", "/_sim/lock", "/_sim/spot-evict"} <= set(index["endpoints"])


@pytest.mark.parametrize(("path", "body"), [
    ("/_sim/workloads", {"workload": {"kind": "Pod", "name": "p"}}),
    ("/_sim/spot-evict", {"node": "n"}),
    ("/_sim/kubelet", {"node": "n", "ready": False}),
    ("/_sim/lock", {"locked": True}),
], ids=["workloads", "spot-evict", "kubelet", "lock"])
def test_an_unknown_cluster_is_a_404_naming_it_on_every_endpoint(path: str, body: dict[str, Any]) -> None:
    status, answer = call(api(), "POST", path, {"cluster": "nope", **body})
    assert (status, answer["error"]["message"]) == (404, "no cluster 'nope'")


def test_a_cluster_is_found_by_name_or_by_id() -> None:
    control = api()
    cluster = next(iter(control.fleet.clusters.values()))
    for ref in ("c", cluster.id.upper()):
        status, answer = call(control, "POST", "/_sim/lock", {"cluster": ref, "locked": True})
        assert (status, answer["cluster"], answer["locked"]) == (200, "c", True)

"""GPUs a node's device plugin does not (or no longer) advertise (sim/kube/gpu_faults.py), in-process.

A GPU off the bus leaves ``capacity`` and drops from ``allocatable`` (the kubelet's device manager); a
reboot finds it again when the fault says so, never otherwise; a new node can come up without
``nvidia.com/gpu`` at all, through reboots, until it is replaced.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.core.control import ControlApi
from sim.core.http import Headers, Request
from sim.model import Fleet, SimClock
from sim.scenario import add_pool

MANAGED = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}


def api() -> ControlApi:
    fleet = Fleet(seed=7, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 1, "restart_s": 10, "reimage_s": 20})
    cluster = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    with fleet.lock:
        add_pool(cluster, {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1})
        add_pool(cluster, {"name": "four", "vmSize": "Standard_NC64as_T4_v3", "count": 1, "gpuProfile": MANAGED})
        add_pool(cluster, {"name": "mig", "vmSize": "Standard_NC24ads_A100_v4", "count": 1,
                           "gpuProfile": {**MANAGED, "nvidia": {**MANAGED["nvidia"], "migStrategy": "Mixed",
                                                                "migProfiles": ["MIG1g"]}}})
    fleet.advance(2)
    return ControlApi(fleet)


def call(control: ControlApi, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    resp = control.handle(Request("POST", path, Headers({"Content-Type": "application/json"}), json.dumps(body).encode()))
    return resp.status, json.loads(resp.body)


def gpus(control: ControlApi, node: str) -> tuple[str | None, str | None]:
    status = next(iter(control.fleet.clusters.values())).nodes[node].obj["status"]
    return status["capacity"].get("nvidia.com/gpu"), status["allocatable"].get("nvidia.com/gpu")


@pytest.mark.parametrize(("fixed_by", "after_restart"), [("restart", ("4", "4")), ("replace", ("4", "3"))],
                         ids=["a reboot finds it again", "a GPU lost for good stays lost"])
def test_a_gpu_off_the_bus_leaves_allocatable_and_a_reboot_brings_it_back_only_when_it_can(
        fixed_by: str, after_restart: tuple[str, str]) -> None:
    control = api()
    status, answer = call(control, "/_sim/gpus/lose", {"cluster": "c", "pool": "four", "fixed_by": fixed_by})
    assert status == 200 and (answer["capacity"], answer["allocatable"]) == ("4", "3")
    cluster = next(iter(control.fleet.clusters.values()))
    with control.fleet.lock:
        cluster.restart_node(answer["node"])
    control.fleet.advance(11)
    assert gpus(control, answer["node"]) == after_restart


def test_a_new_node_that_never_advertises_its_gpus_stays_so_through_a_reboot() -> None:
    control = api()
    status, answer = call(control, "/_sim/gpus/add-node", {"cluster": "c", "pool": "four"})
    assert status == 201 and answer["advertise"] == "absent"
    control.fleet.advance(2)
    cluster = next(iter(control.fleet.clusters.values()))
    node = cluster.nodes[answer["node"]]
    assert node.ready and gpus(control, node.name) == (None, None)
    assert cluster.pools["four"].properties["count"] == 2  # a scale-out by one, as the autoscaler makes it
    with control.fleet.lock:
        cluster.restart_node(node.name)
    control.fleet.advance(11)
    assert gpus(control, node.name) == (None, None)


def test_a_new_node_can_enumerate_fewer_gpus_than_its_size_has() -> None:
    control = api()
    _, answer = call(control, "/_sim/gpus/add-node", {"cluster": "c", "pool": "four", "advertise": 3})
    assert gpus(control, answer["node"]) == ("3", "3")


def test_mig_slices_are_untouched_and_bad_requests_are_refused() -> None:
    control = api()
    _, answer = call(control, "/_sim/gpus/lose", {"cluster": "c", "pool": "mig"})
    status = next(iter(control.fleet.clusters.values())).nodes[answer["node"]].obj["status"]
    assert status["allocatable"].get("nvidia.com/mig-1g.10gb") == "7" and "nvidia.com/gpu" not in status["allocatable"]
    assert call(control, "/_sim/gpus/lose", {"cluster": "c", "pool": "four", "fixed_by": "magic"})[0] == 400
    assert call(control, "/_sim/gpus/add-node", {"cluster": "c", "pool": "four", "advertise": -1})[0] == 400
    assert call(control, "/_sim/gpus/add-node", {"cluster": "c", "pool": "nope"})[0] == 400
    assert call(control, "/_sim/gpus/lose", {"cluster": "nope", "pool": "four"})[0] == 404

"""Spot pools through the app's real Kubernetes adapter against the simulator (one sim process).

The drill's bug: a spot pool that lists AKS's spot taint in its own ``nodeTaints`` (as AKS returns
it) got nodes carrying it twice, and every node patch, the migration's cordon first, was refused
with 422. And Azure's spot evictions, seen the way the app sees them: the Preempt taint AKS node
auto-drain puts on the node, then the node gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared.fleet.node_fate import going_away
from shared.kernel.clock import ManualClock
from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app

SPOT = "kubernetes.azure.com/scalesetpriority"
SUB = "00000000-0000-0000-0000-0000000005b0"
SCENARIO: dict[str, Any] = {
    "seed": 5,
    "clock": {"manual": True},
    "timings": {"node_ready_s": 2, "pod_start_s": 1},
    "subscriptions": [{"id": SUB, "clusters": [{
        "name": "spotty", "resource_group": "rg-spot", "location": "eastus",
        "tags": {"gpu-fleet-steward": "enabled"},
        "pools": [
            {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
            {"name": "gpuspot", "vmSize": "Standard_NC8as_T4_v3", "count": 2, "scaleSetPriority": "Spot",
             "scaleSetEvictionPolicy": "Delete", "spotMaxPrice": -1,
             "nodeTaints": [f"{SPOT}=spot:NoSchedule"], "nodeLabels": {SPOT: "spot"}},
        ]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=SCENARIO, seed=5) as handle:
        yield handle


@pytest.fixture(scope="module")
def kube(sim: SimHandle) -> Any:
    from shared.wiring import FleetAccess

    return FleetAccess(app_settings(sim), clock=ManualClock()).kube(str(sim.cluster("spotty")["id"]))


def spot_nodes(kube: Any) -> list[Any]:
    return sorted(kube.list_nodes(label_selector="kubernetes.azure.com/agentpool=gpuspot"), key=lambda n: n.name)


def test_the_apps_cordon_of_a_spot_node_is_accepted_and_the_taint_is_there_once(kube: Any) -> None:
    node = spot_nodes(kube)[0]
    assert [t.key for t in node.taints].count(SPOT) == 1
    cordoned = kube.patch_node(node.name, {"metadata": {"annotations": {"gpu-fleet-steward/migration": "drill"}},
                                           "spec": {"unschedulable": True}})
    assert cordoned.unschedulable
    kube.patch_node(node.name, {"metadata": {"annotations": {"gpu-fleet-steward/migration": None}},
                                "spec": {"unschedulable": False}})


def test_a_spot_eviction_is_seen_by_the_app_as_a_node_going_away_then_gone(sim: SimHandle, kube: Any) -> None:
    victim = spot_nodes(kube)[-1].name
    answer = sim.control("POST", "/spot-evict", {"cluster": "spotty", "node": victim})
    assert answer["eviction"]["evictionPolicy"] == "Delete"
    seen = kube.get_node(victim)
    assert seen is not None and seen.unschedulable and "Preempt" in going_away(seen)
    sim.control("POST", "/advance", {"seconds": 31})
    assert kube.get_node(victim) is None
    oracles = sim.oracles()
    assert oracles["workload_pods_lost"] == []
    assert [r["cause"] for r in oracles["nodes_removed"] if r["node"] == victim] == ["spot_eviction"]

"""Spot pools in the simulator: the spot label and taint once per node, the low-priority vCPU quota,
and Azure taking spot VMs back (a Preempt notice, then the VM goes as the pool's eviction policy says).

In-process on a manual clock (milliseconds each).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.arm.api import ArmApi, ArmError
from sim.core.control import ControlApi
from sim.core.gpu_catalog import lookup
from sim.core.http import Headers, Request
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube.api import KubeApi
from sim.model import PREEMPT_TAINT, SHUTDOWN_TAINT, SPOT_LABEL, Cluster, Fleet, SimClock
from sim.scenario import add_pool, add_workload

T4 = "Standard_NC8as_T4_v3"
SPOT_TAINT = f"{SPOT_LABEL}=spot:NoSchedule"


def new_fleet() -> tuple[Fleet, Cluster]:
    fleet = Fleet(seed=5, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 10, "pod_start_s": 2})
    cluster = fleet.add_cluster(subscription="s", resource_group="rg", name="c", location="eastus")
    return fleet, cluster


def spot_pool(cluster: Cluster, name: str = "spot", *, listed: bool = True, **props: Any) -> None:
    extra: dict[str, Any] = {"nodeTaints": [SPOT_TAINT], "nodeLabels": {SPOT_LABEL: "spot"}} if listed else {}
    with cluster.fleet.lock:
        add_pool(cluster, {"name": name, "vmSize": T4, "count": 2, "scaleSetPriority": "Spot", **extra, **props})


def kube(fleet: Fleet, method: str, path: str, body: Any = None, *, content_type: str = "") -> Any:
    token = fleet.tokens.issue(AKS_AUDIENCES[0])[0]
    headers = {"Authorization": f"Bearer {token}"}
    if content_type:
        headers["Content-Type"] = content_type
    return KubeApi(fleet).handle(Request(method, f"/k8s/s/rg/c{path}", Headers(headers),
                                         json.dumps(body).encode() if body is not None else b""))


# --------------------------------------------------------------------------- label and taint once


@pytest.mark.parametrize("listed", [True, False], ids=["pool-lists-them", "pool-omits-them"])
def test_a_spot_node_carries_the_spot_taint_and_label_once(listed: bool) -> None:
    fleet, c = new_fleet()
    spot_pool(c, listed=listed)
    fleet.advance(11)
    for node in c.pool_nodes("spot"):
        spot = [t for t in node.obj["spec"]["taints"] if t["key"] == SPOT_LABEL]
        assert spot == [{"key": SPOT_LABEL, "value": "spot", "effect": "NoSchedule"}]
        assert node.labels[SPOT_LABEL] == "spot"


def test_cordoning_a_node_of_a_spot_pool_that_lists_its_taint_is_accepted() -> None:
    # Before: the taint was added a second time and every node patch got 422 "spec.taints[n]: Duplicate value".
    fleet, c = new_fleet()
    spot_pool(c)
    fleet.advance(11)
    name = c.pool_nodes("spot")[0].name
    resp = kube(fleet, "PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}},
                content_type="application/strategic-merge-patch+json")
    assert resp.status == 200, resp.body[:300]
    assert c.nodes[name].unschedulable


# --------------------------------------------------------------------------- low-priority quota


def test_spot_pools_count_against_low_priority_cores_and_not_their_family() -> None:
    fleet, c = new_fleet()
    spot_pool(c)
    with fleet.lock:
        add_pool(c, {"name": "regular", "vmSize": T4, "count": 1})
    family = lookup(T4).family
    assert fleet.vcpus_in_use("s", "eastus", "lowPriorityCores") == 2 * 8
    assert fleet.vcpus_in_use("s", "eastus", family) == 1 * 8


def test_the_quota_check_of_spot_vms_is_the_low_priority_quota() -> None:
    fleet, c = new_fleet()
    spot_pool(c)  # 16 low-priority vCPUs in use
    size = lookup(T4)
    fleet.quotas[("s", "eastus", size.family)] = 0  # no regular quota at all
    fleet.quotas[("s", "eastus", "lowPriorityCores")] = 32
    api = ArmApi(fleet)
    api._check_quota(c, size, extra_vcpus=16, priority="Spot")  # 16 + 16 <= 32: fits
    with pytest.raises(ArmError) as refused:
        api._check_quota(c, size, extra_vcpus=24, priority="Spot")
    assert refused.value.code == "ErrCode_InsufficientVCPUQuota"
    assert "requested 24, remaining 16 for family lowPriorityCores" in str(refused.value)
    with pytest.raises(ArmError):
        api._check_quota(c, size, extra_vcpus=8, priority="Regular")  # regular VMs still meet the family quota


# --------------------------------------------------------------------------- spot evictions


def test_a_spot_eviction_cordons_at_once_and_deletes_the_node_after_the_notice() -> None:
    fleet, c = new_fleet()
    spot_pool(c)
    fleet.advance(11)
    with fleet.lock:
        add_workload(c, {"kind": "Deployment", "name": "batch", "replicas": 4, "resources": {"cpu": "1"},
                         "tolerations": [{"key": SPOT_LABEL, "operator": "Exists"}]})
        fleet.settle()
    fleet.advance(3)
    victim = max(c.pool_nodes("spot"), key=lambda n: len(c.pods_by_node.get(n.name, ()))).name
    on_victim = sorted(p.name for p in c.items("pods") if p.node_name == victim)
    assert on_victim
    with fleet.lock:
        c.spot_evict(victim)
    node = c.nodes[victim]
    assert node.unschedulable and any(t["key"] == PREEMPT_TAINT for t in node.obj["spec"]["taints"])
    fleet.advance(29)
    assert victim in c.nodes  # the notice is ~30 s
    fleet.advance(2)
    assert victim not in c.nodes
    report = fleet.oracles.report()
    assert report["workload_pods_lost"] == []  # Azure took them, not the app
    assert sorted(t["pod"] for t in report["terminations"] if t["cause"] == "spot_eviction") == on_victim
    assert [r["cause"] for r in report["nodes_removed"]] == ["spot_eviction"]


def test_a_deallocated_spot_node_stays_not_ready_with_the_shutdown_taint() -> None:
    fleet, c = new_fleet()
    spot_pool(c, scaleSetEvictionPolicy="Deallocate")
    fleet.advance(11)
    victim = c.pool_nodes("spot")[0].name
    with fleet.lock:
        c.spot_evict(victim, notice_s=30)
    fleet.advance(31)
    node = c.nodes[victim]
    assert not node.ready
    assert {"key": SHUTDOWN_TAINT, "effect": "NoSchedule"} in node.obj["spec"]["taints"]


def test_only_spot_nodes_can_be_evicted_through_the_control_api() -> None:
    fleet, c = new_fleet()
    spot_pool(c)
    with fleet.lock:
        add_pool(c, {"name": "regular", "vmSize": T4, "count": 1})
    fleet.advance(11)
    control = ControlApi(fleet)

    def post(body: Any) -> Any:
        return control.handle(Request("POST", "/_sim/spot-evict", Headers({}), json.dumps(body).encode()))

    regular = c.pool_nodes("regular")[0].name
    assert post({"cluster": "c", "node": regular}).status == 400
    assert post({"cluster": "c", "node": "nope"}).status == 404
    spot = c.pool_nodes("spot")[0].name
    resp = post({"cluster": "c", "node": spot, "notice_s": 5})
    assert resp.status == 202
    assert json.loads(resp.body)["eviction"]["evictionPolicy"] == "Delete"
    fleet.advance(6)
    assert spot not in c.nodes and regular in c.nodes


def test_a_scenario_can_schedule_spot_evictions_by_pool_and_index() -> None:
    from sim.core.spot import SpotEvictionError, schedule_spot_evictions

    fleet, c = new_fleet()
    spot_pool(c)
    with fleet.lock:
        add_pool(c, {"name": "regular", "vmSize": T4, "count": 1})
    t0 = fleet.now()
    schedule_spot_evictions(fleet, [{"cluster": "c", "pool": "spot", "node_index": 1, "at": 60, "notice_s": 10}], t0)
    fleet.advance(11)
    victim = c.pool_nodes("spot")[1].name
    fleet.advance(50)  # t0 + 61: the notice is out
    assert c.nodes[victim].unschedulable
    fleet.advance(10)
    assert victim not in c.nodes and len(c.pool_nodes("spot")) == 1
    for bad, message in [({"cluster": "c", "pool": "regular"}, "not a spot pool"),
                         ({"cluster": "nope", "pool": "spot"}, "not in the scenario"),
                         ({"cluster": "c", "pool": "spot", "at": -1}, "non-negative"),
                         ({"cluster": "c", "pool": "spot", "when": 1}, "unknown keys")]:
        with pytest.raises(SpotEvictionError, match=message):
            schedule_spot_evictions(fleet, [bad], t0)


def test_a_spot_pool_put_is_refused_by_the_low_priority_quota_and_not_by_its_family() -> None:
    from tests.sim.test_arm_handler import SUB, Arm, arm_error, error

    family = lookup(T4).family
    arm = Arm(quotas={(SUB, "eastus", family): 0, (SUB, "eastus", "lowPriorityCores"): 16})
    spot = {"vmSize": T4, "scaleSetPriority": "Spot", "scaleSetEvictionPolicy": "Delete", "spotMaxPrice": -1}
    assert arm.create("spotok", {**spot, "count": 2}).status == 201  # 16 low-priority vCPUs; family quota 0
    arm.advance(120)
    refused = arm.create("spotmore", {**spot, "count": 1})
    assert error(refused) == (400, "ErrCode_InsufficientVCPUQuota")
    assert "for family lowPriorityCores" in arm_error(refused)["message"]
    assert error(arm.create("regular", {"vmSize": T4, "count": 1})) == (400, "ErrCode_InsufficientVCPUQuota")  # family quota

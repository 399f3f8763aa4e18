"""Spot evictions during a migration: a node Azure takes back is left out, never waited for for ever,
and its lost pods are not the migration's doing.

Real: shared.migration, shared.fleet.node_fate, shared.kernel.reconciler, shared.drain. Faked: ARM and Kubernetes
(tests/unit/fakes_migration.py); a spot eviction is done to the fake the way the simulator's
``Cluster.spot_evict`` does it (Preempt taint + cordon, then the VM stops or goes).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from shared.fleet.node_fate import AUTOSCALER_DELETE_TAINT, PREEMPT_TAINT, SHUTDOWN_TAINT, going_away, is_shut_down
from shared.kernel.ports import NodeView, Taint
from shared.migration.planner import run_planner
from shared.migration.policy import MigrationPolicy
from shared.migration.steps import advance
from tests.unit.test_migration import GPU_TOLERATION, World

SPOT_LABEL = "kubernetes.azure.com/scalesetpriority"
SPOT_PROPS = {"scaleSetPriority": "Spot", "scaleSetEvictionPolicy": "Deallocate", "spotMaxPrice": -1,
              "nodeTaints": ["sku=gpu:NoSchedule", f"{SPOT_LABEL}=spot:NoSchedule"]}
TOLERATIONS = (*GPU_TOLERATION, {"key": SPOT_LABEL, "operator": "Exists", "effect": "NoSchedule"})


def spot_world(**policy: Any) -> World:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", drain_timeout_s=600, **policy), replicas=0,
                  pool_props=SPOT_PROPS)
    world.fleet.add_workload(world.cid, "train", 3, min_available=2, pool="gpu", tolerations=TOLERATIONS)
    return world


def preempt(world: World, name: str) -> None:
    """The Preempt notice: AKS node auto-drain cordons the node with its taint."""
    kube = world.fleet.kube_of(world.cid)
    node = kube.nodes[name]
    kube.nodes[name] = msgspec.structs.replace(node, taints=(*node.taints, Taint(PREEMPT_TAINT, "", "NoSchedule")),
                                               unschedulable=True)


def deallocate(world: World, name: str) -> list[str]:
    """The VM stops: the node is NotReady with the shutdown taint; its pods stay bound and never leave."""
    kube = world.fleet.kube_of(world.cid)
    node = kube.nodes[name]
    kube.nodes[name] = msgspec.structs.replace(node, taints=(*node.taints, Taint(SHUTDOWN_TAINT, "", "NoSchedule")))
    kube.ready_at[name] = math.inf  # NotReady from now on
    stuck = [p for p in world.fleet.pods[world.cid] if p.node_name == name]
    for pod in stuck:  # nothing confirms a pod on a stopped VM stopped: it stays Terminating
        kube.pods[pod.uid] = msgspec.structs.replace(pod, grace_period_seconds=10**9)
    return [f"{p.namespace}/{p.name}" for p in stuck]


def test_a_deallocated_spot_node_is_left_out_and_the_migration_still_finishes() -> None:
    world = spot_world()
    ctx = world.ctx()
    run_planner(ctx, start=False)
    record = world.drive_direct(world.record(), crash_each_step=False, until="draining")
    victim = "aks-gpu-1234-vmss000002"  # not in the first batch
    assert victim not in (record.data.get("batch") or [])
    preempt(world, victim)
    lost_pods = deallocate(world, victim)
    assert lost_pods, "the victim must hold a workload pod for this test to mean anything"
    final = world.drive_direct(record, crash_each_step=False)
    # Before: the victim was drained like any node, its pods never left, and the drain blocked.
    assert final.state == "done", final.data.get("reason")
    assert list(final.data["lost"]) == [victim] and "deallocated" in final.data["lost"][victim]
    assert victim not in final.data["drained"]
    assert world.pool("gpu") is None
    assert world.fleet.pdb_violations == []
    assert set(world.fleet.killed) <= set(lost_pods)  # only what Azure already stopped went with the pool
    notes = [h["note"] for h in final.history]
    assert any(f"{victim} left out" in n for n in notes)


def test_the_capacity_floor_does_not_count_gpus_azure_took_back() -> None:
    world = spot_world(capacity_floor_pct=100)
    ctx = world.ctx()
    run_planner(ctx, start=False)
    record = world.drive_direct(world.record(), crash_each_step=False, until="draining")
    victim = "aks-gpu-1234-vmss000002"
    preempt(world, victim)
    deallocate(world, victim)
    # One replacement node is taken back too, for good: the replacement holds 2 of the old pool's 3 GPUs.
    new_nodes = sorted(n for n, node in world.fleet.nodes[world.cid].items() if node.pool == record.data["replacement"])
    world.fleet.nodes[world.cid].pop(new_nodes[-1])
    final = world.drive_direct(record, crash_each_step=False, limit=200)
    # Before: a floor of 3 GPUs against 2 left the migration waiting on capacity for ever.
    assert final.state == "done", (final.state, final.data.get("waiting"))


def test_a_pool_is_not_deleted_while_a_preempted_node_still_runs_pods_and_is_not_drained_again() -> None:
    world = spot_world()
    run_planner(world.ctx(), start=False)
    record = world.drive_direct(world.record(), crash_each_step=False, until="deleting")
    victim = "aks-gpu-1234-vmss000001"
    pod = next(p for p in world.fleet.pods[world.cid] if p.node_name.startswith("aks-gpum"))
    kube = world.fleet.kube_of(world.cid)
    kube.pods[pod.uid] = msgspec.structs.replace(pod, node_name=victim)  # a workload pod that landed there before the notice
    preempt(world, victim)
    stepped = advance(record, world.ctx())
    assert stepped.state == "deleting" and "waiting for Azure to take back" in stepped.data["waiting"]
    assert ("DELETE", world.cid, "gpu") not in world.fleet.arm_writes


NODE = NodeView(name="n", uid="u", resource_version="1", labels={SPOT_LABEL: "spot"}, annotations={},
                unschedulable=False, taints=(), conditions=(), allocatable={}, capacity={}, created=0.0)


@pytest.mark.parametrize(("taint", "why", "stopped"), [
    (None, "", False),
    (PREEMPT_TAINT, "Preempt", False),
    (SHUTDOWN_TAINT, "deallocated", True),
    (AUTOSCALER_DELETE_TAINT, "cluster autoscaler", False),
    ("kubernetes.azure.com/scalesetpriority", "", False),
], ids=["plain", "preempt-notice", "vm-stopped", "autoscaler-removing", "spot-taint-alone"])
def test_a_node_going_away_is_recognised_by_its_taints(taint: str | None, why: str, stopped: bool) -> None:
    import msgspec

    node = msgspec.structs.replace(NODE, taints=(Taint(taint, "", "NoSchedule"),) if taint else ())
    assert (why in going_away(node)) and (bool(going_away(node)) == bool(why))
    assert is_shut_down(node) is stopped


def test_a_replacement_node_taken_back_by_azure_does_not_hold_the_last_batch_for_ever() -> None:
    world = spot_world(capacity_floor_pct=100)
    run_planner(world.ctx(), start=False)
    record = world.drive_direct(world.record(), crash_each_step=False, until="draining")
    new_nodes = sorted(n for n, node in world.fleet.nodes[world.cid].items() if node.pool == record.data["replacement"])
    assert len(new_nodes) == 3
    world.fleet.nodes[world.cid].pop(new_nodes[0])  # Delete policy: the VM and its Node are gone
    final = world.drive_direct(record, crash_each_step=False, limit=200)
    # Before: the last batch waited on "GPU capacity 2 would drop below the floor 3" for ever.
    assert final.state == "done", (final.state, final.data.get("waiting"))

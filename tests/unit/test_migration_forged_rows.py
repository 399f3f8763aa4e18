"""A forged migration row for a pool the planner *would* migrate disrupts nothing the world does not back (issue 19).

tests/unit/test_forged_migration_states.py holds rows for pools the planner never chooses. Here the
pool is an eligible one, with workload pods under a PodDisruptionBudget, and the row lies about how far
its migration got. Every disruptive step proves its preconditions from ARM and the API server first
(shared.migration.proofs): the replacement exists, is this migration's and serves (or passes what
``validating`` proves, before the first cordon); each node to cordon is a machine of the old pool in
ARM; each node to evict from or remove carries this record's own cordon and is unschedulable; a
rollback needs the old pool, none of whose nodes this record cordoned; a planned row needs
MIGRATION_ENABLED. A row that fails ends ``blocked`` with the reason and a Blocked event, and nothing
is written: no pool PUT or DELETE, no deleteMachines, no node patch, no eviction.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.fleet.node_fate import PREEMPT_TAINT
from shared.fleet.pool_clone import MANAGED_GPU_PROFILE, TAG_MIGRATED_FROM
from shared.kernel.ports import Record, Taint
from shared.kernel.reconciler import reconcile_once
from shared.migration import steps as migration
from shared.migration.plan import migration_id
from shared.migration.planner import run_planner
from shared.migration.policy import MigrationPolicy
from shared.migration.proofs import MIGRATION_ANNOTATION
from tests.unit.test_forged_migration_states import _drive, _row
from tests.unit.test_migration import World, t4_pool

DISRUPTIVE = ("patch_node", "evict", "delete_object")


def _gpu_nodes(world: World, pool: str = "gpu") -> list[str]:
    return sorted(n.name for n in world.fleet.nodes[world.cid].values() if n.pool == pool)


def _snapshot(world: World) -> dict[str, Any]:
    world.fleet.settle()
    kube = world.fleet.kube_of(world.cid)
    return {"nodes": {n: (v.unschedulable, dict(v.annotations)) for n, v in kube.nodes.items()},
            "pods": sorted((p.name, p.node_name) for p in kube.pods.values())}


def _forge(world: World, state: str, *, pool: str = "gpu", props: dict[str, Any] | None = None,
           **data: Any) -> Record:
    props = props if props is not None else dict(world.fleet.pools[(world.cid, pool)])
    return world.ledger.create(_row(world.cid, pool, props=props, state=state, **data))


def _ends_blocked_touching_nothing(world: World, before: dict[str, Any], *, pool: str = "gpu", why: str,
                                   ctx_policy: MigrationPolicy | None = None) -> Record:
    world.fleet.aks.writes.clear()
    world.fleet.kube_of(world.cid).writes.clear()
    if ctx_policy is not None:
        world.policy = ctx_policy
    _drive(world)
    after = world.ledger.get("migration", migration_id(world.cid, pool))
    assert after is not None and after.state == "blocked", (after.state if after else None,
                                                            after.data.get("waiting") if after else None)
    assert why in after.data["reason"], after.data["reason"]
    assert world.fleet.arm_writes == [], world.fleet.arm_writes
    writes = [w for w in world.fleet.kube_of(world.cid).writes if w[0] in DISRUPTIVE]
    assert writes == [], writes
    assert _snapshot(world) == before
    assert world.fleet.killed == [] and world.fleet.pdb_violations == []
    assert world.events.types()[-1] == "Steward.Migration.Blocked"
    return after


def _without_replacement() -> World:
    """An eligible pool, gpu, running two pods under a PDB on two of its three nodes (the third is idle);
    no migration ever created its replacement."""
    return World(replicas=2, min_available=1)


def _finished() -> World:
    """A migration that is over: the old pool ``old`` is gone, its replacement ``oldm1`` serves two pods."""
    world = World(replicas=0)
    world.fleet.add_pool(world.cid, "oldm1", t4_pool(count=2, gpuProfile=MANAGED_GPU_PROFILE,
                                                     tags={TAG_MIGRATED_FROM: "old"}))
    world.fleet.add_workload(world.cid, "serve", 2, min_available=1, pool="oldm1")
    return world


# (id, world, state, the row's data beyond a careful forger's defaults, MIGRATION_ENABLED, words of the reason)
NO_REPLACEMENT = [
    ("planned-while-migrations-are-disabled", "planned", {}, False, "MIGRATION_ENABLED is false"),
    ("creating-while-migrations-are-disabled", "creating", {}, False, "MIGRATION_ENABLED is false"),
    ("cordoning", "cordoning", {}, True, "the replacement gpum1 does not exist in ARM"),
    ("draining-a-new-batch", "draining", {}, True, "the replacement gpum1 does not exist in ARM"),
    ("draining-a-batch-in-progress", "draining", {"batch": ["aks-gpu-1234-vmss000000"]}, True,
     "the replacement gpum1 does not exist in ARM: nothing more is evicted from gpu"),
    ("draining-shrink-of-an-idle-node", "draining", {"phase": "shrink", "strategy": "rolling",
                                                     "drained": ["aks-gpu-1234-vmss000002"],
                                                     "shrinking": ["aks-gpu-1234-vmss000002"]}, True,
     "no machine of gpu is deleted: aks-gpu-1234-vmss000002 does not carry this migration's cordon"),
    ("draining-shrink-of-a-busy-node", "draining", {"phase": "shrink", "strategy": "rolling",
                                                    "drained": ["aks-gpu-1234-vmss000000"],
                                                    "shrinking": ["aks-gpu-1234-vmss000000"]}, True,
     "the replacement gpum1 does not exist in ARM: no old node is cordoned"),
    ("draining-grow", "draining", {"phase": "grow", "strategy": "rolling"}, True, "the replacement disappeared"),
    ("deleting", "deleting", {"drained": ["aks-gpu-1234-vmss000000", "aks-gpu-1234-vmss000001",
                                          "aks-gpu-1234-vmss000002"]}, True, "does not exist: gpu is not deleted"),
]


@pytest.mark.parametrize(("state", "data", "enabled", "why"), [r[1:] for r in NO_REPLACEMENT],
                         ids=[r[0] for r in NO_REPLACEMENT])
def test_a_forged_row_for_a_busy_eligible_pool_without_a_replacement_ends_blocked_and_touches_nothing(
        state: str, data: dict[str, Any], enabled: bool, why: str) -> None:
    world = _without_replacement()
    before = _snapshot(world)
    _forge(world, state, **data)
    _ends_blocked_touching_nothing(world, before, why=why,
                                   ctx_policy=MigrationPolicy(enabled=enabled, strategy="surge"))
    assert world.pods_on("gpu") == 2 and world.pool("gpum1") is None


FINISHED = [
    ("planned", "planned", "the old pool old no longer exists"),
    ("creating", "creating", "the old pool old disappeared during the migration"),
    ("validating", "validating", "the old pool old disappeared during the migration"),
    ("cordoning", "cordoning", "the old pool old disappeared during the migration"),
    ("rolling-back", "rolling_back", "the old pool old does not exist: removing the replacement would leave no pool"),
]


@pytest.mark.parametrize(("state", "why"), [r[1:] for r in FINISHED], ids=[r[0] for r in FINISHED])
def test_a_forged_row_for_a_finished_migration_never_touches_the_replacement_that_now_serves(state: str,
                                                                                               why: str) -> None:
    # Before, a rolling_back row here cordoned oldm1, evicted its pods and deleted it: the only pool left.
    world = _finished()
    before = _snapshot(world)
    _forge(world, state, pool="old", props=t4_pool(count=2), replacement="oldm1")
    _ends_blocked_touching_nothing(world, before, pool="old", why=why)
    assert world.pool("oldm1") is not None and world.pods_on("oldm1") == 2


# --------------------------------------------------------------------------- a genuine migration, rewritten


def _validating(world: World) -> Record:
    """A real migration of gpu, its replacement healthy, stopped right before it cordons anything."""
    run_planner(world.ctx(), start=False)
    rec = world.drive_direct(world.record(), crash_each_step=False, until="cordoning")
    world.fleet.settle()
    return rec


@pytest.mark.parametrize(("changes", "why"), [
    ({"state": "draining", "batch": ["aks-gpu-1234-vmss000001"]}, "aks-gpu-1234-vmss000001 does not carry this "
                                                                   "migration's cordon"),
    ({"state": "draining", "phase": "shrink", "strategy": "rolling", "shrinking": ["aks-gpu-1234-vmss000002"],
      "drained": ["aks-gpu-1234-vmss000002"]}, "no machine of gpu is deleted: aks-gpu-1234-vmss000002 does not carry"),
], ids=["an-eviction-round-on-nodes-it-never-cordoned", "deleting-machines-it-never-drained"])
def test_a_row_jumped_ahead_of_its_migration_evicts_nothing_from_nodes_without_its_cordon(
        changes: dict[str, Any], why: str) -> None:
    world = World(replicas=2, min_available=1)  # aks-gpu-1234-vmss000002 runs no workload pod
    rec = _validating(world)
    before = _snapshot(world)
    state = changes.pop("state")
    forged = msgspec.structs.replace(rec, state=state, data={**rec.data, **changes})
    world.ledger.save(forged)
    _ends_blocked_touching_nothing(world, before, why=why)


def test_a_node_someone_else_cordoned_mid_batch_is_not_evicted_from_under_a_forged_marker() -> None:
    # A batch node whose marker names another record (say, a forger's copy of the row under another id)
    # is not this record's to drain.
    world = World()
    rec = _validating(world)
    kube = world.fleet.kube_of(world.cid)
    node = _gpu_nodes(world)[0]
    kube.nodes[node] = msgspec.structs.replace(kube.nodes[node], unschedulable=True,
                                               annotations={MIGRATION_ANNOTATION: "another-record"})
    before = _snapshot(world)
    world.ledger.save(msgspec.structs.replace(rec, state="draining", data={**rec.data, "batch": [node]}))
    after = _ends_blocked_touching_nothing(world, before, why="it has another-record")
    assert "nothing is evicted" in after.data["reason"]


def _fake_node(world: World, name: str, *, pool: str = "gpu", provider_id: str = "") -> None:
    """A Node a cluster admin created with the old pool's label: no VM of that pool backs it."""
    kube = world.fleet.kube_of(world.cid)
    real = kube.nodes[_gpu_nodes(world, pool)[0]]
    kube.boot(msgspec.structs.replace(real, name=name, uid=f"uid-{name}", provider_id=provider_id,
                                      labels={**real.labels, "kubernetes.io/hostname": name}),
              ready_at=world.clock.now())


@pytest.mark.parametrize(("provider_id", "not_machine", "why"), [
    ("", True, "aks-gpu-fake is labelled a node of gpu but is not one of its machines in ARM"),
    ("azure:///subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/MC_rg_c1/providers/"
     "Microsoft.Compute/virtualMachineScaleSets/other/virtualMachines/0", False, "ARM says"),
], ids=["a-node-no-machine-backs", "a-node-whose-provider-id-names-another-vm"])
def test_the_old_pool_is_cordoned_only_when_every_node_to_cordon_is_its_machine_in_arm(
        provider_id: str, not_machine: bool, why: str) -> None:
    world = World()
    rec = _validating(world)
    _fake_node(world, "aks-gpu-fake", provider_id=provider_id)
    if not_machine:
        world.fleet.aks.not_machines.add("aks-gpu-fake")
    before = _snapshot(world)
    world.ledger.save(rec)
    after = _ends_blocked_touching_nothing(world, before, why=why)
    assert "no old node is cordoned or drained" in after.data["reason"]


def test_a_cordoning_row_whose_replacement_has_no_gpus_cordons_nothing() -> None:
    # A row written straight into cordoning skips validating: what it proved is proved again.
    world = World()
    world.fleet.broken_pools.add("gpum1")
    world.fleet.add_pool(world.cid, "gpum1", {**t4_pool(count=3, gpuProfile=MANAGED_GPU_PROFILE),
                                              "tags": {TAG_MIGRATED_FROM: "gpu"}})
    before = _snapshot(world)
    _forge(world, "cordoning")
    _ends_blocked_touching_nothing(world, before, why="does not pass its GPU stack check")
    assert world.pods_on("gpu") == 3


def test_a_rollback_row_moves_no_pod_back_to_an_old_pool_that_has_no_node_to_take_it() -> None:
    world = World(replicas=0)
    world.fleet.add_pool(world.cid, "gpum1", {**t4_pool(count=1, gpuProfile=MANAGED_GPU_PROFILE),
                                              "tags": {TAG_MIGRATED_FROM: "gpu"}})
    world.fleet.add_workload(world.cid, "serve", 1, pool="gpum1")
    kube = world.fleet.kube_of(world.cid)
    for name in _gpu_nodes(world):  # every old node NotReady (no cordon of ours on them)
        kube.ready_at[name] = float("inf")
    kube.nodes.update({n: msgspec.structs.replace(v, conditions=()) for n, v in kube.nodes.items() if v.pool == "gpu"})
    before = _snapshot(world)
    _forge(world, "rolling_back")
    _ends_blocked_touching_nothing(world, before, why="gpu has no Ready, schedulable node to take the pods back")
    assert world.pods_on("gpum1") == 1 and world.pool("gpum1") is not None


def test_the_genuine_migration_still_runs_to_the_end_under_every_proof() -> None:
    # The control: the same checks let the real thing through, and every old node it drained carried its cordon.
    world = World(policy=MigrationPolicy(enabled=True, strategy="rolling", batch_size=1))
    run_planner(world.ctx())
    seen: set[str] = set()
    rec = world.record()
    for _ in range(400):
        seen |= {n.name for n in world.fleet.nodes[world.cid].values()
                 if n.pool == "gpu" and n.annotations.get(MIGRATION_ANNOTATION) == rec.id}
        if rec.state in ("done", "blocked"):
            break
        world.clock.advance(max(1.0, rec.next_at - world.clock.now()))
        reconcile_once(world.ctx(), modules={"migration": migration})
        rec = world.record()
    assert rec.state == "done", (rec.state, rec.data.get("reason"))
    assert seen == {"aks-gpu-1234-vmss000000", "aks-gpu-1234-vmss000001", "aks-gpu-1234-vmss000002"}
    assert world.fleet.killed == [] and world.fleet.pdb_violations == []


def test_a_draining_row_that_skipped_cordoning_freezes_the_autoscaler_before_cordoning_anything() -> None:
    world = World(pool_props={"enableAutoScaling": True, "minCount": 1, "maxCount": 5})
    rec = _validating(world)
    world.fleet.aks.writes.clear()
    world.ledger.save(msgspec.structs.replace(rec, state="draining"))  # past cordoning, which freezes the autoscaler
    reconcile_once(world.ctx(), modules={"migration": migration})
    after = world.record()
    assert "gpu's autoscaler is on: freezing it first" in [h["note"] for h in after.history], after.history
    assert world.fleet.arm_writes == [("PUT", world.cid, "gpu")]  # the freeze, before any node was touched
    assert not any(n.unschedulable for n in world.fleet.nodes[world.cid].values())
    assert world.drive().state == "done"
    assert world.fleet.killed == [] and world.fleet.pdb_violations == []


def test_a_deleting_row_for_nodes_this_migration_never_cordoned_drains_them_under_its_cordon_first() -> None:
    # The pool goes only once this record drained it: a row jumped to deleting is sent back to drain,
    # where every proof applies, and the DELETE comes after each old node carried the record's cordon.
    world = World(replicas=2, min_available=1)
    rec = _validating(world)
    world.ledger.save(msgspec.structs.replace(rec, state="deleting", data={**rec.data, "drained": _gpu_nodes(world)}))
    cordoned_before_delete: list[bool] = []
    plain = world.fleet.aks.begin_delete_pool

    def delete(cid: str, pool: str, **kwargs: Any) -> None:
        if pool == "gpu":
            cordoned_before_delete.extend(n.annotations.get(MIGRATION_ANNOTATION) == rec.id and n.unschedulable
                                          for n in world.fleet.nodes[world.cid].values() if n.pool == "gpu")
        plain(cid, pool, **kwargs)

    world.fleet.aks.begin_delete_pool = delete  # type: ignore[method-assign]
    assert world.drive().state == "done"
    assert cordoned_before_delete == [True, True, True]
    assert world.fleet.killed == [] and world.fleet.pdb_violations == []


@pytest.mark.parametrize("state", ["done", "rolled_back", "blocked", "migrating", "DRAINING"])
def test_a_row_written_in_a_terminal_or_unknown_state_is_never_stepped_and_touches_nothing(state: str) -> None:
    world = World()
    before = _snapshot(world)
    written = _forge(world, state, batch=["aks-gpu-1234-vmss000000"])
    world.fleet.aks.writes.clear()
    _drive(world)
    after = world.ledger.get("migration", written.id)
    assert after is not None and after.etag == written.etag  # the reconciler lists only the active states
    assert world.fleet.arm_writes == [] and _snapshot(world) == before and world.events.types() == []


def test_a_spot_node_azure_is_taking_back_whose_machine_arm_no_longer_lists_does_not_block_the_cordon() -> None:
    # The machine proof applies to the nodes the migration marks; a node under a Preempt notice leaves the
    # migration (shared.fleet.node_fate) and its VM may already be gone from ARM's machine list.
    world = World(replicas=2, min_available=1)
    rec = _validating(world)
    kube = world.fleet.kube_of(world.cid)
    victim = "aks-gpu-1234-vmss000002"
    node = kube.nodes[victim]
    kube.nodes[victim] = msgspec.structs.replace(node, unschedulable=True,
                                                 taints=(*node.taints, Taint(PREEMPT_TAINT, "", "NoSchedule")))
    world.fleet.aks.not_machines.add(victim)
    after = migration.advance(rec, world.ctx())
    assert after.state == "draining", after.data.get("reason")
    assert MIGRATION_ANNOTATION not in world.fleet.nodes[world.cid][victim].annotations

"""A forged migration row in any state writes nothing the planner would not have chosen (issue 11).

Whoever can write the ledger table can write a migration row in ``planned``, ``creating``,
``validating``, ``cordoning``, ``draining`` or ``rolling_back``, naming any pool. Before any write,
every step re-derives from ARM what the planner would: the pool must be an unmanaged NVIDIA Linux
User pool, not MIG, of the recorded size, in a cluster of the fleet's scope (the planner's own rule,
shared.migration.plan.pool_ineligibility); its replacement, when it exists, the managed pool this
app tagged for it; and the row must agree with itself (its id, the replacement's name, the body).
Otherwise the record ends ``blocked`` with the reason and a Blocked event, and nothing is created,
cordoned, drained, scaled or deleted. Also here: the If-Match on the migration's writes to existing
pools (a stale eTag -> 412 -> the step looks again), and the re-read right before deleteMachines,
which takes no If-Match.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec
import pytest

from shared.fleet.pool_clone import MANAGED_GPU_PROFILE, TAG_MIGRATED_FROM, clone_for_managed
from shared.kernel.ports import PoolInfo, Record
from shared.kernel.reconciler import reconcile_once
from shared.migration import steps as migration
from shared.migration.plan import is_replacement_name, migration_id, record_problems
from shared.migration.planner import run_planner
from shared.migration.policy import MigrationPolicy
from tests.unit.fakes_migration import FakeAks
from tests.unit.test_migration import NOW, World, t4_pool

STATES = ["planned", "creating", "validating", "cordoning", "draining", "rolling_back"]


def _row(cid: str, pool: str, *, props: dict[str, Any], state: str, replacement: str | None = None,
         **extra: Any) -> Record:
    """A self-consistent row (as a careful forger writes it) for ``pool`` whose ARM properties are ``props``."""
    name = replacement or f"{pool}m1"
    body = clone_for_managed(PoolInfo(cluster_id=cid, name=pool, properties=props), new_name=name)
    data = {"cluster_id": cid, "cluster_name": cid.rsplit("/", 1)[-1], "location": "eastus", "pool": pool,
            "replacement": name, "vm_size": props["vmSize"], "node_count": int(props.get("count") or 1),
            "strategy": "surge", "strategy_reason": "forged", "batch_size": 1, "family": "x", "vcpus_per_node": 4,
            "gpus_per_node": 1, "order": 1, "body": body, "quota": "", "autoscaler": None, "drained": [],
            "removed": [], "batch": [], "phase": "drain", "replacement_count": int(props.get("count") or 1),
            "create_deadline": NOW + 3600, "validate_deadline": NOW + 3600, **extra}
    return Record(kind="migration", id=migration_id(cid, pool), state=state, data=data, created_at=NOW,
                  updated_at=NOW, next_at=NOW)


def _with_replacement(world: World, cid: str, pool: str, props: dict[str, Any]) -> None:
    """The managed pool a migration of ``pool`` would have created (so only the old pool's own truth can stop it)."""
    world.fleet.add_pool(cid, f"{pool}m1", {**props, "count": 1, "gpuProfile": MANAGED_GPU_PROFILE, "mode": "User",
                                            "tags": {TAG_MIGRATED_FROM: pool}})


def _drive(world: World, rounds: int = 6) -> None:
    for _ in range(rounds):
        reconcile_once(world.ctx(), modules={"migration": migration})
        world.clock.advance(120)


def _untouched(world: World, cid: str) -> None:
    world.fleet.settle()
    assert world.fleet.arm_writes == [], world.fleet.arm_writes
    assert not any(n.unschedulable for n in world.fleet.nodes[cid].values()), "a node was cordoned"
    assert not any(reason.startswith("Migration") for _, _, reason in world.fleet.events), world.fleet.events


def _out_of_scope(world: World) -> str:
    cid = world.fleet.add_cluster("c2")
    world.fleet.aks.update_cluster(cid, tags={})  # not in the fleet
    return cid


# (id, pool name, its ARM properties, in another cluster out of scope, words of the reason)
TARGETS = [
    ("system-gpu-pool", "sysgpu", t4_pool(mode="System", count=1), False, "not a User pool"),
    ("mig-pool", "mig", t4_pool(vmSize="Standard_ND96asr_v4", gpuInstanceProfile="MIG3g", count=1), False, "MIG pool"),
    ("amd-pool", "amd", t4_pool(vmSize="Standard_NV4as_v4", count=1), False, "not an NVIDIA size"),
    ("managed-pool", "done", t4_pool(gpuProfile=MANAGED_GPU_PROFILE, count=1), False, "has a managed GPU profile"),
    ("windows-pool", "win", t4_pool(osType="Windows", count=1), False, "Windows pools"),
    ("cpu-pool", "cpu", {"vmSize": "Standard_D4s_v5", "count": 1, "mode": "User"}, False, "not a GPU size"),
    ("out-of-scope-cluster", "gpu", t4_pool(count=1), True, "out of the fleet's scope"),
]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize(("pool", "props", "foreign", "why"), [t[1:] for t in TARGETS], ids=[t[0] for t in TARGETS])
def test_a_forged_row_in_any_state_for_a_pool_the_planner_never_chooses_writes_nothing_and_ends_blocked(
        state: str, pool: str, props: dict[str, Any], foreign: bool, why: str) -> None:
    world = World(replicas=0)
    cid = _out_of_scope(world) if foreign else world.cid
    if (cid, pool) not in world.fleet.pools:
        world.fleet.add_pool(cid, pool, props)
    world.fleet.add_workload(cid, "victim", 1, pool=pool, tolerations=({"operator": "Exists"},))
    _with_replacement(world, cid, pool, props)
    world.fleet.aks.writes.clear()
    extra = {"autoscaler_was": {"min": 0, "max": 50}} if state == "rolling_back" else {}
    if state in ("draining", "rolling_back"):
        extra["cordoned"] = [n.name for n in world.fleet.nodes[cid].values() if n.pool == pool]
    world.ledger.create(_row(cid, pool, props=props, state=state, **extra))
    _drive(world)
    after = world.ledger.get("migration", migration_id(cid, pool))
    assert after is not None and after.state == "blocked", (after.state, after.data.get("waiting"))
    assert why in after.data["reason"] and "stopped before any write" in after.data["reason"], after.data["reason"]
    _untouched(world, cid)
    assert world.events.types()[-1] == "Steward.Migration.Blocked"


def test_the_same_row_for_a_pool_the_planner_would_choose_does_act() -> None:
    # The control for the table above: the same row for the eligible "gpu" pool is not stopped.
    world = World(replicas=0)
    props = world.fleet.pools[(world.cid, "gpu")]
    world.ledger.create(_row(world.cid, "gpu", props=dict(props), state="planned"))
    _drive(world, rounds=1)
    assert ("PUT", world.cid, "gpum1") in world.fleet.arm_writes


# --------------------------------------------------------------------------- the row agrees with itself


def _gpu_row(world: World, **changes: Any) -> Record:
    rec = _row(world.cid, "gpu", props=dict(world.fleet.pools[(world.cid, "gpu")]), state="validating")
    data = {**rec.data, **changes.pop("data", {})}
    return msgspec.structs.replace(rec, data=data, **changes)


ROWS = [
    ("id-of-another-pool", {"id": "0" * 24}, "is not the migration id of gpu"),
    ("replacement-is-another-pool", {"data": {"replacement": "other"}}, "not a name the migration of gpu"),
    ("replacement-is-the-pool-itself", {"data": {"replacement": "gpu"}}, "not a name the migration of gpu"),
    ("unmanaged-body", {"data": {"body": {"vmSize": "Standard_NC4as_T4_v3", "tags": {TAG_MIGRATED_FROM: "gpu"}}}},
     "not a managed GPU pool"),
    ("body-of-another-size", {"data": {"vm_size": "Standard_NC24ads_A100_v4"}}, "the record says"),
    ("no-batch", {"data": {"batch_size": 0}}, "not a positive number"),
]


@pytest.mark.parametrize(("changes", "why"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_row_that_contradicts_itself_is_refused_by_the_pure_check(changes: dict[str, Any], why: str) -> None:
    world = World(replicas=0)
    assert record_problems(_gpu_row(world)) == ""
    assert why in record_problems(_gpu_row(world, **changes))


def test_a_row_pointing_the_replacement_at_another_existing_pool_cordons_and_drains_nothing() -> None:
    # Before, a "validating" row for gpu naming an unrelated managed pool as its replacement validated
    # that pool and went on to cordon and drain gpu's nodes onto it.
    world = World()
    world.fleet.add_pool(world.cid, "other", t4_pool(count=3, gpuProfile=MANAGED_GPU_PROFILE))
    world.fleet.aks.writes.clear()
    world.ledger.create(_gpu_row(world, data={"replacement": "other"}))
    _drive(world)
    after = world.ledger.get("migration", migration_id(world.cid, "gpu"))
    assert after is not None and after.state == "blocked" and "not a name the migration" in after.data["reason"]
    _untouched(world, world.cid)
    assert world.pods_on("gpu") == 3


@pytest.mark.parametrize(("body", "why"), [
    ({"count": 1000}, "at most"),
    ({"nodeTaints": []}, "differs in nodeTaints"),
    ({"nodeLabels": {"team": "someone-else"}}, "differs in nodeLabels"),
], ids=["a-thousand-nodes", "taints-dropped", "labels-changed"])
def test_a_planned_row_whose_body_is_not_the_clone_of_the_pool_creates_nothing(body: dict[str, Any],
                                                                                   why: str) -> None:
    world = World(replicas=0)
    rec = _row(world.cid, "gpu", props=dict(world.fleet.pools[(world.cid, "gpu")]), state="planned")
    world.ledger.create(msgspec.structs.replace(rec, data={**rec.data, "body": {**rec.data["body"], **body}}))
    _drive(world, rounds=1)
    after = world.ledger.get("migration", migration_id(world.cid, "gpu"))
    assert after is not None and after.state == "blocked" and why in after.data["reason"], after.data.get("reason")
    assert world.fleet.arm_writes == []


@pytest.mark.parametrize(("old", "name", "ok"), [
    ("gpu", "gpum1", True), ("gpu", "gpum7", True), ("verylongname1", "verylongnam1", True),
    ("verylongname1", "verylongnm12", True), ("gpu", "gpum0", False), ("gpu", "gpum01", False),
    ("gpu", "gpu", False), ("gpu", "system", False), ("gpu", "sysm1", False), ("gpu", "gpum1000", False),
])
def test_the_replacement_name_must_be_one_the_clone_would_choose(old: str, name: str, ok: bool) -> None:
    assert is_replacement_name(old, name) is ok


# --------------------------------------------------------------------------- If-Match and the last re-read


def _rolling_back(world: World) -> Record:
    """A real migration of gpu, stopped by a replacement that never turns healthy, right before its rollback step."""
    world.fleet.broken_pools.add("gpum1")
    run_planner(world.ctx(), start=False)
    return world.drive_direct(world.record(), crash_each_step=False, until="rolling_back")


def test_the_rollback_deletes_the_replacement_only_if_match_and_looks_again_after_a_412(
        monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(replicas=0, policy=MigrationPolicy(enabled=True, strategy="surge", validate_timeout_s=300))
    rec = _rolling_back(world)
    world.fleet.settle()
    read = world.fleet.pools[(world.cid, "gpum1")]["eTag"]
    plain = FakeAks.begin_delete_pool
    raced: list[str] = []

    def changed_meanwhile(self: FakeAks, cid: str, pool: str, **kwargs: Any) -> None:
        if not raced:  # someone writes the replacement between our read and our DELETE
            raced.append(pool)
            self.new_etag(cid, pool)
        plain(self, cid, pool, **kwargs)

    monkeypatch.setattr(FakeAks, "begin_delete_pool", changed_meanwhile)
    stepped = migration.advance(rec, world.ctx())
    assert ("DELETE", world.cid, "gpum1") not in world.fleet.arm_writes, "deleted a pool changed since it was read"
    assert ("DELETE", "gpum1", read) in world.fleet.if_match
    assert stepped.state == "rolling_back" and "looking again" in stepped.data["waiting"]
    assert not stepped.data.get("delete_sent")
    world.clock.advance(stepped.next_at - world.clock.now())
    again = migration.advance(stepped, world.ctx())  # reads the new version, verifies it, deletes it
    assert ("DELETE", world.cid, "gpum1") in world.fleet.arm_writes and again.data.get("delete_sent")


def _conditional_puts(world: World, pool: str) -> list[str]:
    return [etag for method, name, etag in world.fleet.if_match if method == "PUT" and name == pool]


def test_the_old_pools_autoscaler_is_frozen_only_over_the_version_read() -> None:
    world = World(pool_props={"enableAutoScaling": True, "minCount": 1, "maxCount": 5})
    run_planner(world.ctx())
    assert world.drive().state == "done"
    assert len(_conditional_puts(world, "gpu")) == 1, world.fleet.if_match  # the freeze, If-Match


def test_a_rollback_restores_the_autoscaler_only_over_the_version_read() -> None:
    world = World(replicas=0, policy=MigrationPolicy(enabled=True, strategy="surge", validate_timeout_s=300),
                  pool_props={"enableAutoScaling": True, "minCount": 1, "maxCount": 5})
    rec = _rolling_back(world)
    world.fleet.pools[(world.cid, "gpu")].update(enableAutoScaling=False, minCount=None, maxCount=None)  # as frozen
    frozen = msgspec.structs.replace(rec, data={**rec.data, "autoscaler_was": {"min": 1, "max": 5}})
    assert world.drive_direct(frozen, crash_each_step=False).state == "rolled_back"
    assert len(_conditional_puts(world, "gpu")) == 1, world.fleet.if_match
    assert world.pool("gpu")["enableAutoScaling"] is True  # type: ignore[index]


def test_deletemachines_rereads_the_pool_right_before_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # AKS's deleteMachines takes no If-Match: the pool is read again right before it. Here the pool turns
    # into a System pool after the shrink listed its machines and before the call.
    world = World(replicas=0, policy=MigrationPolicy(enabled=True, strategy="rolling", batch_size=1))
    run_planner(world.ctx())
    plain = FakeAks.list_machines
    flipped: list[str] = []

    def listing(self: FakeAks, cid: str, pool: str) -> list[Any]:
        machines = plain(self, cid, pool)
        # The shrink's own listing (cordoning and each batch also list the machines, to prove the nodes).
        if pool == "gpu" and not flipped and sys._getframe(1).f_code.co_name == "shrink_phase":
            flipped.append(pool)
            self.pool_props(cid, pool)["mode"] = "System"
        return machines

    monkeypatch.setattr(FakeAks, "list_machines", listing)
    rec = world.drive()
    assert flipped, "the shrink never ran"
    assert rec.state == "blocked" and "no machine of gpu is deleted" in rec.data["reason"], rec.data.get("reason")
    assert not any(w[0] == "deleteMachines" for w in world.fleet.arm_writes)


def test_a_rollback_row_never_turns_on_an_autoscaler_with_bounds_the_replacement_was_not_tagged_with() -> None:
    # Before, a rolling_back row for an eligible pool could set autoscaler_was to any bounds and the
    # app wrote them onto the pool.
    world = World(replicas=0, policy=MigrationPolicy(enabled=True, strategy="surge", validate_timeout_s=300),
                  pool_props={"enableAutoScaling": True, "minCount": 1, "maxCount": 5})
    rec = _rolling_back(world)  # the replacement gpum1 is tagged with the old bounds "1-5"
    world.fleet.pools[(world.cid, "gpu")].update(enableAutoScaling=False, minCount=None, maxCount=None)
    forged = msgspec.structs.replace(rec, data={**rec.data, "autoscaler_was": {"min": 0, "max": 1000}})
    world.fleet.aks.writes.clear()
    after = migration.advance(forged, world.ctx())
    assert after.state == "blocked" and "not the ones gpum1 was tagged with (1-5)" in after.data["reason"]
    assert world.fleet.arm_writes == [] and world.pool("gpu")["enableAutoScaling"] is False  # type: ignore[index]


def test_a_row_rewritten_mid_rolling_migration_grows_the_replacement_by_one_batch_at_most() -> None:
    # Before, a row whose replacement_count said 1000 had the replacement PUT with 1000 nodes.
    world = World(replicas=0, policy=MigrationPolicy(enabled=True, strategy="rolling", batch_size=1))
    run_planner(world.ctx(), start=False)
    rec, ctx = world.record(), world.ctx()
    for _ in range(200):
        if rec.state == "draining" and rec.data.get("phase") == "grow":
            break
        world.clock.advance(max(0.0, rec.next_at - world.clock.now()))
        rec = migration.advance(rec, ctx)
    assert rec.data.get("phase") == "grow", (rec.state, rec.data.get("phase"))
    world.clock.advance(600)  # the grow this step sent is done: the replacement is Succeeded again
    world.fleet.settle()
    assert world.fleet.pools[(world.cid, "gpum1")]["provisioningState"] == "Succeeded"
    before = int(world.fleet.pools[(world.cid, "gpum1")]["count"])
    forged = msgspec.structs.replace(rec, data={**rec.data, "replacement_count": 1000, "nodes_total": 1000})
    migration.advance(forged, ctx)
    world.clock.advance(600)
    assert world.pool("gpum1")["count"] == before + 1  # type: ignore[index]

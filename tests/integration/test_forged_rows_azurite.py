"""Forged migration and command rows, written straight into Azure Table storage (Azurite), disrupt nothing (issue 19).

A table writer (Storage Table Data Contributor on the host account) does not go through the app: it
writes an entity into the ledger table with whatever state and data it likes. Here each row is written
with the raw ``TableClient``, then the real reconciler runs over the real ``TableLedger`` on Azurite. ARM
and Kubernetes are the unit fakes (tests/unit/fakes_migration.py), which record every write: a forged
row must end with no pool PUT or DELETE, no deleteMachines, no node patch and no eviction, and read back
from the table ``blocked`` (``rejected`` for a command) with a reason an operator understands.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.adapters.ledger import TableLedger, to_entity
from shared.fleet.pool_clone import MANAGED_GPU_PROFILE, TAG_MIGRATED_FROM
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.migration import steps as migration
from shared.migration.plan import migration_id
from shared.migration.policy import MigrationPolicy
from shared.remediation import breaker, commands
from tests.unit.test_forged_migration_states import _row
from tests.unit.test_migration import NOW, World, t4_pool

DISRUPTIVE = ("patch_node", "evict", "delete_object")


@pytest.fixture
def table(storage_connection_string: str) -> Any:
    from azure.data.tables import TableClient

    client = TableClient.from_connection_string(storage_connection_string, table_name=f"forged{uuid.uuid4().hex[:16]}",
                                                retry_total=0)
    client.create_table()
    return client


def _write_raw(table: Any, record: Record) -> None:
    """What a table writer does: one entity in the ledger's shape, no app code in between."""
    table.create_entity(to_entity(record))


def _world(table: Any, *, finished: bool, enabled: bool = True) -> World:
    """``finished``: the old pool ``old`` is gone and its replacement ``oldm1`` serves two pods; else the eligible
    pool ``gpu`` runs two pods under a PDB and no replacement exists."""
    world = World(replicas=0 if finished else 2, min_available=1,
                  policy=MigrationPolicy(enabled=enabled, strategy="surge"))
    world.ledger = TableLedger(table, clock=world.clock)  # type: ignore[assignment]
    if finished:
        world.fleet.add_pool(world.cid, "oldm1", t4_pool(count=2, gpuProfile=MANAGED_GPU_PROFILE,
                                                         tags={TAG_MIGRATED_FROM: "old"}))
        world.fleet.add_workload(world.cid, "serve", 2, min_available=1, pool="oldm1")
    world.fleet.settle()
    world.fleet.aks.writes.clear()
    world.fleet.kube_of(world.cid).writes.clear()
    return world


# (id, state, a finished migration's world, MIGRATION_ENABLED, the row's extra data, words of the reason)
ROWS = [
    ("planned", "planned", False, False, {}, "MIGRATION_ENABLED is false"),
    ("creating", "creating", True, True, {}, "the old pool old disappeared during the migration"),
    ("validating", "validating", True, True, {}, "the old pool old disappeared during the migration"),
    ("cordoning", "cordoning", False, True, {}, "the replacement gpum1 does not exist in ARM"),
    ("draining", "draining", False, True, {"batch": ["aks-gpu-1234-vmss000000"]},
     "nothing more is evicted from gpu"),
    ("deleting", "deleting", False, True, {"drained": ["aks-gpu-1234-vmss000000"]}, "gpu is not deleted"),
    ("rolling_back", "rolling_back", True, True, {}, "removing the replacement would leave no pool"),
]


@pytest.mark.parametrize(("state", "finished", "enabled", "extra", "why"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_migration_row_written_straight_into_the_table_in_any_state_disrupts_nothing_and_ends_blocked(
        table: Any, state: str, finished: bool, enabled: bool, extra: dict[str, Any], why: str) -> None:
    world = _world(table, finished=finished, enabled=enabled)
    pool, replacement = ("old", "oldm1") if finished else ("gpu", None)
    props = t4_pool(count=2) if finished else dict(world.fleet.pools[(world.cid, "gpu")])
    pods_before = sorted((p.name, p.node_name) for p in world.fleet.pods[world.cid])
    _write_raw(table, _row(world.cid, pool, props=props, state=state, replacement=replacement, **extra))
    for _ in range(4):
        reconcile_once(world.ctx(), modules={"migration": migration})
        world.clock.advance(120)
    after = world.ledger.get("migration", migration_id(world.cid, pool))
    assert after is not None and after.state == "blocked", (after.state if after else None)
    assert why in after.data["reason"], after.data["reason"]
    world.fleet.settle()
    assert world.fleet.arm_writes == []
    assert [w for w in world.fleet.kube_of(world.cid).writes if w[0] in DISRUPTIVE] == []
    assert not any(n.unschedulable for n in world.fleet.nodes[world.cid].values())
    assert sorted((p.name, p.node_name) for p in world.fleet.pods[world.cid]) == pods_before
    assert world.events.types()[-1] == "Steward.Migration.Blocked"


# (id, state written, data, the state it ends in, words of the reason; "" = never stepped)
COMMANDS = [
    ("a-command-not-allowed", "requested", {"command": "breaker.open", "by": "mallory", "reason": "x",
                                            "requested_at": NOW}, "rejected", "breaker.open"),
    ("a-reset-from-the-future", "requested", {"command": "breaker.reset", "by": "mallory", "reason": "x",
                                              "requested_at": NOW + 86400}, "rejected", "in the future"),
    ("an-applied-row-written-by-hand", "applied", {"command": "breaker.reset", "by": "mallory", "reason": "x",
                                                   "requested_at": NOW, "result": {"breaker": "closed"}}, "applied", ""),
]


@pytest.mark.parametrize(("state", "data", "ends", "why"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_a_command_row_written_straight_into_the_table_resets_no_breaker(
        table: Any, state: str, data: dict[str, Any], ends: str, why: str) -> None:
    world = World(replicas=0)
    ledger = TableLedger(table, clock=world.clock)
    world.ledger = ledger  # type: ignore[assignment]
    ctx, events = world.ctx(), world.events
    ledger.create(Record(kind=breaker.KIND, id=breaker.ID, state=breaker.OPEN, created_at=NOW - 600,
                         data={"window": {"c/n1": NOW - 700}, "fleet_nodes": 20, "opened_at": NOW - 600,
                               "reason": "storm"}))
    _write_raw(table, Record(kind=commands.KIND, id="forged", state=state, data=data, created_at=NOW, next_at=NOW))
    reconcile_once(ctx, modules={commands.KIND: commands})
    after = ledger.get(commands.KIND, "forged")
    assert after is not None and after.state == ends
    assert breaker.current(ctx).is_open
    if why:
        assert why in after.data["rejected_because"]
        assert [e["type"] for e in events.published] == [commands.REJECTED_EVENT]
    else:
        assert events.published == [] and len(after.history) == 0  # never stepped

"""The surge migration's capacity floor counts the GPUs the old pool really serves, and a floor that cannot
open is handed to an operator at the drain timeout instead of holding the old pool cordoned for ever.

Real: shared.migration (draining.capacity_ok, the drain phase), shared.drain. Faked: ARM and Kubernetes
(tests/unit/fakes_migration.py).
"""

from __future__ import annotations

import msgspec

from shared.kernel.ports import NodeView, Record
from shared.migration.planner import run_planner
from shared.migration.policy import MigrationPolicy
from shared.migration.steps import advance
from tests.unit.test_migration import World, assert_safe


def floor_world(**policy: int) -> World:
    return World(policy=MigrationPolicy(enabled=True, strategy="surge", capacity_floor_pct=100, **policy))


def without_gpus(world: World, name: str) -> None:
    """The node stays Ready and advertises no GPU: its device plugin never came up (or died)."""
    kube = world.fleet.kube_of(world.cid)
    node = kube.nodes[name]
    kube.nodes[name] = msgspec.structs.replace(
        node, allocatable={k: v for k, v in node.allocatable.items() if k != "nvidia.com/gpu"})


def draining_with_a_gpu_less_replacement_node(*, drain_timeout_s: int) -> tuple[World, Record, tuple[str, NodeView]]:
    """A surge migration in ``draining`` whose first replacement node lost its GPUs (Ready, not going away: a
    fault, not Azure taking it back); with that node's name and its view before."""
    world = floor_world(drain_timeout_s=drain_timeout_s)
    run_planner(world.ctx(), start=False)
    record = world.drive_direct(world.record(), crash_each_step=False, until="draining")
    name = min(n for n, node in world.fleet.nodes[world.cid].items() if node.pool == record.data["replacement"])
    healthy = world.fleet.kube_of(world.cid).nodes[name]
    without_gpus(world, name)
    return world, record, (name, healthy)


def held_by_the_floor(world: World, record: Record, *, limit: int = 100) -> Record:
    """Step the migration until a step waits on the capacity floor."""
    ctx = world.ctx()
    for _ in range(limit):
        if "below the floor" in str(record.data.get("waiting") or ""):
            return record
        world.clock.advance(max(0.0, record.next_at - world.clock.now()))
        record = advance(record, ctx)
    raise AssertionError(f"never held by the floor: {record.state} {record.data.get('waiting')}")


def test_an_old_node_that_never_served_gpus_does_not_hold_the_drain_on_the_capacity_floor() -> None:
    world = floor_world()
    run_planner(world.ctx(), start=False)
    # A remediation's surge node: the old pool is one node larger, and that node never had a GPU.
    surge = world.fleet._add_node(world.cid, "gpu", ready_at=world.clock.now())
    without_gpus(world, surge.name)
    final = world.drive_direct(world.record(), crash_each_step=False, limit=300)
    # Before: "GPU capacity 3 would drop below the floor 4 (100%)" for ever (soak seed 961801).
    assert final.state == "done", (final.state, final.data.get("waiting"), final.data.get("reason"))
    assert final.data["nodes_total"] == 4
    assert_safe(world)


def test_the_floor_still_holds_a_batch_while_the_replacement_serves_fewer_gpus_than_it_takes() -> None:
    world, record, _ = draining_with_a_gpu_less_replacement_node(drain_timeout_s=3600)
    held = held_by_the_floor(world, record)
    assert held.state == "draining" and "would drop below the floor 3" in held.data["waiting"], held.data["waiting"]
    assert len(held.data["drained"]) == 2  # 2 replacement GPUs + 1 old node = the floor; the last one waits


def test_a_capacity_floor_that_never_opens_blocks_the_migration_at_the_drain_timeout_and_says_why() -> None:
    world, record, _ = draining_with_a_gpu_less_replacement_node(drain_timeout_s=600)
    final = world.drive_direct(record, crash_each_step=True, limit=300)
    # Before: the migration waited on the floor for ever, the old pool cordoned and nobody told.
    assert final.state == "blocked", (final.state, final.data.get("waiting"))
    reason = final.data["reason"]
    assert "would drop below the floor 3" in reason and "MIGRATION_DRAIN_TIMEOUT_S 600" in reason, reason
    assert world.pool("gpu") is not None  # nothing deleted: the undrained node still serves
    assert_safe(world)


def test_the_capacity_floor_wait_restarts_its_clock_once_the_gate_opens() -> None:
    world, record, (name, healthy) = draining_with_a_gpu_less_replacement_node(drain_timeout_s=600)
    kube = world.fleet.kube_of(world.cid)
    held = held_by_the_floor(world, record)
    assert held.data["capacity_held_since"] > 0
    kube.nodes[name] = healthy  # repaired within the timeout
    final = world.drive_direct(held, crash_each_step=False, limit=300)
    assert final.state == "done", (final.state, final.data.get("reason"))
    assert final.data["capacity_held_since"] == 0.0
    assert_safe(world)

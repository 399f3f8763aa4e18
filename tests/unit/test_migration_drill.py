"""What a migration drill on the simulator found: permanent errors must surface, the plan says when a
pool loses its autoscaler, and spot pools are sized against the low-priority (Spot) vCPU quota.

Real: shared.migration, shared.migration.plan, shared.kernel.reconciler, fleetctl's status text, the
InMemoryLedger and RecordingEvents. Faked: ARM and Kubernetes (tests/unit/fakes_migration.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fleetctl import cli, records
from shared.kernel.errors import Forbidden, Invalid, Transient
from shared.kernel.ports import ClusterInfo, PoolInfo, Record
from shared.kernel.reconciler import DEFAULT_MAX_PERMANENT_TRIES, ReconcileReport, advance_record, reconcile_once
from shared.migration import steps as migration
from shared.migration.plan import plan, render_table, to_json
from shared.migration.planner import run_planner
from shared.migration.policy import MigrationPolicy
from tests.unit.fakes_migration import FakeKube, cluster_id
from tests.unit.test_migration import World

NOW = 1_764_684_000.0
CID = cluster_id("c1")
CLUSTER = ClusterInfo(id=CID, name="c1", subscription="s", resource_group="rg", location="eastus",
                      tags={"gpu-fleet-steward": "enabled"}, node_resource_group="MC")


# --------------------------------------------------------------------------- permanent errors surface


def refuse_every_cordon(monkeypatch: pytest.MonkeyPatch, error: Exception) -> list[str]:
    tries: list[str] = []

    def patch_node(self: FakeKube, name: str, patch: Any) -> Any:
        if (patch.get("spec") or {}).get("unschedulable") is True:
            tries.append(name)
            raise error
        return FakeKube.__dict__["_orig_patch_node"](self, name, patch)

    monkeypatch.setattr(FakeKube, "_orig_patch_node", FakeKube.patch_node, raising=False)
    monkeypatch.setattr(FakeKube, "patch_node", patch_node)
    return tries


def status_text(world: World) -> str:
    data = {"clusters": None, "fleet_error": "ledger only", "pool_requests": {}, "remediations_in_flight": [],
            "breaker": records.breaker_view(None),
            "migrations": [records.migration_view(r) for r in world.ledger.list("migration")]}
    return cli._status_text(data)


def test_a_cordon_refused_with_422_on_every_try_blocks_the_migration_after_five_tries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    tries = refuse_every_cordon(monkeypatch, Invalid("Node \"x\" is invalid: spec.taints[3]: Duplicate value",
                                                     code="422"))
    run_planner(world.ctx())
    rec = world.drive(limit=200)  # before: it stayed in cordoning, retrying for ever
    assert rec.state == "blocked"
    assert {tries.count(name) for name in tries} == {DEFAULT_MAX_PERMANENT_TRIES}  # 5 steps, each node tried once
    assert "cordoning" in rec.data["reason"] and "Duplicate value" in rec.data["reason"]
    blocked = world.events.of_type("Steward.Migration.Blocked")
    assert len(blocked) == 1 and "Duplicate value" in blocked[0]["data"]["reason"]
    text = status_text(world)
    assert "BLOCKED c1/gpu: step 'cordoning' failed 5 times in a row" in text
    assert "Duplicate value" in text


def test_the_number_of_tries_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    tries = refuse_every_cordon(monkeypatch, Forbidden("nodes is forbidden: cannot patch resource"))
    ctx = world.ctx()
    ctx = dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, reconcile_max_permanent_tries=2))
    run_planner(ctx)
    assert world.drive(ctx, limit=200).state == "blocked"
    assert {tries.count(name) for name in tries} == {2}


def test_a_step_still_retrying_shows_its_error_in_status(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    refuse_every_cordon(monkeypatch, Invalid("admission webhook denied the request", code="400"))
    run_planner(world.ctx())
    for _ in range(60):
        reconcile_once(world.ctx(), modules={"migration": migration})
        world.clock.advance(max(1.0, world.record().next_at - world.clock.now()))
        if world.record().data.get("_permanent_tries") == 2:
            break
    assert world.record().state == "cordoning"
    assert ("RETRYING c1/gpu in cordoning (2 permanent failures in a row): Invalid: admission webhook denied"
            in status_text(world))


class _Kind:
    """A kind without a give_up hook whose steps fail as told."""

    ACTIVE_STATES = frozenset({"working"})

    def __init__(self, errors: list[Exception | None]) -> None:
        self.errors = errors

    def advance(self, record: Record, ctx: Any) -> Record:
        error = self.errors.pop(0)
        if error is not None:
            raise error
        return record.moved("working", at=ctx.clock.now(), next_at=ctx.clock.now() + 60)


@pytest.mark.parametrize(("errors", "stuck", "tries"), [
    ([Invalid("bad")] * 5, True, 5),
    ([Invalid("bad")] * 3 + [Transient("blip")] + [Invalid("bad")] * 2, True, 5),  # a transient one does not reset
    ([Invalid("bad")] * 4 + [None], False, 0),  # a good step clears the count
], ids=["five-in-a-row", "transient-between", "success-resets"])
def test_a_kind_without_a_hook_keeps_backing_off_and_is_marked_stuck(errors: list[Exception | None], stuck: bool,
                                                                    tries: int) -> None:
    world = World(replicas=0)
    ctx = world.ctx()
    kind = _Kind(list(errors))
    world.ledger.create(Record(kind="test", id="r1", state="working", data={}, next_at=NOW, created_at=NOW,
                               updated_at=NOW))
    for _ in range(len(errors)):
        current = world.ledger.get("test", "r1")
        assert current is not None
        advance_record(current, ctx, report=ReconcileReport(), advance=kind.advance, active=kind.ACTIVE_STATES)
        world.clock.advance(400)
    final = world.ledger.get("test", "r1")
    assert final is not None and final.state == "working"
    assert ("_stuck" in final.data) is stuck
    assert int(final.data.get("_permanent_tries") or 0) == tries


# --------------------------------------------------------------------------- the plan and the autoscaler


def gpu_pool(name: str, **props: Any) -> PoolInfo:
    base = {"vmSize": "Standard_NC4as_T4_v3", "count": 3, "osType": "Linux", "mode": "User",
            "provisioningState": "Succeeded", "gpuProfile": {"driver": "Install"}}
    base.update(props)
    return PoolInfo(cluster_id=CID, name=name, properties=base)


def make_plan(pools: list[PoolInfo], policy: MigrationPolicy | None = None) -> Any:
    return plan([CLUSTER], {CID: pools}, migrations=[], maintenance_by_cluster={CID: []},
                policy=policy or MigrationPolicy(max_concurrent=10), now=NOW)


def test_the_plan_says_when_a_pool_will_lose_its_autoscaler() -> None:
    result = make_plan([gpu_pool("auto", enableAutoScaling=True, minCount=2, maxCount=6),
                        gpu_pool("fixed", enableAutoScaling=False)])
    items = {it.pool: it for it in result.items}
    assert items["auto"].autoscaler.startswith("old pool's autoscaler (2-6) off while it drains; LOST")
    assert "fixed at 3 nodes" in items["auto"].autoscaler
    assert items["fixed"].autoscaler == ""
    table = render_table(result)
    header, *rows = [line for line in table.splitlines() if line.startswith(("#", "1", "2"))]
    assert "AUTOSCALER" in header
    cells = {row.split()[2]: row.split()[8] for row in rows}
    assert cells == {"auto": "lost", "fixed": "-"}
    assert "Autoscaler:\n  1. c1/auto: old pool's autoscaler (2-6) off while it drains; LOST" in table
    assert to_json(result)["items"][0]["autoscaler"] == items["auto"].autoscaler


def test_a_replacement_that_keeps_its_autoscaler_is_shown_as_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.migration import plan as migration_plan

    def clone(pool: PoolInfo, *, new_name: str) -> dict[str, Any]:
        return {"count": 3, "enableAutoScaling": True, "minCount": 2, "maxCount": 6}

    monkeypatch.setattr(migration_plan, "clone_for_managed", clone)
    result = make_plan([gpu_pool("auto", enableAutoScaling=True, minCount=2, maxCount=6)])
    assert result.items[0].autoscaler == "old pool's autoscaler (2-6) off while it drains; replacement autoscales 2-6"
    assert " kept " in render_table(result)


# --------------------------------------------------------------------------- spot pools and the Spot quota


SPOT = {"scaleSetPriority": "Spot", "scaleSetEvictionPolicy": "Delete", "spotMaxPrice": -1,
        "nodeTaints": ["kubernetes.azure.com/scalesetpriority=spot:NoSchedule"],
        "nodeLabels": {"kubernetes.azure.com/scalesetpriority": "spot"}}


@pytest.mark.parametrize(("headroom", "strategy", "why"), [
    ("eastus:standardNCASv3_T4Family=1000,eastus:lowPriorityCores=4", "rolling", "low-priority (Spot) vCPU headroom 4 < 12"),
    ("eastus:standardNCASv3_T4Family=0,eastus:lowPriorityCores=12", "surge", "low-priority (Spot) vCPU headroom 12 holds"),
    ("eastus:standardNCASv3_T4Family=1000", "rolling", "low-priority (Spot) vCPU headroom unknown"),
], ids=["spot-quota-short", "family-quota-irrelevant", "spot-quota-unknown"])
def test_a_spot_pool_is_sized_against_the_low_priority_quota(headroom: str, strategy: str, why: str) -> None:
    from shared.migration.policy import parse_headroom

    policy = MigrationPolicy(max_concurrent=10, gpu_vcpu_headroom=parse_headroom("H", headroom))
    [item] = make_plan([gpu_pool("spot", **SPOT)], policy).items
    assert (item.strategy, item.quota) == (strategy, "lowPriorityCores")
    assert why in item.strategy_reason


def test_spot_and_regular_pools_draw_on_separate_headrooms() -> None:
    from shared.migration.policy import parse_headroom

    # 12 vCPUs in each quota: both 12-vCPU replacements surge, neither eats the other's headroom.
    policy = MigrationPolicy(max_concurrent=10, gpu_vcpu_headroom=parse_headroom(
        "H", "eastus:standardNCASv3_T4Family=12,eastus:lowPriorityCores=12"))
    items = {it.pool: it for it in make_plan([gpu_pool("regular"), gpu_pool("spot", **SPOT)], policy).items}
    assert (items["regular"].strategy, items["spot"].strategy) == ("surge", "surge")
    assert items["regular"].quota == "standardNCASv3_T4Family"


def test_the_quota_family_of_the_t4_size_is_what_the_test_assumes() -> None:
    from shared.fleet import gpu_sizes

    assert gpu_sizes.lookup("Standard_NC4as_T4_v3").family == "standardNCASv3_T4Family"




def test_the_replacement_of_a_spot_pool_lists_the_spot_taint_once_and_not_the_reserved_label() -> None:
    from shared.migration.fit import body_taints

    [item] = make_plan([gpu_pool("spot", **SPOT)]).items
    assert item.body["nodeTaints"].count("kubernetes.azure.com/scalesetpriority=spot:NoSchedule") == 1
    assert "kubernetes.azure.com/scalesetpriority" not in (item.body.get("nodeLabels") or {})
    assert [t.key for t in body_taints(item.body)].count("kubernetes.azure.com/scalesetpriority") == 1
    assert (item.body["scaleSetPriority"], item.body["scaleSetEvictionPolicy"]) == ("Spot", "Delete")


def test_a_remediation_stuck_on_a_permanent_error_shows_it_in_status() -> None:
    rec = Record(kind="remediation", id="r1-1", state="cordoned", created_at=NOW, updated_at=NOW,
                 data={"cluster": CID, "node": "n1", "condition": "UnhealthyNvidiaDevicePlugin",
                       "_last_error": "Forbidden: nodes is forbidden", "_permanent_tries": 5,
                       "_stuck": "step 'cordoned' failed 5 times in a row"})
    data = {"clusters": None, "fleet_error": "ledger only", "pool_requests": {}, "migrations": [],
            "remediations_in_flight": [records.remediation_view(rec)], "breaker": records.breaker_view(None)}
    assert ("STUCK c1/n1 in cordoned (5 permanent failures in a row): Forbidden: nodes is forbidden"
            in cli._status_text(data))

"""The cluster tag ``gpu-fleet-steward/paused=true`` holds migrations and pool creation too (issue 11).

Until now only remediation honoured it. A paused cluster's migration stays where it is (reported in
its record and once in a ``Step`` event) and the planner starts none there; a new pool request for a
paused cluster waits (and fails ``ClusterPaused`` if the pause outlasts its create timeout, having
made nothing), one in flight holds without any write and does not time out because of the pause.
The tag is read from ARM at each step. Also here: the reconciler's ``give_up`` hook of pool requests.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.fleet import scope
from shared.fleet.scope import PAUSED_TAG
from shared.kernel.errors import Forbidden, Invalid
from shared.kernel.reconciler import reconcile_once
from shared.migration import steps as migration
from shared.migration.planner import run_planner
from shared.migration.records import TERMINAL_STATES as MIGRATION_TERMINAL
from shared.migration.steps import advance as advance_migration
from shared.pools import intake
from shared.pools import steps as pool_steps
from tests.unit.fakes_pool import CLUSTER, make_world, materialise, message
from tests.unit.test_migration import World


def test_the_pause_tag_is_read_case_insensitively_and_only_true_pauses() -> None:
    assert scope.paused_reason({PAUSED_TAG: "true"})
    assert scope.paused_reason({PAUSED_TAG.upper(): "True"})
    assert not scope.paused_reason({PAUSED_TAG: "false"})
    assert not scope.paused_reason({"gpu-fleet-steward": "enabled"})
    assert not scope.paused_reason(None)


# --------------------------------------------------------------------------- migrations


def pause_migration_cluster(world: World, *, paused: bool = True) -> None:
    info = world.fleet.clusters[world.cid]
    tags = {k: v for k, v in info.tags.items() if k != PAUSED_TAG}
    if paused:
        tags[PAUSED_TAG] = "true"
    world.fleet.aks.update_cluster(world.cid, tags=tags)


def test_the_planner_starts_no_migration_on_a_paused_cluster_and_says_why() -> None:
    world = World()
    pause_migration_cluster(world)
    plan = run_planner(world.ctx())
    assert plan.items == ()
    assert [(s.pool, s.code) for s in plan.skipped if s.pool == "gpu"] == [("gpu", "paused")]
    assert world.ledger.list("migration") == []
    assert world.fleet.arm_writes == []


def test_a_migration_in_flight_holds_where_it_is_while_its_cluster_is_paused_and_resumes_after() -> None:
    world = World()
    run_planner(world.ctx())  # records it and takes its first steps (the replacement pool's PUT)
    started = world.record()
    assert started.state not in ("planned", *MIGRATION_TERMINAL)
    pause_migration_cluster(world)
    writes_before, evictions_before = list(world.fleet.arm_writes), [
        p.name for p in world.fleet.pods[world.cid] if p.deletion_timestamp is not None]
    for _ in range(20):
        world.clock.advance(120)
        reconcile_once(world.ctx(), modules={"migration": migration})
    held = world.record()
    assert held.state == started.state
    assert "paused" in held.data["waiting"] and "held where it is" in held.data["waiting"]
    assert world.fleet.arm_writes == writes_before
    assert [p.name for p in world.fleet.pods[world.cid] if p.deletion_timestamp is not None] == evictions_before
    steps = [e for e in world.events.published if e["type"] == "Steward.Migration.Step"
             and "held where it is" in str(e["data"].get("note"))]
    assert len(steps) == 1  # reported once per pause, not every look
    pause_migration_cluster(world, paused=False)
    assert world.drive().state == "done"


def test_the_pause_tag_is_read_from_arm_at_the_step() -> None:
    world = World()
    run_planner(world.ctx(), start=False)
    pause_migration_cluster(world)
    after = advance_migration(world.record(), world.ctx())
    assert after.state == "planned" and "paused" in after.data["waiting"]
    assert world.fleet.arm_writes == []


# --------------------------------------------------------------------------- pool creation


def pause_pool_cluster(world: Any, *, paused: bool = True) -> None:
    info = world.aks.clusters[CLUSTER.lower()]
    tags = {k: v for k, v in info.tags.items() if k != PAUSED_TAG}
    if paused:
        tags[PAUSED_TAG] = "true"
    world.aks.clusters[CLUSTER.lower()] = msgspec.structs.replace(info, tags=tags)


def request_record(world: Any) -> Any:
    found = world.ledger.get(pool_steps.KIND, "req-0001")
    assert found is not None
    return found


def reconcile(world: Any, seconds: float = 0.0) -> None:
    world.clock.advance(seconds)
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})


def test_a_new_request_for_a_paused_cluster_waits_without_creating_anything() -> None:
    world = make_world()
    intake.accept(message(), dequeue_count=1, ctx=world.ctx)
    assert request_record(world).state == "accepted"
    pause_pool_cluster(world)
    for _ in range(5):
        reconcile(world, pool_steps.PAUSED_RETRY_S)
    waiting = request_record(world)
    assert waiting.state == "accepted" and "paused" in waiting.data["waiting"]
    assert world.aks.puts == []
    pause_pool_cluster(world, paused=False)
    reconcile(world, pool_steps.PAUSED_RETRY_S)
    assert request_record(world).state == "creating" and len(world.aks.puts) == 1


def test_a_request_whose_cluster_stays_paused_past_its_create_timeout_fails_having_made_nothing() -> None:
    world = make_world()
    intake.accept(message(), dequeue_count=1, ctx=world.ctx)
    pause_pool_cluster(world)
    reconcile(world)
    reconcile(world, world.policy.create_timeout_s + 1)
    failed = request_record(world)
    assert failed.state == "failed" and failed.data["error"]["code"] == "ClusterPaused"
    assert world.aks.puts == []
    assert "Steward.PoolRequest.Failed" in world.events.types()


def test_a_request_in_flight_holds_while_paused_and_the_pause_does_not_make_it_time_out() -> None:
    world = make_world()
    intake.accept(message(), dequeue_count=1, ctx=world.ctx)
    reconcile(world)
    assert request_record(world).state == "creating"
    deadline = float(request_record(world).data["deadline"])
    pause_pool_cluster(world)
    materialise(world.aks, world.kube(CLUSTER), CLUSTER, "gpunp")
    paused_for = world.policy.create_timeout_s * 2
    reconcile(world, world.policy.poll_interval_s)
    reconcile(world, paused_for)
    held = request_record(world)
    assert held.state == "creating" and "paused" in held.data["waiting"]
    assert world.kube(CLUSTER).jobs() == [] and len(world.aks.puts) == 1
    pause_pool_cluster(world, paused=False)
    reconcile(world, pool_steps.PAUSED_RETRY_S)
    resumed = request_record(world)
    assert resumed.state not in ("failed", "creating"), resumed.history[-3:]
    assert resumed.data.get("paused_since") is None
    assert "the cluster pause was lifted" in " ".join(h["note"] for h in resumed.history)
    assert deadline < world.clock.now()  # without the shift, the creating step would have timed out


def test_a_pool_request_failing_permanently_is_ended_failed_by_the_give_up_hook() -> None:
    world = make_world()
    intake.accept(message(), dequeue_count=1, ctx=world.ctx)

    def invalid(cluster_id: str) -> Any:
        raise Invalid("the subscription is disabled", code="SubscriptionNotRegistered")

    world.aks.get_cluster = invalid  # type: ignore[method-assign]
    for _ in range(12):
        reconcile(world, 3600)
    ended = request_record(world)
    assert ended.state == "failed" and ended.data["error"]["code"] == "GaveUp"
    assert "failed 5 times in a row with a permanent error" in ended.data["error"]["message"]
    assert world.aks.puts == []
    assert "Steward.PoolRequest.Failed" in world.events.types()


def test_give_up_of_a_request_in_flight_says_its_pool_was_left_for_an_operator() -> None:
    world = make_world()
    intake.accept(message(), dequeue_count=1, ctx=world.ctx)
    reconcile(world)
    ended = pool_steps.give_up(request_record(world), world.ctx, reason="step 'creating' failed 5 times")
    assert ended.state == "failed" and ended.data["outcome"]["cleanup"]["action"] == "none"
    assert world.aks.deletes == []
    assert pool_steps.give_up(ended, world.ctx, reason="again") is ended


def test_a_step_that_cannot_read_the_pause_tag_writes_nothing() -> None:
    world = make_world()
    intake.accept(message(), dequeue_count=1, ctx=world.ctx)

    def forbidden(cluster_id: str) -> Any:
        raise Forbidden("AuthorizationFailed: no read on the cluster")

    world.aks.get_cluster = forbidden  # type: ignore[method-assign]
    with pytest.raises(Forbidden):
        pool_steps.advance(request_record(world), world.ctx)
    assert world.aks.puts == []

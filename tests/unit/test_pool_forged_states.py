"""A forged pool-request row in any state disrupts nothing unless the world bears it out (issue 19, item 1).

Whoever can write the ledger table can write a ``pool-request`` row in any state, or put a finished row
back in flight. Each test writes such a row straight into the ledger (the InMemoryLedger; the same
through Azurite in tests/integration/test_pool_forged_rows_azurite.py), runs the reconciler and checks
that ARM saw no PUT or DELETE, no cluster saw a write (no Job, no Karpenter object), and the row ended
``blocked`` with a reason that names what was looked at, with a Blocked event. The controls show the
same steps do act when the world agrees, so the refusals can fail.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.pools import proof, records
from shared.pools import steps as pool_steps
from shared.pools.intake import accept
from shared.pools.nap import ANNOTATION_REQUEST_ID, ANNOTATION_REQUESTER, NODECLASS_API, NODEPOOL_API
from shared.pools.records import KIND, State
from shared.pools.sample_job import job_name
from shared.pools.spec import TAG_CREATED_AT, TAG_REQUEST_ID, TAG_REQUESTER
from shared.pools.teams import Team
from tests.unit.fakes_pool import CLUSTER, NAP_CLUSTER, World, make_node, make_world, message
from tests.unit.fakes_pool import request as request_body

VISION = Team(name="vision", queue="gpu-pool-requests-vision", clusters=(CLUSTER, NAP_CLUSTER))
ROW = "vision:req-1"
HOURS = 3600.0


def team_world() -> World:
    world = make_world()
    world.ctx.settings = dataclasses.replace(world.ctx.settings, teams=(VISION,))
    return world


def forge(world: World, state: str, *, cluster: str = CLUSTER, row_id: str = ROW, **data: Any) -> Record:
    """A row in ``state`` written straight into the ledger, self-consistent as a careful forger would make it."""
    req = {**request_body(requestId="req-1", cluster=cluster, poolName="victim"), "requester": "vision"}
    now = world.clock.now()
    body = {"request": req, "fingerprint": "forged", "cluster": cluster, "pool": "victim", "requester": "vision",
            "vm_size": req["vmSize"], "team": "vision", "announced": True, "puts": 1, **data}
    return world.ledger.create(Record(kind=KIND, id=row_id, state=state, data=body, created_at=now, updated_at=now,
                                      next_at=now))


def pool(world: World, *, age_s: float | None, state: str = "Succeeded", **tags: str) -> None:
    """An agent pool ``victim`` tagged as request req-1 of vision made it ``age_s`` ago (no mark when None)."""
    marks = {TAG_REQUEST_ID: "req-1", TAG_REQUESTER: "vision", **tags}
    if age_s is not None:
        marks[TAG_CREATED_AT] = str(int(world.clock.now() - age_s))
    world.aks.pools[(CLUSTER.lower(), "victim")] = {
        "vmSize": "Standard_NC4as_T4_v3", "count": 1, "mode": "User", "provisioningState": state,
        "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}, "tags": marks}


def nodepool(world: World, *, annotations: dict[str, str] | None, age_s: float = 0.0) -> None:
    """NodePool + AKSNodeClass ``victim`` on the NAP cluster (``annotations`` None: made by someone else)."""
    born = world.clock.now() - age_s
    stamp = datetime.fromtimestamp(born, tz=UTC)
    for api, kind in ((NODEPOOL_API, "NodePool"), (NODECLASS_API, "AKSNodeClass")):
        meta: dict[str, Any] = {"name": "victim", "creationTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "resourceVersion": "7"}
        if annotations is not None:
            meta["annotations"] = dict(annotations)
        world.kube(NAP_CLUSTER).objects[(api, kind, "", "victim")] = {
            "apiVersion": api, "kind": kind, "metadata": meta, "spec": {"limits": {"nvidia.com/gpu": "1"}}}


def run(world: World, row_id: str = ROW) -> Record:
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})
    found = world.ledger.get(KIND, row_id)
    assert found is not None
    return found


def assert_untouched(world: World) -> None:
    assert world.aks.puts == [] and world.aks.deletes == []
    for cluster in (CLUSTER, NAP_CLUSTER):
        assert world.kube(cluster).writes == [], world.kube(cluster).writes


def assert_blocked(world: World, final: Record, *words: str) -> None:
    assert final.state == "blocked", (final.state, final.data.get("error"))
    for word in words:
        assert word in final.data["reason"], final.data["reason"]
    assert final.data["outcome"]["state"] == "blocked" and final.data["error"]["code"] in ("RowNotProven",
                                                                                          "RequestNotAllowed")
    assert world.events.types()[-1] == "Steward.PoolRequest.Blocked"
    [event] = [e for e in world.events.published if e["type"] == "Steward.PoolRequest.Blocked"]
    assert event["data"]["requestId"] == "req-1" and event["data"]["reason"] == final.data["reason"]
    assert_untouched(world)


UNHEALTHY = {"deadline": 0.0}  # a deadline long past: a genuine row would now clean its pool up
FAILING = {"failing": {"code": "StackValidationTimeout", "message": "forged", "since": 0.0}}
OLD = 5 * HOURS  # older than any request can still be working on its pool (proof.life_s is about 2 h)

CASES = [
    # state, cluster, data, world, words
    ("accepted-under-another-teams-key", "accepted", CLUSTER, {"row_id": "research:req-1"}, None,
     ("requestId: the record 'research:req-1'",)),
    ("accepted-for-a-requester-that-is-no-team", "accepted", CLUSTER,
     {"request": {**request_body(requestId="req-1", poolName="victim"), "requester": "mallory"}}, None,
     ("'mallory' is not a team",)),
    ("creating-a-pool-of-another-owner", "creating", CLUSTER, {}, ("pool", None, {TAG_REQUEST_ID: "req-other"}),
     ("was not created by request 'req-1' of 'vision'",)),
    ("creating-a-pool-of-another-team", "creating", CLUSTER, {}, ("pool", 60.0, {TAG_REQUESTER: "research"}),
     ("was not created by request 'req-1' of 'vision'",)),
    ("creating-an-old-failed-pool", "creating", CLUSTER, {}, ("failed-pool", OLD, {}),
     ("longer than any request can still be working on it",)),
    ("creating-a-pool-with-no-creation-mark", "creating", CLUSTER, {}, ("failed-pool", None, {}),
     ("carries no creation mark",)),
    ("creating-someone-elses-nodepool", "creating", NAP_CLUSTER, {"nap": True}, ("nodepool", None, None),
     ("the NodePool 'victim' on the cluster was not made by request 'req-1'",)),
    ("validating-an-old-pool-past-its-deadline", "validating", CLUSTER, UNHEALTHY, ("pool", OLD, {}),
     ("was made 300 min ago",)),
    ("validating-a-nodepool-of-another-team", "validating", NAP_CLUSTER, {"nap": True, **UNHEALTHY},
     ("nodepool", {ANNOTATION_REQUEST_ID: "req-1", ANNOTATION_REQUESTER: "research"}, None), ("was not made by",)),
    ("validating-no-nodepool-at-all", "validating", NAP_CLUSTER, {"nap": True}, None,
     ("its NodePool/AKSNodeClass do not exist",)),
    ("testing-an-old-pool", "testing", CLUSTER, {"validate_workload": True}, ("pool", OLD, {}),
     ("longer than any request",)),
    ("testing-a-pool-that-does-not-exist", "testing", CLUSTER, {}, None, ("the pool does not exist",)),
    ("testing-someone-elses-nodepool", "testing", NAP_CLUSTER, {"nap": True}, ("nodepool", None, None),
     ("was not made by",)),
    ("a-failure-waiting-to-clean-up-an-old-pool", "validating", CLUSTER, FAILING, ("pool", OLD, {}),
     ("longer than any request",)),
    ("an-accepted-row-carrying-a-failure-to-clean-up", "accepted", CLUSTER, FAILING, ("pool", OLD, {}),
     ("this accepted row names 'victim'", "longer than any request")),
]


@pytest.mark.parametrize(("state", "cluster", "data", "setup", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_forged_row_in_any_state_touches_nothing_and_ends_blocked_with_the_reason(
        state: str, cluster: str, data: dict[str, Any], setup: tuple[Any, ...] | None, words: tuple[str, ...]) -> None:
    world = team_world()
    data = dict(data)
    row_id = data.pop("row_id", ROW)
    if setup is not None:
        what, arg, extra = setup
        if what == "nodepool":
            nodepool(world, annotations=arg)
        else:
            pool(world, age_s=arg, state="Failed" if what == "failed-pool" else "Succeeded", **extra)
    forge(world, state, cluster=cluster, row_id=row_id, **data)
    assert_blocked(world, run(world, row_id), *words)


def test_a_row_put_back_in_flight_for_a_finished_requests_idle_pool_does_not_delete_it() -> None:
    # The finished row rewritten to "validating" with a deadline long past, for the pool it made hours ago.
    world = team_world()
    pool(world, age_s=OLD)
    forge(world, "validating", **UNHEALTHY)
    assert_blocked(world, run(world), "this validating row names 'victim' on c1")
    assert world.aks.get_pool(CLUSTER, "victim") is not None


def test_a_forged_deadline_cannot_time_a_young_pool_out_sooner_than_a_genuine_request() -> None:
    world = team_world()
    pool(world, age_s=60.0)  # this request's pool, PUT a minute ago; no node is up yet
    forge(world, "validating", **UNHEALTHY)
    final = run(world)
    assert final.state == "validating" and world.aks.deletes == []
    assert final.data["deadline"] >= world.clock.now() - 60.0 + world.policy.validate_timeout_s


def test_control_the_same_young_pool_is_cleaned_up_once_its_genuine_deadline_has_passed() -> None:
    world = team_world()
    pool(world, age_s=60.0)
    forge(world, "validating", **UNHEALTHY)
    world.clock.advance(world.policy.validate_timeout_s + 1)
    final = run(world)
    assert final.state == "failed" and final.data["error"]["code"] == "StackValidationTimeout"
    assert world.aks.deletes == [(CLUSTER, "victim")]


def test_control_a_young_pool_of_this_request_is_validated_and_tested() -> None:
    world = team_world()
    pool(world, age_s=60.0)
    node = make_node("aks-victim-0", pool="victim", labels={"kubernetes.azure.com/dcgm-exporter": "enabled"},
                     allocatable={"cpu": "4", "nvidia.com/gpu": "1"}, conditions=_healthy())
    world.kube().nodes[node.name] = node
    forge(world, "validating", request={**request_body(requestId="req-1", poolName="victim"), "requester": "vision",
                                        "validateWorkload": True})
    assert run(world).state == "testing"
    world.clock.advance(world.policy.poll_interval_s)
    run(world)
    assert [j["metadata"]["name"] for j in world.kube().jobs()] == [
        job_name(records.decode(world.ledger.get(KIND, ROW).data).request)]  # type: ignore[union-attr, arg-type]


def _healthy() -> tuple[Any, ...]:
    from tests.unit.fakes_pool import HEALTHY_NPD

    return HEALTHY_NPD


def test_a_blocked_row_round_trips_as_the_record_stores_it() -> None:
    world = team_world()
    forge(world, "testing")
    final = run(world)
    stored = records.normalised(final)
    data = records.decode(stored.data)
    assert data.reason == final.data["reason"] and data.outcome is not None and data.outcome.state == State.BLOCKED
    assert records.decode(json.loads(json.dumps(stored.data))) == data
    assert final.state in records.TERMINAL_STATES and final.state not in pool_steps.ACTIVE_STATES


def test_the_life_of_a_request_covers_every_timeout_it_can_wait_through() -> None:
    policy = make_world().policy
    longest = (policy.create_timeout_s + policy.validate_timeout_s + policy.sample_job_timeout_s
               + proof.FAILING_WAIT_MAX_S)
    assert proof.life_s(policy) > longest


def test_a_genuine_request_goes_through_every_state_under_the_checks() -> None:
    from tests.unit.fakes_pool import materialise

    world = team_world()
    assert accept(message(requestId="req-1"), dequeue_count=1, ctx=world.ctx, team=VISION).status == "accepted"
    assert run(world).state == "creating"
    [put] = world.aks.puts
    assert put.body["properties"]["tags"][TAG_CREATED_AT] == str(int(world.clock.now()))
    materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    world.clock.advance(15)
    final = run(world)
    assert final.state == "succeeded" and "validating" in [line["state"] for line in final.history]
    assert world.events.types()[-1] == "Steward.PoolRequest.Created"

"""Request rows are keyed by team and request id, so one team cannot squat another's ids (issue 19, item 3).

The row of a request is ``<team>:<requestId>``. Two teams using one id get two requests; the pool one
team's request made is never adopted by the other's (the pool carries the team as well as the id);
events say the bare request id in their data; rows written before the change, keyed by the bare id,
are still found by a redelivery and by ``fleetctl requests <id>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fleetctl import records as fleetctl_records
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.pools import records
from shared.pools import steps as pool_steps
from shared.pools.intake import accept, new_record
from shared.pools.policy import PoolRequestPolicy
from shared.pools.records import KIND
from shared.pools.teams import Team
from shared.pools.validation import ValidatedRequest, parse_and_validate
from tests.unit.fakes_pool import CLUSTER, World, make_world, message

VISION = Team(name="vision", queue="q-vision", clusters=(CLUSTER,))
RESEARCH = Team(name="research", queue="q-research", clusters=(CLUSTER,))


def world_of_teams() -> World:
    world = make_world()
    world.ctx.settings = dataclasses.replace(world.ctx.settings, teams=(VISION, RESEARCH))
    return world


def run(world: World) -> None:
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})


def row(world: World, row_id: str) -> Record:
    found = world.ledger.get(KIND, row_id)
    assert found is not None
    return found


@pytest.mark.parametrize(("team", "request_id", "expected"), [
    ("vision", "req-1", "vision:req-1"), (None, "req-1", "req-1"), ("ml-platform", "a.b_c-1", "ml-platform:a.b_c-1"),
], ids=["a-team", "no-team", "every-character-a-request-id-may-hold"])
def test_a_row_id_is_team_and_request_id_and_splits_back(team: str | None, request_id: str, expected: str) -> None:
    assert records.record_id(team, request_id) == expected
    assert records.split_id(expected) == (team, request_id)


def test_another_team_using_the_same_request_id_and_pool_name_never_adopts_the_first_teams_pool() -> None:
    world = world_of_teams()
    assert accept(message(requestId="req-1"), dequeue_count=1, ctx=world.ctx, team=VISION).status == "accepted"
    run(world)
    assert row(world, "vision:req-1").state == "creating" and len(world.aks.puts) == 1
    # research sends the same id for the same pool name on the same cluster: its own row, and not vision's pool
    assert accept(message(requestId="req-1"), dequeue_count=1, ctx=world.ctx, team=RESEARCH).status == "accepted"
    run(world)
    theirs = row(world, "research:req-1")
    assert theirs.state == "failed" and theirs.data["error"]["code"] == "PoolNameTaken"
    assert len(world.aks.puts) == 1 and world.aks.deletes == []
    assert row(world, "vision:req-1").state == "creating"


def test_events_carry_the_team_in_their_id_and_the_bare_request_id_in_their_data() -> None:
    world = world_of_teams()
    accept(message(requestId="req-1"), dequeue_count=1, ctx=world.ctx, team=VISION)
    accept(message(requestId="req-1", poolName="other"), dequeue_count=1, ctx=world.ctx, team=RESEARCH)
    accepted = world.events.of_type("Steward.PoolRequest.Accepted")
    assert [e["id"] for e in accepted] == ["pool-request/vision:req-1/Accepted", "pool-request/research:req-1/Accepted"]
    assert [e["data"]["requestId"] for e in accepted] == ["req-1", "req-1"]


def _validated(**fields: Any) -> ValidatedRequest:
    result = parse_and_validate(message(**fields).encode(), policy=PoolRequestPolicy(), in_scope=lambda _: True,
                                requester="vision")
    assert isinstance(result, ValidatedRequest)
    return result


def test_a_row_an_older_version_keyed_by_the_bare_id_still_answers_its_teams_redelivery() -> None:
    world = world_of_teams()
    legacy = new_record(_validated(requestId="req-1"), now=world.clock.now(), dequeue_count=1)
    assert legacy.id == "req-1"
    world.ledger.create(msgspec_replace(legacy, announced=True))
    outcome = accept(message(requestId="req-1"), dequeue_count=2, ctx=world.ctx, team=VISION)
    assert (outcome.status, outcome.request_id) == ("duplicate", "req-1")
    assert world.ledger.get(KIND, "vision:req-1") is None
    # another team's same id is its own request, not a redelivery of vision's
    assert accept(message(requestId="req-1", poolName="rpool"), dequeue_count=1, ctx=world.ctx,
                  team=RESEARCH).status == "accepted"


def msgspec_replace(record: Record, **data: Any) -> Record:
    import msgspec

    return msgspec.structs.replace(record, data={**record.data, **data})


def test_fleetctl_finds_a_request_by_its_bare_id_unless_two_teams_used_it() -> None:
    world = world_of_teams()
    accept(message(requestId="req-1"), dequeue_count=1, ctx=world.ctx, team=VISION)
    found = fleetctl_records.get_record(world.ledger, fleetctl_records.POOL_REQUEST, "req-1")
    assert found is not None and found.id == "vision:req-1"
    view = fleetctl_records.pool_request_view(found)
    assert (view["id"], view["request_id"]) == ("vision:req-1", "req-1")
    accept(message(requestId="req-1", poolName="rpool"), dequeue_count=1, ctx=world.ctx, team=RESEARCH)
    assert fleetctl_records.get_record(world.ledger, fleetctl_records.POOL_REQUEST, "req-1") is None
    assert {r.id for r in fleetctl_records.pool_request_matches(world.ledger, "req-1")} == {
        "vision:req-1", "research:req-1"}
    assert fleetctl_records.get_record(world.ledger, fleetctl_records.POOL_REQUEST, "research:req-1") is not None


def test_blocked_is_a_terminal_state_fleetctl_knows() -> None:
    assert fleetctl_records.TERMINAL[fleetctl_records.POOL_REQUEST] == {str(s) for s in records.TERMINAL_STATES}

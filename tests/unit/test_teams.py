"""Who may ask for what: a team's queue decides who asked, and the team's entry bounds the request.

The policy (shared/pools/teams.py) by tables; then through ``intake.accept`` with the real
in-memory ledger, and through the ``handle_pool_request`` entry point with the team of the queue.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared import entrypoints
from shared.kernel.env import SettingError
from shared.kernel.errors import Invalid
from shared.pools import teams
from shared.pools.intake import accept
from shared.pools.records import KIND
from shared.pools.teams import DEFAULT_MAX_GPUS_PER_REQUEST, DEFAULT_SIZES, Team
from shared.settings import load
from tests.unit.fakes_pool import CLUSTER, NAP_CLUSTER, OTHER_SUB, SUB, make_world, message

H100 = "Standard_ND96isr_H100_v5"  # 8 GPUs per VM
A100 = "Standard_NC24ads_A100_v4"  # 1 GPU per VM
T4 = "Standard_NC4as_T4_v3"  # 1 GPU per VM
T4X4 = "Standard_NC64as_T4_v3"  # 4 GPUs per VM

VISION = Team(name="vision", queue="gpu-pool-requests-vision", clusters=(CLUSTER,))
RESEARCH = Team(name="research", queue="research-requests", clusters=None, sizes=(A100, H100), max_gpus_per_request=64)


def _entry(**fields: Any) -> str:
    return json.dumps({"vision": {"clusters": [CLUSTER], **fields}})


# --------------------------------------------------------------------------- the setting


def test_a_team_entry_that_says_nothing_gets_t4_and_a10_sizes_and_eight_gpus() -> None:
    [team] = teams.parse(_entry())
    assert team.sizes == DEFAULT_SIZES and team.max_gpus_per_request == DEFAULT_MAX_GPUS_PER_REQUEST == 8
    assert DEFAULT_SIZES and all("T4" in s or "A10" in s for s in DEFAULT_SIZES)
    assert H100 not in DEFAULT_SIZES and A100 not in DEFAULT_SIZES
    assert team.queue == "gpu-pool-requests-vision" and team.clusters == (CLUSTER,)


def test_the_default_queue_name_follows_pool_request_queue_and_a_team_may_name_its_own() -> None:
    [team] = teams.parse(_entry(), queue_prefix="pool-req")
    assert team.queue == "pool-req-vision"
    [team] = teams.parse(_entry(queue="vision-inbox"))
    assert team.queue == "vision-inbox"


def test_star_means_every_cluster_in_scope_and_every_size() -> None:
    [team] = teams.parse(json.dumps({"research": {"clusters": "*", "sizes": "*", "maxGpusPerRequest": 64}}))
    assert (team.clusters, team.sizes, team.max_gpus_per_request) == (None, None, 64)


def test_sizes_are_stored_in_their_canonical_spelling() -> None:
    [team] = teams.parse(_entry(sizes=["standard_nc24ads_a100_v4"]))
    assert team.sizes == (A100,)


@pytest.mark.parametrize(("value", "names"), [
    pytest.param("{not json", ["POOL_REQUEST_TEAMS", "not valid JSON"], id="not-json"),
    pytest.param("[]", ["POOL_REQUEST_TEAMS", "JSON object"], id="not-an-object"),
    pytest.param(json.dumps({"Vision": {"clusters": "*"}}), ["POOL_REQUEST_TEAMS", "'Vision'", "team name"],
                 id="uppercase-team-name"),
    pytest.param(json.dumps({"vision": {}}), ["team 'vision'", '"clusters" is required'], id="no-clusters"),
    pytest.param(json.dumps({"vision": {"clusters": []}}), ["team 'vision'", "non-empty list"], id="empty-clusters"),
    pytest.param(json.dumps({"vision": {"clusters": ["c1"]}}), ["team 'vision'", "'c1'", "ARM id"], id="bad-cluster"),
    pytest.param(_entry(sizes=["Standard_D4s_v5"]), ["team 'vision'", "Standard_D4s_v5", "NVIDIA"], id="not-gpu-size"),
    pytest.param(_entry(sizes=["Standard_NV4as_v4"]), ["team 'vision'", "NVIDIA"], id="amd-size"),
    pytest.param(_entry(maxGpusPerRequest=0), ["team 'vision'", "maxGpusPerRequest"], id="zero-gpus"),
    pytest.param(_entry(maxGpusPerRequest="8"), ["team 'vision'", "maxGpusPerRequest"], id="gpus-as-text"),
    pytest.param(_entry(maxGpusPerRequest=8001), ["team 'vision'", "maxGpusPerRequest"], id="gpus-over-limit"),
    pytest.param(_entry(queue="Vision_Q"), ["team 'vision'", "'Vision_Q'", "queue name"], id="bad-queue"),
    pytest.param(_entry(queue="vision-poison"), ["team 'vision'", "-poison"], id="poison-queue-name"),
    pytest.param(_entry(maxGpus=8), ["team 'vision'", "unknown key", "maxGpus"], id="unknown-key"),
    pytest.param(json.dumps({"a1": {"clusters": "*", "queue": "same-q"}, "b2": {"clusters": "*", "queue": "same-q"}}),
                 ["POOL_REQUEST_TEAMS", "a1, b2", "share queue"], id="two-teams-one-queue"),
    pytest.param('{"vision": {"clusters": "*"}, "vision": {"clusters": "*", "sizes": "*"}}',
                 ["POOL_REQUEST_TEAMS", "'vision'", "appears twice"], id="a-team-written-twice"),
    pytest.param('{"vision": {"clusters": "*", "maxGpusPerRequest": 2, "maxGpusPerRequest": 64}}',
                 ["POOL_REQUEST_TEAMS", "'maxGpusPerRequest'", "appears twice"], id="a-field-written-twice"),
])
def test_a_bad_teams_setting_is_refused_naming_the_setting_and_the_team(value: str, names: list[str]) -> None:
    with pytest.raises(SettingError) as error:
        teams.parse(value)
    assert all(name in str(error.value) for name in names), str(error.value)


def test_a_team_cluster_outside_the_fleet_subscriptions_is_refused() -> None:
    other = CLUSTER.replace(SUB, OTHER_SUB)
    with pytest.raises(SettingError, match="not in FLEET_SUBSCRIPTIONS"):
        teams.parse(json.dumps({"vision": {"clusters": [other]}}), subscriptions=(SUB,))


BASE = {"FLEET_SUBSCRIPTIONS": SUB, "EVENTGRID_TOPIC_ENDPOINT": "https://topic.example/api/events",
        "AzureWebJobsStorage": "UseDevelopmentStorage=true"}


@pytest.mark.parametrize(("overrides", "names"), [
    pytest.param({"POOL_REQUEST_TEAMS": _entry()}, ["POOL_REQUEST_TEAMS", "TeamRequestsStorage"],
                 id="teams-without-their-storage"),
    pytest.param({"POOL_REQUEST_TEAMS": _entry(queue="steward-nudge"), "TeamRequestsStorage": "UseDevelopmentStorage=true"},
                 ["POOL_REQUEST_TEAMS", "NUDGE_QUEUE"], id="team-queue-is-the-nudge-queue"),
    pytest.param({"POOL_REQUEST_TEAMS": json.dumps({"vision": {"clusters": [CLUSTER.replace(SUB, OTHER_SUB)]}}),
                  "TeamRequestsStorage": "UseDevelopmentStorage=true"},
                 ["POOL_REQUEST_TEAMS", "FLEET_SUBSCRIPTIONS"], id="team-cluster-outside-subscriptions"),
    pytest.param({"POOL_REQUEST_TEAMS": "{", "TeamRequestsStorage": "UseDevelopmentStorage=true"},
                 ["POOL_REQUEST_TEAMS"], id="malformed"),
])
def test_settings_refuse_a_teams_configuration_that_cannot_work(overrides: dict[str, str], names: list[str]) -> None:
    with pytest.raises(SettingError) as error:
        load({**BASE, **overrides})
    assert all(name in str(error.value) for name in names), str(error.value)


def test_settings_load_the_teams_with_identity_based_team_storage() -> None:
    s = load({**BASE, "POOL_REQUEST_TEAMS": _entry(),
              "TeamRequestsStorage__queueServiceUri": "https://stteams.queue.core.windows.net"})
    assert [t.name for t in s.teams] == ["vision"]
    assert s.describe()["teams"]["vision"]["queue"] == "gpu-pool-requests-vision"
    assert load(BASE).teams == ()


# --------------------------------------------------------------------------- the rule, by table


@pytest.mark.parametrize(("team", "cluster", "size", "gpus", "count", "amax", "fields"), [
    pytest.param(VISION, CLUSTER, T4, 1, 8, None, [], id="vision-eight-t4-within-limits"),
    pytest.param(VISION, CLUSTER, T4, 1, 9, None, ["count"], id="vision-nine-t4-over-eight-gpus"),
    pytest.param(VISION, CLUSTER, T4X4, 4, 3, None, ["count"], id="vision-three-4gpu-vms-is-twelve-gpus"),
    pytest.param(VISION, CLUSTER, T4, 1, None, 9, ["autoscale.max"], id="vision-autoscale-max-counts"),
    pytest.param(VISION, NAP_CLUSTER, T4, 1, 1, None, ["cluster"], id="vision-other-cluster"),
    pytest.param(VISION, CLUSTER.upper(), T4, 1, 1, None, [], id="vision-cluster-id-case-insensitive"),
    pytest.param(VISION, CLUSTER, H100, 8, 125, None, ["vmSize", "count"], id="vision-1000-h100s"),
    pytest.param(VISION, NAP_CLUSTER, A100, 1, 1, None, ["cluster", "vmSize"], id="vision-every-rule-at-once"),
    pytest.param(RESEARCH, NAP_CLUSTER, H100, 8, 8, None, [], id="research-any-cluster-64-gpus"),
    pytest.param(RESEARCH, NAP_CLUSTER, H100, 8, 9, None, ["count"], id="research-72-gpus"),
    pytest.param(RESEARCH, CLUSTER, T4, 1, 1, None, ["vmSize"], id="research-not-allowed-t4"),
])
def test_a_request_outside_its_teams_rules_is_named_field_by_field(team: Team, cluster: str, size: str, gpus: int,
                                                                  count: int | None, amax: int | None,
                                                                  fields: list[str]) -> None:
    found = teams.violations(team, cluster=cluster, vm_size=size, gpus_per_vm=gpus, count=count, autoscale_max=amax)
    assert [v.field for v in found] == fields
    for v in found:
        assert f"team {team.name!r}" in v.problem and "POOL_REQUEST_TEAMS" in v.problem


# --------------------------------------------------------------------------- through accept


def test_a_request_on_a_teams_queue_outside_its_mapping_is_rejected_with_the_team_rule() -> None:
    world = make_world()
    outcome = accept(message(requestId="big-ask", cluster=NAP_CLUSTER, vmSize=H100, count=125), dequeue_count=1,
                     ctx=world.ctx, team=VISION)
    assert outcome.status == "rejected"
    stored = world.ledger.get(KIND, "vision:big-ask")
    assert stored is not None and stored.state == "rejected" and stored.data["requester"] == "vision"
    fields = [p["field"] for p in stored.data["problems"]]
    assert fields == ["cluster", "vmSize", "count"]
    assert all("team 'vision'" in reason and "POOL_REQUEST_TEAMS" in reason for reason in stored.data["reasons"])
    assert "1000 GPUs" in stored.data["reasons"][2]
    assert world.events.types() == ["Steward.PoolRequest.Rejected"]
    assert world.aks.puts == []


def test_the_requester_recorded_is_the_team_of_the_queue_even_if_the_message_claims_another() -> None:
    world = make_world()
    outcome = accept(message(requester="research"), dequeue_count=1, ctx=world.ctx, team=VISION)
    assert outcome.status == "accepted"
    stored = world.ledger.get(KIND, "vision:req-0001")
    assert stored is not None and outcome.request_id == stored.id
    assert stored.data["requester"] == "vision" and stored.data["request"]["requester"] == "vision"
    assert stored.data["claimed_requester"] == "research" and stored.data["team"] == "vision"
    assert stored.data["queue"] == VISION.queue


def test_the_same_request_id_from_another_teams_queue_is_that_teams_own_request() -> None:
    # Rows are keyed by team and request id: neither team can squat (or be taken for a redelivery of) the other's.
    world = make_world()
    assert accept(message(), dequeue_count=1, ctx=world.ctx, team=VISION).status == "accepted"
    other = Team(name="research", queue="gpu-pool-requests-research", clusters=None)
    outcome = accept(message(poolName="respool"), dequeue_count=1, ctx=world.ctx, team=other)
    assert (outcome.status, outcome.request_id) == ("accepted", "research:req-0001")
    assert world.ledger.get(KIND, "vision:req-0001").data["requester"] == "vision"  # type: ignore[union-attr]
    assert world.ledger.get(KIND, "research:req-0001").data["requester"] == "research"  # type: ignore[union-attr]
    # and each team's redelivery is its own duplicate
    assert accept(message(), dequeue_count=2, ctx=world.ctx, team=VISION).status == "duplicate"
    assert accept(message(poolName="respool"), dequeue_count=2, ctx=world.ctx, team=other).status == "duplicate"


def test_an_invalid_request_on_a_teams_queue_is_filed_under_the_team() -> None:
    world = make_world()
    outcome = accept(message(requester="someone-else", vmSize="Standard_D4s_v5"), dequeue_count=1, ctx=world.ctx,
                     team=VISION)
    assert outcome.status == "rejected"
    assert world.ledger.get(KIND, "vision:req-0001").data["requester"] == "vision"  # type: ignore[union-attr]


def test_the_entry_point_applies_the_team_named_by_the_trigger() -> None:
    world = make_world()
    world.ctx.settings = _with_teams(world.ctx.settings, (VISION,))
    result = entrypoints.handle_pool_request(message(count=9).encode(), team="vision", ctx=world.ctx)
    assert (result.status, result.nudge) == ("rejected", None)
    with pytest.raises(SettingError, match="no team 'ghost'"):
        entrypoints.handle_pool_request(message(requestId="r2").encode(), team="ghost", ctx=world.ctx)
    assert world.ledger.get(KIND, "r2") is None


def _with_teams(settings: Any, team_list: tuple[Team, ...]) -> Any:
    import dataclasses

    return dataclasses.replace(settings, teams=team_list)


# --------------------------------------------------------------------------- the team's total


def _pool(team: str, request_id: str, *, size: str = T4, count: int = 1, autoscale_max: int | None = None
          ) -> dict[str, Any]:
    props: dict[str, Any] = {"vmSize": size, "count": count,
                             "tags": {teams.TAG_REQUESTER: team, teams.TAG_REQUEST_ID: request_id}}
    if autoscale_max is not None:
        props.update(enableAutoScaling=True, maxCount=autoscale_max)
    return props


def _active(team: str, request_id: str, *, size: str = T4, count: int | None = 1,
            autoscale_max: int | None = None) -> teams.InFlight:
    return teams.InFlight(requester=team, request_id=request_id, vm_size=size, count=count, autoscale_max=autoscale_max)


@pytest.mark.parametrize(("pools", "active", "exclude", "expected"), [
    pytest.param([], [], "", 0, id="nothing"),
    pytest.param([_pool("vision", "a", size=T4X4, count=2)], [], "", 8, id="a-pool-of-4gpu-vms"),
    pytest.param([_pool("vision", "a", count=2, autoscale_max=5)], [], "", 5, id="autoscaled-pool-at-its-max"),
    pytest.param([_pool("research", "r", count=9)], [], "", 0, id="another-teams-pool"),
    pytest.param([{"vmSize": T4, "count": 9}], [], "", 0, id="an-untagged-pool"),
    pytest.param([], [_active("vision", "b", count=3)], "", 3, id="a-request-in-flight"),
    pytest.param([], [_active("vision", "b", count=None, autoscale_max=4)], "", 4, id="autoscaled-request"),
    pytest.param([_pool("vision", "a", count=2)], [_active("vision", "a", count=2)], "", 2,
                 id="a-request-whose-pool-exists-counts-once"),
    pytest.param([_pool("vision", "a", count=2)], [_active("vision", "b", count=3)], "b", 2,
                 id="the-request-judged-does-not-count-itself"),
    pytest.param([_pool("vision", "a", count=2)], [], "a", 0, id="nor-its-own-pool"),
])
def test_the_gpus_a_team_holds_are_its_tagged_pools_and_requests_in_flight(
        pools: list[dict[str, Any]], active: list[teams.InFlight], exclude: str, expected: int) -> None:
    assert teams.gpus_in_use("vision", pools=pools, active_requests=active, exclude_request_id=exclude) == expected


@pytest.mark.parametrize("count", ["lots", "2", 2.5, True, -1], ids=["text", "numeric-text", "fraction", "bool", "negative"])
def test_a_pool_count_that_is_not_a_whole_number_is_refused_rather_than_read_as_zero(count: Any) -> None:
    pool = {**_pool("vision", "a"), "count": count}
    with pytest.raises(Invalid):
        teams.gpus_in_use("vision", pools=[pool], active_requests=[])


def test_a_request_never_fits_under_the_team_total_when_a_pool_count_is_malformed() -> None:
    capped = Team(name="vision", queue="q-vision", clusters=(CLUSTER,), max_gpus_total=8)
    world = make_world()
    world.aks.pools[(CLUSTER.lower(), "old")] = {**_pool("vision", "old"), "count": "many"}
    outcome = accept(message(), dequeue_count=1, ctx=world.ctx, team=capped)
    assert outcome.status == "rejected"
    assert any("cannot be counted" in p.problem for p in outcome.problems), outcome.problems


def test_the_team_total_is_named_when_exceeded_and_ignored_when_not_set() -> None:
    capped = Team(name="vision", queue="q-vision", clusters=None, max_gpus_total=8)
    [v] = teams.violations(capped, cluster=CLUSTER, vm_size=T4, gpus_per_vm=1, count=3, autoscale_max=None, in_use=6)
    assert v.field == "count" and "maxGpusTotal is 8" in v.problem and "9 GPUs" in v.problem
    assert teams.violations(capped, cluster=CLUSTER, vm_size=T4, gpus_per_vm=1, count=2, autoscale_max=None,
                            in_use=6) == []
    assert teams.violations(VISION, cluster=CLUSTER, vm_size=T4, gpus_per_vm=1, count=2, autoscale_max=None,
                            in_use=10_000) == []
    [team] = teams.parse(_entry(maxGpusTotal=32))
    assert team.max_gpus_total == 32 and teams.parse(_entry())[0].max_gpus_total is None


def test_a_request_that_would_pass_the_teams_total_is_rejected_counting_pools_and_requests_in_flight() -> None:
    from shared.kernel.reconciler import reconcile_once
    from shared.pools import steps as pool_steps

    world = make_world()
    capped = Team(name="vision", queue="q-vision", clusters=(CLUSTER,), max_gpus_total=8)
    first = accept(message(requestId="a", poolName="poola", count=6), dequeue_count=1, ctx=world.ctx, team=capped)
    assert first.status == "accepted"
    second = accept(message(requestId="b", poolName="poolb", count=3), dequeue_count=1, ctx=world.ctx, team=capped)
    assert second.status == "rejected"
    assert "maxGpusTotal is 8" in world.ledger.get(KIND, "vision:b").data["reasons"][0]  # type: ignore[union-attr]
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})  # a: PUT, the pool exists in ARM now
    assert [p.pool for p in world.aks.puts] == ["poola"]
    # a redelivery of a is not counted against itself; c fits beside a's 6 GPUs
    assert accept(message(requestId="a", poolName="poola", count=6), dequeue_count=2, ctx=world.ctx,
                  team=capped).status == "duplicate"
    assert accept(message(requestId="c", poolName="poolc", count=2), dequeue_count=1, ctx=world.ctx,
                  team=capped).status == "accepted"
    assert accept(message(requestId="d", poolName="poold", count=1), dequeue_count=1, ctx=world.ctx,
                  team=capped).status == "rejected"


def test_pools_the_ledger_no_longer_follows_are_counted_from_arm() -> None:
    world = make_world()
    capped = Team(name="vision", queue="q-vision", clusters=None, max_gpus_total=8)
    # created long ago (its record is finished), still running 2 x 4 GPUs, tagged with the team
    world.aks.pools[(NAP_CLUSTER.lower(), "old")] = _pool("vision", "old-request", size=T4X4, count=2)
    world.aks.pools[(CLUSTER.lower(), "theirs")] = _pool("research", "r1", size=T4X4, count=2)
    outcome = accept(message(requestId="e", count=1), dequeue_count=1, ctx=world.ctx, team=capped)
    assert outcome.status == "rejected"
    assert "8 in its pools" in world.ledger.get(KIND, "vision:e").data["reasons"][0]  # type: ignore[union-attr]

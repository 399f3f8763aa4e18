"""One cluster's share of the breaker (issue 19): its nodes count at most a share of what opens it."""

from __future__ import annotations

import pytest

from shared.remediation import breaker
from shared.remediation.policy import RemediationPolicy
from tests.unit.fakes_remediation import Fleet

NOW = 1_764_684_000.0
POLICY = RemediationPolicy()


def obs(n: int, *, cluster: str, at: float = NOW - 60) -> tuple[dict[str, float], dict[str, str]]:
    """``n`` nodes of ``cluster`` turned unhealthy at ``at``: (observations, origins)."""
    keys = [f"{cluster}-n{i}" for i in range(n)]
    return {k: at for k in keys}, {k: cluster for k in keys}


def merged(*parts: tuple[dict[str, float], dict[str, str]]) -> tuple[dict[str, float], dict[str, str]]:
    observations: dict[str, float] = {}
    origins: dict[str, str] = {}
    for o, c in parts:
        observations.update(o)
        origins.update(c)
    return observations, origins


TRIP = [
    ("the percentage rule: more than 30 percent of 50 nodes is 16", 50, POLICY, 16),
    ("a small fleet needs BREAKER_MIN_NODES", 6, POLICY, 3),
    ("an absolute count below the percentage wins", 1000, RemediationPolicy(breaker_max_nodes=10), 10),
    ("no GPU nodes seen and no absolute count: nothing opens it", 0, POLICY, None),
    ("a disabled breaker never opens", 50, RemediationPolicy(breaker_enabled=False), None),
]


@pytest.mark.parametrize(("fleet", "policy", "expected"), [c[1:] for c in TRIP], ids=[c[0] for c in TRIP])
def test_the_trip_count_is_the_fewest_nodes_that_open_the_breaker(fleet: int, policy: RemediationPolicy,
                                                                   expected: int | None) -> None:
    assert breaker.trip_count(fleet, policy) == expected
    if expected is not None:
        assert breaker.should_trip(expected, fleet, policy) is not None
        assert breaker.should_trip(expected - 1, fleet, policy) is None


CAPS = [
    ("two clusters, the default half of 16", 50, 2, POLICY, 8),
    ("a fleet of one cluster is not capped", 50, 1, POLICY, None),
    ("a share of 100 turns the cap off", 50, 3, RemediationPolicy(breaker_cluster_share_percent=100), None),
    ("a small fleet rounds the share up", 6, 2, POLICY, 2),
    ("a share of 1 percent still counts one node per cluster", 50, 2,
     RemediationPolicy(breaker_cluster_share_percent=1), 1),
    ("a share of 99 stays one below the trip count", 50, 2, RemediationPolicy(breaker_cluster_share_percent=99), 15),
    ("an absolute count of 10 gives each cluster 5", 1000, 4, RemediationPolicy(breaker_max_nodes=10), 5),
    ("a single node opens it: no share can apply", 50, 2, RemediationPolicy(breaker_max_nodes=1), 1),
    ("a disabled breaker needs no cap", 50, 2, RemediationPolicy(breaker_enabled=False), None),
]


@pytest.mark.parametrize(("fleet", "clusters", "policy", "expected"), [c[1:] for c in CAPS], ids=[c[0] for c in CAPS])
def test_the_cluster_cap(fleet: int, clusters: int, policy: RemediationPolicy, expected: int | None) -> None:
    cap = breaker.cluster_cap(fleet_nodes=fleet, fleet_clusters=clusters, policy=policy)
    assert cap == expected
    trip = breaker.trip_count(fleet, policy)
    if cap is not None and trip is not None and trip > 1:
        assert cap < trip, "one cluster alone must never reach the trip count"


COUNTED = [
    ("uncapped, every node counts", {"a": 9, "b": 2}, None, 11),
    ("capped, a cluster counts at most the cap", {"a": 9, "b": 2}, 4, 6),
    ("nodes without an origin count as one more cluster", {"a": 9, "": 7}, 4, 8),
    ("an empty window counts nothing", {}, 4, 0),
]


@pytest.mark.parametrize(("per_cluster", "cap", "expected"), [c[1:] for c in COUNTED], ids=[c[0] for c in COUNTED])
def test_what_the_breaker_counts(per_cluster: dict[str, int], cap: int | None, expected: int) -> None:
    window = {f"{c}-{i}": NOW for c, n in per_cluster.items() for i in range(n)}
    origins = {f"{c}-{i}": c for c, n in per_cluster.items() if c for i in range(n)}
    assert breaker.counted(window, origins, cap) == expected


DECIDE = [
    ("one cluster's 10 of 20 nodes, with another cluster in the fleet, keep it closed",
     merged(obs(10, cluster="a")), 2, breaker.CLOSED),
    ("the same 10 nodes in a fleet of one cluster open it", merged(obs(10, cluster="a")), 1, breaker.OPEN),
    ("4 and 4 nodes of two clusters open it (7 of 20 do)", merged(obs(4, cluster="a"), obs(4, cluster="b")), 2,
     breaker.OPEN),
    ("10 nodes of one cluster and 1 of another stay below 7 counted", merged(obs(10, cluster="a"), obs(1, cluster="b")),
     3, breaker.CLOSED),
]


@pytest.mark.parametrize(("seen", "clusters", "expected"), [c[1:] for c in DECIDE], ids=[c[0] for c in DECIDE])
def test_decide_caps_each_clusters_share(seen: tuple[dict[str, float], dict[str, str]], clusters: int,
                                         expected: str) -> None:
    observations, origins = seen
    state = breaker.decide(breaker.BreakerState(), observations, fleet_nodes=20, policy=POLICY, now=NOW,
                           origins=origins, fleet_clusters=clusters)
    assert state.state == expected
    assert len(state.window) == len(observations), "every node stays in the window; only the count is capped"


def test_the_share_holds_across_sweeps_as_one_cluster_keeps_failing() -> None:
    state = breaker.BreakerState()
    for sweep in range(5):
        observations, origins = obs(4 * (sweep + 1), cluster="a")
        state = breaker.decide(state, observations, fleet_nodes=20, policy=POLICY, now=NOW + 30 * sweep,
                               origins=origins, fleet_clusters=3)
    assert not state.is_open and len(state.window) == 20
    observations, origins = obs(3, cluster="b")
    assert breaker.decide(state, observations, fleet_nodes=20, policy=POLICY, now=NOW + 200, origins=origins,
                          fleet_clusters=3).is_open, "another cluster's faults add to the first one's share"


def test_the_reason_says_the_count_was_capped() -> None:
    observations, origins = merged(obs(10, cluster="a"), obs(4, cluster="b"))
    state = breaker.decide(breaker.BreakerState(), observations, fleet_nodes=20, policy=POLICY, now=NOW,
                           origins=origins, fleet_clusters=2)
    assert state.is_open and state.reason.startswith("8 of 20 GPU nodes (40%)")
    assert "at most 4 counted per cluster (BREAKER_CLUSTER_SHARE_PERCENT)" in state.reason


def test_origins_survive_the_ledger_and_opened_reports_the_count() -> None:
    fleet = Fleet()
    ctx = fleet.ctx()
    observations, origins = obs(10, cluster="/subscriptions/s/resourceGroups/rg/providers/x/managedClusters/a")
    state = breaker.update(ctx, observations=observations, origins=origins, fleet_nodes=20, fleet_clusters=2,
                           policy=POLICY)
    assert not state.is_open
    stored = breaker.current(ctx)
    assert stored.origins == state.origins and set(stored.origins) == set(observations)
    assert stored.fleet_clusters == 2
    more, more_origins = obs(3, cluster="b")
    assert breaker.update(ctx, observations=more, origins=more_origins, fleet_nodes=20, policy=POLICY).is_open
    [opened] = [e for e in fleet.events.published if e["type"] == breaker.OPENED_EVENT]
    assert opened["data"]["counted"] == 7 and opened["data"]["cluster_cap"] == 4
    assert opened["data"]["unhealthy_in_window"] == 13 and opened["data"]["clusters_in_window"] == 2


def test_a_record_without_origins_still_loads_and_counts_as_one_group() -> None:
    fleet = Fleet()
    ctx = fleet.ctx()
    breaker.update(ctx, observations={f"old{i}": NOW for i in range(5)}, fleet_nodes=20, policy=POLICY)
    fleet.clock.advance(10)
    state = breaker.update(ctx, observations={}, fleet_nodes=20, fleet_clusters=2, policy=POLICY)
    assert not state.is_open and state.origins == {} and len(state.window) == 5


def test_a_window_of_many_clusters_is_trimmed_to_fit_the_table() -> None:
    fleet = Fleet()
    ctx = fleet.ctx()
    observations = {f"{i:024x}": NOW - 500 + i * 0.123456789 for i in range(400)}
    origins = {k: f"/subscriptions/s/resourceGroups/rg/providers/x/managedClusters/c{i}" for i, k in
               enumerate(observations)}
    state = breaker.update(ctx, observations=observations, origins=origins, fleet_nodes=100_000, fleet_clusters=400,
                           policy=POLICY)
    assert 250 < len(state.window) < 400, "the oldest entries are dropped, the newest kept"
    assert min(state.window.values()) > min(observations.values())
    record = ctx.ledger.get(breaker.KIND, breaker.ID)
    assert record is not None and ctx.ledger.data_bytes(record) <= breaker.WINDOW_BUDGET_BYTES + 1024


def test_a_full_window_of_a_few_clusters_keeps_every_entry() -> None:
    fleet = Fleet()
    ctx = fleet.ctx()
    observations = {f"{i:024x}": NOW - 500 + i + 0.123456789 for i in range(breaker.MAX_WINDOW_ENTRIES)}
    origins = {k: f"/subscriptions/s/resourceGroups/rg/providers/x/managedClusters/c{i % 5}" for i, k in
               enumerate(observations)}
    state = breaker.update(ctx, observations=observations, origins=origins, fleet_nodes=100_000, fleet_clusters=5,
                           policy=POLICY)
    assert len(state.window) == breaker.MAX_WINDOW_ENTRIES and len(breaker.current(ctx).origins) == 400

"""No tenant holds the fleet's budget (issue 19, item 3): a cluster's share of the in-flight slots, and a
drain a PodDisruptionBudget blocks gives its fleet slot back after BUDGET_BLOCKED_DRAIN_SLOT_S."""

from __future__ import annotations

from typing import Any

import pytest

from shared.drain.settings import DrainSettings
from shared.drain.state import DrainState, Evict, drain_step, record_eviction
from shared.kernel.ports import EVICTED, EVICTION_BLOCKED, EvictionResult
from shared.remediation import budget
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import State
from tests.unit.fakes_remediation import make_pod

NOW = 1_764_684_000.0
POLICY = RemediationPolicy()

CLUSTER = [
    ("no remediation in the cluster: admitted", 0, 3, POLICY, True),
    ("two in flight, the default share of three: admitted", 2, 3, POLICY, True),
    ("three in flight: the cluster's share is full", 3, 2, POLICY, False),
    ("a share of 0 admits nothing", 0, 2, RemediationPolicy(cluster_max_in_flight=0), False),
    ("a share at the fleet cap leaves only the fleet cap", 4, 2, RemediationPolicy(cluster_max_in_flight=5), True),
    ("a fleet of one cluster keeps the whole fleet cap", 4, 1, POLICY, True),
    ("before the first sweep counted the clusters, no share applies", 4, 0, POLICY, True),
]


@pytest.mark.parametrize(("in_flight", "clusters", "policy", "allowed"), [c[1:] for c in CLUSTER],
                         ids=[c[0] for c in CLUSTER])
def test_cluster_admission(in_flight: int, clusters: int, policy: RemediationPolicy, allowed: bool) -> None:
    cluster = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/team-a"
    verdict = budget.cluster_admission(cluster=cluster, in_flight_in_cluster=in_flight, fleet_clusters=clusters,
                                       policy=policy)
    assert verdict.allowed is allowed
    if not allowed:
        assert verdict.code == budget.CLUSTER_BUDGET
        assert verdict.reason.startswith(f"cluster team-a: {in_flight} remediations in flight")
        assert "BUDGET_CLUSTER_MAX_IN_FLIGHT" in verdict.reason


def test_the_default_cluster_share_is_below_the_fleet_cap() -> None:
    assert 0 < POLICY.cluster_max_in_flight < POLICY.max_in_flight
    assert RemediationPolicy.from_env({}).cluster_max_in_flight == 3
    assert RemediationPolicy.from_env({"BUDGET_CLUSTER_MAX_IN_FLIGHT": "1"}).cluster_max_in_flight == 1


def test_the_chain_checks_the_cluster_share_before_the_fleet_cap() -> None:
    ok = budget.Admission.ok
    full = budget.cluster_admission(cluster="c", in_flight_in_cluster=3, fleet_clusters=2, policy=POLICY)
    verdict = budget.admit(paused=None, breaker_open=False, node=ok(), pool=ok("pool fine"), cluster=full,
                           fleet=budget.fleet_admission(in_flight=5, policy=POLICY))
    assert verdict.code == budget.CLUSTER_BUDGET
    both = budget.admit(paused=None, breaker_open=False, node=ok(), pool=ok("pool fine"),
                        cluster=ok("1 of 3 in the cluster"), fleet=ok("2 of 5"))
    assert both.allowed and both.reason == "pool fine; 1 of 3 in the cluster; 2 of 5"
    assert budget.admit(paused=None, breaker_open=False, node=ok(), pool=ok("p"), fleet=ok("f")).reason == "p; f"
    assert budget.CLUSTER_BUDGET in budget.REFUSAL_CODES


def blocked(since: float, *, outcome: str = "") -> dict[str, Any]:
    """A drain's stored state with one pod a PodDisruptionBudget has refused since ``since``."""
    return {"started_at": since - 10, "blocked": {"uid-1": {"ns": "default", "name": "p", "since": since, "tries": 4}},
            "outcome": outcome}


SLOT = [
    ("a drain blocked for 301 s frees its fleet slot", State.DRAINING, blocked(NOW - 301), POLICY, False),
    ("a drain blocked for 299 s still holds it", State.DRAINING, blocked(NOW - 299), POLICY, True),
    ("exactly at the limit the slot is free", State.DRAINING, blocked(NOW - 300), POLICY, False),
    ("a drain nothing blocks holds it", State.DRAINING, {"started_at": NOW - 3600}, POLICY, True),
    ("a drain not started yet holds it", State.DRAINING, None, POLICY, True),
    ("a stopped drain is no longer running: it holds it until its record ends", State.DRAINING,
     blocked(NOW - 4000, outcome="stalled"), POLICY, True),
    ("0 keeps today's rule: a blocked drain holds its slot until it ends", State.DRAINING, blocked(NOW - 4000),
     RemediationPolicy(blocked_drain_slot_s=0), True),
    ("a longer setting waits longer", State.DRAINING, blocked(NOW - 400), RemediationPolicy(blocked_drain_slot_s=600),
     True),
    ("a remediation repairing holds it whatever its old drain says", State.REPAIRING, blocked(NOW - 4000), POLICY, True),
    ("a cordoned remediation holds it", State.CORDONED, None, POLICY, True),
]


@pytest.mark.parametrize(("state", "drain", "policy", "held"), [c[1:] for c in SLOT], ids=[c[0] for c in SLOT])
def test_holds_fleet_slot(state: str, drain: dict[str, Any] | None, policy: RemediationPolicy, held: bool) -> None:
    assert budget.holds_fleet_slot(state=state, drain=drain, now=NOW, policy=policy) is held


def test_a_slot_taken_again_after_waiting_gets_the_full_time_anew() -> None:
    drain = blocked(NOW - 4000)
    assert not budget.holds_fleet_slot(state=State.DRAINING, drain=drain, now=NOW, policy=POLICY)
    assert budget.holds_fleet_slot(state=State.DRAINING, drain=drain, now=NOW, policy=POLICY, taken_at=NOW - 120)
    assert not budget.holds_fleet_slot(state=State.DRAINING, drain=drain, now=NOW, policy=POLICY, taken_at=NOW - 300)


def test_a_drain_the_eviction_api_keeps_refusing_gives_its_slot_back_and_takes_it_again_once_unblocked() -> None:
    """Through the drain's own state: 429s from the Eviction API (a PDB), then the budget lets the pod go."""
    settings = DrainSettings()
    pod = make_pod("web-0", "aks-gpu-1")
    state, [evict] = drain_step(node="aks-gpu-1", pods=[pod], previous=DrainState(), now=NOW, settings=settings)
    t = NOW
    while t < NOW + 400:
        state = record_eviction(state, evict, EvictionResult(outcome=EVICTION_BLOCKED, message="429 Too Many Requests",
                                                             pdb="web"), now=t, grace=30, settings=settings)
        held = budget.holds_fleet_slot(state=State.DRAINING, drain=state.to_data(), now=t, policy=POLICY)
        assert held is (t - NOW < POLICY.blocked_drain_slot_s), t
        assert budget.blocked_since(state) == NOW
        t += 20
    state = record_eviction(state, Evict(namespace="default", name="web-0", uid=pod.uid),
                            EvictionResult(outcome=EVICTED), now=t, grace=30, settings=settings)
    assert budget.blocked_since(state) is None
    assert budget.holds_fleet_slot(state=State.DRAINING, drain=state, now=t, policy=POLICY)


def test_the_settings_are_read_with_their_defaults() -> None:
    policy = RemediationPolicy.from_env({})
    assert (policy.blocked_drain_slot_s, policy.breaker_cluster_share_percent, policy.breaker_verify_max_nodes) == \
        (300, 50, 100)
    custom = RemediationPolicy.from_env({"BUDGET_BLOCKED_DRAIN_SLOT_S": "0", "BREAKER_CLUSTER_SHARE_PERCENT": "100",
                                         "BREAKER_VERIFY_MAX_NODES": "7"})
    assert (custom.blocked_drain_slot_s, custom.breaker_cluster_share_percent, custom.breaker_verify_max_nodes) == \
        (0, 100, 7)

"""May one more GPU node be taken out of service now? Small pure functions, checked in order.

Modelled on Cluster API's ``isAllowedRemediation`` / ``getMaxUnhealthy``, with three independent
blast-radius limits (the anchors' lesson 2) plus per-node guards: pause, breaker, per-node cooldown
and attempt cap, per-pool max unavailable (count and percentage, the stricter wins; nodes under
remediation *and* nodes already NotReady or cordoned count as unavailable), and a fleet-wide cap on
remediations in flight. Each function returns an :class:`Admission` whose ``reason`` is what the
Refused event and the operator see. The caller (shared.remediation.admission) gathers the observations and
serializes admissions so that two hosts cannot both take the last slot.

Rounding of the percentage: ``floor(pool_size * percent / 100)``, but at least 1 when the
percentage is above 0 and the pool has nodes. Without the floor of 1 a pool of fewer than 5 nodes
could never be repaired at the default 20 %, leaving its broken GPU node (already useless to
workloads) cordoned forever; one node at a time is also what AKS auto-repair does. A count or
percentage of 0 admits nothing (an explicit stop); set 100 to turn the percentage rule off.

No tenant holds the fleet (issue 19). One cluster may have at most ``cluster_max_in_flight``
remediations in flight (BUDGET_CLUSTER_MAX_IN_FLIGHT = 3, below the fleet's 5), so the PodDisruptionBudgets
or the storm of one cluster never take every fleet slot; like every count here, 0 admits nothing, and a
value at or above BUDGET_MAX_IN_FLIGHT leaves the fleet cap alone. The share applies once the fleet has
GPU nodes in more than one cluster (the last sweep's count, kept by the breaker): a fleet of one
cluster has no other team to protect, and keeps the whole fleet cap. And
a drain a PodDisruptionBudget keeps refusing stops holding its slot after ``blocked_drain_slot_s``
(BUDGET_BLOCKED_DRAIN_SLOT_S = 300; 0 = it holds it until the drain ends): :func:`holds_fleet_slot`.
It keeps its cordon (so it still counts against its pool's budget), and before it goes on it takes a
slot again under the same rules (the fleet cap and its cluster's share), or waits.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.drain.state import DrainOutcome, DrainState
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import State

PAUSED = "paused"
OPTED_OUT = "opt-out"  # the node's opt-out label: a person's choice for that node (never kept for later)
BREAKER = "breaker"
COOLDOWN = "cooldown"
ATTEMPTS = "attempts"
POOL_BUDGET = "budget-pool"
FLEET_BUDGET = "budget-fleet"
CLUSTER_BUDGET = "budget-cluster"
REFUSAL_CODES: tuple[str, ...] = (PAUSED, BREAKER, COOLDOWN, ATTEMPTS, POOL_BUDGET, CLUSTER_BUDGET, FLEET_BUDGET)


@dataclass(frozen=True)
class Admission:
    allowed: bool
    reason: str
    code: str = ""  # one of REFUSAL_CODES when refused

    @staticmethod
    def ok(reason: str = "within every budget") -> Admission:
        return Admission(True, reason)

    @staticmethod
    def refuse(code: str, reason: str) -> Admission:
        return Admission(False, reason, code)


def max_unavailable(pool_size: int, *, count: int, percent: int) -> int:
    """How many nodes of a pool of ``pool_size`` may be unavailable at once (the stricter rule)."""
    if pool_size <= 0 or count <= 0 or percent <= 0:
        return 0
    by_percent = max(1, math.floor(pool_size * percent / 100))
    return min(count, by_percent, pool_size)


def pool_admission(*, pool: str, pool_size: int, unavailable: Collection[str], candidate: str,
                   policy: RemediationPolicy) -> Admission:
    """``unavailable``: names of nodes NotReady, cordoned or under remediation in the pool now."""
    limit = max_unavailable(pool_size, count=policy.pool_max_unavailable, percent=policy.pool_max_unavailable_percent)
    after = set(unavailable) | {candidate}
    if len(after) > limit:
        return Admission.refuse(
            POOL_BUDGET,
            f"pool {pool}: {len(set(unavailable))} of {pool_size} nodes already unavailable, the budget allows {limit} "
            f"(BUDGET_POOL_MAX_UNAVAILABLE={policy.pool_max_unavailable}, "
            f"BUDGET_POOL_MAX_UNAVAILABLE_PERCENT={policy.pool_max_unavailable_percent}%)")
    return Admission.ok(f"pool {pool}: {len(after)} of {limit} allowed unavailable")


def fleet_admission(*, in_flight: int, policy: RemediationPolicy) -> Admission:
    if in_flight >= policy.max_in_flight:
        return Admission.refuse(
            FLEET_BUDGET, f"{in_flight} remediations in flight fleet-wide, at most {policy.max_in_flight} "
                          f"(BUDGET_MAX_IN_FLIGHT)")
    return Admission.ok(f"{in_flight + 1} of {policy.max_in_flight} in flight")


def cluster_admission(*, cluster: str, in_flight_in_cluster: int, fleet_clusters: int,
                      policy: RemediationPolicy) -> Admission:
    """The cluster's share of the fleet: ``in_flight_in_cluster`` remediations of ``cluster`` hold a slot now;
    ``fleet_clusters`` is how many clusters had GPU nodes at the last sweep (``BreakerState.fleet_clusters``):
    with one (or none seen yet) the share does not apply."""
    limit = policy.cluster_max_in_flight
    if fleet_clusters <= 1:
        return Admission.ok("the only cluster with GPU nodes: no cluster share")
    if in_flight_in_cluster >= limit:
        return Admission.refuse(
            CLUSTER_BUDGET, f"cluster {cluster.rsplit('/', 1)[-1]}: {in_flight_in_cluster} remediations in flight, at "
                            f"most {limit} per cluster (BUDGET_CLUSTER_MAX_IN_FLIGHT)")
    return Admission.ok(f"{in_flight_in_cluster + 1} of {limit} in flight in the cluster")


def blocked_since(drain: Mapping[str, Any] | DrainState | None) -> float | None:
    """Since when a running drain has waited on a pod a PodDisruptionBudget keeps refusing (the Eviction
    API's 429, :attr:`DrainState.blocked`); None when it is not blocked or not running."""
    state = drain if isinstance(drain, DrainState) else DrainState.from_data(drain)
    if state.outcome != DrainOutcome.DRAINING or not state.blocked:
        return None
    return min(float(b.get("since", 0.0)) for b in state.blocked.values())


def holds_fleet_slot(*, state: str, drain: Mapping[str, Any] | DrainState | None, now: float,
                     policy: RemediationPolicy, taken_at: float = 0.0) -> bool:
    """Whether an active remediation in ``state`` holds its fleet slot now.

    Every active remediation does, except one ``draining`` whose drain a PodDisruptionBudget has blocked
    for ``blocked_drain_slot_s`` or longer (0: never released), timed from the later of the first refusal
    and ``taken_at`` (when the record last took its slot: one that took it again after waiting gets the
    full time anew). It keeps its cordon, and takes a slot again, when one is free, before it goes on."""
    if state != State.DRAINING or policy.blocked_drain_slot_s <= 0:
        return True
    since = blocked_since(drain)
    return since is None or now - max(since, taken_at) < policy.blocked_drain_slot_s


def node_admission(*, attempts: Sequence[float], last_finished_at: float | None, now: float,
                   policy: RemediationPolicy) -> Admission:
    """Cooldown since the last remediation ended, and the cap on attempts in the window."""
    if last_finished_at is not None and now < last_finished_at + policy.cooldown_s:
        wait = last_finished_at + policy.cooldown_s - now
        return Admission.refuse(COOLDOWN, f"node was remediated {now - last_finished_at:.0f}s ago; "
                                          f"cooldown {policy.cooldown_s}s has {wait:.0f}s left")
    recent = [a for a in attempts if a > now - policy.attempt_window_s]
    if len(recent) >= policy.max_attempts:
        return Admission.refuse(ATTEMPTS, f"{len(recent)} attempts in the last {policy.attempt_window_s}s, at most "
                                          f"{policy.max_attempts}: leaving the node to an operator")
    return Admission.ok()


def admit(*, paused: str | None, breaker_open: bool, node: Admission, pool: Admission,
          fleet: Admission, cluster: Admission | None = None) -> Admission:
    """The chain: pause, breaker, node guards, pool budget, cluster share, fleet cap; the first refusal wins."""
    if paused:
        return Admission.refuse(PAUSED, paused)
    if breaker_open:
        return Admission.refuse(BREAKER, "the fleet breaker is open: no remediation until an operator resets it "
                                          "(python -m fleetctl breaker reset)")
    for check in (node, pool, cluster, fleet):
        if check is not None and not check.allowed:
            return check
    return Admission.ok("; ".join(c.reason for c in (pool, cluster, fleet) if c is not None))

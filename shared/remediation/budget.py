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
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from shared.remediation.policy import RemediationPolicy

PAUSED = "paused"
BREAKER = "breaker"
COOLDOWN = "cooldown"
ATTEMPTS = "attempts"
POOL_BUDGET = "budget-pool"
FLEET_BUDGET = "budget-fleet"
REFUSAL_CODES: tuple[str, ...] = (PAUSED, BREAKER, COOLDOWN, ATTEMPTS, POOL_BUDGET, FLEET_BUDGET)


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
          fleet: Admission) -> Admission:
    """The chain: pause, breaker, node guards, pool budget, fleet cap; the first refusal wins."""
    if paused:
        return Admission.refuse(PAUSED, paused)
    if breaker_open:
        return Admission.refuse(BREAKER, "the fleet breaker is open: no remediation until an operator resets it "
                                          "(python -m fleetctl breaker reset)")
    for check in (node, pool, fleet):
        if not check.allowed:
            return check
    return Admission.ok(f"{pool.reason}; {fleet.reason}")

"""A drain as a resumable state: each step decides what to evict now, and folds the answers back in.

``kubectl drain`` is a loop in one process; ours runs one short step per reconciler call and keeps
its memory in the job's record (:class:`DrainState`), so any instance can resume a drain at any
step. :func:`drain_step` decides which pods to evict now, from the pods on the node now and the
state; the runner (:mod:`shared.drain.runner`) sends the evictions through the Eviction API only --
pods are never deleted -- and folds each answer back in with :func:`record_eviction`. Deletion is
awaited by pod UID, so a pod recreated under the same name is a new pod, and each evicted pod keeps
its own grace period even past the drain deadline.

Bounded by design (docs/remediation.md, "Drain"): the plan is decided before anything is disrupted
(:func:`shared.drain.filters.plan_drain`: a pod that fails a filter refuses the whole node up front,
as kubectl's ``GetPodsForDeletion``); a pod stuck terminating longer than
``skip_wait_for_delete_timeout_s`` past its deletion time is no longer waited for (kubectl
``--skip-wait-for-delete-timeout``, Cluster API's drain); a pod a disruption budget keeps refusing
for ``pdb_blocked_timeout_s`` ends the drain as ``stalled``, naming the budget; a pod covered by more
than one PDB stops it as ``refused`` (the Eviction API answers 500 for it forever, and kubectl stops
too). Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shared.drain.filters import MSG_REFUSED, describe_pdb, pdbs_covering, plan_drain, pod_key
from shared.drain.settings import DrainSettings
from shared.kernel.ports import EVICTED, EVICTION_BLOCKED, MULTIPLE_PDBS, NAMESPACE_TERMINATING, EvictionResult, PodView

MSG_MULTIPLE_PDBS_ANSWER = ("the Eviction API answered 500 ({answer}): the pod is covered by more than one "
                            "PodDisruptionBudget; remove or merge one of the budgets, or move the pod yourself")
MSG_PDB_BLOCKED = ("eviction refused by a PodDisruptionBudget: retrying; scale up the workload or relax its PDB "
                   "if this persists (the drain stops after DRAIN_PDB_BLOCKED_TIMEOUT_S={timeout})")
MSG_NAMESPACE_TERMINATING = "its namespace is being deleted: waiting for the namespace controller to delete the pod"
MSG_DEADLINE = "drain deadline reached with pods still on the node: {pods}"
MSG_STALLED = ("drain stalled: a PodDisruptionBudget refused {pod} for {seconds:.0f}s "
               "(DRAIN_PDB_BLOCKED_TIMEOUT_S={timeout}): {why}")


class DrainOutcome(StrEnum):
    """How a drain stands (:attr:`DrainState.outcome`). The values are the strings stored records hold."""

    DRAINING = ""  # still in progress
    DRAINED = "drained"  # every pod that had to go is gone
    TIMED_OUT = "timed_out"  # the drain deadline passed with pods still there
    REFUSED = "refused"  # a pod no rule lets us evict (or the multi-PDB 500): nothing more is evicted
    STALLED = "stalled"  # a disruption budget refused a pod for pdb_blocked_timeout_s


DRAINED, TIMED_OUT, REFUSED, STALLED = DrainOutcome.DRAINED, DrainOutcome.TIMED_OUT, DrainOutcome.REFUSED, DrainOutcome.STALLED
STOPPED: frozenset[DrainOutcome] = frozenset({REFUSED, STALLED})
"""Outcomes that stop the drain before its deadline: the caller's fallback applies at once."""


@dataclass(frozen=True)
class Evict:
    """Action: evict this pod (the Eviction API; grace ``None`` = the pod's own period)."""

    namespace: str
    name: str
    uid: str
    grace_period_seconds: int | None = None


@dataclass
class DrainState:
    """The drain's memory between steps (stored as a dict in the job's record: :meth:`to_data`)."""

    started_at: float | None = None
    evicted: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> {ns, name, at, grace}
    retry_at: dict[str, float] = field(default_factory=dict)  # uid -> when to try a refused eviction again
    # uid -> {ns, name, since (first budget refusal), tries}: the clock of DRAIN_PDB_BLOCKED_TIMEOUT_S
    blocked: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # "ns/name" -> what the operator should know
    outcome: DrainOutcome = DrainOutcome.DRAINING
    reason: str = ""  # refused / stalled / timed_out: what stopped the drain, for the operator
    remaining: list[str] = field(default_factory=list)  # "ns/name" still on the node at the last step
    wake_at: float | None = None

    def to_data(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "evicted": self.evicted, "retry_at": self.retry_at,
                "blocked": self.blocked, "messages": dict(list(self.messages.items())[-20:]),
                "outcome": self.outcome.value, "reason": self.reason, "remaining": self.remaining[:50],
                "wake_at": self.wake_at}

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> DrainState:
        if not data:
            return cls()
        return cls(started_at=data.get("started_at"), evicted=dict(data.get("evicted") or {}),
                   retry_at={k: float(v) for k, v in (data.get("retry_at") or {}).items()},
                   blocked={k: dict(v) for k, v in (data.get("blocked") or {}).items()},
                   messages=dict(data.get("messages") or {}), outcome=DrainOutcome(str(data.get("outcome") or "")),
                   reason=str(data.get("reason") or ""),
                   remaining=list(data.get("remaining") or []), wake_at=data.get("wake_at"))


def grace_of(pod: PodView) -> int:
    """The pod's terminationGracePeriodSeconds (30, the API default, when unset)."""
    return 30 if pod.grace_period_seconds is None else max(0, int(pod.grace_period_seconds))


def _stall(state: DrainState, pods: Mapping[str, PodView], *, now: float, settings: DrainSettings,
           pdbs: Sequence[Mapping[str, Any]] | None) -> str:
    """The stall report when a pod has been refused by a budget for DRAIN_PDB_BLOCKED_TIMEOUT_S, else ""."""
    timeout = settings.pdb_blocked_timeout_s
    if timeout <= 0:
        return ""
    longest = min(((float(b["since"]), uid) for uid, b in state.blocked.items() if uid in pods), default=None)
    if longest is None or now - longest[0] < timeout:
        return ""
    pod = pods[longest[1]]
    covering = pdbs_covering(pod, pdbs or ())
    why = ("; ".join(f"PodDisruptionBudget {describe_pdb(p)}" for p in covering) if covering
           else state.messages.get(pod_key(pod), "refused by a PodDisruptionBudget"))
    return MSG_STALLED.format(pod=pod_key(pod), seconds=now - longest[0], timeout=timeout, why=why)


def drain_step(*, node: str, pods: Sequence[PodView], previous: DrainState, now: float,
               settings: DrainSettings, pdbs: Sequence[Mapping[str, Any]] | None = None,
               ) -> tuple[DrainState, list[Evict]]:
    """One step of the drain of ``node`` given the pods on it now; returns the new state and evictions.

    Decided before anything is disrupted: when a pod fails a filter (no controller, emptyDir under
    ``refuse``, more than one PDB in ``pdbs``) the outcome is ``refused`` and nothing is evicted.
    Done (``drained``) when no pod that must go (to evict, or terminating and not yet past
    ``skip_wait_for_delete_timeout_s``) is still there by UID. ``stalled`` once a budget refused a pod
    for ``pdb_blocked_timeout_s``. Past ``drain_timeout_s`` — and once every evicted pod had its
    grace period — ``timed_out``. The caller applies the fallback to all three.
    """
    started = previous.started_at if previous.started_at is not None else now
    state = DrainState(started_at=started, evicted=dict(previous.evicted), retry_at=dict(previous.retry_at),
                       blocked={k: dict(v) for k, v in previous.blocked.items()},
                       messages=dict(previous.messages))
    on_node = [p for p in pods if p.node_name in ("", node)]
    plan = plan_drain(on_node, settings, now=now, pdbs=pdbs)
    present = {p.uid for p in on_node}
    # Forget what is gone: a pod recreated with the same name has another UID and starts afresh.
    state.evicted = {uid: v for uid, v in state.evicted.items() if uid in present}
    state.retry_at = {uid: t for uid, t in state.retry_at.items() if uid in present}
    evictable = {p.uid for p in plan.evict}
    state.blocked = {uid: v for uid, v in state.blocked.items() if uid in evictable}
    for pod, message in plan.blocked:
        state.messages[pod_key(pod)] = message
    for pod, message in plan.stuck:
        state.messages[pod_key(pod)] = message
    for pod, message in plan.warnings:
        state.messages.setdefault(pod_key(pod), message)

    if plan.refused:  # kubectl GetPodsForDeletion: refuse the node before evicting anything
        state.outcome, state.reason = REFUSED, plan.refusal()
        state.remaining = sorted(pod_key(p) for p, _ in plan.blocked)
        state.wake_at = None
        return state, []

    actions: list[Evict] = []
    waiting_grace: list[float] = []
    for pod in plan.evict:
        done = state.evicted.get(pod.uid)
        if done is not None:
            waiting_grace.append(float(done["at"]) + float(done["grace"]))
            continue
        retry = state.retry_at.get(pod.uid)
        if retry is not None and now < retry:
            continue
        actions.append(Evict(namespace=pod.namespace, name=pod.name, uid=pod.uid))
    # Longest grace period first: the drain ends when the slowest pod is gone, so it starts first.
    graces = {p.uid: grace_of(p) for p in plan.evict}
    actions.sort(key=lambda a: -graces.get(a.uid, 0))
    for pod in plan.terminating:
        # deletionTimestamp is already "deleted at + grace period": the pod's own deadline.
        waiting_grace.append(float(pod.deletion_timestamp if pod.deletion_timestamp is not None else now))

    must_go = [*plan.evict, *plan.terminating]
    state.remaining = sorted(pod_key(p) for p in must_go)
    if not must_go:
        state.outcome = DRAINED
        state.wake_at = None
        return state, []
    stalled = _stall(state, {p.uid: p for p in plan.evict}, now=now, settings=settings, pdbs=pdbs)
    if stalled:
        state.outcome, state.reason = STALLED, stalled
        state.wake_at = None
        return state, []
    deadline = started + settings.drain_timeout_s
    in_grace = [t for t in waiting_grace if t > now]
    if now >= deadline and not in_grace:
        state.outcome = TIMED_OUT
        state.reason = state.messages["_deadline"] = MSG_DEADLINE.format(pods=", ".join(state.remaining[:10]))
        state.wake_at = None
        return state, []
    wakes = [t for t in state.retry_at.values() if t > now]
    wakes.append(now + min(float(settings.poll_s), 5.0) if actions or in_grace else now + settings.poll_s)
    if now < deadline:
        wakes.append(deadline)
    stuck_at = [float(p.deletion_timestamp) + settings.skip_wait_for_delete_timeout_s + 1 for p in plan.terminating
                if p.deletion_timestamp is not None and settings.skip_wait_for_delete_timeout_s > 0]
    wakes += [t for t in stuck_at if t > now]
    state.wake_at = min(wakes)
    return state, actions


def retry_delay(settings: DrainSettings, tries: int, retry_after: float | None) -> float:
    """Seconds before asking a budget again: the server's Retry-After, else ``eviction_retry_s`` doubling
    per refusal up to the poll interval (kubectl retries every 5 s; a refusal that persists is asked
    less often, so a budget that never frees up costs tens of calls, not the ~720 of 5 s for an hour)."""
    if retry_after:
        return float(retry_after)
    base = float(settings.eviction_retry_s)
    cap = max(base, float(settings.poll_s))
    return min(cap, base * (2 ** max(0, tries - 1)))


def record_eviction(state: DrainState, action: Evict, result: EvictionResult, *, now: float,
                    grace: int | None, settings: DrainSettings) -> DrainState:
    """Fold one Eviction API answer into the state (``grace`` = the pod's terminationGracePeriodSeconds)."""
    key = f"{action.namespace}/{action.name}"
    if result.outcome == EVICTED:
        state.evicted[action.uid] = {"ns": action.namespace, "name": action.name, "at": now,
                                     "grace": 30 if grace is None else max(0, int(grace))}
        state.retry_at.pop(action.uid, None)
        state.blocked.pop(action.uid, None)
        state.messages.pop(key, None)
    elif result.outcome == EVICTION_BLOCKED:
        entry = state.blocked.setdefault(action.uid, {"ns": action.namespace, "name": action.name, "since": now,
                                                      "tries": 0})
        entry["tries"] = int(entry.get("tries", 0)) + 1
        delay = retry_delay(settings, int(entry["tries"]), result.retry_after)
        state.retry_at[action.uid] = now + delay
        detail = result.message + (f" [PDB {result.pdb}]" if result.pdb and result.pdb not in result.message else "")
        state.messages[key] = MSG_PDB_BLOCKED.format(timeout=settings.pdb_blocked_timeout_s) + (
            f" ({detail})" if detail else "")
        if state.wake_at is None or state.wake_at > now + delay:
            state.wake_at = now + delay
    elif result.outcome == NAMESPACE_TERMINATING:
        # kubectl drain: retry the eviction until the namespace controller marks the pod deleted, then
        # wait for it like any terminating pod. Not a budget refusal: it does not count as a stall.
        delay = float(settings.eviction_retry_s)
        state.retry_at[action.uid] = now + delay
        state.blocked.pop(action.uid, None)
        state.messages[key] = MSG_NAMESPACE_TERMINATING
        if state.wake_at is None or state.wake_at > now + delay:
            state.wake_at = now + delay
    elif result.outcome == MULTIPLE_PDBS:
        state.outcome = REFUSED
        state.reason = MSG_REFUSED.format(pods=f"{key}: {MSG_MULTIPLE_PDBS_ANSWER.format(answer=result.message)}")
        state.messages[key] = state.reason
        state.wake_at = None
    else:  # gone: already deleted; nothing to wait for beyond its UID disappearing
        state.retry_at.pop(action.uid, None)
        state.blocked.pop(action.uid, None)
    return state

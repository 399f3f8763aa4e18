"""kubectl-drain semantics as pure functions, so a drain can be resumed by any instance at any step.

``kubectl drain`` is a loop in one process; ours runs one short step per reconciler call and keeps
its memory in the remediation record (:class:`DrainState`). The filters mirror kubectl's
``pkg/drain/filters.go`` (terminating, DaemonSet, mirror, local storage, unreplicated) plus
"completed": each returns a :class:`PodDeleteStatus`, the first one that does not say "okay" wins.
:func:`drain_step` decides which pods to evict now; the runner (shared.remediation) performs the
evictions through the Eviction API only — pods are never deleted — and folds each answer back in
with :func:`record_eviction`. Deletion is awaited by pod UID, so a pod recreated under the same
name is a new pod, and each evicted pod keeps its own grace period even past the drain deadline.

A drain lasts about as long as the evicted pod that is last to go, so :func:`drain_step` orders its
evictions longest grace period first, and :func:`evict_all` (the one piece of I/O here, shared by
both runners) sends them a few at a time: with 100 pods on a node, evicting one after another
would add the round trips of all of them to the longest grace period. Each eviction is still an
Eviction API call that the API server admits or refuses against the PDBs on its own, atomically.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shared.ports import EvictionResult, PodView
from shared.remediation_policy import RemediationPolicy

# Messages tell the operator what to do (like kubectl's).
MSG_DAEMONSET = "DaemonSet-managed pod: left in place (DaemonSets tolerate the cordon)"
MSG_MIRROR = "mirror (static) pod: left in place (the kubelet owns it)"
MSG_COMPLETED = "completed pod: nothing to evict"
MSG_TERMINATING = "already terminating: waiting for it to go"
MSG_EMPTY_DIR_WARN = "pod with emptyDir (local data will be lost): evicting (REMEDIATION_EMPTY_DIR=evict)"
MSG_EMPTY_DIR_FATAL = ("pod with emptyDir local data: not evicted (set REMEDIATION_EMPTY_DIR=evict to allow, "
                       "or move the pod off the node yourself)")
MSG_UNMANAGED_WARN = "pod without a controller (it will not come back): evicting (REMEDIATION_UNMANAGED_PODS=evict)"
MSG_UNMANAGED_FATAL = ("pod without a controller would be lost for good: not evicted (set REMEDIATION_UNMANAGED_PODS=evict "
                       "to allow, or delete it yourself)")
MSG_PDB_BLOCKED = ("eviction refused by a PodDisruptionBudget: retrying every {delay:g}s; "
                   "scale up the workload or relax its PDB if this persists")
MSG_DEADLINE = "drain deadline reached with pods still on the node: {pods}"

OKAY, SKIP, WARNING, ERROR = "okay", "skip", "warning", "error"


@dataclass(frozen=True)
class PodDeleteStatus:
    delete: bool
    reason: str  # okay | skip | warning | error
    message: str = ""

    @staticmethod
    def okay() -> PodDeleteStatus:
        return PodDeleteStatus(True, OKAY)

    @staticmethod
    def skip(message: str) -> PodDeleteStatus:
        return PodDeleteStatus(False, SKIP, message)

    @staticmethod
    def warning(message: str) -> PodDeleteStatus:
        return PodDeleteStatus(True, WARNING, message)

    @staticmethod
    def error(message: str) -> PodDeleteStatus:
        return PodDeleteStatus(False, ERROR, message)


PodFilter = Callable[[PodView], PodDeleteStatus]


def skip_terminating(pod: PodView) -> PodDeleteStatus:
    return PodDeleteStatus.skip(MSG_TERMINATING) if pod.deletion_timestamp is not None else PodDeleteStatus.okay()


def skip_daemonset(pod: PodView) -> PodDeleteStatus:
    owner = pod.controller()
    return PodDeleteStatus.skip(MSG_DAEMONSET) if owner is not None and owner.kind == "DaemonSet" else PodDeleteStatus.okay()


def skip_mirror(pod: PodView) -> PodDeleteStatus:
    return PodDeleteStatus.skip(MSG_MIRROR) if pod.is_mirror else PodDeleteStatus.okay()


def skip_completed(pod: PodView) -> PodDeleteStatus:
    return PodDeleteStatus.skip(MSG_COMPLETED) if pod.phase in ("Succeeded", "Failed") else PodDeleteStatus.okay()


def empty_dir_filter(policy: str) -> PodFilter:
    def check(pod: PodView) -> PodDeleteStatus:
        if not pod.has_empty_dir:
            return PodDeleteStatus.okay()
        return PodDeleteStatus.warning(MSG_EMPTY_DIR_WARN) if policy == "evict" else PodDeleteStatus.error(MSG_EMPTY_DIR_FATAL)

    return check


def unmanaged_filter(policy: str) -> PodFilter:
    def check(pod: PodView) -> PodDeleteStatus:
        if pod.controller() is not None:
            return PodDeleteStatus.okay()
        return PodDeleteStatus.warning(MSG_UNMANAGED_WARN) if policy == "evict" else PodDeleteStatus.error(MSG_UNMANAGED_FATAL)

    return check


def make_filters(policy: RemediationPolicy, *, additional: Sequence[PodFilter] = ()) -> list[PodFilter]:
    return [skip_terminating, skip_daemonset, skip_mirror, skip_completed,
            empty_dir_filter(policy.empty_dir), unmanaged_filter(policy.unmanaged_pods), *additional]


def filter_pod(pod: PodView, filters: Sequence[PodFilter]) -> PodDeleteStatus:
    """The first filter that does not say "okay" decides (warnings still delete)."""
    warning: PodDeleteStatus | None = None
    for f in filters:
        status = f(pod)
        if not status.delete:
            return status
        if status.reason == WARNING and warning is None:
            warning = status
    return warning or PodDeleteStatus.okay()


@dataclass
class DrainPlan:
    evict: list[PodView] = field(default_factory=list)
    skip: list[tuple[PodView, str]] = field(default_factory=list)
    blocked: list[tuple[PodView, str]] = field(default_factory=list)
    terminating: list[PodView] = field(default_factory=list)  # skipped, but the drain waits for them
    warnings: list[tuple[PodView, str]] = field(default_factory=list)


def plan_drain(pods: Sequence[PodView], policy: RemediationPolicy, *,
               additional: Sequence[PodFilter] = ()) -> DrainPlan:
    filters = make_filters(policy, additional=additional)
    plan = DrainPlan()
    for pod in pods:
        status = filter_pod(pod, filters)
        if status.delete:
            plan.evict.append(pod)
            if status.reason == WARNING:
                plan.warnings.append((pod, status.message))
        elif status.reason == ERROR:
            plan.blocked.append((pod, status.message))
        else:
            plan.skip.append((pod, status.message))
            if status.message == MSG_TERMINATING:
                plan.terminating.append(pod)
    return plan


# --------------------------------------------------------------------------- the resumable drain


@dataclass(frozen=True)
class Evict:
    """Action: evict this pod (the Eviction API; grace ``None`` = the pod's own period)."""

    namespace: str
    name: str
    uid: str
    grace_period_seconds: int | None = None


@dataclass
class DrainState:
    """The drain's memory between steps (stored as a dict in the remediation record)."""

    started_at: float | None = None
    evicted: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> {ns, name, at, grace}
    retry_at: dict[str, float] = field(default_factory=dict)  # uid -> when to try a blocked eviction again
    messages: dict[str, str] = field(default_factory=dict)  # "ns/name" -> what the operator should know
    outcome: str = ""  # "" (in progress) | drained | timed_out
    remaining: list[str] = field(default_factory=list)  # "ns/name" still on the node at the last step
    wake_at: float | None = None

    def to_data(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "evicted": self.evicted, "retry_at": self.retry_at,
                "messages": dict(list(self.messages.items())[-20:]), "outcome": self.outcome,
                "remaining": self.remaining[:50], "wake_at": self.wake_at}

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> DrainState:
        if not data:
            return cls()
        return cls(started_at=data.get("started_at"), evicted=dict(data.get("evicted") or {}),
                   retry_at={k: float(v) for k, v in (data.get("retry_at") or {}).items()},
                   messages=dict(data.get("messages") or {}), outcome=str(data.get("outcome") or ""),
                   remaining=list(data.get("remaining") or []), wake_at=data.get("wake_at"))


def _key(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def _grace(pod: PodView) -> int:
    return 30 if pod.grace_period_seconds is None else max(0, int(pod.grace_period_seconds))


def drain_step(*, node: str, pods: Sequence[PodView], previous: DrainState, now: float,
               policy: RemediationPolicy) -> tuple[DrainState, list[Evict]]:
    """One step of the drain of ``node`` given the pods on it now; returns the new state and evictions.

    Done (``outcome == "drained"``) when no pod that must go (to evict, blocked by policy, or
    terminating) is still there by UID. Past ``drain_timeout_s`` — and once every evicted pod had
    its grace period — the outcome is ``timed_out`` and the caller applies the fallback.
    """
    started = previous.started_at if previous.started_at is not None else now
    state = DrainState(started_at=started, evicted=dict(previous.evicted), retry_at=dict(previous.retry_at),
                       messages=dict(previous.messages), outcome="")
    on_node = [p for p in pods if p.node_name in ("", node)]
    plan = plan_drain(on_node, policy)
    present = {p.uid for p in on_node}
    # Forget what is gone: a pod recreated with the same name has another UID and starts afresh.
    state.evicted = {uid: v for uid, v in state.evicted.items() if uid in present}
    state.retry_at = {uid: t for uid, t in state.retry_at.items() if uid in present}

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
    graces = {p.uid: _grace(p) for p in plan.evict}
    actions.sort(key=lambda a: -graces.get(a.uid, 0))
    for pod in plan.terminating:
        waiting_grace.append((pod.deletion_timestamp or now) + _grace(pod))
    for pod, message in plan.blocked:
        state.messages[_key(pod)] = message
    for pod, message in plan.warnings:
        state.messages.setdefault(_key(pod), message)

    must_go = [*plan.evict, *plan.terminating, *(p for p, _ in plan.blocked)]
    state.remaining = sorted(_key(p) for p in must_go)
    if not must_go:
        state.outcome = "drained"
        state.wake_at = None
        return state, []
    deadline = started + policy.drain_timeout_s
    in_grace = [t for t in waiting_grace if t > now]
    if now >= deadline and not in_grace:
        state.outcome = "timed_out"
        state.messages["_deadline"] = MSG_DEADLINE.format(pods=", ".join(state.remaining[:10]))
        state.wake_at = None
        return state, []
    wakes = [t for t in state.retry_at.values() if t > now]
    wakes.append(now + min(float(policy.poll_s), 5.0) if actions or in_grace else now + policy.poll_s)
    if now < deadline:
        wakes.append(deadline)
    state.wake_at = min(wakes)
    return state, actions


def record_eviction(state: DrainState, action: Evict, result: EvictionResult, *, now: float,
                    grace: int | None, policy: RemediationPolicy) -> DrainState:
    """Fold one Eviction API answer into the state (``grace`` = the pod's terminationGracePeriodSeconds)."""
    key = f"{action.namespace}/{action.name}"
    if result.outcome == "evicted":
        state.evicted[action.uid] = {"ns": action.namespace, "name": action.name, "at": now,
                                     "grace": 30 if grace is None else max(0, int(grace))}
        state.retry_at.pop(action.uid, None)
        state.messages.pop(key, None)
    elif result.outcome == "blocked":
        delay = float(result.retry_after) if result.retry_after else float(policy.eviction_retry_s)
        state.retry_at[action.uid] = now + delay
        state.messages[key] = MSG_PDB_BLOCKED.format(delay=delay) + (f" ({result.message})" if result.message else "")
        if state.wake_at is None or state.wake_at > now + delay:
            state.wake_at = now + delay
    else:  # gone: already deleted; nothing to wait for beyond its UID disappearing
        state.retry_at.pop(action.uid, None)
    return state


# --------------------------------------------------------------------------- sending the evictions

EVICTION_WORKERS = 8  # in flight at once; below the Kubernetes client's connection pool (5 per CPU)


def evict_all(evict: Callable[[Evict], EvictionResult], actions: Sequence[Evict], *,
              workers: int = EVICTION_WORKERS) -> list[tuple[Evict, EvictionResult]]:
    """Call ``evict`` for every action, at most ``workers`` at once; the answers in the actions' order.

    Every call finishes before this returns (no eviction outlives the step). When calls raised,
    the first error is raised once all are done: the step is retried, and the pods already evicted
    are then seen terminating and waited for, never evicted twice by mistake nor killed.
    """
    if not actions:
        return []
    if len(actions) == 1 or workers <= 1:
        return [(a, evict(a)) for a in actions]
    with ThreadPoolExecutor(max_workers=min(workers, len(actions)), thread_name_prefix="evict") as pool:
        futures = [pool.submit(evict, a) for a in actions]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]  # type: ignore[misc]
    return [(a, f.result()) for a, f in zip(actions, futures, strict=True)]

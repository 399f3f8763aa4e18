"""kubectl-drain semantics as pure functions, so a drain can be resumed by any instance at any step.

``kubectl drain`` is a loop in one process; ours runs one short step per reconciler call and keeps
its memory in the remediation record (:class:`DrainState`). The filters mirror kubectl's
``pkg/drain/filters.go`` (terminating, DaemonSet, mirror, local storage, unreplicated) plus
"completed": each returns a :class:`PodDeleteStatus`, the first one that does not say "okay" wins.
:func:`drain_step` decides which pods to evict now; the runner (shared.remediation.core) performs the
evictions through the Eviction API only — pods are never deleted — and folds each answer back in
with :func:`record_eviction`. Deletion is awaited by pod UID, so a pod recreated under the same
name is a new pod, and each evicted pod keeps its own grace period even past the drain deadline.

A drain lasts about as long as the evicted pod that is last to go, so :func:`drain_step` orders its
evictions longest grace period first, and :func:`evict_all` (the one piece of I/O here, shared by
both runners) sends them a few at a time: with 100 pods on a node, evicting one after another
would add the round trips of all of them to the longest grace period. Each eviction is still an
Eviction API call that the API server admits or refuses against the PDBs on its own, atomically.

Bounded by design (docs/remediation.md, "Drain"): the plan is decided before anything is disrupted
(a pod that fails a filter refuses the whole node up front, as kubectl's ``GetPodsForDeletion``);
a pod stuck terminating longer than ``DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S`` past its deletion time
is no longer waited for (kubectl ``--skip-wait-for-delete-timeout``, Cluster API's drain); a pod a
disruption budget keeps refusing for ``DRAIN_PDB_BLOCKED_TIMEOUT_S`` ends the drain as ``stalled``,
naming the budget; a pod covered by more than one PDB stops it as ``refused`` (the Eviction API
answers 500 for it forever, and kubectl stops too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shared.kernel.ports import EVICTED, EVICTION_BLOCKED, MULTIPLE_PDBS, NAMESPACE_TERMINATING, EvictionResult, PodView
from shared.remediation.policy import RemediationPolicy

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
MSG_MULTIPLE_PDBS = ("covered by more than one PodDisruptionBudget ({pdbs}): the Eviction API refuses such a pod "
                     "(500) every time; remove or merge one of the budgets, or move the pod yourself")
MSG_MULTIPLE_PDBS_ANSWER = ("the Eviction API answered 500 ({answer}): the pod is covered by more than one "
                            "PodDisruptionBudget; remove or merge one of the budgets, or move the pod yourself")
MSG_STUCK = ("stuck terminating more than {timeout}s past its deletion time: no longer waited for "
             "(DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S={timeout}; the repair that follows frees it)")
MSG_PDB_BLOCKED = ("eviction refused by a PodDisruptionBudget: retrying; scale up the workload or relax its PDB "
                   "if this persists (the drain stops after DRAIN_PDB_BLOCKED_TIMEOUT_S={timeout})")
MSG_NAMESPACE_TERMINATING = "its namespace is being deleted: waiting for the namespace controller to delete the pod"
MSG_DEADLINE = "drain deadline reached with pods still on the node: {pods}"
MSG_REFUSED = "drain refused before evicting anything: {pods}"
MSG_STALLED = ("drain stalled: a PodDisruptionBudget refused {pod} for {seconds:.0f}s "
               "(DRAIN_PDB_BLOCKED_TIMEOUT_S={timeout}): {why}")

# Drain outcomes (DrainState.outcome); "" while in progress.
DRAINED, TIMED_OUT, REFUSED, STALLED = "drained", "timed_out", "refused", "stalled"

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


def skip_deleted_filter(timeout_s: int, now: float) -> PodFilter:
    """kubectl ``skipDeletedFilter`` (staging/src/k8s.io/kubectl/pkg/drain/filters.go): a pod whose
    ``deletionTimestamp`` is more than ``timeout_s`` in the past is skipped, not waited for (0 = off).

    ``deletionTimestamp`` is the time the pod's grace period ends (the API server sets it to the
    delete time plus the grace period), so the wait it bounds starts after the grace period.
    """

    def check(pod: PodView) -> PodDeleteStatus:
        if timeout_s <= 0 or pod.deletion_timestamp is None:
            return PodDeleteStatus.okay()
        late = now - pod.deletion_timestamp
        if late > timeout_s:
            return PodDeleteStatus.skip(MSG_STUCK.format(timeout=timeout_s))
        return PodDeleteStatus.okay()

    return check


def _requirement_matches(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key, op, values = str(expr.get("key") or ""), str(expr.get("operator") or ""), list(expr.get("values") or [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # an operator the API server would have rejected: match nothing, as an invalid selector


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A ``metav1.LabelSelector`` as policy/v1 PDBs use it: null matches nothing, ``{}`` matches everything
    (kubernetes/kubernetes staging/src/k8s.io/client-go/listers/policy/v1/poddisruptionbudget_expansion.go)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_requirement_matches(labels, e) for e in selector.get("matchExpressions") or [])


def pdbs_covering(pod: PodView, pdbs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The PodDisruptionBudgets of the pod's namespace whose selector matches its labels."""
    out = []
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        if meta.get("namespace") == pod.namespace and selector_matches((pdb.get("spec") or {}).get("selector"), pod.labels):
            out.append(pdb)
    return out


def describe_pdb(pdb: Mapping[str, Any]) -> str:
    """``ns/name (disruptionsAllowed=0, currentHealthy=1, desiredHealthy=1, expectedPods=1)``."""
    meta, status = pdb.get("metadata") or {}, pdb.get("status") or {}
    fields = ", ".join(f"{k}={status.get(k, '?')}" for k in ("disruptionsAllowed", "currentHealthy", "desiredHealthy",
                                                             "expectedPods"))
    return f"{meta.get('namespace', '')}/{meta.get('name', '')} ({fields})"


def multiple_pdbs_filter(pdbs: Sequence[Mapping[str, Any]]) -> PodFilter:
    """A pod under two or more PDBs can never be evicted (eviction.go answers 500): refuse it up front."""

    def check(pod: PodView) -> PodDeleteStatus:
        covering = pdbs_covering(pod, pdbs)
        if len(covering) < 2:
            return PodDeleteStatus.okay()
        names = ", ".join(str((p.get("metadata") or {}).get("name", "")) for p in covering)
        return PodDeleteStatus.error(MSG_MULTIPLE_PDBS.format(pdbs=names))

    return check


def make_filters(policy: RemediationPolicy, *, now: float | None = None,
                 pdbs: Sequence[Mapping[str, Any]] | None = None,
                 additional: Sequence[PodFilter] = ()) -> list[PodFilter]:
    """kubectl's order (filters.go ``makeFilters``): skip-deleted first, then ours, then the policy filters.

    ``now`` enables the skip-deleted rule; ``pdbs`` (every PDB the caller could list, ``None`` when it
    could not) enables the multiple-PDB refusal.
    """
    first = [skip_deleted_filter(policy.skip_wait_for_delete_timeout_s, now)] if now is not None else []
    last = [multiple_pdbs_filter(pdbs)] if pdbs else []
    return [*first, skip_terminating, skip_daemonset, skip_mirror, skip_completed,
            empty_dir_filter(policy.empty_dir), unmanaged_filter(policy.unmanaged_pods), *last, *additional]


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
    blocked: list[tuple[PodView, str]] = field(default_factory=list)  # fail a filter: the node is refused
    terminating: list[PodView] = field(default_factory=list)  # skipped, but the drain waits for them
    stuck: list[tuple[PodView, str]] = field(default_factory=list)  # terminating too long: no longer waited for
    warnings: list[tuple[PodView, str]] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        """kubectl ``GetPodsForDeletion``: any pod that fails a filter refuses the whole node."""
        return bool(self.blocked)

    def refused_pods(self, *, limit: int = 5) -> str:
        """``ns/name: rule and the setting that changes it`` for each refusing pod ("" when none)."""
        parts = [f"{_key(p)}: {m}" for p, m in self.blocked[:limit]]
        more = len(self.blocked) - limit
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

    def refusal(self, *, limit: int = 5) -> str:
        """Which pods, which rule, which setting changes it (empty when nothing refuses the node)."""
        return MSG_REFUSED.format(pods=self.refused_pods(limit=limit)) if self.blocked else ""


def plan_drain(pods: Sequence[PodView], policy: RemediationPolicy, *, now: float | None = None,
               pdbs: Sequence[Mapping[str, Any]] | None = None,
               additional: Sequence[PodFilter] = ()) -> DrainPlan:
    """Sort the pods of a node into evict / skip / blocked / terminating / stuck — before any eviction."""
    filters = make_filters(policy, now=now, pdbs=pdbs, additional=additional)
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
            elif pod.deletion_timestamp is not None:
                plan.stuck.append((pod, status.message))
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
    retry_at: dict[str, float] = field(default_factory=dict)  # uid -> when to try a refused eviction again
    # uid -> {ns, name, since (first budget refusal), tries}: the clock of DRAIN_PDB_BLOCKED_TIMEOUT_S
    blocked: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # "ns/name" -> what the operator should know
    outcome: str = ""  # "" (in progress) | drained | timed_out | refused | stalled
    reason: str = ""  # refused / stalled / timed_out: what stopped the drain, for the operator
    remaining: list[str] = field(default_factory=list)  # "ns/name" still on the node at the last step
    wake_at: float | None = None

    def to_data(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "evicted": self.evicted, "retry_at": self.retry_at,
                "blocked": self.blocked, "messages": dict(list(self.messages.items())[-20:]),
                "outcome": self.outcome, "reason": self.reason, "remaining": self.remaining[:50],
                "wake_at": self.wake_at}

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> DrainState:
        if not data:
            return cls()
        return cls(started_at=data.get("started_at"), evicted=dict(data.get("evicted") or {}),
                   retry_at={k: float(v) for k, v in (data.get("retry_at") or {}).items()},
                   blocked={k: dict(v) for k, v in (data.get("blocked") or {}).items()},
                   messages=dict(data.get("messages") or {}), outcome=str(data.get("outcome") or ""),
                   reason=str(data.get("reason") or ""),
                   remaining=list(data.get("remaining") or []), wake_at=data.get("wake_at"))


def _key(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def _grace(pod: PodView) -> int:
    return 30 if pod.grace_period_seconds is None else max(0, int(pod.grace_period_seconds))


def _stall(state: DrainState, pods: Mapping[str, PodView], *, now: float, policy: RemediationPolicy,
           pdbs: Sequence[Mapping[str, Any]] | None) -> str:
    """The stall report when a pod has been refused by a budget for DRAIN_PDB_BLOCKED_TIMEOUT_S, else ""."""
    timeout = policy.pdb_blocked_timeout_s
    if timeout <= 0:
        return ""
    longest = min(((float(b["since"]), uid) for uid, b in state.blocked.items() if uid in pods), default=None)
    if longest is None or now - longest[0] < timeout:
        return ""
    pod = pods[longest[1]]
    covering = pdbs_covering(pod, pdbs or ())
    why = ("; ".join(f"PodDisruptionBudget {describe_pdb(p)}" for p in covering) if covering
           else state.messages.get(_key(pod), "refused by a PodDisruptionBudget"))
    return MSG_STALLED.format(pod=_key(pod), seconds=now - longest[0], timeout=timeout, why=why)


def drain_step(*, node: str, pods: Sequence[PodView], previous: DrainState, now: float,
               policy: RemediationPolicy, pdbs: Sequence[Mapping[str, Any]] | None = None,
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
                       messages=dict(previous.messages), outcome="")
    on_node = [p for p in pods if p.node_name in ("", node)]
    plan = plan_drain(on_node, policy, now=now, pdbs=pdbs)
    present = {p.uid for p in on_node}
    # Forget what is gone: a pod recreated with the same name has another UID and starts afresh.
    state.evicted = {uid: v for uid, v in state.evicted.items() if uid in present}
    state.retry_at = {uid: t for uid, t in state.retry_at.items() if uid in present}
    evictable = {p.uid for p in plan.evict}
    state.blocked = {uid: v for uid, v in state.blocked.items() if uid in evictable}
    for pod, message in plan.blocked:
        state.messages[_key(pod)] = message
    for pod, message in plan.stuck:
        state.messages[_key(pod)] = message
    for pod, message in plan.warnings:
        state.messages.setdefault(_key(pod), message)

    if plan.refused:  # kubectl GetPodsForDeletion: refuse the node before evicting anything
        state.outcome, state.reason = REFUSED, plan.refusal()
        state.remaining = sorted(_key(p) for p, _ in plan.blocked)
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
    graces = {p.uid: _grace(p) for p in plan.evict}
    actions.sort(key=lambda a: -graces.get(a.uid, 0))
    for pod in plan.terminating:
        # deletionTimestamp is already "deleted at + grace period": the pod's own deadline.
        waiting_grace.append(float(pod.deletion_timestamp if pod.deletion_timestamp is not None else now))

    must_go = [*plan.evict, *plan.terminating]
    state.remaining = sorted(_key(p) for p in must_go)
    if not must_go:
        state.outcome = DRAINED
        state.wake_at = None
        return state, []
    stalled = _stall(state, {p.uid: p for p in plan.evict}, now=now, policy=policy, pdbs=pdbs)
    if stalled:
        state.outcome, state.reason = STALLED, stalled
        state.wake_at = None
        return state, []
    deadline = started + policy.drain_timeout_s
    in_grace = [t for t in waiting_grace if t > now]
    if now >= deadline and not in_grace:
        state.outcome = TIMED_OUT
        state.reason = state.messages["_deadline"] = MSG_DEADLINE.format(pods=", ".join(state.remaining[:10]))
        state.wake_at = None
        return state, []
    wakes = [t for t in state.retry_at.values() if t > now]
    wakes.append(now + min(float(policy.poll_s), 5.0) if actions or in_grace else now + policy.poll_s)
    if now < deadline:
        wakes.append(deadline)
    stuck_at = [float(p.deletion_timestamp) + policy.skip_wait_for_delete_timeout_s + 1 for p in plan.terminating
                if p.deletion_timestamp is not None and policy.skip_wait_for_delete_timeout_s > 0]
    wakes += [t for t in stuck_at if t > now]
    state.wake_at = min(wakes)
    return state, actions


def retry_delay(policy: RemediationPolicy, tries: int, retry_after: float | None) -> float:
    """Seconds before asking a budget again: the server's Retry-After, else ``eviction_retry_s`` doubling
    per refusal up to the poll interval (kubectl retries every 5 s; a refusal that persists is asked
    less often, so a budget that never frees up costs tens of calls, not the ~720 of 5 s for an hour)."""
    if retry_after:
        return float(retry_after)
    base = float(policy.eviction_retry_s)
    cap = max(base, float(policy.poll_s))
    return min(cap, base * (2 ** max(0, tries - 1)))


def record_eviction(state: DrainState, action: Evict, result: EvictionResult, *, now: float,
                    grace: int | None, policy: RemediationPolicy) -> DrainState:
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
        delay = retry_delay(policy, int(entry["tries"]), result.retry_after)
        state.retry_at[action.uid] = now + delay
        detail = result.message + (f" [PDB {result.pdb}]" if result.pdb and result.pdb not in result.message else "")
        state.messages[key] = MSG_PDB_BLOCKED.format(timeout=policy.pdb_blocked_timeout_s) + (
            f" ({detail})" if detail else "")
        if state.wake_at is None or state.wake_at > now + delay:
            state.wake_at = now + delay
    elif result.outcome == NAMESPACE_TERMINATING:
        # kubectl drain: retry the eviction until the namespace controller marks the pod deleted, then
        # wait for it like any terminating pod. Not a budget refusal: it does not count as a stall.
        delay = float(policy.eviction_retry_s)
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


def fetch_pdbs(kube: Any) -> list[Mapping[str, Any]] | None:
    """Every PodDisruptionBudget of the cluster, or ``None`` when they cannot be read now.

    Best effort: the Eviction API enforces the budgets on its own; the list only lets the drain
    refuse a pod under two PDBs before evicting anything and name the budget when it stalls.
    """
    from shared.kernel.errors import StewardError

    try:
        return list(kube.list_pdbs())
    except StewardError:
        return None

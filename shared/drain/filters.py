"""Which pods a drain evicts, which it leaves, and which refuse the node: kubectl's pod filters.

The filters mirror kubectl's ``GetPodsForDeletion`` (kubernetes/kubernetes
staging/src/k8s.io/kubectl/pkg/drain/filters.go: skip-deleted, DaemonSet, mirror, local storage,
unreplicated) plus "completed" and "covered by two PDBs". Each returns a :class:`PodDeleteStatus`,
and the first one that does not say "okay" decides (a warning still evicts). :func:`plan_drain`
sorts a node's pods with them before anything is disrupted: a pod that fails a filter refuses the
whole node up front, so a drain never starts on a node it could not finish. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shared.drain.settings import DrainSettings
from shared.kernel.ports import PodView

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
MSG_STUCK = ("stuck terminating more than {timeout}s past its deletion time: no longer waited for "
             "(DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S={timeout}; the repair that follows frees it)")
MSG_REFUSED = "drain refused before evicting anything: {pods}"


class Verdict(StrEnum):
    """What a filter says of a pod (kubectl's ``PodDeleteStatus.Reason``)."""

    OKAY = "okay"  # evict it
    SKIP = "skip"  # leave it (a DaemonSet pod, a mirror pod, a completed or terminating one)
    WARNING = "warning"  # evict it, and tell the operator what is lost
    ERROR = "error"  # never evict it: the node is refused


OKAY, SKIP, WARNING, ERROR = Verdict.OKAY, Verdict.SKIP, Verdict.WARNING, Verdict.ERROR


@dataclass(frozen=True)
class PodDeleteStatus:
    delete: bool
    reason: Verdict
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


def empty_dir_filter(rule: str) -> PodFilter:
    def check(pod: PodView) -> PodDeleteStatus:
        if not pod.has_empty_dir:
            return PodDeleteStatus.okay()
        return PodDeleteStatus.warning(MSG_EMPTY_DIR_WARN) if rule == "evict" else PodDeleteStatus.error(MSG_EMPTY_DIR_FATAL)

    return check


def unmanaged_filter(rule: str) -> PodFilter:
    def check(pod: PodView) -> PodDeleteStatus:
        if pod.controller() is not None:
            return PodDeleteStatus.okay()
        return PodDeleteStatus.warning(MSG_UNMANAGED_WARN) if rule == "evict" else PodDeleteStatus.error(MSG_UNMANAGED_FATAL)

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


def make_filters(settings: DrainSettings, *, now: float | None = None,
                 pdbs: Sequence[Mapping[str, Any]] | None = None) -> list[PodFilter]:
    """kubectl's order (filters.go ``makeFilters``): skip-deleted first, then ours, then the pod rules.

    ``now`` enables the skip-deleted rule; ``pdbs`` (every PDB the caller could list, ``None`` when it
    could not) enables the multiple-PDB refusal.
    """
    first = [skip_deleted_filter(settings.skip_wait_for_delete_timeout_s, now)] if now is not None else []
    last = [multiple_pdbs_filter(pdbs)] if pdbs else []
    return [*first, skip_terminating, skip_daemonset, skip_mirror, skip_completed,
            empty_dir_filter(settings.empty_dir), unmanaged_filter(settings.unmanaged_pods), *last]


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
        parts = [f"{pod_key(p)}: {m}" for p, m in self.blocked[:limit]]
        more = len(self.blocked) - limit
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

    def refusal(self, *, limit: int = 5) -> str:
        """Which pods, which rule, which setting changes it (empty when nothing refuses the node)."""
        return MSG_REFUSED.format(pods=self.refused_pods(limit=limit)) if self.blocked else ""


def plan_drain(pods: Sequence[PodView], settings: DrainSettings, *, now: float | None = None,
               pdbs: Sequence[Mapping[str, Any]] | None = None) -> DrainPlan:
    """Sort the pods of a node into evict / skip / blocked / terminating / stuck — before any eviction."""
    filters = make_filters(settings, now=now, pdbs=pdbs)
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


def is_workload(pod: PodView) -> bool:
    """A pod that must leave before its node may go: not DaemonSet-managed, not mirror, not completed
    (terminating pods count: they are still running until they are gone)."""
    return skip_daemonset(pod).delete and skip_mirror(pod).delete and skip_completed(pod).delete


def pod_key(pod: PodView) -> str:
    """``namespace/name``: how the drain names a pod to the operator."""
    return f"{pod.namespace}/{pod.name}"


"""Is a GPU node unhealthy long enough to act on? A pure evaluation over listed nodes.

Shaped like Cluster API's ``healthCheckTargets``: every node lands in exactly one bucket —
``skipped`` (not ours to judge now, with a reason), ``unhealthy`` (a configured condition has been
``True`` for at least its threshold), ``pending`` (``True`` but not yet for long enough: look again
at ``next_check``), ``unknown`` (a configured condition is missing or ``Unknown``: never treated
as healthy) or ``healthy``. No I/O, no clock: ``now`` is an argument, so tables test it.

Flap damping comes from ``lastTransitionTime``: a condition that went ``False`` and back to ``True``
has a new transition time, so its clock restarts and it must stay ``True`` for the whole threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.ports import NodeView
from shared.remediation_policy import RemediationPolicy

CORDONED_BY_LABEL = "gpu-fleet-steward/cordoned-by"
CORDON_FOR_ANNOTATION = "gpu-fleet-steward/cordoned-for"
CORDON_REASON_ANNOTATION = "gpu-fleet-steward/cordon-reason"
CORDON_AT_ANNOTATION = "gpu-fleet-steward/cordoned-at"
STATE_ANNOTATION = "gpu-fleet-steward/remediation"

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

# Skip reasons (stable strings: they show up in reports and tests).
SKIP_OPTED_OUT = "opted-out"
SKIP_STARTING = "starting"
SKIP_BUSY_TAINT = "busy-taint"
SKIP_BUSY_ANNOTATION = "busy-annotation"
SKIP_CORDONED_BY_OTHER = "cordoned-by-other"
SKIP_NOT_READY = "not-ready"
SKIP_DELETING = "deleting"


@dataclass(frozen=True)
class Finding:
    """``condition`` has been ``True`` on ``node`` since ``since`` (its lastTransitionTime)."""

    node: NodeView
    condition: str
    since: float


@dataclass
class Evaluation:
    healthy: list[NodeView] = field(default_factory=list)
    unhealthy: list[Finding] = field(default_factory=list)
    pending: list[Finding] = field(default_factory=list)
    unknown: list[tuple[NodeView, str]] = field(default_factory=list)  # (node, condition missing/Unknown)
    skipped: list[tuple[NodeView, str]] = field(default_factory=list)  # (node, reason)
    next_check: float | None = None

    def _later(self, at: float) -> None:
        self.next_check = at if self.next_check is None else min(self.next_check, at)


def cordoned_by_us(node: NodeView) -> bool:
    """The node carries our cordon marker (only then may we ever uncordon it)."""
    return bool(node.labels.get(CORDONED_BY_LABEL)) and bool(node.annotations.get(CORDON_FOR_ANNOTATION))


def skip_reason(node: NodeView, *, now: float, policy: RemediationPolicy) -> str | None:
    """Why this node is not ours to judge right now, or None. Order matters: the first reason wins."""
    if node.labels.get(policy.opt_out_label, "").lower() == "true":
        return SKIP_OPTED_OUT
    if node.deletion_timestamp is not None:
        # AKS (scale-down, upgrade surge, a deleted machine) is already taking this node away.
        return SKIP_DELETING
    taint_keys = {t.key for t in node.taints}
    for key in policy.busy_taints:
        if key in taint_keys:
            return f"{SKIP_BUSY_TAINT}:{key}"
    for key in policy.busy_annotations:
        if key in node.annotations:
            return f"{SKIP_BUSY_ANNOTATION}:{key}"
    if (node.unschedulable or UNSCHEDULABLE_TAINT in taint_keys) and not cordoned_by_us(node):
        # AKS cordons during upgrades and node-image updates; an operator may be investigating.
        return SKIP_CORDONED_BY_OTHER
    if now - node.created < policy.startup_grace_s:
        return SKIP_STARTING
    if policy.skip_not_ready and not node.ready and not cordoned_by_us(node):
        # NotReady is AKS auto-repair's job (reboot, reimage, redeploy); never race it.
        return SKIP_NOT_READY
    return None


def evaluate(nodes: Sequence[NodeView], *, now: float, policy: RemediationPolicy) -> Evaluation:
    """Sort ``nodes`` into buckets; ``next_check`` is the earliest time a pending finding crosses."""
    out = Evaluation()
    thresholds = [(type_, policy.threshold_for(type_)) for type_ in policy.conditions]  # once, not per node
    for node in nodes:
        reason = skip_reason(node, now=now, policy=policy)
        if reason is not None:
            out.skipped.append((node, reason))
            if reason == SKIP_STARTING:
                out._later(node.created + policy.startup_grace_s)
            continue
        over: list[Finding] = []
        under: list[Finding] = []
        missing: list[str] = []
        for type_, threshold in thresholds:
            cond = node.condition(type_)
            if cond is None or cond.status not in ("True", "False"):
                missing.append(type_)
                continue
            if cond.status != "True":
                continue
            if cond.last_transition is None:
                missing.append(type_)  # True without a transition time cannot be debounced
                continue
            # a plain float: a decoded transition time is a ports.Epoch, which msgspec cannot store
            since = float(cond.last_transition)
            finding = Finding(node=node, condition=type_, since=since)
            crosses = since + threshold
            if now >= crosses:
                over.append(finding)
            else:
                under.append(finding)
                out._later(crosses)
        if over:
            out.unhealthy.extend(over)
        if under:
            out.pending.extend(under)
        if over or under:
            continue
        if missing:
            out.unknown.extend((node, type_) for type_ in missing)
            continue
        out.healthy.append(node)
    return out


def is_recovered(node: NodeView, *, policy: RemediationPolicy) -> tuple[bool, str]:
    """Ready, no configured condition ``True``, and GPUs allocatable: the check after each repair.

    A missing NPD condition is accepted here (a reimaged node may not report it yet, and managed
    GPU pools may not run NPD at all) because allocatable GPUs are checked too.
    """
    if not node.ready:
        return False, "node is not Ready"
    for type_ in policy.conditions:
        cond = node.condition(type_)
        if cond is not None and cond.status != "False":
            return False, f"{type_} is {cond.status}"
    if gpus_allocatable(node) <= 0:
        return False, "no GPUs allocatable"
    return True, "Ready, GPU conditions False, GPUs allocatable"


def gpus_allocatable(node: NodeView) -> int:
    """GPUs (or MIG slices) the kubelet offers: every ``nvidia.com/*`` allocatable resource summed."""
    total = 0
    for key, value in node.allocatable.items():
        if key.startswith("nvidia.com/"):
            try:
                total += int(str(value))
            except ValueError:
                continue
    return total

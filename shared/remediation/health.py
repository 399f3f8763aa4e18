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

from shared.kernel.ports import NodeView
from shared.kernel.timefmt import iso
from shared.remediation.policy import RemediationPolicy

CORDONED_BY_LABEL = "gpu-fleet-steward/cordoned-by"
CORDON_FOR_ANNOTATION = "gpu-fleet-steward/cordoned-for"
CORDON_REASON_ANNOTATION = "gpu-fleet-steward/cordon-reason"
CORDON_AT_ANNOTATION = "gpu-fleet-steward/cordoned-at"
STATE_ANNOTATION = "gpu-fleet-steward/remediation"

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

AGENTPOOL_LABEL = "kubernetes.azure.com/agentpool"
# Node auto-provisioning (Karpenter) nodes carry neither kubernetes.azure.com/agentpool nor
# kubernetes.azure.com/accelerator (Azure/karpenter-provider-azure designs/0006-requirements-and-labels.md;
# #837 dropped accelerator as redundant with sku-gpu-name): their pool is the NodePool, and GPU nodes
# are found by karpenter.azure.com/sku-gpu-manufacturer (pkg/apis/v1beta1/labels.go).
NODEPOOL_LABEL = "karpenter.sh/nodepool"
NAP_GPU_SELECTOR = "karpenter.azure.com/sku-gpu-manufacturer=nvidia"

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
    #: (finding, skip reason): a skipped node that also carries a fault past its threshold. Not a fault to
    #: publish (the skip wins), but a decision not to repair, recorded for the operator (shared.remediation.decisions).
    skipped_faults: list[tuple[Finding, str]] = field(default_factory=list)
    next_check: float | None = None

    def _later(self, at: float) -> None:
        self.next_check = at if self.next_check is None else min(self.next_check, at)


def is_karpenter_node(node: NodeView) -> bool:
    """A node auto-provisioning (Karpenter) node: made for a NodePool, a standalone VM, no agent pool."""
    return bool(node.labels.get(NODEPOOL_LABEL)) and "/virtualmachinescalesets/" not in node.provider_id.lower()


def pool_of(node: NodeView) -> str:
    """The node's pool: its agent pool, or the Karpenter NodePool that made it."""
    if is_karpenter_node(node):
        return node.labels.get(NODEPOOL_LABEL, "")
    return node.pool


def pool_selector(node: NodeView) -> str:
    """The label selector of the node's pool (agent pool, or Karpenter NodePool)."""
    if is_karpenter_node(node):
        return f"{NODEPOOL_LABEL}={node.labels.get(NODEPOOL_LABEL, '')}"
    return f"{AGENTPOOL_LABEL}={node.pool}"


def cordoned_by_us(node: NodeView) -> bool:
    """The node carries our cordon marker (only then may we ever uncordon it)."""
    return bool(node.labels.get(CORDONED_BY_LABEL)) and bool(node.annotations.get(CORDON_FOR_ANNOTATION))


@dataclass(frozen=True)
class _Rules:
    """The policy's skip rules in the shapes a per-node check wants (built once per evaluation)."""

    opt_out_label: str
    busy_taints: tuple[str, ...]
    busy_taint_set: frozenset[str]
    busy_annotations: tuple[str, ...]
    startup_grace_s: float
    skip_not_ready: bool
    thresholds: tuple[tuple[str, float], ...]

    def threshold(self, condition: str) -> float:
        return next(t for type_, t in self.thresholds if type_ == condition)

    @classmethod
    def of(cls, policy: RemediationPolicy) -> _Rules:
        return cls(policy.opt_out_label, tuple(policy.busy_taints), frozenset(policy.busy_taints),
                   tuple(policy.busy_annotations), float(policy.startup_grace_s), bool(policy.skip_not_ready),
                   tuple((type_, policy.threshold_for(type_)) for type_ in policy.conditions))


def _skip(node: NodeView, *, now: float, rules: _Rules) -> str | None:
    """Why this node is not ours to judge right now, or None. Order matters: the first reason wins."""
    labels = node.labels
    if labels and labels.get(rules.opt_out_label, "").lower() == "true":
        return SKIP_OPTED_OUT
    if node.deletion_timestamp is not None:
        # AKS (scale-down, upgrade surge, a deleted machine) is already taking this node away.
        return SKIP_DELETING
    tainted_unschedulable = False
    if node.taints:
        taint_keys = [t.key for t in node.taints]
        if not rules.busy_taint_set.isdisjoint(taint_keys):
            for key in rules.busy_taints:  # the policy's order decides which busy taint is named
                if key in taint_keys:
                    return f"{SKIP_BUSY_TAINT}:{key}"
        tainted_unschedulable = UNSCHEDULABLE_TAINT in taint_keys
    annotations = node.annotations
    if annotations:
        for key in rules.busy_annotations:
            if key in annotations:
                return f"{SKIP_BUSY_ANNOTATION}:{key}"
    if (node.unschedulable or tainted_unschedulable) and not cordoned_by_us(node):
        # AKS cordons during upgrades and node-image updates; an operator may be investigating.
        return SKIP_CORDONED_BY_OTHER
    if now - node.created < rules.startup_grace_s:
        return SKIP_STARTING
    if rules.skip_not_ready and not node.ready and not cordoned_by_us(node):
        # NotReady is AKS auto-repair's job (reboot, reimage, redeploy); never race it.
        return SKIP_NOT_READY
    return None


def _judge(node: NodeView, *, now: float, rules: _Rules) -> tuple[list[Finding], list[Finding], list[str]]:
    """The node's configured conditions: ``True`` past the threshold, ``True`` under it, and missing or
    ``Unknown`` (a ``True`` without a transition time cannot be debounced: missing)."""
    over: list[Finding] = []
    under: list[Finding] = []
    missing: list[str] = []
    for type_, threshold in rules.thresholds:
        cond = node.condition(type_)
        if cond is None or cond.status not in ("True", "False"):
            missing.append(type_)
            continue
        if cond.status != "True":
            continue
        transition = cond.last_transition
        if transition is None:
            missing.append(type_)
            continue
        since = float(transition)  # a plain float: what records store
        (over if now >= since + threshold else under).append(Finding(node=node, condition=type_, since=since))
    return over, under, missing


def evaluate(nodes: Sequence[NodeView], *, now: float, policy: RemediationPolicy) -> Evaluation:
    """Sort ``nodes`` into buckets; ``next_check`` is the earliest time a pending finding crosses."""
    out = Evaluation()
    rules = _Rules.of(policy)  # once, not per node
    for node in nodes:
        reason = _skip(node, now=now, rules=rules)
        if reason is not None:
            out.skipped.append((node, reason))
            if reason == SKIP_STARTING:
                out._later(node.created + rules.startup_grace_s)
            out.skipped_faults.extend((f, reason) for f in _judge(node, now=now, rules=rules)[0])
            continue
        over, under, missing = _judge(node, now=now, rules=rules)
        for finding in under:
            out._later(finding.since + rules.threshold(finding.condition))
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


def fault_back_after_boot(node: NodeView, *, policy: RemediationPolicy, since: float) -> str:
    """The configured condition that a node-problem-detector started by a boot after ``since`` found True
    again (pure); empty when none did.

    NPD runs every rule once on start (kubernetes/node-problem-detector pkg/custompluginmonitor/plugin/
    plugin.go ``Run``), so a fault that survived a restart or reimage is True again seconds after the node
    is back, and it may never read ``False`` when the app looks. That is the rung failing, known now, not at
    the rung's timeout. Only the conservative case counts: the node Ready again since ``since`` (the
    action's start) and the condition turned True no earlier than that Ready, so a fault still True from
    before the boot, or one that turned True while the node went down, is not taken for the boot's verdict.
    """
    ready = node.condition("Ready")
    if not node.ready or ready is None or ready.last_transition is None or ready.last_transition < since:
        return ""
    for type_ in policy.conditions:
        cond = node.condition(type_)
        if (cond is not None and cond.status == "True" and cond.last_transition is not None
                and cond.last_transition >= ready.last_transition):
            return (f"{type_} True again since {iso(cond.last_transition)}, after the node was Ready at "
                    f"{iso(ready.last_transition)}")
    return ""


VERIFIED, CONFIRMING, NOT_RECOVERED = "verified", "confirming", "not-recovered"


@dataclass(frozen=True)
class Verdict:
    """The check after a repair: ``state`` is VERIFIED, CONFIRMING (healthy, but not yet for the whole
    window: look again at ``until``) or NOT_RECOVERED; ``why`` says so for the record."""

    state: str
    why: str
    until: float | None = None


def verify_repair(node: NodeView, *, policy: RemediationPolicy, since: float, now: float,
                  window_s: float, since_what: str = "verification began") -> Verdict:
    """Whether a repaired node may be trusted again (pure).

    Healthy (:func:`is_recovered`) is not enough right after a boot: node-problem-detector publishes
    its custom-plugin conditions ``False`` with a fresh ``lastTransitionTime`` when it starts, before
    its first check (kubernetes/node-problem-detector custom_plugin_monitor.go ``initialConditions``),
    and a fault that survived the reboot turns ``True`` only at that check. So the node must stay
    healthy for ``window_s`` after the latest of: ``since`` (verification began), Ready's transition
    and each configured condition's transition. A ``False`` that NPD published at start-up is thus
    never taken as recovery on its own.
    """
    recovered, why = is_recovered(node, policy=policy)
    if not recovered:
        return Verdict(NOT_RECOVERED, why)
    start, what = since, since_what
    ready = node.condition("Ready")
    if ready is not None and ready.last_transition is not None and ready.last_transition > start:
        start, what = ready.last_transition, "the node turned Ready"
    for type_ in policy.conditions:
        cond = node.condition(type_)
        at = cond.last_transition if cond is not None else None
        if at is not None and at > start:
            start, what = at, f"{type_} turned {cond.status if cond else ''} (NPD start-up or check)"
    until = start + window_s
    if now < until:
        return Verdict(CONFIRMING, f"healthy; confirming for {window_s:.0f}s after {what} (outlasting NPD's first "
                                   f"check after a boot)", until)
    return Verdict(VERIFIED, f"{why}; stable for {now - start:.0f}s since {what}")


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

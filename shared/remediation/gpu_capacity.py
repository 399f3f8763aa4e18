"""A GPU node that offers fewer GPUs than its VM size has: the fourth fault signal (issue 18 item 6).

NPD, DCGM and Resource Health each report a fault someone detected. A node can also be quietly
useless: Ready, but its device plugin never advertised ``nvidia.com/gpu``, or advertises fewer than the
VM size has (a GPU failed to enumerate at boot, or fell off the bus while running). Two references
treat exactly this as a fault:

- Cluster API's MachineHealthCheck ``nodeStartupTimeout`` (kubernetes-sigs/cluster-api
  internal/controllers/machinehealthcheck/machinehealthcheck_targets.go ``needsRemediation``: a machine
  without a node once the timeout has passed since its creation is unhealthy; default 10 minutes,
  api/v1beta2 ``MachineHealthCheck``) and is remediated by deleting the machine: a new one replaces it;
- the EKS node monitoring agent's ``NvidiaDeviceCountMismatch`` (aws/eks-node-monitoring-agent
  ``DeviceCount``: "expected N GPUs for this instance type but only M were detected — possible hardware
  failure", a Fatal ``AcceleratedHardwareReady`` condition since v1.6.2;
  https://docs.aws.amazon.com/eks/latest/userguide/node-health-nma.html), as AKS's own NPD
  ``GPUMissing`` check compares nvidia-smi's count with the VM SKU's
  (https://learn.microsoft.com/azure/aks/gpu-health-monitoring).

What the node offers is ``status.allocatable["nvidia.com/gpu"]``: the NVIDIA device plugin registers
the resource with the kubelet, which publishes every device in ``capacity`` and only the healthy ones
in ``allocatable`` (kubernetes/kubernetes pkg/kubelet/cm/devicemanager; NVIDIA/k8s-device-plugin marks
a device unhealthy on XID 79 and the like, internal/rm/health.go). The expected count is the VM
size's, from the app's one table (:mod:`shared.fleet.gpu_sizes`); the sweep reads the size from the
node's ``node.kubernetes.io/instance-type`` label, and the admission re-check from the pool in ARM.

Never judged: a node not Ready (AKS auto-repair's), being deleted, opted out, cordoned by another
actor, carrying a busy taint or annotation (the same rules as :mod:`shared.remediation.health`); a
size the table does not know (or not NVIDIA); a MIG node (the device plugin advertises MIG instances,
``nvidia.com/mig-*`` or more ``nvidia.com/gpu`` than GPUs: :mod:`shared.fleet.stack`); and a node of a
pool whose GPU stack is not AKS-managed that advertises no ``nvidia.com/gpu`` at all (its device
plugin is the team's to install, maybe later: absence is "cannot tell"). On a managed pool, a missing
resource or GPU health conditions never reported are a shortfall too: AKS installs both.

Debounce: the first sweep that sees a node short keeps the time in a ledger row (kind
``gpu-capacity-node``, one per node, removed when the node is whole again, skipped or gone), so every
host agrees on the fault's ``since`` and hence its id. A node short since its start-up grace began is
a ``gpu-capacity:startup`` fault once the grace has passed since its creation; a node first seen short
later is a ``gpu-capacity:lost`` fault once ``REMEDIATION_GPU_LOST_THRESHOLD_S`` has passed. A short
node still short after its remediation ended starts a new ``lost`` fault, which a re-check escalates
to replace after a restart did not hold (NVIDIA's XID 79 row: reboot, a repeat is hardware).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import gpu_sizes, stack
from shared.kernel.errors import Conflict, Forbidden, Invalid, NotFound, StewardError
from shared.kernel.ports import NodeView, PoolInfo, Record
from shared.kernel.quantity import whole_units
from shared.kernel.timefmt import iso, parse_time
from shared.remediation import admission, attempts, health
from shared.remediation import signal_policy as sp
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    decode,
    fault_id,
    node_key,
    to_data,
)
from shared.remediation.signals import Signal, SignalSource

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.gpu_capacity")

SIGNAL = str(SignalSource.GPU_CAPACITY)
ROW_KIND = "gpu-capacity-node"
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
# GPU feature discovery and the MIG manager label MIG nodes (NVIDIA/gpu-feature-discovery, NVIDIA/mig-parted).
MIG_LABELS = ("nvidia.com/mig.strategy", "nvidia.com/mig.config")

SRC_CAPI = ("kubernetes-sigs/cluster-api internal/controllers/machinehealthcheck/machinehealthcheck_targets.go "
            "(needsRemediation: nodeStartupTimeout since machine creation, default 10m; remediation replaces the machine)")
SRC_EKS = ("aws/eks-node-monitoring-agent DeviceCount: NvidiaDeviceCountMismatch, GPUs detected below the instance "
           "type's count; https://docs.aws.amazon.com/eks/latest/userguide/node-health-nma.html")
SRC_AKS_NPD = "https://learn.microsoft.com/azure/aks/gpu-health-monitoring (GPUMissing: count below the VM SKU's)"
SRC_PLUGIN = ("kubernetes/kubernetes pkg/kubelet/cm/devicemanager (unhealthy devices leave allocatable, stay in capacity); "
              "NVIDIA/k8s-device-plugin internal/rm/health.go")


@dataclass(frozen=True)
class Row:
    """One policy row of this signal: ``key`` stands in for the condition in the record and the fault id."""

    id: str
    key: str
    action: str
    source: str
    note: str

    def decision(self) -> sp.Decision:
        return sp.Decision(self.action, self.id, self.source, self.note)


STARTUP = Row("gpu-capacity:startup", "GpuCapacity/startup", sp.REPLACE, f"{SRC_CAPI}; {SRC_EKS}",
              "the node never offered all its GPUs within the start-up grace: replace the machine, as CAPI does")
LOST = Row("gpu-capacity:lost", "GpuCapacity/lost", sp.RESTART_THEN_REPLACE, f"{SRC_PLUGIN}; {SRC_EKS}; {SRC_AKS_NPD}; "
           f"{sp.SRC_XID} (XID 79)", "a running node lost GPUs (fell off the bus): reboot; a repeat is hardware")
ROWS: tuple[Row, ...] = (STARTUP, LOST)
_BY_KEY: Mapping[str, Row] = {r.key: r for r in ROWS}

# What a node looks like to this signal (stable strings: reports and tests).
SKIPPED, UNJUDGED, WHOLE, PENDING, DUE = "skipped", "unjudged", "whole", "pending", "due"


@dataclass(frozen=True)
class Expect:
    """What a node should offer: ``gpus`` from its VM size (None: not a known NVIDIA size), whether its
    pool's GPU stack is AKS-managed (device plugin and NPD installed by AKS) and whether it is MIG."""

    gpus: int | None
    managed: bool
    mig: bool
    size: str


@dataclass(frozen=True)
class Verdict:
    """One node judged: ``state``; the row and fault ``since`` once short; ``due_at`` when it becomes a fault."""

    state: str
    detail: str
    row: Row | None = None
    since: float | None = None
    due_at: float | None = None
    advertised: int | None = None
    expected: int | None = None


def _size_of(node: NodeView) -> str:
    return next((node.labels[k] for k in INSTANCE_TYPE_LABELS if node.labels.get(k)), "")


def _gpus_of(size: str) -> int | None:
    known = gpu_sizes.lookup(size) if size else None
    return known.gpus if known is not None and known.is_nvidia and known.gpus > 0 else None


def expect_from_node(node: NodeView) -> Expect:
    """The sweep's cheap view, from the node's own labels and resources (the re-check asks ARM)."""
    mig = any(k.startswith(stack.MIG_RESOURCE_PREFIX) for k in [*node.capacity, *node.allocatable]) or any(
        node.labels.get(k, "").lower() not in ("", "none", "all-disabled") for k in MIG_LABELS)
    managed = node.labels.get(stack.DCGM_LABEL) == "enabled"  # AKS's label on nodes of managed GPU pools
    return Expect(_gpus_of(_size_of(node)), managed, mig, _size_of(node))


def expect_from_pool(pool: PoolInfo, node: NodeView) -> Expect:
    """ARM's view: the pool's ``vmSize``, management mode and MIG profile (classic or managed)."""
    gp = pool.properties.get("gpuProfile") or {}
    nvidia = gp.get("nvidia") or {}
    mig = bool(pool.properties.get("gpuInstanceProfile")) or bool(nvidia.get("migProfiles")) or \
        str(nvidia.get("migStrategy") or "None").lower() != "none" or expect_from_node(node).mig
    return Expect(_gpus_of(pool.vm_size), pool.management_mode == "Managed", mig, pool.vm_size)


def advertised(node: NodeView) -> int | None:
    """Allocatable ``nvidia.com/gpu`` (None when the resource is not there at all, or not a quantity)."""
    raw = node.allocatable.get(stack.GPU_RESOURCE)
    if raw is None:
        return None
    try:
        return whole_units(str(raw))
    except Invalid:
        return None


def shortfall(node: NodeView, expect: Expect) -> tuple[bool | None, str]:
    """Is the node short of GPUs (True), whole (False), or can that not be told (None)? No time, no skips."""
    if expect.gpus is None:
        return None, f"size {expect.size or '(none)'} has no known NVIDIA GPU count"
    if expect.mig:
        return None, "MIG node: the device plugin advertises MIG instances, not GPUs"
    have = advertised(node)
    if have is None and not expect.managed:
        return None, f"no {stack.GPU_RESOURCE} advertised on a pool whose device plugin is not AKS's"
    if have is None or have < expect.gpus:
        return True, f"{stack.GPU_RESOURCE} allocatable {'missing' if have is None else have} of {expect.gpus} " \
                     f"({expect.size})"
    if expect.managed and not any(node.condition(t) is not None for t in stack.GPU_CONDITIONS):
        return True, f"GPU health conditions ({', '.join(stack.GPU_CONDITIONS)}) never reported"
    return False, f"{have} of {expect.gpus} GPUs allocatable"


def _skip_reason(node: NodeView, *, policy: RemediationPolicy) -> str | None:
    """health's skip rules (same reasons, same order), without its start-up grace (this signal has its
    own) and with Ready required whatever REMEDIATION_SKIP_NOT_READY says: a NotReady node offers nothing."""
    if node.labels.get(policy.opt_out_label, "").lower() == "true":
        return health.SKIP_OPTED_OUT
    if node.deletion_timestamp is not None:
        return health.SKIP_DELETING
    taints = [t.key for t in node.taints]
    busy = next((k for k in policy.busy_taints if k in taints), None)
    if busy is not None:
        return f"{health.SKIP_BUSY_TAINT}:{busy}"
    annotation = next((k for k in policy.busy_annotations if k in node.annotations), None)
    if annotation is not None:
        return f"{health.SKIP_BUSY_ANNOTATION}:{annotation}"
    if (node.unschedulable or health.UNSCHEDULABLE_TAINT in taints) and not health.cordoned_by_us(node):
        return health.SKIP_CORDONED_BY_OTHER
    if not node.ready:
        return health.SKIP_NOT_READY
    return None


def judge(node: NodeView, *, expect: Expect, short_since: float | None, now: float,
          policy: RemediationPolicy) -> Verdict:
    """Pure: the verdict on one node, ``short_since`` being when a sweep first saw it short (None: not yet).

    A node first seen short before ``created + gpu_startup_grace_s`` is a STARTUP fault due at the end
    of the grace; one first seen short later is a LOST fault due ``gpu_lost_threshold_s`` after that."""
    skip = _skip_reason(node, policy=policy)
    if skip is not None:
        return Verdict(SKIPPED, skip)
    short, why = shortfall(node, expect)
    have = advertised(node)
    if short is None:
        return Verdict(UNJUDGED, why, advertised=have, expected=expect.gpus)
    if not short:
        return Verdict(WHOLE, why, advertised=have, expected=expect.gpus)
    since = now if short_since is None else short_since
    grace_end = node.created + policy.gpu_startup_grace_s
    row, due = (STARTUP, grace_end) if since < grace_end else (LOST, since + policy.gpu_lost_threshold_s)
    state = DUE if now >= due else PENDING
    detail = f"{why}; {'short since start-up' if row is STARTUP else 'short since ' + iso(since)}"
    return Verdict(state, detail, row, since, due, have, expect.gpus)


class CapacityRow(msgspec.Struct, kw_only=True):
    """``Record.data`` of a ``gpu-capacity-node`` row: when a sweep first saw this node (by uid) short."""

    cluster: str
    node: str
    uid: str
    since: float


@dataclass(frozen=True)
class CapacityFault:
    cluster: str
    node: str
    pool: str
    verdict: Verdict

    def event_data(self) -> dict[str, Any]:
        row = self.verdict.row
        assert row is not None
        return {"signal": SIGNAL, "policy_row": row.id, "action": row.action, "expected": self.verdict.expected,
                "advertised": self.verdict.advertised, "due_at": iso(self.verdict.due_at or self.verdict.since or 0.0),
                "threshold_s": int((self.verdict.due_at or 0.0) - (self.verdict.since or 0.0))}


@dataclass
class CapacitySweep:
    """What one sweep found (shared.remediation.sweep folds it into its report)."""

    judged: int = 0
    whole: int = 0
    pending: int = 0
    unjudged: int = 0
    faults: list[CapacityFault] = field(default_factory=list)
    observations: dict[str, float] = field(default_factory=dict)  # node key -> since (breaker)
    errors: list[str] = field(default_factory=list)
    next_check: float | None = None

    def summary(self) -> dict[str, Any]:
        return {"judged": self.judged, "whole": self.whole, "pending": self.pending, "unjudged": self.unjudged,
                "faults": len(self.faults), "errors": list(self.errors)}


class Sweeper:
    """The sweep's side of this signal: pages of nodes in, faults out, the ledger rows kept in step."""

    def __init__(self, ctx: Context, policy: RemediationPolicy) -> None:
        self.ctx, self.policy = ctx, policy
        self.result = CapacitySweep()
        self.enabled = policy.gpu_capacity
        self.rows: dict[str, Record] = {}
        self.seen: set[str] = set()
        self.done: set[str] = set()
        if self.enabled:
            try:
                self.rows = {r.id: r for r in ctx.ledger.list(ROW_KIND)}
            except StewardError as exc:
                self.result.errors.append(f"gpu-capacity: reading the {ROW_KIND} rows: {exc}")
                self.enabled = False

    def page(self, cluster_id: str, nodes: Iterable[NodeView]) -> None:
        if not self.enabled:
            return
        for node in nodes:
            try:
                self._node(cluster_id, node)
            except StewardError as exc:
                self.result.errors.append(f"gpu-capacity {cluster_id}/{node.name}: {type(exc).__name__}: {exc}")

    def cluster_done(self, cluster_id: str) -> None:
        """Every node of the cluster was listed: rows of nodes not seen belong to nodes that are gone."""
        self.done.add(cluster_id.lower())

    def finish(self) -> CapacitySweep:
        for key, rec in self.rows.items():
            if key not in self.seen and str(rec.data.get("cluster", "")).lower() in self.done:
                self._forget(rec)
        return self.result

    def _forget(self, rec: Record | None) -> None:
        if rec is None:
            return
        with contextlib.suppress(Conflict, NotFound):  # another host changed or removed it: the next sweep looks
            self.ctx.ledger.delete(rec)

    def _store(self, rec: Record | None, data: CapacityRow, now: float) -> Record | None:
        try:
            if rec is None:
                return self.ctx.ledger.create(Record(kind=ROW_KIND, id=node_key(data.cluster, data.node), state="short",
                                                     data=to_data(data), created_at=now, updated_at=now))
            return self.ctx.ledger.save(msgspec.structs.replace(rec, data=to_data(data), updated_at=now))
        except Conflict:
            return None  # another host judged this node at the same time: its row wins, this node waits a sweep

    def _node(self, cluster_id: str, node: NodeView) -> None:
        now, key, res = self.ctx.clock.now(), node_key(cluster_id, node.name), self.result
        self.seen.add(key)
        rec = self.rows.get(key)
        row = decode(rec.data, CapacityRow) if rec is not None else None
        since = row.since if row is not None and row.uid == node.uid else None
        verdict = judge(node, expect=expect_from_node(node), short_since=since, now=now, policy=self.policy)
        if verdict.state in (SKIPPED, UNJUDGED, WHOLE):
            res.judged += verdict.state != SKIPPED
            res.unjudged += verdict.state == UNJUDGED
            res.whole += verdict.state == WHOLE
            self._forget(rec)
            return
        res.judged += 1
        if verdict.state == DUE and verdict.row is not None and verdict.since is not None:
            fid = fault_id(cluster_id, node.name, verdict.row.key, verdict.since)
            if attempts.handling(self.ctx, cluster_id, node.name, fid) == "ended":
                # still short after its remediation ended: a new fault, first seen now (the re-check may escalate)
                since = None
                verdict = judge(node, expect=expect_from_node(node), short_since=now, now=now, policy=self.policy)
        if since is None and self._store(rec, CapacityRow(cluster=cluster_id, node=node.name, uid=node.uid,
                                                          since=verdict.since or now), now) is None:
            return
        if verdict.row is LOST or verdict.state == DUE:  # a start-up still in its grace is not an observation
            res.observations[key] = min(verdict.since or now, res.observations.get(key, verdict.since or now))
        if verdict.state == PENDING:
            res.pending += 1
            due = verdict.due_at or now
            res.next_check = due if res.next_check is None else min(res.next_check, due)
            return
        res.faults.append(CapacityFault(cluster=cluster_id, node=node.name, pool=health.pool_of(node), verdict=verdict))


# --------------------------------------------------------------------------- admission and the steps
def _expect_from_arm(ctx: Context, cluster_id: str, node: NodeView) -> Expect | None:
    """The expectation ARM backs: the agent pool's size and profile; a Karpenter node's own size label
    (no pool in ARM; the only action on it deletes its NodeClaim in the same cluster). None: unreadable."""
    if health.is_karpenter_node(node):
        return expect_from_node(node)
    try:
        pool = ctx.access.aks().get_pool(cluster_id, node.pool)
    except (NotFound, Forbidden, Invalid):
        return None
    return expect_from_pool(pool, node) if pool is not None else None


def still_present(ctx: Context, *, cluster_id: str, node: NodeView) -> tuple[bool | None, str]:
    """Before a disruptive step: is the node still short of GPUs (True), whole again (False), or can that
    not be told (None: ARM unreadable, a MIG or unknown size, no device plugin on a pool that is not managed)?

    Reads the pool from ARM (raises only Throttled/Transient, for the step to retry); judges ``node``
    as given (the caller has just read it), without the start-up grace or threshold: those were for
    admitting the fault, not for keeping it."""
    expect = _expect_from_arm(ctx, cluster_id, node)
    if expect is None:
        return None, f"the pool of {node.name} cannot be read from ARM"
    return shortfall(node, expect)


def _ignored(detail: str) -> admission.Handled:
    return admission.Handled(admission.Handling.IGNORED, f"ignored: {detail}")


def recheck(ctx: Context, data: Mapping[str, Any], *, event_id: str, observed_at: float) -> admission.Handled:
    """Re-read the node from its API server and its pool from ARM, judge again, and admit what is due now.

    The event only names the node: the verdict, its row and its ``since`` are this function's own
    (the ledger row keeps the first sighting). Raises only Throttled/Transient."""
    cluster_id, node_name = str(data.get("cluster") or ""), str(data.get("node") or "")
    key, since = str(data.get("condition") or ""), parse_time(data.get("since") or None)
    if not cluster_id or not node_name or key not in _BY_KEY or since is None:
        return _ignored("malformed gpu-capacity event (needs data.cluster, node, condition, since)")
    policy = admission.policy_of(ctx)
    if not policy.gpu_capacity:
        return _ignored("the GPU capacity signal is off (REMEDIATION_GPU_CAPACITY=false)")
    cluster, why_not = admission.scoped_cluster(ctx, cluster_id)
    if cluster is None:
        return _ignored(why_not)
    now = ctx.clock.now()
    node = ctx.access.kube(cluster.id).get_node(node_name)
    if node is None:
        return _ignored(f"node {node_name} no longer exists")
    expect = _expect_from_arm(ctx, cluster.id, node)
    if expect is None:
        return _ignored(f"the pool of {node_name} cannot be read from ARM: nothing inferred")
    rec = ctx.ledger.get(ROW_KIND, node_key(cluster.id, node_name))
    row = decode(rec.data, CapacityRow) if rec is not None else None
    if row is None or row.uid != node.uid:
        return _ignored(f"no sweep has seen {node_name} short of GPUs")
    verdict = judge(node, expect=expect, short_since=row.since, now=now, policy=policy)
    if verdict.state != DUE or verdict.row is None or verdict.since is None:
        return _ignored(f"{node_name}: {verdict.state} ({verdict.detail})")
    if verdict.row.key != key or verdict.since > since + 1.0:
        return _ignored(f"stale event ({key} since {iso(since)}; now {verdict.row.key} since {iso(verdict.since)})")
    active, repeated = attempts.earlier(ctx, cluster.id, node_name, signal=SIGNAL, now=now, policy=policy)
    if active:
        return admission.Handled(admission.Handling.DUPLICATE, f"duplicate: remediation {active} is in progress on "
                                                               f"{node_name}; its GPUs are judged again after it")
    decision = verdict.row.decision()
    if decision.action == sp.RESTART_THEN_REPLACE and repeated:
        decision = sp.Decision(sp.REPLACE, f"{decision.row}:repeat", decision.source,
                               f"still short after remediation {repeated} restarted the node: {decision.note}")
    log.info("GPU capacity re-check of %s/%s: %s -> %s (row %s)", cluster.id, node_name, verdict.detail,
             decision.action, decision.row)
    signal = Signal(source=SignalSource.GPU_CAPACITY, key=verdict.row.key, since=verdict.since, decision=decision,
                    detail=f"{verdict.detail} (row {decision.row}: {decision.action}; {decision.note})")
    return admission.admit_signal(ctx, cluster=cluster, node=node, signal=signal, event_id=event_id,
                                  observed_at=observed_at)

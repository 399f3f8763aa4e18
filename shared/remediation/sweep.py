"""The health sweep: find unhealthy GPU nodes across the fleet and report each fault once per sweep.

Runs on a timer (every minute by default). For each cluster in scope it streams the GPU nodes page
by page (``kubernetes.azure.com/accelerator=nvidia``, and on node auto-provisioning clusters
``karpenter.azure.com/sku-gpu-manufacturer=nvidia``: Karpenter's nodes do not carry the former), evaluates each page with the pure
:func:`shared.remediation.health.evaluate` and keeps only the findings, so memory is bounded by the page size
and the number of unhealthy nodes, never by the fleet size. Each unhealthy (cluster, node,
condition, lastTransitionTime) is published as a ``Steward.GpuNode.Unhealthy`` CloudEvent whose id
is sha256 of those four: the same fault always has the same id, and a fault already handled by a
remediation is not published again. Faults that were refused (budget, breaker, pause) keep being
reported every sweep: that is how they are retried once the limit allows. The sweep also feeds
the fleet breaker with the nodes that turned unhealthy, and one failing cluster never stops the
sweep of the others (its error is in the report).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.fleet import scope
from shared.kernel.errors import StewardError
from shared.kernel.ports import NodeView
from shared.kernel.timefmt import iso
from shared.remediation import breaker, breaker_evidence, dcgm, decisions, due_sweep, gpu_capacity, health, pending_faults
from shared.remediation.notify import metric
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import NODE_KIND, UNHEALTHY_EVENT, NodeData, decode, fault_id, node_key, subject

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.sweep")


@dataclass(frozen=True)
class Fault:
    cluster: str
    node: str
    pool: str
    condition: str
    since: float
    message: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # a DCGM fault's signal, metric, value, GPU, row

    @property
    def id(self) -> str:
        return fault_id(self.cluster, self.node, self.condition, self.since)


@dataclass
class SweepReport:
    clusters: int = 0
    nodes: int = 0
    healthy: int = 0
    unhealthy: int = 0
    pending: int = 0
    unknown: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    published: int = 0
    suppressed: int = 0  # already handled by a remediation
    errors: list[str] = field(default_factory=list)
    next_check: float | None = None
    due_sweep: int | None = None  # the epoch second a sweep was asked for (shared.remediation.due_sweep)
    breaker: str = ""
    faults: list[Fault] = field(default_factory=list)
    skipped_faults: list[decisions.SkippedFault] = field(default_factory=list)  # recorded as decision rows
    decisions: dict[str, int] = field(default_factory=dict)  # what recording them did
    pending_faults: dict[str, Any] = field(default_factory=dict)  # kept refused pushed faults judged again
    dcgm: dict[str, Any] = field(default_factory=dict)  # shared.remediation.dcgm.DcgmSweep.summary()
    gpu_capacity: dict[str, Any] = field(default_factory=dict)  # shared.remediation.gpu_capacity.CapacitySweep.summary()
    breaker_evidence: dict[str, Any] = field(default_factory=dict)  # shared.remediation.breaker_evidence.Evidence.summary()

    def summary(self) -> dict[str, Any]:
        return {"clusters": self.clusters, "nodes": self.nodes, "healthy": self.healthy, "unhealthy": self.unhealthy,
                "pending": self.pending, "unknown": self.unknown, "skipped": dict(self.skipped),
                "published": self.published, "suppressed": self.suppressed, "errors": list(self.errors),
                "next_check": self.next_check, "due_sweep": self.due_sweep, "breaker": self.breaker,
                "decisions": dict(self.decisions),
                "pending_faults": dict(self.pending_faults),
                "dcgm": dict(self.dcgm),
                "gpu_capacity": dict(self.gpu_capacity), "breaker_evidence": dict(self.breaker_evidence)}


def _fold(report: SweepReport, evaluation: health.Evaluation, *, cluster: str,
          observations: dict[str, float]) -> None:
    report.healthy += len(evaluation.healthy)
    report.unknown += len({n.name for n, _ in evaluation.unknown})
    report.pending += len(evaluation.pending)
    report.unhealthy += len(evaluation.unhealthy)
    for _, reason in evaluation.skipped:
        key = reason.split(":", 1)[0]
        report.skipped[key] = report.skipped.get(key, 0) + 1
    if evaluation.next_check is not None:
        report.next_check = evaluation.next_check if report.next_check is None else min(report.next_check,
                                                                                         evaluation.next_check)
    for f in [*evaluation.unhealthy, *evaluation.pending]:
        key = node_key(cluster, f.node.name)
        observations[key] = min(f.since, observations.get(key, f.since))
    for f, reason in evaluation.skipped_faults:
        report.skipped_faults.append(decisions.SkippedFault(cluster=cluster, node=f.node.name, pool=health.pool_of(f.node),
                                                            condition=f.condition, since=f.since, reason=reason))
    for f in evaluation.unhealthy:
        cond = f.node.condition(f.condition)
        report.faults.append(Fault(cluster=cluster, node=f.node.name, pool=health.pool_of(f.node), condition=f.condition,
                                   since=f.since, message=(cond.message if cond else "")[:300]))


def _selectors(cluster: Any, policy: RemediationPolicy) -> list[str]:
    """The GPU-node selectors of a cluster: REMEDIATION's (kubernetes.azure.com/accelerator=nvidia) and, on
    node auto-provisioning clusters, Karpenter's GPU label, which its nodes carry instead."""
    selectors = [policy.node_selector]
    if str(getattr(cluster, "node_provisioning_mode", "")).lower() == "auto" and \
            policy.node_selector != health.NAP_GPU_SELECTOR:
        selectors.append(health.NAP_GPU_SELECTOR)
    return selectors


def _equality_terms(selector: str) -> dict[str, str] | None:
    """``k=v,k2=v2`` as a dict; None for any other selector form."""
    terms: dict[str, str] = {}
    for part in selector.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key or value.startswith("=") or key.endswith("!"):
            return None
        terms[key.strip()] = value.strip()
    return terms


def _sweep_cluster(ctx: Context, cluster: Any, *, policy: RemediationPolicy, report: SweepReport,
                   observations: dict[str, float], capacity: gpu_capacity.Sweeper | None = None,
                   known: dict[str, dcgm.NodeFacts] | None = None) -> None:
    """Evaluate the cluster's GPU nodes page by page; ``known`` collects each node's name and GPU count
    (its size's), which the DCGM sweep maps series to: a series naming anything else is a phantom."""
    cluster_id = cluster.id
    kube = ctx.access.kube(cluster_id)
    page: list[NodeView] = []
    selectors = _selectors(cluster, policy)
    primary = _equality_terms(selectors[0])
    seen: set[str] = set()  # only when the primary selector is not plain equality (never by default)
    for i, selector in enumerate(selectors):
        for node in kube.list_nodes(label_selector=selector, page_size=policy.page_size):
            if i == 0 and primary is None and len(selectors) > 1:
                seen.add(node.name)
            if i > 0:
                # a node both selectors match was evaluated in the first pass
                if primary is not None and all(node.labels.get(k) == v for k, v in primary.items()):
                    continue
                if primary is None and node.name in seen:
                    continue
            report.nodes += 1
            page.append(node)
            if known is not None:
                known[node.name] = dcgm.node_facts(node)
            if len(page) >= policy.page_size:
                if capacity is not None:
                    capacity.page(cluster_id, page)
                _fold(report, health.evaluate(page, now=ctx.clock.now(), policy=policy), cluster=cluster_id,
                      observations=observations)
                page = []
    if page:
        if capacity is not None:
            capacity.page(cluster_id, page)
        _fold(report, health.evaluate(page, now=ctx.clock.now(), policy=policy), cluster=cluster_id,
              observations=observations)
    if capacity is not None:
        capacity.cluster_done(cluster_id)


def _fold_signal(report: SweepReport, *, errors: list[str], found: Mapping[str, float], next_check: float | None,
                 observations: dict[str, float]) -> None:
    """What every other signal's sweep adds alike: its errors, its breaker observations (earliest since per
    node), and when the sweep must look again."""
    report.errors.extend(errors)
    for key, since in found.items():
        observations[key] = min(since, observations.get(key, since))
    if next_check is not None:
        report.next_check = next_check if report.next_check is None else min(report.next_check, next_check)


def _fold_dcgm(report: SweepReport, found: dcgm.DcgmSweep, *, observations: dict[str, float]) -> None:
    """DCGM faults join the conditions' (same publishing, suppression and breaker); a workspace that
    failed only adds its error (shared.remediation.dcgm: nothing is inferred from missing data)."""
    report.dcgm = found.summary()
    _fold_signal(report, errors=found.errors, found=found.observations, next_check=found.next_check,
                 observations=observations)
    for f in found.faults:
        report.faults.append(Fault(cluster=f.cluster, node=f.node, pool=f.pool, condition=f.observed.key, since=f.since,
                                   message=f.observed.detail()[:300], extra=f.observed.event_data()))


def _fold_capacity(report: SweepReport, found: gpu_capacity.CapacitySweep, *, observations: dict[str, float]) -> None:
    """GPU-capacity faults join the others (same publishing, suppression and breaker)."""
    report.gpu_capacity = found.summary()
    _fold_signal(report, errors=found.errors, found=found.observations, next_check=found.next_check,
                 observations=observations)
    for f in found.faults:
        if f.verdict.row is not None and f.verdict.since is not None:
            report.faults.append(Fault(cluster=f.cluster, node=f.node, pool=f.pool, condition=f.verdict.row.key,
                                       since=f.verdict.since, message=f.verdict.detail[:300], extra=f.event_data()))


def _handled(ctx: Context, fault: Fault) -> bool:
    rec = ctx.ledger.get(NODE_KIND, node_key(fault.cluster, fault.node))
    return rec is not None and fault.id in decode(rec.data, NodeData).faults


def _publish(ctx: Context, fault: Fault, *, now: float, policy: RemediationPolicy) -> None:
    ctx.events.publish(
        type_=UNHEALTHY_EVENT,
        subject=subject(fault.cluster, fault.pool, fault.node),
        data={"cluster": fault.cluster, "node": fault.node, "pool": fault.pool, "condition": fault.condition,
              "since": iso(fault.since), "observed_at": iso(now),
              "threshold_s": policy.threshold_for(fault.condition), "message": fault.message, **fault.extra},
        id_=fault.id,
    )


def sweep(ctx: Context) -> SweepReport:
    """Evaluate every GPU node in scope, feed the breaker, publish the unhealthy faults."""
    policy = ctx.settings.remediation or RemediationPolicy()
    report = SweepReport()
    try:
        clusters = scope.discover(ctx.access.aks(), ctx.settings)
    except StewardError as exc:
        report.errors.append(f"discovering clusters: {exc}")
        return report
    observations: dict[str, float] = {}
    capacity = gpu_capacity.Sweeper(ctx, policy)
    known: dict[str, dict[str, dcgm.NodeFacts]] = {}  # cluster -> its GPU nodes, for the DCGM series' provenance
    for cluster in clusters:
        report.clusters += 1
        names: dict[str, dcgm.NodeFacts] = {}
        try:
            _sweep_cluster(ctx, cluster, policy=policy, report=report, observations=observations, capacity=capacity,
                           known=names)
            known[str(cluster.id).lower()] = names
        except StewardError as exc:
            report.errors.append(f"{cluster.id}: {type(exc).__name__}: {exc}")
            log.warning("sweep of %s failed: %s", cluster.id, exc)
    _fold_dcgm(report, dcgm.sweep(ctx, clusters, policy=policy, known=known), observations=observations)
    _fold_capacity(report, capacity.finish(), observations=observations)
    now = ctx.clock.now()
    try:
        evidence = breaker_evidence.gather(ctx, clusters=clusters, known=known, observations=observations,
                                           fleet_nodes=report.nodes, policy=policy)
        report.errors.extend(evidence.errors)
        report.breaker_evidence = evidence.summary()
        state = breaker.update(ctx, observations=evidence.observations, origins=evidence.origins,
                               fleet_nodes=evidence.fleet_nodes, fleet_clusters=evidence.fleet_clusters, policy=policy)
        report.breaker = state.state
        metric(ctx, "breaker_open", 1 if state.is_open else 0)
    except StewardError as exc:
        report.errors.append(f"breaker: {exc}")
    for fault in report.faults:
        try:
            if _handled(ctx, fault):
                report.suppressed += 1
                continue
            _publish(ctx, fault, now=now, policy=policy)
            report.published += 1
            seen = ctx.caches.reported_faults
            if seen.get(fault.id, now=now) is None:  # a refused fault is re-reported every sweep: measure its detection once
                seen.put(fault.id, now, now=now)
                metric(ctx, "time_to_detect_s", now - fault.since, condition=fault.condition)
        except StewardError as exc:
            report.errors.append(f"publishing {fault.cluster}/{fault.node}/{fault.condition}: {exc}")
    rejudged = pending_faults.rejudge(ctx)
    report.pending_faults = rejudged.summary()
    report.errors.extend(rejudged.errors)
    if report.skipped_faults:
        recorded = decisions.record_skips(ctx, report.skipped_faults, now=now)
        report.decisions = {k: v for k, v in vars(recorded).items() if v}
    report.due_sweep = due_sweep.ask(ctx, report.next_check, now=now)
    log.info("sweep: %s", report.summary())
    return report


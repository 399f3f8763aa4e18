"""DCGM error counters read from Azure Monitor managed Prometheus: the third fault signal.

Clusters that send dcgm-exporter's metrics to an Azure Monitor workspace are configured in
SIGNALS_PROMETHEUS (:mod:`shared.remediation.dcgm_config`). Three entry points, one judgement:

- :func:`sweep` (called by :mod:`shared.remediation.sweep` every sweep) sends ONE instant query per
  (workspace, exporter) for the raw series, keeps only those with the shape their exporter's scrape
  gives (:mod:`shared.remediation.dcgm_provenance`), maps each to a node that the cluster's API server
  lists, judges each node's readings with the policy tables (:func:`judge`) and returns the faults to
  publish as ``Steward.GpuNode.Unhealthy`` events;
- :func:`recheck` (called by :func:`shared.remediation.admission.handle_event` for an event whose
  ``data.signal`` is ``dcgm``) re-reads that one node over the target's window (every sample, every
  copy) and judges again: the event alone is never trusted; what it finds goes to
  :func:`admission.admit_signal`, the path every fault takes;
- :func:`still_present` (called before every disruptive step of a DCGM remediation) asks the same.

Why it is built this way:

- **Provenance before anything.** A series counts only if it has its exporter's shape (job, labels,
  namespace), names a node the cluster's API server lists as a GPU node with a GPU of that index, and,
  once it shows a fault, that node passed the ARM check (shared.fleet.node_truth). Everything else is
  counted, reported once a day per workspace and code (shared.remediation.dcgm_reports), and never
  written to the ledger nor fed to the breaker: a thousand invented node names cost nothing.
- **Copies must agree.** Several accepted series for one (node, GPU, counter) are folded with ``min``:
  a fault counts only when every copy shows it. Before acting, the window query asks the lowest value
  of every sample in ``windowSeconds``, so a forged copy interleaved with the exporter's own healthy
  samples never crosses it.
- **Debouncing like the conditions.** A fault must be seen by two sweeps at least its threshold apart
  (``RemediationPolicy.threshold_for(key)``). The first sighting of each key on a node (``Xid79``,
  ``DCGM_FI_DEV_ROW_REMAP_FAILURE``...) is kept in one ``dcgm-node`` row per node (ETag-guarded), the
  fault's ``since`` and so its fault id (``records.fault_id``). A key no longer seen is forgotten, unless
  its counter shows another fault at that moment (a last-XID gauge whose copies alternate between two XIDs).
- **The lifetime DBE counter** says nothing about now by its level: its baseline per GPU is kept in the
  same row; growth over it is a fault until an admission handled it.
- **Only what exists by default is relied upon.** The managed exporter exports only the default CSV's
  counters; rows needing others are inactive for that cluster and said so (dcgm_reports).
- **Nothing is inferred from missing data.** A workspace that fails (outage, 4xx, a partial answer) or
  a cluster whose nodes could not be listed contributes nothing this sweep.
- **Restart, then replace.** For a ``restart_then_replace`` row, :func:`recheck` escalates to ``replace``
  when an earlier DCGM remediation of the node already restarted it and ended ``done`` within
  BUDGET_NODE_ATTEMPT_WINDOW_S (NVIDIA's catalogue reads a repeat after a reset as hardware).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import gpu_sizes
from shared.kernel.errors import Conflict, StewardError
from shared.kernel.ports import NodeView, Record, Sample
from shared.remediation import admission, attempts, dcgm_reports, health
from shared.remediation import dcgm_provenance as prov
from shared.remediation import signal_policy as sp
from shared.remediation.dcgm_config import PrometheusTarget
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    DEDUPE_KIND,
    decode,
    fault_id,
    node_key,
    to_data,
)
from shared.remediation.signals import SignalSource

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.dcgm")

DCGM_KIND = "dcgm-node"
_MAX_ATTEMPT_IDS = 50  # a node's remediations are few (BUDGET_NODE_MAX_ATTEMPTS in a window); a bound all the same
SIGNAL = str(SignalSource.DCGM)
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


class DcgmNodeData(msgspec.Struct, kw_only=True):
    """``Record.data`` of a ``dcgm-node`` row: what the sweeps remember about one node's counters.

    ``seen``: signal key -> when a sweep first saw it (the fault's ``since``); ``baselines``: GPU ->
    the lifetime double-bit ECC count accepted as already known; ``confirmed``: XID key -> when a sweep's
    window query first held for that sighting (what shows a later-replaced XID was real:
    shared.remediation.dcgm_recheck ``masked``)."""

    cluster: str
    node: str
    seen: dict[str, float] = {}
    baselines: dict[str, float] = {}
    confirmed: dict[str, float] = {}


@dataclass(frozen=True)
class Reading:
    """One (metric, GPU) sample of one node."""

    metric: str
    gpu: str
    value: float


@dataclass(frozen=True)
class Observed:
    """One fault a node's readings show, judged: ``key`` is ``Xid<n>`` or the counter's metric name."""

    key: str
    metric: str
    value: float
    gpus: tuple[str, ...]
    decision: sp.Decision

    @property
    def xid(self) -> int | None:
        return int(self.value) if self.metric == sp.XID_METRIC else None

    @property
    def acts(self) -> bool:
        return self.decision.action not in (sp.RECORD_ONLY, sp.IGNORE)

    def detail(self) -> str:
        what = f"XID {self.xid}" if self.xid is not None else f"{self.metric} = {self.value:g}"
        return f"{what} on GPU {', '.join(self.gpus)} (row {self.decision.row}: {self.decision.action}; {self.decision.note})"

    def event_data(self) -> dict[str, Any]:
        """The extra data of the Unhealthy event: signal, metric, XID or counter value, GPU, policy row."""
        out: dict[str, Any] = {"signal": SIGNAL, "metric": self.metric, "gpu": ",".join(self.gpus),
                               "policy_row": self.decision.row, "action": self.decision.action}
        if self.xid is not None:
            out["xid"] = self.xid
        else:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class DcgmFault:
    """A debounced fault to publish (shared.remediation.sweep turns it into its ``Fault``)."""

    cluster: str
    node: str
    pool: str
    observed: Observed
    since: float

    @property
    def id(self) -> str:
        return fault_id(self.cluster, self.node, self.observed.key, self.since)


@dataclass
class DcgmSweep:
    """What one sweep read from the workspaces."""

    workspaces: int = 0
    nodes: int = 0
    faults: list[DcgmFault] = field(default_factory=list)
    pending: int = 0
    observations: dict[str, float] = field(default_factory=dict)  # node key -> earliest since (breaker)
    errors: list[str] = field(default_factory=list)
    next_check: float | None = None
    refused: dcgm_reports.Refusals = field(default_factory=dcgm_reports.Refusals)
    contested: int = 0
    inactive: dict[str, list[str]] = field(default_factory=dict)  # cluster -> counters its exporter lacks
    expired: int = 0

    def summary(self) -> dict[str, Any]:
        return {"workspaces": self.workspaces, "nodes": self.nodes, "faults": len(self.faults),
                "pending": self.pending, "errors": list(self.errors), "refused": dict(self.refused.counts),
                "contested": self.contested, "inactive": dict(self.inactive), "expired": self.expired}


# --------------------------------------------------------------------------- judging readings
def judge(readings: Iterable[Reading], *, baselines: Mapping[str, float],
          overrides: Mapping[int, str] | None = None) -> tuple[list[Observed], dict[str, float]]:
    """The faults one node's readings show (``ignore`` rows dropped), and its lifetime-DBE baselines
    after this look (a GPU seen for the first time, or whose count went down, takes its value)."""
    found: dict[str, tuple[str, float, list[str], sp.Decision]] = {}
    new_baselines = dict(baselines)
    for r in readings:
        decision: sp.Decision | None
        if r.metric == sp.XID_METRIC:
            xid = sp.xid_of(r.value)
            if xid is None:
                continue
            key, decision = f"Xid{xid}", sp.xid_action(xid, overrides)
        elif r.metric == sp.DBE_AGGREGATE:
            baseline = baselines.get(r.gpu)
            if baseline is None or r.value < baseline:  # first sight, or the count was reset (a new GPU)
                new_baselines[r.gpu] = r.value
                continue
            key, decision = r.metric, sp.counter_action(r.metric, r.value, baseline)
        else:
            key, decision = r.metric, sp.counter_action(r.metric, r.value)
        if decision is None or decision.action == sp.IGNORE:
            continue
        if key in found:
            metric, value, gpus, first = found[key]
            found[key] = (metric, max(value, r.value), [*gpus, r.gpu], first)
        else:
            found[key] = (r.metric, r.value, [r.gpu], decision)
    observed = [Observed(key, metric, value, tuple(sorted(set(gpus), key=_gpu_order)), decision)
                for key, (metric, value, gpus, decision) in sorted(found.items())]
    return observed, new_baselines


def _metric_of(key: str) -> str:
    """The counter behind a ``dcgm-node`` row's key: ``Xid<n>`` keys are the last-XID gauge's, others are named
    for their counter (:func:`judge`)."""
    return sp.XID_METRIC if key.startswith("Xid") else key


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def readings_by_node(samples: Sequence[Sample], targets: Sequence[PrometheusTarget], *, metric: str | None = None,
                     refused: dcgm_reports.Refusals | None = None) -> tuple[dict[tuple[str, str], list[Reading]], int]:
    """(cluster id, node) -> readings of the series that pass :func:`dcgm_provenance.check` (the others
    counted in ``refused``), copies of one (node, GPU, metric) folded with ``min``; and how many such
    groups had copies that disagreed."""
    if not targets:
        return {}, 0
    folded: dict[tuple[str, str, str, str], list[float]] = {}
    for s in samples:
        verdict = prov.check(s.labels, targets, metric=metric)
        if isinstance(verdict, prov.Refused):
            if verdict.code == prov.UNKNOWN_CLUSTER:
                continue  # another cluster's series in a shared workspace: not ours, not a fault of anyone's
            if refused is not None:
                refused.add(verdict.code, f"{_show(s.labels)}: {verdict.why}")
            continue
        if verdict.metric not in prov.POLICY_METRICS:
            continue
        folded.setdefault((verdict.cluster_id, verdict.node, verdict.gpu, verdict.metric), []).append(float(s.value))
    out: dict[tuple[str, str], list[Reading]] = {}
    contested = 0
    for (cluster, node, gpu, name), values in sorted(folded.items()):
        if len(set(values)) > 1:
            contested += 1
        out.setdefault((cluster, node), []).append(Reading(name, gpu, min(values)))
    return out, contested


def _show(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))[:600] + "}"


@dataclass(frozen=True)
class NodeFacts:
    """What the sweep's listing says of a GPU node: its size's GPU count (None: unknown size) and whether
    AKS's managed exporter runs on it."""

    gpus: int | None
    exporter: bool


def node_facts(node: NodeView) -> NodeFacts:
    size = gpu_sizes.lookup(node.labels.get(INSTANCE_TYPE, "") or "")
    return NodeFacts(size.gpus if size is not None else None, prov.runs_managed_exporter(node.labels))


# --------------------------------------------------------------------------- the ledger row
def _load(rec: Record | None, cluster: str, node: str) -> DcgmNodeData:
    return decode(rec.data, DcgmNodeData) if rec is not None else DcgmNodeData(cluster=cluster, node=node)


def _store(ctx: Context, rec: Record | None, data: DcgmNodeData, *, now: float) -> bool:
    """Create or ETag-save the node's row; False when another host wrote it first (it re-judges next sweep)."""
    try:
        if rec is None:
            ctx.ledger.create(Record(kind=DCGM_KIND, id=node_key(data.cluster, data.node), state="known",
                                     data=to_data(data), created_at=now, updated_at=now))
        else:
            ctx.ledger.save(msgspec.structs.replace(rec, data=to_data(data), updated_at=now))
    except Conflict:
        return False
    return True


# --------------------------------------------------------------------------- the sweep
@dataclass
class _Group:
    """One query's worth: the targets of one (workspace, exporter), their clusters and known nodes."""

    targets: list[PrometheusTarget]
    clusters: dict[str, Any]  # lower-case id -> ClusterInfo
    verified: int = 0


def sweep(ctx: Context, clusters: Iterable[Any], *, policy: RemediationPolicy,
          known: Mapping[str, Mapping[str, NodeFacts]]) -> DcgmSweep:
    """One query per (workspace, exporter) for the ``clusters`` in scope that have one configured.

    ``known``: lower-case cluster id -> {GPU node name: its facts} as the sweep listed them; a
    cluster missing from it (its listing failed) is not judged this sweep."""
    result = DcgmSweep()
    configured = ctx.settings.signals_prometheus
    groups: dict[tuple[str, ...], _Group] = {}
    now = ctx.clock.now()
    for cluster in clusters:
        target = configured.get(str(cluster.id).lower())
        if target is None:
            continue
        group = groups.setdefault(target.group, _Group([], {}))
        group.targets.append(target)
        group.clusters[target.cluster_id.lower()] = cluster
        if target.inactive:
            result.inactive[target.cluster_id] = list(target.inactive)
            dcgm_reports.report_inactive(ctx, target, now=now)
    if not groups:
        return result
    try:
        rows = {r.id: r for r in ctx.ledger.list(DCGM_KIND)}
    except StewardError as exc:
        result.errors.append(f"dcgm: reading the {DCGM_KIND} rows: {exc}")
        return result
    for group in groups.values():
        result.workspaces += 1
        endpoint = group.targets[0].endpoint
        metrics = [m for t in group.targets for m in t.counters]
        try:
            samples = ctx.access.metrics(endpoint).query(prov.sweep_query(group.targets[0], metrics))
        except StewardError as exc:  # outage, 4xx, partial answer: this workspace tells nothing this sweep
            result.errors.append(f"dcgm {endpoint}: {type(exc).__name__}: {exc}")
            log.warning("DCGM query to %s failed, nothing inferred: %s", endpoint, exc)
            continue
        refused = dcgm_reports.Refusals()
        by_node, contested = readings_by_node(samples, group.targets, refused=refused)
        result.contested += contested
        for (cluster_id, node), readings in sorted(by_node.items()):
            nodes = known.get(cluster_id.lower())
            if nodes is None:
                continue  # its nodes could not be listed this sweep: nothing inferred
            if node not in nodes:
                refused.add(prov.PHANTOM_NODE, f"{node} in {cluster_id.rsplit('/', 1)[-1]}: no such GPU node")
                continue
            facts = nodes[node]
            if group.targets[0].exporter == "managed" and not facts.exporter:
                refused.add(prov.NO_EXPORTER, f"{node}: AKS's managed exporter does not run on it (no "
                                              f"{prov.EXPORTER_NODE_LABEL}=enabled): nobody genuine writes its series")
                continue
            count = facts.gpus
            bad = sorted({r.gpu for r in readings if count is not None and int(r.gpu) >= count})
            if bad:
                refused.add(prov.BAD_GPU, f"{node}: GPU {', '.join(bad)} beyond its size's {count}")
                readings = [r for r in readings if r.gpu not in bad]
            result.nodes += 1
            try:
                _sweep_node(ctx, group, cluster_id, node, readings, rows.get(node_key(cluster_id, node)),
                            policy=policy, result=result, refused=refused)
            except StewardError as exc:
                result.errors.append(f"dcgm {cluster_id}/{node}: {type(exc).__name__}: {exc}")
        result.refused.merge(refused)
        dcgm_reports.report_refused(ctx, endpoint, refused, now=now)
    result.expired = dcgm_reports.expire(ctx, rows.values(), known=known, now=now,
                                         retention_s=policy.dcgm_row_retention_s)
    return result


def _target(group: _Group, cluster_id: str) -> PrometheusTarget:
    return next(t for t in group.targets if t.cluster_id.lower() == cluster_id.lower())


def _confirmed(ctx: Context, group: _Group, cluster_id: str, node: str, due: list[Observed], *,
               refused: dcgm_reports.Refusals, result: DcgmSweep) -> list[Observed]:
    """The due faults that hold in every sample and copy over the window (the admission's own question,
    asked before anything is published): a forged copy interleaved with the exporter's healthy samples
    is counted ``contested`` here and never becomes an Unhealthy event."""
    from shared.remediation.dcgm_recheck import window_readings  # it builds on this module

    target = _target(group, cluster_id)
    try:
        readings = window_readings(ctx, target, node)
    except StewardError as exc:
        result.errors.append(f"dcgm {cluster_id}/{node}: window: {type(exc).__name__}: {exc}")
        return []  # nothing inferred: judged again next sweep
    row = _load(None, cluster_id, node)
    held = {o.key for o in judge(readings, baselines=row.baselines, overrides=ctx.settings.xid_overrides)[0]}
    for o in due:
        if o.key not in held and o.metric != sp.DBE_AGGREGATE:
            result.contested += 1
            refused.add(prov.CONTESTED, f"{node}: {o.key} shows in the instant sample but not in every sample and "
                                        f"copy of the last {target.window_s:.0f}s")
    return [o for o in due if o.key in held or o.metric == sp.DBE_AGGREGATE]


def _verified(ctx: Context, group: _Group, cluster_id: str, node: str, *, policy: RemediationPolicy,
              refused: dcgm_reports.Refusals) -> NodeView | None:
    """The node, if it exists and ARM agrees it is a GPU node of the cluster; within the sweep's cap."""
    if group.verified >= policy.dcgm_max_nodes:
        refused.add(prov.OVER_CAP, f"{node}: more than {policy.dcgm_max_nodes} faulty nodes in one sweep "
                                   f"(SIGNALS_DCGM_MAX_NODES); judged in a later sweep")
        return None
    group.verified += 1
    view = ctx.access.kube(cluster_id).get_node(node)
    if view is None:
        refused.add(prov.PHANTOM_NODE, f"{node}: gone from the API server")
        return None
    verdict = admission.judge_node(ctx, group.clusters[cluster_id.lower()], view)
    if not verdict.ok:
        refused.add(prov.UNVERIFIED_NODE, f"{node}: {verdict.code}: {verdict.reason}")
        return None
    return view


def _sweep_node(ctx: Context, group: _Group, cluster_id: str, node: str, readings: list[Reading],
                rec: Record | None, *, policy: RemediationPolicy, result: DcgmSweep,
                refused: dcgm_reports.Refusals) -> None:
    now = ctx.clock.now()
    data = _load(rec, cluster_id, node)
    observed, baselines = judge(readings, baselines=data.baselines, overrides=ctx.settings.xid_overrides)
    showing = {o.metric for o in observed}
    if any(r.metric == sp.XID_METRIC and sp.xid_of(r.value) is not None for r in readings):
        showing.add(sp.XID_METRIC)  # any XID, even one the table ignores: it may have replaced a kept one
    shown = {o.key for o in observed}
    view: NodeView | None = None
    if observed or any(k not in shown and _metric_of(k) in showing for k in data.seen):
        view = _verified(ctx, group, cluster_id, node, policy=policy, refused=refused)
        if view is None:
            return  # nothing of an unverified node is remembered or counted
    elif rec is None:
        if baselines == data.baselines:
            return  # a healthy node with nothing to remember: no row
        # a lifetime count's first baseline (only exporters that export it): written for a verified node only
        view = _verified(ctx, group, cluster_id, node, policy=policy, refused=refused)
        if view is None:
            return
    seen = {o.key: data.seen.get(o.key, now) for o in observed}  # a key no longer seen is forgotten ...
    for key, first in data.seen.items():
        if key not in seen and _metric_of(key) in showing:
            # ... unless the same counter shows another XID now: a GPU's last-XID gauge that flips between
            # two faulty values (copies that alternate, one forged: soak seed 952019) still shows a fault, and
            # forgetting each value at every flip would restart its threshold for ever; kept, the value comes
            # due when it shows again, and the window re-check judges every sample and copy as for any fault.
            # A later XID, even one the table ignores, may also have replaced a confirmed fault (dcgm_recheck.replaced_due).
            seen[key] = first
    for o in observed:
        handling = attempts.handling(ctx, cluster_id, node, fault_id(cluster_id, node, o.key, data.seen[o.key])) \
            if o.key in data.seen else ""
        if o.metric == sp.DBE_AGGREGATE and handling == "active":
            continue  # its remediation runs: the growth stays visible to the re-reads before each of its steps
        if o.metric == sp.DBE_AGGREGATE and handling:
            # the remediation of that growth ended: it is the new normal for this GPU
            baselines.update({r.gpu: r.value for r in readings if r.metric == sp.DBE_AGGREGATE})
            del seen[o.key]
        elif handling == "ended":
            # still there after its remediation ended (the reset did not hold, or no sweep saw the gap):
            # a new fault, first seen now, which the re-check may escalate (restart, then replace)
            seen[o.key] = now
    # a confirmation belongs to one sighting: a key forgotten or first seen anew has none yet
    confirmed = {k: t for k, t in data.confirmed.items() if k in seen and seen[k] == data.seen.get(k)}
    due: list[Observed] = []
    for o in observed:
        if o.key not in seen:
            continue
        since = seen[o.key]
        crosses = since + policy.threshold_for(o.key)
        if now >= crosses:
            due.append(o)
        else:
            result.pending += 1
            result.next_check = crosses if result.next_check is None else min(result.next_check, crosses)
    replaced: list[Observed] = []
    if view is not None:
        if due:
            due = _confirmed(ctx, group, cluster_id, node, due, refused=refused, result=result)
            for o in due:
                if o.metric == sp.XID_METRIC:
                    confirmed.setdefault(o.key, now)  # when its window first held: what replaced_due re-asks
        from shared.remediation.dcgm_recheck import replaced_due  # it builds on this module

        replaced, gone = replaced_due(ctx, _target(group, cluster_id), cluster_id, node, seen, confirmed=confirmed, shown=shown,
                                      policy=policy, baselines=baselines, errors=result.errors)
        for key in gone:
            seen.pop(key, None)
            confirmed.pop(key, None)
    changed = seen != data.seen or baselines != data.baselines or confirmed != data.confirmed
    if changed and not _store(ctx, rec, msgspec.structs.replace(data, seen=seen, baselines=baselines,
                                                                confirmed=confirmed), now=now):
        return  # another host judged this node at the same time: its row wins, this node waits a sweep
    if view is None:
        return
    due = [*due, *replaced]
    for o in due:  # the breaker counts a fault only once its window confirms it, never a pending sighting
        if o.acts:
            key = node_key(cluster_id, node)
            result.observations[key] = min(seen[o.key], result.observations.get(key, seen[o.key]))
    for o in due:
        if not o.acts and ctx.ledger.get(DEDUPE_KIND, f"recorded-{fault_id(cluster_id, node, o.key, seen[o.key])}"):
            continue  # a record_only row, already recorded by admission: nothing more to say
        result.faults.append(DcgmFault(cluster=cluster_id, node=node, pool=health.pool_of(view), observed=o,
                                       since=seen[o.key]))

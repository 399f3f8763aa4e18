"""DCGM error counters read from Azure Monitor managed Prometheus: the third fault signal (issue 13).

Clusters that send dcgm-exporter's metrics to an Azure Monitor workspace are configured in
SIGNALS_PROMETHEUS (:mod:`shared.remediation.dcgm_config`). Two entry points, one judgement:

- :func:`sweep` (called by :mod:`shared.remediation.sweep` every sweep) sends ONE instant query per
  workspace (:func:`signal_policy.dcgm_query`; clusters sharing a workspace are told apart by their
  cluster label), maps each series to its node, judges each node's readings with the policy tables
  (:func:`judge`) and returns the faults to publish as ``Steward.GpuNode.Unhealthy`` events;
- :func:`recheck` (called by :func:`shared.remediation.admission.handle_event` for an event whose
  ``data.signal`` is ``dcgm``) re-queries that one node and judges again: the event alone is never
  trusted. What it finds goes to :func:`admission.admit_signal`, the path every fault takes.

Why it is built this way:

- **Debouncing like the conditions.** A condition must be True for its threshold before it is acted
  on; a DCGM fault must likewise be seen by two sweeps at least the threshold apart
  (``RemediationPolicy.threshold_for(key)``). The first sighting of each signal key on a node (``Xid79``,
  ``DCGM_FI_DEV_ROW_REMAP_FAILURE``...) is kept in the ledger, in one ``dcgm-node`` row per node, so that
  every host agrees on it; it is the fault's ``since``, hence its fault id (``records.fault_id``), so one
  fault is remediated once. A key no longer seen is forgotten: if it comes back, it is a new fault.
- **The lifetime DBE counter** (``DCGM_FI_DEV_ECC_DBE_AGG_TOTAL``) says nothing about now by its level:
  its baseline per GPU is kept in the same row (ETag-guarded writes, never process memory). First
  sight sets the baseline and publishes nothing (the count is history); growth over it is a fault,
  until an admission handled that fault: then the baseline moves up to the value.
- **Nothing is inferred from missing data.** A workspace that fails (outage, 4xx, a partial answer:
  the adapter raises on ``warnings``) is reported in the sweep's errors and contributes nothing: no
  fault, no breaker observation, no forgetting of first sightings. A node without series is skipped
  the same way: neither healthy nor faulty.
- **Restart, then replace.** For a ``restart_then_replace`` row, :func:`recheck` escalates to
  ``replace`` when an earlier DCGM remediation of the node already restarted it and ended ``done``
  within BUDGET_NODE_ATTEMPT_WINDOW_S: the fault came back after a reset, which NVIDIA's catalogue
  reads as hardware (docs/signals-dcgm.md). The repair's own verification reads the node (Ready, NPD
  conditions, allocatable GPUs): a fault that only DCGM sees is judged again by the next sweeps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import scope
from shared.kernel.errors import Conflict, Forbidden, Invalid, NotFound, StewardError
from shared.kernel.ports import Record, Sample
from shared.kernel.timefmt import iso, parse_time
from shared.remediation import admission, health
from shared.remediation import signal_policy as sp
from shared.remediation.dcgm_config import PrometheusTarget
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    ACTIVE_STATES,
    DEDUPE_KIND,
    KIND,
    NODE_KIND,
    NodeData,
    RemediationData,
    Rung,
    State,
    decode,
    fault_id,
    node_key,
    to_data,
)
from shared.remediation.signals import Signal, SignalSource

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.dcgm")

DCGM_KIND = "dcgm-node"
_MAX_ATTEMPT_IDS = 50  # a node's remediations are few (BUDGET_NODE_MAX_ATTEMPTS in a window); a bound all the same
SIGNAL = str(SignalSource.DCGM)


class DcgmNodeData(msgspec.Struct, kw_only=True):
    """``Record.data`` of a ``dcgm-node`` row: what the sweeps remember about one node's counters.

    ``seen``: signal key -> when a sweep first saw it (the fault's ``since``); ``baselines``: GPU ->
    the lifetime double-bit ECC count accepted as already known."""

    cluster: str
    node: str
    seen: dict[str, float] = {}
    baselines: dict[str, float] = {}


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

    def summary(self) -> dict[str, Any]:
        return {"workspaces": self.workspaces, "nodes": self.nodes, "faults": len(self.faults),
                "pending": self.pending, "errors": list(self.errors)}


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


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def readings_by_node(samples: Sequence[Sample], targets: Sequence[PrometheusTarget]) -> dict[tuple[str, str], list[Reading]]:
    """(cluster id, node) -> readings, for the series of ``targets``' clusters (any other series is not ours)."""
    if not targets:
        return {}
    node_label, cluster_label = targets[0].node_label, targets[0].cluster_label
    by_value = {t.cluster_value: t.cluster_id for t in targets}
    only = targets[0].cluster_id if len(targets) == 1 and not cluster_label else None
    out: dict[tuple[str, str], list[Reading]] = {}
    for s in samples:
        node = s.labels.get(node_label, "")
        cluster = only or by_value.get(s.labels.get(cluster_label, ""))
        metric = s.labels.get("__name__", "")
        if not node or cluster is None or metric not in sp.QUERY_METRICS:
            continue
        out.setdefault((cluster, node), []).append(Reading(metric, s.labels.get("gpu", "?"), float(s.value)))
    return out


def _query(target: PrometheusTarget, node: str | None = None) -> str:
    where = None
    if node is not None:
        where = {target.node_label: node, **({target.cluster_label: target.cluster_value} if target.cluster_label else {})}
    return sp.dcgm_query(target.node_label, cluster_label=target.cluster_label, where=where)


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


def _handling(ctx: Context, cluster: str, node: str, fault: str) -> str:
    """``""`` when no admission took ``fault``; ``"active"`` while its remediation runs; ``"ended"`` after."""
    rec = ctx.ledger.get(NODE_KIND, node_key(cluster, node))
    nd = decode(rec.data, NodeData) if rec is not None else None
    if nd is None or fault not in nd.faults:
        return ""
    attempt = next((a for a in reversed(nd.attempts) if a.fault == fault), None)
    remediation = ctx.ledger.get(KIND, attempt.id) if attempt is not None else None
    return "active" if remediation is not None and remediation.state in ACTIVE_STATES else "ended"


# --------------------------------------------------------------------------- the sweep
def sweep(ctx: Context, clusters: Iterable[Any], *, policy: RemediationPolicy) -> DcgmSweep:
    """One query per workspace for the ``clusters`` in scope that have one configured; see the module docstring."""
    result = DcgmSweep()
    configured = ctx.settings.signals_prometheus
    groups: dict[tuple[str, str, str], list[PrometheusTarget]] = {}
    for cluster in clusters:
        target = configured.get(str(cluster.id).lower())
        if target is not None:
            groups.setdefault(target.group, []).append(target)
    if not groups:
        return result
    try:
        rows = {r.id: r for r in ctx.ledger.list(DCGM_KIND)}
    except StewardError as exc:
        result.errors.append(f"dcgm: reading the {DCGM_KIND} rows: {exc}")
        return result
    for targets in groups.values():
        result.workspaces += 1
        endpoint = targets[0].endpoint
        try:
            samples = ctx.access.metrics(endpoint).query(_query(targets[0]))
        except StewardError as exc:  # outage, 4xx, partial answer: this workspace tells nothing this sweep
            result.errors.append(f"dcgm {endpoint}: {type(exc).__name__}: {exc}")
            log.warning("DCGM query to %s failed, nothing inferred: %s", endpoint, exc)
            continue
        for (cluster_id, node), readings in sorted(readings_by_node(samples, targets).items()):
            result.nodes += 1
            try:
                _sweep_node(ctx, cluster_id, node, readings, rows.get(node_key(cluster_id, node)),
                            policy=policy, result=result)
            except StewardError as exc:
                result.errors.append(f"dcgm {cluster_id}/{node}: {type(exc).__name__}: {exc}")
    return result


def _sweep_node(ctx: Context, cluster_id: str, node: str, readings: list[Reading], rec: Record | None, *,
                policy: RemediationPolicy, result: DcgmSweep) -> None:
    now = ctx.clock.now()
    data = _load(rec, cluster_id, node)
    observed, baselines = judge(readings, baselines=data.baselines, overrides=ctx.settings.xid_overrides)
    seen = {o.key: data.seen.get(o.key, now) for o in observed}  # a key no longer seen is forgotten
    for o in observed:
        handling = _handling(ctx, cluster_id, node, fault_id(cluster_id, node, o.key, data.seen[o.key])) \
            if o.key in data.seen else ""
        if o.metric == sp.DBE_AGGREGATE and handling:
            # an admission took the growth: it is the new normal for this GPU
            baselines.update({r.gpu: r.value for r in readings if r.metric == sp.DBE_AGGREGATE})
            del seen[o.key]
        elif handling == "ended":
            # still there after its remediation ended (the reset did not hold, or no sweep saw the gap):
            # a new fault, first seen now, which the re-check may escalate (restart, then replace)
            seen[o.key] = now
    changed = seen != data.seen or baselines != data.baselines
    if changed and not _store(ctx, rec, msgspec.structs.replace(data, seen=seen, baselines=baselines), now=now):
        return  # another host judged this node at the same time: its row wins, this node waits a sweep
    due: list[Observed] = []
    for o in observed:
        if o.key not in seen:
            continue
        since = seen[o.key]
        crosses = since + policy.threshold_for(o.key)
        if o.acts:
            key = node_key(cluster_id, node)
            result.observations[key] = min(since, result.observations.get(key, since))
        if now >= crosses:
            due.append(o)
        else:
            result.pending += 1
            result.next_check = crosses if result.next_check is None else min(result.next_check, crosses)
    if not due:
        return
    view = ctx.access.kube(cluster_id).get_node(node)
    if view is None:
        return  # the series outlived its node (scrape lag): nothing to publish
    for o in due:
        if not o.acts and ctx.ledger.get(DEDUPE_KIND, f"recorded-{fault_id(cluster_id, node, o.key, seen[o.key])}"):
            continue  # a record_only row, already recorded by admission: nothing more to say
        result.faults.append(DcgmFault(cluster=cluster_id, node=node, pool=health.pool_of(view), observed=o,
                                       since=seen[o.key]))


# --------------------------------------------------------------------------- the admission's re-check
def _earlier(ctx: Context, cluster_id: str, node: str, *, now: float, policy: RemediationPolicy) -> tuple[str, str]:
    """(a remediation of the node still in progress, an earlier DCGM remediation that restarted it and
    ended done within the attempt window), each ``""`` when none: a restart_then_replace fault seen
    again after the latter goes to replace; while the former runs, nothing is decided (its end may be
    the very evidence, so the next sweep's report is judged after it).

    Read by record id (``<node key>-<n>``, admission's deterministic ids), not from the node row's
    attempt list, which admission completes only after the fact when two deliveries raced."""
    nk = node_key(cluster_id, node)
    active = repeated = ""
    for n in range(1, _MAX_ATTEMPT_IDS + 1):
        earlier = ctx.ledger.get(KIND, f"{nk}-{n}")
        if earlier is None:
            break
        if earlier.state in ACTIVE_STATES:
            active = earlier.id
        if earlier.state != State.DONE or now - earlier.created_at > policy.attempt_window_s:
            continue
        d = decode(earlier.data, RemediationData)
        if d.signal == SIGNAL and not d.dry_run and Rung.RESTART in d.ladder[: d.rung_index + 1]:
            repeated = earlier.id
    return active, repeated


def escalate(decision: sp.Decision, repeated_by: str) -> sp.Decision:
    """``restart_then_replace`` seen again after a restart: ``replace``, naming the row and the earlier repair."""
    if decision.action != sp.RESTART_THEN_REPLACE or not repeated_by:
        return decision
    return sp.Decision(sp.REPLACE, f"{decision.row}:repeat", decision.source,
                       f"seen again after remediation {repeated_by} restarted the node: {decision.note}")


#: How much a decision asks for: when a node shows several faults, the one that asks the most is acted on.
_SEVERITY: Mapping[str, int] = {sp.IGNORE: 0, sp.RECORD_ONLY: 1, sp.RESTART: 2, sp.RESTART_THEN_REPLACE: 3,
                                sp.REPLACE: 4}


def _ignored(detail: str) -> admission.Handled:
    return admission.Handled(admission.Handling.IGNORED, f"ignored: {detail}")


def recheck(ctx: Context, data: Mapping[str, Any], *, event_id: str, observed_at: float) -> admission.Handled:
    """Re-read one node's counters from its workspace and admit (or record) what they show now.

    Raises only Throttled/Transient (the workspace is unavailable or answered in part): Event Grid
    delivers again later, and nothing is decided from an answer that is not whole."""
    cluster_id, node_name = str(data.get("cluster") or ""), str(data.get("node") or "")
    key, since = str(data.get("condition") or ""), parse_time(data.get("since") or None)
    if not cluster_id or not node_name or not key or since is None:
        return _ignored("malformed DCGM event (needs data.cluster, node, condition, since)")
    target = ctx.settings.signals_prometheus.get(cluster_id.lower())
    if target is None:
        return _ignored(f"cluster {cluster_id} has no workspace in SIGNALS_PROMETHEUS")
    try:
        cluster = ctx.access.aks().get_cluster(cluster_id)
    except (NotFound, Forbidden) as exc:
        return _ignored(f"cluster {cluster_id} cannot be read ({exc})")
    ok, why = scope.cluster_in_scope(cluster, ctx.settings)
    if not ok:
        return _ignored(f"cluster {cluster_id} is out of scope ({why})")
    policy = admission.policy_of(ctx)
    now = ctx.clock.now()
    node = ctx.access.kube(cluster.id).get_node(node_name)
    if node is None:
        return _ignored(f"node {node_name} no longer exists")
    skipped = next((r for _, r in health.evaluate([node], now=now, policy=policy).skipped), None)
    if skipped and skipped != health.SKIP_OPTED_OUT:  # opted out: admission refuses it, as for a condition
        return _ignored(f"node {node_name} is skipped ({skipped})")
    try:
        samples = ctx.access.metrics(target.endpoint).query(_query(target, node_name))
    except (Forbidden, Invalid, NotFound) as exc:
        return _ignored(f"the workspace cannot be read ({exc}): nothing inferred")
    readings = readings_by_node(samples, [target]).get((target.cluster_id, node_name), [])
    if not readings:
        return _ignored(f"no DCGM series for {node_name}: nothing inferred")
    row = _load(ctx.ledger.get(DCGM_KIND, node_key(cluster_id, node_name)), cluster_id, node_name)
    observed, _ = judge(readings, baselines=row.baselines, overrides=ctx.settings.xid_overrides)
    found = next((o for o in observed if o.key == key), None)
    first = row.seen.get(key)
    if found is None or first is None:
        return _ignored(f"{key} no longer shows on {node_name}")
    if first > since + 1.0:
        return _ignored(f"stale event ({key} cleared and came back at {iso(first)})")
    if now < first + policy.threshold_for(key):
        return _ignored(f"{key} on {node_name} has not been seen for its threshold yet")
    active, repeated = _earlier(ctx, cluster.id, node_name, now=now, policy=policy)
    if active and found.acts:
        return admission.Handled(admission.Handling.DUPLICATE, f"duplicate: remediation {active} is in progress on "
                                                               f"{node_name}; {key} is judged again after it")
    decision = escalate(found.decision, repeated)
    worst = max(((escalate(o.decision, repeated), o.key) for o in observed if o.key in row.seen),
                key=lambda c: _SEVERITY.get(c[0].action, 0))
    if _SEVERITY.get(worst[0].action, 0) > _SEVERITY.get(decision.action, 0):
        # One remediation per node: the fault that asks the most decides it (its own event admits it),
        # so an ECC storm's pending remap (restart) never takes the turn of its XID 48 (restart, then replace).
        return _ignored(f"{worst[1]} on {node_name} asks for more ({worst[0].action}) than {key}: its event decides")
    log.info("DCGM re-check of %s/%s: %s -> %s (row %s%s)", cluster.id, node_name, key, decision.action, decision.row,
             f"; repeat of {repeated}" if repeated else "")
    signal = Signal(source=SignalSource.DCGM, key=key, since=first, decision=decision,
                    detail=Observed(found.key, found.metric, found.value, found.gpus, decision).detail())
    return admission.admit_signal(ctx, cluster=cluster, node=node, signal=signal, event_id=event_id,
                                  observed_at=observed_at)

"""Migrating an unmanaged GPU pool to a managed one: the planner and the record's step function.

AKS cannot turn an existing GPU pool into a managed one (seed), so each migration creates a
replacement (cloned by :mod:`shared.fleet.pool_clone`), proves its GPU stack works (:mod:`shared.fleet.stack`),
checks that the old pool's pods would fit on it, cordons and drains the old nodes in batches
through the Eviction API (:mod:`shared.drain.core`), and deletes the old pool only once no workload pod
remains on it. Each migration is one ledger record; the reconciler calls :func:`advance` to take
one short step, which re-observes ARM and Kubernetes first, so a repeated or resumed step after a
crash does nothing twice. States and events are documented in docs/migration.md.

``run_planner`` (the timer) turns the plan of :mod:`shared.migration.plan` into records: the record
id is derived from (cluster, pool), so create-if-absent guarantees one migration per pool even when
two hosts plan at once. It then takes each new record's first step itself, with the cluster's
Kubernetes client already built, rather than leaving it to the reconciler's next tick: the record's
clock starts when the app is ready to act on it.

Per-node reads and writes (pod listings, cordons, evictions) go out a few at a time
(:func:`_concurrently`), because a step's length is what the critical path pays for; each is still
one idempotent call, so a step cut short by a crash is simply taken again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from shared.adapters.aks import parse_cluster_id, pool_etag
from shared.fleet import scope
from shared.fleet.node_fate import going_away, is_shut_down
from shared.fleet.pool_clone import TAG_AUTOSCALER, TAG_MIGRATED_FROM, frozen_old_pool
from shared.kernel.errors import Conflict, FeatureNotRegistered, Invalid, NotFound, QuotaExceeded, StewardError
from shared.kernel.ports import ClusterInfo, KubePort, NodeView, PodView, PoolInfo, Record, Taint
from shared.migration import plan as migration_plan
from shared.migration.maintenance import window_open
from shared.migration.plan import ACTIVE_STATES, KIND, TERMINAL_STATES, Plan, PlanItem
from shared.migration.policy import MigrationPolicy

if TYPE_CHECKING:
    from shared.kernel.context import Context

__all__ = ["ACTIVE_STATES", "KIND", "TERMINAL_STATES", "advance", "give_up", "observe_plan", "run_planner"]

log = logging.getLogger("steward.migration")

MIGRATION_ANNOTATION = "gpu-fleet-steward/migration"  # value: the record id of the migration that cordoned
EVENT_PREFIX = "Steward.Migration."
PAUSE_RECHECK_S = 60.0
MAX_CHAINED_SUBSTEPS = 4
POOL_LABEL = "kubernetes.azure.com/agentpool"
ZONE_LABEL = "topology.kubernetes.io/zone"
QUOTA_CODES = ("QuotaExceeded", "InsufficientVCPUQuota", "ErrCode_InsufficientVCPUQuota")
PER_NODE_WORKERS = 8  # per-node API calls in flight at once (below the Kubernetes client's connection pool)

_T = TypeVar("_T")
_R = TypeVar("_R")


# --------------------------------------------------------------------------- small helpers


def _policy(ctx: Context) -> MigrationPolicy:
    return getattr(ctx.settings, "migration", None) or MigrationPolicy()


def _subject(cluster_id: str, pool: str, node: str | None = None) -> str:
    return f"{cluster_id}/agentPools/{pool}" + (f"/nodes/{node}" if node else "")


def _publish(ctx: Context, record: Record, what: str, **extra: Any) -> None:
    """Best effort: an event that cannot be published never stops a migration (the record is the truth)."""
    data = {"migration": record.id, "cluster": record.data.get("cluster_id"), "pool": record.data.get("pool"),
            "replacement": record.data.get("replacement"), "state": record.state,
            "strategy": record.data.get("strategy"), "progress": record.data.get("progress"), **extra}
    # The id is derived from what happened, so a step repeated after a crash publishes the same id
    # (consumers dedupe on it) while different steps never share one.
    fingerprint = f"{record.id}|{what}|{record.state}|{extra.get('previous', '')}|{extra.get('note', '')}"
    event_id = f"{record.id}-{what}-{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}"
    try:
        ctx.events.publish(type_=EVENT_PREFIX + what,
                           subject=_subject(str(record.data.get("cluster_id")), str(record.data.get("pool"))),
                           data=data, id_=event_id)
    except StewardError as exc:
        log.warning("could not publish %s for migration %s: %s", what, record.id, exc)


def _node_event(kube: KubePort, node: NodeView | str, record: Record, reason: str, message: str) -> None:
    kube.create_event(node=node, reason=reason, message=message, action="Migrate", correlation_id=record.id)


def _is_quota(exc: Invalid) -> bool:
    """A refusal for want of vCPU quota, told by its type or Azure's code (never by message text)."""
    return isinstance(exc, QuotaExceeded) or (exc.code or "") in QUOTA_CODES


def _digitless(text: str) -> str:
    return re.sub(r"-?\d+", "#", text)


def _wait(record: Record, *, now: float, until: float, why: str) -> Record:
    """Stay in the state; note why (history only when the reason changes, so waits do not flood it)."""
    data = dict(record.data)
    data["waiting"] = why
    history = record.history
    if _digitless(str(record.data.get("waiting") or "")) != _digitless(why):
        history = [*history, {"at": now, "state": record.state, "note": why}][-50:]
    return msgspec.structs.replace(record, data=data, history=history, next_at=until, updated_at=now)


def _move(ctx: Context, record: Record, state: str, *, now: float, note: str, **data: Any) -> Record:
    moved = record.moved(state, at=now, note=note, **{**data, "waiting": ""})
    _publish(ctx, moved, "Step", previous=record.state, note=note)
    return moved


def _finish(ctx: Context, record: Record, state: str, *, now: float, note: str, event: str, **data: Any) -> Record:
    done = record.moved(state, at=now, note=note, **{**data, "waiting": ""})
    _publish(ctx, done, "Step", previous=record.state, note=note)
    _publish(ctx, done, event, reason=note)
    return done


def _window(ctx: Context, record: Record, *, now: float, policy: MigrationPolicy) -> Record | None:
    """A waiting copy when the maintenance window is closed, else None (writes may go ahead)."""
    cluster_id = str(record.data["cluster_id"])
    configs = ctx.access.aks().list_maintenance_configurations(cluster_id)
    is_open, next_open, why = window_open(configs, now=now, policy=policy)
    if is_open:
        return None
    until = next_open if next_open is not None else now + 3600.0
    return _wait(record, now=now, until=until, why=f"paused between steps: {why}")


def _concurrently(fn: Callable[[_T], _R], items: Sequence[_T], *, workers: int = PER_NODE_WORKERS) -> list[_R]:
    """``[fn(i) for i in items]`` with up to ``workers`` calls in flight; every call ends before it returns.

    The first error is raised once all calls are done (the step is then retried from what it re-observes).
    """
    if len(items) <= 1 or workers <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="migration") as pool:
        futures = [pool.submit(fn, i) for i in items]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [f.result() for f in futures]


def _pool_nodes(kube: KubePort, pool: str) -> list[NodeView]:
    return sorted(kube.list_nodes(label_selector=f"{POOL_LABEL}={pool}"), key=lambda n: n.name)


def _workload_pods(kube: KubePort, node: str, *, listed: Sequence[PodView] | None = None) -> list[PodView]:
    """Pods that must leave before the node's pool may go: not DaemonSet, not mirror, not completed.
    ``listed``: the node's pods as already listed in this step (else they are listed now)."""
    from shared.drain import core as drain

    out = []
    for pod in kube.list_pods(node_name=node) if listed is None else listed:
        if pod.node_name not in ("", node):
            continue
        if drain.skip_daemonset(pod).delete and drain.skip_mirror(pod).delete and drain.skip_completed(pod).delete:
            out.append(pod)
    return out


def _progress(record: Record, **extra: Any) -> dict[str, Any]:
    total = int(record.data.get("nodes_total") or record.data.get("node_count") or 0)
    drained = len(record.data.get("drained") or [])
    batch = max(1, int(record.data.get("batch_size") or 1))
    batches = (total + batch - 1) // batch if total else 0
    current = min(batches, drained // batch + (1 if record.data.get("batch") else 0))
    return {"nodes_drained": drained, "nodes_total": total, "batch": current, "batches": batches,
            "nodes_lost": len(record.data.get("lost") or {}), "phase": record.data.get("phase", ""), **extra}


# --------------------------------------------------------------------------- fit check (pure)


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
          "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number ("500m" -> 0.5, "1Gi" -> 1073741824)."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+?)([A-Za-z]{0,2})\s*", str(text))
    if not match:
        return 0.0
    try:
        return float(match.group(1)) * _UNITS.get(match.group(2), 1.0)
    except ValueError:
        return 0.0


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key, op = tol.get("key") or "", tol.get("operator") or "Equal"
        if not key and op == "Exists":
            return True
        if key != taint.key:
            continue
        if op == "Exists" or (tol.get("value") or "") == taint.value:
            return True
    return False


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            left, right = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _affinity_matches(affinity: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    required = (((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_expression_matches(e, labels) for e in (term.get("matchExpressions") or [])) for term in terms)


@dataclass(frozen=True)
class NodeShape:
    """What a pod's scheduling constraints are checked against: one (real or predicted) node."""

    labels: Mapping[str, str]
    taints: Sequence[Taint]
    allocatable: Mapping[str, str]


def _pod_misfit(pod: PodView, shape: NodeShape) -> str:
    """Why ``pod`` cannot run on a node shaped like ``shape`` ("" = it can)."""
    hard = [t for t in shape.taints if t.effect in ("NoSchedule", "NoExecute") and not t.key.startswith("node.kubernetes.io/")]
    untolerated = [t.key for t in hard if not _tolerates(pod.tolerations, t)]
    if untolerated:
        return f"does not tolerate the replacement's taint(s) {', '.join(untolerated)}"
    wrong = sorted(k for k, v in pod.node_selector.items() if shape.labels.get(k) != v)
    if wrong:
        return "selects node labels the replacement does not carry: " + ", ".join(f"{k}={pod.node_selector[k]}" for k in wrong)
    if not _affinity_matches(pod.affinity, shape.labels):
        return "has a required node affinity the replacement's nodes do not match"
    for resource, amount in sorted(pod.requests.items()):
        if resource in shape.allocatable and quantity(amount) > quantity(shape.allocatable[resource]):
            return f"requests {resource}={amount}, more than one node offers ({shape.allocatable[resource]})"
    return ""


def fit_problems(pods: Sequence[PodView], *, shapes: Sequence[NodeShape], node_count: int) -> list[str]:
    """Why these pods would not run on the replacement's nodes (empty = they fit).

    A pod fits when at least one of the replacement's node ``shapes`` (nodes differ by zone) takes
    it: every NoSchedule/NoExecute taint tolerated, nodeSelector and required node affinity matched,
    each request within one node's allocatable. Together, the pods' GPU requests must fit the
    replacement's GPUs (``node_count`` nodes of the size of ``shapes``).
    """
    problems: list[str] = []
    if not shapes:
        return problems if not pods else [f"the replacement has no node to check {len(pods)} pods against"]
    gpu_total = max(quantity(s.allocatable.get("nvidia.com/gpu", "0")) for s in shapes) * node_count
    gpu_wanted = 0.0
    for pod in pods:
        misfits = [_pod_misfit(pod, shape) for shape in shapes]
        if all(misfits):
            problems.append(f"pod {pod.namespace}/{pod.name} {misfits[0]}")
        gpu_wanted += quantity(pod.requests.get("nvidia.com/gpu", "0"))
    if gpu_wanted > gpu_total:
        problems.append(f"the pods request {gpu_wanted:g} GPUs; the replacement offers {gpu_total:g}")
    return problems


def predicted_labels(old_node: NodeView, *, old_pool: str, new_pool: str) -> dict[str, str]:
    """The labels a replacement node will carry, from an old node's (before the replacement exists)."""
    out = {k: v for k, v in old_node.labels.items() if k not in ("kubernetes.io/hostname",)}
    for key in (POOL_LABEL, "agentpool"):
        if out.get(key) == old_pool:
            out[key] = new_pool
    out["kubernetes.azure.com/dcgm-exporter"] = "enabled"
    return out


def parse_taints(texts: Sequence[str]) -> list[Taint]:
    out = []
    for text in texts:
        kv, _, effect = str(text).rpartition(":")
        key, _, value = kv.partition("=")
        out.append(Taint(key=key, value=value, effect=effect))
    return out


def _body_taints(body: Mapping[str, Any]) -> list[Taint]:
    taints = parse_taints(body.get("nodeTaints") or [])
    if body.get("scaleSetPriority") == "Spot" and not any(t.key == "kubernetes.azure.com/scalesetpriority" for t in taints):
        taints.append(Taint(key="kubernetes.azure.com/scalesetpriority", value="spot", effect="NoSchedule"))
    return taints


def _old_pods(kube: KubePort, nodes: Sequence[NodeView],
              listed: Mapping[str, Sequence[PodView]] | None = None) -> list[PodView]:
    from shared.drain import core as drain

    pods = [p for found in _concurrently(
        lambda n: _workload_pods(kube, n.name, listed=None if listed is None else listed[n.name]), nodes)
        for p in found]
    return [p for p in pods if drain.skip_terminating(p).delete]


# --------------------------------------------------------------------------- planner


def _observe(ctx: Context) -> tuple[list[Any], dict[str, list[PoolInfo]], dict[str, list[Mapping[str, Any]]]]:
    from shared.fleet import scope

    aks = ctx.access.aks()
    clusters = []
    pools: dict[str, list[PoolInfo]] = {}
    maintenance: dict[str, list[Mapping[str, Any]]] = {}
    for cluster in scope.discover(aks, ctx.settings):
        try:
            pools[cluster.id] = aks.list_pools(cluster.id)
            try:
                maintenance[cluster.id] = list(aks.list_maintenance_configurations(cluster.id))
            except NotFound:
                maintenance[cluster.id] = []
        except StewardError as exc:  # one unreadable cluster never hides the rest of the fleet's plan
            log.warning("cluster %s left out of the migration plan: %s", cluster.id, exc)
            continue
        clusters.append(cluster)
    return clusters, pools, maintenance


def observe_plan(ctx: Context) -> Plan:
    """Discover and plan, changing nothing (the CLI's ``plan``)."""
    clusters, pools, maintenance = _observe(ctx)
    return migration_plan.plan(clusters, pools, migrations=ctx.ledger.list(KIND), maintenance_by_cluster=maintenance,
                               policy=_policy(ctx), now=ctx.clock.now())


def record_for(item: PlanItem, *, now: float) -> Record:
    data = {"cluster_id": item.cluster_id, "cluster_name": item.cluster_name, "location": item.location,
            "pool": item.pool, "replacement": item.replacement, "vm_size": item.vm_size,
            "node_count": item.node_count, "strategy": item.strategy, "strategy_reason": item.strategy_reason,
            "batch_size": item.batch_size, "family": item.family, "vcpus_per_node": item.vcpus_per_node,
            "gpus_per_node": item.gpus_per_node, "order": item.order, "body": item.body,
            "quota": item.quota or item.family, "autoscaler": item.autoscaler,
            "drained": [], "removed": [], "batch": [], "phase": "drain"}
    return Record(kind=KIND, id=item.record_id, state="planned", data=data, next_at=now, created_at=now,
                  updated_at=now, history=[{"at": now, "state": "planned", "note": item.strategy_reason}])


def _warm_clients(ctx: Context, plan: Plan) -> None:
    """Build the Kubernetes clients the first steps will need (a cold worker imports the client here).

    Best effort: a cluster whose client cannot be built now is left to the step, which reports why.
    """
    for cluster_id in sorted({item.cluster_id for item in plan.items}):
        try:
            ctx.access.kube(cluster_id)
        except StewardError as exc:
            log.info("Kubernetes client of %s not built ahead of its migration: %s", cluster_id, exc)


def run_planner(ctx: Context, *, start: bool = True) -> Plan:
    """The timer: plan, then record each planned item (create-if-absent) when migrations are enabled.

    With ``start`` (the timer's default) each record this call created is advanced at once, through
    the reconciler's claim (so never by two instances), instead of waiting for the reconciler's tick.
    """
    plan = observe_plan(ctx)
    policy = _policy(ctx)
    if not policy.enabled or getattr(ctx.settings, "paused", False):
        log.info("migration plan (not started: %s): %d items, %d skipped",
                 "STEWARD_PAUSED" if policy.enabled else "MIGRATION_ENABLED=false", len(plan.items), len(plan.skipped))
        return plan
    if start and plan.items:
        _warm_clients(ctx, plan)
    now = ctx.clock.now()
    created_records: list[Record] = []
    for item in plan.items:
        if ctx.ledger.get(KIND, item.record_id) is not None:
            continue  # recorded by an earlier run or another instance: announced then
        record = record_for(item, now=now)
        # Announce before the record exists: once it does, any instance's reconciler may claim it and
        # publish its first Step, and a migration's story must open with Planned. A planner racing this
        # one publishes the same deterministic id, which consumers dedupe.
        _publish(ctx, record, "Planned", order=item.order, vm_size=item.vm_size, node_count=item.node_count,
                 strategy_reason=item.strategy_reason)
        try:
            created_records.append(ctx.ledger.create(record))
        except Conflict:
            log.info("migration %s already recorded by another instance", item.record_id)
    if start and created_records:
        from shared.kernel.reconciler import ReconcileReport, advance_record

        report = ReconcileReport()
        for created in created_records:
            advance_record(created, ctx, report=report, advance=advance, active=ACTIVE_STATES, give_up=give_up)
        log.info("migrations started by the planner: %s", report.advanced or "none (another instance has them)")
    return plan


# --------------------------------------------------------------------------- steps


def _started_elsewhere(ctx: Context, record: Record) -> int:
    return sum(1 for r in ctx.ledger.list(KIND, states=sorted(ACTIVE_STATES - {"planned"})) if r.id != record.id)


def _put_replacement(ctx: Context, record: Record, *, count: int, existing: PoolInfo | None) -> None:
    """PUT the recorded replacement body with ``count`` nodes. Over ``existing`` (the replacement as read
    and verified) its eTag is sent as If-Match, so a pool changed since is not written (412 -> Conflict).
    With none the PUT creates the replacement and sends If-None-Match: * : a pool someone made under
    that name since the read is never overwritten (412 -> Conflict; the next step finds it and refuses
    it for want of the migrated-from tag)."""
    body = dict(record.data["body"])
    body["count"] = count
    ctx.access.aks().begin_put_pool(str(record.data["cluster_id"]), str(record.data["replacement"]), {"properties": body},
                                    etag=pool_etag(existing), create_only=existing is None)


def _step_planned(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    waiting = _window(ctx, record, now=now, policy=policy)
    if waiting is not None:
        return waiting
    if _started_elsewhere(ctx, record) >= policy.max_concurrent:
        return _wait(record, now=now, until=now + policy.poll_interval_s * 4,
                     why=f"fleet cap of {policy.max_concurrent} concurrent migrations reached")
    aks = ctx.access.aks()
    cluster_id, pool, new = str(record.data["cluster_id"]), str(record.data["pool"]), str(record.data["replacement"])
    old = aks.get_pool(cluster_id, pool)
    if old is None:
        return _finish(ctx, record, "blocked", now=now, note=f"the old pool {pool} no longer exists", event="Blocked",
                       reason=f"the old pool {pool} no longer exists")
    if old.provisioning_state != "Succeeded":
        return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"old pool is {old.provisioning_state}")
    # What is created is the managed clone of the pool ARM shows, at most its size: never a body the row made up.
    unlike = migration_plan.body_problems(old, record)
    wanted = int(record.data["body"].get("count") or 0)
    if not unlike and wanted > migration_plan.count_bound(old):
        bound = migration_plan.count_bound(old)
        unlike = f"the recorded replacement has {wanted} nodes; {pool} has {old.count} (at most {bound})"
    if unlike:
        reason = f"nothing is created: {unlike}"
        return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    existing = aks.get_pool(cluster_id, new)
    if existing is not None and (existing.properties.get("tags") or {}).get(TAG_MIGRATED_FROM) != pool:
        reason = f"a pool named {new} exists and was not created by this migration"
        return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    kube = ctx.access.kube(cluster_id)
    old_nodes = _pool_nodes(kube, pool)
    if existing is None and old_nodes:
        body = record.data["body"]
        shapes = [NodeShape(predicted_labels(n, old_pool=pool, new_pool=new), _body_taints(body), n.allocatable)
                  for n in old_nodes]
        names = [n.name for n in old_nodes]  # each node's pods listed once, for the fit and the drain checks
        listed = dict(zip(names, _concurrently(lambda n: kube.list_pods(node_name=n), names), strict=True))
        problems = fit_problems(_old_pods(kube, old_nodes, listed), shapes=shapes,
                                node_count=int(body.get("count") or 0))
        if problems:
            reason = "the old pool's pods would not fit the replacement: " + "; ".join(problems[:5])
            return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
        # A pod the drain would refuse (no controller, emptyDir under "refuse", two PDBs) would block the
        # migration at its first batch with both pools billed: say so before a GPU is bought.
        refusal = drain_preflight(ctx, record, names, now=now, policy=policy, listed=listed)
        if refusal:
            reason = "drain refused before evicting anything (checked before creating the replacement): " + refusal
            return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    strategy = str(record.data["strategy"])
    full = int(record.data["body"].get("count") or 0)
    batch = int(record.data["batch_size"])
    switched: dict[str, Any] = {}
    if existing is None:
        count = full if strategy == "surge" else min(full, batch)
        try:
            _put_replacement(ctx, record, count=count, existing=None)
        except Invalid as exc:
            if not _is_quota(exc) or strategy != "surge":
                reason = f"creating the replacement was refused: {exc.reason}"
                if isinstance(exc, FeatureNotRegistered):  # the owner must register it: say how
                    from shared.pools.creation import feature_registration_help

                    reason = "creating the replacement was refused: " + feature_registration_help(
                        exc, subscription=cluster_id.split("/")[2])
                return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
            strategy, count = "rolling", min(full, batch)
            switched = {"strategy": "rolling", "strategy_switched": f"surge refused by quota ({exc.reason}); switched to rolling"}
            try:
                _put_replacement(ctx, record, count=count, existing=None)
            except Invalid as again:
                reason = f"GPU quota cannot hold one batch of the replacement: {again.reason}"
                return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason, **switched)
    else:
        count = existing.count
        if strategy == "surge" and count < full:
            # A crash after a quota-driven switch lost the record's copy of it: the pool says rolling.
            switched = {"strategy": "rolling",
                        "strategy_switched": f"the replacement exists with {count} of {full} nodes: continuing rolling"}
    moved = _move(ctx, record, "creating", now=now, note=switched.get("strategy_switched", f"creating {new} with {count} nodes"),
                  replacement_count=count, create_deadline=now + policy.create_timeout_s, **switched)
    _publish(ctx, moved, "Started", replacement_count=count)
    return moved


def _step_creating(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    new = ctx.access.aks().get_pool(str(record.data["cluster_id"]), str(record.data["replacement"]))
    deadline = float(record.data.get("create_deadline") or now)
    if new is None:
        if now > deadline:
            return _move(ctx, record, "rolling_back", now=now, note="the replacement never appeared",
                         reason="replacement never appeared")
        return _move(ctx, record, "planned", now=now, note="the replacement is not there: creating it again")
    state = new.provisioning_state
    if state == "Succeeded":
        return _move(ctx, record, "validating", now=now, note=f"{new.name} provisioned; validating its GPU stack",
                     validate_deadline=now + policy.validate_timeout_s)
    if state in ("Failed", "Canceled") or now > deadline:
        reason = f"the replacement is {state}" if state in ("Failed", "Canceled") else "the replacement took too long to create"
        return _move(ctx, record, "rolling_back", now=now, note=reason, reason=reason)
    return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"replacement is {state}")


def _step_validating(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    from shared.fleet.stack import evaluate_stack

    cluster_id, pool, name = str(record.data["cluster_id"]), str(record.data["pool"]), str(record.data["replacement"])
    new = ctx.access.aks().get_pool(cluster_id, name)
    if new is None:
        return _move(ctx, record, "rolling_back", now=now, note="the replacement disappeared", reason="replacement disappeared")
    kube = ctx.access.kube(cluster_id)
    nodes = _pool_nodes(kube, name)
    report = evaluate_stack(pool=new, nodes=nodes, expected_count=int(record.data.get("replacement_count") or 0), now=now)
    if not report.ok:
        if now > float(record.data.get("validate_deadline") or now):
            reason = "the replacement did not become healthy: " + "; ".join(report.problems[:5])
            return _move(ctx, record, "rolling_back", now=now, note=reason, reason=reason)
        return _wait(record, now=now, until=now + policy.poll_interval_s, why="; ".join(report.problems[:3]))
    if nodes:
        old_nodes = _pool_nodes(kube, pool)
        shapes = [NodeShape(n.labels, n.taints, n.allocatable) for n in nodes]
        # A rolling replacement starts with one batch, in fewer zones than it will span; it has the
        # old pool's availabilityZones, so its nodes will also come up in every zone the old ones are in.
        zones = sorted({n.labels[ZONE_LABEL] for n in old_nodes if ZONE_LABEL in n.labels})
        shapes += [NodeShape({**nodes[0].labels, ZONE_LABEL: z}, nodes[0].taints, nodes[0].allocatable) for z in zones]
        problems = fit_problems(_old_pods(kube, old_nodes), shapes=shapes,
                                node_count=int(record.data["body"].get("count") or 0))
        if problems:
            reason = "the old pool's pods would not fit the replacement: " + "; ".join(problems[:5])
            return _move(ctx, record, "rolling_back", now=now, note=reason, reason=reason, final="blocked")
    return _move(ctx, record, "cordoning", now=now, note=f"{name} is healthy ({report.ready_nodes} nodes, "
                 f"{report.gpu_allocatable} GPUs)")


def _cordon(kube: KubePort, node: NodeView, record: Record) -> NodeView:
    patched = kube.patch_node(node.name, {"metadata": {"annotations": {MIGRATION_ANNOTATION: record.id}},
                                          "spec": {"unschedulable": True}})
    _node_event(kube, node, record, "MigrationCordoned",
                f"cordoned to migrate pool {record.data['pool']} to managed pool {record.data['replacement']}")
    return patched


def _ours(node: NodeView, record: Record) -> bool:
    return node.annotations.get(MIGRATION_ANNOTATION) == record.id


def _step_cordoning(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    waiting = _window(ctx, record, now=now, policy=policy)
    if waiting is not None:
        return waiting
    aks = ctx.access.aks()
    cluster_id, pool = str(record.data["cluster_id"]), str(record.data["pool"])
    old = aks.get_pool(cluster_id, pool)
    if old is None:
        reason = f"the old pool {pool} disappeared during the migration"
        return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    if old.provisioning_state != "Succeeded":
        return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"old pool is {old.provisioning_state}")
    if old.properties.get("enableAutoScaling"):
        # Freeze the old pool's autoscaler so it neither adds nodes for evicted pods nor fights deletions.
        # If-Match: written only over the version just read (and verified by _refusal): else 412, look again.
        try:
            aks.begin_put_pool(cluster_id, pool, {"properties": frozen_old_pool(old, enable_autoscaling=False)},
                               etag=pool_etag(old))
        except Conflict as exc:
            return _wait(record, now=now, until=now + policy.poll_interval_s,
                         why=f"{pool} was not written ({type(exc).__name__}: {exc}): looking again")
        frozen = {"min": old.properties.get("minCount"), "max": old.properties.get("maxCount")}
        return _wait(msgspec.structs.replace(record, data={**record.data, "autoscaler_was": frozen}),
                     now=now, until=now + policy.poll_interval_s, why="turning the old pool's autoscaler off")
    kube = ctx.access.kube(cluster_id)
    nodes = _pool_nodes(kube, pool)
    seen = _concurrently(lambda n: n if n.unschedulable else _cordon(kube, n, record), nodes)
    ours = [node.name for node in seen if _ours(node, record)]
    data = {"cordoned": ours, "nodes_total": len(nodes), "phase": "drain", "batch": []}
    moved = record.moved("draining", at=now, note=f"cordoned {len(ours)} of {len(nodes)} old nodes", **{**data, "waiting": ""})
    moved = msgspec.structs.replace(moved, data={**moved.data, "progress": _progress(moved)})
    _publish(ctx, moved, "Step", previous=record.state, note=f"cordoned {len(ours)} old nodes")
    return moved


def _drain_policy(policy: MigrationPolicy, base: Any = None) -> Any:
    """The drain rules of a migration: the pod rules and DRAIN_* bounds of the remediation settings
    (REMEDIATION_EMPTY_DIR / REMEDIATION_UNMANAGED_PODS, DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S,
    DRAIN_PDB_BLOCKED_TIMEOUT_S), with the migration's own deadline and pace."""
    from shared.remediation.policy import RemediationPolicy

    base = base if isinstance(base, RemediationPolicy) else RemediationPolicy()
    # A PDB's 429 carries no Retry-After; the budget frees up when a replacement pod turns Ready, which
    # the next poll can see, so a refused eviction is asked again at the poll interval (at most 5 s).
    poll = min(policy.poll_interval_s, 20)
    return RemediationPolicy(drain_timeout_s=policy.drain_timeout_s, empty_dir=base.empty_dir,
                             unmanaged_pods=base.unmanaged_pods, eviction_retry_s=min(5.0, poll), poll_s=poll,
                             skip_wait_for_delete_timeout_s=base.skip_wait_for_delete_timeout_s,
                             pdb_blocked_timeout_s=min(base.pdb_blocked_timeout_s, policy.drain_timeout_s))


def drain_preflight(ctx: Context, record: Record, nodes: Sequence[str], *, now: float,
                    policy: MigrationPolicy, listed: Mapping[str, Sequence[PodView]] | None = None) -> str:
    """kubectl ``GetPodsForDeletion`` over every old node still to drain, before the next batch is
    disrupted: the refusal (which pod, which rule, which setting) or "" when every node can be drained.
    ``listed``: each node's pods as this step already listed them."""
    from shared.drain import core as drain

    kube = ctx.access.kube(str(record.data["cluster_id"]))
    dpolicy = _drain_policy(policy, ctx.settings.remediation)
    pdbs = drain.fetch_pdbs(kube)
    names = list(nodes)
    found = ([listed[n] for n in names] if listed is not None
             else _concurrently(lambda n: kube.list_pods(node_name=n), names))
    refusals = []
    for name, pods in zip(names, found, strict=True):
        plan = drain.plan_drain([p for p in pods if p.node_name in ("", name)], dpolicy, now=now, pdbs=pdbs)
        if plan.refused:
            refusals.append(f"{name}: {plan.refused_pods(limit=3)}")
    return "; ".join(refusals[:3])


def drain_nodes(ctx: Context, record: Record, nodes: Sequence[str], *, now: float,
                policy: MigrationPolicy) -> tuple[dict[str, Any], str, float, list[str]]:
    """One drain step over ``nodes`` with shared.drain.core (Eviction API only).

    Returns (drain states by node, outcome, wake-up time, messages). The outcome is "drained" when
    every node is, else the first of "refused" (a pod fails a filter: nothing in the batch is
    evicted), "stalled" (a PDB kept refusing for DRAIN_PDB_BLOCKED_TIMEOUT_S), "timed_out", or "".
    The reasons of refused / stalled / timed-out nodes come first in the messages.
    """
    from shared.drain import core as drain

    kube = ctx.access.kube(str(record.data["cluster_id"]))
    dpolicy = _drain_policy(policy, ctx.settings.remediation)
    states: dict[str, Any] = dict(record.data.get("drain") or {})
    outcomes: list[str] = []
    wakes: list[float] = []
    messages: list[str] = []
    names = list(nodes)
    listed = _concurrently(lambda n: kube.list_pods(node_name=n), names)
    previous_states = {n: drain.DrainState.from_data(states.get(n)) for n in names}
    need_pdbs = any(p.started_at is None or p.blocked for p in previous_states.values())
    pdbs = drain.fetch_pdbs(kube) if need_pdbs else None
    stepped: dict[str, tuple[Any, Any, list[Any]]] = {}
    todo: list[tuple[str, Any]] = []
    for name, pods in zip(names, listed, strict=True):
        previous = previous_states[name]
        state, actions = drain.drain_step(node=name, pods=pods, previous=previous, now=now, policy=dpolicy, pdbs=pdbs)
        stepped[name] = (previous, state, pods)
        todo += [(name, a) for a in actions]
    if any(st.outcome in (drain.REFUSED, drain.STALLED) for _, st, _ in stepped.values()):
        todo = []  # the batch stops as a whole: nothing more is disrupted for a migration that blocks
    # The batch's evictions all go out together, longest grace period first across the batch.
    graces = {p.uid: 30 if p.grace_period_seconds is None else p.grace_period_seconds
              for _, _, pods in stepped.values() for p in pods}
    todo.sort(key=lambda item: -graces.get(item[1].uid, 0))
    answers = drain.evict_all(lambda a: kube.evict(a.namespace, a.name, grace_period_seconds=a.grace_period_seconds),
                              [a for _, a in todo])
    sent: dict[str, int] = {}
    for (name, _), (action, result) in zip(todo, answers, strict=True):
        previous, state, pods = stepped[name]
        pod = next((p for p in pods if p.uid == action.uid), None)
        state = drain.record_eviction(state, action, result, now=now,
                                      grace=pod.grace_period_seconds if pod else None, policy=dpolicy)
        stepped[name] = (previous, state, pods)
        sent[name] = sent.get(name, 0) + 1
    started = [n for n in names if sent.get(n) and stepped[n][0].started_at is None]
    _concurrently(lambda n: _node_event(kube, n, record, "MigrationDraining",
                                        f"evicting {sent[n]} pods (Eviction API, PDBs respected)"), started)
    stopped = [n for n in names if stepped[n][1].outcome in (drain.REFUSED, drain.STALLED)
               and stepped[n][0].outcome != stepped[n][1].outcome]
    _concurrently(lambda n: _node_event(kube, n, record, "MigrationDrainRefused" if stepped[n][1].outcome == drain.REFUSED
                                        else "MigrationDrainBlocked", stepped[n][1].reason), stopped)
    reasons: list[str] = []
    for name in names:
        state = stepped[name][1]
        states[name] = state.to_data()
        outcomes.append(state.outcome)
        if state.wake_at is not None:
            wakes.append(state.wake_at)
        if state.reason:
            reasons.append(f"{name}: {state.reason}")
        messages += [f"{k}: {v}" for k, v in state.messages.items() if k != "_deadline"]
    messages = reasons + messages
    if outcomes and all(o == drain.DRAINED for o in outcomes):
        outcome = drain.DRAINED
    else:
        outcome = next((o for o in (drain.REFUSED, drain.STALLED, drain.TIMED_OUT) if o in outcomes), "")
    return states, outcome, min(wakes) if wakes else now + policy.poll_interval_s, messages


def _leave_out_departing(ctx: Context, record: Record, old_nodes: Sequence[NodeView], *,
                         now: float) -> tuple[Record, list[NodeView]]:
    """Old nodes the platform is taking away (a spot eviction, shared.fleet.node_fate) leave the migration.

    They are not drained (AKS drains a preempted node itself, and a stopped VM runs nothing), not
    waited for, and not counted in the capacity floor: their loss is Azure's, not this migration's.
    Each is recorded once in ``lost`` with the reason, in the history and as a ``Step`` event.
    """
    departing = {n.name: why for n in old_nodes if (why := going_away(n))}
    lost = dict(record.data.get("lost") or {})
    new = {name: why for name, why in departing.items() if name not in lost}
    if new:
        lost.update(new)
        batch = [n for n in record.data.get("batch") or [] if n not in new]
        states = {k: v for k, v in (record.data.get("drain") or {}).items() if k not in new}
        note = "; ".join(f"{name} left out: {why}" for name, why in sorted(new.items()))
        record = record.moved(record.state, at=now, note=note, lost=lost, batch=batch, drain=states,
                              waiting=str(record.data.get("waiting") or ""))
        record = msgspec.structs.replace(record, next_at=now)
        _publish(ctx, record, "Step", previous=record.state, note=note)
    return record, [n for n in old_nodes if n.name not in departing]


def _lost_count(record: Record) -> int:
    return len(record.data.get("lost") or {})


def _capacity_ok(ctx: Context, record: Record, batch: Sequence[str], *, old_nodes: Sequence[NodeView],
                 policy: MigrationPolicy) -> tuple[bool, str]:
    """Surge only: GPUs on Ready nodes (replacement + undrained old) minus the batch stay above the floor.

    The floor is a share of the old pool's GPUs less those of nodes the platform took away (spot
    evictions) from either pool: that loss is not this migration's, and counting it would hold the
    drain for ever (AKS does not bring an evicted spot node back by itself).
    """
    from shared.fleet.stack import gpu_resources

    if record.data.get("strategy") != "surge" or policy.capacity_floor_pct <= 0:
        return True, ""
    kube = ctx.access.kube(str(record.data["cluster_id"]))
    drained = set(record.data.get("drained") or [])

    def gpus(n: NodeView) -> int:
        return sum(gpu_resources(n).values()) if n.ready else 0

    per_node = int(record.data.get("gpus_per_node") or 0)
    new_nodes = [n for n in _pool_nodes(kube, str(record.data["replacement"])) if not going_away(n)]
    # A surge replacement has every node from the start: one missing or going away was taken by Azure.
    new_lost = max(0, int(record.data.get("replacement_count") or 0) - len(new_nodes))
    baseline = per_node * max(0, int(record.data.get("nodes_total") or len(old_nodes)) - _lost_count(record) - new_lost)
    new_gpus = sum(gpus(n) for n in new_nodes)
    old_gpus = sum(gpus(n) for n in old_nodes if n.name not in drained and n.name not in batch)
    floor = baseline * policy.capacity_floor_pct / 100.0
    if new_gpus + old_gpus >= floor:
        return True, ""
    return False, f"GPU capacity {new_gpus + old_gpus} would drop below the floor {floor:g} ({policy.capacity_floor_pct}%)"


def _drain_phase(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    kube = ctx.access.kube(str(record.data["cluster_id"]))
    pool = str(record.data["pool"])
    old_nodes = _pool_nodes(kube, pool)
    record, old_nodes = _leave_out_departing(ctx, record, old_nodes, now=now)
    present = {n.name for n in old_nodes}
    drained = [n for n in record.data.get("drained") or []]
    batch = [n for n in record.data.get("batch") or [] if n in present]
    if not batch:
        remaining = [n.name for n in old_nodes if n.name not in drained]
        if not remaining:
            return _move(ctx, record, "deleting", now=now, note="every old node is drained")
        waiting = _window(ctx, record, now=now, policy=policy)
        if waiting is not None:
            return waiting
        cordoned = list(record.data.get("cordoned") or [])
        for node in old_nodes:  # a node that appeared or was uncordoned since: cordon it too
            if not node.unschedulable:
                _cordon(kube, node, record)
                cordoned.append(node.name)
        batch = remaining[: int(record.data["batch_size"])]
        ok, why = _capacity_ok(ctx, record, batch, old_nodes=old_nodes, policy=policy)
        if not ok:
            return _wait(record, now=now, until=now + policy.poll_interval_s, why=why)
        # Decide before disrupting: before the first batch, every old node is checked (once: each later
        # batch's drain step still refuses its own nodes before evicting anything).
        refusal = "" if drained else drain_preflight(ctx, record, remaining, now=now, policy=policy)
        if refusal:  # no node of the pool is drained when one of them cannot be
            reason = "drain refused before evicting anything: " + refusal
            kept = msgspec.structs.replace(record, data={**record.data, "cordoned": sorted(set(cordoned))})
            return _finish(ctx, kept, "blocked", now=now, note=reason, event="Blocked", reason=reason)
        record = msgspec.structs.replace(record, data={**record.data, "batch": batch, "drain": {},
                                                       "cordoned": sorted(set(cordoned))})
    states, outcome, wake, messages = drain_nodes(ctx, record, batch, now=now, policy=policy)
    data = {**record.data, "drain": states}
    if outcome in ("timed_out", "stalled", "refused"):
        lead = {"timed_out": "drain stalled past MIGRATION_DRAIN_TIMEOUT_S: ",
                "stalled": "drain stalled on a PodDisruptionBudget (DRAIN_PDB_BLOCKED_TIMEOUT_S): ",
                "refused": "drain refused before evicting anything: "}[outcome]
        reason = lead + "; ".join(messages[:5])
        return _finish(ctx, msgspec.structs.replace(record, data=data), "blocked", now=now, note=reason,
                       event="Blocked", reason=reason)
    if outcome != "drained":
        record = msgspec.structs.replace(record, data={**data, "progress": _progress(record)})
        return _wait(record, now=now, until=max(now, wake), why="draining " + ", ".join(batch)
                     + (f" ({messages[0]})" if messages else ""))
    _concurrently(lambda name: _node_event(kube, name, record, "MigrationDrained", "no workload pod left on the node"),
                  batch)
    drained = sorted(set(drained) | set(batch))
    remaining = [n for n in present if n not in drained]
    rolling = record.data.get("strategy") == "rolling" and remaining
    data.update(drained=drained, batch=[], drain={}, phase="shrink" if rolling else "drain",
                shrinking=batch if rolling else [])
    stepped = msgspec.structs.replace(record, data=data)
    stepped = msgspec.structs.replace(stepped, data={**stepped.data, "progress": _progress(stepped)})
    stepped = stepped.moved("draining", at=now, note=f"drained {', '.join(batch)}", waiting="")
    _publish(ctx, stepped, "Step", previous="draining", note=f"drained {', '.join(batch)}")
    return stepped


def _shrink_phase(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    aks, cluster_id, pool = ctx.access.aks(), str(record.data["cluster_id"]), str(record.data["pool"])
    victims = list(record.data.get("shrinking") or [])
    present = [m.name for m in aks.list_machines(cluster_id, pool) if m.name in victims]
    if not present:
        removed = sorted(set(record.data.get("removed") or []) | set(victims))
        data = {**record.data, "removed": removed, "shrinking": [], "shrink_sent": False, "phase": "grow"}
        return _move(ctx, record, "draining", now=now, note=f"removed {', '.join(victims)} from {pool}", **data)
    if not record.data.get("shrink_sent"):
        kube = ctx.access.kube(cluster_id)
        busy = [n for n, pods in zip(present, _concurrently(lambda n: _workload_pods(kube, n), present), strict=True)
                if pods]
        if busy:  # a pod landed there since the drain: drain again rather than kill it with the VM
            data = {**record.data, "drained": [n for n in record.data.get("drained") or [] if n not in busy],
                    "phase": "drain", "shrinking": []}
            return _move(ctx, record, "draining", now=now, note=f"workload pods back on {', '.join(busy)}: draining again",
                         **data)
        # deleteMachines takes no If-Match: AgentPools_DeleteMachines declares no such header, where
        # AgentPools_Delete declares ``if-match`` (Azure/azure-rest-api-specs specification/containerservice/
        # resource-manager/Microsoft.ContainerService/aks/stable/2025-10-01/managedClusters.json; the SDK's
        # build_agent_pools_delete_machines_request sends none either). So the pool and its machines are
        # read again right before the call, and the pool must still be the one this migration drains.
        again = _read_again(aks, cluster_id, pool)
        refusal = "it no longer exists" if again is None else _pool_refusal(record, again)
        if refusal:
            reason = f"no machine of {pool} is deleted: {refusal}"
            return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
        still = {m.name for m in aks.list_machines(cluster_id, pool)}
        present = [n for n in present if n in still]
        if present:
            aks.begin_delete_machines(cluster_id, pool, present)
        record = msgspec.structs.replace(record, data={**record.data, "shrink_sent": True})
    return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"deleting machines {', '.join(present)}")


def _grow_phase(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    from shared.fleet.stack import evaluate_stack

    aks, cluster_id, name = ctx.access.aks(), str(record.data["cluster_id"]), str(record.data["replacement"])
    total = int(record.data.get("nodes_total") or record.data["body"].get("count") or 0)
    target = min(total, len(record.data.get("removed") or []) + int(record.data["batch_size"]))
    target = max(target, int(record.data.get("replacement_count") or 0))
    new = aks.get_pool(cluster_id, name)
    if new is None:
        reason = "the replacement disappeared during a rolling migration"
        return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    deadline = float(record.data.get("grow_deadline") or 0) or now + policy.validate_timeout_s
    record = msgspec.structs.replace(record, data={**record.data, "grow_deadline": deadline})
    if new.provisioning_state != "Succeeded":  # an operation is running (ours, most likely): never stack PUTs
        if now > deadline:
            reason = f"the replacement stayed {new.provisioning_state} while growing to {target} nodes"
            return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
        return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"{name} is {new.provisioning_state}")
    # The row's counts are claims too: one grow adds at most one batch (the record's, never more than
    # MIGRATION_BATCH_SIZE) to what ARM shows, and grows happen only between drained batches of the old pool.
    target = min(target, new.count + max(1, min(int(record.data["batch_size"]), policy.batch_size)))
    if new.count < target:
        waiting = _window(ctx, record, now=now, policy=policy)
        if waiting is not None:
            return waiting
        try:
            _put_replacement(ctx, record, count=target, existing=new)
        except Conflict as exc:
            return _wait(record, now=now, until=now + policy.poll_interval_s,
                         why=f"{name} was not written ({type(exc).__name__}: {exc}): looking again")
        except Invalid as exc:
            reason = f"growing the replacement to {target} nodes was refused: {exc.reason}"
            return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
        return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"growing {name} to {target} nodes")
    nodes = _pool_nodes(ctx.access.kube(cluster_id), name)
    report = evaluate_stack(pool=new, nodes=nodes, expected_count=target, now=now)
    if not report.ok:
        if now > deadline:
            reason = f"the replacement did not become healthy at {target} nodes: " + "; ".join(report.problems[:5])
            return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
        return _wait(record, now=now, until=now + policy.poll_interval_s, why="; ".join(report.problems[:3]))
    data = {**record.data, "phase": "drain", "replacement_count": target, "grow_deadline": 0}
    return _move(ctx, record, "draining", now=now, note=f"{name} healthy at {target} nodes", **data)


_PHASES = {"drain": _drain_phase, "shrink": _shrink_phase, "grow": _grow_phase}


def _step_draining(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    # Sub-steps inside "draining" (next batch, shrink, grow) are chained in one call while they are
    # immediately actionable, because the reconciler chains calls only on state changes; each sub-step
    # still re-observes before it writes, and a batch being evicted always ends the call.
    for _ in range(MAX_CHAINED_SUBSTEPS):
        phase = str(record.data.get("phase") or "drain")
        stepped = _PHASES[phase](ctx, record, now, policy)
        if stepped.state != "draining" or stepped.next_at > now:
            return stepped
        if phase == "drain" and stepped.data.get("phase") == "shrink":
            # Save the drained batch before its machines are deleted: resumed after a crash in between,
            # the drain phase would find the batch gone from the old pool, never record it as removed,
            # and the rolling replacement would never grow back to the old pool's size.
            return stepped
        record = stepped
    return record


def _size_of(vm_size: str) -> Any:
    from shared.fleet import gpu_sizes

    return gpu_sizes.lookup(vm_size)


def _pool_refusal(record: Record, old: PoolInfo) -> str:
    """Why ARM says ``old`` is not a pool this migration may act on ("" = it may). Pure (over the read).

    The planner's own rules (:func:`shared.migration.plan.pool_ineligibility`: an unmanaged NVIDIA
    Linux User pool, not MIG), and the size the record was planned for."""
    found = migration_plan.pool_ineligibility(old, size=_size_of(old.vm_size))
    if found is not None:
        return found[1]
    wanted = str(record.data.get("vm_size") or "")
    if not wanted or old.vm_size.lower() != wanted.lower():
        return f"{old.name} is {old.vm_size or 'of no size'}, not the recorded {wanted or '(none)'}"
    return ""


def _replacement_refusal(record: Record, new: PoolInfo) -> str:
    """Why ARM says ``new`` is not this migration's replacement ("" = it is). Pure (over the read)."""
    pool, name = str(record.data.get("pool") or ""), new.name
    if str((new.properties.get("tags") or {}).get(TAG_MIGRATED_FROM) or "") != pool:
        return f"{name} does not carry {TAG_MIGRATED_FROM}={pool}: it was not created by a migration of {pool}"
    if new.management_mode != "Managed":
        return f"the replacement {name} is not managed"
    wanted = str(record.data.get("vm_size") or "")
    if new.vm_size.lower() != wanted.lower():
        return f"the replacement {name} is {new.vm_size}, not {wanted or '(none)'}"
    return ""


def _autoscaler_refusal(was: Mapping[str, Any], new: PoolInfo | None, name: str) -> str:
    """Why the recorded autoscaler bounds ``was`` are not restored ("" = they are those the replacement,
    tagged by this app when it cloned the old pool, remembers in ``TAG_AUTOSCALER``). Pure."""
    bounds = f"{was.get('min', '')}-{was.get('max', '')}"
    if new is None:
        return f"the replacement {name}, which remembers the old bounds, is gone: restore {bounds} by hand if right"
    tagged = str((new.properties.get("tags") or {}).get(TAG_AUTOSCALER) or "")
    if tagged != bounds:
        return f"the recorded bounds {bounds} are not the ones {name} was tagged with ({tagged or 'none'})"
    return ""


def _refusal(ctx: Context, record: Record, cluster: ClusterInfo | None) -> str:
    """Why this record may not take its next step, from ARM's truth ("" = it may). Read before any write.

    A ledger row is only a claim (whoever can write the table can write any row): before a step of
    any state writes, the row must agree with itself (:func:`shared.migration.plan.record_problems`),
    its cluster must be in the fleet's scope, its old pool (when it exists) must be one the planner
    would migrate, of the recorded size, and its replacement (when it exists, after ``planned``) must
    be the managed pool of that size this app created for that old pool.
    """
    problem = migration_plan.record_problems(record)
    if problem:
        return problem
    if cluster is None:
        return f"the cluster {record.data.get('cluster_id')} does not exist in ARM"
    inside, why = scope.cluster_in_scope(cluster, ctx.settings)
    if not inside:
        return f"the cluster {cluster.name} is out of the fleet's scope: {why}"
    aks, cluster_id = ctx.access.aks(), str(record.data["cluster_id"])
    old = aks.get_pool(cluster_id, str(record.data["pool"]))
    if old is not None:
        problem = _pool_refusal(record, old)  # a managed pool included: AKS never turns a pool managed in place
        if problem:
            return problem
    if record.state != "planned":
        new = aks.get_pool(cluster_id, str(record.data["replacement"]))
        if new is not None:
            return _replacement_refusal(record, new)
    return ""


def _old_pool_refusal(record: Record, old: PoolInfo, new: PoolInfo | None) -> str:
    """Why ARM says ``old`` is not the pool this migration may delete ("" = it is). Pure.

    The record alone is not enough (a forged or corrupted ledger row could name any pool): the old
    pool must still be the unmanaged User pool of the recorded size, and its managed replacement,
    of the same size, must exist carrying ``TAG_MIGRATED_FROM=<old>`` (the tag only this app sets,
    shared.fleet.pool_clone)."""
    pool, name = old.name, str(record.data.get("replacement") or "")
    wanted = str(record.data.get("vm_size") or "")
    if old.management_mode == "Managed":
        return f"{pool} has a managed GPU profile: it is not the unmanaged pool this migration replaces"
    if str(old.properties.get("mode") or "User") != "User":
        return f"{pool} is a {old.properties.get('mode')} pool, not a User pool"
    if not wanted or old.vm_size.lower() != wanted.lower():
        return f"{pool} is {old.vm_size or 'of no size'}, not the recorded {wanted or '(none)'}"
    if new is None:
        return f"the replacement {name or '(none recorded)'} does not exist: {pool} is not deleted without it"
    if str((new.properties.get("tags") or {}).get(TAG_MIGRATED_FROM) or "") != pool:
        return f"{name} does not carry {TAG_MIGRATED_FROM}={pool}: it was not created by a migration of {pool}"
    if new.management_mode != "Managed":
        return f"the replacement {name} is not managed"
    if new.vm_size.lower() != old.vm_size.lower():
        return f"the replacement {name} is {new.vm_size}, not {old.vm_size}"
    return ""


def _replacement_serves(kube: KubePort, new: PoolInfo) -> str:
    """Why the replacement is not (yet) fit to take over ("" = it is): Succeeded, with Ready nodes."""
    if new.provisioning_state != "Succeeded":
        return f"the replacement {new.name} is {new.provisioning_state}"
    ready = sum(1 for n in _pool_nodes(kube, new.name) if n.ready)
    if ready < min(1, new.count):
        return f"the replacement {new.name} has no Ready node"
    return ""


def _step_deleting(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    aks, cluster_id, pool = ctx.access.aks(), str(record.data["cluster_id"]), str(record.data["pool"])
    old = aks.get_pool(cluster_id, pool)
    if old is None:
        return _finish(ctx, record, "done", now=now, note=f"{pool} deleted; {record.data['replacement']} serves",
                       event="Completed", progress=_progress(record))
    if record.data.get("delete_sent") and old.provisioning_state == "Deleting":
        return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"{pool} is Deleting")
    # Trust ARM, not the row: the pool to delete is derived from what ARM shows, before anything is touched.
    new = aks.get_pool(cluster_id, str(record.data.get("replacement") or "")) if record.data.get("replacement") else None
    refusal = _old_pool_refusal(record, old, new)
    if refusal:
        reason = f"{pool} is not deleted: {refusal}"
        return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    waiting = _window(ctx, record, now=now, policy=policy)
    if waiting is not None:
        return waiting
    kube = ctx.access.kube(cluster_id)
    unfit = _replacement_serves(kube, new) if new is not None else "no replacement"
    if unfit:
        return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"{unfit}: {pool} is kept until it serves")
    nodes = _pool_nodes(kube, pool)
    # A node whose VM is stopped (a spot eviction with the Deallocate policy) runs nothing, whatever
    # pods the API still binds to it; one under a Preempt notice is about to go: wait for it, never
    # drain it again (AKS is draining it).
    names = [n.name for n in nodes if not is_shut_down(n)]
    leaving = {n.name for n in nodes if going_away(n) and not is_shut_down(n)}
    busy = [n for n, pods in zip(names, _concurrently(lambda n: _workload_pods(kube, n), names), strict=True) if pods]
    if busy and set(busy) <= leaving:
        return _wait(record, now=now, until=now + policy.poll_interval_s,
                     why=f"waiting for Azure to take back {', '.join(busy)} (spot eviction) before deleting {pool}")
    busy = [n for n in busy if n not in leaving]
    if busy:  # re-checked right before the DELETE: never delete a pool that still runs workload pods
        data = {**record.data, "drained": [n for n in record.data.get("drained") or [] if n not in busy],
                "phase": "drain", "batch": []}
        return _move(ctx, msgspec.structs.replace(record, data=data), "draining", now=now,
                     note=f"workload pods still on {', '.join(busy)}: draining again")
    # If-Match: deleted only if the pool is still the version read and verified above (412 -> Conflict: look again).
    aks.begin_delete_pool(cluster_id, pool, etag=pool_etag(old))
    record = msgspec.structs.replace(record, data={**record.data, "delete_sent": True})
    return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"deleting {pool}")


def _step_rolling_back(ctx: Context, record: Record, now: float, policy: MigrationPolicy) -> Record:
    aks, cluster_id = ctx.access.aks(), str(record.data["cluster_id"])
    pool, name = str(record.data["pool"]), str(record.data["replacement"])
    kube = ctx.access.kube(cluster_id)
    for node in _pool_nodes(kube, pool):  # uncordon only what this migration cordoned
        if _ours(node, record):
            kube.patch_node(node.name, {"metadata": {"annotations": {MIGRATION_ANNOTATION: None}},
                                        "spec": {"unschedulable": False}})
            _node_event(kube, node, record, "MigrationUncordoned", "migration rolled back: node serves again")
    was = record.data.get("autoscaler_was")
    old = aks.get_pool(cluster_id, pool)
    new = aks.get_pool(cluster_id, name)
    if was and old is not None and not old.properties.get("enableAutoScaling") and old.provisioning_state == "Succeeded":
        # On the very read whose eTag conditions the PUT; and the bounds restored are the ones the
        # replacement was tagged with when it was cloned (TAG_AUTOSCALER), never a row's say-so alone.
        refusal = _pool_refusal(record, old) or _autoscaler_refusal(was, new, name)
        if refusal:
            reason = f"{pool}'s autoscaler is not restored: {refusal}"
            return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
        try:
            aks.begin_put_pool(cluster_id, pool, {"properties": frozen_old_pool(
                old, enable_autoscaling=True, min_count=was.get("min"), max_count=was.get("max"))},
                etag=pool_etag(old))
        except Conflict as exc:
            return _wait(record, now=now, until=now + policy.poll_interval_s,
                         why=f"{pool} was not written ({type(exc).__name__}: {exc}): looking again")
        record = msgspec.structs.replace(record, data={**record.data, "autoscaler_was": None})
    final = str(record.data.get("final") or "rolled_back")
    if new is None:
        event = "Blocked" if final == "blocked" else "RolledBack"
        return _finish(ctx, record, final, now=now, note=f"{name} removed; {pool} serves again", event=event,
                       reason=record.data.get("reason"), uncordoned=True)
    refusal = _replacement_refusal(record, new)
    if refusal:
        reason = f"{name} is not deleted: {refusal}"
        return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    new_nodes = _pool_nodes(kube, name)
    for node in new_nodes:  # nothing new may land on the replacement from now on (pods being recreated included)
        if not node.unschedulable:
            _cordon(kube, node, record)
    new_names = [n.name for n in new_nodes]
    busy = [n for n, pods in zip(new_names, _concurrently(lambda n: _workload_pods(kube, n), new_names), strict=True)
            if pods]
    if busy:  # never delete a pool that runs workload pods: move them back to the old pool first
        states, _, wake, messages = drain_nodes(ctx, record, busy, now=now, policy=policy)
        record = msgspec.structs.replace(record, data={**record.data, "drain": states})
        return _wait(record, now=now, until=max(now, wake), why="moving pods back off the replacement: "
                     + ("; ".join(messages[:2]) or ", ".join(busy)))
    if not record.data.get("delete_sent") or new.provisioning_state != "Deleting":
        # If-Match: the replacement is deleted only if it is still the version read and verified above
        # (tagged by this migration, managed, empty); a 412 means it changed since: look again next poll.
        try:
            aks.begin_delete_pool(cluster_id, name, etag=pool_etag(new))
        except Conflict as exc:
            return _wait(record, now=now, until=now + policy.poll_interval_s,
                         why=f"{name} was not written ({type(exc).__name__}: {exc}): looking again")
        record = msgspec.structs.replace(record, data={**record.data, "delete_sent": True})
    return _wait(record, now=now, until=now + policy.poll_interval_s, why=f"deleting the replacement {name}")


_STEPS = {
    "planned": _step_planned,
    "creating": _step_creating,
    "validating": _step_validating,
    "cordoning": _step_cordoning,
    "draining": _step_draining,
    "deleting": _step_deleting,
    "rolling_back": _step_rolling_back,
}


def give_up(record: Record, ctx: Context, *, reason: str) -> Record:
    """The reconciler's hook for a step that failed permanently too many times in a row: ``blocked``.

    The migration stops where it is (nodes it cordoned stay cordoned, nothing is deleted) and says
    why, in the record (``reason``, shown by ``fleetctl status``) and in a ``Blocked`` event, so an
    operator fixes the cause and removes the record to try again.
    """
    if record.state in TERMINAL_STATES:
        return record
    now = ctx.clock.now()
    return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)


def _read_cluster(ctx: Context, record: Record) -> ClusterInfo | None:
    """The record's cluster as ARM describes it now (None: ARM has no such cluster)."""
    cluster_id = str(record.data.get("cluster_id") or "")
    try:
        parse_cluster_id(cluster_id)
    except Invalid:  # a cluster id that is not one (a malformed row): the row's checks say so
        return None
    try:
        return ctx.access.aks().get_cluster(cluster_id)
    except NotFound:
        return None


def _cluster_pause(ctx: Context, record: Record, *, now: float, cluster: ClusterInfo | None) -> Record | None:
    """A held copy when the cluster carries ``gpu-fleet-steward/paused=true`` (read from ARM at every step),
    else None. The migration stays where it is (cordons stay, nothing is created, drained or deleted)
    and says so: in the record's ``waiting`` and history, and once per pause in a ``Step`` event."""
    why = scope.paused_reason(cluster.tags) if cluster is not None else ""
    if not why:
        return None
    note = f"held where it is: {why}"
    if record.data.get("waiting") != note:
        _publish(ctx, record, "Step", previous=record.state, note=note)
    return _wait(record, now=now, until=now + PAUSE_RECHECK_S, why=note)


def advance(record: Record, ctx: Context) -> Record:
    """One short, idempotent step of a migration; returns the record to save (the reconciler saves it)."""
    if record.state in TERMINAL_STATES:
        return record
    now = ctx.clock.now()
    policy = _policy(ctx)
    if getattr(ctx.settings, "paused", False):
        return _wait(record, now=now, until=now + PAUSE_RECHECK_S, why="STEWARD_PAUSED: no writes")
    cluster = _read_cluster(ctx, record)
    held = _cluster_pause(ctx, record, now=now, cluster=cluster)
    if held is not None:
        return held
    step = _STEPS.get(record.state)
    if step is None:
        raise Invalid(f"migration {record.id} is in an unknown state {record.state!r}")
    # One view of the pools per step: the pools _refusal verifies are the ones the step reads and whose
    # eTags its writes send as If-Match, so a pool changed after the check is never written (412).
    ctx = dataclasses.replace(ctx, access=StepReads(ctx.access))
    refusal = _refusal(ctx, record, cluster)
    if refusal:  # nothing is created, cordoned, drained, scaled or deleted for a row ARM contradicts
        reason = f"stopped before any write: {refusal}"
        return _finish(ctx, record, "blocked", now=now, note=reason, event="Blocked", reason=reason)
    return step(ctx, record, now, policy)


def _read_again(aks: Any, cluster_id: str, pool: str) -> PoolInfo | None:
    """The pool as ARM shows it now, past the step's view (:class:`StepReads`)."""
    forget = getattr(aks, "forget", None)
    if forget is not None:
        forget(cluster_id, pool)
    return aks.get_pool(cluster_id, pool)  # type: ignore[no-any-return]


class StepReads:
    """ClusterAccess for one step: each agent pool is read from ARM once, and read again only after the
    step itself wrote it. Everything else passes through to the access it wraps."""

    def __init__(self, access: Any) -> None:
        self._access = access
        self._aks: _OnceAks | None = None

    def aks(self) -> Any:
        if self._aks is None:
            self._aks = _OnceAks(self._access.aks())
        return self._aks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._access, name)


class _OnceAks:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._pools: dict[tuple[str, str], PoolInfo | None] = {}

    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        key = (cluster_id.lower(), pool)
        if key not in self._pools:
            self._pools[key] = self._inner.get_pool(cluster_id, pool)
        return self._pools[key]

    def forget(self, cluster_id: str, pool: str) -> None:
        """The next read of ``pool`` goes to ARM (a write with no If-Match must see the pool as it is now)."""
        self._pools.pop((cluster_id.lower(), pool), None)

    _wrote = forget

    def begin_put_pool(self, cluster_id: str, pool: str, body: Any, **kwargs: Any) -> None:
        self._wrote(cluster_id, pool)
        self._inner.begin_put_pool(cluster_id, pool, body, **kwargs)

    def begin_delete_pool(self, cluster_id: str, pool: str, **kwargs: Any) -> None:
        self._wrote(cluster_id, pool)
        self._inner.begin_delete_pool(cluster_id, pool, **kwargs)

    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Any) -> None:
        self._wrote(cluster_id, pool)
        self._inner.begin_delete_machines(cluster_id, pool, machines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


"""Remediation of one unhealthy GPU node: admission (Event Grid trigger) and the step function.

:func:`handle_event` takes a ``Steward.GpuNode.Unhealthy`` CloudEvent, trusts nothing in it (it may
be stale, duplicated, late or out of order): it re-reads the node, re-evaluates it, and admits a
remediation only under every safety limit. Admissions are serialized fleet-wide through one ledger
record (kind ``budget``, id ``fleet``) holding the slots of remediations in flight: taking a slot is
an ETag-conditional save, so of two hosts admitting at once exactly one wins and the other re-reads
and re-decides with the winner's slot counted — the budgets can never be exceeded. Record ids make
duplicates impossible: a remediation's id is ``<node key>-<attempt n>`` and the per-node record
(kind ``remediation-node``) lists the faults already handled, so one fault is never remediated twice.

:func:`advance` is called by the reconciler; each call re-observes the node and takes one short,
idempotent step: ``admitted → cordoned → draining → repairing → verifying → done``, or ends in
``gave_up`` (every rung failed; the node stays cordoned), ``released`` (nothing left to do, or the
``release`` drain fallback) or ``failed`` (we are not allowed to act). Every write re-reads first,
intent is saved before a non-idempotent call (pool counts are desired-state PUTs of a count fixed in
the record), so a crash before or after any step resumes to the same end state. docs/remediation.md
documents the states, data fields and events.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from shared.adapters.aks import pool_etag
from shared.adapters.compute import VmActionDenied, VmActionImpossible
from shared.drain import core as drain
from shared.fleet import node_fate, node_truth
from shared.kernel.errors import (
    AllocationFailed,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    OperationInProgress,
    QuotaExceeded,
    StewardError,
    Throttled,
    Transient,
)
from shared.kernel.ports import EvictionResult, KubePort, NodeView, PoolInfo, Record
from shared.remediation import breaker, budget, health
from shared.remediation.policy import RemediationPolicy

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation")

KIND = "remediation"
NODE_KIND = "remediation-node"
BUDGET_KIND, BUDGET_ID = "budget", "fleet"
DEDUPE_KIND = "dedupe"

ADMITTED, CORDONED, DRAINING, REPAIRING, VERIFYING = "admitted", "cordoned", "draining", "repairing", "verifying"
DONE, GAVE_UP, RELEASED, FAILED, REFUSED = "done", "gave_up", "released", "failed", "refused"
ACTIVE_STATES: frozenset[str] = frozenset({ADMITTED, CORDONED, DRAINING, REPAIRING, VERIFYING})
TERMINAL_STATES: frozenset[str] = frozenset({DONE, GAVE_UP, RELEASED, FAILED, REFUSED})

UNHEALTHY_EVENT = "Steward.GpuNode.Unhealthy"
EVENT_PREFIX = "Steward.Remediation."
ADMITTED_EV, CORDONED_EV, DRAINED_EV = "Admitted", "Cordoned", "Drained"
RESTARTED_EV, REIMAGED_EV, REPLACED_EV = "Restarted", "Reimaged", "Replaced"
RECOVERED_EV, REFUSED_EV, GAVE_UP_EV, FAILED_EV, DRY_RUN_EV = "Recovered", "Refused", "GaveUp", "Failed", "DryRun"
RUNG_EVENTS: Mapping[str, str] = {"restart": RESTARTED_EV, "reimage": REIMAGED_EV, "replace": REPLACED_EV}
GOING_AWAY = "GoingAway"  # refusal code: the platform is taking the node away (shared.fleet.node_fate)

POOL_LABEL = "kubernetes.azure.com/agentpool"
SLOT_ORPHAN_S = 300.0  # a slot whose record never appeared is dropped after this
_ADMIT_TRIES = 6
_SURGE_FALLBACK_CODES = frozenset({"QuotaExceeded", "AllocationFailed", "ZonalAllocationFailed",
                                   "OverconstrainedAllocationRequest", "OverconstrainedZonalAllocationRequest",
                                   "SkuNotAvailable"})
_BUSY_POOL_STATES = frozenset({"Creating", "Updating", "Scaling", "Deleting", "Upgrading"})
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]")
_LEASELESS: set[str] = set()  # clusters without the lease namespace (warned once per process)


# --------------------------------------------------------------------------- identities


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def node_key(cluster_id: str, node: str) -> str:
    return hashlib.sha256(f"{cluster_id.lower()}/{node}".encode()).hexdigest()[:24]


def fault_id(cluster_id: str, node: str, condition: str, since: float) -> str:
    """The id of one fault (and of its Unhealthy CloudEvent): sha256(cluster|node|condition|transition)."""
    return hashlib.sha256(f"{cluster_id.lower()}|{node}|{condition}|{iso(since)}".encode()).hexdigest()


def subject(cluster_id: str, pool: str, node: str) -> str:
    return f"{cluster_id}/agentPools/{pool}/nodes/{node}"


def _label_value(text: str) -> str:
    return (_LABEL_VALUE.sub("-", text).strip("-._") or "steward")[:63].rstrip("-._") or "steward"


# --------------------------------------------------------------------------- small effects


def _policy(ctx: Context) -> RemediationPolicy:
    policy = getattr(ctx.settings, "remediation", None)
    return policy if isinstance(policy, RemediationPolicy) else RemediationPolicy()


def _metric(ctx: Context, name: str, value: float, **attrs: Any) -> None:
    """The one place remediation talks to telemetry; absent or failing telemetry is ignored."""
    telemetry = getattr(ctx, "telemetry", None)
    for method in ("record", "observe"):
        fn = getattr(telemetry, method, None)
        if callable(fn):
            try:
                fn(name, value, **attrs)
            except Exception as exc:  # metrics never fail a step
                log.debug("metric %s not recorded: %s", name, exc)
            return


def _publish(ctx: Context, record_or_data: Record | Mapping[str, Any], event: str, note: str, *,
             key: str = "", extra: Mapping[str, Any] | None = None) -> None:
    """Outcome CloudEvent, best effort (the ledger is the truth; events are notifications)."""
    data = record_or_data.data if isinstance(record_or_data, Record) else record_or_data
    rid = record_or_data.id if isinstance(record_or_data, Record) else str(data.get("id", ""))
    state = record_or_data.state if isinstance(record_or_data, Record) else ""
    payload = {"remediation": rid, "cluster": data.get("cluster"), "node": data.get("node"),
               "pool": data.get("pool"), "condition": data.get("condition"), "since": data.get("since"),
               "attempt": data.get("attempt"), "state": state, "note": note, "dry_run": bool(data.get("dry_run")),
               **(extra or {})}
    try:
        ctx.events.publish(type_=EVENT_PREFIX + event,
                           subject=subject(str(data.get("cluster")), str(data.get("pool")), str(data.get("node"))),
                           data=payload,
                           id_=hashlib.sha256(f"{rid}|{event}|{key}".encode()).hexdigest())
    except StewardError as exc:
        log.warning("could not publish %s for %s: %s", event, rid, exc)


def _kube_event(kube: KubePort, node: NodeView | str, record: Record, reason: str, message: str,
                type_: str = "Normal") -> None:
    kube.create_event(node=node, reason=reason, message=message, type_=type_, action=record.state,
                      correlation_id=record.id)


def _annotate(kube: KubePort, node: NodeView, record: Record, state: str, note: str) -> None:
    """Best effort: the node's annotation mirrors the ledger state (attempt, rung, when)."""
    value = json.dumps({"v": 1, "id": record.id, "state": state, "attempt": record.data.get("attempt"),
                        "rung": _rung(record), "at": record.updated_at, "note": note[:200]}, separators=(",", ":"))
    try:
        kube.patch_node(node.name, {"metadata": {"annotations": {health.STATE_ANNOTATION: value}}})
    except StewardError as exc:
        log.info("state annotation on %s not written: %s", node.name, exc)


def _rung(record: Record) -> str:
    ladder = record.data.get("ladder") or []
    i = int(record.data.get("rung_index") or 0)
    return ladder[i] if i < len(ladder) else ""


# --------------------------------------------------------------------------- admission


def _event_data(event: Mapping[str, Any]) -> Mapping[str, Any]:
    data = event.get("data")
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except ValueError:
            return {}
    return data if isinstance(data, Mapping) else {}


def _paused_reason(ctx: Context, tags: Mapping[str, str] | None, node: NodeView | None,
                   policy: RemediationPolicy) -> str | None:
    if getattr(ctx.settings, "paused", False):
        return "the app is paused (STEWARD_PAUSED=true)"
    for key, value in (tags or {}).items():
        if key.lower() == policy.paused_tag.lower() and str(value).lower() == "true":
            return f"the cluster is paused (tag {policy.paused_tag}=true)"
    if node is not None and node.labels.get(policy.opt_out_label, "").lower() == "true":
        return f"the node opted out (label {policy.opt_out_label}=true)"
    return None


def _refuse(ctx: Context, info: Mapping[str, Any], code: str, reason: str, *,
            warn: tuple[KubePort, NodeView] | None = None) -> str:
    """Publish Refused once per (fault, reason code): the sweep re-reports the fault every minute.

    ``warn`` also posts a Warning event on the node, in its own cluster (for refusals an operator of
    that cluster must see: a node that ARM contradicts, or one the platform is taking away)."""
    marker = Record(kind=DEDUPE_KIND, id=f"refused-{info['fault']}-{code}", state="seen",
                    data={"reason": reason, "reason_code": code, "cluster": info.get("cluster"),
                          "node": info.get("node")}, created_at=ctx.clock.now())
    try:
        ctx.ledger.create(marker)
    except Conflict:
        return f"refused ({code}, already reported): {reason}"
    _publish(ctx, {**info, "id": ""}, REFUSED_EV, reason, key=f"{info['fault']}|{code}",
             extra={"reason_code": code, "reason": reason})
    if warn is not None:  # best effort: the port's create_event never raises
        kube, node = warn
        kube.create_event(node=node, reason=f"StewardRefused{code}", message=f"remediation refused: {reason}",
                          type_="Warning", action=REFUSED, correlation_id=str(info["fault"])[:24])
    log.warning("remediation refused for %s/%s: %s", info.get("cluster"), info.get("node"), reason)
    return f"refused ({code}): {reason}"


def handle_event(event: Mapping[str, Any], ctx: Context) -> str:
    """Admit or refuse a remediation for one Unhealthy CloudEvent; returns what happened, for the log.

    Raises only Throttled/Transient (and Conflict when the admission record stays contended), which
    Event Grid's retry turns into a later, re-evaluated delivery.
    """
    policy = _policy(ctx)
    source = getattr(ctx.settings, "event_source", "/gpu-fleet-steward")
    if event.get("source") != source:
        return f"ignored: source {event.get('source')!r} is not {source!r}"
    if event.get("type") != UNHEALTHY_EVENT:
        return f"ignored: type {event.get('type')!r}"
    data = _event_data(event)
    cluster_id = str(data.get("cluster") or "")
    node_name = str(data.get("node") or "")
    condition = str(data.get("condition") or "")
    since = parse_time(data.get("since"))
    observed_at = parse_time(data.get("observed_at")) or parse_time(event.get("time")) or 0.0
    if not cluster_id or not node_name or not condition or since is None:
        return "ignored: malformed event (needs data.cluster, node, condition, since)"
    if condition not in policy.conditions:
        return f"ignored: condition {condition} is not configured (REMEDIATION_CONDITIONS)"

    from shared.fleet import scope

    try:
        cluster = ctx.access.aks().get_cluster(cluster_id)
    except NotFound:
        return f"ignored: cluster {cluster_id} does not exist"
    except Forbidden as exc:
        return f"ignored: cluster {cluster_id} cannot be read ({exc}): out of our reach"
    ok, why = scope.cluster_in_scope(cluster, ctx.settings)
    if not ok:
        return f"ignored: cluster {cluster_id} is out of scope ({why})"
    cluster_id = cluster.id

    now = ctx.clock.now()
    fleet_breaker = breaker.current(ctx)
    kube = ctx.access.kube(cluster_id)
    node = kube.get_node(node_name)
    if node is None:
        return f"ignored: node {node_name} no longer exists"
    evaluation = health.evaluate([node], now=now, policy=policy)
    finding = next((f for f in evaluation.unhealthy if f.condition == condition), None)
    info: dict[str, Any] = {"cluster": cluster_id, "node": node_name, "pool": health.pool_of(node), "condition": condition,
                            "since": iso(finding.since if finding else since), "event_id": str(event.get("id", ""))}
    if finding is None:
        skipped = next((r for n, r in evaluation.skipped), None)
        if skipped == health.SKIP_OPTED_OUT:
            info["fault"] = fault_id(cluster_id, node_name, condition, since)
            return _refuse(ctx, info, budget.PAUSED, _paused_reason(ctx, None, node, policy) or "opted out")
        if skipped:
            return f"ignored: node {node_name} is skipped ({skipped})"
        return f"ignored: {condition} on {node_name} is no longer True over its threshold"
    if finding.since > since + 1.0:
        return f"ignored: stale event ({condition} flapped since: now True since {iso(finding.since)})"
    info["fault"] = fault_id(cluster_id, node_name, condition, finding.since)
    # The free checks first: a backlog replayed after a breaker reset costs no ARM read per event.
    if breaker.is_stale(observed_at, fleet_breaker):
        return _refuse(ctx, info, "stale", f"observed at {iso(observed_at)}, before the breaker reset at "
                                           f"{iso(fleet_breaker.reset_at)}: dropped with the backlog")
    leaving = node_fate.going_away(node)
    if leaving:
        return _refuse(ctx, info, GOING_AWAY, f"{node_name} is being taken away by the platform: {leaving}",
                       warn=(kube, node))
    # Trust ARM, not the node: the pool it claims must be a User GPU pool in ARM, and its VM the one
    # ARM lists for it, in this cluster's own node resource group (shared/fleet/node_truth.py).
    verdict = _judge_node(ctx, cluster, node)
    if not verdict.ok:
        return _refuse(ctx, info, verdict.code, verdict.reason, warn=(kube, node))
    info["vm_id"] = verdict.vm_id
    paused = _paused_reason(ctx, cluster.tags, node, policy)
    return _admit(ctx, kube=kube, node=node, finding=finding, info=info, paused=paused,
                  breaker_open=fleet_breaker.is_open, policy=policy)




def _judge_node(ctx: Context, cluster: Any, node: NodeView) -> node_truth.Verdict:
    """:func:`node_truth.resolve` for admission, remembered a minute per process.

    The sweep re-reports a refused fault every minute; without this each report would cost two ARM
    reads (the pool and its machines). A cached answer is safe here: admission only cordons, and the
    VM action reads ARM again right before the call (:func:`_vm_id`). The key holds everything the
    verdict depends on (the node's uid, providerID and claimed pool; the cluster's node resource
    group and provisioning mode), so a changed node or cluster is judged afresh.
    """
    key = (cluster.id.lower(), cluster.subscription, cluster.node_resource_group, cluster.node_provisioning_mode,
           node.name, node.uid, node.provider_id, health.pool_of(node), str(health.is_karpenter_node(node)))
    now = ctx.clock.now()
    hit: node_truth.Verdict | None = ctx.caches.node_verdicts.get(key, now=now)
    if hit is not None:
        return hit
    verdict = node_truth.resolve(ctx.access.aks(), cluster, pool_name=health.pool_of(node), node_name=node.name,
                                 provider_id=node.provider_id, nap=health.is_karpenter_node(node))
    return ctx.caches.node_verdicts.put(key, verdict, now=now)


def _pool_unavailable(kube: KubePort, selector: str, policy: RemediationPolicy) -> tuple[int, set[str]]:
    size, unavailable = 0, set()
    for n in kube.list_nodes(label_selector=selector, page_size=policy.page_size):
        size += 1
        if not n.ready or n.unschedulable:
            unavailable.add(n.name)
    return size, unavailable


def _live_slots(ctx: Context, slots: Mapping[str, Mapping[str, Any]], now: float) -> dict[str, dict[str, Any]]:
    """Slots of remediations still active (a finished or vanished one frees its slot)."""
    live: dict[str, dict[str, Any]] = {}
    for rid, slot in slots.items():
        rec = ctx.ledger.get(KIND, rid)
        if rec is None:
            if now - float(slot.get("at", 0.0)) < SLOT_ORPHAN_S:
                live[rid] = dict(slot)  # being created right now by another host
            continue
        if rec.state in ACTIVE_STATES:
            live[rid] = dict(slot)
    return live


def _admit(ctx: Context, *, kube: KubePort, node: NodeView, finding: health.Finding, info: dict[str, Any],
           paused: str | None, breaker_open: bool, policy: RemediationPolicy) -> str:
    cluster_id, name, fault = info["cluster"], node.name, info["fault"]
    nk = node_key(cluster_id, name)
    pool = health.pool_of(node)
    pool_size, unavailable_now = _pool_unavailable(kube, health.pool_selector(node), policy)
    for _ in range(_ADMIT_TRIES):
        now = ctx.clock.now()
        node_rec = ctx.ledger.get(NODE_KIND, nk)
        nd = dict(node_rec.data) if node_rec else {"cluster": cluster_id, "node": name, "attempts": [], "faults": []}
        if fault in nd.get("faults", []):
            return f"duplicate: fault {fault[:12]} on {name} was already handled"
        attempts: list[dict[str, Any]] = list(nd.get("attempts", []))
        number = max(int(nd.get("count") or 0), len(attempts)) + 1
        rid = f"{nk}-{number}"
        existing = ctx.ledger.get(KIND, rid)
        if existing is not None:
            # A host crashed (or is) between creating the record and updating the node record: repair it.
            _note_attempt(ctx, node_rec, nd, existing)
            if existing.data.get("fault") == fault:
                return f"duplicate: remediation {rid} handles this fault"
            if existing.state in ACTIVE_STATES:
                return f"duplicate: remediation {rid} is in progress on {name}"
            continue
        last = ctx.ledger.get(KIND, attempts[-1]["id"]) if attempts else None
        if last is not None and last.state in ACTIVE_STATES:
            return f"duplicate: remediation {last.id} is in progress on {name}"

        budget_rec = ctx.ledger.get(BUDGET_KIND, BUDGET_ID)
        slots = _live_slots(ctx, (budget_rec.data.get("slots") if budget_rec else {}) or {}, now)
        in_pool = {s["node"] for s in slots.values() if s.get("cluster") == cluster_id and s.get("pool") == pool}
        node_check = budget.node_admission(attempts=[float(a["at"]) for a in attempts],
                                           last_finished_at=last.updated_at if last is not None else None,
                                           now=now, policy=policy)
        # At the attempt cap the node is not repaired again, but it must not keep taking workloads either:
        # it is cordoned (within the same budgets) and handed to an operator with a GaveUp alert.
        cap_reached = node_check.code == budget.ATTEMPTS
        admission = budget.admit(
            paused=paused, breaker_open=breaker_open,
            node=budget.Admission.ok(node_check.reason) if cap_reached else node_check,
            pool=budget.pool_admission(pool=pool, pool_size=pool_size, unavailable=unavailable_now | in_pool,
                                       candidate=name, policy=policy),
            fleet=budget.fleet_admission(in_flight=len(slots), policy=policy),
        )
        if not admission.allowed:
            return _refuse(ctx, info, admission.code, admission.reason)

        slots[rid] = {"cluster": cluster_id, "pool": pool, "node": name, "at": now}
        try:
            if budget_rec is None:
                ctx.ledger.create(Record(kind=BUDGET_KIND, id=BUDGET_ID, state="open", data={"slots": slots},
                                         created_at=now, updated_at=now))
            else:
                ctx.ledger.save(msgspec.structs.replace(budget_rec, data={"slots": slots}, updated_at=now))
        except Conflict:
            continue  # another admission took a slot first: re-read and re-decide
        record = _new_record(rid, node=node, finding=finding, info=info, attempt=number,
                             policy=policy, now=now, instance=ctx.instance,
                             cap_reached=node_check.reason if cap_reached else "")
        # Announce before the record exists: once written, any instance's reconciler may claim it and
        # report its first step, and a remediation's story must open with Admitted. A host racing this
        # one publishes the same deterministic id, which consumers dedupe.
        _publish(ctx, record, ADMITTED_EV, f"{node_check.reason}: cordon only" if cap_reached else admission.reason,
                 extra={"dry_run": policy.dry_run})
        try:
            record = ctx.ledger.create(record)
        except Conflict:
            continue  # same attempt created by another host: the next pass sees it
        _note_attempt(ctx, node_rec, nd, record)
        _metric(ctx, "time_to_admit_s", now - finding.since, condition=finding.condition)
        _metric(ctx, "remediations_in_flight", len(slots))
        log.info("remediation %s admitted for %s/%s (%s)", rid, cluster_id, name, admission.reason)
        return f"admitted: {rid}"
    raise Conflict("the admission record stayed contended; Event Grid will deliver again")


def _note_attempt(ctx: Context, node_rec: Record | None, nd: dict[str, Any], record: Record) -> None:
    """Remember the attempt and its fault on the per-node record (best effort: ids already dedupe)."""
    attempts = [a for a in nd.get("attempts", []) if a.get("id") != record.id]
    attempts.append({"id": record.id, "at": record.created_at, "fault": record.data.get("fault")})
    faults = [f for f in nd.get("faults", []) if f != record.data.get("fault")] + [record.data.get("fault")]
    count = max(int(nd.get("count") or 0), int(record.data.get("attempt") or 0))
    data = {**nd, "attempts": attempts[-20:], "faults": faults[-20:], "last_id": record.id, "count": count}
    try:
        if node_rec is None:
            ctx.ledger.create(Record(kind=NODE_KIND, id=node_key(nd["cluster"], nd["node"]), state="known", data=data,
                                     created_at=record.created_at, updated_at=record.created_at))
        else:
            ctx.ledger.save(msgspec.structs.replace(node_rec, data=data, updated_at=record.created_at))
    except Conflict:
        log.info("node record %s changed meanwhile; the next admission repairs it", nd["node"])


def _new_record(rid: str, *, node: NodeView, finding: health.Finding, info: Mapping[str, Any], attempt: int,
                policy: RemediationPolicy, now: float, instance: str, cap_reached: str = "") -> Record:
    data = {"cluster": info["cluster"], "node": node.name, "node_uid": node.uid, "pool": health.pool_of(node),
            "pool_selector": health.pool_selector(node), "nap": health.is_karpenter_node(node),
            "provider_id": node.provider_id, "arm_vm_id": str(info.get("vm_id") or ""),
            "condition": finding.condition, "since": iso(finding.since), "since_ts": finding.since,
            "fault": info["fault"], "event_id": info.get("event_id", ""), "attempt": attempt,
            "dry_run": policy.dry_run, "ladder": [] if cap_reached else list(policy.ladder), "rung_index": 0,
            "rung_phase": "start", "cap_reached": cap_reached, "admitted_by": instance, "admitted_at": now}
    return Record(kind=KIND, id=rid, state=ADMITTED, data=data, created_at=now, updated_at=now, next_at=now,
                  history=[{"at": now, "state": ADMITTED, "note": f"{finding.condition} True since {iso(finding.since)}"}])


# --------------------------------------------------------------------------- the step function


def _stay(record: Record, *, now: float, next_at: float, note: str | None = None, **data: Any) -> Record:
    """Same state, later: no history line unless there is news (waits are frequent)."""
    if note is not None and note != record.data.get("last_note"):
        return record.moved(record.state, at=now, note=note, next_at=next_at, last_note=note, **data)
    merged = {**record.data, **data}
    return msgspec.structs.replace(record, data=merged, next_at=next_at, updated_at=now)


def _move(record: Record, state: str, *, now: float, note: str, next_at: float | None = None, **data: Any) -> Record:
    return record.moved(state, at=now, note=note, next_at=now if next_at is None else next_at, last_note=note, **data)


def advance(record: Record, ctx: Context) -> Record:
    """One short, idempotent step of the remediation ``record`` (re-observing first)."""
    if record.state not in ACTIVE_STATES:
        return record
    policy = _policy(ctx)
    now = ctx.clock.now()
    d = record.data
    dry = bool(d.get("dry_run"))
    kube = ctx.access.kube(d["cluster"])
    paused = _paused_reason(ctx, _cluster_tags(ctx, d["cluster"]), None, policy)
    if paused and not dry:
        return _stay(record, now=now, next_at=now + max(60, policy.poll_s), note=f"waiting: {paused}")
    if not dry and not _take_lease(kube, record, policy):
        return _stay(record, now=now, next_at=now + policy.poll_s,
                     note=f"waiting: another actor holds the node lease {_lease_name(d['node'])}")
    step = {ADMITTED: _step_admitted, CORDONED: _step_cordoned, DRAINING: _step_draining,
            REPAIRING: _step_repairing, VERIFYING: _step_verifying}[record.state]
    try:
        stepped = step(record, ctx, kube=kube, policy=policy, now=now)
    except Forbidden as exc:
        stepped = _finish(record, ctx, kube, FAILED, now=now, event=FAILED_EV,
                          note=f"not allowed: {exc} (check the app's Azure role and Kubernetes RBAC); node left as is")
    if stepped.state != record.state and not dry and stepped.state not in TERMINAL_STATES:
        node = kube.get_node(d["node"])
        if node is not None:
            _annotate(kube, node, stepped, stepped.state, str(stepped.data.get("last_note", "")))
    return stepped


def _lease_name(node: str) -> str:
    return f"gpu-fleet-steward-{_label_value(node)}"


def _take_lease(kube: KubePort, record: Record, policy: RemediationPolicy) -> bool:
    """Take or renew the node lease (holder = this remediation, so any host advancing it may renew).

    The lease keeps other actors that honour it off the node. Between steward hosts the ledger claim
    and the one-remediation-per-node admission already guarantee a single writer, so a cluster
    without the lease namespace (``NotFound``) degrades to that guarantee, with a warning.
    """
    try:
        # in the app's own namespace (the adapter's; STEWARD_NAMESPACE), where its Role grants leases
        return kube.acquire_lease(_lease_name(record.data["node"]), holder=record.id, duration_s=policy.lease_s)
    except NotFound as exc:
        cluster = str(record.data["cluster"])
        if cluster not in _LEASELESS:
            _LEASELESS.add(cluster)
            log.warning("node leases unavailable on %s (%s): relying on the ledger claim", cluster, exc)
        return True


def _cluster_tags(ctx: Context, cluster_id: str) -> Mapping[str, str]:
    """The cluster's tags (for the pause tag), cached a minute per process."""
    now = ctx.clock.now()
    hit = ctx.caches.cluster_tags.get(cluster_id, now=now)
    if hit is not None:
        return hit
    try:
        tags = dict(ctx.access.aks().get_cluster(cluster_id).tags or {})
    except NotFound:
        tags = {}
    return ctx.caches.cluster_tags.put(cluster_id, tags, now=now)


def _finish(record: Record, ctx: Context, kube: KubePort, state: str, *, now: float, event: str, note: str,
            extra: Mapping[str, Any] | None = None, **data: Any) -> Record:
    """End the remediation: free its budget slot and node lease, tell the operator."""
    done = _move(record, state, now=now, note=note, next_at=now, finished_at=now, **data)
    _release_slot(ctx, record.id)
    _drop_pool_turn(ctx, record)
    if not record.data.get("dry_run"):
        try:
            kube.release_lease(_lease_name(record.data["node"]), holder=record.id)
        except StewardError as exc:
            log.info("lease of %s not released (it expires): %s", record.data["node"], exc)
        node = kube.get_node(record.data["node"])
        if node is not None:
            if state != DONE:
                _annotate(kube, node, done, state, note)
            _kube_event(kube, node, done, f"Steward{state.title().replace('_', '')}", note,
                        "Normal" if state in (DONE, RELEASED) else "Warning")
    _publish(ctx, done, event, note, key=state, extra=extra)
    _metric(ctx, "remediations_total", 1, outcome=state, condition=record.data.get("condition"),
            rung=_rung(record) or None, dry_run=bool(record.data.get("dry_run")))
    if state == DONE and not record.data.get("dry_run"):
        _metric(ctx, "time_to_repair_s", now - float(record.data.get("since_ts") or record.created_at),
                condition=record.data.get("condition"), rung=_rung(record))
    return done


def _release_slot(ctx: Context, rid: str) -> None:
    for _ in range(3):
        rec = ctx.ledger.get(BUDGET_KIND, BUDGET_ID)
        if rec is None or rid not in (rec.data.get("slots") or {}):
            return
        slots = {k: v for k, v in rec.data["slots"].items() if k != rid}
        try:
            ctx.ledger.save(msgspec.structs.replace(rec, data={"slots": slots}, updated_at=ctx.clock.now()))
            _metric(ctx, "remediations_in_flight", len(slots))
            return
        except Conflict:
            continue
    # Admissions drop slots of finished remediations anyway (_live_slots).


def _still_faulty(node: NodeView, d: Mapping[str, Any]) -> bool:
    cond = node.condition(d["condition"])
    return cond is not None and cond.status == "True" and (cond.last_transition or 0.0) <= float(d["since_ts"]) + 1.0


def _step_admitted(record: Record, ctx: Context, *, kube: KubePort, policy: RemediationPolicy, now: float) -> Record:
    d = record.data
    node = kube.get_node(d["node"])
    if node is None:
        return _finish(record, ctx, kube, RELEASED, now=now, event=FAILED_EV, note="the node no longer exists: nothing to do")
    if node.uid != d["node_uid"]:
        return _finish(record, ctx, kube, RELEASED, now=now, event=FAILED_EV,
                       note="the node was recreated under the same name: this fault is gone")
    if not _still_faulty(node, d):
        return _finish(record, ctx, kube, RELEASED, now=now, event=RECOVERED_EV,
                       note=f"{d['condition']} cleared before we touched the node: released")
    leaving = node_fate.going_away(node)
    if leaving:  # the platform started taking it away after the admission: not ours to touch
        return _finish(record, ctx, kube, REFUSED, now=now, event=REFUSED_EV,
                       note=f"refused ({GOING_AWAY}): the platform is taking {node.name} away ({leaving}); not cordoned",
                       refusal={"code": GOING_AWAY, "reason": leaving},
                       extra={"reason_code": GOING_AWAY, "reason": leaving})
    if d.get("dry_run"):
        note = f"dry run: would cordon {node.name} (marker {health.CORDONED_BY_LABEL}) and drain it"
        _publish(ctx, record, DRY_RUN_EV, note, key="cordon")
        return _move(record, CORDONED, now=now, note=note, cordoned_by_us=False)
    marker = node.annotations.get(health.CORDON_FOR_ANNOTATION, "")
    if health.cordoned_by_us(node) and node.unschedulable and marker == record.id:
        note = "cordoned (found our marker: resumed after a crash)"
        by_us = True
    elif health.cordoned_by_us(node) and node.unschedulable:
        # Still cordoned by an earlier remediation of ours (it gave up): adopt the cordon, so that this
        # remediation may lift it when the node recovers.
        kube.patch_node(node.name, {"metadata": {"resourceVersion": node.resource_version,
                                                 "annotations": {health.CORDON_FOR_ANNOTATION: record.id}}})
        note = f"already cordoned by our earlier remediation {marker}: adopted"
        by_us = True
    elif node.unschedulable:
        note = "already cordoned by someone else: it will be drained and repaired but never uncordoned by us"
        by_us = False
    else:
        reason = f"{d['condition']} True since {d['since']}"
        kube.patch_node(node.name, {
            "metadata": {"resourceVersion": node.resource_version,  # fails if anyone changed the node meanwhile
                         "labels": {health.CORDONED_BY_LABEL: _label_value(ctx.instance)},
                         "annotations": {health.CORDON_FOR_ANNOTATION: record.id,
                                         health.CORDON_REASON_ANNOTATION: reason,
                                         health.CORDON_AT_ANNOTATION: iso(now)}},
            "spec": {"unschedulable": True},
        })
        note = f"cordoned: {reason}"
        by_us = True
    _kube_event(kube, node, record, "StewardCordoned", note)
    _publish(ctx, record, CORDONED_EV, note, extra={"cordoned_by_us": by_us})
    return _move(record, CORDONED, now=now, note=note, cordoned_by_us=by_us, cordoned_at=now)


def _step_cordoned(record: Record, ctx: Context, *, kube: KubePort, policy: RemediationPolicy, now: float) -> Record:
    d = record.data
    node = kube.get_node(d["node"])
    if node is None or node.uid != d["node_uid"]:
        return _finish(record, ctx, kube, RELEASED, now=now, event=FAILED_EV, note="the node disappeared before the drain")
    if not d.get("dry_run") and not node.unschedulable:
        return _finish(record, ctx, kube, RELEASED, now=now, event=FAILED_EV,
                       note="someone uncordoned the node: respecting that and stopping (the fault is not handled)")
    if d.get("cap_reached"):
        return _finish(record, ctx, kube, GAVE_UP, now=now, event=GAVE_UP_EV,
                       note=f"{d['cap_reached']}: cordoned and not drained or repaired again; an operator must look "
                            f"(uncordon it or remove the node when done)")
    if not d.get("dry_run"):
        _kube_event(kube, node, record, "StewardDraining", "draining through the Eviction API (PDBs respected)")
    return _move(record, DRAINING, now=now, note="draining", drain={}, drain_started_at=now)


def _step_draining(record: Record, ctx: Context, *, kube: KubePort, policy: RemediationPolicy, now: float) -> Record:
    d = record.data
    node = kube.get_node(d["node"])
    if node is None or node.uid != d["node_uid"]:
        return _finish(record, ctx, kube, RELEASED, now=now, event=FAILED_EV, note="the node disappeared during the drain")
    pods = kube.list_pods(node_name=node.name)
    previous = drain.DrainState.from_data(d.get("drain"))
    # PDBs are read when the drain starts (a pod under two PDBs refuses the node before any eviction)
    # and while a budget refuses a pod (the stall report names the PDB and its status).
    pdbs = drain.fetch_pdbs(kube) if d.get("dry_run") or previous.started_at is None or previous.blocked else None
    if d.get("dry_run"):
        plan = drain.plan_drain(pods, policy, now=now, pdbs=pdbs)
        refusal = plan.refusal()
        note = (f"dry run: would evict {len(plan.evict)} pods ({', '.join(f'{p.namespace}/{p.name}' for p in plan.evict[:10])}), "
                f"skip {len(plan.skip)}, blocked by policy {len(plan.blocked)}"
                + (f"; would refuse the node and evict nothing: {refusal}" if refusal else ""))
        _publish(ctx, record, DRY_RUN_EV, note, key="drain")
        return _move(record, REPAIRING, now=now, note=note, rung_index=0, rung_phase="start")
    state, actions = drain.drain_step(node=node.name, pods=pods, previous=previous, now=now, policy=policy, pdbs=pdbs)
    by_uid = {p.uid: p for p in pods}

    def evict(action: drain.Evict) -> EvictionResult:
        try:
            return kube.evict(action.namespace, action.name)
        except NotFound:
            return EvictionResult(outcome="gone")
        except Throttled as exc:
            return EvictionResult(outcome="blocked", message=str(exc), retry_after=exc.retry_after)

    for action, result in drain.evict_all(evict, actions):
        pod = by_uid.get(action.uid)
        state = drain.record_eviction(state, action, result, now=now,
                                      grace=pod.grace_period_seconds if pod else None, policy=policy)
    new_blocks = [m for k, m in state.messages.items() if previous.messages.get(k) != m and k != "_deadline"]
    if state.outcome not in (drain.REFUSED, drain.STALLED):
        for message in new_blocks[:3]:
            _kube_event(kube, node, record, "StewardDrainWaiting", message, "Warning")
    if state.outcome == drain.DRAINED:
        started = float(d.get("drain_started_at") or now)
        _metric(ctx, "drain_time_s", now - started)
        note = f"drained in {now - started:.0f}s"
        _kube_event(kube, node, record, "StewardDrained", note)
        _publish(ctx, record, DRAINED_EV, note)
        return _move(record, REPAIRING, now=now, note=note, drain=state.to_data(), rung_index=0, rung_phase="start")
    if state.outcome in (drain.TIMED_OUT, drain.REFUSED, drain.STALLED):
        message = state.reason or state.messages.get("_deadline", "drain deadline reached")
        if state.outcome != drain.TIMED_OUT:  # say why before the fallback's own event
            _kube_event(kube, node, record, "StewardDrainRefused" if state.outcome == drain.REFUSED
                        else "StewardDrainBlocked", message, "Warning")
        if policy.drain_fallback == "release":
            _uncordon_if_ours(kube, record)
            return _finish(record, ctx, kube, RELEASED, now=now, event=FAILED_EV, drain=state.to_data(),
                           drain_outcome=state.outcome,
                           note=f"{message}; fallback release: uncordoned (if we cordoned it), nothing repaired")
        return _finish(record, ctx, kube, GAVE_UP, now=now, event=GAVE_UP_EV, drain=state.to_data(),
                       drain_outcome=state.outcome,
                       note=f"{message}; fallback hold: the node stays cordoned, move or evict these pods, then "
                            f"uncordon or repair it yourself")
    wake = state.wake_at if state.wake_at is not None else now + policy.poll_s
    return _stay(record, now=now, next_at=max(wake, now + 1.0), drain=state.to_data(),
                 note=f"draining: {len(state.remaining)} pods still on the node")


# --------------------------------------------------------------------------- the ladder


def _vm_id(ctx: Context, node: NodeView | None, d: Mapping[str, Any]) -> node_truth.Verdict:
    """The VM to restart or reimage, from ARM, re-checked right before the call (never the node's word).

    ARM's machines of the record's pool give the VM; it must be in the cluster's own subscription and
    node resource group, and the node's providerID must name it (the one recorded at admission when
    the node is not registered right now, e.g. while it is being reimaged). See shared/fleet/node_truth.py.
    """
    aks = ctx.access.aks()
    cluster = aks.get_cluster(d["cluster"])
    provider_id = node.provider_id if node is not None else str(d.get("provider_id") or "")
    return node_truth.resolve(aks, cluster, pool_name=str(d["pool"]), node_name=str(d["node"]),
                              provider_id=provider_id, nap=False)


def _admitted_vm(ctx: Context, node: NodeView | None, d: Mapping[str, Any], *, action: str) -> node_truth.Verdict:
    """:func:`_vm_id`, refused unless the node is still the one admitted: the same Node object (uid) when
    it is registered, and ARM's VM for it the VM admitted (``arm_vm_id``). A Node re-registered since
    lost our cordon, so pods may have landed on it that never went through the Eviction API: restarting,
    reimaging or deleting its VM would kill them. Right before any VM action (and deleteMachines)."""
    if node is not None and d.get("node_uid") and node.uid != d["node_uid"]:
        return node_truth.Verdict.refuse(node_truth.NODE_RECREATED, (
            f"{d['node']} is now Node uid {node.uid}, not the Node {d['node_uid']} admitted and cordoned: it "
            f"re-registered (our cordon is gone, its pods were not drained): not {action}"))
    verdict = _vm_id(ctx, node, d)
    admitted = str(d.get("arm_vm_id") or "")
    if verdict.ok and admitted and verdict.vm_id.lower() != admitted.lower():
        return node_truth.Verdict.refuse(node_truth.NOT_A_MACHINE, (
            f"ARM's machine {d['node']} of pool {d['pool']} is now VM {verdict.vm_id}, not the VM "
            f"{admitted} admitted: not {action}"))
    return verdict


def _refuse_untrusted(record: Record, ctx: Context, kube: KubePort, *, now: float,
                      verdict: node_truth.Verdict) -> Record:
    """End a remediation whose node ARM contradicts: Refused (with the code), a Warning on the node, no
    VM action. A cordon of ours stays for an operator: the node's identity is in doubt."""
    return _finish(record, ctx, kube, REFUSED, now=now, event=REFUSED_EV,
                   note=f"refused ({verdict.code}): {verdict.reason}; no VM was touched",
                   refusal={"code": verdict.code, "reason": verdict.reason},
                   extra={"reason_code": verdict.code, "reason": verdict.reason})


def _next_rung(record: Record, ctx: Context, kube: KubePort, *, now: float, why: str) -> Record:
    d = record.data
    i = int(d.get("rung_index") or 0) + 1
    ladder = d.get("ladder") or []
    rung = _rung(record)
    _kube_event(kube, d["node"], record, "StewardRungFailed", f"{rung} did not repair the node: {why}", "Warning")
    if i >= len(ladder):
        return _give_up(record, ctx, kube, now=now, note=f"every rung failed (last: {rung}: {why}); the node stays cordoned")
    _drop_pool_turn(ctx, record)
    return _move(record, REPAIRING, now=now, note=f"{rung} failed ({why}); escalating to {ladder[i]}",
                 rung_index=i, rung_phase="start", replace={}, rung_entered_at=now)


def _escalate_to_replace(record: Record, ctx: Context, kube: KubePort, *, now: float, code: str, why: str) -> Record:
    """A rung Azure denies (403: RBAC, a deny assignment such as node resource group lockdown, a policy)
    or cannot do on this VM (409: e.g. a deallocated spot VM) will not work on retry, and neither will
    the next VM-level rung: go straight to ``replace``, which goes through the AKS API (deleteMachines,
    or the NodeClaim on node auto-provisioning), with the reason in the record and the events."""
    d = record.data
    rung = _rung(record)
    ladder = list(d.get("ladder") or [])
    i = int(d.get("rung_index") or 0)
    escalation = {"from": rung, "code": code, "reason": why[:500], "at": now}
    message = f"{rung} is not possible on this node ({code}: {why[:300]})"
    _kube_event(kube, d["node"], record, "StewardRungDenied", message, "Warning")
    if "replace" not in ladder[i + 1:]:
        record = msgspec.structs.replace(record, data={**d, "escalation": escalation})
        return _give_up(record, ctx, kube, now=now,
                        note=f"{message}; no replace rung left on the ladder (REMEDIATION_LADDER): the node stays "
                             f"cordoned")
    _drop_pool_turn(ctx, record)
    return _move(record, REPAIRING, now=now, note=f"{message}; escalating to replace through the AKS API",
                 rung_index=ladder.index("replace", i + 1), rung_phase="start", replace={}, rung_entered_at=now,
                 escalation=escalation)


def _give_up(record: Record, ctx: Context, kube: KubePort, *, now: float, note: str) -> Record:
    policy = _policy(ctx)
    attempts = int(record.data.get("attempt") or 1)
    if attempts >= policy.max_attempts:
        note += f"; {attempts} attempts used (BUDGET_NODE_MAX_ATTEMPTS={policy.max_attempts}): an operator must look at it"
    return _finish(record, ctx, kube, GAVE_UP, now=now, event=GAVE_UP_EV, note=note)


class _BestEffortKube:
    """The node's cluster for the clean-up of a record that is given up: a call that fails is logged and
    skipped (the permanent error that led here may well be the cluster's own answer)."""

    def __init__(self, ctx: Context, cluster_id: str) -> None:
        self._kube: KubePort | None = None
        try:
            self._kube = ctx.access.kube(cluster_id)
        except StewardError as exc:
            log.info("cluster %s not reachable for the give-up clean-up: %s", cluster_id, exc)

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._kube, name, None) if self._kube is not None else None

        def call(*args: Any, **kwargs: Any) -> Any:
            if target is None:
                return None
            try:
                return target(*args, **kwargs)
            except StewardError as exc:
                log.info("give-up clean-up: %s failed: %s", name, exc)
                return None
        return call


def give_up(record: Record, ctx: Context, *, reason: str) -> Record:
    """The reconciler's hook after RECONCILE_MAX_PERMANENT_TRIES permanent errors in a row: ``gave_up``.

    Same ending as a ladder that ran out (:func:`_give_up`): the budget slot, the pool's replace turn
    and the node lease are released, a GaveUp event and a Warning on the node say why. A node the app
    cordoned stays cordoned for an operator (our marker tells them whose cordon it is); a node someone
    else cordoned, or that was never cordoned, is left exactly as it is. Clean-up calls to the cluster
    are best effort: the permanent error may be the cluster's own refusal.
    """
    if record.state not in ACTIVE_STATES:
        return record
    now = ctx.clock.now()
    kube: Any = _BestEffortKube(ctx, str(record.data.get("cluster") or ""))
    held = ("the node stays cordoned (the app cordoned it) for an operator" if record.data.get("cordoned_by_us")
            else "the node is left as it was")
    return _give_up(record, ctx, kube, now=now, note=f"{reason}; gave up: {held}")


def _step_repairing(record: Record, ctx: Context, *, kube: KubePort, policy: RemediationPolicy, now: float) -> Record:
    d = record.data
    rung = _rung(record)
    if not rung:
        return _give_up(record, ctx, kube, now=now, note="no rung left on the ladder")
    if d.get("dry_run"):
        note = f"dry run: would {rung} {d['node']} (ladder {', '.join(d.get('ladder') or [])}); nothing was changed"
        return _finish(record, ctx, kube, DONE, now=now, event=DRY_RUN_EV, note=note)
    if d.get("rung_entered_at") is None:  # the first step of the ladder's first rung
        record = msgspec.structs.replace(record, data={**d, "rung_entered_at": now})
        d = record.data
    entered = float(d["rung_entered_at"])
    if d.get("rung_phase", "start") in ("start", REQUESTED) and now >= entered + policy.rung_timeout(rung):
        # The phases before the rung's action took hold (Azure answering "busy", the pool's replace turn,
        # a request that never showed) are bounded by the rung's timeout from when the ladder reached it;
        # the later phases by the same timeout from the action (checked where they observe the node),
        # so a rung that never completes moves on: nothing is re-issued forever.
        return _next_rung(record, ctx, kube, now=now,
                          why=f"not completed within {policy.rung_timeout(rung)}s "
                              f"(REMEDIATION_RUNG_TIMEOUTS; phase {d.get('rung_phase', 'start')}: "
                              f"{str(d.get('last_note') or '')[:200]})")
    if d.get("nap") and rung != "replace":
        # A node auto-provisioning node is a standalone VM that Karpenter owns (not a VMSS instance):
        # there is no VMSS VM to restart or reimage; Karpenter's way is to delete its NodeClaim.
        return _escalate_to_replace(record, ctx, kube, now=now, code="KarpenterNode",
                                    why=f"{d['node']} is a Karpenter (node auto-provisioning) node, a standalone VM "
                                        f"({d.get('provider_id') or 'no providerID'}): it is replaced by deleting its "
                                        f"NodeClaim")
    if rung == "replace":
        return _step_replace(record, ctx, kube=kube, policy=policy, now=now)
    phase = d.get("rung_phase", "start")
    node = kube.get_node(d["node"])
    if phase == REQUESTED and d.get("vm_id"):
        # Judged from the node and the VM recorded with the request; ARM is read again only if the
        # request is issued once more (in _issue_vm_action, right before the call).
        return _check_requested(record, ctx, kube, node=node, vm=str(d["vm_id"]), rung=rung,
                                seq=int(d.get("op_seq") or 1), requested_at=float(d.get("requested_at") or now),
                                boot_before=str(d.get("boot_id_before") or ""), policy=policy, now=now)
    if phase in ("start", REQUESTED):
        return _issue_vm_action(record, ctx, kube, node=node, rung=rung, seq=int(d.get("op_seq") or 1)
                                if phase == REQUESTED else 1, policy=policy, now=now)
    started = float(d.get("rung_started_at") or now)
    if node is not None:
        # Same VM, same name: a reimage may re-register the Node object (new uid), which counts as rebooted.
        recovered, why = health.is_recovered(node, policy=policy)
        ready = node.condition("Ready")
        rebooted = ((ready is not None and (ready.last_transition or 0.0) >= started) or node.uid != d["node_uid"]
                    or _booted_since(node, str(d.get("boot_id_before") or "")))
        if recovered and (rebooted or now - started >= policy.settle_s):
            note = f"{rung} repaired the node in {now - started:.0f}s ({why})"
            _kube_event(kube, node, record, f"Steward{RUNG_EVENTS[rung]}", note)
            _publish(ctx, record, RUNG_EVENTS[rung], note)
            return _move(record, VERIFYING, now=now, note=note, verify_since=now, target=node.name)
    else:
        why = "the node is not registered (yet)"
    if now >= started + policy.rung_timeout(rung):
        return _next_rung(record, ctx, kube, now=now, why=f"not recovered within {policy.rung_timeout(rung)}s ({why})")
    return _stay(record, now=now, next_at=now + policy.poll_s, note=f"waiting for {rung}: {why}")


# Restart / reimage at most once per rung, across crashes. The reconciler saves a step's result only
# after the step returns, so a host killed inside begin_restart would leave the rung at "start" and its
# successor would restart the VM again. So before the call the step inserts an operation marker (kind
# ``dedupe``, id ``op-<remediation>-<rung index>-<rung>-<n>``; insert-if-absent is atomic): whoever
# finds the marker already there knows the call may have gone out, and never calls blindly. It moves to
# ``rung_phase=requested`` and decides from the node: a reboot or reimage shows as a Ready transition
# at or after the request time (the node controller marks a silent kubelet Unknown within its
# node-monitor-grace-period, 40-50 s, and a GPU VM takes longer than that to boot) or as a new Node
# uid (a reimage may re-register); that means it happened -> ``wait``. Only a node that is still the
# same object and has stayed Ready since before the request, once the grace below has passed, is
# positive evidence that the call never took effect: then it is issued once more, under marker n+1.
# Anything else (node gone, not Ready, no Ready condition) is not evidence either way, so it is not
# repeated; the rung's timeout escalates if the node does not recover.
REQUESTED = "requested"


def _reissue_grace(policy: RemediationPolicy) -> float:
    """How long after a request a restart/reimage that happened must have shown on the node."""
    return max(policy.settle_s, 2 * policy.poll_s)


def _op_key(record: Record, rung: str, seq: int) -> str:
    return f"op-{record.id}-{int(record.data.get('rung_index') or 0)}-{rung}-{seq}"


def _booted_since(node: NodeView, boot_before: str) -> bool:
    """The node's bootID differs from the one seen before the request: it booted, however briefly."""
    return bool(boot_before and node.boot_id and node.boot_id != boot_before)


def _vm_action_seen(node: NodeView | None, d: Mapping[str, Any], *, since: float,
                    boot_before: str = "") -> tuple[bool, str]:
    """(whether the node cannot rule out a restart/reimage requested at ``since``, why).

    ``boot_before`` is the node's bootID read just before the request: a reboot fast enough that
    Ready never left True (and so kept its transition time) still changes it.
    """
    if node is None:
        return True, "the node is not registered (reimaging, or removed)"
    if node.uid != d["node_uid"]:
        return True, "the node re-registered (new uid)"
    if _booted_since(node, boot_before):
        return True, "the node booted again (new bootID)"
    ready = node.condition("Ready")
    if ready is None or ready.last_transition is None:
        return True, "the node's Ready condition has no transition time"
    if ready.last_transition >= since:
        return True, f"Ready turned {ready.status} at {iso(ready.last_transition)}"
    if ready.status != "True":
        return True, f"the node is not Ready ({ready.status})"
    return False, f"Ready has stayed True since {iso(ready.last_transition)}, before the request"


def _forget_marker(ctx: Context, marker: Record) -> None:
    """Azure answered without acting: drop the marker so the next try may call (best effort)."""
    try:
        ctx.ledger.delete(marker)
    except StewardError as exc:  # the next try treats the call as uncertain: slower, still safe
        log.info("operation marker %s not dropped: %s", marker.id, exc)


def _issue_vm_action(record: Record, ctx: Context, kube: KubePort, *, node: NodeView | None, rung: str,
                     seq: int, policy: RemediationPolicy, now: float) -> Record:
    """Read the VM from ARM (refused unless the node and its VM are still the ones admitted), insert the
    operation marker, then call begin_restart / begin_reimage (see the comment above)."""
    d = record.data
    verdict = _admitted_vm(ctx, node, d, action="restarted" if rung == "restart" else "reimaged")
    if not verdict.ok:
        return _refuse_untrusted(record, ctx, kube, now=now, verdict=verdict)
    vm = verdict.vm_id
    key = _op_key(record, rung, seq)
    boot = node.boot_id if node is not None else ""
    try:
        marker = ctx.ledger.create(Record(kind=DEDUPE_KIND, id=key, state=REQUESTED, created_at=now, updated_at=now,
                                          data={"remediation": record.id, "rung": rung, "vm_id": vm,
                                                "requested_at": now, "by": ctx.instance, "boot_id": boot}))
    except Conflict:
        prior = ctx.ledger.get(DEDUPE_KIND, key)
        at = float(prior.data.get("requested_at") or prior.created_at) if prior is not None else now
        before = str(prior.data.get("boot_id") or "") if prior is not None else ""
        return _check_requested(record, ctx, kube, node=node, vm=vm, rung=rung, seq=seq, requested_at=at,
                                boot_before=before, policy=policy, now=now)
    compute = ctx.access.compute()
    try:
        # cluster_id: the gate then requires the VM in this cluster's own node resource group
        (compute.begin_restart if rung == "restart" else compute.begin_reimage)(vm, cluster_id=str(d["cluster"]))
    except VmActionDenied as exc:
        _forget_marker(ctx, marker)  # Azure answered without acting
        return _escalate_to_replace(record, ctx, kube, now=now, code=str(exc.code or "denied"),
                                    why=f"Azure denied the {rung}: {exc}")
    except VmActionImpossible as exc:
        _forget_marker(ctx, marker)  # Azure answered without acting
        # 409 OperationNotAllowed says only "not in the VM's current state". Escalate on the node's own
        # evidence that its VM cannot act (stopped or deallocated, e.g. an evicted spot VM: the cloud node
        # lifecycle controller's shutdown taint; or no Node at all); otherwise the VM is busy with
        # something else: wait, bounded by the rung's timeout (_step_repairing).
        now_node = kube.get_node(d["node"])
        if now_node is None or node_fate.is_shut_down(now_node):
            state = "is not registered" if now_node is None else "is shut down (its VM is stopped or deallocated)"
            return _escalate_to_replace(record, ctx, kube, now=now, code=str(exc.code or "impossible"),
                                        why=f"Azure cannot do the {rung} and the node {state}: {exc}")
        return _stay(record, now=now, next_at=now + policy.poll_s,
                     note=f"waiting to {rung}: Azure cannot do it in the VM's current state ({exc}); the node "
                          f"shows no shutdown, so it is taken as busy")
    except OperationInProgress as exc:
        _forget_marker(ctx, marker)  # Azure answered without acting: another operation runs
        return _stay(record, now=now, next_at=now + policy.poll_s, note=f"waiting to {rung}: {exc}")
    except Invalid as exc:
        _forget_marker(ctx, marker)
        return _next_rung(record, ctx, kube, now=now, why=f"Azure refused the {rung}: {exc}")
    except NotFound as exc:
        _forget_marker(ctx, marker)
        return _next_rung(record, ctx, kube, now=now, why=f"Azure refused the {rung}: {exc}")
    except Throttled:
        _forget_marker(ctx, marker)
        raise
    except Transient as exc:  # it may have reached Azure: judge by the node, never by a second call
        return _move(record, REPAIRING, now=now, next_at=now + policy.poll_s, rung_phase=REQUESTED,
                     requested_at=now, op_seq=seq, vm_id=vm, boot_id_before=boot,
                     note=f"the {rung} call for {vm} failed in transit ({exc}): watching the node for it")
    note = f"{rung} of {vm} started" + (f" (issued again: request {seq - 1} never took effect)" if seq > 1 else "")
    _kube_event(kube, node or d["node"], record, f"Steward{rung.title()}Started", note)
    return _move(record, REPAIRING, now=now, next_at=now + policy.poll_s, note=note, rung_phase="wait",
                 rung_started_at=now, requested_at=now, op_seq=seq, vm_id=vm, boot_id_before=boot)


def _check_requested(record: Record, ctx: Context, kube: KubePort, *, node: NodeView | None, vm: str, rung: str,
                     seq: int, requested_at: float, boot_before: str, policy: RemediationPolicy,
                     now: float) -> Record:
    """A restart/reimage may have been issued at ``requested_at`` by a step whose result was lost."""
    d = record.data
    fields: dict[str, Any] = {"requested_at": requested_at, "op_seq": seq, "vm_id": vm, "boot_id_before": boot_before}
    seen, why = _vm_action_seen(node, d, since=requested_at, boot_before=boot_before)
    if seen:
        note = f"{rung} of {vm} requested at {iso(requested_at)} by a step that did not finish: {why}; not repeated"
        _kube_event(kube, node or d["node"], record, f"Steward{rung.title()}Started", note)
        return _move(record, REPAIRING, now=now, next_at=now + policy.poll_s, note=note, rung_phase="wait",
                     rung_started_at=requested_at, **fields)
    grace_end = requested_at + _reissue_grace(policy)
    if now < grace_end:
        note = (f"{rung} of {vm} requested at {iso(requested_at)} by a step that did not finish: "
                f"waiting until {iso(grace_end)} for it to show ({why})")
        next_at = min(grace_end, now + policy.poll_s)
        if d.get("rung_phase") == REQUESTED:
            return _stay(record, now=now, next_at=next_at, note=note, **fields)
        return _move(record, REPAIRING, now=now, next_at=next_at, note=note, rung_phase=REQUESTED, **fields)
    log.warning("%s of %s requested at %s never took effect (%s): issuing it again", rung, vm, iso(requested_at), why)
    return _issue_vm_action(record, ctx, kube, node=node, rung=rung, seq=seq + 1, policy=policy, now=now)


def _pool_body(pool: PoolInfo, count: int) -> dict[str, Any]:
    """The pool's own GET body (every field; read on the api-version that shows them all) with only
    ``count`` changed: a PUT is create-or-replace, so a field left out would be reset. The adapter
    sends it on the preview api-version when it carries a preview-only field (a MIG pool)."""
    from shared.fleet.pool_clone import update_properties

    return {"properties": update_properties(pool, count=count)}


# One replace per pool at a time. A replace reads the pool's count at its start and takes "a node of the
# pool created after the rung started" as its replacement, so two replaces overlapping in one pool see
# each other's count changes and new nodes (soak seed 1040: a delete-first replace dropped the count, a
# surge started from the lowered count, and both took the surge node). So a replace leaves its start
# only with the pool's turn: no other active remediation of the pool is in its replace rung past its
# start (read from the ledger), and it holds the turn marker (kind ``dedupe``, id
# ``replace-turn-<sha256(cluster/pool)>``, insert-if-absent, so of two records starting at once exactly
# one gets it). The marker is dropped when the holder finishes or leaves the rung; a marker whose holder
# is no longer active in its replace rung (a lost drop) is stale and taken over. Independently, a
# replacement node is claimed with an insert-if-absent marker (``replacement-<sha256(cluster/node/uid)>``)
# before a remediation takes it: a node is never the replacement of two remediations.
TURN_PREFIX, CLAIM_PREFIX = "replace-turn-", "replacement-"


def _turn_key(cluster_id: str, pool: str) -> str:
    return TURN_PREFIX + hashlib.sha256(f"{cluster_id.lower()}/{pool}".encode()).hexdigest()[:24]


def _claim_key(cluster_id: str, node: NodeView) -> str:
    return CLAIM_PREFIX + hashlib.sha256(f"{cluster_id.lower()}/{node.name}/{node.uid}".encode()).hexdigest()[:32]


def _replacing(record: Record) -> bool:
    """Whether ``record`` is in its replace rung past the start (it may be changing its pool's count)."""
    return (record.state in (REPAIRING, VERIFYING) and _rung(record) == "replace"
            and record.data.get("rung_phase", "start") != "start")


def _same_pool(record: Record, d: Mapping[str, Any]) -> bool:
    return (str(record.data.get("cluster", "")).lower() == str(d["cluster"]).lower()
            and record.data.get("pool") == d["pool"])


def _take_pool_turn(record: Record, ctx: Context, *, now: float) -> str | None:
    """Take the pool's replace turn for ``record``; None when taken (or already ours), else whom we wait for."""
    d = record.data
    for other in ctx.ledger.list(KIND, states=sorted(ACTIVE_STATES)):
        if other.id != record.id and _same_pool(other, d) and _replacing(other):
            return other.id
    key = _turn_key(d["cluster"], d["pool"])
    for _ in range(3):
        try:
            ctx.ledger.create(Record(kind=DEDUPE_KIND, id=key, state="held", created_at=now, updated_at=now,
                                     data={"remediation": record.id, "cluster": d["cluster"], "pool": d["pool"],
                                           "at": now, "by": ctx.instance}))
            return None
        except Conflict:
            turn = ctx.ledger.get(DEDUPE_KIND, key)
        if turn is None:
            continue  # dropped meanwhile: try again
        holder = str(turn.data.get("remediation") or "")
        if holder == record.id:
            return None  # ours (a step that took it did not finish)
        other = ctx.ledger.get(KIND, holder) if holder else None
        if other is not None and other.state in (REPAIRING, VERIFYING) and _rung(other) == "replace":
            return holder
        try:  # the holder finished or left its replace rung and its drop was lost: stale
            ctx.ledger.delete(turn)
        except Conflict:
            continue
    return "another remediation"


def _drop_pool_turn(ctx: Context, record: Record) -> None:
    """Give the pool's replace turn back if ``record`` holds it (best effort: a stale turn is taken over)."""
    d = record.data
    if d.get("dry_run") or _rung(record) != "replace" or not d.get("pool"):
        return
    try:
        turn = ctx.ledger.get(DEDUPE_KIND, _turn_key(d["cluster"], d["pool"]))
        if turn is not None and turn.data.get("remediation") == record.id:
            ctx.ledger.delete(turn)
    except StewardError as exc:
        log.info("replace turn of pool %s not dropped (it is taken over when stale): %s", d["pool"], exc)


def _claim(ctx: Context, record: Record, node: NodeView, *, now: float) -> bool:
    """Claim ``node`` as ``record``'s replacement; False when another remediation claimed it first."""
    key = _claim_key(record.data["cluster"], node)
    try:
        ctx.ledger.create(Record(kind=DEDUPE_KIND, id=key, state="claimed", created_at=now, updated_at=now,
                                 data={"remediation": record.id, "cluster": record.data["cluster"],
                                       "pool": record.data["pool"], "node": node.name, "uid": node.uid}))
        return True
    except Conflict:
        prior = ctx.ledger.get(DEDUPE_KIND, key)
        return prior is not None and prior.data.get("remediation") == record.id


def _replacement(ctx: Context, record: Record, kube: KubePort, *, since: float, policy: RemediationPolicy,
                 now: float) -> NodeView | None:
    """A node of the pool created after the rung started, Ready, healthy, with GPUs, and claimed by us."""
    d = record.data
    selector = str(d.get("pool_selector") or f"{POOL_LABEL}={d['pool']}")
    for n in kube.list_nodes(label_selector=selector, page_size=policy.page_size):
        if n.name == d["node"] or n.created < since - 1.0:
            continue
        if health.is_recovered(n, policy=policy)[0] and _claim(ctx, record, n, now=now):
            return n
    return None


def _step_replace(record: Record, ctx: Context, *, kube: KubePort, policy: RemediationPolicy, now: float) -> Record:
    """Surge-first replace: count+1, wait for the new node, delete the broken machine (count back to N).

    Without quota (or for autoscaled pools) it is delete-then-scale: delete the machine, then PUT the
    original count back, and the pool is one node short until the new VM is allocated.
    """
    d = record.data
    rep: dict[str, Any] = dict(d.get("replace") or {})
    phase = d.get("rung_phase", "start")
    started = float(d.get("rung_started_at") or now)
    if d.get("nap"):
        # The rung's timeout runs from the NodeClaim's delete (rung_started_at): a node Karpenter never
        # terminates must not hold the ladder forever. ``await_replacement`` (the node is gone) ends on
        # its own once the settle time has passed.
        if phase not in ("start", "await_replacement") and now >= started + policy.rung_timeout("replace"):
            return _next_rung(record, ctx, kube, now=now,
                              why=f"replacement not finished within {policy.rung_timeout('replace')}s (phase "
                                  f"{phase}; NodeClaim {rep.get('nodeclaim') or '?'} deleted, {d['node']} not "
                                  f"terminated)")
        return _step_replace_nodeclaim(record, ctx, kube=kube, policy=policy, now=now)
    aks = ctx.access.aks()
    pool = aks.get_pool(d["cluster"], d["pool"])
    if pool is None:
        return _next_rung(record, ctx, kube, now=now, why=f"pool {d['pool']} not found")
    if phase != "start" and now >= started + policy.rung_timeout("replace"):
        return _next_rung(record, ctx, kube, now=now,
                          why=f"replacement not finished within {policy.rung_timeout('replace')}s (phase {phase}; "
                              f"pool count {pool.count}, was {rep.get('original_count')})")

    def go(next_phase: str, note: str, wait: bool = False, **extra: Any) -> Record:
        rep.update(extra)
        return _move(record, REPAIRING, now=now, note=note, next_at=now + policy.poll_s if wait else now,
                     rung_phase=next_phase, replace=rep)

    if phase == "start":
        waiting_for = _take_pool_turn(record, ctx, now=now)
        if waiting_for is not None:
            return _stay(record, now=now, next_at=now + policy.poll_s,
                         note=f"waiting: remediation {waiting_for} is replacing a node of pool {d['pool']} "
                              f"(one replace per pool at a time)")
        autoscaled = bool(pool.properties.get("enableAutoScaling"))
        surge = policy.surge and not autoscaled
        mode = "surge" if surge else "delete-first"
        note = (f"replacing {d['node']}: surge to {pool.count + 1} first" if surge else
                f"replacing {d['node']}: delete then restore count {pool.count}"
                + (" (autoscaled pool: the autoscaler owns the count)" if autoscaled else ""))
        rep = {"original_count": pool.count, "target_count": pool.count + 1, "mode": mode, "autoscaled": autoscaled}
        return _move(record, REPAIRING, now=now, note=note, rung_phase="surge" if surge else "delete",
                     rung_started_at=now, replace=rep)
    if phase in ("surge", "delete", "scale_back") and pool.provisioning_state in _BUSY_POOL_STATES:
        return _stay(record, now=now, next_at=now + policy.poll_s,
                     note=f"waiting: pool {d['pool']} is {pool.provisioning_state}")
    if phase == "surge":
        if pool.count < int(rep["target_count"]):
            try:
                # If-Match the pool as read: 412 (it changed since: another scale, an operator's edit)
                # -> Conflict: look again
                aks.begin_put_pool(d["cluster"], d["pool"], _pool_body(pool, int(rep["target_count"])),
                                   etag=pool_etag(pool))
            except OperationInProgress as exc:
                return _stay(record, now=now, next_at=now + policy.poll_s, note=f"waiting: {exc}")
            except Invalid as exc:
                if isinstance(exc, (QuotaExceeded, AllocationFailed)) or exc.code in _SURGE_FALLBACK_CODES:
                    note = (f"surge refused ({exc.code or 'Invalid'}: {exc}): falling back to delete-then-scale; "
                            f"the pool is one GPU node short until the new VM is allocated")
                    _kube_event(kube, d["node"], record, "StewardSurgeFallback", note, "Warning")
                    return go("delete", note, mode="delete-first", surge_error=str(exc)[:300])
                raise
        return go("surge_wait", f"pool {d['pool']} scaling to {rep['target_count']}", wait=True)
    if phase == "surge_wait":
        new = _replacement(ctx, record, kube, since=started, policy=policy, now=now)
        if new is not None:
            return go("delete", f"replacement {new.name} is Ready with GPUs: deleting {d['node']}", replacement=new.name)
        if pool.provisioning_state == "Failed":
            note = "the surge failed to provision: falling back to delete-then-scale"
            _kube_event(kube, d["node"], record, "StewardSurgeFallback", note, "Warning")
            return go("delete", note, mode="delete-first")
        return _stay(record, now=now, next_at=now + policy.poll_s, note="waiting for the surge node")
    if phase == "delete":
        node = kube.get_node(d["node"])
        if node is not None and node.uid == d["node_uid"] and node.deletion_timestamp is None:
            # deleteMachines takes no If-Match (AgentPools_DeleteMachines declares none, AgentPools_Delete
            # does: Azure/azure-rest-api-specs specification/containerservice/resource-manager/
            # Microsoft.ContainerService/aks/stable/2025-10-01/managedClusters.json): so ARM is read again
            # right before it. The machine must still be this node (uid checked above) in
            # the User GPU pool admitted, and its VM the one admitted (``arm_vm_id``, shared.fleet.node_truth).
            verdict = _admitted_vm(ctx, node, d, action="deleted")
            if not verdict.ok:
                return _refuse_untrusted(record, ctx, kube, now=now, verdict=verdict)
            # Not deleted yet as far as the node shows. The same operation marker as for restart/reimage
            # keeps a host that resumes after a kill inside deleteMachines from sending it again.
            seq = int(rep.get("delete_seq") or 1)
            key = _op_key(record, "delete", seq)
            try:
                marker = ctx.ledger.create(Record(kind=DEDUPE_KIND, id=key, state=REQUESTED, created_at=now,
                                                  updated_at=now, data={"remediation": record.id, "rung": "replace",
                                                                        "machine": d["node"], "requested_at": now,
                                                                        "by": ctx.instance}))
            except Conflict:
                prior = ctx.ledger.get(DEDUPE_KIND, key)
                at = float(prior.data.get("requested_at") or prior.created_at) if prior is not None else now
                machines = {m.name for m in aks.list_machines(d["cluster"], d["pool"])}
                if d["node"] not in machines:
                    return go("delete_wait", f"machine {d['node']} is gone (deleteMachines sent at {iso(at)})",
                              wait=True)
                if now < at + _reissue_grace(policy):
                    return _stay(record, now=now, next_at=min(at + _reissue_grace(policy), now + policy.poll_s),
                                 note=f"deleteMachines of {d['node']} sent at {iso(at)} by a step that did not "
                                      f"finish: waiting for it to show")
                # The pool is idle (not busy, checked above), the machine and its node are still there well
                # after the request: it never took effect. Send it once more, under the next marker.
                rep["delete_seq"] = seq + 1
                return _stay(record, now=now, next_at=now, replace=rep,
                             note=f"deleteMachines of {d['node']} sent at {iso(at)} never took effect: sending it again")
            try:
                aks.begin_delete_machines(d["cluster"], d["pool"], [d["node"]])
            except NotFound:
                pass  # already gone (the adapter also answers normally when every machine is gone)
            except OperationInProgress as exc:
                _forget_marker(ctx, marker)
                return _stay(record, now=now, next_at=now + policy.poll_s, note=f"waiting: {exc}")
            except Invalid:
                _forget_marker(ctx, marker)
                raise
            except Throttled:
                _forget_marker(ctx, marker)
                raise
        return go("delete_wait", f"deleting machine {d['node']}", wait=True)
    if phase == "delete_wait":
        node = kube.get_node(d["node"])
        if node is not None and node.uid == d["node_uid"]:
            return _stay(record, now=now, next_at=now + policy.poll_s, note=f"waiting for {d['node']} to be deleted")
        if pool.provisioning_state not in ("Succeeded", "Failed"):
            return _stay(record, now=now, next_at=now + policy.poll_s, note=f"pool is {pool.provisioning_state}")
        if rep.get("mode") == "surge" and rep.get("replacement"):
            if pool.count > int(rep["original_count"]):
                rep["note"] = (f"pool count stayed {pool.count} after deleteMachines (original {rep['original_count']}): "
                               f"left as is rather than scale down an arbitrary node")
            return _replaced(record, ctx, kube, now=now, target=str(rep["replacement"]), rep=rep)
        if rep.get("autoscaled"):
            note = f"{d['node']} deleted; the cluster autoscaler owns the pool's count and brings capacity back on demand"
            _kube_event(kube, d["node"], record, "StewardReplaced", note)
            _publish(ctx, record, REPLACED_EV, note, extra={"replacement": ""})
            return _finish(record, ctx, kube, DONE, now=now, event=RECOVERED_EV, note=note, replace=rep)
        if pool.count < int(rep["original_count"]):
            return go("scale_back", f"machine deleted; restoring count {rep['original_count']} (now {pool.count})")
        return go("await_replacement", "machine deleted; waiting for its replacement", wait=True)
    if phase == "scale_back":
        if pool.count < int(rep["original_count"]):
            try:
                aks.begin_put_pool(d["cluster"], d["pool"], _pool_body(pool, int(rep["original_count"])),
                                   etag=pool_etag(pool))
            except (Invalid, OperationInProgress) as exc:
                # Busy, or no quota/capacity right now: keep trying until the rung's timeout.
                return _stay(record, now=now, next_at=now + policy.poll_s, note=f"waiting to restore the count: {exc}")
        return go("await_replacement", f"pool {d['pool']} scaling back to {rep['original_count']}", wait=True)
    if phase == "await_replacement":
        new = _replacement(ctx, record, kube, since=started, policy=policy, now=now)
        if new is not None:
            return _replaced(record, ctx, kube, now=now, target=new.name, rep={**rep, "replacement": new.name})
        return _stay(record, now=now, next_at=now + policy.poll_s, note="waiting for the replacement node")
    raise Invalid(f"unknown replace phase {phase!r}")


def _step_replace_nodeclaim(record: Record, ctx: Context, *, kube: KubePort, policy: RemediationPolicy,
                            now: float) -> Record:
    """Replace a node auto-provisioning node the Karpenter way: delete its NodeClaim.

    Karpenter's termination controller then deletes the node and its VM (the node is already cordoned
    and drained by us) and provisions a new node when pods are pending (kubernetes-sigs/karpenter
    pkg/controllers/node/termination, pkg/controllers/provisioning). Deleting a NodeClaim is idempotent
    (a claim already terminating is unaffected; a claim that is gone matches nothing), so a step that
    resumes after a crash may simply send it again. A replacement is a Ready, healthy node of the same
    NodePool created after the delete; if none comes (no pod asked for one), Karpenter owns the
    capacity and the remediation ends once the broken node is gone.
    """
    d = record.data
    rep: dict[str, Any] = dict(d.get("replace") or {})
    phase = d.get("rung_phase", "start")
    node = kube.get_node(d["node"])
    ours = node is not None and node.uid == d["node_uid"]

    def go(next_phase: str, note: str, **extra: Any) -> Record:
        rep.update(extra)
        return _move(record, REPAIRING, now=now, note=note, next_at=now + policy.poll_s, rung_phase=next_phase,
                     replace=rep)

    if phase == "start":
        claim = kube.delete_nodeclaim(node_name=d["node"], provider_id=str(d.get("provider_id") or
                                                                           (node.provider_id if node else "")))
        if claim is None and ours:
            return _next_rung(record, ctx, kube, now=now,
                              why=f"no Karpenter NodeClaim owns {d['node']} (matched by providerID and node name)")
        note = (f"deleted NodeClaim {claim}: Karpenter deletes {d['node']} and its VM and provisions a replacement "
                f"on demand" if claim else f"{d['node']} and its NodeClaim are already gone")
        _kube_event(kube, d["node"], record, "StewardNodeClaimDeleted", note)
        return _move(record, REPAIRING, now=now, next_at=now + policy.poll_s, note=note, rung_phase="claim_wait",
                     rung_started_at=now, replace={"mode": "nodeclaim", "nodeclaim": claim or ""})
    if phase == "claim_wait":
        if ours:
            return _stay(record, now=now, next_at=now + policy.poll_s,
                         note=f"waiting for Karpenter to terminate {d['node']} (NodeClaim {rep.get('nodeclaim')})")
        return go("await_replacement", f"{d['node']} is gone; waiting for Karpenter's replacement", gone_at=now)
    if phase == "await_replacement":
        # Karpenter provisions for the pods our drain made pending, often before the NodeClaim was
        # deleted: a node of the NodePool made since the cordon counts (claimed, so never twice).
        since = float(d.get("cordoned_at") or record.created_at)
        new = _replacement(ctx, record, kube, since=since, policy=policy, now=now)
        if new is not None:
            return _replaced(record, ctx, kube, now=now, target=new.name, rep={**rep, "replacement": new.name})
        gone_at = float(rep.get("gone_at") or now)
        if now >= gone_at + max(policy.settle_s, 2 * policy.poll_s):
            note = (f"{d['node']} deleted through its NodeClaim; no replacement yet: Karpenter provisions one when "
                    f"pods need it (NodePool {d['pool']})")
            _kube_event(kube, d["node"], record, "StewardReplaced", note)
            extra: dict[str, Any] = {"replacement": ""}
            if d.get("escalation"):
                extra["escalation"] = d["escalation"]
            _publish(ctx, record, REPLACED_EV, note, extra=extra)
            return _finish(record, ctx, kube, DONE, now=now, event=RECOVERED_EV, note=note, replace=rep)
        return _stay(record, now=now, next_at=now + policy.poll_s, note="waiting for Karpenter's replacement node")
    raise Invalid(f"unknown NodeClaim replace phase {phase!r}")


def _replaced(record: Record, ctx: Context, kube: KubePort, *, now: float, target: str, rep: dict[str, Any]) -> Record:
    note = f"{record.data['node']} replaced by {target}" + (f"; {rep['note']}" if rep.get("note") else "")
    _kube_event(kube, target, record, "StewardReplaced", note)
    extra: dict[str, Any] = {"replacement": target}
    if record.data.get("escalation"):
        extra["escalation"] = record.data["escalation"]
    _publish(ctx, record, REPLACED_EV, note, extra=extra)
    return _move(record, VERIFYING, now=now, note=note, verify_since=now, target=target, replace=rep)


def _step_verifying(record: Record, ctx: Context, *, kube: KubePort, policy: RemediationPolicy, now: float) -> Record:
    """Declare the repair done only once the node has been healthy for longer than NPD needs after a boot.

    A rebooted node's node-problem-detector publishes every GPU condition ``False`` with a fresh
    transition time before its first check (kubernetes/node-problem-detector
    pkg/custompluginmonitor/custom_plugin_monitor.go ``initialConditions``); a fault that survived the
    reboot turns ``True`` again only one ``invoke_interval`` later. So the start-up ``False`` proves
    nothing: :func:`health.verify_repair` waits a whole window after the latest of Ready's and the
    conditions' transitions, and only then is the node uncordoned.
    """
    d = record.data
    target = str(d.get("target") or d["node"])
    node = kube.get_node(target)
    since = float(d.get("verify_since") or now)
    window = verify_window_s(policy)
    if node is not None:
        verdict = health.verify_repair(node, policy=policy, since=since, now=now, window_s=window)
        if verdict.state == health.VERIFIED:
            uncordoned = _uncordon_if_ours(kube, record) if target == d["node"] else False
            note = f"recovered: {verdict.why}" + ("; uncordoned" if uncordoned else "")
            return _finish(record, ctx, kube, DONE, now=now, event=RECOVERED_EV, note=note, target=target)
        if verdict.state == health.CONFIRMING:
            if now >= since + VERIFY_MAX_WINDOWS * window:
                # Healthy whenever looked at, but a condition or Ready keeps transitioning: never stable.
                return _next_rung(record, ctx, kube, now=now,
                                  why=f"never stable for {window:.0f}s within {VERIFY_MAX_WINDOWS * window:.0f}s "
                                      f"({verdict.why})")
            until = float(verdict.until or now + policy.poll_s)
            return _stay(record, now=now, next_at=max(now + 1.0, min(until, now + policy.poll_s)),
                         note=f"verifying: {verdict.why}")
        why = verdict.why
    else:
        why = f"{target} is gone"
    if now >= since + max(window, 2 * policy.poll_s):
        return _next_rung(record, ctx, kube, now=now, why=f"did not stay healthy: {why}")
    return _stay(record, now=now, next_at=now + policy.poll_s, note=f"verifying: {why}")


# NPD's custom plugin monitor runs its first check one invoke_interval after it starts (30 s by default,
# kubernetes/node-problem-detector pkg/custompluginmonitor/types/config.go); the interval of AKS's GPU
# plugins is not documented. Verification outlasts twice that default at least, or REMEDIATION_SETTLE_S
# when longer (raise it if a cluster's NPD checks less often).
NPD_DEFAULT_INVOKE_INTERVAL_S = 30.0
VERIFY_MAX_WINDOWS = 4  # verification is bounded too: a node never stable this long fails the rung


def verify_window_s(policy: RemediationPolicy) -> float:
    """How long a repaired node must stay healthy after its last restart evidence before it is trusted."""
    return max(float(policy.settle_s), 2 * NPD_DEFAULT_INVOKE_INTERVAL_S)


def _uncordon_if_ours(kube: KubePort, record: Record) -> bool:
    """Uncordon only a node we cordoned for this remediation, and drop our markers."""
    if not record.data.get("cordoned_by_us"):
        return False
    node = kube.get_node(record.data["node"])
    if node is None or node.annotations.get(health.CORDON_FOR_ANNOTATION) != record.id:
        return False
    kube.patch_node(node.name, {
        "metadata": {"resourceVersion": node.resource_version,
                     "labels": {health.CORDONED_BY_LABEL: None},
                     "annotations": {health.CORDON_FOR_ANNOTATION: None, health.CORDON_REASON_ANNOTATION: None,
                                     health.CORDON_AT_ANNOTATION: None, health.STATE_ANNOTATION: None}},
        "spec": {"unschedulable": False},
    })
    return True

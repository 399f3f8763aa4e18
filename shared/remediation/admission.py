"""Admission of a remediation for one unhealthy GPU node (the Event Grid trigger's work).

:func:`handle_event` takes a ``Steward.GpuNode.Unhealthy`` CloudEvent and trusts nothing in it (it may
be stale, duplicated, late or out of order): it re-reads the node, re-evaluates it, and admits a
remediation only under every safety limit. Admissions are serialized fleet-wide through one ledger
record (kind ``budget``, id ``fleet``) holding the slots of remediations in flight: taking a slot is
an ETag-conditional save, so of two hosts admitting at once exactly one wins and the other re-reads
and re-decides with the winner's slot counted — the budgets can never be exceeded. Record ids make
duplicates impossible: a remediation's id is ``<node key>-<attempt n>`` and the per-node record
(kind ``remediation-node``) lists the faults already handled, so one fault is never remediated twice.
The steps that follow are in :mod:`shared.remediation.steps`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import node_fate, node_truth, scope
from shared.kernel.errors import Conflict, Forbidden, NotFound
from shared.kernel.ports import KubePort, NodeView, Record
from shared.kernel.timefmt import iso, parse_time
from shared.remediation import attempts, breaker, budget, health, pool_view
from shared.remediation.notify import metric, publish_now
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    ACTIVE_STATES,
    BUDGET_ID,
    BUDGET_KIND,
    DEDUPE_KIND,
    GOING_AWAY,
    KIND,
    NODE_KIND,
    UNHEALTHY_EVENT,
    BudgetData,
    Event,
    NodeData,
    RefusedMarker,
    RemediationData,
    Rung,
    RungPhase,
    Slot,
    State,
    decode,
    fault_id,
    node_key,
    to_data,
)
from shared.remediation.signals import Signal, SignalSource, ladder_for

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation")

SLOT_ORPHAN_S = 300.0  # a slot whose record never appeared is dropped after this
_FOREIGN_IDS = 20  # rows no admission made, stepped over at a node's next attempt ids (forged rows: a few)
_ADMIT_TRIES = 6


class Handling(StrEnum):
    """What :func:`handle_event` did with an event."""

    ADMITTED = "admitted"
    DUPLICATE = "duplicate"  # the fault, or the node, is already being handled
    REFUSED = "refused"  # a safety limit said no (reported once per fault and reason)
    IGNORED = "ignored"  # not ours, malformed, stale or no longer true
    RECORDED = "recorded"  # a signal whose policy row only records it (shared.remediation.signals)


@dataclass(frozen=True)
class Handled:
    """:func:`handle_event`'s answer: the outcome, and the sentence the log and the reports show."""

    outcome: Handling
    detail: str
    code: str = ""  # a refusal's code (shared.remediation.refusals), "" otherwise

    def __str__(self) -> str:
        return self.detail


def _ignored(detail: str) -> Handled:
    return Handled(Handling.IGNORED, f"ignored: {detail}")


#: A duplicate's code when another fault's remediation holds the node: this fault is not handled yet (a pushed
#: one is kept and judged again, shared.remediation.pending_faults); "" when this very fault is handled.
NODE_BUSY = "node-busy"


def _duplicate(detail: str, *, code: str = "") -> Handled:
    return Handled(Handling.DUPLICATE, f"duplicate: {detail}", code)


def policy_of(ctx: Context) -> RemediationPolicy:
    return ctx.settings.remediation or RemediationPolicy()


def paused_reason(ctx: Context, tags: Mapping[str, str] | None, node: NodeView | None,
                  policy: RemediationPolicy) -> str | None:
    """Why remediation must not act now: the app, the cluster (tag) or the node (label) is paused."""
    if ctx.settings.paused:
        return "the app is paused (STEWARD_PAUSED=true)"
    for key, value in (tags or {}).items():
        if key.lower() == policy.paused_tag.lower() and str(value).lower() == "true":
            return f"the cluster is paused (tag {policy.paused_tag}=true)"
    if node is not None and node.labels.get(policy.opt_out_label, "").lower() == "true":
        return f"the node opted out (label {policy.opt_out_label}=true)"
    return None


def _event_data(event: Mapping[str, Any]) -> Mapping[str, Any]:
    data = event.get("data")
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except ValueError:
            return {}
    return data if isinstance(data, Mapping) else {}


def refuse(ctx: Context, info: Mapping[str, Any], code: str, reason: str, *,
            warn: tuple[KubePort, NodeView] | None = None) -> Handled:
    """Publish Refused once per (fault, reason code): the sweep re-reports the fault every minute.

    ``warn`` also posts a Warning event on the node, in its own cluster (for refusals an operator of
    that cluster must see: a node that ARM contradicts, or one the platform is taking away)."""
    marker = RefusedMarker(reason=reason, reason_code=code, cluster=info.get("cluster"), node=info.get("node"))
    try:
        ctx.ledger.create(Record(kind=DEDUPE_KIND, id=f"refused-{info['fault']}-{code}", state="seen",
                                 data=to_data(marker), created_at=ctx.clock.now()))
    except Conflict:
        return Handled(Handling.REFUSED, f"refused ({code}, already reported): {reason}", code)
    publish_now(ctx, Record(kind=KIND, id="", state="", data=dict(info)), Event.REFUSED, reason,
                key=f"{info['fault']}|{code}", extra={"reason_code": code, "reason": reason})
    metric(ctx, "remediation_refusals_total", 1, reason_code=code, signal=str(info.get("signal") or "npd"))
    if warn is not None:  # best effort: the port's create_event never raises
        kube, node = warn
        kube.create_event(node=node, reason=f"StewardRefused{code}", message=f"remediation refused: {reason}",
                          type_="Warning", action=State.REFUSED, correlation_id=str(info["fault"])[:24])
    log.warning("remediation refused for %s/%s: %s", info.get("cluster"), info.get("node"), reason)
    return Handled(Handling.REFUSED, f"refused ({code}): {reason}", code)


def handle_event(event: Mapping[str, Any], ctx: Context) -> Handled:
    """Admit or refuse a remediation for one Unhealthy CloudEvent.

    Raises only Throttled/Transient (and Conflict when the admission record stays contended), which
    Event Grid's retry turns into a later, re-evaluated delivery.
    """
    policy = policy_of(ctx)
    source = ctx.settings.event_source
    if event.get("source") != source:
        return _ignored(f"source {event.get('source')!r} is not {source!r}")
    if event.get("type") != UNHEALTHY_EVENT:
        return _ignored(f"type {event.get('type')!r}")
    data = _event_data(event)
    if data.get("signal") == str(SignalSource.DCGM):
        from shared.remediation import dcgm_recheck  # it builds on this module: imported when first needed

        return dcgm_recheck.recheck(ctx, data, event_id=str(event.get("id", "")),
                                    observed_at=parse_time(data.get("observed_at") or None)
                                    or parse_time(event.get("time") or None) or 0.0)
    if data.get("signal") == str(SignalSource.GPU_CAPACITY):
        from shared.remediation import gpu_capacity  # it builds on this module, as dcgm does

        return gpu_capacity.recheck(ctx, data, event_id=str(event.get("id", "")),
                                    observed_at=parse_time(data.get("observed_at") or None)
                                    or parse_time(event.get("time") or None) or 0.0)
    cluster_id = str(data.get("cluster") or "")
    node_name = str(data.get("node") or "")
    condition = str(data.get("condition") or "")
    since = parse_time(data.get("since") or None)
    observed_at = parse_time(data.get("observed_at") or None) or parse_time(event.get("time") or None) or 0.0
    if not cluster_id or not node_name or not condition or since is None:
        return _ignored("malformed event (needs data.cluster, node, condition, since)")
    if condition not in policy.conditions:
        return _ignored(f"condition {condition} is not configured (REMEDIATION_CONDITIONS)")
    try:
        cluster = ctx.access.aks().get_cluster(cluster_id)
    except NotFound:
        return _ignored(f"cluster {cluster_id} does not exist")
    except Forbidden as exc:
        return _ignored(f"cluster {cluster_id} cannot be read ({exc}): out of our reach")
    ok, why = scope.cluster_in_scope(cluster, ctx.settings)
    if not ok:
        return _ignored(f"cluster {cluster_id} is out of scope ({why})")
    cluster_id = cluster.id

    now = ctx.clock.now()
    kube = ctx.access.kube(cluster_id)
    node = kube.get_node(node_name)
    if node is None:
        return _ignored(f"node {node_name} no longer exists")
    evaluation = health.evaluate([node], now=now, policy=policy)
    finding = next((f for f in evaluation.unhealthy if f.condition == condition), None)
    info: dict[str, Any] = {"cluster": cluster_id, "node": node_name, "pool": health.pool_of(node), "condition": condition,
                            "since": iso(finding.since if finding else since), "event_id": str(event.get("id", ""))}
    if finding is None:
        skipped = next((r for n, r in evaluation.skipped), None)
        if skipped == health.SKIP_OPTED_OUT:
            info["fault"] = fault_id(cluster_id, node_name, condition, since)
            return refuse(ctx, info, budget.OPTED_OUT, f"the node opted out (label {policy.opt_out_label}=true)")
        if skipped:
            return _ignored(f"node {node_name} is skipped ({skipped})")
        return _ignored(f"{condition} on {node_name} is no longer True over its threshold")
    if finding.since > since + 1.0:
        return _ignored(f"stale event ({condition} flapped since: now True since {iso(finding.since)})")
    info["fault"] = fault_id(cluster_id, node_name, condition, finding.since)
    return _admit_checked(ctx, cluster=cluster, kube=kube, node=node, finding=finding, info=info,
                          observed_at=observed_at, policy=policy)


def _admit_checked(ctx: Context, *, cluster: Any, kube: KubePort, node: NodeView, finding: health.Finding,
                   info: dict[str, Any], observed_at: float, policy: RemediationPolicy,
                   ladder: tuple[str, ...] | None = None) -> Handled:
    """The checks every fault passes, whatever its source, then admission under the budgets."""
    fleet_breaker = breaker.current(ctx)
    # The free checks first: a backlog replayed after a breaker reset costs no ARM read per event.
    if breaker.is_stale(observed_at, fleet_breaker):
        return refuse(ctx, info, "stale", f"observed at {iso(observed_at)}, before the breaker reset at "
                                           f"{iso(fleet_breaker.reset_at)}: dropped with the backlog")
    leaving = node_fate.going_away(node)
    if leaving:
        return refuse(ctx, info, GOING_AWAY, f"{node.name} is being taken away by the platform: {leaving}",
                       warn=(kube, node))
    # Trust ARM, not the node: the pool it claims must be a User GPU pool in ARM, and its VM the one
    # ARM lists for it, in this cluster's own node resource group (shared/fleet/node_truth.py).
    verdict = judge_node(ctx, cluster, node)
    if not verdict.ok:
        return refuse(ctx, info, verdict.code, verdict.reason, warn=(kube, node))
    info["vm_id"] = verdict.vm_id
    if node.labels.get(policy.opt_out_label, "").lower() == "true":
        return refuse(ctx, info, budget.OPTED_OUT, f"the node opted out (label {policy.opt_out_label}=true)")
    paused = paused_reason(ctx, cluster.tags, node, policy)
    return _admit(ctx, kube=kube, node=node, finding=finding, info=info, paused=paused,
                  breaker_open=fleet_breaker.is_open, fleet_clusters=fleet_breaker.fleet_clusters, policy=policy,
                  ladder=ladder)


def scoped_cluster(ctx: Context, cluster_id: str) -> tuple[Any, str]:
    """The cluster an event names, read from ARM and judged in scope now: (cluster, "") or (None, why not).
    The re-checks of the signals that publish their own events (DCGM, GPU capacity) start here."""
    try:
        cluster = ctx.access.aks().get_cluster(cluster_id)
    except (NotFound, Forbidden) as exc:
        return None, f"cluster {cluster_id} cannot be read ({exc})"
    ok, why = scope.cluster_in_scope(cluster, ctx.settings)
    if not ok:
        return None, f"cluster {cluster_id} is out of scope ({why})"
    return cluster, ""


def admit_signal(ctx: Context, *, cluster: Any, node: NodeView, signal: Signal, event_id: str,
                 observed_at: float) -> Handled:
    """Admit a remediation for a fault another source saw (shared.remediation.signals), or record it.

    The caller has already re-read the truth the signal claims (ARM's availability status, the
    workspace's counters) and resolved ``node`` in ``cluster`` (in scope). From here on it is the same
    path as a condition fault: one fault id per (node, signal, since), one active remediation per node,
    and every budget. A ``record_only`` row publishes ``Steward.Remediation.SignalRecorded`` once per fault and admits
    nothing.
    """
    policy = policy_of(ctx)
    kube = ctx.access.kube(cluster.id)
    info: dict[str, Any] = {"cluster": cluster.id, "node": node.name, "pool": health.pool_of(node),
                            "condition": signal.key, "since": iso(signal.since), "event_id": event_id,
                            "fault": fault_id(cluster.id, node.name, signal.key, signal.since),
                            "signal": str(signal.source), "signal_detail": signal.detail,
                            "policy_row": signal.decision.row}
    if not signal.acts:
        return record_signal(ctx, info, signal)
    finding = health.Finding(node=node, condition=signal.key, since=signal.since)
    return _admit_checked(ctx, cluster=cluster, kube=kube, node=node, finding=finding, info=info,
                          observed_at=observed_at, policy=policy,
                          ladder=ladder_for(signal.decision.action, tuple(policy.ladder)))


def record_signal(ctx: Context, info: Mapping[str, Any], signal: Signal) -> Handled:
    """Publish ``Steward.Remediation.SignalRecorded`` once per fault: the row says to act on nothing, only to remember."""
    marker = RefusedMarker(reason=signal.detail, reason_code="recorded", cluster=info.get("cluster"),
                           node=info.get("node"))
    try:
        ctx.ledger.create(Record(kind=DEDUPE_KIND, id=f"recorded-{info['fault']}", state="seen",
                                 data=to_data(marker), created_at=ctx.clock.now()))
    except Conflict:
        return Handled(Handling.RECORDED, f"recorded (already): {signal.detail}")
    publish_now(ctx, Record(kind=KIND, id="", state="", data=dict(info)), Event.SIGNAL_RECORDED, signal.detail,
                key=str(info["fault"]), extra={"signal": str(signal.source), "policy_row": signal.decision.row,
                                               "action": signal.decision.action, "source": signal.decision.source})
    log.info("signal recorded for %s/%s: %s (row %s)", info.get("cluster"), info.get("node"), signal.detail,
             signal.decision.row)
    return Handled(Handling.RECORDED, f"recorded ({signal.decision.row}): {signal.detail}")


def judge_node(ctx: Context, cluster: Any, node: NodeView) -> node_truth.Verdict:
    """:func:`node_truth.resolve` for admission, remembered a minute per process.

    The sweep re-reports a refused fault every minute; without this each report would cost two ARM
    reads (the pool and its machines). A cached answer is safe here: admission only cordons, and the
    VM action reads ARM again right before the call (``shared.remediation.ladder.admitted_vm``). The key
    holds everything the verdict depends on (the node's uid, providerID and claimed pool; the cluster's
    node resource group and provisioning mode), so a changed node or cluster is judged afresh.
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


def _live_slots(ctx: Context, slots: Mapping[str, Slot], now: float) -> dict[str, Slot]:
    """Slots of remediations still active (a finished or vanished one frees its slot)."""
    live: dict[str, Slot] = {}
    for rid, slot in slots.items():
        rec = ctx.ledger.get(KIND, rid)
        if rec is None:
            if now - slot.at < SLOT_ORPHAN_S:
                live[rid] = slot  # being created right now by another host
            continue
        if rec.state in ACTIVE_STATES:
            live[rid] = slot
    return live


def _next_attempt(ctx: Context, nk: str, number: int, *, cluster: str, node: str) -> tuple[int, Record | None]:
    """From ``number`` on, the first attempt number whose row is free or admission's own, with that row
    (``(0, None)`` when none of the next :data:`_FOREIGN_IDS` is).

    A row at a node's next ids that no admission made (written straight into the table: no creation slot,
    not on the node's row) is stepped over, never adopted: adopting it would charge the node an attempt it
    never had, mark that row's fault handled, and make it the node's last attempt, so the check for one in
    progress would read it and miss the genuine remediation still running (soak seed 965691: two admitted on
    one node). Admission's own row there is one whose host died before noting it: its slot still proves it
    (the row's first step notes it otherwise, :func:`attempts.note_if_admitted`)."""
    slots: dict[str, Slot] | None = None
    for n in range(number, number + _FOREIGN_IDS):
        existing = ctx.ledger.get(KIND, f"{nk}-{n}")
        if existing is None:
            return n, None
        slots = attempts.budget_slots(ctx) if slots is None else slots
        if attempts.slot_of_creation(slots, existing, cluster=cluster, node=node):
            return n, existing
    return 0, None


def _admit(ctx: Context, *, kube: KubePort, node: NodeView, finding: health.Finding, info: dict[str, Any],
           paused: str | None, breaker_open: bool, policy: RemediationPolicy, fleet_clusters: int = 0,
           ladder: tuple[str, ...] | None = None) -> Handled:
    cluster_id, name, fault = info["cluster"], node.name, info["fault"]
    nk = node_key(cluster_id, name)
    pool = health.pool_of(node)
    listed = pool_view.pool_nodes(kube, health.pool_selector(node), page_size=policy.page_size)
    unavailable_now = {n for n, down in listed.items() if down}
    for _ in range(_ADMIT_TRIES):
        now = ctx.clock.now()
        node_rec = ctx.ledger.get(NODE_KIND, nk)
        nd = decode(node_rec.data, NodeData) if node_rec else NodeData(cluster=cluster_id, node=name)
        if fault in nd.faults:
            return _duplicate(f"fault {fault[:12]} on {name} was already handled")
        number, existing = _next_attempt(ctx, nk, max(nd.count, len(nd.attempts)) + 1, cluster=cluster_id, node=name)
        if number == 0:
            return _duplicate(f"the next {_FOREIGN_IDS} attempt ids of {name} hold rows no admission made: an operator "
                              "must look at the ledger", code=NODE_BUSY)
        rid = f"{nk}-{number}"
        if existing is not None:
            # A host crashed (or is) between creating the record and updating the node record: repair it.
            attempts.note(ctx, node_rec, nd, existing)
            if existing.data.get("fault") == fault:
                return _duplicate(f"remediation {rid} handles this fault")
            if existing.state in ACTIVE_STATES:
                return _duplicate(f"remediation {rid} is in progress on {name}", code=NODE_BUSY)
            continue
        last = ctx.ledger.get(KIND, nd.attempts[-1].id) if nd.attempts else None
        if last is not None and last.state in ACTIVE_STATES:
            return _duplicate(f"remediation {last.id} is in progress on {name}", code=NODE_BUSY)

        budget_rec = ctx.ledger.get(BUDGET_KIND, BUDGET_ID)
        slots = _live_slots(ctx, decode(budget_rec.data, BudgetData).slots if budget_rec else {}, now)
        in_pool = {s.node for s in slots.values() if s.cluster == cluster_id and s.pool == pool}
        # a surge node stands in for the broken node it replaces: not the team's capacity (pool_view)
        pool_size = len(listed) - pool_view.surge_stand_ins(ctx, slots, cluster=cluster_id, pool=pool, listed=listed)
        # The node's last attempt is not the only one that can be active (a slot reserve took for a row, a race);
        # a slot of this very id without its row is this attempt's own, from an admission that died before the row.
        holder = next((r for r, s in slots.items()
                       if r != rid and s.node == name and s.cluster.lower() == cluster_id.lower()), "")
        if holder:
            return _duplicate(f"remediation {holder} is in progress on {name}", code=NODE_BUSY)
        in_cluster = sum(1 for s in slots.values() if s.cluster.lower() == cluster_id.lower())
        node_check = budget.node_admission(attempts=[a.at for a in nd.attempts],
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
            cluster=budget.cluster_admission(cluster=cluster_id, in_flight_in_cluster=in_cluster,
                                             fleet_clusters=fleet_clusters, policy=policy),
            fleet=budget.fleet_admission(in_flight=len(slots), policy=policy),
        )
        if not admission.allowed:
            return refuse(ctx, info, admission.code, admission.reason)

        slots[rid] = Slot(cluster=cluster_id, pool=pool, node=name, at=now)
        budget_data = to_data(BudgetData(slots=slots))
        try:
            if budget_rec is None:
                ctx.ledger.create(Record(kind=BUDGET_KIND, id=BUDGET_ID, state="open", data=budget_data,
                                         created_at=now, updated_at=now))
            else:
                ctx.ledger.save(msgspec.structs.replace(budget_rec, data=budget_data, updated_at=now))
        except Conflict:
            continue  # another admission took a slot first: re-read and re-decide
        record = _new_record(rid, node=node, finding=finding, info=info, attempt=number,
                             policy=policy, now=now, instance=ctx.instance,
                             cap_reached=node_check.reason if cap_reached else "", ladder=ladder)
        # Announce before the record exists: once written, any instance's reconciler may claim it and
        # report its first step, and a remediation's story must open with Admitted. A host racing this
        # one publishes the same deterministic id, which consumers dedupe.
        publish_now(ctx, record, Event.ADMITTED, f"{node_check.reason}: cordon only" if cap_reached else admission.reason,
                    extra={"dry_run": policy.dry_run})
        try:
            record = ctx.ledger.create(record)
        except Conflict:
            continue  # same attempt created by another host: the next pass sees it
        attempts.note(ctx, node_rec, nd, record)
        metric(ctx, "time_to_admit_s", now - finding.since, condition=finding.condition)
        metric(ctx, "remediations_in_flight", len(slots))
        log.info("remediation %s admitted for %s/%s (%s)", rid, cluster_id, name, admission.reason)
        return Handled(Handling.ADMITTED, f"admitted: {rid}")
    raise Conflict("the admission record stayed contended; Event Grid will deliver again")


def _new_record(rid: str, *, node: NodeView, finding: health.Finding, info: Mapping[str, Any], attempt: int,
                policy: RemediationPolicy, now: float, instance: str, cap_reached: str = "",
                ladder: tuple[str, ...] | None = None) -> Record:
    data = RemediationData(
        cluster=info["cluster"], node=node.name, node_uid=node.uid, pool=health.pool_of(node),
        pool_selector=health.pool_selector(node), nap=health.is_karpenter_node(node), provider_id=node.provider_id,
        arm_vm_id=str(info.get("vm_id") or ""), condition=finding.condition, since=iso(finding.since),
        since_ts=finding.since, fault=info["fault"], event_id=info.get("event_id", ""), attempt=attempt,
        dry_run=policy.dry_run, ladder=[] if cap_reached else [Rung(r) for r in (ladder or policy.ladder)],
        rung_index=0, rung_phase=RungPhase.START, cap_reached=cap_reached, admitted_by=instance, admitted_at=now,
        signal=str(info.get("signal") or SignalSource.NPD), signal_detail=str(info.get("signal_detail") or ""),
        policy_row=str(info.get("policy_row") or ""))
    stored = {k: v for k, v in to_data(data).items() if k in _ADMISSION_FIELDS}
    return Record(kind=KIND, id=rid, state=State.ADMITTED, data=stored, created_at=now, updated_at=now, next_at=now,
                  history=[{"at": now, "state": State.ADMITTED, "note": f"{finding.condition} True since {iso(finding.since)}"}])


# What admission writes: the later fields are written by the steps that set them.
_ADMISSION_FIELDS = frozenset({"cluster", "node", "node_uid", "pool", "pool_selector", "nap", "provider_id", "arm_vm_id",
                               "condition", "since", "since_ts", "fault", "event_id", "attempt", "dry_run", "ladder",
                               "rung_index", "rung_phase", "cap_reached", "admitted_by", "admitted_at",
                               "signal", "signal_detail", "policy_row"})

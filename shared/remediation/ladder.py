"""Moving along the repair ladder, and ending a remediation: the helpers every rung's step shares.

:func:`end` is the one way a remediation stops: it frees the budget slot, the pool's replace turn and
the node lease, tells the operator (a Kubernetes event on the node, the outcome CloudEvent) and counts
it. :func:`next_rung` and :func:`escalate_to_replace` move to the next rung or give up when none is
left. :func:`admitted_vm` is the check before any VM action: the node and its VM must still be the
ones admitted, read from ARM right before the call (shared/fleet/node_truth.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import node_truth
from shared.kernel.errors import Conflict, StewardError
from shared.kernel.ports import KubePort, NodeView, Record
from shared.kernel.steps import Transition, finish, move
from shared.remediation import health
from shared.remediation.notify import annotate, announce, kube_event, metric
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    BUDGET_ID,
    BUDGET_KIND,
    DEDUPE_KIND,
    BudgetData,
    Escalation,
    Event,
    Refusal,
    RemediationData,
    ReplaceData,
    Rung,
    RungPhase,
    State,
    decode,
    fields,
    lease_name,
    load,
    to_data,
    turn_key,
)

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation")


def end(record: Record, ctx: Context, kube: KubePort, state: State, *, now: float, event: Event, note: str,
        extra: Mapping[str, Any] | None = None, **changes: Any) -> Transition:
    """End the remediation in ``state``: free its budget slot, pool turn and node lease, tell the operator."""
    d = load(record)
    done = finish(record, state, now=now, note=note, **fields(finished_at=now, **changes))
    release_slot(ctx, record.id)
    drop_pool_turn(ctx, record)
    if not d.dry_run:
        try:
            kube.release_lease(lease_name(d.node), holder=record.id)
        except StewardError as exc:
            log.info("lease of %s not released (it expires): %s", d.node, exc)
        node = kube.get_node(d.node)
        if node is not None:
            if state != State.DONE:
                annotate(kube, node, done.record, note)
            kube_event(kube, node, done.record, f"Steward{state.title().replace('_', '')}", note,
                       "Normal" if state in (State.DONE, State.RELEASED) else "Warning")
    metric(ctx, "remediations_total", 1, outcome=str(state), condition=d.condition, rung=str(d.rung or "") or None,
           dry_run=d.dry_run, signal=d.signal)
    if state == State.DONE and not d.dry_run:
        metric(ctx, "time_to_repair_s", now - (d.since_ts or record.created_at), condition=d.condition,
               rung=str(d.rung or ""))
    return announce(done, done.record, event, note, key=state, extra=extra)


def release_slot(ctx: Context, rid: str) -> None:
    for _ in range(3):
        rec = ctx.ledger.get(BUDGET_KIND, BUDGET_ID)
        if rec is None:
            return
        slots = decode(rec.data, BudgetData).slots
        if rid not in slots:
            return
        del slots[rid]
        try:
            ctx.ledger.save(msgspec.structs.replace(rec, data=to_data(BudgetData(slots=slots)),
                                                    updated_at=ctx.clock.now()))
            metric(ctx, "remediations_in_flight", len(slots))
            return
        except Conflict:
            continue
    # Admissions drop slots of finished remediations anyway (admission._live_slots).


def drop_pool_turn(ctx: Context, record: Record) -> None:
    """Give the pool's replace turn back if ``record`` holds it (best effort: a stale turn is taken over)."""
    d = load(record)
    if d.dry_run or d.rung != Rung.REPLACE or not d.pool:
        return
    try:
        turn = ctx.ledger.get(DEDUPE_KIND, turn_key(d.cluster, d.pool))
        if turn is not None and turn.data.get("remediation") == record.id:
            ctx.ledger.delete(turn)
    except StewardError as exc:
        log.info("replace turn of pool %s not dropped (it is taken over when stale): %s", d.pool, exc)


def give_up_now(record: Record, ctx: Context, kube: KubePort, *, now: float, note: str) -> Transition:
    """``gave_up``: the ladder ran out, or the reconciler saw too many permanent errors."""
    policy = ctx.settings.remediation or RemediationPolicy()
    attempts = load(record).attempt or 1
    if attempts >= policy.max_attempts:
        note += f"; {attempts} attempts used (BUDGET_NODE_MAX_ATTEMPTS={policy.max_attempts}): an operator must look at it"
    return end(record, ctx, kube, State.GAVE_UP, now=now, event=Event.GAVE_UP, note=note)


def next_rung(record: Record, ctx: Context, kube: KubePort, *, now: float, why: str) -> Transition:
    d = load(record)
    i = d.rung_index + 1
    rung = str(d.rung or "")
    kube_event(kube, d.node, record, "StewardRungFailed", f"{rung} did not repair the node: {why}", "Warning")
    if i >= len(d.ladder):
        return give_up_now(record, ctx, kube, now=now,
                           note=f"every rung failed (last: {rung}: {why}); the node stays cordoned")
    drop_pool_turn(ctx, record)
    return move(record, State.REPAIRING, now=now, note=f"{rung} failed ({why}); escalating to {d.ladder[i]}",
                **fields(rung_index=i, rung_phase=RungPhase.START, replace=ReplaceData(), rung_entered_at=now,
                         rung_away_s=0.0))


def escalate_to_replace(record: Record, ctx: Context, kube: KubePort, *, now: float, code: str,
                        why: str) -> Transition:
    """A rung Azure denies (403: RBAC, a deny assignment such as node resource group lockdown, a policy)
    or cannot do on this VM (409: e.g. a deallocated spot VM) will not work on retry, and neither will
    the next VM-level rung: go straight to ``replace``, which goes through the AKS API (deleteMachines,
    or the NodeClaim on node auto-provisioning), with the reason in the record and the events."""
    d = load(record)
    rung = str(d.rung or "")
    escalation = Escalation(from_=rung, code=code, reason=why[:500], at=now)
    message = f"{rung} is not possible on this node ({code}: {why[:300]})"
    kube_event(kube, d.node, record, "StewardRungDenied", message, "Warning")
    if Rung.REPLACE not in d.ladder[d.rung_index + 1:]:
        record = msgspec.structs.replace(record, data={**record.data, **fields(escalation=escalation)})
        return give_up_now(record, ctx, kube, now=now,
                           note=f"{message}; no replace rung left on the ladder (REMEDIATION_LADDER): the node stays "
                                f"cordoned")
    drop_pool_turn(ctx, record)
    return move(record, State.REPAIRING, now=now, note=f"{message}; escalating to replace through the AKS API",
                **fields(rung_index=d.ladder.index(Rung.REPLACE, d.rung_index + 1), rung_phase=RungPhase.START,
                         replace=ReplaceData(), rung_entered_at=now, rung_away_s=0.0,
                         escalation=escalation))


def escalation_extra(record: Record) -> dict[str, Any]:
    """The ``escalation`` of a Replaced event, when the ladder skipped to replace."""
    escalation = record.data.get("escalation")
    return {"escalation": escalation} if escalation else {}


def admitted_vm(ctx: Context, node: NodeView | None, record: Record, *, action: str) -> node_truth.Verdict:
    """The VM to act on, from ARM right before the call, refused unless the node is still the one admitted.

    ARM's machines of the record's pool give the VM; it must be in the cluster's own subscription and
    node resource group, and the node's providerID must name it (the one recorded at admission when
    the node is not registered right now, e.g. while it is being reimaged). The node must be the same
    Node object (uid) when it is registered, and ARM's VM for it the VM admitted (``arm_vm_id``): a Node
    re-registered since lost our cordon, so pods may have landed on it that never went through the
    Eviction API, and restarting, reimaging or deleting its VM would kill them.
    """
    d = load(record)
    if not d.node_uid or not d.arm_vm_id:
        # A row that names no node uid or no VM cannot be checked against the world: never acted on.
        return node_truth.Verdict.refuse(node_truth.NODE_RECREATED if not d.node_uid else node_truth.NOT_A_MACHINE, (
            f"the record names no {'node uid' if not d.node_uid else 'VM'} for {d.node}: which machine was "
            f"admitted is unknown, so it is not {action}"))
    if node is not None and node.uid != d.node_uid:
        return node_truth.Verdict.refuse(node_truth.NODE_RECREATED, (
            f"{d.node} is now Node uid {node.uid}, not the Node {d.node_uid} admitted and cordoned: it "
            f"re-registered (our cordon is gone, its pods were not drained): not {action}"))
    aks = ctx.access.aks()
    cluster = aks.get_cluster(d.cluster)
    provider_id = node.provider_id if node is not None else d.provider_id
    verdict = node_truth.resolve(aks, cluster, pool_name=d.pool, node_name=d.node, provider_id=provider_id, nap=False)
    if verdict.ok and verdict.vm_id.lower() != d.arm_vm_id.lower():
        return node_truth.Verdict.refuse(node_truth.NOT_A_MACHINE, (
            f"ARM's machine {d.node} of pool {d.pool} is now VM {verdict.vm_id}, not the VM "
            f"{d.arm_vm_id} admitted: not {action}"))
    return verdict


def refuse_untrusted(record: Record, ctx: Context, kube: KubePort, *, now: float,
                     verdict: node_truth.Verdict) -> Transition:
    """End a remediation whose node ARM contradicts: Refused (with the code), a Warning on the node, no
    VM action. A cordon of ours stays for an operator: the node's identity is in doubt.

    Unless the node is simply gone: no Node of that name in the cluster and no machine of that name in
    the admitted pool in ARM (or no such pool). Nothing claims anything then; the VM was deleted (its pool
    migrated or deleted, a scale-down) and the fault went with it, so the remediation is released, "no
    longer exists", like a node gone before its cordon (soak seed 962203: a migration deleted the old pool
    while a remediation of one of its nodes waited for its reimage, which then ended "refused (NoSuchPool)"
    as if the node had lied about its pool)."""
    if verdict.code in (node_truth.NO_SUCH_POOL, node_truth.NOT_A_MACHINE) and _gone(ctx, kube, load(record)):
        return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                   note=f"the node no longer exists, nor its machine in ARM ({verdict.reason}): nothing to repair; "
                        "no VM was touched")
    return end(record, ctx, kube, State.REFUSED, now=now, event=Event.REFUSED,
               note=f"refused ({verdict.code}): {verdict.reason}; no VM was touched",
               refusal=Refusal(code=verdict.code, reason=verdict.reason),
               extra={"reason_code": verdict.code, "reason": verdict.reason})


def _gone(ctx: Context, kube: KubePort, d: RemediationData) -> bool:
    """No Node named ``d.node`` in the cluster, and ARM lists no machine of that name in ``d.pool``."""
    if kube.get_node(d.node) is not None:
        return False
    aks = ctx.access.aks()
    if aks.get_pool(d.cluster, d.pool) is None:
        return True
    return all(m.name != d.node for m in aks.list_machines(d.cluster, d.pool))


def block(record: Record, ctx: Context, kube: KubePort, *, now: float, code: str, reason: str,
          what: str) -> Transition:
    """End a remediation whose row the world does not bear out: ``blocked``, with the reason, a Blocked
    event and a Warning on the node, and nothing touched (shared.remediation.preconditions). A cordon
    carrying this record's marker is left for an operator, like any cordon in doubt."""
    return end(record, ctx, kube, State.BLOCKED, now=now, event=Event.BLOCKED,
               note=f"blocked before {what} ({code}): {reason}; nothing was touched",
               refusal=Refusal(code=code, reason=reason), extra={"reason_code": code, "reason": reason})


def uncordon_if_ours(kube: KubePort, record: Record) -> bool:
    """Uncordon only a node we cordoned for this remediation, and drop our markers."""
    d = load(record)
    if not d.cordoned_by_us:
        return False
    node = kube.get_node(d.node)
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


#: A step that runs this much later than it was due (beyond one poll) ran late because the steward was away:
#: a crashed host's claim held the record until its lease expired (shared/kernel/reconciler.py ``LEASE_S``), a
#: nudge was lost and the timer came late. That time is not Azure's: a rung's timeout bounds how long Azure
#: may take, so it is credited to the rung, up to :data:`AWAY_MAX_TIMEOUTS` times the timeout (a steward late
#: at every step must still end the rung). Soak seed 961026: two crashes each cost a 120 s lease inside a
#: 240 s replace whose deleteMachines had worked, and the rung gave up with the pool one node short.
AWAY_MAX_TIMEOUTS = 2


def away_s(record: Record, *, now: float, policy: RemediationPolicy, timeout: float) -> float:
    """The rung's credit for the steward's absence so far, with this step's lateness added."""
    d = load(record)
    late = now - record.next_at - policy.poll_s if record.next_at > 0 else 0.0
    credit = float(d.rung_away_s or 0.0) + max(0.0, late)
    return min(credit, AWAY_MAX_TIMEOUTS * float(timeout))


def away_note(away: float) -> str:
    """How a give-up names the credit: the rung waited longer than its timeout because the steward was away."""
    return f" (plus {away:.0f}s the steward was away)" if away >= 1.0 else ""

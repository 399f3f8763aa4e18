"""The restart and reimage rungs: one VM action through Compute, sent at most once per rung across crashes.

The reconciler saves a step's result only after the step returns, so a host killed inside
``begin_restart`` would leave the rung at ``start`` and its successor would restart the VM again. So
before the call the step inserts an operation marker (kind ``dedupe``, id
``op-<remediation>-<rung index>-<rung>-<n>``; insert-if-absent is atomic): whoever finds the marker
already there knows the call may have gone out, and never calls blindly. It moves to
``rung_phase=requested`` and decides from the node: a reboot or reimage shows as a Ready transition at
or after the request time (the node controller marks a silent kubelet Unknown within its
node-monitor-grace-period, 40-50 s, and a GPU VM takes longer than that to boot), as a new Node uid (a
reimage may re-register) or as a new bootID; that means it happened -> ``wait``. Only a node that is
still the same object and has stayed Ready since before the request, once the grace below has passed,
is positive evidence that the call never took effect: then it is issued once more, under marker n+1.
Anything else (node gone, not Ready, no Ready condition) is not evidence either way, so it is not
repeated; the rung's timeout escalates if the node does not recover.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from shared.fleet import node_fate
from shared.kernel.errors import (
    Conflict,
    Invalid,
    NotFound,
    OperationInProgress,
    StewardError,
    Throttled,
    Transient,
    VmActionDenied,
    VmActionImpossible,
)
from shared.kernel.ports import KubePort, NodeView, Record
from shared.kernel.steps import Transition, move, stay
from shared.kernel.timefmt import iso
from shared.remediation import preconditions
from shared.remediation.ladder import admitted_vm, block, escalate_to_replace, next_rung, refuse_untrusted
from shared.remediation.notify import kube_event
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    DEDUPE_KIND,
    OpMarker,
    RemediationData,
    Rung,
    RungPhase,
    State,
    decode,
    fields,
    load,
    op_key,
    to_data,
)

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation")


def reissue_grace(policy: RemediationPolicy) -> float:
    """How long after a request a restart/reimage (or deleteMachines) that happened must have shown."""
    return max(policy.settle_s, 2 * policy.poll_s)


def booted_since(node: NodeView, boot_before: str) -> bool:
    """The node's bootID differs from the one seen before the request: it booted, however briefly."""
    return bool(boot_before and node.boot_id and node.boot_id != boot_before)


def vm_action_seen(node: NodeView | None, d: RemediationData, *, since: float, boot_before: str = "") -> tuple[bool, str]:
    """(whether the node cannot rule out a restart/reimage requested at ``since``, why).

    ``boot_before`` is the node's bootID read just before the request: a reboot fast enough that
    Ready never left True (and so kept its transition time) still changes it.
    """
    if node is None:
        return True, "the node is not registered (reimaging, or removed)"
    if node.uid != d.node_uid:
        return True, "the node re-registered (new uid)"
    if booted_since(node, boot_before):
        return True, "the node booted again (new bootID)"
    ready = node.condition("Ready")
    if ready is None or ready.last_transition is None:
        return True, "the node's Ready condition has no transition time"
    if ready.last_transition >= since:
        return True, f"Ready turned {ready.status} at {iso(ready.last_transition)}"
    if ready.status != "True":
        return True, f"the node is not Ready ({ready.status})"
    return False, f"Ready has stayed True since {iso(ready.last_transition)}, before the request"


def forget_marker(ctx: Context, marker: Record) -> None:
    """Azure answered without acting: drop the marker so the next try may call (best effort)."""
    try:
        ctx.ledger.delete(marker)
    except StewardError as exc:  # the next try treats the call as uncertain: slower, still safe
        log.info("operation marker %s not dropped: %s", marker.id, exc)


def request(record: Record, ctx: Context, kube: KubePort, *, node: NodeView | None, rung: Rung,
            policy: RemediationPolicy, now: float) -> Transition:
    """The rung's phases before its action took hold (``start``, ``requested``): issue the restart/reimage,
    or judge a request whose answer was lost."""
    d = load(record)
    if d.rung_phase == RungPhase.REQUESTED and d.vm_id:
        proof = _request_proven(ctx, record, d, node, rung)
        if not proof.ok:
            return block(record, ctx, kube, now=now, code=proof.code, reason=proof.reason,
                         what=f"judging the {rung} request")
        # Judged from the node and the VM recorded with the request; ARM is read again only if the
        # request is issued once more (in _issue, right before the call).
        return _check_requested(record, ctx, kube, node=node, vm=d.vm_id, rung=rung, seq=d.op_seq or 1,
                                requested_at=d.requested_at or now, boot_before=d.boot_id_before, policy=policy, now=now)
    seq = (d.op_seq or 1) if d.rung_phase == RungPhase.REQUESTED else 1
    return _issue(record, ctx, kube, node=node, rung=rung, seq=seq, policy=policy, now=now)


def _request_proven(ctx: Context, record: Record, d: RemediationData, node: NodeView | None,
                    rung: Rung) -> preconditions.Proof:
    """A row that says its restart/reimage was requested is judged from the node (did it reboot since?) only
    when this remediation's own marks prove the request: the operation marker inserted before every call
    (:func:`_issue`), and, while the node is the one admitted, this record's cordon on it (a VM action is
    only ever issued under it). A row anyone can write otherwise turns a node that merely joined or
    rebooted after the claimed time into a "restart" that never happened, reported Restarted and Recovered
    (soak seed 940032: a forged ``repairing/restart/requested`` row on a surge node that had just joined)."""
    marker = ctx.ledger.get(DEDUPE_KIND, op_key(record.id, d.rung_index, rung, d.op_seq or 1))
    try:
        op = decode(marker.data, OpMarker) if marker is not None else None
    except (msgspec.ValidationError, TypeError, ValueError):
        op = None
    if op is None or op.remediation != record.id:
        return preconditions.Proof.refuse(preconditions.NOT_ADMITTED, f"the row says a {rung} was requested, and no "
                                                                      "operation marker of this remediation records it")
    if node is not None and node.uid == d.node_uid:
        return preconditions.marked(node, record.id)
    return preconditions.PROVEN


def _issue(record: Record, ctx: Context, kube: KubePort, *, node: NodeView | None, rung: Rung, seq: int,
           policy: RemediationPolicy, now: float) -> Transition:
    """Read the VM from ARM (refused unless the node and its VM are still the ones admitted), insert the
    operation marker, then call begin_restart / begin_reimage (see the module's docstring)."""
    d = load(record)
    verdict = admitted_vm(ctx, node, record, action="restarted" if rung == Rung.RESTART else "reimaged")
    if not verdict.ok:
        return refuse_untrusted(record, ctx, kube, now=now, verdict=verdict)
    vm = verdict.vm_id
    if node is not None:  # right before the call: this record's cordon, the node drained (never the row's word)
        proof = preconditions.before_vm_action(ctx, kube, record, d, node, settings=ctx.settings.drain, now=now)
        if not proof.ok:
            return block(record, ctx, kube, now=now, code=proof.code, reason=proof.reason, what=f"the {rung}")
    key = op_key(record.id, d.rung_index, rung, seq)
    boot = node.boot_id if node is not None else ""
    try:
        marker = ctx.ledger.create(Record(kind=DEDUPE_KIND, id=key, state=RungPhase.REQUESTED, created_at=now,
                                          updated_at=now,
                                          data=to_data(OpMarker(remediation=record.id, rung=rung, vm_id=vm,
                                                                requested_at=now, by=ctx.instance, boot_id=boot))))
    except Conflict:
        prior = ctx.ledger.get(DEDUPE_KIND, key)
        op = decode(prior.data, OpMarker) if prior is not None else None
        at = (op.requested_at or prior.created_at) if op is not None and prior is not None else now
        return _check_requested(record, ctx, kube, node=node, vm=vm, rung=rung, seq=seq, requested_at=at,
                                boot_before=op.boot_id if op is not None else "", policy=policy, now=now)
    compute = ctx.access.compute()
    try:
        # cluster_id: the gate then requires the VM in this cluster's own node resource group
        (compute.begin_restart if rung == Rung.RESTART else compute.begin_reimage)(vm, cluster_id=d.cluster)
    except VmActionDenied as exc:
        forget_marker(ctx, marker)  # Azure answered without acting
        return escalate_to_replace(record, ctx, kube, now=now, code=str(exc.code or "denied"),
                                   why=f"Azure denied the {rung}: {exc}")
    except VmActionImpossible as exc:
        forget_marker(ctx, marker)  # Azure answered without acting
        # 409 OperationNotAllowed says only "not in the VM's current state". Escalate on the node's own
        # evidence that its VM cannot act (stopped or deallocated, e.g. an evicted spot VM: the cloud node
        # lifecycle controller's shutdown taint; or no Node at all); otherwise the VM is busy with
        # something else: wait, bounded by the rung's timeout (steps.step_repairing).
        now_node = kube.get_node(d.node)
        if now_node is None or node_fate.is_shut_down(now_node):
            state = "is not registered" if now_node is None else "is shut down (its VM is stopped or deallocated)"
            return escalate_to_replace(record, ctx, kube, now=now, code=str(exc.code or "impossible"),
                                       why=f"Azure cannot do the {rung} and the node {state}: {exc}")
        return stay(record, now=now, until=now + policy.poll_s,
                    note=f"waiting to {rung}: Azure cannot do it in the VM's current state ({exc}); the node "
                         f"shows no shutdown, so it is taken as busy")
    except OperationInProgress as exc:
        forget_marker(ctx, marker)  # Azure answered without acting: another operation runs
        return stay(record, now=now, until=now + policy.poll_s, note=f"waiting to {rung}: {exc}")
    except (Invalid, NotFound) as exc:
        forget_marker(ctx, marker)
        return next_rung(record, ctx, kube, now=now, why=f"Azure refused the {rung}: {exc}")
    except Throttled:
        forget_marker(ctx, marker)
        raise
    except Transient as exc:  # it may have reached Azure: judge by the node, never by a second call
        return move(record, State.REPAIRING, now=now, next_at=now + policy.poll_s,
                    note=f"the {rung} call for {vm} failed in transit ({exc}): watching the node for it",
                    **fields(rung_phase=RungPhase.REQUESTED, requested_at=now, op_seq=seq, vm_id=vm,
                             boot_id_before=boot))
    note = f"{rung} of {vm} started" + (f" (issued again: request {seq - 1} never took effect)" if seq > 1 else "")
    kube_event(kube, node or d.node, record, f"Steward{rung.title()}Started", note)
    return move(record, State.REPAIRING, now=now, next_at=now + policy.poll_s, note=note,
                **fields(rung_phase=RungPhase.WAIT, rung_started_at=now, requested_at=now, op_seq=seq, vm_id=vm,
                         boot_id_before=boot))


def _check_requested(record: Record, ctx: Context, kube: KubePort, *, node: NodeView | None, vm: str, rung: Rung,
                     seq: int, requested_at: float, boot_before: str, policy: RemediationPolicy,
                     now: float) -> Transition:
    """A restart/reimage may have been issued at ``requested_at`` by a step whose result was lost."""
    d = load(record)
    known = fields(requested_at=requested_at, op_seq=seq, vm_id=vm, boot_id_before=boot_before)
    seen, why = vm_action_seen(node, d, since=requested_at, boot_before=boot_before)
    if seen:
        note = f"{rung} of {vm} requested at {iso(requested_at)} by a step that did not finish: {why}; not repeated"
        kube_event(kube, node or d.node, record, f"Steward{rung.title()}Started", note)
        return move(record, State.REPAIRING, now=now, next_at=now + policy.poll_s, note=note,
                    **fields(rung_phase=RungPhase.WAIT, rung_started_at=requested_at), **known)
    grace_end = requested_at + reissue_grace(policy)
    if now < grace_end:
        note = (f"{rung} of {vm} requested at {iso(requested_at)} by a step that did not finish: "
                f"waiting until {iso(grace_end)} for it to show ({why})")
        next_at = min(grace_end, now + policy.poll_s)
        if d.rung_phase == RungPhase.REQUESTED:
            return stay(record, now=now, until=next_at, note=note, **known)
        return move(record, State.REPAIRING, now=now, next_at=next_at, note=note,
                    **fields(rung_phase=RungPhase.REQUESTED), **known)
    log.warning("%s of %s requested at %s never took effect (%s): issuing it again", rung, vm, iso(requested_at), why)
    return _issue(record, ctx, kube, node=node, rung=rung, seq=seq + 1, policy=policy, now=now)

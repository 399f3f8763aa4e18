"""The replace rung: a new node for the broken one, through the AKS API (or Karpenter's NodeClaim).

Surge-first on a VMSS pool: count+1, wait for the new node, delete the broken machine (count back to
N). Without quota or capacity (or on an autoscaled pool) it is delete-then-scale: delete the machine,
then PUT the original count back, and the pool is one node short until the new VM is allocated. On a
node auto-provisioning node it deletes the NodeClaim and Karpenter does the rest.

One replace per pool at a time. A replace reads the pool's count at its start and takes "a node of the
pool created after the rung started" as its replacement, so two replaces overlapping in one pool see
each other's count changes and new nodes (soak seed 1040: a delete-first replace dropped the count, a
surge started from the lowered count, and both took the surge node). So a replace leaves its start
only with the pool's turn: no other active remediation of the pool is in its replace rung past its
start (read from the ledger), and it holds the turn marker (kind ``dedupe``, id
``replace-turn-<sha256(cluster/pool)>``, insert-if-absent, so of two records starting at once exactly
one gets it). The marker is dropped when the holder finishes or leaves the rung
(``ladder.drop_pool_turn``); a marker whose holder is no longer active in its replace rung (a lost
drop) is stale and taken over. Independently, a replacement node is claimed with an insert-if-absent
marker (``replacement-<sha256(cluster/node/uid)>``) before a remediation takes it: a node is never the
replacement of two remediations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet.pool_clone import update_properties
from shared.fleet.pool_writes import precondition
from shared.kernel.errors import (
    AllocationFailed,
    Conflict,
    Invalid,
    NotFound,
    OperationInProgress,
    QuotaExceeded,
    Throttled,
)
from shared.kernel.ports import KubePort, NodeView, PoolInfo, Record
from shared.kernel.steps import Transition, move, stay
from shared.kernel.timefmt import iso
from shared.remediation import health, preconditions
from shared.remediation.ladder import (
    admitted_vm,
    away_note,
    block,
    end,
    escalation_extra,
    give_up_now,
    next_rung,
    refuse_untrusted,
)
from shared.remediation.notify import announce, announcement, kube_event
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    ACTIVE_STATES,
    DEDUPE_KIND,
    KIND,
    POOL_LABEL,
    ClaimMarker,
    Event,
    OpMarker,
    RemediationData,
    ReplaceData,
    ReplaceMode,
    Rung,
    RungPhase,
    State,
    TurnMarker,
    claim_key,
    decode,
    fields,
    load,
    op_key,
    to_data,
    turn_key,
)
from shared.remediation.vm_actions import forget_marker, reissue_grace

if TYPE_CHECKING:
    from shared.kernel.context import Context

_BUSY_POOL_STATES = frozenset({"Creating", "Updating", "Scaling", "Deleting", "Upgrading"})


def pool_body(pool: PoolInfo, count: int) -> dict[str, Any]:
    """The pool's own GET body (every field; read on the api-version that shows them all) with only
    ``count`` changed: a PUT is create-or-replace, so a field left out would be reset. The adapter
    sends it on the preview api-version when it carries a preview-only field (a MIG pool)."""
    return {"properties": update_properties(pool, count=count)}


def _replacing(d: RemediationData, state: str) -> bool:
    """Whether a record is in its replace rung past the start (it may be changing its pool's count)."""
    return state in (State.REPAIRING, State.VERIFYING) and d.rung == Rung.REPLACE and d.rung_phase != RungPhase.START


def take_pool_turn(record: Record, ctx: Context, *, now: float) -> str | None:
    """Take the pool's replace turn for ``record``; None when taken (or already ours), else whom we wait for."""
    d = load(record)
    for other in ctx.ledger.list(KIND, states=sorted(ACTIVE_STATES)):
        o = load(other)
        if (other.id != record.id and o.cluster.lower() == d.cluster.lower() and o.pool == d.pool
                and _replacing(o, other.state)):
            return other.id
    key = turn_key(d.cluster, d.pool)
    for _ in range(3):
        try:
            ctx.ledger.create(Record(kind=DEDUPE_KIND, id=key, state="held", created_at=now, updated_at=now,
                                     data=to_data(TurnMarker(remediation=record.id, cluster=d.cluster, pool=d.pool,
                                                             at=now, by=ctx.instance))))
            return None
        except Conflict:
            turn = ctx.ledger.get(DEDUPE_KIND, key)
        if turn is None:
            continue  # dropped meanwhile: try again
        holder = str(turn.data.get("remediation") or "")
        if holder == record.id:
            return None  # ours (a step that took it did not finish)
        holding = ctx.ledger.get(KIND, holder) if holder else None
        if (holding is not None and holding.state in (State.REPAIRING, State.VERIFYING)
                and load(holding).rung == Rung.REPLACE):
            return holder
        try:  # the holder finished or left its replace rung and its drop was lost: stale
            ctx.ledger.delete(turn)
        except Conflict:
            continue
    return "another remediation"


def _claim(ctx: Context, record: Record, node: NodeView, *, now: float) -> bool:
    """Claim ``node`` as ``record``'s replacement; False when another remediation claimed it first."""
    d = load(record)
    key = claim_key(d.cluster, node.name, node.uid)
    try:
        ctx.ledger.create(Record(kind=DEDUPE_KIND, id=key, state="claimed", created_at=now, updated_at=now,
                                 data=to_data(ClaimMarker(remediation=record.id, cluster=d.cluster, pool=d.pool,
                                                          node=node.name, uid=node.uid))))
        return True
    except Conflict:
        prior = ctx.ledger.get(DEDUPE_KIND, key)
        return prior is not None and prior.data.get("remediation") == record.id


def arrivals(ctx: Context, record: Record, kube: KubePort, *, since: float, policy: RemediationPolicy,
             now: float) -> tuple[NodeView | None, tuple[NodeView, str] | None]:
    """The nodes of the pool created after the rung started, from one listing: the healthy replacement this
    replace claims (Ready, healthy, with GPUs, claimed by us), else the node AKS made for it that is not a
    healthy replacement and why (the newcomer: not deleting, not claimed by another remediation; the VM this
    replace asked for, one replace per pool at a time, come up with a fault of its own or still coming up)."""
    d = load(record)
    selector = d.pool_selector or f"{POOL_LABEL}={d.pool}"
    came: tuple[NodeView, str] | None = None
    for n in kube.list_nodes(label_selector=selector, page_size=policy.page_size):
        if n.name == d.node or n.created < since - 1.0:
            continue
        recovered, why = health.is_recovered(n, policy=policy)
        if recovered:
            if _claim(ctx, record, n, now=now):
                return n, None
            continue  # a healthy one another remediation claimed
        if came is None and n.deletion_timestamp is None:
            prior = ctx.ledger.get(DEDUPE_KIND, claim_key(d.cluster, n.name, n.uid))
            if prior is None or prior.data.get("remediation") == record.id:  # else another remediation's
                came = (n, why)
    return None, came


def replacement(ctx: Context, record: Record, kube: KubePort, *, since: float, policy: RemediationPolicy,
                now: float) -> NodeView | None:
    """A node of the pool created after ``since``, Ready, healthy, with GPUs, and claimed by us."""
    return arrivals(ctx, record, kube, since=since, policy=policy, now=now)[0]


def faulty_on_its_own(node: NodeView, *, policy: RemediationPolicy, now: float) -> str:
    """The fault the sweep itself would act on for ``node`` (a configured condition ``True`` past its
    threshold, the node past its start-up grace, Ready, nobody else's cordon); empty when none (pure)."""
    found = health.evaluate([node], now=now, policy=policy).unhealthy
    return f"{found[0].condition} True since {iso(found[0].since)}" if found else ""


def no_healthy_replacement(record: Record, ctx: Context, kube: KubePort, *, now: float, count: int,
                           came: tuple[NodeView, str] | None, why: str, rep: ReplaceData) -> Transition:
    """Give up after the broken machine was deleted and the pool's count restored, with no healthy node for it.

    The ladder is over (the node is gone: no rung can follow), and the record says which node came instead
    and why it is not a replacement (``replace.newcomer``), so that an operator, and the soak's oracle, can
    tell a replacement that came up with a fault of its own from capacity that never came. That node's fault
    is its own: the sweep judges it like any node's once this remediation has freed its budget slot.
    """
    d = load(record)
    if came is not None:
        node = came[0]
        rep = msgspec.structs.replace(rep, newcomer=node.name)
        note = (f"replace: {d.node} is deleted and pool {d.pool} is at {count} (was {rep.original_count}), but the node "
                f"that came for it, {node.name}, is not healthy ({why}): every rung failed; {node.name}'s fault is its "
                f"own and is judged like any node's")
        kube_event(kube, node.name, record, "StewardReplacementUnhealthy", note, "Warning")
    else:
        note = (f"replace: {d.node} is deleted and pool {d.pool} is at {count} (was {rep.original_count}), but no new node came "
                f"({why}): every rung failed; the pool is one GPU node short")
    record = msgspec.structs.replace(record, data={**record.data, **fields(replace=rep)})
    return give_up_now(record, ctx, kube, now=now, note=note)


def replaced(record: Record, ctx: Context, kube: KubePort, *, now: float, target: str, rep: ReplaceData) -> Transition:
    d = load(record)
    note = f"{d.node} replaced by {target}" + (f"; {rep.note}" if rep.note else "")
    kube_event(kube, target, record, "StewardReplaced", note)
    moved = move(record, State.VERIFYING, now=now, note=note, **fields(verify_since=now, target=target, replace=rep))
    return announce(moved, record, Event.REPLACED, note, extra={"replacement": target, **escalation_extra(record)})


def step_replace(record: Record, ctx: Context, kube: KubePort, *, policy: RemediationPolicy, now: float) -> Transition:
    """One step of the replace rung (see the module's docstring)."""
    d = load(record)
    rep = d.replace
    phase = d.rung_phase
    started = d.rung_started_at or now
    if d.nap:
        # The rung's timeout runs from the NodeClaim's delete (rung_started_at): a node Karpenter never
        # terminates must not hold the ladder forever. ``await_replacement`` (the node is gone) ends on
        # its own once the settle time has passed.
        if phase not in (RungPhase.START, RungPhase.AWAIT_REPLACEMENT) and \
                now >= started + policy.rung_timeout("replace") + d.rung_away_s:
            return next_rung(record, ctx, kube, now=now,
                             why=f"replacement not finished within {policy.rung_timeout('replace')}s"
                                 f"{away_note(d.rung_away_s)} (phase "
                                 f"{phase}; NodeClaim {rep.nodeclaim or '?'} deleted, {d.node} not terminated)")
        return replace_nodeclaim(record, ctx, kube, policy=policy, now=now)
    aks = ctx.access.aks()
    pool = aks.get_pool(d.cluster, d.pool)
    if pool is None:
        return next_rung(record, ctx, kube, now=now, why=f"pool {d.pool} not found")
    if phase != RungPhase.START and now >= started + policy.rung_timeout("replace") + d.rung_away_s:
        timeout = policy.rung_timeout("replace")
        # A pool whose last operation failed says why (a scale a locked node resource group or a quota
        # refused: soak seeds 958002, 958013), so the operator reads Azure's reason, not only "not finished".
        failed = (f"; pool {d.pool} is {pool.provisioning_state}: {': '.join(pool.provisioning_error)}"
                  if pool.operation_ended_undone else "")
        if record.data.get("_last_error"):  # the reconciler's note of the last step that raised
            failed += f"; last step error: {str(record.data['_last_error'])[:200]}"
        if phase == RungPhase.AWAIT_REPLACEMENT:  # the machine is gone: no rung can follow
            new, came = arrivals(ctx, record, kube, since=started, policy=policy, now=now)
            if new is not None:
                # Found late (the step ran long after its poll: a lost nudge, a crash) is found all the same:
                # the timeout bounds the waiting, it does not discard a replacement that came in time (soak
                # seed 959002: a healthy replacement for 70 s, and the rung gave up on "no new node").
                return replaced(record, ctx, kube, now=now, target=new.name,
                                rep=msgspec.structs.replace(rep, replacement=new.name, found_at=now))
            return no_healthy_replacement(record, ctx, kube, now=now, count=pool.count, came=came, rep=rep,
                                          why=(f"{came[1]} after {timeout}s{away_note(d.rung_away_s)}"
                                               if came is not None
                                               else f"not within {timeout}s{away_note(d.rung_away_s)}") + failed)
        return next_rung(record, ctx, kube, now=now,
                         why=f"replacement not finished within {timeout}s{away_note(d.rung_away_s)} (phase {phase}; "
                             f"pool count {pool.count}, was {rep.original_count}; last: {d.last_note[:200]}){failed}")

    def go(next_phase: RungPhase, note: str, wait: bool = False, **changes: Any) -> Transition:
        return move(record, State.REPAIRING, now=now, note=note, next_at=now + policy.poll_s if wait else now,
                    **fields(rung_phase=next_phase, replace=msgspec.structs.replace(rep, **changes)))

    def waiting(note: str) -> Transition:
        return stay(record, now=now, until=now + policy.poll_s, note=note)

    if phase == RungPhase.START:
        waiting_for = take_pool_turn(record, ctx, now=now)
        if waiting_for is not None:
            return waiting(f"waiting: remediation {waiting_for} is replacing a node of pool {d.pool} "
                           f"(one replace per pool at a time)")
        autoscaled = bool(pool.properties.get("enableAutoScaling"))
        surge = policy.surge and not autoscaled
        note = (f"replacing {d.node}: surge to {pool.count + 1} first" if surge else
                f"replacing {d.node}: delete then restore count {pool.count}"
                + (" (autoscaled pool: the autoscaler owns the count)" if autoscaled else ""))
        rep = ReplaceData(original_count=pool.count, target_count=pool.count + 1, autoscaled=autoscaled,
                          mode=ReplaceMode.SURGE if surge else ReplaceMode.DELETE_FIRST)
        return move(record, State.REPAIRING, now=now, note=note,
                    **fields(rung_phase=RungPhase.SURGE if surge else RungPhase.DELETE, rung_started_at=now, replace=rep))
    original = int(rep.original_count or 0)
    if phase in (RungPhase.SURGE, RungPhase.DELETE, RungPhase.SCALE_BACK) and pool.provisioning_state in _BUSY_POOL_STATES:
        return waiting(f"waiting: pool {d.pool} is {pool.provisioning_state}")
    if phase == RungPhase.SURGE:
        target_count = int(rep.target_count or original + 1)
        if pool.count < target_count:
            try:
                # If-Match the pool as read: 412 (it changed since: another scale, an operator's edit)
                # -> Conflict: look again
                aks.begin_put_pool(d.cluster, d.pool, pool_body(pool, target_count), etag=precondition(aks, pool))
            except OperationInProgress as exc:
                return waiting(f"waiting: {exc}")
            except (QuotaExceeded, AllocationFailed) as exc:
                note = (f"surge refused ({exc.code or type(exc).__name__}: {exc}): falling back to delete-then-scale; "
                        f"the pool is one GPU node short until the new VM is allocated")
                kube_event(kube, d.node, record, "StewardSurgeFallback", note, "Warning")
                return go(RungPhase.DELETE, note, mode=ReplaceMode.DELETE_FIRST, surge_error=str(exc)[:300])
        return go(RungPhase.SURGE_WAIT, f"pool {d.pool} scaling to {target_count}", wait=True)
    if phase == RungPhase.SURGE_WAIT:
        new, came = arrivals(ctx, record, kube, since=started, policy=policy, now=now)
        if new is not None:
            return go(RungPhase.DELETE, f"replacement {new.name} is Ready with GPUs: deleting {d.node}",
                      replacement=new.name, found_at=now)
        if pool.operation_ended_undone:
            note = f"the surge ended {pool.provisioning_state}: falling back to delete-then-scale"
            kube_event(kube, d.node, record, "StewardSurgeFallback", note, "Warning")
            return go(RungPhase.DELETE, note, mode=ReplaceMode.DELETE_FIRST)
        return waiting("waiting for the surge node"
                       + (f" ({came[0].name} came up: {came[1]})" if came is not None else ""))
    if phase == RungPhase.DELETE:
        return _delete(record, ctx, kube, d=d, policy=policy, now=now, go=go)
    if phase == RungPhase.DELETE_WAIT:
        node = kube.get_node(d.node)
        if node is not None and node.uid == d.node_uid:
            if pool.operation_ended_undone and node.deletion_timestamp is None:
                # deleteMachines is over (Failed, or Canceled by an abort) and the machine is still here:
                # the delete will not happen by itself, so waiting would only hold the rung to its timeout.
                return next_rung(record, ctx, kube, now=now,
                                 why=f"deleteMachines of {d.node} ended {pool.provisioning_state} with the node still "
                                     f"there (pool {d.pool})")
            return waiting(f"waiting for {d.node} to be deleted")
        if pool.provisioning_state != "Succeeded" and not pool.operation_ended_undone:
            return waiting(f"pool is {pool.provisioning_state}")
        if rep.mode == ReplaceMode.SURGE and rep.replacement:
            if pool.count > original:
                rep = msgspec.structs.replace(rep, note=(
                    f"pool count stayed {pool.count} after deleteMachines (original {original}): "
                    f"left as is rather than scale down an arbitrary node"))
            return replaced(record, ctx, kube, now=now, target=rep.replacement, rep=rep)
        if rep.autoscaled:
            note = f"{d.node} deleted; the cluster autoscaler owns the pool's count and brings capacity back on demand"
            kube_event(kube, d.node, record, "StewardReplaced", note)
            return _replaced_then(end(record, ctx, kube, State.DONE, now=now, event=Event.RECOVERED, note=note,
                                      replace=rep), record, note, extra={"replacement": ""})
        if pool.count < original:
            return go(RungPhase.SCALE_BACK, f"machine deleted; restoring count {original} (now {pool.count})")
        return go(RungPhase.AWAIT_REPLACEMENT, "machine deleted; waiting for its replacement", wait=True)
    if phase == RungPhase.SCALE_BACK:
        if pool.count < original:
            try:
                aks.begin_put_pool(d.cluster, d.pool, pool_body(pool, original), etag=precondition(aks, pool))
            except (Invalid, OperationInProgress) as exc:
                # Busy, or no quota/capacity right now: keep trying until the rung's timeout.
                return waiting(f"waiting to restore the count: {exc}")
        return go(RungPhase.AWAIT_REPLACEMENT, f"pool {d.pool} scaling back to {original}", wait=True)
    if phase == RungPhase.AWAIT_REPLACEMENT:
        new, came = arrivals(ctx, record, kube, since=started, policy=policy, now=now)
        if new is not None:
            return replaced(record, ctx, kube, now=now, target=new.name,
                            rep=msgspec.structs.replace(rep, replacement=new.name, found_at=now))
        fault = faulty_on_its_own(came[0], policy=policy, now=now) if came is not None else ""
        if came is not None and fault:
            # It came up with a fault the sweep itself acts on: the rung failed, known now, not at its
            # timeout. Waiting would hold this remediation's budget slot, which that node's own repair needs
            # (soak seed 955084: its fault refused ``budget-fleet`` until this one gave up at the timeout).
            return no_healthy_replacement(record, ctx, kube, now=now, count=pool.count, came=came, rep=rep, why=fault)
        if (came is None and pool.count < original and pool.provisioning_state == "Succeeded"
                and not rep.autoscaled):
            # The count is below the rung's start and the pool is idle with its last operation done: the
            # scale-back did not hold (the count dropped after it was read, or the PUT never took). Restoring
            # it is SCALE_BACK's own idempotent PUT; waiting would only run the rung into its timeout.
            return go(RungPhase.SCALE_BACK, f"pool {d.pool} is at {pool.count}, below {original}: restoring it")
        return waiting("waiting for the replacement node"
                       + (f" ({came[0].name} came up: {came[1]})" if came is not None else ""))
    raise Invalid(f"unknown replace phase {phase!r}")


def _replaced_then(ended: Transition, record: Record, note: str, *, extra: dict[str, Any]) -> Transition:
    """``ended`` with Replaced published before its own events (the story reads Replaced, then Recovered)."""
    return Transition(ended.record, ended.outcome,
                      (announcement(record, Event.REPLACED, note, extra=extra), *ended.events))


def replace_nodeclaim(record: Record, ctx: Context, kube: KubePort, *, policy: RemediationPolicy,
                      now: float) -> Transition:
    """Replace a node auto-provisioning node the Karpenter way: delete its NodeClaim.

    Karpenter's termination controller then deletes the node and its VM (the node is already cordoned
    and drained by us) and provisions a new node when pods are pending (kubernetes-sigs/karpenter
    pkg/controllers/node/termination, pkg/controllers/provisioning). Deleting a NodeClaim is idempotent
    (a claim already terminating is unaffected; a claim that is gone matches nothing), so a step that
    resumes after a crash may simply send it again. A replacement is a Ready, healthy node of the same
    NodePool created after the delete; if none comes (no pod asked for one), Karpenter owns the
    capacity and the remediation ends once the broken node is gone.
    """
    d = load(record)
    rep = d.replace
    node = kube.get_node(d.node)
    ours = node is not None and node.uid == d.node_uid
    if d.rung_phase == RungPhase.START:
        claim = kube.delete_nodeclaim(node_name=d.node, provider_id=d.provider_id or (node.provider_id if node else ""))
        if claim is None and ours:
            return next_rung(record, ctx, kube, now=now,
                             why=f"no Karpenter NodeClaim owns {d.node} (matched by providerID and node name)")
        note = (f"deleted NodeClaim {claim}: Karpenter deletes {d.node} and its VM and provisions a replacement "
                f"on demand" if claim else f"{d.node} and its NodeClaim are already gone")
        kube_event(kube, d.node, record, "StewardNodeClaimDeleted", note)
        return move(record, State.REPAIRING, now=now, next_at=now + policy.poll_s, note=note,
                    **fields(rung_phase=RungPhase.CLAIM_WAIT, rung_started_at=now,
                             replace=ReplaceData(mode=ReplaceMode.NODECLAIM, nodeclaim=claim or "")))
    if d.rung_phase == RungPhase.CLAIM_WAIT:
        if ours:
            return stay(record, now=now, until=now + policy.poll_s,
                        note=f"waiting for Karpenter to terminate {d.node} (NodeClaim {rep.nodeclaim})")
        return move(record, State.REPAIRING, now=now, next_at=now + policy.poll_s,
                    note=f"{d.node} is gone; waiting for Karpenter's replacement",
                    **fields(rung_phase=RungPhase.AWAIT_REPLACEMENT, replace=msgspec.structs.replace(rep, gone_at=now)))
    if d.rung_phase == RungPhase.AWAIT_REPLACEMENT:
        # Karpenter provisions for the pods our drain made pending, often before the NodeClaim was
        # deleted: a node of the NodePool made since the cordon counts (claimed, so never twice).
        new = replacement(ctx, record, kube, since=d.cordoned_at or record.created_at, policy=policy, now=now)
        if new is not None:
            return replaced(record, ctx, kube, now=now, target=new.name,
                            rep=msgspec.structs.replace(rep, replacement=new.name, found_at=now))
        gone_at = rep.gone_at or now
        if now >= gone_at + max(policy.settle_s, 2 * policy.poll_s):
            note = (f"{d.node} deleted through its NodeClaim; no replacement yet: Karpenter provisions one when "
                    f"pods need it (NodePool {d.pool})")
            kube_event(kube, d.node, record, "StewardReplaced", note)
            return _replaced_then(end(record, ctx, kube, State.DONE, now=now, event=Event.RECOVERED, note=note,
                                      replace=rep), record, note, extra={"replacement": "", **escalation_extra(record)})
        return stay(record, now=now, until=now + policy.poll_s, note="waiting for Karpenter's replacement node")
    raise Invalid(f"unknown NodeClaim replace phase {d.rung_phase!r}")


def _delete(record: Record, ctx: Context, kube: KubePort, *, d: RemediationData, policy: RemediationPolicy,
            now: float, go: Any) -> Transition:
    """deleteMachines of the broken node, sent at most once per marker (the VM rungs' rule, vm_actions)."""
    rep = d.replace
    aks = ctx.access.aks()
    node = kube.get_node(d.node)
    if node is not None and node.uid == d.node_uid and node.deletion_timestamp is None:
        # deleteMachines takes no If-Match (AgentPools_DeleteMachines declares none, AgentPools_Delete
        # does: Azure/azure-rest-api-specs specification/containerservice/resource-manager/
        # Microsoft.ContainerService/aks/stable/2025-10-01/managedClusters.json): so ARM is read again
        # right before it. The machine must still be this node (uid checked above) in
        # the User GPU pool admitted, and its VM the one admitted (``arm_vm_id``, shared.fleet.node_truth).
        verdict = admitted_vm(ctx, node, record, action="deleted")
        if not verdict.ok:
            return refuse_untrusted(record, ctx, kube, now=now, verdict=verdict)
        proof = preconditions.before_vm_action(ctx, kube, record, d, node, settings=ctx.settings.drain, now=now)
        if not proof.ok:  # this record's cordon, the node drained: proved from the node, not the row
            return block(record, ctx, kube, now=now, code=proof.code, reason=proof.reason, what="deleteMachines")
        # Not deleted yet as far as the node shows. The same operation marker as for restart/reimage
        # keeps a host that resumes after a kill inside deleteMachines from sending it again.
        seq = rep.delete_seq or 1
        key = op_key(record.id, d.rung_index, "delete", seq)
        try:
            marker = ctx.ledger.create(Record(
                kind=DEDUPE_KIND, id=key, state=RungPhase.REQUESTED, created_at=now, updated_at=now,
                data=to_data(OpMarker(remediation=record.id, rung=Rung.REPLACE, machine=d.node, requested_at=now,
                                      by=ctx.instance))))
        except Conflict:
            prior = ctx.ledger.get(DEDUPE_KIND, key)
            at = (decode(prior.data, OpMarker).requested_at or prior.created_at) if prior is not None else now
            machines = {m.name for m in aks.list_machines(d.cluster, d.pool)}
            if d.node not in machines:
                return go(RungPhase.DELETE_WAIT, f"machine {d.node} is gone (deleteMachines sent at {iso(at)})",
                          wait=True)
            if now < at + reissue_grace(policy):
                return stay(record, now=now, until=min(at + reissue_grace(policy), now + policy.poll_s),
                            note=f"deleteMachines of {d.node} sent at {iso(at)} by a step that did not "
                                 f"finish: waiting for it to show")
            # The pool is idle (not busy, checked above), the machine and its node are still there well
            # after the request: it never took effect. Send it once more, under the next marker.
            return stay(record, now=now, until=now, note=f"deleteMachines of {d.node} sent at {iso(at)} never took "
                                                         f"effect: sending it again",
                        **fields(replace=msgspec.structs.replace(rep, delete_seq=seq + 1)))
        try:
            aks.begin_delete_machines(d.cluster, d.pool, [d.node])
        except NotFound:
            pass  # already gone (the adapter also answers normally when every machine is gone)
        except OperationInProgress as exc:
            forget_marker(ctx, marker)
            return stay(record, now=now, until=now + policy.poll_s, note=f"waiting: {exc}")
        except (Invalid, Throttled):
            forget_marker(ctx, marker)  # Azure answered without acting: the reconciler decides what follows
            raise
    return go(RungPhase.DELETE_WAIT, f"deleting machine {d.node}", wait=True)

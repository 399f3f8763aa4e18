"""The remediation steps that wait on others: the drain (each eviction round proves its preconditions from
the world first) and the helpers that end a remediation whose fault cleared or cannot be re-read.

Split from :mod:`shared.remediation.steps` (which keeps the kind's contract and the other states).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import msgspec

from shared.drain.filters import plan_drain
from shared.drain.runner import DEADLINE_KEY, advance_drain, fetch_pdbs
from shared.drain.settings import DrainSettings
from shared.drain.state import DRAINED, REFUSED, STOPPED, TIMED_OUT, DrainState
from shared.kernel.ports import KubePort, Record
from shared.kernel.steps import Transition, move, stay
from shared.remediation import budget, fault_source, preconditions
from shared.remediation.ladder import block, end, release_slot, uncordon_if_ours
from shared.remediation.notify import announce, kube_event, metric
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    BUDGET_ID,
    BUDGET_KIND,
    DEDUPE_KIND,
    BudgetData,
    Event,
    OpMarker,
    Rung,
    RungPhase,
    State,
    decode,
    fields,
    load,
    op_key,
)

if TYPE_CHECKING:
    from shared.kernel.context import Context

# After giving its slot back, a PDB-held drain waits two sweeps, so the faults the sweep re-reports
# meanwhile are admitted into the slot first.
_SLOT_GIVEN_BACK_S = 120.0


def _slot_taken_at(ctx: Context, rid: str) -> float:
    """When this remediation last took its fleet budget slot (0: it holds none): the blocked-drain clock
    restarts from there, so a slot taken again is kept for the whole BUDGET_BLOCKED_DRAIN_SLOT_S anew."""
    rec = ctx.ledger.get(BUDGET_KIND, BUDGET_ID)
    slot = decode(rec.data, BudgetData).slots.get(rid) if rec is not None else None
    return slot.at if slot is not None else 0.0


def unconfirmed(record: Record, ctx: Context, kube: KubePort, *, since: float, why: str, now: float,
                 policy: RemediationPolicy, what: str) -> Transition:
    """The fault's source cannot answer: wait, and stop (releasing what we cordoned) once that has lasted
    longer than a restart may take: nothing is done on a guess."""
    bound = policy.rung_timeout(Rung.RESTART)
    if now - since >= bound:
        uncordon_if_ours(kube, record)
        return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                   note=f"the fault could not be re-read from its source for {bound}s ({why}): released before "
                        f"{what}, uncordoned if we cordoned it")
    return stay(record, now=now, until=now + policy.poll_s, note=f"waiting to re-read the fault before {what}: {why}")


def cleared(record: Record, ctx: Context, kube: KubePort, *, why: str, now: float, what: str) -> Transition:
    """The fault's source says the node is well again before ``what``: release it. The note says whether an
    earlier rung of this remediation acted, so an operator reading "released" knows if a restart or reimage
    happened (soak seed 963316: a restart cured the device plugin, another condition failed its verification,
    and that one cleared by itself before the reimage: the record had said "nothing repaired")."""
    uncordon_if_ours(kube, record)
    acted = _last_action(ctx, record)
    done = f"no {what.removeprefix('the ')} needed after the {acted} it did" if acted else "nothing repaired"
    return end(record, ctx, kube, State.RELEASED, now=now, event=Event.RECOVERED,
               note=f"re-read before {what}: {why}; released, uncordoned if we cordoned it, {done}")


def _last_action(ctx: Context, record: Record) -> str:
    """The last rung before the current one whose VM action this remediation requested ("" for none): its
    operation marker (``op_key``, written before the request) is the proof, not the ladder position, since an
    escalation skips rungs and a rung may time out before acting."""
    d = load(record)
    for index in range(min(d.rung_index, len(d.ladder)) - 1, -1, -1):
        rung = d.ladder[index]
        marker = ctx.ledger.get(DEDUPE_KIND, op_key(record.id, index, rung, 1))
        try:
            op = decode(marker.data, OpMarker) if marker is not None else None
        except (msgspec.ValidationError, TypeError, ValueError):
            op = None
        if op is not None and op.remediation == record.id:  # its own marker, not a row someone else wrote
            return str(rung)
    return ""


def drain_settings(ctx: Context, policy: RemediationPolicy) -> DrainSettings:
    """The drain of a repair: the app's pod rules, bounds and deadline (``Settings.drain``, the
    REMEDIATION_EMPTY_DIR ... REMEDIATION_EVICTION_RETRY_S settings) looked at again at remediation's
    own REMEDIATION_POLL_S, the interval every other wait of a remediation uses too."""
    base = ctx.settings.drain
    return base if base.poll_s == policy.poll_s else dataclasses.replace(base, poll_s=policy.poll_s)


def step_draining(record: Record, ctx: Context, *, now: float, policy: RemediationPolicy) -> Transition:
    """Evict the node's pods through the Eviction API: one round of the drain runner for a batch of
    one node (shared.drain decides which pods, and when; this step publishes the node's events)."""
    d = load(record)
    kube = ctx.access.kube(d.cluster)
    node = kube.get_node(d.node)
    if node is None or node.uid != d.node_uid:
        return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                   note="the node disappeared during the drain")
    if not d.dry_run:  # every eviction round starts from the world: our cordon, our slot, the fault's own source
        ours = preconditions.marked(node, record.id)
        if ours.code == preconditions.NOT_CORDONED:
            return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                       note="someone uncordoned the node during the drain: respecting that and stopping")
        if not ours.ok:
            return block(record, ctx, kube, now=now, code=ours.code, reason=ours.reason, what="an eviction round")
        if d.slot_released_at is not None and now < d.slot_released_at + _SLOT_GIVEN_BACK_S:
            return stay(record, now=now, until=d.slot_released_at + _SLOT_GIVEN_BACK_S,
                        note="drain paused, cordon kept: its budget slot was given back to faults waiting elsewhere")
        held, why_not = preconditions.reserve(ctx, kube, record, d, now=now, policy=policy)
        if not held:
            return stay(record, now=now, until=now + max(60, policy.poll_s),
                        note=f"drain paused, cordon kept: {why_not}")
        shows, why = fault_source.present(ctx, d, node)
        if shows is False:
            return cleared(record, ctx, kube, why=why, now=now, what="an eviction round")
        if shows is None:
            return unconfirmed(record, ctx, kube, since=d.drain_started_at or now, why=why, now=now, policy=policy,
                                what="an eviction round")
    pods = kube.list_pods(node_name=node.name)
    settings = drain_settings(ctx, policy)
    if d.dry_run:
        # The plan a real drain would start with, PDBs included (a pod under two PDBs refuses the node).
        plan = plan_drain(pods, settings, now=now, pdbs=fetch_pdbs(kube))
        refusal = plan.refusal()
        note = (f"dry run: would evict {len(plan.evict)} pods ({', '.join(f'{p.namespace}/{p.name}' for p in plan.evict[:10])}), "
                f"skip {len(plan.skip)}, blocked by policy {len(plan.blocked)}"
                + (f"; would refuse the node and evict nothing: {refusal}" if refusal else ""))
        return announce(move(record, State.REPAIRING, now=now, note=note,
                             **fields(rung_index=0, rung_phase=RungPhase.START)), record, Event.DRY_RUN, note, key="drain")
    result = advance_drain(kube, [node.name], previous={node.name: DrainState.from_data(d.drain)}, now=now,
                           settings=settings, pods={node.name: pods})
    this = result.nodes[node.name]
    state = this.state
    if state.outcome not in STOPPED:
        for message in this.new_messages()[:3]:
            kube_event(kube, node, record, "StewardDrainWaiting", message, "Warning")
    if state.outcome == DRAINED:
        started = d.drain_started_at or now
        metric(ctx, "drain_time_s", now - started)
        note = f"drained in {now - started:.0f}s"
        kube_event(kube, node, record, "StewardDrained", note)
        return announce(move(record, State.REPAIRING, now=now, note=note,
                             **fields(drain=state.to_data(), rung_index=0, rung_phase=RungPhase.START)),
                        record, Event.DRAINED, note)
    if state.outcome in (TIMED_OUT, *STOPPED):
        message = state.reason or state.messages.get(DEADLINE_KEY, "drain deadline reached")
        if state.outcome != TIMED_OUT:  # say why before the fallback's own event
            kube_event(kube, node, record, "StewardDrainRefused" if state.outcome == REFUSED
                       else "StewardDrainBlocked", message, "Warning")
        if policy.drain_fallback == "release":
            uncordon_if_ours(kube, record)
            return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED, drain=state.to_data(),
                       drain_outcome=state.outcome,
                       note=f"{message}; fallback release: uncordoned (if we cordoned it), nothing repaired")
        return end(record, ctx, kube, State.GAVE_UP, now=now, event=Event.GAVE_UP, drain=state.to_data(),
                   drain_outcome=state.outcome,
                   note=f"{message}; fallback hold: the node stays cordoned, move or evict these pods, then "
                        f"uncordon or repair it yourself")
    wake = result.wake_at if result.wake_at is not None else now + policy.poll_s
    held_since = budget.blocked_since(state)
    if not d.dry_run and held_since is not None and not budget.holds_fleet_slot(
            state=State.DRAINING, drain=state, now=now, policy=policy, taken_at=_slot_taken_at(ctx, record.id)):
        # A PodDisruptionBudget has held the drain for a while: its fleet slot goes back to faults waiting
        # elsewhere (the cordon stays); the drain resumes once it can take a slot again.
        release_slot(ctx, record.id)
        note = (f"draining held by a PodDisruptionBudget for {now - held_since:.0f}s "
                f"(BUDGET_BLOCKED_DRAIN_SLOT_S={policy.blocked_drain_slot_s}): budget slot given back, cordon kept")
        return stay(record, now=now, until=now + _SLOT_GIVEN_BACK_S, note=note,
                    **fields(drain=state.to_data(), slot_released_at=now))
    return stay(record, now=now, until=max(wake, now + 1.0), note=f"draining: {len(state.remaining)} pods still on the node",
                **fields(drain=state.to_data(), slot_released_at=None))

"""Migrating an unmanaged GPU pool to a managed one: the record kind the reconciler advances.

Each migration is one ledger record (:mod:`shared.migration.records`); the reconciler calls
:func:`advance` to take one short step, which re-observes ARM and Kubernetes first, so a repeated
or resumed step after a crash does nothing twice. Every state has one step with the kernel's
signature, ``step(record, ctx, *, now, policy) -> Transition`` (:mod:`shared.kernel.steps`):

=============  ==========================================  ==========================
state          step                                        module
=============  ==========================================  ==========================
planned        create the replacement (surge or a batch)   shared.migration.replacement
creating       wait for it to provision                    shared.migration.replacement
validating     prove its GPU stack and the pods' fit       shared.migration.replacement
cordoning      freeze the old autoscaler, cordon           shared.migration.draining
draining       drain / shrink / grow, batch by batch       shared.migration.draining (+ replacement)
deleting       delete the old pool                         shared.migration.deleting
rolling_back   remove the replacement, uncordon            shared.migration.deleting
=============  ==========================================  ==========================

Before any step writes, the row is checked against ARM (:mod:`shared.migration.checks`): a row that
contradicts itself or ARM ends ``blocked`` with nothing written. Each disruptive write then proves its
own preconditions from ARM and the API server right before it (:mod:`shared.migration.proofs`: the
replacement serves, the nodes are the old pool's machines and carry this record's cordon), so a row
that lies about how far its migration got disrupts nothing. States, events and the table of what each
state may do and re-reads first are in docs/migration.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from shared.fleet import scope
from shared.kernel.errors import Invalid, NotFound
from shared.kernel.ports import ClusterInfo, Record
from shared.kernel.steps import Publication, Transition, settle
from shared.migration import checks
from shared.migration.deleting import step_deleting, step_rolling_back
from shared.migration.draining import drain_phase, shrink_phase, step_cordoning
from shared.migration.plan import record_problems
from shared.migration.policy import MigrationPolicy
from shared.migration.reads import StepReads
from shared.migration.records import ACTIVE_STATES, KIND, TERMINAL_STATES, MigrationState, Phase, read
from shared.migration.replacement import grow_phase, step_creating, step_planned, step_validating
from shared.migration.transitions import blocked, parts, publication, publisher, wait

if TYPE_CHECKING:
    from shared.kernel.context import Context

__all__ = ["ACTIVE_STATES", "KIND", "TERMINAL_STATES", "advance", "give_up"]

Step = Callable[..., Transition]  # step(record, ctx, *, now, policy) -> Transition

PAUSE_RECHECK_S = 60.0
MAX_CHAINED_SUBSTEPS = 4
PHASES: Mapping[Phase, Step] = {Phase.DRAIN: drain_phase, Phase.SHRINK: shrink_phase, Phase.GROW: grow_phase}


def step_draining(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    """The phases of ``draining`` (next batch, shrink, grow), chained in one call while they are
    immediately actionable, because the reconciler chains calls only on state changes; each phase
    still re-observes before it writes, and a batch being evicted always ends the call."""
    events: tuple[Publication, ...] = ()
    last: Transition | None = None
    for _ in range(MAX_CHAINED_SUBSTEPS):
        phase = read(record.data).phase
        last = PHASES[phase](record, ctx, now=now, policy=policy)
        events = (*events, *last.events)
        stepped = last.record
        if stepped.state != MigrationState.DRAINING or stepped.next_at > now:
            break
        if phase == Phase.DRAIN and stepped.data.get("phase") == Phase.SHRINK:
            # Save the drained batch before its machines are deleted: resumed after a crash in between,
            # the drain phase would find the batch gone from the old pool, never record it as removed,
            # and the rolling replacement would never grow back to the old pool's size.
            break
        record = stepped
    assert last is not None
    return Transition(last.record, last.outcome, events)


STEPS: Mapping[str, Step] = {
    MigrationState.PLANNED: step_planned,
    MigrationState.CREATING: step_creating,
    MigrationState.VALIDATING: step_validating,
    MigrationState.CORDONING: step_cordoning,
    MigrationState.DRAINING: step_draining,
    MigrationState.DELETING: step_deleting,
    MigrationState.ROLLING_BACK: step_rolling_back,
}


def _policy(ctx: Context) -> MigrationPolicy:
    return ctx.settings.migration or MigrationPolicy()


def give_up(record: Record, ctx: Context, *, reason: str) -> Record:
    """The reconciler's hook for a step that failed permanently too many times in a row: ``blocked``.

    The migration stops where it is (nodes it cordoned stay cordoned, nothing is deleted) and says
    why, in the record (``reason``, shown by ``fleetctl status``) and in a ``Blocked`` event, so an
    operator fixes the cause and removes the record to try again.
    """
    if record.state in TERMINAL_STATES:
        return record
    return settle(blocked(record, now=ctx.clock.now(), reason=reason), publisher(ctx))


def _read_cluster(ctx: Context, record: Record) -> ClusterInfo | None:
    """The record's cluster as ARM describes it now (None: ARM has none by that id, or the id is not one)."""
    try:
        return ctx.access.aks().get_cluster(str(record.data.get("cluster_id") or ""))
    except (NotFound, Invalid):
        return None


def _cluster_pause(record: Record, *, now: float, cluster: ClusterInfo | None) -> Transition | None:
    """A hold when the cluster carries ``gpu-fleet-steward/paused=true`` (read from ARM at every step),
    else None. The migration stays where it is (cordons stay, nothing is created, drained or deleted)
    and says so: in the record's ``waiting`` and history, and once per pause in a ``Step`` event."""
    why = scope.paused_reason(cluster.tags) if cluster is not None else ""
    if not why:
        return None
    note = f"held where it is: {why}"
    held = wait(record, now=now, until=now + PAUSE_RECHECK_S, why=note)
    if record.data.get("waiting") == note:
        return held
    return held.publish(*parts(publication(record, "Step", previous=str(record.state), note=note)))


def _unreadable(record: Record) -> str:
    """Why the row's data cannot be read as a migration's ("" = it can): a value of the wrong type."""
    try:
        read(record.data)
    except Invalid as exc:
        return exc.reason
    return ""


def _step(record: Record, ctx: Context, *, now: float) -> Transition:
    if ctx.settings.paused:
        return wait(record, now=now, until=now + PAUSE_RECHECK_S, why="STEWARD_PAUSED: no writes")
    cluster = _read_cluster(ctx, record)
    held = _cluster_pause(record, now=now, cluster=cluster)
    if held is not None:
        return held
    step = STEPS.get(record.state)
    if step is None:
        raise Invalid(f"migration {record.id} is in an unknown state {record.state!r}")
    # One view of the pools per step: the pools the checks verify are the ones the step reads and whose
    # eTags its writes send as If-Match, so a pool changed after the check is never written (412).
    ctx = dataclasses.replace(ctx, access=StepReads(ctx.access))
    refusal = record_problems(record) or _unreadable(record) or checks.refusal(ctx, record, read(record.data), cluster)
    if refusal:  # nothing is created, cordoned, drained, scaled or deleted for a row ARM contradicts
        return blocked(record, now=now, reason=f"stopped before any write: {refusal}")
    return step(record, ctx, now=now, policy=_policy(ctx))


def advance(record: Record, ctx: Context) -> Record:
    """One short, idempotent step of a migration; returns the record to save (the reconciler saves it)."""
    if record.state in TERMINAL_STATES:
        return record
    return settle(_step(record, ctx, now=ctx.clock.now()), publisher(ctx))

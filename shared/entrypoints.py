"""One entry point per trigger: the only functions the blueprints in ``functions/`` call.

Each builds (once per process) or receives a :class:`shared.kernel.context.Context`, calls the job's core and
returns a small result the trigger turns into outputs. The jobs' modules and the SDKs are imported
inside the functions, so importing ``function_app`` stays cheap (a cold start pays only for what it
runs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.kernel.context import Context
    from shared.kernel.reconciler import ReconcileReport
    from shared.kernel.retention import RetentionReport

log = logging.getLogger("steward")


def _ctx(ctx: Context | None) -> Context:
    if ctx is not None:
        return ctx
    from shared import wiring

    return wiring.get_context()


@dataclass(frozen=True)
class PoolRequestResult:
    """What the queue trigger needs to know: the request's fate and whether to wake the reconciler."""

    status: str  # shared.pools.intake.AcceptStatus: accepted | duplicate | rejected
    request_id: str
    nudge: str | None = None


@dataclass(frozen=True)
class TeamQueue:
    """One team's pool-request queue, as the function app registers a queue trigger for it."""

    team: str
    function_name: str
    queue: str
    connection: str


def pool_request_queues(env: Mapping[str, str] | None = None) -> list[TeamQueue]:
    """The queues of POOL_REQUEST_TEAMS, one trigger each (read when the function app is indexed)."""
    from shared.pools import teams

    return [TeamQueue(team=t.name, function_name=t.function_name, queue=t.queue, connection=teams.CONNECTION)
            for t in teams.from_env(env)]


def handle_pool_request(body: bytes | str, *, team: str, message_id: str = "", dequeue_count: int = 1,
                        ctx: Context | None = None) -> PoolRequestResult:
    """Validate and record a pool request that arrived on ``team``'s queue.

    The team is who asked (the queue says so, not the message) and bounds what may be asked for
    (shared.pools.teams). Raises only for transient failures (the queue retries), and SettingError when
    the trigger's team is not in POOL_REQUEST_TEAMS (settings changed under a running worker).
    """
    from shared.kernel import telemetry
    from shared.kernel.env import SettingError
    from shared.pools import intake
    from shared.pools import teams as teams_mod

    context = _ctx(ctx)
    entry = teams_mod.by_name(context.settings.teams, team)
    if entry is None:
        raise SettingError(f"setting {teams_mod.SETTING} has no team {team!r}, whose queue this message came from")
    with telemetry.correlation(message_id or None):
        outcome = intake.accept(body, dequeue_count=dequeue_count, ctx=context, team=entry)
    nudge = f"pool-request:{outcome.request_id}" if outcome.status is intake.AcceptStatus.ACCEPTED else None
    return PoolRequestResult(status=outcome.status.value, request_id=outcome.request_id, nudge=nudge)


def record_kinds() -> dict[str, ModuleType]:
    """Each kind of durable record and the module that steps it (``KIND``, ``ACTIVE_STATES``, ``advance``,
    ``give_up``): the reconciler's registry, named here in the app layer so that the kernel imports no job.
    Imported when a reconcile runs, not when the function app is indexed (cold start)."""
    from shared.migration import steps as migration
    from shared.pools import steps as pool_requests
    from shared.remediation import commands
    from shared.remediation import steps as remediation

    return {module.KIND: module for module in (pool_requests, remediation, migration, commands)}


def run_reconcile(*, reason: str = "timer", hint: str | None = None, ctx: Context | None = None) -> ReconcileReport:
    """Advance every due durable record. A nudge only makes it run sooner; it always looks at all.

    The timer's run (every RECONCILE_SCHEDULE, a safety net) also expires old ledger rows: run_retention."""
    from shared.kernel import reconciler, telemetry

    context = _ctx(ctx)
    with telemetry.correlation(None):
        report = reconciler.reconcile_once(context, modules=record_kinds())
        if reason == "timer":
            run_retention(context)
    log.info("reconcile (%s%s): %s", reason, f", {hint}" if hint else "", report.advanced or "nothing due")
    return report


def run_retention(ctx: Context | None = None) -> RetentionReport:
    """Delete the ledger rows past their retention, a bounded number per run (shared.kernel.retention)."""
    from shared.kernel import retention

    context = _ctx(ctx)
    return retention.sweep(context, policy=context.settings.retention)


def run_nudge(hint: str, *, ctx: Context | None = None) -> Any:
    """A message on the nudge queue: a sweep asked for when a pending finding crosses its threshold
    (shared.remediation.due_sweep), or else a wake-up of the reconciler. Either way only a hint: what runs
    looks at everything afresh."""
    from shared.remediation.due_sweep import SWEEP_HINT

    if hint.startswith(SWEEP_HINT):
        return run_health_sweep(ctx)
    return run_reconcile(reason="nudge", hint=hint, ctx=ctx)


def run_health_sweep(ctx: Context | None = None) -> Any:
    """Sweep the GPU nodes of every cluster in scope and publish unhealthy findings."""
    from shared.kernel import telemetry
    from shared.remediation import sweep

    context = _ctx(ctx)
    with telemetry.correlation(None):
        return sweep.sweep(context)


@dataclass(frozen=True)
class GpuEventResult:
    """What happened to an unhealthy-node event, and whether to wake the reconciler now.

    An admitted remediation is nudged so that the cordon follows within seconds rather than at the
    reconciler's next tick: reaction time is one sweep interval plus a few seconds of work.
    """

    outcome: str
    nudge: str | None = None


def handle_gpu_event(event: dict[str, Any], ctx: Context | None = None) -> GpuEventResult:
    """Admit or refuse a remediation for a ``Steward.GpuNode.Unhealthy`` CloudEvent."""
    from shared.remediation import admission

    return _handle_fault_event(event, admission.handle_event, ctx)


def handle_health_event(event: dict[str, Any], ctx: Context | None = None) -> GpuEventResult:
    """Admit, record or refuse what an Azure Resource Health (HealthResources) CloudEvent claims."""
    from shared.remediation import health_events

    return _handle_fault_event(event, health_events.handle, ctx)


def _handle_fault_event(event: dict[str, Any], handler: Callable[[dict[str, Any], Context], Any],
                        ctx: Context | None) -> GpuEventResult:
    """Run ``handler`` under the event's correlation id; nudge the reconciler when it admitted a remediation."""
    from shared.kernel import telemetry
    from shared.remediation.admission import Handling

    context = _ctx(ctx)
    with telemetry.correlation(str(event.get("id") or "") or None):
        handled = handler(event, context)
    admitted = handled.outcome is Handling.ADMITTED
    return GpuEventResult(outcome=handled.detail, nudge=f"remediation:{event.get('id')}" if admitted else None)


def run_migration_planner(ctx: Context | None = None) -> Any:
    """Plan migrations of unmanaged GPU pools and start the ones the plan allows."""
    from shared.kernel import telemetry
    from shared.migration import planner as migration

    context = _ctx(ctx)
    with telemetry.correlation(None):
        return migration.run_planner(context)

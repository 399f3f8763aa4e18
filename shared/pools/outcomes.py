"""How a pool request ends and what it tells the world: the CloudEvents, ``failed`` and ``succeeded``.

Outcomes are published as CloudEvents ``Steward.PoolRequest.Accepted|Rejected|Created|Failed|Blocked`` with
deterministic ids (``pool-request/<id>/<Type>``), so that a repeat after a lost save is recognisable
downstream, and are kept in the record's ``data``. A step asks for its events on the
:class:`~shared.kernel.steps.Transition` it returns; :func:`settle` publishes them before the
reconciler saves the record (at least once: consumers de-duplicate on the id).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from shared.kernel import steps
from shared.kernel.ports import Record
from shared.kernel.steps import Publication, Transition
from shared.kernel.telemetry import count_safely
from shared.pools.records import (
    Cleanup,
    CleanupAction,
    ErrorInfo,
    Outcome,
    SampleJobResult,
    StackReport,
    State,
    builtins,
    split_id,
    wire,
)

if TYPE_CHECKING:
    from shared.kernel.context import Context

EVENT_ACCEPTED = "Steward.PoolRequest.Accepted"
EVENT_REJECTED = "Steward.PoolRequest.Rejected"
EVENT_CREATED = "Steward.PoolRequest.Created"
EVENT_FAILED = "Steward.PoolRequest.Failed"
EVENT_BLOCKED = "Steward.PoolRequest.Blocked"
OUTCOME_EVENTS = frozenset({EVENT_ACCEPTED, EVENT_REJECTED, EVENT_CREATED, EVENT_FAILED, EVENT_BLOCKED})
"""Each one adds 1 to ``pool_requests_total`` with ``outcome`` its last word, lower case."""


def subject(record: Record) -> str:
    """The event subject: the pool's ARM id when the record names one, else the request's path."""
    cluster, pool = record.data.get("cluster"), record.data.get("pool")
    if cluster and pool:
        return f"{cluster}/agentPools/{pool}"
    return f"/pool-requests/{record.id}"


def event_data(record: Record, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Every event's data: who asked for what, then ``extra`` (already in the events' camelCase).

    ``requestId`` is the request's own id (the row's id is ``<team>:<requestId>``, records.record_id)."""
    request = record.data.get("request")
    request_id = request.get("requestId") if isinstance(request, Mapping) else None
    return {"requestId": request_id or record.data.get("request_id") or split_id(record.id)[1],
            "requester": record.data.get("requester"),
            "cluster": record.data.get("cluster"), "poolName": record.data.get("pool"), **extra}


def publish_now(ctx: Context, event_type: str, record: Record, extra: Mapping[str, Any]) -> None:
    """Publish one event at once (intake: there is no step to carry it)."""
    publish(ctx, record.id)(Publication(event_type, subject(record), event_data(record, extra)))


def publish(ctx: Context, record_id: str) -> Callable[[Publication], None]:
    """The publisher :func:`shared.kernel.steps.settle` calls for each event of a record's step."""
    def send(event: Publication) -> None:
        what = event.event_type.rsplit('.', 1)[-1]
        event_id = f"pool-request/{record_id}/{what}"
        ctx.events.publish(type_=event.event_type, subject=event.subject, data=dict(event.data), id_=event_id)
        if event.event_type in OUTCOME_EVENTS:  # the workbook's "pool requests by outcome" (infra/monitoring)
            count_safely(getattr(ctx, "telemetry", None), "pool_requests_total", outcome=what.lower(),
                         team=str(event.data.get("team") or "") or None)

    return send


def settle(transition: Transition, ctx: Context) -> Record:
    """Publish the transition's events (ids derived from the record), and hand its record back."""
    return steps.settle(transition, publish(ctx, transition.record.id))


def fail(record: Record, *, now: float, code: str, message: str, cleanup: Cleanup | None = None,
         **data: Any) -> Transition:
    """End the request ``failed`` with Azure's (or our) ``code`` and ``message``, and publish Failed.

    ``data`` (stack, job, feature: typed structs or builtins) is kept in the record and sent with the
    event; ``cleanup`` says what became of a pool the request had created.
    """
    error = ErrorInfo(code=code, message=message[:2000])
    stage = State(record.state)
    outcome = Outcome(state=State.FAILED, stage=stage, code=error.code, message=error.message, cleanup=cleanup)
    stored = {key: builtins(value) for key, value in data.items()}
    ended = steps.finish(record, State.FAILED, now=now, note=f"{code}: {message}"[:500], error=builtins(error),
                         outcome=builtins(outcome), cleanup=builtins(cleanup), failing=None, **stored)
    extra = {"stage": str(stage), "error": wire(error), **({"cleanup": wire(cleanup)} if cleanup else {}),
             **{key: wire(value) for key, value in data.items() if value is not None}}
    return ended.publish(EVENT_FAILED, subject(record), event_data(record, extra))


def succeed(record: Record, *, now: float, stack: StackReport | None, sample_job: SampleJobResult) -> Transition:
    """End the request ``succeeded`` (pool created and validated), and publish Created with the outcome."""
    outcome = Outcome(state=State.SUCCEEDED, nodes=stack.ready_nodes if stack else None,
                      resources=dict(stack.resources) if stack else None, sample_job=sample_job, stack=stack)
    ended = steps.finish(record, State.SUCCEEDED, now=now, note="pool created and validated", outcome=builtins(outcome))
    return ended.publish(EVENT_CREATED, subject(record), event_data(record, {"outcome": wire(outcome)}))


def block(record: Record, *, now: float, code: str, reason: str) -> Transition:
    """End the request ``blocked``: its row asked for something the world does not bear out (shared.pools.proof),
    so nothing was created, changed or deleted. ``reason`` says what was looked at and what was found; the
    Blocked event carries it."""
    error = ErrorInfo(code=code, message=reason[:2000])
    stage = State(record.state)
    outcome = Outcome(state=State.BLOCKED, stage=stage, code=code, message=error.message,
                      cleanup=Cleanup(action=CleanupAction.NONE, note="refused before any write: nothing was touched"))
    ended = steps.finish(record, State.BLOCKED, now=now, note=f"blocked ({code}): {reason}"[:500], error=builtins(error),
                         outcome=builtins(outcome), reason=error.message, failing=None)
    return ended.publish(EVENT_BLOCKED, subject(record),
                         event_data(record, {"stage": str(stage), "error": wire(error), "reason": error.message}))

"""Intake: a message from a team's queue becomes a durable pool-request record, or a recorded "no".

:func:`accept` runs in the queue trigger: it validates the message (shared.pools.validation, and the
team's rules, shared.pools.recheck) and writes the record in state ``accepted`` (or a terminal
``rejected`` record with every reason), publishes Accepted or Rejected, and returns quickly: creating
a GPU pool takes many minutes and is never waited for inside one invocation. The reconciler takes it
from there (shared.pools.steps).

A message is delivered at least once. A redelivery of the same request (same id, same fingerprint)
is a ``duplicate``; the same id for a different request is refused, and filed under the message's
digest; a rejected id may be reused by the corrected request.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import msgspec

from shared.kernel.errors import Conflict, NotFound, Transient
from shared.kernel.ports import LedgerPort, Record
from shared.pools import policy as pool_policy
from shared.pools.outcomes import EVENT_ACCEPTED, EVENT_REJECTED, publish_now
from shared.pools.recheck import scope_check, team_violations
from shared.pools.records import KIND, ProblemRow, State, builtins, record_id
from shared.pools.request import Problem
from shared.pools.validation import Rejection, ValidatedRequest, evidence, parse_and_validate

if TYPE_CHECKING:
    from shared.kernel.context import Context
    from shared.pools.teams import Team

log = logging.getLogger("steward.pool_creation")


class AcceptStatus(StrEnum):
    """What became of a queue message (shared.entrypoints.handle_pool_request reads it)."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # already recorded: a redelivery
    REJECTED = "rejected"


@dataclass(frozen=True)
class AcceptOutcome:
    """What became of a queue message, and the id of the record that says so."""

    status: AcceptStatus
    request_id: str  # the record's id: ``<team>:<requestId>`` (or ``<team>:msg-<sha256>`` for unreadable messages)
    message: str = ""
    problems: tuple[Problem, ...] = ()


def accept(raw: bytes | str, *, dequeue_count: int, ctx: Context, team: Team | None = None) -> AcceptOutcome:
    """Validate one queue message and record it. Raises only Throttled/Transient (retry the message).

    ``team`` is the team whose queue the message came from (shared.pools.teams; the trigger always
    passes it): it becomes the request's requester whatever the message claims, and the request
    must stay within the team's clusters, sizes and GPUs per request. ``None`` applies no team
    rules; only tests and tools that call this directly use it.
    """
    now = ctx.clock.now()
    owner = team.name if team is not None else None
    result = judge(raw, ctx=ctx, team=team)
    if isinstance(result, Rejection):
        return _reject(result, ctx=ctx, now=now, dequeue_count=dequeue_count, team=owner)
    req = result.request

    def fresh() -> Record:
        record = new_record(result, now=now, dequeue_count=dequeue_count, team=owner)
        if team is None:
            return record
        return msgspec.structs.replace(record, data={**record.data, "team": team.name, "queue": team.queue,
                                                     "claimed_requester": result.claimed_requester})

    too_large = too_large_to_record(fresh(), ctx.ledger)
    if too_large is not None:  # before anything is published: Accepted must never precede a failed write
        rejection = Rejection((too_large,), request_id=req.request_id, requester=req.requester, cluster=req.cluster,
                              pool_name=req.pool_name, **evidence(raw))
        return _reject(rejection, ctx=ctx, now=now, dequeue_count=dequeue_count, team=owner)

    existing, status = _record(ctx, fresh, result, team=owner)
    if existing.data.get("fingerprint") != result.fingerprint:
        reuse = Problem("requestId", f"{result.request_id!r} was already used for a different request "
                        f"(now {existing.state})",
                        "use a new requestId for a new request; resend the original unchanged to retry it")
        rejection = Rejection((reuse,), request_id=None, requester=req.requester, cluster=req.cluster,
                              pool_name=req.pool_name, **evidence(raw))
        return _reject(rejection, ctx=ctx, now=now, dequeue_count=dequeue_count, reused_id=result.request_id,
                       team=owner)

    if not existing.data.get("announced"):  # recorded by a version that announced after writing
        _announce(ctx, existing, result)
        _mark_announced(ctx, existing)
    log.info("pool request %s %s", existing.id, status)
    return AcceptOutcome(status=status, request_id=existing.id)


def judge(raw: bytes | str, *, ctx: Context, team: Team | None = None) -> ValidatedRequest | Rejection:
    """The verdict on a request, writing nothing: the seed's rules and the cluster's scope
    (shared.pools.validation), then ``team``'s clusters, sizes and GPUs per request (shared.pools.recheck).

    :func:`accept` records it; ``fleetctl submit --dry-run`` prints it before anything is queued, so a team
    sees exactly the "no" intake would give."""
    result = parse_and_validate(raw, policy=pool_policy.of(ctx.settings), in_scope=scope_check(ctx),
                                requester=team.name if team is not None else None)
    if isinstance(result, Rejection) or team is None:
        return result
    found = team_violations(ctx, team, result)
    if not found:
        return result
    req = result.request
    return Rejection(tuple(Problem(v.field, v.problem, v.fix) for v in found), request_id=req.request_id,
                     requester=team.name, cluster=req.cluster, pool_name=req.pool_name, **evidence(raw))


def _record(ctx: Context, fresh: Any, result: ValidatedRequest, *, team: str | None) -> tuple[Record, AcceptStatus]:
    """The record of this team's request id (written now, or found), and whether this message wrote it.

    Rows are keyed ``<team>:<requestId>`` (records.record_id): another team's use of the same id is another
    row. A row an older version keyed by the request id alone still answers for its own team's redelivery."""
    key = record_id(team, result.request_id)
    existing = ctx.ledger.get(KIND, key)
    if existing is None and team is not None:
        legacy = ctx.ledger.get(KIND, result.request_id)
        if legacy is not None and legacy.data.get("requester") == team and legacy.data.get("fingerprint") is not None:
            existing = legacy
    if existing is None:
        try:
            return ctx.ledger.create(_announced(ctx, fresh(), result)), AcceptStatus.ACCEPTED
        except Conflict:  # another delivery of a message with this id won the race
            existing = ctx.ledger.get(KIND, key)
            if existing is None:
                raise Transient("pool request record vanished right after a conflicting create") from None
            return existing, AcceptStatus.DUPLICATE
    if existing.state == State.REJECTED and existing.data.get("fingerprint") is None:
        # A rejected id may be reused by the corrected request: the rejection stays in its history.
        replacement = fresh()
        replacement = msgspec.structs.replace(replacement, etag=existing.etag,
                                              history=[*existing.history, *replacement.history][-50:])
        try:
            return ctx.ledger.save(_announced(ctx, replacement, result)), AcceptStatus.ACCEPTED
        except (Conflict, NotFound):
            raise Transient("pool request record changed while replacing a rejection; retry") from None
    return existing, AcceptStatus.DUPLICATE


def new_record(v: ValidatedRequest, *, now: float, dequeue_count: int, team: str | None = None) -> Record:
    """The ``accepted`` record of a valid request, as intake first writes it (keyed by team and request id)."""
    req = v.request
    data = {"request": msgspec.to_builtins(req), "fingerprint": v.fingerprint, "cluster": req.cluster,
            "pool": req.pool_name, "requester": req.requester, "vm_size": v.size.name,
            "dequeue_count": dequeue_count}
    return Record(kind=KIND, id=record_id(team, req.request_id), state=State.ACCEPTED, data=data, created_at=now, updated_at=now,
                  next_at=now, history=[{"at": now, "state": State.ACCEPTED, "note": "validated and recorded"}])


def _announce(ctx: Context, record: Record, result: ValidatedRequest) -> None:
    publish_now(ctx, EVENT_ACCEPTED, record, {"state": record.state, "vmSize": result.request.vm_size,
                                              "installProfile": result.request.install_profile})


def _announced(ctx: Context, record: Record, result: ValidatedRequest) -> Record:
    """Publish Accepted, then return the record marked as announced, ready to be written.

    The event goes out before the record can be seen: once it is written, any instance's reconciler
    may claim it and report progress, and a request's story must open with Accepted. If the write
    then loses a race, the winner published the same id, which consumers dedupe.
    """
    _announce(ctx, record, result)
    return msgspec.structs.replace(record, data={**record.data, "announced": True})


def _mark_announced(ctx: Context, record: Record) -> None:
    # If the reconciler claimed it meanwhile, the event is out anyway; a re-publish carries the same id.
    with contextlib.suppress(Conflict, NotFound):
        ctx.ledger.save(msgspec.structs.replace(record, data={**record.data, "announced": True}))


def _reject(rejection: Rejection, *, ctx: Context, now: float, dequeue_count: int,
            reused_id: str | None = None, team: str | None = None) -> AcceptOutcome:
    """Write the terminal ``rejected`` record (once) and publish the reasons. Never retried.

    The record and the Rejected event carry the message's sha256, size and first bytes (escaped,
    shared.pools.validation.escape_head) so an operator can see what was sent. Problems beyond
    :data:`MAX_PROBLEMS_RECORDED`, or beyond what fits the ledger's property limit, are counted but
    not listed: a rejection that cannot be recorded would be retried into the poison queue.
    """
    by_digest = record_id(team, f"msg-{rejection.digest[:40]}")
    key = record_id(team, rejection.request_id) if rejection.request_id else by_digest
    total = len(rejection.problems)
    shown = min(total, MAX_PROBLEMS_RECORDED)
    while True:
        problems = rejection.problems[:shown]
        message = f"pool request rejected: {total} problem{'s' if total != 1 else ''}" \
            + "".join(f"\n- {p}" for p in problems) + (f"\n- ... and {total - shown} more" if shown < total else "")
        rows = [ProblemRow(field=p.field, problem=p.problem, fix=p.fix) for p in problems]
        data: dict[str, Any] = {
            "reasons": [str(p) for p in problems], "problems": builtins(rows), "problem_count": total,
            "message": message, "digest": rejection.digest, "message_bytes": rejection.size,
            "message_head": rejection.head, "request_id": reused_id or rejection.request_id,
            "requester": rejection.requester, "cluster": rejection.cluster, "pool": rejection.pool_name,
            "dequeue_count": dequeue_count,
        }
        record = Record(kind=KIND, id=key, state=State.REJECTED, data=data, created_at=now, updated_at=now,
                        history=[{"at": now, "state": State.REJECTED, "note": message[:500]}])
        if shown == 0 or too_large_to_record(record, ctx.ledger) is None:
            break
        shown //= 2
    stored = _create_or_get(ctx, record)
    if stored.data.get("digest") != rejection.digest and key != by_digest:
        # The id belongs to another request: file this rejection under the message's digest instead.
        stored = _create_or_get(ctx, msgspec.structs.replace(record, id=by_digest))
    if not stored.data.get("announced"):
        publish_now(ctx, EVENT_REJECTED, stored, {
            "reasons": data["reasons"], "problems": [{"field": p.field, "problem": p.problem, "fix": p.fix}
                                                     for p in problems],
            "problemCount": total, "message": message, "digest": rejection.digest, "messageBytes": rejection.size,
            "messageHead": rejection.head})
        _mark_announced(ctx, stored)
    log.info("pool request rejected (%s): %d problems, sha256 %s", stored.id, total, rejection.digest)
    return AcceptOutcome(status=AcceptStatus.REJECTED, request_id=stored.id, message=message, problems=problems)


# What a pool-request record may weigh when it is first written. The ledger keeps ``data`` as one
# JSON string property, and Azure Table storage allows 64 KiB per string property (UTF-16, so 32 Ki
# characters; json.dumps escapes non-ASCII as \uXXXX, 12 bytes a character) and 1 MiB per entity
# (https://learn.microsoft.com/rest/api/storageservices/understanding-the-table-service-data-model).
# The entity limit never binds: data <= 64 KiB + history <= 48 KiB (shared.adapters.ledger) + a few scalars.
# The steps after acceptance add to ``data`` (PUT count, stack verdict, job, at most 2 x 2,000
# characters of Azure's error on failure, about 10 KiB at worst as UTF-16), so the first write keeps
# RECORD_GROWTH_RESERVE_BYTES free: a request that would start closer to the limit could be
# accepted and then fail to save its progress.
RECORD_GROWTH_RESERVE_BYTES = 16 * 1024
MAX_PROBLEMS_RECORDED = 20


def too_large_to_record(record: Record, ledger: LedgerPort) -> Problem | None:
    """Why ``record`` may not be written as it is (its ``data`` over the start budget), or None."""
    limit = ledger.data_limit_bytes
    budget = limit - RECORD_GROWTH_RESERVE_BYTES
    size = ledger.data_bytes(record)
    if size <= budget:
        return None
    shown = f"{size} bytes" if size <= limit else f"more than {limit} bytes"
    return Problem("$", f"the request is valid but too large to record: it would be stored as {shown} "
                   f"(UTF-16 JSON), over the {budget} bytes a request may take "
                   f"(Azure Table storage holds {limit} bytes per property; "
                   f"{RECORD_GROWTH_RESERVE_BYTES} are kept for the request's progress)",
                   "send fewer or shorter tags and labels (non-ASCII characters count six times); "
                   f"about {budget // 2 - 4096} ASCII characters of request fit")


def _create_or_get(ctx: Context, record: Record) -> Record:
    try:
        return ctx.ledger.create(record)
    except Conflict:
        existing = ctx.ledger.get(record.kind, record.id)
        if existing is None:
            raise Transient("record vanished right after a conflicting create") from None
        return existing

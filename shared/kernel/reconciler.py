"""The reconciler: claims due records and advances each one short, idempotent step at a time.

Every kind of long work (a pool request, a remediation, a migration) is a record in the ledger and a
module exposing ``ACTIVE_STATES`` and ``advance(record, ctx) -> Record`` (shared.kernel.steps). The reconciler is the only
caller of ``advance``; it guarantees one writer per record by claiming it first with an
ETag-conditional save (owner + lease). A second instance that read the same version loses the race
with ``Conflict`` and moves on; a crashed owner's lease expires and another instance resumes from the
last saved step. Each step is saved before the next one is tried, so a crash loses at most one step,
and the step functions re-observe the world, so repeating that step is harmless.

A record whose step asks to be looked at again within :data:`HOLD_S` (a pool being created, pods
terminating) is kept claimed, and stepped again once due, rather than released and found again by a
later invocation: listing the ledger and claiming anew would cost more than the wait, and the next
tick may be far away. It is saved after every step all the same, and the lease is renewed with each
save; the waits of one invocation are capped (:data:`HOLD_BUDGET_S`) so that other records get
their turn.

A step that keeps failing with a permanent error (:data:`PERMANENT`: ``Invalid`` -- HTTP 400/422 --
or ``Forbidden``) would otherwise back off forever, its error visible only in the record's
``_last_error``. After :data:`DEFAULT_MAX_PERMANENT_TRIES` such failures in a row
(``RECONCILE_MAX_PERMANENT_TRIES``), the reconciler hands the record to its kind's
``give_up(record, ctx, *, reason) -> Record`` hook, which ends it (a migration goes ``blocked``
and publishes ``Blocked`` with the reason). A kind without the hook keeps backing off; its record
then carries ``_stuck``, the reason, for ``fleetctl status``.

When a record is released unfinished, the reconciler asks ``ctx.nudge`` (shared.kernel.nudge) to wake it
when the record is due (``next_at``, at least :data:`MIN_NUDGE_DELAY_S` away, rounded up to a grid
step of at most a fifth of the wait so that records due together share a wake-up): a message on the
nudge queue with that visibility timeout. So the pace of the work does not depend on the timer,
which is only a safety net (``RECONCILE_SCHEDULE``, every 5 minutes by default). A failed nudge is
logged and counted, never fatal: the step is already saved, and the timer will find the record.

The reconciler's reads stay bounded however large the ledger grows (issue 19): per kind it asks the
store only for rows in an active state that are due and claimed by no one
(:meth:`~shared.kernel.ports.LedgerPort.scan`, filtered in the table service), at most
:data:`MAX_DUE_PER_KIND` of them per invocation. Finished rows are never read here (and expire:
shared.kernel.retention); a kind flooded with due rows (a table writer's) cannot hold back another
kind, and its backlog is worked through over the following invocations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

import msgspec

from shared.kernel.errors import RETRYABLE, Conflict, Forbidden, Invalid, NotFound, StewardError
from shared.kernel.nudge import NudgeBook, wake_time
from shared.kernel.ports import Record
from shared.kernel.retention import scan

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.reconciler")


LEASE_S = 120.0  # longer than any single step; a crashed owner's claim expires after this
MAX_STEPS_PER_RECORD = 25  # per invocation, while the record stays immediately actionable
MAX_BACKOFF_S = 300.0
HOLD_S = 5.0  # a record due again within this many seconds stays claimed and is stepped again when due
HOLD_BUDGET_S = 20.0  # per invocation: the most (fleet) time spent waiting on held records
#: Errors that repeating the same step cannot cure: a refused request (HTTP 400/422) or a denied one (401/403).
PERMANENT: tuple[type[StewardError], ...] = (Invalid, Forbidden)
DEFAULT_MAX_PERMANENT_TRIES = 5  # RECONCILE_MAX_PERMANENT_TRIES: permanent failures in a row before giving up
GiveUp = Callable[..., Record]  # give_up(record, ctx, *, reason) -> the record to save (a terminal state)
#: A released record is woken no sooner than this: a step that makes no progress but is due at once
#: must not turn the nudge queue into a busy loop (HOLD_S covers the shorter waits in-process).
MIN_NUDGE_DELAY_S = HOLD_S
#: The most due rows of one kind read (and stepped) per invocation; the rest are due again next time.
MAX_DUE_PER_KIND = 500


@dataclass
class ReconcileReport:
    advanced: dict[str, int] = field(default_factory=dict)  # kind -> steps taken
    skipped_conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # "kind/id -> state"
    held_s: float = 0.0  # fleet seconds this invocation waited on held records
    nudges: NudgeBook = field(default_factory=NudgeBook)  # delayed wake-ups sent (or skipped) by this invocation

    def count(self, kind: str) -> None:
        self.advanced[kind] = self.advanced.get(kind, 0) + 1


def _due(record: Record, *, now: float) -> bool:
    # A live lease excludes every invocation, this instance's too: the timer and the nudge trigger
    # (and concurrent invocations in one worker) run side by side in one instance, and two of them
    # stepping one record would repeat its side effects (a second PUT) before the ETag catches it.
    if record.next_at > now:
        return False
    return record.lease_until <= now


def claim(record: Record, ctx: Context) -> Record | None:
    """Take the record for this instance, or None if another instance holds or just took it."""
    now = ctx.clock.now()
    claimed = msgspec.structs.replace(record, owner=ctx.instance, lease_until=now + LEASE_S)
    try:
        return ctx.ledger.save(claimed)
    except (Conflict, NotFound):
        return None


def _backoff(record: Record, *, error: BaseException, now: float) -> Record:
    streak = int(record.data.get("_error_streak", 0)) + 1
    hint = getattr(error, "retry_after", None)
    delay = min(MAX_BACKOFF_S, max(float(hint or 0.0), 5.0 * 2 ** min(streak - 1, 6)))
    data = dict(record.data)
    data["_error_streak"] = streak
    data["_last_error"] = f"{type(error).__name__}: {error}"[:500]
    return msgspec.structs.replace(record, data=data, next_at=now + delay, updated_at=now)


_ERROR_KEYS = ("_error_streak", "_last_error", "_permanent_tries", "_stuck")


def _clear_errors(record: Record) -> Record:
    if not any(k in record.data for k in _ERROR_KEYS):
        return record
    data = {k: v for k, v in record.data.items() if k not in _ERROR_KEYS}
    return msgspec.structs.replace(record, data=data)


def max_permanent_tries(ctx: Context) -> int:
    """How many permanent failures in a row a step gets (the setting, or the default)."""
    value = getattr(ctx.settings, "reconcile_max_permanent_tries", None)
    return int(value) if isinstance(value, int) and value >= 1 else DEFAULT_MAX_PERMANENT_TRIES


def _permanent_failure(record: Record, ctx: Context, *, error: StewardError, now: float,
                       give_up: GiveUp | None) -> Record:
    """Back off after a permanent error; past the limit, end the record through its kind's hook."""
    stepped = _backoff(record, error=error, now=now)
    tries = int(record.data.get("_permanent_tries", 0)) + 1
    data = {**stepped.data, "_permanent_tries": tries}
    limit = max_permanent_tries(ctx)
    if tries < limit:
        return msgspec.structs.replace(stepped, data=data)
    reason = (f"step {record.state!r} failed {tries} times in a row with a permanent error; "
              f"last: {type(error).__name__}: {error}")[:500]
    if give_up is not None:
        try:
            return give_up(msgspec.structs.replace(record, data=dict(data)), ctx, reason=reason)
        except StewardError as exc:
            log.error("giving up %s/%s failed too: %s", record.kind, record.id, exc)
    return msgspec.structs.replace(stepped, data={**data, "_stuck": reason})


def nudge_later(record: Record, ctx: Context, *, report: ReconcileReport, now: float) -> None:
    """Ask for a wake-up when the released ``record`` is due; coalesced, bounded, and never fatal."""
    nudger = getattr(ctx, "nudge", None)
    if nudger is None:
        return
    book = report.nudges
    when = wake_time(max(record.next_at, now + MIN_NUDGE_DELAY_S), now=now)
    if book.covers(when):
        book.coalesced += 1
        return
    if book.full:
        book.dropped += 1
        log.info("not nudging %s/%s: %d nudges already sent by this invocation; the timer will find it",
                 record.kind, record.id, book.limit)
        return
    try:
        nudger.nudge_at(when, hint=f"{record.kind}:{record.id}")
    except StewardError as exc:
        book.failed += 1
        log.warning("nudging the reconciler for %s/%s failed (the timer will find it): %s", record.kind, record.id, exc)
        return
    book.pending.append(when)


def advance_record(record: Record, ctx: Context, *, report: ReconcileReport,
                   advance: Callable[[Record, Context], Record], active: frozenset[str] | set[str],
                   give_up: GiveUp | None = None) -> Record | None:
    """Claim ``record`` and advance it while it stays immediately actionable; returns the last saved copy.

    ``give_up`` is the kind's hook for a step that keeps failing permanently (see the module docstring).
    """
    current = claim(record, ctx)
    if current is None:
        report.skipped_conflicts += 1
        return None
    for taken in range(1, MAX_STEPS_PER_RECORD + 1):
        now = ctx.clock.now()
        before = current
        try:
            stepped = _clear_errors(advance(current, ctx))
        except RETRYABLE as exc:
            log.warning("step of %s/%s will be retried: %s", record.kind, record.id, exc)
            stepped = _backoff(current, error=exc, now=now)
        except Conflict as exc:
            # Someone changed the world under us (a resourceVersion, another operation); look again soon.
            stepped = _backoff(current, error=exc, now=now)
        except PERMANENT as exc:
            report.errors.append(f"{record.kind}/{record.id}: {exc}")
            log.error("step of %s/%s failed permanently: %s", record.kind, record.id, exc)
            stepped = _permanent_failure(current, ctx, error=exc, now=now, give_up=give_up)
        except StewardError as exc:
            report.errors.append(f"{record.kind}/{record.id}: {exc}")
            log.error("step of %s/%s failed: %s", record.kind, record.id, exc)
            stepped = _backoff(current, error=exc, now=now)
        stepped = msgspec.structs.replace(stepped, etag=current.etag, owner=ctx.instance)
        finished = stepped.state not in active
        after = ctx.clock.now()
        last = taken == MAX_STEPS_PER_RECORD  # the claim is always released by the last step taken
        # Onward at once while the step moved (a new state, or a new phase within it: a fresh history line)
        # and the record is due already: each phase's first call then follows its predecessor in the same
        # invocation instead of a reconciler tick later. A step that only waits (``stay``) is not due now.
        moved = stepped.state != before.state or stepped.history[-1:] != before.history[-1:]
        more = not finished and not last and stepped.next_at <= after and moved
        wait = stepped.next_at - after
        hold = (not finished and not last and not more and 0.0 < wait <= HOLD_S
                and report.held_s + wait <= HOLD_BUDGET_S and "_error_streak" not in stepped.data)
        stepped = msgspec.structs.replace(stepped, lease_until=after + LEASE_S if more or hold else 0.0)
        try:
            current = ctx.ledger.save(stepped)
        except (Conflict, NotFound):
            report.skipped_conflicts += 1
            return None
        report.count(record.kind)
        if finished:
            report.finished.append(f"{record.kind}/{record.id} -> {current.state}")
        if hold:
            ctx.clock.sleep(wait)
            report.held_s += wait
            continue
        if not more:
            if not finished:  # released unfinished: wake the reconciler when it is due
                nudge_later(current, ctx, report=report, now=after)
            break
    return current


def reconcile_once(ctx: Context, *, modules: Mapping[str, ModuleType]) -> ReconcileReport:
    """Advance every due record of every kind once (and onward while it stays actionable).

    ``modules`` maps each kind to the module that steps it (``ACTIVE_STATES``, ``advance``, optionally
    ``give_up``): the app layer names them (shared.entrypoints.record_kinds), so the kernel depends on no job.
    """
    report = ReconcileReport()
    for kind, module in modules.items():
        active = frozenset(module.ACTIVE_STATES)
        now = ctx.clock.now()
        try:
            records = scan(ctx.ledger, kind, states=sorted(active), due_by=now, limit=MAX_DUE_PER_KIND)
        except RETRYABLE as exc:
            report.errors.append(f"listing {kind}: {exc}")
            continue
        for record in sorted(records, key=lambda r: (r.next_at, r.id)):
            if not _due(record, now=now):
                continue
            advance_record(record, ctx, report=report, advance=module.advance, active=active,
                           give_up=getattr(module, "give_up", None))
    return report

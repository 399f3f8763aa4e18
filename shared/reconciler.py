"""The reconciler: claims due records and advances each one short, idempotent step at a time.

Every kind of long work (a pool request, a remediation, a migration) is a record in the ledger and a
module exposing ``ACTIVE_STATES`` and ``advance(record, ctx) -> Record``. The reconciler is the only
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
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

import msgspec

from shared.errors import RETRYABLE, Conflict, NotFound, StewardError
from shared.ports import Record

if TYPE_CHECKING:
    from shared.context import Context

log = logging.getLogger("steward.reconciler")

#: kind -> module implementing it. Imported lazily: the function app must import fast.
KINDS: Mapping[str, str] = {
    "pool-request": "shared.pool_creation",
    "remediation": "shared.remediation",
    "migration": "shared.migration",
}

LEASE_S = 120.0  # longer than any single step; a crashed owner's claim expires after this
MAX_STEPS_PER_RECORD = 25  # per invocation, while the record stays immediately actionable
MAX_BACKOFF_S = 300.0
HOLD_S = 5.0  # a record due again within this many seconds stays claimed and is stepped again when due
HOLD_BUDGET_S = 20.0  # per invocation: the most (fleet) time spent waiting on held records


@dataclass
class ReconcileReport:
    advanced: dict[str, int] = field(default_factory=dict)  # kind -> steps taken
    skipped_conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # "kind/id -> state"
    held_s: float = 0.0  # fleet seconds this invocation waited on held records

    def count(self, kind: str) -> None:
        self.advanced[kind] = self.advanced.get(kind, 0) + 1


def _module(kind: str) -> ModuleType:
    return importlib.import_module(KINDS[kind])


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


def _clear_errors(record: Record) -> Record:
    if "_error_streak" not in record.data and "_last_error" not in record.data:
        return record
    data = {k: v for k, v in record.data.items() if k not in ("_error_streak", "_last_error")}
    return msgspec.structs.replace(record, data=data)


def advance_record(record: Record, ctx: Context, *, report: ReconcileReport,
                   advance: Callable[[Record, Context], Record], active: frozenset[str] | set[str]) -> Record | None:
    """Claim ``record`` and advance it while it stays immediately actionable; returns the last saved copy."""
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
        except StewardError as exc:
            report.errors.append(f"{record.kind}/{record.id}: {exc}")
            log.error("step of %s/%s failed: %s", record.kind, record.id, exc)
            stepped = _backoff(current, error=exc, now=now)
        stepped = msgspec.structs.replace(stepped, etag=current.etag, owner=ctx.instance)
        finished = stepped.state not in active
        after = ctx.clock.now()
        last = taken == MAX_STEPS_PER_RECORD  # the claim is always released by the last step taken
        more = not finished and not last and stepped.next_at <= after and stepped.state != before.state
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
            break
    return current


def reconcile_once(ctx: Context, *, modules: Mapping[str, ModuleType] | None = None) -> ReconcileReport:
    """Advance every due record of every kind once (and onward while it stays actionable).

    ``modules`` maps kinds to their implementations; by default every kind in :data:`KINDS`.
    """
    report = ReconcileReport()
    chosen = modules if modules is not None else {kind: _module(kind) for kind in KINDS}
    for kind, module in chosen.items():
        active = frozenset(module.ACTIVE_STATES)
        now = ctx.clock.now()
        try:
            records = ctx.ledger.list(kind, states=sorted(active))
        except RETRYABLE as exc:
            report.errors.append(f"listing {kind}: {exc}")
            continue
        for record in sorted(records, key=lambda r: (r.next_at, r.id)):
            if not _due(record, now=now):
                continue
            advance_record(record, ctx, report=report, advance=module.advance, active=active)
    return report

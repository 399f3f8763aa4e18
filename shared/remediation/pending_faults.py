"""A pushed fault refused for a reason that passes is kept, and judged again every sweep (issue 24, item 1).

NPD conditions and DCGM series are pulled: the sweep finds a refused fault again every minute, and it is
admitted once the budget, the breaker or the cooldown allows. An Azure Resource Health event is pushed:
it arrives once, and a refusal (or another fault's remediation on the node) used to be the end of it
(soak seed 931005: a degraded host refused three times while its neighbour's repair held the pool's budget,
then never looked at again). So when the admission refuses a Resource Health fault with a code whose rule passes by itself
(shared.remediation.refusals ``RULES[code].passes``: a budget slot, a cooldown, a node recreated; and the
pause and the breaker, which end when an operator acts), the event is kept here, one ``pending-fault`` row
per fault, and :func:`rejudge` (called by every sweep) hands it to shared.remediation.health_events
``handle`` again. That re-reads everything, the VM's availability from Resource Health first, exactly as
for a fresh delivery, so a kept event is never trusted more than a new one (a row anyone wrote is only an
event to check):

- admitted, or this very fault already handled (a duplicate): the row goes;
- refused again for a reason that passes, or the node held by another fault's remediation (a duplicate with
  ``admission.NODE_BUSY``: a restart for a device-plugin fault need not cure a failing host): the row stays
  (``tries`` counts the judgements);
- refused for a reason that needs a person (a trust check, an opt-out), or no longer confirmed by its
  source (Resource Health says the VM is fine, the VM or node is gone): the row goes, with a
  ``Steward.Remediation.PendingDropped`` event saying why;
- kept longer than ``REMEDIATION_PENDING_FAULT_MAX_AGE_S`` (a day by default): dropped the same way.

Bounded: at most :data:`MAX_ROWS` rows (a refusal beyond them is only reported, as before) and
:data:`MAX_PER_SWEEP` judgements per sweep, oldest first.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from shared.kernel.errors import Conflict, NotFound, StewardError
from shared.kernel.ports import Record
from shared.remediation.records import KIND as REMEDIATION_KIND
from shared.remediation.records import Event, decode, to_data

if TYPE_CHECKING:
    from shared.kernel.context import Context
    from shared.remediation.admission import Handled

log = logging.getLogger("steward.pending")

KIND = "pending-fault"
WAITING = "waiting"
MAX_ROWS = 500
MAX_PER_SWEEP = 50


class PendingFault(msgspec.Struct, kw_only=True):
    """``pending-fault`` ``<fault id>``: a pushed fault refused for a reason that passes, and its event."""

    event: dict[str, Any]
    cluster: str
    node: str
    code: str
    reason: str
    first_at: float
    last_at: float
    tries: int = 1


def passes(code: str) -> bool:
    """Whether a fault refused with ``code`` is kept: its rule passes by itself, or it ends when an operator
    unpauses the steward or resets the breaker (the fault must still be there to repair then), or another
    fault's remediation holds the node (``admission.NODE_BUSY``: that repair may not cure this fault)."""
    from shared.remediation import budget
    from shared.remediation.admission import NODE_BUSY
    from shared.remediation.refusals import RULES

    if code == NODE_BUSY:
        return True
    rule = RULES.get(code)
    return rule is not None and (rule.passes or code in (budget.PAUSED, budget.BREAKER))


def keep(ctx: Context, *, event: Mapping[str, Any], info: Mapping[str, Any], handled: Handled) -> None:
    """After a refusal of a pushed fault: keep its event while the refusal is one that passes (best effort:
    a failure to keep it is logged; the refusal itself was already reported)."""
    code = getattr(handled, "code", "")
    if not passes(code):
        return
    now = ctx.clock.now()
    fault = str(info["fault"])
    try:
        current = ctx.ledger.get(KIND, fault)
        if current is None:
            if len(ctx.ledger.scan(KIND, limit=MAX_ROWS)) >= MAX_ROWS:  # bounded: never the whole kind
                log.warning("pending faults full (%d): %s on %s is refused and not kept", MAX_ROWS, fault, info.get("node"))
                return
            row = PendingFault(event=dict(event), cluster=str(info["cluster"]), node=str(info["node"]), code=code,
                               reason=handled.detail, first_at=now, last_at=now)
            ctx.ledger.create(Record(kind=KIND, id=fault, state=WAITING, data=to_data(row), created_at=now))
            return
        row = decode(current.data, PendingFault)
        ctx.ledger.save(current.moved(WAITING, at=now, note=f"refused again ({code})", **to_data(
            msgspec.structs.replace(row, code=code, reason=handled.detail, last_at=now, tries=row.tries + 1))))
    except (Conflict, NotFound):
        return  # another instance kept (or dropped) it meanwhile: theirs stands
    except (StewardError, msgspec.ValidationError, TypeError, ValueError) as exc:
        log.warning("pending fault %s not kept: %s", fault, exc)


@dataclass
class Rejudged:
    admitted: int = 0
    waiting: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "waiting": self.waiting, "dropped": dict(self.dropped),
                "errors": list(self.errors)}


def max_age_s(ctx: Context) -> float:
    policy = ctx.settings.remediation
    return float(getattr(policy, "pending_fault_max_age_s", 86400) or 86400)


def _drop(ctx: Context, record: Record, row: PendingFault | None, why: str, report: Rejudged, *, kind: str) -> None:
    from shared.remediation.notify import publish_now

    try:
        ctx.ledger.delete(record)
    except (Conflict, NotFound):
        return  # someone else judged it meanwhile
    report.dropped[kind] = report.dropped.get(kind, 0) + 1
    if row is not None:
        about = Record(kind=REMEDIATION_KIND, id="", state="", data={"cluster": row.cluster, "node": row.node,
                                                                     "fault": record.id})
        publish_now(ctx, about, Event.PENDING_DROPPED, why, key=f"{record.id}|dropped",
                    extra={"reason_code": kind, "reason": why, "tries": row.tries})
    log.info("pending fault %s dropped (%s): %s", record.id, kind, why)


def rejudge(ctx: Context) -> Rejudged:
    """Judge every kept fault again (at most MAX_PER_SWEEP, oldest first); see the module docstring."""
    from shared.remediation import health_events
    from shared.remediation.admission import Handling

    report = Rejudged()
    now = ctx.clock.now()
    try:
        rows = sorted(ctx.ledger.scan(KIND, limit=MAX_ROWS), key=lambda r: (r.updated_at, r.id))[:MAX_PER_SWEEP]
    except NotFound:
        return report
    except StewardError as exc:
        report.errors.append(f"listing pending faults: {exc}")
        return report
    for record in rows:
        try:
            row = decode(record.data, PendingFault)
        except (msgspec.ValidationError, TypeError, ValueError) as exc:
            _drop(ctx, record, None, f"unreadable row: {exc}", report, kind="unreadable")
            continue
        if now - row.first_at > max_age_s(ctx):
            _drop(ctx, record, row, f"still refused ({row.code}) after {int(now - row.first_at)} s: handed to an "
                  "operator", report, kind="expired")
            continue
        try:
            # observed now: handle() re-reads the VM's availability before it admits anything
            handled = health_events.handle(row.event, ctx, observed_at=now)
        except StewardError as exc:
            report.errors.append(f"{record.id}: {type(exc).__name__}: {exc}")
            continue
        if handled.outcome == Handling.DUPLICATE and passes(handled.code):
            report.waiting += 1  # another fault's repair holds the node: health_events.handle kept it again
        elif handled.outcome in (Handling.ADMITTED, Handling.DUPLICATE):
            report.admitted += handled.outcome == Handling.ADMITTED
            try:
                current = ctx.ledger.get(KIND, record.id)
                if current is not None:
                    ctx.ledger.delete(current)
            except (Conflict, NotFound):
                pass
        elif handled.outcome == Handling.REFUSED and passes(getattr(handled, "code", "")):
            report.waiting += 1  # health_events.handle kept it again (tries, last_at)
        elif handled.outcome == Handling.REFUSED:
            _drop(ctx, _fresh(ctx, record), row, f"refused for a reason a person must change: {handled.detail}",
                  report, kind="refused")
        else:
            _drop(ctx, _fresh(ctx, record), row, f"its source no longer confirms it: {handled.detail}", report,
                  kind="cleared")
    return report


def _fresh(ctx: Context, record: Record) -> Record:
    return ctx.ledger.get(KIND, record.id) or record

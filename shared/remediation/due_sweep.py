"""One more sweep at the moment a pending finding crosses its threshold, not at the timer's next tick.

The sweep judges a condition that has been True for less than its threshold *pending* and knows when the
earliest such finding crosses (``SweepReport.next_check``). The timer then finds it up to one SWEEP_SCHEDULE
interval late: measured by bench/time_to_repair.py (issue 24, item 3), that wait was the largest and the
most variable of the app's overheads (0 to 30 s against floors of 150 to 190 s). So the sweep asks for one
more sweep at that moment, through the delayed nudge the reconciler already uses (shared.kernel.nudge: a
message on NUDGE_QUEUE hidden until then, learn.microsoft.com/rest/api/storageservices/put-message
``visibilitytimeout``), and the ``reconcile_nudge`` trigger runs a sweep for such a hint
(shared.entrypoints.run_nudge).

A wake-up is a hint, never an instruction: the sweep it starts judges every node afresh, from the API
servers and the workspaces, exactly as the timer's does; a forged or duplicate message costs one sweep.
Bounded: at most one request per crossing second for the whole app (a ``dedupe`` marker
``sweep-due-<epoch second>``, so the timer's sweeps that see the same pending finding, on any instance, ask
once between them; the marker expires with the other dedupe rows), one per sweep (the earliest crossing:
the sweep it starts asks for the next), and none beyond the queue's visibility limit. Failing to ask is
only logged: the timer's sweep still comes.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from shared.kernel.errors import Conflict, StewardError
from shared.kernel.nudge import MAX_VISIBILITY_S
from shared.kernel.ports import Record
from shared.kernel.timefmt import iso
from shared.remediation.records import DEDUPE_KIND

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.sweep")

#: The hint of a nudge that asks for a sweep (the reconciler's own hints are ``<kind>:<id>``).
SWEEP_HINT = "sweep-due:"
#: After the crossing: the finding is judged at least its threshold old, whatever the rounding.
MARGIN_S = 1.0


def marker_id(when: int) -> str:
    return f"sweep-due-{when}"


def ask(ctx: Context, next_check: float | None, *, now: float) -> int | None:
    """Ask for a sweep just after ``next_check`` (fleet time); the epoch second asked for, or None when none
    was asked (nothing pending, no nudge port, already asked by another sweep, too far, or a failure)."""
    nudger = getattr(ctx, "nudge", None)
    if nudger is None or next_check is None:
        return None
    when = math.ceil(max(next_check, now) + MARGIN_S)
    if when - now > MAX_VISIBILITY_S:
        return None
    try:
        ctx.ledger.create(Record(kind=DEDUPE_KIND, id=marker_id(when), state="asked", created_at=now,
                                 updated_at=now, data={"at": when, "by": ctx.instance}))
    except Conflict:
        return None  # another sweep asked for this second already
    except StewardError as exc:
        log.warning("not asking for a sweep at %s: %s (the timer's sweep will find it)", iso(when), exc)
        return None
    try:
        nudger.nudge_at(float(when), hint=f"{SWEEP_HINT}{when}")
    except StewardError as exc:
        log.warning("asking for a sweep at %s failed: %s (the timer's sweep will find it)", iso(when), exc)
        return None
    log.info("a pending finding crosses its threshold at %s: sweep asked for then", iso(next_check))
    return when

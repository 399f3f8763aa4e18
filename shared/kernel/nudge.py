"""Delayed nudges: wake the reconciler when a record is due, instead of polling for it on a fast timer.

Why: on Flex Consumption every execution is billed at least 1,000 ms, and an idle reconcile takes
about 12 ms, so a 30-second timer pays almost only for minimums (docs/deploy.md, "What the timers
cost"). When the reconciler releases a record whose next look is in the future, it puts one message
on ``NUDGE_QUEUE`` -- which already triggers it -- with a *visibility timeout* equal to the wait
(Azure queues hide a message for up to 7 days: learn.microsoft.com/rest/api/storageservices/put-message,
``visibilitytimeout``). The reconciler then wakes when work is due, and the timer is only a slow
safety net for a lost nudge.

A wake-up is a hint, never an instruction: the reconciler looks at every due record whatever woke
it, so a duplicate or early message costs one short execution and nothing else. :class:`NudgeBook`
keeps one invocation's messages few: wake-up times fall on a coarse grid (:func:`wake_time`), one
message per grid point (a pending nudge at most :data:`COALESCE_S` after a record's wake-up time
serves it too), and at most :data:`MAX_NUDGES_PER_INVOCATION` in all. The grid also matters across
invocations: two invocations asking for the same point send two messages, the second of which finds
nothing due and sends nothing, so duplicates never chain.

This module is the reconciler's bookkeeping only; the NudgePort is sent over a queue by
:mod:`shared.adapters.nudge_queue` (and recorded in memory for tests by ``tests.fakes.nudge``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_VISIBILITY_S = 7 * 24 * 3600 - 60  # Put Message: visibilitytimeout up to 7 days, and below the TTL
COALESCE_S = 2.0  # a nudge already pending at most this long after a record's due time wakes it too
MAX_NUDGES_PER_INVOCATION = 20  # more records than that wait for the safety-net timer
#: Wake-ups fall on a grid of fleet time: the coarsest of these steps that is at most
#: :data:`SLOT_FRACTION` of the wait. Records due close together then share one wake-up, whichever
#: invocation asked for it, and records polled at the same pace fall into step instead of each
#: costing an execution of its own; a record is woken at most 20% of its wait late.
SLOTS_S: tuple[float, ...] = (60.0, 30.0, 10.0, 5.0, 2.0, 1.0)
SLOT_FRACTION = 0.2


@dataclass
class NudgeBook:
    """One invocation's delayed nudges: which wake-up times are already pending, and what was skipped."""

    limit: int = MAX_NUDGES_PER_INVOCATION
    pending: list[float] = field(default_factory=list)  # fleet times of the nudges sent
    coalesced: int = 0
    dropped: int = 0  # over the limit: the safety-net timer picks those records up
    failed: int = 0

    def covers(self, when: float) -> bool:
        """A nudge already sent wakes the reconciler at ``when`` or up to COALESCE_S later."""
        return any(when <= t <= when + COALESCE_S for t in self.pending)

    @property
    def full(self) -> bool:
        return len(self.pending) >= self.limit


def wake_time(due: float, *, now: float) -> float:
    """When to wake the reconciler for a record due at ``due``: ``due`` rounded up to its grid step."""
    wait = max(0.0, due - now)
    slot = next((s for s in SLOTS_S if s <= wait * SLOT_FRACTION), SLOTS_S[-1])
    return math.ceil(due / slot - 1e-9) * slot


def wall_delay_s(when: float, *, now: float, speed: float = 1.0) -> int:
    """The visibility timeout, in whole wall-clock seconds, for a wake-up at fleet time ``when``.

    Rounded up (a wake-up must not come before the record is due: it would find nothing and not
    re-arm); fleet time may run ``speed`` times faster than the wall clock (shared.kernel.clock.ScaledClock).
    """
    seconds = max(0.0, when - now) / (speed if speed > 0 else 1.0)
    return min(MAX_VISIBILITY_S, math.ceil(seconds - 1e-9))

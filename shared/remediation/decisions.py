"""A faulty node the sweep set aside, recorded as a short-lived ``decision`` row (issue 22, item 2).

The sweep judges only the nodes that are its to judge (shared.remediation.health ``_skip``: opted out,
deleting, a busy taint or annotation, cordoned by someone else, still starting, NotReady). A skipped node
that also carries a fault past its threshold is a decision *not to repair*, and the operator asking
``fleetctl why NODE`` at 3 a.m. should find it without searching the host's log. So the sweep writes one
``decision`` row per (fault, skip code), insert-if-absent:

- **bounded**: one row per fault and code (a fault is a node's condition and its lastTransitionTime), at
  most :data:`MAX_PER_SWEEP` new rows a sweep, and a process cache so a known row costs no write;
- **expiring**: ``LEDGER_DECISION_RETENTION_DAYS`` after it was written (shared.kernel.retention);
- **a note, not a step**: no step reads it, and a failure to write it is logged, never raised: the
  sweep's real work (publishing faults, feeding the breaker) does not depend on it.

Refusals made by the admission (budgets, breaker, cooldown, trust checks) are recorded apart, as ``dedupe``
``refused-<fault>-<code>`` rows (shared.remediation.admission ``refuse``); shared.remediation.refusals
explains both kinds of code.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from shared.kernel.errors import Conflict, StewardError
from shared.kernel.ports import Record
from shared.remediation.records import decode, fault_id, to_data

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.decisions")

KIND = "decision"
SKIPPED = "skipped"
SKIP_PREFIX = "skip-"
MAX_PER_SWEEP = 100  # new rows one sweep may write; the rest wait for the next sweep (the skip persists)


class SkipDecision(msgspec.Struct, kw_only=True):
    """``decision`` ``skip-<fault>-<code>``: the sweep set this faulty node aside, for this reason."""

    cluster: str
    node: str
    pool: str
    condition: str
    since: float
    code: str  # the skip code (shared.remediation.health SKIP_*), the part of the reason before ':'
    reason: str  # the whole skip reason (``busy-taint:<key>`` names the taint)
    at: float


@dataclass(frozen=True)
class SkippedFault:
    """A fault the sweep found on a node it skipped (shared.remediation.health ``Evaluation.skipped_faults``)."""

    cluster: str
    node: str
    pool: str
    condition: str
    since: float
    reason: str

    @property
    def code(self) -> str:
        return self.reason.split(":", 1)[0]

    @property
    def row_id(self) -> str:
        return f"{SKIP_PREFIX}{fault_id(self.cluster, self.node, self.condition, self.since)}-{self.code}"


@dataclass
class Recorded:
    written: int = 0
    known: int = 0  # already recorded (the cache or the row said so)
    deferred: int = 0  # over this sweep's bound: the next sweep writes them
    failed: int = 0


def record_skips(ctx: Context, skips: Sequence[SkippedFault], *, now: float) -> Recorded:
    """Write a ``decision`` row for each skipped fault not yet recorded; never raises a StewardError."""
    out = Recorded()
    cache = ctx.caches.recorded_decisions
    for skip in skips:
        row_id = skip.row_id
        if cache.get(row_id, now=now) is not None:
            out.known += 1
            continue
        if out.written + out.failed >= MAX_PER_SWEEP:
            out.deferred += 1
            continue
        decision = SkipDecision(cluster=skip.cluster, node=skip.node, pool=skip.pool, condition=skip.condition,
                                since=skip.since, code=skip.code, reason=skip.reason, at=now)
        try:
            ctx.ledger.create(Record(kind=KIND, id=row_id, state=SKIPPED, data=to_data(decision), created_at=now))
            out.written += 1
        except Conflict:
            out.known += 1
        except StewardError as exc:  # a note, not a step: the sweep goes on
            out.failed += 1
            log.warning("recording the skip of %s/%s (%s) failed: %s", skip.cluster, skip.node, skip.reason, exc)
            continue
        cache.put(row_id, now, now=now)
    return out


def load(record: Record) -> SkipDecision | None:
    """The decision a row holds; None for a row that is not one (rows may be written by anyone)."""
    if record.kind != KIND or not record.id.startswith(SKIP_PREFIX):
        return None
    try:
        return decode(record.data, SkipDecision)
    except (msgspec.ValidationError, TypeError, ValueError):
        return None

"""The fleet circuit breaker: stop every remediation when too many GPU nodes fail at once.

A storm (a bad driver roll-out, a DCGM bug, a zone event) makes many nodes unhealthy together;
replacing them all would turn a monitoring problem into an outage. The sweep feeds the breaker the
nodes whose configured condition turned ``True`` (pending or over threshold) with their transition
times; :func:`decide` (pure) keeps the distinct nodes that turned unhealthy within the window and
opens when they are more than ``breaker_percent`` of the fleet's GPU nodes (once at least
``breaker_min_nodes`` did) or at least ``breaker_max_nodes``. Once open it stays open until an
operator resets it (NVSentinel's runbook; ``fleetctl breaker --reset`` asks through a validated
command record that the reconciler applies with :func:`reset`, shared.remediation.commands): a reset records its
time, and remediation
events observed before it are refused as stale, so the backlog queued during the storm is dropped
instead of replayed (NVSentinel#450); nodes still unhealthy are re-reported by the next sweep.

The state is one ledger record (kind ``breaker``, id ``fleet``) updated under its ETag.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from shared.kernel.errors import Conflict, StewardError
from shared.kernel.ports import Record
from shared.remediation.policy import RemediationPolicy

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.breaker")

KIND = "breaker"
ID = "fleet"
CLOSED, OPEN = "closed", "open"
OPENED_EVENT = "Steward.Breaker.Opened"
RESET_EVENT = "Steward.Breaker.Reset"
MAX_WINDOW_ENTRIES = 400  # keeps the record far below the table's 64 KiB property limit
_SAVE_TRIES = 5


@dataclass(frozen=True)
class BreakerState:
    state: str = CLOSED
    window: Mapping[str, float] = field(default_factory=dict)  # node key -> when it turned unhealthy
    fleet_nodes: int = 0
    opened_at: float | None = None
    reason: str = ""
    reset_at: float = 0.0
    reset_by: str = ""

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    def to_data(self) -> dict[str, Any]:
        return {"window": dict(self.window), "fleet_nodes": self.fleet_nodes, "opened_at": self.opened_at,
                "reason": self.reason, "reset_at": self.reset_at, "reset_by": self.reset_by}

    @classmethod
    def from_record(cls, record: Record | None) -> BreakerState:
        if record is None:
            return cls()
        d = record.data
        return cls(state=record.state if record.state in (OPEN, CLOSED) else CLOSED,
                   window={str(k): float(v) for k, v in (d.get("window") or {}).items()},
                   fleet_nodes=int(d.get("fleet_nodes") or 0), opened_at=d.get("opened_at"),
                   reason=str(d.get("reason") or ""), reset_at=float(d.get("reset_at") or 0.0),
                   reset_by=str(d.get("reset_by") or ""))


def should_trip(count: int, fleet_nodes: int, policy: RemediationPolicy) -> str | None:
    """Why the breaker must open with ``count`` nodes turned unhealthy in the window, or None."""
    if not policy.breaker_enabled:
        return None
    if policy.breaker_max_nodes and count >= policy.breaker_max_nodes:
        return (f"{count} GPU nodes turned unhealthy within {policy.breaker_window_s}s "
                f"(BREAKER_MAX_NODES={policy.breaker_max_nodes})")
    if count >= policy.breaker_min_nodes and fleet_nodes > 0 and count * 100 > policy.breaker_percent * fleet_nodes:
        return (f"{count} of {fleet_nodes} GPU nodes ({100 * count / fleet_nodes:.0f}%) turned unhealthy within "
                f"{policy.breaker_window_s}s (BREAKER_PERCENT={policy.breaker_percent})")
    return None


def decide(state: BreakerState, observations: Mapping[str, float], *, fleet_nodes: int,
           policy: RemediationPolicy, now: float) -> BreakerState:
    """The breaker after one sweep's observations (node key -> when its condition turned True)."""
    if state.is_open:
        return BreakerState(state=OPEN, window=state.window, fleet_nodes=max(fleet_nodes, state.fleet_nodes),
                            opened_at=state.opened_at, reason=state.reason, reset_at=state.reset_at,
                            reset_by=state.reset_by)
    floor = max(now - policy.breaker_window_s, state.reset_at)
    merged = dict(state.window)
    for key, since in observations.items():
        merged[key] = min(since, merged.get(key, since))
    window = {k: v for k, v in merged.items() if v >= floor}
    if len(window) > MAX_WINDOW_ENTRIES:
        window = dict(sorted(window.items(), key=lambda kv: kv[1])[-MAX_WINDOW_ENTRIES:])
    fleet = fleet_nodes or state.fleet_nodes
    reason = should_trip(len(window), fleet, policy)
    if reason is not None:
        return BreakerState(state=OPEN, window=window, fleet_nodes=fleet, opened_at=now, reason=reason,
                            reset_at=state.reset_at, reset_by=state.reset_by)
    return BreakerState(state=CLOSED, window=window, fleet_nodes=fleet, reset_at=state.reset_at,
                        reset_by=state.reset_by)


def current(ctx: Context) -> BreakerState:
    return BreakerState.from_record(ctx.ledger.get(KIND, ID))


def _write(ctx: Context, new: BreakerState, record: Record | None, *, note: str) -> None:
    now = ctx.clock.now()
    if record is None:
        ctx.ledger.create(Record(kind=KIND, id=ID, state=new.state, data=new.to_data(), created_at=now,
                                 updated_at=now, next_at=now,
                                 history=[{"at": now, "state": new.state, "note": note}]))
        return
    if new.state != record.state:
        ctx.ledger.save(record.moved(new.state, at=now, note=note, **new.to_data()))
    else:
        ctx.ledger.save(msgspec.structs.replace(record, data=new.to_data(), updated_at=now))


def _publish(ctx: Context, type_: str, data: Mapping[str, Any], key: str) -> None:
    try:
        ctx.events.publish(type_=type_, subject=f"{ctx.settings.event_source}/breaker/{ID}", data=data,
                           id_=hashlib.sha256(f"{type_}|{key}".encode()).hexdigest())
    except StewardError as exc:  # the state change is durable; the event is the notification
        log.warning("could not publish %s: %s", type_, exc)


def update(ctx: Context, *, observations: Mapping[str, float], fleet_nodes: int,
           policy: RemediationPolicy) -> BreakerState:
    """Apply one sweep's observations under the record's ETag; publishes Opened on the transition."""
    for _ in range(_SAVE_TRIES):
        now = ctx.clock.now()
        record = ctx.ledger.get(KIND, ID)
        old = BreakerState.from_record(record)
        new = decide(old, observations, fleet_nodes=fleet_nodes, policy=policy, now=now)
        if new == old and record is not None:
            return new
        try:
            _write(ctx, new, record, note=new.reason if new.is_open and not old.is_open else "sweep")
        except Conflict:
            continue
        if new.is_open and not old.is_open:
            log.error("fleet breaker opened: %s", new.reason)
            _publish(ctx, OPENED_EVENT, {"reason": new.reason, "opened_at": new.opened_at,
                                         "unhealthy_in_window": len(new.window), "fleet_gpu_nodes": new.fleet_nodes,
                                         "window_s": policy.breaker_window_s}, str(new.opened_at))
        return new
    raise Conflict("breaker record kept changing under us")


def reset(ctx: Context, *, by: str, reason: str = "", command: str = "") -> BreakerState:
    """Close the breaker: clears the window and refuses events from before now.

    An operator asks for it through a validated ``command`` record (``fleetctl breaker --reset``,
    applied by the reconciler: shared.remediation.commands), never by writing this record; ``command`` is that
    record's id, carried with ``by`` and ``reason`` into the history and the Reset event."""
    for _ in range(_SAVE_TRIES):
        now = ctx.clock.now()
        record = ctx.ledger.get(KIND, ID)
        old = BreakerState.from_record(record)
        new = BreakerState(state=CLOSED, window={}, fleet_nodes=old.fleet_nodes, reset_at=now, reset_by=by)
        try:
            _write(ctx, new, record, note=f"reset by {by}" + (f" (command {command}): {reason}" if command else ""))
        except Conflict:
            continue
        _publish(ctx, RESET_EVENT, {"reset_by": by, "reset_at": now, "was": old.state,
                                    "opened_at": old.opened_at, "reason": old.reason,
                                    "reset_reason": reason, "command": command}, str(now))
        return new
    raise Conflict("breaker record kept changing under us")


def is_stale(observed_at: float, state: BreakerState) -> bool:
    """An event observed before the last reset belongs to the dropped backlog."""
    return observed_at < state.reset_at

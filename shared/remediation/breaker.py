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

No tenant holds the fleet (issue 19). A cluster's admin writes its Node objects, so the nodes the
breaker counts are first checked against ARM (shared.remediation.breaker_evidence): a fake Node is no
evidence. And a cluster's own nodes, genuine or not, count at most ``breaker_cluster_share_percent`` of
what would open the breaker (:func:`cluster_cap`), rounded up but always below it: one cluster can never
switch repair off for every team; a storm confined to one cluster is bounded by that cluster's share of
the in-flight budget instead (shared.remediation.budget). A fleet of one cluster is not capped (there is
no other team to protect). Each node in the window remembers its cluster as a short hash (``origins``).

The state is one ledger record (kind ``breaker``, id ``fleet``) updated under its ETag; the window is
trimmed, oldest first, to stay well below the table's 64 KiB property limit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
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
WINDOW_BUDGET_BYTES = 56 * 1024  # the window and its origins as stored (UTF-16 JSON); the oldest go first
UNATTRIBUTED = ""  # the origin of a node counted before origins were recorded: one group, capped like a cluster
_SAVE_TRIES = 5


def cluster_tag(cluster_id: str) -> str:
    """The short, stable name of a cluster in the window's ``origins`` (its ARM id is too long to repeat)."""
    return hashlib.sha256(cluster_id.lower().encode()).hexdigest()[:10]


def _group(origins: Mapping[str, str]) -> dict[str, list[str]]:
    """``origins`` (node key -> cluster tag) as stored: cluster tag -> its node keys, sorted."""
    grouped: dict[str, list[str]] = {}
    for key, tag in sorted(origins.items()):
        grouped.setdefault(tag, []).append(key)
    return grouped


@dataclass(frozen=True)
class BreakerState:
    state: str = CLOSED
    window: Mapping[str, float] = field(default_factory=dict)  # node key -> when it turned unhealthy
    fleet_nodes: int = 0
    opened_at: float | None = None
    reason: str = ""
    reset_at: float = 0.0
    reset_by: str = ""
    origins: Mapping[str, str] = field(default_factory=dict)  # node key -> cluster_tag() of its cluster
    fleet_clusters: int = 0  # clusters with GPU nodes at the last sweep (the share applies from two)

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"window": dict(self.window), "fleet_nodes": self.fleet_nodes,
                                "opened_at": self.opened_at, "reason": self.reason, "reset_at": self.reset_at,
                                "reset_by": self.reset_by}
        if self.origins:
            data["origins"] = _group(self.origins)
        if self.fleet_clusters:
            data["fleet_clusters"] = self.fleet_clusters
        return data

    @classmethod
    def from_record(cls, record: Record | None) -> BreakerState:
        if record is None:
            return cls()
        d = record.data
        window = {str(k): float(v) for k, v in (d.get("window") or {}).items()}
        grouped = d.get("origins") or {}
        origins = {str(key): str(tag) for tag, keys in (grouped.items() if isinstance(grouped, Mapping) else ())
                   for key in (keys if isinstance(keys, list) else ()) if str(key) in window}
        return cls(state=record.state if record.state in (OPEN, CLOSED) else CLOSED,
                   window=window, fleet_nodes=int(d.get("fleet_nodes") or 0), opened_at=d.get("opened_at"),
                   reason=str(d.get("reason") or ""), reset_at=float(d.get("reset_at") or 0.0),
                   reset_by=str(d.get("reset_by") or ""), origins=origins,
                   fleet_clusters=int(d.get("fleet_clusters") or 0))


def trip_count(fleet_nodes: int, policy: RemediationPolicy) -> int | None:
    """The fewest nodes in the window that open the breaker (:func:`should_trip`); None: nothing opens it."""
    if not policy.breaker_enabled:
        return None
    counts = [policy.breaker_max_nodes] if policy.breaker_max_nodes else []
    if fleet_nodes > 0:  # count * 100 > percent * fleet, at least breaker_min_nodes
        counts.append(max(policy.breaker_min_nodes, policy.breaker_percent * fleet_nodes // 100 + 1))
    return min(counts, default=None)


def cluster_cap(*, fleet_nodes: int, fleet_clusters: int, policy: RemediationPolicy) -> int | None:
    """How many of one cluster's nodes the breaker counts at most; None when uncapped.

    ``breaker_cluster_share_percent`` of :func:`trip_count`, rounded up, but always at least one fewer
    than the trip count itself (one cluster alone never opens the breaker) and at least 1. Uncapped
    when the share is 100, when the fleet has one cluster (no other team to protect), or when nothing
    would open the breaker. When a single node opens it (BREAKER_MAX_NODES=1) no share can apply.
    """
    share = policy.breaker_cluster_share_percent
    trip = trip_count(fleet_nodes, policy)
    if share >= 100 or fleet_clusters <= 1 or trip is None:
        return None
    return max(1, min(trip - 1, math.ceil(trip * share / 100)))


def counted(window: Mapping[str, float], origins: Mapping[str, str], cap: int | None) -> int:
    """The nodes of ``window`` the breaker counts: all of them uncapped, else at most ``cap`` per cluster
    (nodes without an origin count as one more cluster)."""
    if cap is None:
        return len(window)
    per_cluster: dict[str, int] = {}
    for key in window:
        tag = origins.get(key, UNATTRIBUTED)
        per_cluster[tag] = per_cluster.get(tag, 0) + 1
    return sum(min(n, cap) for n in per_cluster.values())


def _stored_bytes(window: Mapping[str, float], origins: Mapping[str, str]) -> int:
    return 2 * len(json.dumps({"window": dict(window), "origins": _group(origins)}, separators=(",", ":")))


def _trim(window: dict[str, float], origins: dict[str, str]) -> tuple[dict[str, float], dict[str, str]]:
    """The newest entries that fit: at most MAX_WINDOW_ENTRIES and WINDOW_BUDGET_BYTES as stored."""
    if len(window) > MAX_WINDOW_ENTRIES:
        window = dict(sorted(window.items(), key=lambda kv: kv[1])[-MAX_WINDOW_ENTRIES:])
    while window and _stored_bytes(window, {k: v for k, v in origins.items() if k in window}) > WINDOW_BUDGET_BYTES:
        drop = max(1, len(window) // 10)
        window = dict(sorted(window.items(), key=lambda kv: kv[1])[drop:])
    return window, {k: v for k, v in origins.items() if k in window}


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
           policy: RemediationPolicy, now: float, origins: Mapping[str, str] | None = None,
           fleet_clusters: int = 0) -> BreakerState:
    """The breaker after one sweep's observations (node key -> when its condition turned True).

    ``origins`` names each observed node's cluster (node key -> cluster id, kept as its :func:`cluster_tag`);
    ``fleet_clusters`` is how many clusters had GPU nodes in the sweep. Without them nothing is capped.
    """
    if state.is_open:
        return BreakerState(state=OPEN, window=state.window, fleet_nodes=max(fleet_nodes, state.fleet_nodes),
                            opened_at=state.opened_at, reason=state.reason, reset_at=state.reset_at,
                            reset_by=state.reset_by, origins=state.origins,
                            fleet_clusters=fleet_clusters or state.fleet_clusters)
    floor = max(now - policy.breaker_window_s, state.reset_at)
    merged = dict(state.window)
    tags = dict(state.origins)
    for key, seen in observations.items():
        since = round(seen, 3)  # milliseconds: 400 entries and their origins fit the record
        merged[key] = min(since, merged.get(key, since))
        origin = (origins or {}).get(key)
        if origin:
            tags[key] = cluster_tag(origin)
    window, tags = _trim({k: v for k, v in merged.items() if v >= floor}, tags)
    fleet = fleet_nodes or state.fleet_nodes
    clusters = fleet_clusters or state.fleet_clusters
    cap = cluster_cap(fleet_nodes=fleet, fleet_clusters=clusters, policy=policy)
    count = counted(window, tags, cap)
    reason = should_trip(count, fleet, policy)
    if reason is not None:
        if cap is not None:
            reason += f"; at most {cap} counted per cluster (BREAKER_CLUSTER_SHARE_PERCENT)"
        return BreakerState(state=OPEN, window=window, fleet_nodes=fleet, opened_at=now, reason=reason,
                            reset_at=state.reset_at, reset_by=state.reset_by, origins=tags, fleet_clusters=clusters)
    return BreakerState(state=CLOSED, window=window, fleet_nodes=fleet, reset_at=state.reset_at,
                        reset_by=state.reset_by, origins=tags, fleet_clusters=clusters)


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
           policy: RemediationPolicy, origins: Mapping[str, str] | None = None,
           fleet_clusters: int = 0) -> BreakerState:
    """Apply one sweep's observations under the record's ETag; publishes Opened on the transition.

    ``origins`` and ``fleet_clusters`` as for :func:`decide` (shared.remediation.breaker_evidence gives both)."""
    for _ in range(_SAVE_TRIES):
        now = ctx.clock.now()
        record = ctx.ledger.get(KIND, ID)
        old = BreakerState.from_record(record)
        new = decide(old, observations, fleet_nodes=fleet_nodes, policy=policy, now=now, origins=origins,
                     fleet_clusters=fleet_clusters)
        if new == old and record is not None:
            return new
        try:
            _write(ctx, new, record, note=new.reason if new.is_open and not old.is_open else "sweep")
        except Conflict:
            continue
        if new.is_open and not old.is_open:
            log.error("fleet breaker opened: %s", new.reason)
            cap = cluster_cap(fleet_nodes=new.fleet_nodes, fleet_clusters=new.fleet_clusters, policy=policy)
            _publish(ctx, OPENED_EVENT, {"reason": new.reason, "opened_at": new.opened_at,
                                         "unhealthy_in_window": len(new.window), "fleet_gpu_nodes": new.fleet_nodes,
                                         "counted": counted(new.window, new.origins, cap), "cluster_cap": cap,
                                         "clusters_in_window": len(set(new.origins.values())),
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
        new = BreakerState(state=CLOSED, window={}, fleet_nodes=old.fleet_nodes, reset_at=now, reset_by=by,
                           fleet_clusters=old.fleet_clusters)
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

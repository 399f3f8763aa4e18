"""What earlier remediations of a node say about a fault seen again: shared by the signals that keep
their own first sightings (DCGM counters, GPU capacity); and which rows are admission's own attempts.

Read by admission's deterministic record ids (``<node key>-<n>``) and the per-node row, never from an
event: a fault handled by an active remediation is left to it, one handled by a remediation that ended
is a new fault, and a ``restart_then_replace`` fault seen again after a restart that ended ``done``
goes to replace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import msgspec

from shared.kernel.errors import Conflict
from shared.kernel.ports import Record
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    ACTIVE_STATES,
    BUDGET_ID,
    BUDGET_KIND,
    KIND,
    NODE_KIND,
    Attempt,
    BudgetData,
    NodeData,
    RemediationData,
    Rung,
    Slot,
    State,
    decode,
    node_key,
    to_data,
)

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation")

MAX_ATTEMPT_IDS = 50  # a node's remediations are few (BUDGET_NODE_MAX_ATTEMPTS in a window); a bound all the same


def handling(ctx: Context, cluster: str, node: str, fault: str) -> str:
    """``""`` when no admission took ``fault``; ``"active"`` while its remediation runs; ``"ended"`` after."""
    rec = ctx.ledger.get(NODE_KIND, node_key(cluster, node))
    nd = decode(rec.data, NodeData) if rec is not None else None
    if nd is None or fault not in nd.faults:
        return ""
    attempt = next((a for a in reversed(nd.attempts) if a.fault == fault), None)
    remediation = ctx.ledger.get(KIND, attempt.id) if attempt is not None else None
    return "active" if remediation is not None and remediation.state in ACTIVE_STATES else "ended"


def earlier(ctx: Context, cluster_id: str, node: str, *, signal: str, now: float,
            policy: RemediationPolicy) -> tuple[str, str]:
    """(a remediation of the node still in progress, an earlier ``signal`` remediation that restarted it
    and ended done within the attempt window), each ``""`` when none."""
    nk = node_key(cluster_id, node)
    active = repeated = ""
    mine = own(ctx, cluster_id, node)
    for n in range(1, MAX_ATTEMPT_IDS + 1):
        rec = ctx.ledger.get(KIND, f"{nk}-{n}")
        if rec is None:
            break
        if not mine(rec):
            continue  # written straight into the table: neither in progress here nor a restart that was tried
        if rec.state in ACTIVE_STATES:
            active = rec.id
        if rec.state != State.DONE or now - rec.created_at > policy.attempt_window_s:
            continue
        d = decode(rec.data, RemediationData)
        if d.signal == signal and not d.dry_run and Rung.RESTART in d.ladder[: d.rung_index + 1]:
            repeated = rec.id
    return active, repeated


def own(ctx: Context, cluster_id: str, node: str) -> Callable[[Record], bool]:
    """Whether a row at one of ``node``'s attempt ids is admission's: the node's row lists it, or the slot
    admission took when it created it is still held (read once, on the first row that needs it)."""
    rec = ctx.ledger.get(NODE_KIND, node_key(cluster_id, node))
    listed = {a.id for a in decode(rec.data, NodeData).attempts} if rec is not None else set()
    slots: dict[str, Slot] | None = None

    def mine(row: Record) -> bool:
        nonlocal slots
        if row.id in listed:
            return True
        slots = budget_slots(ctx) if slots is None else slots
        return slot_of_creation(slots, row, cluster=cluster_id, node=node)

    return mine


def slot_of_creation(slots: Mapping[str, Slot], record: Record, *, cluster: str, node: str) -> bool:
    """Whether ``slots`` hold the budget slot admission took for ``record`` on ``node`` when it created it.

    Admission takes the slot and creates the row in the same pass (the slot's ``at`` is the row's
    ``created_at``); :func:`shared.remediation.preconditions.reserve` takes one later for a row that has none,
    and that later slot is not admission's mark."""
    slot = slots.get(record.id)
    return (slot is not None and slot.node == node and slot.cluster.lower() == cluster.lower()
            and abs(slot.at - record.created_at) < 1.0)


def budget_slots(ctx: Context) -> dict[str, Slot]:
    rec = ctx.ledger.get(BUDGET_KIND, BUDGET_ID)
    return decode(rec.data, BudgetData).slots if rec is not None else {}


def note(ctx: Context, node_rec: Record | None, nd: NodeData, record: Record) -> None:
    """Remember admission's ``record`` and its fault on the per-node row (best effort: ids already dedupe)."""
    fault = str(record.data.get("fault") or "")
    attempts = [a for a in nd.attempts if a.id != record.id]
    attempts.append(Attempt(id=record.id, at=record.created_at, fault=fault))
    faults = [f for f in nd.faults if f != fault] + [fault]
    count = max(nd.count, int(record.data.get("attempt") or 0))
    data = to_data(msgspec.structs.replace(nd, attempts=attempts[-20:], faults=faults[-20:], last_id=record.id,
                                           count=count))
    try:
        if node_rec is None:
            ctx.ledger.create(Record(kind=NODE_KIND, id=node_key(nd.cluster, nd.node), state="known", data=data,
                                     created_at=record.created_at, updated_at=record.created_at))
        else:
            ctx.ledger.save(msgspec.structs.replace(node_rec, data={**node_rec.data, **data},
                                                    updated_at=record.created_at))
    except Conflict:
        log.info("node record %s changed meanwhile; the next admission repairs it", nd.node)


def note_if_admitted(ctx: Context, record: Record, d: RemediationData) -> None:
    """Note ``record`` on its node's row when admission made it and could not note it (its host died between
    creating the row and noting it), while its creation slot still proves it: the slot goes when the
    remediation ends, and a row nobody noted would then look like one written straight into the table
    (:func:`shared.remediation.admission._admit` steps over those). A row the node's row already lists costs
    one read."""
    node_rec = ctx.ledger.get(NODE_KIND, node_key(d.cluster, d.node))
    nd = decode(node_rec.data, NodeData) if node_rec is not None else NodeData(cluster=d.cluster, node=d.node)
    if any(a.id == record.id for a in nd.attempts):
        return
    if slot_of_creation(budget_slots(ctx), record, cluster=d.cluster, node=d.node):
        note(ctx, node_rec, nd, record)

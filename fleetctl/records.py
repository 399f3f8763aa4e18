"""Reading the app's ledger (one Azure Table; docs/architecture.md, "Durable records").

fleetctl reads here (and writes only operator commands, shared.remediation.commands), through
``shared.adapters.ledger.TableLedger`` so the row encoding stays the app's.
The views below pick the fields a person needs from each kind's record: what was asked, where it
is now, and why (the last history note, or the rejection's reasons).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from fleetctl.config import Storage

POOL_REQUEST, REMEDIATION, MIGRATION, BREAKER = "pool-request", "remediation", "migration", "breaker"

# Terminal states per kind, as docs/architecture.md lists them.
TERMINAL: dict[str, frozenset[str]] = {
    POOL_REQUEST: frozenset({"succeeded", "rejected", "failed", "blocked"}),
    REMEDIATION: frozenset({"done", "gave_up", "refused", "released", "failed", "blocked"}),
    MIGRATION: frozenset({"done", "rolled_back", "blocked"}),
}


def open_ledger(storage: Storage, table: str) -> Any:
    """The ledger, read-only in spirit: never creates its table, asks once (fleetctl.cli reports a failure)."""
    from shared.adapters.ledger import TableLedger

    return TableLedger(storage.table_client(table), ensure_table=False, read_attempts=1)


def list_records(ledger: Any, kind: str, *, states: Sequence[str] | None = None) -> list[Any]:
    """Records of a kind (none when the table does not exist yet), newest first."""
    from shared.kernel.errors import NotFound

    try:
        records = ledger.list(kind, states=list(states) if states else None)
    except NotFound:
        return []
    return sorted(records, key=lambda r: (r.updated_at, r.id), reverse=True)


def get_record(ledger: Any, kind: str, id_: str) -> Any:
    """The record ``id_`` of ``kind``, or None.

    Pool requests are keyed ``<team>:<requestId>`` (shared.pools.records.record_id); a bare request id finds the
    one team's request of that id (or the row an older version keyed by it). When several teams used the id,
    none is guessed: :func:`pool_request_matches` lists them."""
    from shared.kernel.errors import NotFound

    try:
        found = ledger.get(kind, id_)
    except NotFound:
        return None
    if found is not None or kind != POOL_REQUEST:
        return found
    matches = pool_request_matches(ledger, id_)
    return matches[0] if len(matches) == 1 else None


def pool_request_matches(ledger: Any, request_id: str) -> list[Any]:
    """Every pool-request row of this request id, whichever team sent it (newest first)."""
    from shared.pools.records import split_id

    return [r for r in list_records(ledger, POOL_REQUEST) if split_id(r.id)[1] == request_id]


def _last_note(record: Any) -> str:
    for line in reversed(record.history or []):
        if line.get("note"):
            return str(line["note"])
    return ""


def _cluster_name(cluster_id: Any) -> str:
    return str(cluster_id or "").rstrip("/").rsplit("/", 1)[-1]


def pool_request_view(record: Any) -> dict[str, Any]:
    d = record.data
    reasons = d.get("reasons") or []
    from shared.pools.records import split_id

    return {"id": record.id, "request_id": split_id(record.id)[1], "state": record.state, "requester": d.get("requester"),
            "cluster": _cluster_name(d.get("cluster")), "cluster_id": d.get("cluster"), "pool": d.get("pool"),
            "vm_size": d.get("vm_size") or d.get("vmSize"), "created_at": record.created_at, "updated_at": record.updated_at,
            "outcome": "; ".join(map(str, reasons)) if reasons else (d.get("error") or _last_note(record)),
            "terminal": record.state in TERMINAL[POOL_REQUEST]}


def remediation_view(record: Any) -> dict[str, Any]:
    d = record.data
    return {"id": record.id, "state": record.state, "cluster": _cluster_name(d.get("cluster")),
            "cluster_id": d.get("cluster"), "pool": d.get("pool"), "node": d.get("node"),
            "condition": d.get("condition"), "attempts": record.attempts, "created_at": record.created_at,
            "updated_at": record.updated_at, "note": _last_note(record),
            "last_error": str(d.get("_last_error") or ""), "error_tries": int(d.get("_permanent_tries") or 0),
            "stuck": str(d.get("_stuck") or ""),
            "terminal": record.state in TERMINAL[REMEDIATION]}


def migration_view(record: Any) -> dict[str, Any]:
    d = record.data
    total = int(d.get("nodes_total") or d.get("node_count") or 0)
    drained = len(d.get("drained") or [])
    return {"id": record.id, "state": record.state, "cluster": d.get("cluster_name") or _cluster_name(d.get("cluster_id")),
            "pool": d.get("pool"), "replacement": d.get("replacement"), "strategy": d.get("strategy"),
            "nodes_drained": drained, "nodes_total": total, "phase": d.get("phase"),
            "updated_at": record.updated_at, "note": _last_note(record),
            "reason": str(d.get("reason") or "") if record.state in ("blocked", "rolling_back", "rolled_back") else "",
            "last_error": str(d.get("_last_error") or ""), "error_tries": int(d.get("_permanent_tries") or 0),
            "waiting": str(d.get("waiting") or ""),
            "terminal": record.state in TERMINAL[MIGRATION]}


def breaker_view(record: Any) -> dict[str, Any]:
    if record is None:
        return {"state": "closed", "reason": "", "opened_at": None, "reset_at": None, "reset_by": "",
                "unhealthy_in_window": 0, "fleet_nodes": 0}
    d = record.data
    return {"state": record.state, "reason": d.get("reason") or "", "opened_at": d.get("opened_at"),
            "reset_at": d.get("reset_at") or None, "reset_by": d.get("reset_by") or "",
            "unhealthy_in_window": len(d.get("window") or {}), "fleet_nodes": int(d.get("fleet_nodes") or 0)}


def counts(records: Sequence[Any]) -> dict[str, int]:
    return dict(Counter(r.state for r in records))


COMMAND = "command"
RECENT_COMMANDS = 5


def command_views(ledger: Any, *, limit: int = RECENT_COMMANDS) -> list[dict[str, Any]]:
    """The latest operator commands (pending first), as shared.remediation.commands shows them."""
    from shared.remediation import commands

    found = list_records(ledger, COMMAND)
    pending = [r for r in found if r.state in commands.ACTIVE_STATES]
    done = [r for r in found if r.state not in commands.ACTIVE_STATES]
    return [commands.view(r) for r in (pending + done)[:limit]]

"""LedgerPort in memory: the same contract as shared.adapters.ledger.TableLedger, for tests and the soak.

Records go through the product's own entity encoding (``to_entity`` / ``from_entity``), so what could
not be stored in Azure Table storage fails here too; tests/integration/test_ledger_azurite.py runs the
same contract against both.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from shared.adapters.ledger import PROPERTY_LIMIT_BYTES, data_bytes, encode_key, from_entity, to_entity
from shared.kernel.errors import Conflict, Invalid
from shared.kernel.ports import Record
from shared.kernel.retention import matches


class InMemoryLedger:
    """The same contract as :class:`TableLedger`, in a dict (for unit tests; thread-safe).

    Records go through the same entity encoding as the table, so a record that could not be stored
    in Azure (oversized data, empty id) fails here too, and the history is truncated the same way.
    """

    data_limit_bytes = PROPERTY_LIMIT_BYTES

    def data_bytes(self, record: Record) -> int:
        """LedgerPort.data_bytes, measured as the table measures it."""
        return data_bytes(record)

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _new_etag() -> str:
        return f'W/"{uuid.uuid4().hex}"'

    def create(self, record: Record) -> Record:
        entity = to_entity(record)
        key = (entity["PartitionKey"], entity["RowKey"])
        with self._lock:
            if key in self._rows:
                raise Conflict(f"create {record.kind}/{record.id}: already exists")
            etag = self._new_etag()
            self._rows[key] = (entity, etag)
        return msgspec.structs.replace(record, etag=etag)

    def get(self, kind: str, id_: str) -> Record | None:
        with self._lock:
            row = self._rows.get((encode_key(kind), encode_key(id_)))
        return None if row is None else from_entity(*row)

    def scan(self, kind: str, *, states: Sequence[str] | None = None, due_by: float | None = None,
             older_than: float | None = None, limit: int = 1000) -> list[Record]:
        """LedgerPort.scan: the table's filter (shared.kernel.retention.matches), in key order, at most ``limit``."""
        rows = [r for r in self.list(kind, states=states) if matches(r, due_by=due_by, older_than=older_than)]
        return rows[:max(0, limit)]

    def list(self, kind: str, *, states: Sequence[str] | None = None) -> list[Record]:
        pk = encode_key(kind)
        wanted = None if states is None else set(states)
        with self._lock:
            rows = [row for (p, _), row in sorted(self._rows.items()) if p == pk]
        return [from_entity(*row) for row in rows if wanted is None or row[0]["state"] in wanted]

    def save(self, record: Record) -> Record:
        what = f"save {record.kind}/{record.id}"
        if not record.etag:
            raise Invalid(f"{what}: the record has no ETag (use create for new records)")
        entity = to_entity(record)
        key = (entity["PartitionKey"], entity["RowKey"])
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                raise Conflict(f"{what}: deleted by someone else")
            if row[1] != record.etag:
                raise Conflict(f"{what}: changed by someone else (ETag mismatch)")
            etag = self._new_etag()
            self._rows[key] = (entity, etag)
        return msgspec.structs.replace(record, etag=etag)

    def delete(self, record: Record) -> None:
        key = (encode_key(record.kind), encode_key(record.id))
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                return
            if record.etag and row[1] != record.etag:
                raise Conflict(f"delete {record.kind}/{record.id}: changed by someone else (ETag mismatch)")
            del self._rows[key]

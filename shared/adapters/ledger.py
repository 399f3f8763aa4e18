"""Durable records of long work, in one Azure Table, guarded by ETags.

Work that outlives one invocation (creating a pool, repairing a node, migrating a pool) is a
record whose ``state`` moves step by step; every write is conditional on the ETag the writer read,
so two instances racing on one record cannot both win: the loser gets :class:`Conflict` and drops
its step. :class:`TableLedger` is the real thing (Azure Table storage, Azurite locally);
``tests.fakes.ledger.InMemoryLedger`` has the same semantics for unit tests of the state machines.

Row layout (docs/architecture.md, "Durable records"): PartitionKey = kind, RowKey = id made
table-safe by :func:`encode_key`; columns ``state``, ``data`` and ``history`` (JSON strings),
``owner``, ``lease_until``, ``next_at``, ``attempts``, ``created_at``, ``updated_at``.

Only reads are retried here (they are idempotent); a write that failed transiently raises
:class:`Transient` and the reconciler tries the step again later, re-reading first.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from shared.adapters.storage import map_table_error
from shared.kernel.errors import Conflict, Invalid, NotFound, Transient
from shared.kernel.ports import Record

if TYPE_CHECKING:
    from shared.kernel.clock import Clock
    from shared.settings import Settings

T = TypeVar("T")

PROPERTY_LIMIT_BYTES = 64 * 1024
"""Azure Table storage limit for one string property (UTF-16, so 32 Ki characters)."""

_HISTORY_BUDGET_BYTES = 48 * 1024  # leave room below the limit for the notes we keep
_NOTE_MAX_CHARS = 500
_KEY_MAX_CHARS = 512  # keys are limited to 1 KiB (UTF-16) by the service

# Characters a PartitionKey/RowKey may not hold (/ \ # ? and control characters), plus the escape
# character itself and the single quote (keys travel inside OData literals in URLs).
_UNSAFE_KEY = re.compile(r"[/\\#?%'\x00-\x1f\x7f-\x9f]")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def encode_key(value: str) -> str:
    """Make ``value`` a valid table key, reversibly (``%XX`` for each unsafe character)."""
    if not value:
        raise Invalid("a record kind or id must not be empty")
    encoded = _UNSAFE_KEY.sub(lambda m: f"%{ord(m.group(0)):02X}", value)
    if len(encoded) > _KEY_MAX_CHARS:
        raise Invalid(f"record key too long ({len(encoded)} characters after encoding, at most {_KEY_MAX_CHARS})")
    return encoded


def decode_key(value: str) -> str:
    """Inverse of :func:`encode_key`."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), value)


def _utf16_size(text: str) -> int:
    return len(text.encode("utf-16-le"))


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def _history_json(history: Sequence[Mapping[str, Any]]) -> str:
    """The history as JSON, oldest lines dropped and long notes cut to stay under the limit."""
    lines: list[dict[str, Any]] = []
    for line in history:
        line = dict(line)
        note = line.get("note")
        if isinstance(note, str) and len(note) > _NOTE_MAX_CHARS:
            line["note"] = note[: _NOTE_MAX_CHARS - 1] + "…"
        lines.append(line)
    text = _dump(lines)
    while lines and _utf16_size(text) > _HISTORY_BUDGET_BYTES:
        lines = lines[max(1, len(lines) // 10):]  # drop the oldest tenth (at least one line)
        text = _dump(lines)
    return text


def data_bytes(record: Record) -> int:
    """How many bytes ``record.data`` takes as stored (UTF-16 JSON), over the limit or not."""
    return _utf16_size(_dump(record.data))


def _data_json(record: Record) -> str:
    text = _dump(record.data)
    if _utf16_size(text) > PROPERTY_LIMIT_BYTES:
        raise Invalid(
            f"record {record.kind}/{record.id}: data is {_utf16_size(text)} bytes as UTF-16, "
            f"over the {PROPERTY_LIMIT_BYTES}-byte table property limit"
        )
    return text


def to_entity(record: Record) -> dict[str, Any]:
    """The table entity for ``record`` (without the ETag, which travels as a header)."""
    return {
        "PartitionKey": encode_key(record.kind),
        "RowKey": encode_key(record.id),
        "state": record.state,
        "data": _data_json(record),
        "owner": record.owner,
        "lease_until": float(record.lease_until),
        "next_at": float(record.next_at),
        "attempts": int(record.attempts),
        "created_at": float(record.created_at),
        "updated_at": float(record.updated_at),
        "history": _history_json(record.history),
    }


def from_entity(entity: Mapping[str, Any], etag: str) -> Record:
    """The record stored as ``entity`` at version ``etag``."""
    return Record(
        kind=decode_key(str(entity["PartitionKey"])),
        id=decode_key(str(entity["RowKey"])),
        state=str(entity.get("state", "")),
        data=json.loads(entity.get("data") or "{}"),
        owner=str(entity.get("owner") or ""),
        lease_until=float(entity.get("lease_until") or 0.0),
        next_at=float(entity.get("next_at") or 0.0),
        attempts=int(entity.get("attempts") or 0),
        created_at=float(entity.get("created_at") or 0.0),
        updated_at=float(entity.get("updated_at") or 0.0),
        history=json.loads(entity.get("history") or "[]"),
        etag=etag,
    )


def query_filter(kind: str, *, states: Sequence[str] | None = None, due_by: float | None = None,
                 older_than: float | None = None) -> tuple[str, dict[str, Any]]:
    """The OData filter (and its parameters) of LedgerPort.list / scan: the partition, then the states,
    then due (``next_at`` and ``lease_until`` at or before ``due_by``), then old (``created_at`` and
    ``updated_at`` before ``older_than``). Every timestamp column is an Edm.Double (:func:`to_entity`)."""
    parameters: dict[str, Any] = {"pk": encode_key(kind)}
    query = "PartitionKey eq @pk"
    if states:
        alternatives = []
        for i, state in enumerate(dict.fromkeys(states)):
            parameters[f"s{i}"] = state
            alternatives.append(f"state eq @s{i}")
        query += " and ( " + " or ".join(alternatives) + " )"  # the SDK substitutes @names between spaces
    if due_by is not None:
        parameters["due"] = float(due_by)
        query += " and next_at le @due and lease_until le @due"
    if older_than is not None:
        parameters["old"] = float(older_than)
        query += " and created_at lt @old and updated_at lt @old"
    return query, parameters


# --------------------------------------------------------------------------- Azure Table storage

_ensured: set[tuple[str, str]] = set()
_ensured_lock = threading.Lock()


class TableLedger:
    """LedgerPort over one Azure Table (``azure.data.tables.TableClient``)."""

    data_limit_bytes = PROPERTY_LIMIT_BYTES

    def data_bytes(self, record: Record) -> int:
        """LedgerPort.data_bytes: the size ``record.data`` takes in the table."""
        return data_bytes(record)

    def __init__(self, table_client: Any, *, clock: Clock | None = None, ensure_table: bool = True,
                 read_attempts: int = 4) -> None:
        """``read_attempts``: tries of a read that fails transiently (the app waits them out; an operator's
        tool asks once and says so)."""
        self._table = table_client
        self._clock = clock
        self._read_attempts = read_attempts
        if ensure_table:
            self._ensure_table()

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock | None = None) -> TableLedger:
        """Connect as the settings say: a connection string locally, the managed identity in Azure."""
        from azure.data.tables import TableClient

        from shared.adapters.storage import storage_client

        client = storage_client(TableClient, settings, url_keyword="endpoint", url=settings.storage_table_uri,
                                table_name=settings.ledger_table)
        return cls(client, clock=clock)

    # -- plumbing

    def _call(self, fn: Callable[[], T], *, what: str) -> T:
        try:
            return fn()
        except Exception as error:  # SDK errors are translated at the edge; anything else is a bug
            mapped = map_table_error(error, what=what)
            if mapped is None:
                raise
            raise mapped from error

    def _read(self, fn: Callable[[], T], *, what: str) -> T:
        from shared.kernel import clock as clocks
        from shared.kernel import retry

        return retry.call(self._call, fn, what=what, clock=self._clock or clocks.current(), attempts=self._read_attempts,
                          max_delay=10.0)

    def _ensure_table(self) -> None:
        key = (str(getattr(self._table, "url", "")), str(self._table.table_name))
        with _ensured_lock:
            if key in _ensured:
                return

        def create() -> None:
            from azure.core.exceptions import ResourceExistsError

            with contextlib.suppress(ResourceExistsError):
                self._table.create_table()

        self._read(create, what=f"create table {self._table.table_name}")
        with _ensured_lock:
            _ensured.add(key)

    @staticmethod
    def _etag(metadata: Mapping[str, Any]) -> str:
        etag = metadata.get("etag")
        if not etag:
            raise Transient("storage answered without an ETag")
        return str(etag)

    # -- LedgerPort

    def create(self, record: Record) -> Record:
        entity = to_entity(record)
        metadata = self._call(lambda: self._table.create_entity(entity), what=f"create {record.kind}/{record.id}")
        return msgspec.structs.replace(record, etag=self._etag(metadata))

    def get(self, kind: str, id_: str) -> Record | None:
        pk, rk = encode_key(kind), encode_key(id_)
        try:
            entity = self._read(lambda: self._table.get_entity(partition_key=pk, row_key=rk), what=f"get {kind}/{id_}")
        except NotFound:
            return None
        return from_entity(entity, str(entity.metadata["etag"]))

    def scan(self, kind: str, *, states: Sequence[str] | None = None, due_by: float | None = None,
             older_than: float | None = None, limit: int = 1000) -> list[Record]:
        """LedgerPort.scan: the filter runs in the table service; pages are read only until ``limit`` rows."""
        if limit <= 0 or (states is not None and not states):
            return []
        query, parameters = query_filter(kind, states=states, due_by=due_by, older_than=older_than)

        def fetch() -> list[Record]:
            found: list[Record] = []
            pages = self._table.query_entities(query, parameters=parameters,
                                               results_per_page=min(limit, 1000)).by_page()
            for page in pages:
                for entity in page:
                    found.append(from_entity(entity, str(entity.metadata["etag"])))
                    if len(found) >= limit:
                        return found
            return found

        return self._read(fetch, what=f"scan {kind}")

    def list(self, kind: str, *, states: Sequence[str] | None = None) -> list[Record]:
        if states is not None and not states:
            return []
        query, parameters = query_filter(kind, states=states)

        def fetch() -> list[Record]:
            entities: Iterator[Any] = self._table.query_entities(query, parameters=parameters, results_per_page=1000)
            return [from_entity(e, str(e.metadata["etag"])) for e in entities]

        return self._read(fetch, what=f"list {kind}")

    def save(self, record: Record) -> Record:
        from azure.core import MatchConditions
        from azure.data.tables import UpdateMode

        if not record.etag:
            raise Invalid(f"save {record.kind}/{record.id}: the record has no ETag (use create for new records)")
        entity = to_entity(record)
        what = f"save {record.kind}/{record.id}"
        try:
            metadata = self._call(
                lambda: self._table.update_entity(entity, mode=UpdateMode.REPLACE, etag=record.etag,
                                                  match_condition=MatchConditions.IfNotModified),
                what=what)
        except NotFound as gone:
            raise Conflict(f"{what}: deleted by someone else") from gone
        return msgspec.structs.replace(record, etag=self._etag(metadata))

    def delete(self, record: Record) -> None:
        from azure.core import MatchConditions

        pk, rk = encode_key(record.kind), encode_key(record.id)
        what = f"delete {record.kind}/{record.id}"
        if record.etag:
            call = lambda: self._table.delete_entity(  # noqa: E731
                partition_key=pk, row_key=rk, etag=record.etag, match_condition=MatchConditions.IfNotModified)
        else:
            call = lambda: self._table.delete_entity(partition_key=pk, row_key=rk)  # noqa: E731
        try:
            self._call(call, what=what)
        except NotFound:
            return  # already gone: deleting is idempotent

"""The ledger contract, run against Azure Table storage (Azurite) and against the in-memory twin.

The state machines are unit-tested on :class:`InMemoryLedger`; these tests are what makes that
honest: every behaviour the machines rely on (ETag conflicts between writers, create-if-absent,
listing by state, odd ids) is checked on both implementations with the same assertions.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.adapters.ledger import PROPERTY_LIMIT_BYTES, TableLedger, decode_key, encode_key, to_entity
from shared.kernel.errors import Conflict, Invalid
from shared.kernel.ports import LedgerPort, Record
from tests.fakes.ledger import InMemoryLedger


def _table_ledger(connection: str) -> TableLedger:
    from azure.data.tables import TableClient

    client = TableClient.from_connection_string(connection, table_name=f"ledger{uuid.uuid4().hex[:16]}", retry_total=0)
    return TableLedger(client)


@pytest.fixture(params=["in-memory", "azurite"])
def make_ledger(request: pytest.FixtureRequest) -> Callable[[], LedgerPort]:
    if request.param == "in-memory":
        shared = InMemoryLedger()
        return lambda: shared
    connection = request.getfixturevalue("storage_connection_string")  # the session's Azurite (tests/conftest.py)
    table = _table_ledger(connection)
    return lambda: table


@pytest.fixture
def ledger(make_ledger: Callable[[], LedgerPort]) -> LedgerPort:
    return make_ledger()


def _record(id_: str = "r1", *, kind: str = "remediation", state: str = "admitted", **data: object) -> Record:
    return Record(kind=kind, id=id_, state=state, data=dict(data), created_at=1000.0, updated_at=1000.0, next_at=1000.0)


def _without_etag(record: Record) -> dict[str, object]:
    fields = {f: getattr(record, f) for f in record.__struct_fields__}
    fields.pop("etag")
    return fields


def test_a_created_record_reads_back_equal_with_an_etag(ledger: LedgerPort) -> None:
    created = ledger.create(_record(cluster="/subscriptions/s/c1", node="aks-gpu-0", attempt=1))
    assert created.etag
    read = ledger.get("remediation", "r1")
    assert read is not None
    assert _without_etag(read) == _without_etag(created)
    assert read.etag == created.etag


def test_creating_a_record_that_exists_is_a_conflict(ledger: LedgerPort) -> None:
    ledger.create(_record())
    with pytest.raises(Conflict):
        ledger.create(_record(state="cordoned"))
    stored = ledger.get("remediation", "r1")
    assert stored is not None and stored.state == "admitted"


def test_a_dedupe_marker_is_inserted_only_once(ledger: LedgerPort) -> None:
    outcomes = []
    for _ in range(3):
        try:
            ledger.create(Record(kind="dedupe", id="event-123", state="seen"))
            outcomes.append("new")
        except Conflict:
            outcomes.append("duplicate")
    assert outcomes == ["new", "duplicate", "duplicate"]


def test_a_missing_record_reads_as_none(ledger: LedgerPort) -> None:
    assert ledger.get("remediation", "nope") is None


def test_saving_moves_the_etag_and_the_stale_writer_loses(ledger: LedgerPort) -> None:
    ledger.create(_record())
    first = ledger.get("remediation", "r1")
    second = ledger.get("remediation", "r1")
    assert first is not None and second is not None

    saved = ledger.save(first.moved("cordoned", at=1010.0, note="cordoned by A"))
    assert saved.etag != first.etag
    with pytest.raises(Conflict):
        ledger.save(second.moved("refused", at=1011.0, note="B was late"))

    stored = ledger.get("remediation", "r1")
    assert stored is not None
    assert stored.state == "cordoned"
    assert stored.history == [{"at": 1010.0, "state": "cordoned", "note": "cordoned by A"}]
    assert stored.etag == saved.etag


def test_a_saved_copy_can_be_saved_again_with_its_new_etag(ledger: LedgerPort) -> None:
    record = ledger.create(_record())
    for step, state in enumerate(["cordoned", "draining", "repairing"]):
        record = ledger.save(record.moved(state, at=1000.0 + step, attempt=step))
    stored = ledger.get("remediation", "r1")
    assert stored is not None and stored.state == "repairing" and stored.data["attempt"] == 2


def test_concurrent_writers_never_lose_an_update(ledger: LedgerPort) -> None:
    ledger.create(_record(state="counting"))
    writers, increments = 4, 5
    conflicts: list[int] = []

    def work() -> None:
        done = 0
        while done < increments:
            current = ledger.get("remediation", "r1")
            assert current is not None
            try:
                ledger.save(Record(**{**_without_etag(current), "attempts": current.attempts + 1}, etag=current.etag))
                done += 1
            except Conflict:
                conflicts.append(1)

    threads = [threading.Thread(target=work) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stored = ledger.get("remediation", "r1")
    assert stored is not None and stored.attempts == writers * increments


def test_saving_a_record_someone_deleted_is_a_conflict(ledger: LedgerPort) -> None:
    created = ledger.create(_record())
    ledger.delete(created)
    with pytest.raises(Conflict):
        ledger.save(created.moved("cordoned", at=1001.0))


def test_saving_a_record_that_was_never_read_is_refused(ledger: LedgerPort) -> None:
    with pytest.raises(Invalid):
        ledger.save(_record())


def test_deleting_with_a_stale_etag_is_a_conflict_and_deleting_twice_is_harmless(ledger: LedgerPort) -> None:
    created = ledger.create(_record())
    moved = ledger.save(created.moved("done", at=1001.0))
    with pytest.raises(Conflict):
        ledger.delete(created)
    ledger.delete(moved)
    ledger.delete(moved)
    assert ledger.get("remediation", "r1") is None


def test_listing_filters_by_kind_and_state(ledger: LedgerPort) -> None:
    for i, state in enumerate(["admitted", "draining", "done", "draining", "gave_up"]):
        ledger.create(_record(f"r{i}", state=state))
    ledger.create(_record("m1", kind="migration", state="draining"))

    def ids(records: list[Record]) -> list[str]:
        return sorted(r.id for r in records)

    assert ids(ledger.list("remediation")) == ["r0", "r1", "r2", "r3", "r4"]
    assert ids(ledger.list("remediation", states=["draining"])) == ["r1", "r3"]
    assert ids(ledger.list("remediation", states=["admitted", "gave_up", "draining"])) == ["r0", "r1", "r3", "r4"]
    assert ids(ledger.list("migration", states=["draining"])) == ["m1"]
    assert ledger.list("remediation", states=[]) == []
    assert ledger.list("pool-request") == []
    assert all(r.etag for r in ledger.list("remediation"))


ODD_IDS = {
    "slashes": "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1/agentPools/gpu",
    "backslash": "a\\b",
    "hash-and-question": "node#1?x=y",
    "percent-looking-like-an-escape": "100%2Fdone%",
    "single-quote": "it's",
    "control-characters": "tab\there\nnewline\x7f",
    "unicode": "nœud-ノード-🚀",
    "spaces": "  padded  ",
}


@pytest.mark.parametrize("odd_id", list(ODD_IDS.values()), ids=list(ODD_IDS))
def test_odd_ids_round_trip_and_list(ledger: LedgerPort, odd_id: str) -> None:
    created = ledger.create(_record(odd_id, kind="pool-request", state="accepted"))
    read = ledger.get("pool-request", odd_id)
    assert read is not None and read.id == odd_id and read.etag == created.etag
    assert [r.id for r in ledger.list("pool-request", states=["accepted"])] == [odd_id]
    ledger.save(read.moved("creating", at=1001.0))
    ledger.delete(ledger.get("pool-request", odd_id))  # type: ignore[arg-type]
    assert ledger.get("pool-request", odd_id) is None


def test_a_long_history_is_truncated_to_fit_keeping_the_latest_lines(ledger: LedgerPort) -> None:
    record = ledger.create(_record())
    history = [{"at": 1000.0 + i, "state": "draining", "note": f"{i}:" + "x" * 2000} for i in range(200)]
    record = Record(**{**_without_etag(record), "history": history}, etag=record.etag)
    ledger.save(record)
    stored = ledger.get("remediation", "r1")
    assert stored is not None
    assert 0 < len(stored.history) < 200
    assert stored.history[-1]["at"] == 1199.0 and stored.history[-1]["note"].startswith("199:")
    assert len(to_entity(stored)["history"].encode("utf-16-le")) < PROPERTY_LIMIT_BYTES


def test_data_over_the_property_limit_is_refused_before_any_write(ledger: LedgerPort) -> None:
    with pytest.raises(Invalid, match="property limit"):
        ledger.create(_record(blob="y" * 40_000))
    assert ledger.get("remediation", "r1") is None


def test_an_empty_id_is_refused(ledger: LedgerPort) -> None:
    with pytest.raises(Invalid):
        ledger.create(_record(""))


@given(st.text(min_size=1, max_size=60))
def test_key_encoding_is_reversible_and_table_safe(value: str) -> None:
    encoded = encode_key(value)
    assert decode_key(encoded) == value
    assert not any(ch in encoded for ch in "/\\#?'") and all(ord(ch) >= 0x20 and not 0x7F <= ord(ch) <= 0x9F
                                                             for ch in encoded)


def test_the_ledger_connects_from_settings_and_creates_its_table_once(storage_connection_string: str) -> None:
    from shared.settings import Settings

    settings = Settings(subscriptions=("11111111-1111-1111-1111-111111111111",),
                        eventgrid_topic_endpoint="https://eg.example", storage_connection_string=storage_connection_string,
                        ledger_table=f"settings{uuid.uuid4().hex[:12]}")
    first = TableLedger.from_settings(settings)
    second = TableLedger.from_settings(settings)  # the table exists: no second create
    created = first.create(_record("from-settings"))
    assert second.get("remediation", "from-settings") == created


class _FakeResponse:
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        self.headers = headers or {}
        self.reason = "reason"
        self.content_type = "application/json"

    def text(self, encoding: str | None = None) -> str:
        return '{"odata.error": {"code": "Code", "message": {"value": "message"}}}'

    def body(self) -> bytes:
        return self.text().encode()


def _http_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    from azure.core.exceptions import HttpResponseError

    return HttpResponseError(message="boom", response=_FakeResponse(status, headers))


MAPPED = [
    ("throttled-with-retry-after", lambda: _http_error(429, {"Retry-After": "7"}), "Throttled", 7.0),
    ("server-error", lambda: _http_error(503), "Transient", None),
    ("etag-mismatch", lambda: _http_error(412), "Conflict", None),
    ("conflict", lambda: _http_error(409), "Conflict", None),
    ("not-found", lambda: _http_error(404), "NotFound", None),
    ("forbidden", lambda: _http_error(403), "Forbidden", None),
    ("bad-request", lambda: _http_error(400), "Invalid", None),
    ("connection-refused", lambda: __import__("azure.core.exceptions").core.exceptions.ServiceRequestError("refused"),
     "Transient", None),
]


@pytest.mark.parametrize(("make", "expected", "retry_after"), [m[1:] for m in MAPPED], ids=[m[0] for m in MAPPED])
def test_storage_errors_map_to_the_projects_errors(make: Callable[[], Exception], expected: str,
                                                   retry_after: float | None) -> None:
    from shared.adapters.storage import map_table_error

    mapped = map_table_error(make(), what="op")
    assert type(mapped).__name__ == expected
    assert getattr(mapped, "retry_after", None) == retry_after


def test_a_programming_error_is_not_disguised_as_a_storage_error() -> None:
    from shared.adapters.storage import map_table_error

    assert map_table_error(KeyError("x"), what="op") is None

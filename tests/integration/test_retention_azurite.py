"""Bounded reads of the ledger, against Azure Table storage (Azurite) and the in-memory twin (issue 19, item 4).

``LedgerPort.scan`` filters in the table service (state, due, age) and stops at its limit; the retention
sweep and the reconciler read through it. The same assertions run on the in-memory ledger, which has no
``scan`` and is filtered by shared.kernel.retention with the same rules.
"""

from __future__ import annotations

import types
import uuid
from typing import Any

import pytest

from shared.adapters.ledger import TableLedger
from shared.kernel import retention
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.ports import LedgerPort, Record
from shared.kernel.reconciler import reconcile_once
from shared.kernel.retention import DAY_S, RetentionPolicy
from tests.fakes.ledger import InMemoryLedger

NOW = 1_764_684_000.0


@pytest.fixture(params=["in-memory", "azurite"])
def ledger(request: pytest.FixtureRequest) -> LedgerPort:
    if request.param == "in-memory":
        return InMemoryLedger()
    from azure.data.tables import TableClient

    connection = request.getfixturevalue("storage_connection_string")  # the session's Azurite (tests/conftest.py)
    client = TableClient.from_connection_string(connection, table_name=f"ledger{uuid.uuid4().hex[:16]}", retry_total=0)
    return TableLedger(client)


def ctx_of(ledger: LedgerPort) -> Context:
    return Context(settings=None, clock=ManualClock(NOW), ledger=ledger, access=None, events=None,  # type: ignore[arg-type]
                   telemetry=None, instance="host-a")


def put(ledger: LedgerPort, kind: str, id_: str, state: str, *, age_days: float = 0.0, next_at: float = 0.0,
        lease_until: float = 0.0, **data: Any) -> Record:
    at = NOW - age_days * DAY_S
    return ledger.create(Record(kind=kind, id=id_, state=state, data=dict(data), created_at=at - 60, updated_at=at,
                                next_at=next_at, lease_until=lease_until))


FILTERS = [
    ("active states only", {"states": ["a", "b"]}),
    ("due and unclaimed now", {"due_by": NOW}),
    ("due among the active", {"states": ["a"], "due_by": NOW}),
    ("older than ten days", {"older_than": NOW - 10 * DAY_S}),
    ("finished and older than ten days", {"states": ["done"], "older_than": NOW - 10 * DAY_S}),
    ("nothing matches", {"states": ["a"], "older_than": NOW - 999 * DAY_S}),
]


@pytest.mark.parametrize("where", [f[1] for f in FILTERS], ids=[f[0] for f in FILTERS])
def test_scan_filters_in_the_store_exactly_as_the_rule_says(ledger: LedgerPort, where: dict[str, Any]) -> None:
    put(ledger, "k", "a-due", "a", age_days=20, next_at=NOW - 5)
    put(ledger, "k", "a-due-now", "a", age_days=1, next_at=NOW)
    put(ledger, "k", "a-later", "a", age_days=20, next_at=NOW + 60)
    put(ledger, "k", "a-claimed", "a", age_days=20, next_at=NOW - 5, lease_until=NOW + 100)
    put(ledger, "k", "b-due", "b", age_days=3)
    put(ledger, "k", "done-old", "done", age_days=30)
    put(ledger, "k", "done-recent", "done", age_days=2)
    put(ledger, "other", "a-due", "a", age_days=30)
    everything = ledger.list("k")
    expected = sorted(r.id for r in everything if retention.matches(r, **where))
    got = retention.scan(ledger, "k", **where)
    assert sorted(r.id for r in got) == expected
    assert all(r.etag and r.kind == "k" for r in got)


def test_scan_returns_at_most_its_limit_in_key_order(ledger: LedgerPort) -> None:
    for i in range(25):
        put(ledger, "k", f"r{i:03}", "done", age_days=40)
    assert [r.id for r in retention.scan(ledger, "k", older_than=NOW - DAY_S, limit=7)] == [f"r{i:03}" for i in range(7)]
    assert len(retention.scan(ledger, "k", states=["done"], limit=1000)) == 25
    assert retention.scan(ledger, "k", limit=0) == [] and retention.scan(ledger, "k", states=[]) == []


def test_the_retention_sweep_deletes_old_rows_and_keeps_active_recent_and_owned_ones(ledger: LedgerPort) -> None:
    put(ledger, "remediation", "rem-old", "done", age_days=31)
    put(ledger, "remediation", "rem-active", "draining", age_days=60)
    put(ledger, "remediation", "rem-recent", "gave_up", age_days=2)
    put(ledger, "dedupe", "op-rem-active-0-restart-1", "requested", age_days=30, remediation="rem-active")
    put(ledger, "dedupe", "op-rem-old-0-restart-1", "requested", age_days=30, remediation="rem-old")
    put(ledger, "dedupe", "refused-fault-budget-fleet", "seen", age_days=8)
    put(ledger, "pool-request", "team:req-1", "succeeded", age_days=31)
    put(ledger, "pool-request", "msg-abc", "rejected", age_days=8)
    put(ledger, "pool-request", "team:req-2", "creating", age_days=31)
    put(ledger, "migration", "mig-blocked", "blocked", age_days=300)
    put(ledger, "gpu-capacity-node", "cap-old", "short", age_days=31)
    report = retention.sweep(ctx_of(ledger), policy=RetentionPolicy())
    left = {f"{k}/{r.id}" for k in ("remediation", "dedupe", "pool-request", "migration", "gpu-capacity-node")
            for r in ledger.list(k)}
    assert left == {"remediation/rem-active", "remediation/rem-recent", "dedupe/op-rem-active-0-restart-1",
                    "pool-request/team:req-2", "migration/mig-blocked"}
    assert report.deleted == {"remediation": 1, "dedupe": 2, "pool-request": 2, "gpu-capacity-node": 1}


def test_the_retention_sweep_stops_at_its_bound_and_the_next_runs_finish(ledger: LedgerPort) -> None:
    for i in range(12):
        put(ledger, "dedupe", f"refused-{i:03}", "seen", age_days=9)
    policy = RetentionPolicy(max_deletes=5)
    assert retention.sweep(ctx_of(ledger), policy=policy).deleted == {"dedupe": 5}
    assert len(ledger.list("dedupe")) == 7
    retention.sweep(ctx_of(ledger), policy=policy)
    retention.sweep(ctx_of(ledger), policy=policy)
    assert ledger.list("dedupe") == []


def test_the_reconciler_steps_only_due_rows_read_from_the_table(ledger: LedgerPort) -> None:
    stepped: list[str] = []

    def advance(record: Record, ctx: Context) -> Record:
        stepped.append(record.id)
        return record.moved("done", at=ctx.clock.now())

    kind = types.ModuleType("k")
    kind.ACTIVE_STATES = ("a",)  # type: ignore[attr-defined]
    kind.advance = advance  # type: ignore[attr-defined]
    put(ledger, "k", "due", "a", next_at=NOW - 1)
    put(ledger, "k", "later", "a", next_at=NOW + 600)
    put(ledger, "k", "claimed", "a", next_at=NOW - 1, lease_until=NOW + 60)
    put(ledger, "k", "finished", "done", next_at=NOW - 1)
    report = reconcile_once(ctx_of(ledger), modules={"k": kind})
    assert stepped == ["due"] and report.finished == ["k/due -> done"]

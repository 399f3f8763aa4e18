"""The ledger does not grow without bound (issue 19, item 4): what expires, what never does, how much one
run deletes, and the reconciler reading only what is due. tests/integration/test_retention_azurite.py runs
the same against Azure Table storage."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import pytest

from shared.kernel import reconciler, retention
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.kernel.retention import DAY_S, Owner, RetentionPolicy, Rule, expired
from tests.fakes.ledger import InMemoryLedger

NOW = 1_764_684_000.0
POLICY = RetentionPolicy()


class ScanningLedger(InMemoryLedger):
    """The in-memory ledger with LedgerPort.scan (the filter shared.kernel.retention.matches defines)."""

    def __init__(self) -> None:
        super().__init__()
        self.scans: list[dict[str, Any]] = []

    def scan(self, kind: str, *, states: Sequence[str] | None = None, due_by: float | None = None,
             older_than: float | None = None, limit: int = 1000) -> list[Record]:
        self.scans.append({"kind": kind, "states": states, "due_by": due_by, "older_than": older_than, "limit": limit})
        rows = [r for r in self.list(kind, states=states)
                if retention.matches(r, due_by=due_by, older_than=older_than)]
        return rows[:max(0, limit)]


class ListOnlyLedger(InMemoryLedger):
    """A ledger that can only list (a wrapper written before LedgerPort.scan): shared.kernel.retention.scan
    filters its rows itself."""

    scan = None  # type: ignore[assignment]


def ctx_of(ledger: InMemoryLedger, now: float = NOW) -> Context:
    return Context(settings=None, clock=ManualClock(now), ledger=ledger, access=None, events=None,  # type: ignore[arg-type]
                   telemetry=None, instance="host-a")


def row(kind: str, id_: str, state: str, *, age_days: float, lease_until: float = 0.0, **data: Any) -> Record:
    at = NOW - age_days * DAY_S
    return Record(kind=kind, id=id_, state=state, data=dict(data), created_at=at - 60, updated_at=at,
                  lease_until=lease_until)


# --------------------------------------------------------------------------- the names are the jobs' own


def test_the_kinds_and_states_named_in_the_kernel_are_the_jobs_own() -> None:
    from shared.migration import records as migration
    from shared.pools import records as pools
    from shared.remediation import commands, dcgm, dcgm_reports, decisions, gpu_capacity, pending_faults
    from shared.remediation import records as remediation

    assert retention.REMEDIATION_ACTIVE == remediation.ACTIVE_STATES
    assert retention.REMEDIATION_ENDED == remediation.TERMINAL_STATES
    assert set(pools.TERMINAL_STATES) == retention.POOL_REQUEST_ENDED | retention.POOL_REQUEST_REJECTED
    assert {pools.State.REJECTED} == retention.POOL_REQUEST_REJECTED
    assert retention.MIGRATION_DONE == {migration.MigrationState.DONE} < migration.TERMINAL_STATES
    assert retention.COMMAND_ENDED == commands.TERMINAL_STATES
    kinds = {r.kind for r in retention.standard_rules(POLICY)}
    assert kinds == {remediation.KIND, remediation.NODE_KIND, remediation.DEDUPE_KIND, pools.KIND, migration.KIND,
                     commands.KIND, dcgm_reports.REPORT_KIND, dcgm.DCGM_KIND, gpu_capacity.ROW_KIND, decisions.KIND,
                     pending_faults.KIND}
    assert remediation.BUDGET_KIND not in kinds and "breaker" not in kinds, "single rows are never expired"


def test_no_rule_lets_an_active_state_expire() -> None:
    from shared.entrypoints import record_kinds

    for kind, module in record_kinds().items():
        for rule in retention.standard_rules(POLICY):
            if rule.kind == kind:
                assert rule.states is not None, f"{kind}: a rule for a stepped kind must name its states"
                assert not rule.states & set(module.ACTIVE_STATES), f"{kind}: {rule.states & set(module.ACTIVE_STATES)}"


def test_a_migration_rolled_back_or_blocked_waits_for_an_operator() -> None:
    for state in ("rolled_back", "blocked"):
        old = row("migration", "m1", state, age_days=3650)
        assert not any(expired(old, r, now=NOW) for r in retention.standard_rules(POLICY))


# --------------------------------------------------------------------------- the decision

OWNED = Owner(field="remediation", kind="remediation", active=retention.REMEDIATION_ACTIVE)
EXPIRED = [
    ("a finished row past its retention", row("remediation", "r", "done", age_days=31),
     Rule("remediation", 30 * DAY_S, frozenset({"done"})), None, True),
    ("a finished row within its retention", row("remediation", "r", "done", age_days=29),
     Rule("remediation", 30 * DAY_S, frozenset({"done"})), None, False),
    ("an active row, however old", row("remediation", "r", "draining", age_days=400),
     Rule("remediation", 30 * DAY_S, frozenset({"done"})), None, False),
    ("a row someone holds the lease of", row("remediation", "r", "done", age_days=31, lease_until=NOW + 60),
     Rule("remediation", 30 * DAY_S, frozenset({"done"})), None, False),
    ("a retention of 0 keeps it for ever", row("remediation", "r", "done", age_days=4000),
     Rule("remediation", 0, frozenset({"done"})), None, False),
    ("a marker whose remediation is active", row("dedupe", "op-x", "requested", age_days=9, remediation="x"),
     Rule("dedupe", 7 * DAY_S, owner=OWNED), "repairing", False),
    ("a marker whose remediation ended", row("dedupe", "op-x", "requested", age_days=9, remediation="x"),
     Rule("dedupe", 7 * DAY_S, owner=OWNED), "done", True),
    ("a marker whose remediation is gone", row("dedupe", "op-x", "requested", age_days=9, remediation="x"),
     Rule("dedupe", 7 * DAY_S, owner=OWNED), None, True),
    ("another kind's rule does not apply", row("migration", "m", "done", age_days=99),
     Rule("remediation", 30 * DAY_S, frozenset({"done"})), None, False),
]


@pytest.mark.parametrize(("record", "rule", "owner_state", "expected"), [c[1:] for c in EXPIRED],
                         ids=[c[0] for c in EXPIRED])
def test_expired(record: Record, rule: Rule, owner_state: str | None, expected: bool) -> None:
    assert expired(record, rule, now=NOW, owner_state=owner_state) is expected


def test_a_row_written_recently_is_young_whatever_its_creation() -> None:
    old_but_touched = Record(kind="dcgm-node", id="n", state="known", created_at=NOW - 90 * DAY_S,
                             updated_at=NOW - 2 * DAY_S)
    assert not expired(old_but_touched, Rule("dcgm-node", 30 * DAY_S), now=NOW)
    assert retention.matches(old_but_touched, older_than=NOW - DAY_S)
    assert not retention.matches(old_but_touched, older_than=NOW - 30 * DAY_S)


# --------------------------------------------------------------------------- the sweep


def fill(ledger: InMemoryLedger) -> dict[str, bool]:
    """One row of each case; the value says whether the standard rules delete it."""
    rows = [
        (row("remediation", "rem-done-old", "done", age_days=31), True),
        (row("remediation", "rem-gave-up-old", "gave_up", age_days=45), True),
        (row("remediation", "rem-done-recent", "done", age_days=3), False),
        (row("remediation", "rem-active-old", "draining", age_days=60), False),
        (row("remediation-node", "node-ended", "known", age_days=31, last_id="rem-done-old"), True),
        (row("remediation-node", "node-active", "known", age_days=60, last_id="rem-active-old"), False),
        (row("pool-request", "req-ok-old", "succeeded", age_days=31), True),
        (row("pool-request", "req-creating-old", "creating", age_days=31), False),
        (row("pool-request", "msg-rejected-old", "rejected", age_days=8), True),
        (row("pool-request", "msg-rejected-recent", "rejected", age_days=6), False),
        (row("migration", "mig-done-old", "done", age_days=31), True),
        (row("migration", "mig-blocked-old", "blocked", age_days=300), False),
        (row("command", "cmd-applied-old", "applied", age_days=31), True),
        (row("command", "cmd-requested-old", "requested", age_days=31), False),
        (row("dedupe", "refused-f-budget-fleet", "seen", age_days=8), True),
        (row("dedupe", "refused-f-recent", "seen", age_days=2), False),
        (row("dedupe", "op-rem-active-old-0-restart-1", "requested", age_days=30, remediation="rem-active-old"), False),
        (row("dedupe", "op-rem-done-old-0-restart-1", "requested", age_days=30, remediation="rem-done-old"), True),
        (row("dcgm-report", "rep-old", "reported", age_days=8), True),
        (row("dcgm-node", "dcgm-old", "known", age_days=31), True),
        (row("dcgm-node", "dcgm-recent", "known", age_days=1), False),
        (row("gpu-capacity-node", "cap-old", "short", age_days=31), True),
        (row("decision", "skip-f-starting", "skipped", age_days=3), True),
        (row("decision", "skip-g-starting", "skipped", age_days=1), False),
        (row("budget", "fleet", "open", age_days=400), False),
        (row("breaker", "fleet", "closed", age_days=400), False),
    ]
    for r, _ in rows:
        ledger.create(r)
    return {f"{r.kind}/{r.id}": gone for r, gone in rows}


def remaining(ledger: InMemoryLedger, kinds: Sequence[str]) -> set[str]:
    return {f"{r.kind}/{r.id}" for k in kinds for r in ledger.list(k)}


@pytest.mark.parametrize("ledger_type", [ScanningLedger, ListOnlyLedger], ids=["scan", "list-only ledger"])
def test_retention_removes_old_rows_of_each_kind_and_keeps_active_and_recent_ones(ledger_type: type) -> None:
    ledger = ledger_type()
    expected = fill(ledger)
    kinds = sorted({k.split("/")[0] for k in expected})
    report = retention.sweep(ctx_of(ledger), policy=POLICY)
    assert remaining(ledger, kinds) == {k for k, gone in expected.items() if not gone}
    assert sum(report.deleted.values()) == sum(expected.values()) and not report.exhausted and not report.errors
    again = retention.sweep(ctx_of(ledger), policy=POLICY)
    assert again.deleted == {}


def test_the_store_is_asked_for_old_rows_of_the_expiring_states_only() -> None:
    ledger = ScanningLedger()
    retention.sweep(ctx_of(ledger), policy=POLICY)
    by_kind = {(s["kind"], tuple(s["states"] or ())): s for s in ledger.scans}
    remediation = by_kind[("remediation", tuple(sorted(retention.REMEDIATION_ENDED)))]
    assert remediation["older_than"] == NOW - 30 * DAY_S and remediation["due_by"] is None
    assert by_kind[("pool-request", ("rejected",))]["older_than"] == NOW - 7 * DAY_S
    assert all(s["limit"] <= retention.SCAN_PAGE for s in ledger.scans)


def test_one_run_deletes_at_most_its_bound_and_shares_it_between_kinds() -> None:
    ledger = ScanningLedger()
    for i in range(60):
        ledger.create(row("pool-request", f"msg-{i:03}", "rejected", age_days=8))
        ledger.create(row("dedupe", f"refused-{i:03}", "seen", age_days=8))
    policy = RetentionPolicy(max_deletes=30)
    report = retention.sweep(ctx_of(ledger), policy=policy)
    assert sum(report.deleted.values()) == 30 and report.exhausted
    fair = 30 // len(retention.standard_rules(policy))  # each rule's equal part of the run
    assert report.deleted["dedupe"] >= fair and report.deleted["pool-request"] >= fair, report.deleted
    for _ in range(3):
        retention.sweep(ctx_of(ledger), policy=policy)
    assert ledger.list("pool-request") == [] and ledger.list("dedupe") == []


def test_a_row_written_between_the_read_and_the_delete_is_kept() -> None:
    class Racing(ScanningLedger):
        def scan(self, kind: str, **kwargs: Any) -> list[Record]:
            rows = super().scan(kind, **kwargs)
            for r in rows:  # someone writes each row right after we read it
                self.save(r.moved(r.state, at=NOW))
            return rows

    ledger = Racing()
    ledger.create(row("remediation", "r1", "done", age_days=40))
    report = retention.sweep(ctx_of(ledger), policy=POLICY)
    assert report.changed == 1 and report.deleted == {} and ledger.get("remediation", "r1") is not None


def test_a_retention_of_zero_days_keeps_that_class_for_ever() -> None:
    ledger = ScanningLedger()
    ledger.create(row("remediation", "r1", "done", age_days=4000))
    ledger.create(row("dedupe", "refused-x", "seen", age_days=4000))
    retention.sweep(ctx_of(ledger), policy=RetentionPolicy(terminal_days=0))
    assert ledger.get("remediation", "r1") is not None and ledger.get("dedupe", "refused-x") is None


def test_the_settings() -> None:
    assert RetentionPolicy.from_env({}) == RetentionPolicy(terminal_days=30, rejection_days=7, dedupe_days=7,
                                                           signal_days=30, max_deletes=200)
    custom = RetentionPolicy.from_env({"LEDGER_RETENTION_DAYS": "90", "LEDGER_REJECTION_RETENTION_DAYS": "1",
                                       "LEDGER_DEDUPE_RETENTION_DAYS": "0", "LEDGER_SIGNAL_RETENTION_DAYS": "14",
                                       "LEDGER_RETENTION_MAX_DELETES": "1000"})
    assert custom == RetentionPolicy(terminal_days=90, rejection_days=1, dedupe_days=0, signal_days=14,
                                     max_deletes=1000)


# --------------------------------------------------------------------------- the reconciler's reads stay bounded


def stepping_kind(stepped: list[str]) -> types.ModuleType:
    """A kind whose one step ends its record (``a`` -> ``done``)."""

    def advance(record: Record, ctx: Context) -> Record:
        stepped.append(record.id)
        return record.moved("done", at=ctx.clock.now())

    module = types.ModuleType("stepping_kind")
    module.ACTIVE_STATES = ("a",)  # type: ignore[attr-defined]
    module.advance = advance  # type: ignore[attr-defined]
    return module


def seed(ledger: InMemoryLedger, kind: str, count: int, *, state: str = "a", next_at: float = NOW,
         lease_until: float = 0.0, tag: str = "due") -> None:
    for i in range(count):
        ledger.create(Record(kind=kind, id=f"{kind}-{tag}-{i:03}", state=state, created_at=NOW - 60,
                             next_at=next_at, lease_until=lease_until))


def test_the_reconciler_asks_the_store_only_for_due_unclaimed_rows_of_active_states() -> None:
    ledger, stepped = ScanningLedger(), []
    seed(ledger, "k", 2)
    seed(ledger, "k", 2, next_at=NOW + 600, tag="later")  # not due yet
    seed(ledger, "k", 2, lease_until=NOW + 60, tag="claimed")  # another instance is stepping them
    seed(ledger, "k", 50, state="done", tag="done")  # finished rows: never read
    reconcile_once(ctx_of(ledger), modules={"k": stepping_kind(stepped)})
    assert ledger.scans == [{"kind": "k", "states": ["a"], "due_by": NOW, "older_than": None,
                             "limit": reconciler.MAX_DUE_PER_KIND}]
    assert sorted(stepped) == ["k-due-000", "k-due-001"]


@pytest.mark.parametrize("ledger_type", [ScanningLedger, ListOnlyLedger], ids=["scan", "list-only ledger"])
def test_a_flood_of_due_rows_is_worked_through_a_bounded_batch_at_a_time_without_holding_back_another_kind(
        ledger_type: type, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconciler, "MAX_DUE_PER_KIND", 3)
    ledger, stepped = ledger_type(), []
    seed(ledger, "flood", 7)
    seed(ledger, "k", 1)
    kinds = {"flood": stepping_kind(stepped), "k": stepping_kind(stepped)}
    reconcile_once(ctx_of(ledger), modules=kinds)
    assert len(stepped) == 4 and "k-due-000" in stepped
    reconcile_once(ctx_of(ledger), modules=kinds)
    reconcile_once(ctx_of(ledger), modules=kinds)
    assert len(stepped) == 8 and len(set(stepped)) == 8

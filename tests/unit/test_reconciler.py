"""The reconciler claims records with ETags, advances them step by step and survives races and errors."""

from __future__ import annotations

import types
from typing import Any

import msgspec
import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import Invalid, Throttled
from shared.kernel.ports import Record
from shared.kernel.reconciler import HOLD_BUDGET_S, HOLD_S, LEASE_S, claim, reconcile_once
from tests.fakes.ledger import InMemoryLedger


def make_ctx(ledger: InMemoryLedger, clock: ManualClock, instance: str = "host-a") -> Context:
    return Context(settings=None, clock=clock, ledger=ledger, access=None, events=None,  # type: ignore[arg-type]
                   telemetry=None, instance=instance)


def counting_kind(steps: list[str], *, wait_in: str | None = None, fail: Exception | None = None) -> types.ModuleType:
    """A kind that walks a -> b -> c -> done, optionally waiting in one state or failing once."""
    order = {"a": "b", "b": "c", "c": "done"}
    failures = [fail] if fail else []

    def advance(record: Record, ctx: Context) -> Record:
        if failures:
            raise failures.pop()
        steps.append(record.state)
        now = ctx.clock.now()
        if record.state == wait_in:
            return record.moved(record.state, at=now, next_at=now + 60)
        return record.moved(order[record.state], at=now)

    module = types.ModuleType("counting_kind")
    module.ACTIVE_STATES = ("a", "b", "c")  # type: ignore[attr-defined]
    module.advance = advance  # type: ignore[attr-defined]
    return module


def seed(ledger: InMemoryLedger, clock: ManualClock, id_: str = "r1", state: str = "a") -> Record:
    return ledger.create(Record(kind="k", id=id_, state=state, created_at=clock.now(), next_at=clock.now()))


def test_a_due_record_is_advanced_through_every_immediately_actionable_step_and_released() -> None:
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    seed(ledger, clock)
    report = reconcile_once(make_ctx(ledger, clock), modules={"k": counting_kind(steps)})
    record = ledger.get("k", "r1")
    assert steps == ["a", "b", "c"]
    assert record is not None and record.state == "done" and record.lease_until == 0.0
    assert report.finished == ["k/r1 -> done"]


def test_a_record_that_waits_is_left_until_its_next_look() -> None:
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    seed(ledger, clock)
    kind = counting_kind(steps, wait_in="b")
    reconcile_once(make_ctx(ledger, clock), modules={"k": kind})
    reconcile_once(make_ctx(ledger, clock), modules={"k": kind})
    assert steps == ["a", "b"]
    clock.advance(61)
    reconcile_once(make_ctx(ledger, clock), modules={"k": kind})
    assert steps == ["a", "b", "b"]


def test_a_record_claimed_by_another_live_instance_is_not_touched() -> None:
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    record = seed(ledger, clock)
    assert claim(record, make_ctx(ledger, clock, "host-b")) is not None
    reconcile_once(make_ctx(ledger, clock, "host-a"), modules={"k": counting_kind(steps)})
    assert steps == []
    clock.advance(LEASE_S + 1)  # host-b crashed: its lease expires and host-a resumes
    reconcile_once(make_ctx(ledger, clock, "host-a"), modules={"k": counting_kind(steps)})
    assert ledger.get("k", "r1").state == "done"  # type: ignore[union-attr]


def test_two_instances_racing_on_one_version_have_exactly_one_winner() -> None:
    ledger, clock = InMemoryLedger(), ManualClock()
    record = seed(ledger, clock)
    winners = [claim(record, make_ctx(ledger, clock, name)) for name in ("host-a", "host-b")]
    assert sum(w is not None for w in winners) == 1


@pytest.mark.parametrize(
    ("error", "expected_delay"),
    [(Throttled("slow down", retry_after=42.0), 42.0), (Invalid("bad request"), 5.0)],
    ids=["a throttled step waits for the server's Retry-After", "an unexpected error backs off and is reported"],
)
def test_a_failing_step_is_retried_later_without_losing_the_record(error: Exception, expected_delay: float) -> None:
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    seed(ledger, clock)
    reconcile_once(make_ctx(ledger, clock), modules={"k": counting_kind(steps, fail=error)})
    record = ledger.get("k", "r1")
    assert record is not None and record.state == "a"
    assert record.next_at == pytest.approx(clock.now() + expected_delay)
    assert "_last_error" in record.data and record.lease_until == 0.0


def test_a_success_after_errors_clears_the_error_streak() -> None:
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    seed(ledger, clock)
    kind = counting_kind(steps, fail=Throttled("x", retry_after=1))
    reconcile_once(make_ctx(ledger, clock), modules={"k": kind})
    clock.advance(6)  # the retry waits at least the Retry-After, and never less than the first backoff (5 s)
    reconcile_once(make_ctx(ledger, clock), modules={"k": kind})
    record = ledger.get("k", "r1")
    assert record is not None and record.state == "done" and "_error_streak" not in record.data


def test_a_record_changed_by_someone_else_mid_step_is_not_overwritten() -> None:
    ledger, clock = InMemoryLedger(), ManualClock()
    seed(ledger, clock)

    def advance(record: Record, ctx: Context) -> Record:
        current = ledger.get("k", "r1")
        assert current is not None
        ledger.save(msgspec.structs.replace(current, state="c"))  # a racing writer wins first
        return record.moved("b", at=ctx.clock.now())

    module: Any = types.ModuleType("racing")
    module.ACTIVE_STATES, module.advance = ("a", "b", "c"), advance
    report = reconcile_once(make_ctx(ledger, clock), modules={"k": module})
    assert ledger.get("k", "r1").state == "c"  # type: ignore[union-attr]
    assert report.skipped_conflicts == 1


def test_a_live_claim_excludes_a_second_invocation_of_the_same_instance() -> None:
    # The timer and the nudge trigger run side by side in one instance: they must not step one record twice.
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    record = seed(ledger, clock)
    assert claim(record, make_ctx(ledger, clock, "host-a")) is not None
    reconcile_once(make_ctx(ledger, clock, "host-a"), modules={"k": counting_kind(steps)})
    assert steps == []


def polling_kind(steps: list[float], *, polls: int, every: float) -> types.ModuleType:
    """A kind that waits ``every`` seconds ``polls`` times in state a, then finishes."""

    def advance(record: Record, ctx: Context) -> Record:
        now = ctx.clock.now()
        steps.append(now)
        stored = ledger_view[0].get("k", record.id)
        assert stored is not None and stored.lease_until > now  # held between polls: nobody else may step it
        if len(steps) > polls:
            return record.moved("done", at=now)
        return msgspec.structs.replace(record, next_at=now + every, updated_at=now)

    ledger_view: list[InMemoryLedger] = []
    module: Any = types.ModuleType("polling_kind")
    module.ACTIVE_STATES, module.advance, module.ledger_view = ("a",), advance, ledger_view
    return module


def test_a_record_due_again_within_seconds_stays_claimed_and_is_stepped_again_in_the_same_invocation() -> None:
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    seed(ledger, clock)
    kind = polling_kind(steps, polls=3, every=2.0)
    kind.ledger_view.append(ledger)
    start = clock.now()
    report = reconcile_once(make_ctx(ledger, clock), modules={"k": kind})
    assert steps == [start, start + 2.0, start + 4.0, start + 6.0]  # each poll once due, never earlier
    record = ledger.get("k", "r1")
    assert record is not None and record.state == "done" and record.lease_until == 0.0
    assert report.held_s == pytest.approx(6.0) and report.advanced == {"k": 4}


@pytest.mark.parametrize(("every", "polls", "expected_steps"), [
    (HOLD_S + 1, 3, 1),
    (4.0, 100, 1 + int(HOLD_BUDGET_S // 4.0)),
], ids=["a wait longer than the hold is left to a later invocation",
        "the waits of one invocation stop at the budget, and the claim is released"])
def test_holding_a_record_is_bounded(every: float, polls: int, expected_steps: int) -> None:
    ledger, clock, steps = InMemoryLedger(), ManualClock(), []
    seed(ledger, clock)
    kind = polling_kind(steps, polls=polls, every=every)
    kind.ledger_view.append(ledger)
    reconcile_once(make_ctx(ledger, clock), modules={"k": kind})
    record = ledger.get("k", "r1")
    assert len(steps) == expected_steps
    assert record is not None and record.state == "a" and record.lease_until == 0.0

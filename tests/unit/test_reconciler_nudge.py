"""The reconciler wakes itself when a released record is due (a delayed nudge), coalesced, bounded, never fatal."""

from __future__ import annotations

import types

import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import Transient
from shared.kernel.nudge import MAX_NUDGES_PER_INVOCATION, MAX_VISIBILITY_S, wake_time, wall_delay_s
from shared.kernel.ports import Record
from shared.kernel.reconciler import HOLD_BUDGET_S, MIN_NUDGE_DELAY_S, reconcile_once
from tests.fakes.ledger import InMemoryLedger
from tests.fakes.nudge import RecordingNudger


def make_ctx(ledger: InMemoryLedger, clock: ManualClock, nudger: RecordingNudger | None) -> Context:
    return Context(settings=None, clock=clock, ledger=ledger, access=None, events=None,  # type: ignore[arg-type]
                   telemetry=None, instance="host-a", nudge=nudger)


def waiting_kind(waits: dict[str, float], *, finish: set[str] | None = None) -> types.ModuleType:
    """Each record steps ``a -> b`` and then waits ``waits[id]`` seconds in ``b`` (ids in ``finish`` end instead)."""
    finish = finish or set()

    def advance(record: Record, ctx: Context) -> Record:
        now = ctx.clock.now()
        if record.state == "a":
            return record.moved("b", at=now, next_at=now + waits[record.id])
        if record.id in finish:
            return record.moved("done", at=now)
        return record.moved("b", at=now, next_at=now + waits[record.id])

    module = types.ModuleType("waiting_kind")
    module.ACTIVE_STATES = ("a", "b")  # type: ignore[attr-defined]
    module.advance = advance  # type: ignore[attr-defined]
    return module


def seed(ledger: InMemoryLedger, clock: ManualClock, *ids: str) -> None:
    for id_ in ids:
        ledger.create(Record(kind="k", id=id_, state="a", created_at=clock.now(), next_at=clock.now()))


def test_a_record_released_to_wait_schedules_one_delayed_nudge_at_its_next_look() -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    seed(ledger, clock, "r1")
    start = clock.now()
    reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": waiting_kind({"r1": 45.0})})
    record = ledger.get("k", "r1")
    assert record is not None and record.state == "b" and record.lease_until == 0.0
    assert nudger.sent == [(start + 45.0, "k:r1")]
    assert record.next_at == start + 45.0


def test_the_woken_reconciler_advances_the_record_and_rearms_for_its_next_look() -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    seed(ledger, clock, "r1")
    kind = waiting_kind({"r1": 45.0})
    reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": kind})
    (when, _), = nudger.sent
    clock.advance(when - clock.now())  # the message becomes visible: the nudge trigger runs
    report = reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": kind})
    assert report.advanced == {"k": 1}
    assert [w for w, _ in nudger.sent] == [when, when + 45.0]


def test_a_wake_up_that_finds_nothing_due_sends_no_nudge() -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    seed(ledger, clock, "r1")
    kind = waiting_kind({"r1": 45.0})
    reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": kind})
    clock.advance(10)  # a duplicate or early wake-up (the safety-net timer, another nudge)
    report = reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": kind})
    assert report.advanced == {} and len(nudger.sent) == 1  # no chain of duplicates grows from it


def test_a_finished_record_is_not_nudged() -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    seed(ledger, clock, "r1")
    kind = waiting_kind({"r1": 0.0}, finish={"r1"})  # a -> b (due at once) -> done
    reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": kind})
    assert ledger.get("k", "r1").state == "done"  # type: ignore[union-attr]
    assert nudger.sent == []


@pytest.mark.parametrize(("waits", "expected"), [
    pytest.param({"r1": 60.0, "r2": 60.0}, [60.0], id="same-time-one-message"),
    pytest.param({"r1": 61.0, "r2": 63.0}, [70.0], id="same-grid-step-one-message"),
    pytest.param({"r1": 8.5, "r2": 8.0}, [9.0], id="later-pending-within-window-serves"),
    pytest.param({"r1": 8.0, "r2": 8.5}, [8.0, 9.0], id="earlier-pending-does-not-serve-a-later-record"),
    pytest.param({"r1": 60.0, "r2": 90.0}, [60.0, 90.0], id="distinct-times-two-messages"),
])
def test_nudges_of_one_invocation_are_coalesced_only_when_the_pending_one_wakes_every_record(
        waits: dict[str, float], expected: list[float]) -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    seed(ledger, clock, *waits)
    start = clock.now()
    report = reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": waiting_kind(waits)})
    assert [w - start for w, _ in nudger.sent] == expected
    assert report.nudges.coalesced == len(waits) - len(expected)


def test_one_invocation_sends_a_bounded_number_of_nudges() -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    waits = {f"r{i:02d}": 30.0 + 60.0 * i for i in range(MAX_NUDGES_PER_INVOCATION + 5)}  # distinct grid points
    seed(ledger, clock, *waits)
    report = reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": waiting_kind(waits)})
    assert len(nudger.sent) == MAX_NUDGES_PER_INVOCATION
    assert report.nudges.dropped == 5
    assert all(r.state == "b" for r in ledger.list("k"))  # every record was still stepped


def test_a_failed_nudge_does_not_fail_the_step() -> None:
    ledger, clock = InMemoryLedger(), ManualClock()
    nudger = RecordingNudger(fail=Transient("queue service unavailable"))
    seed(ledger, clock, "r1", "r2")
    report = reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": waiting_kind({"r1": 45.0, "r2": 90.0})})
    assert {r.id: (r.state, r.lease_until) for r in ledger.list("k")} == {"r1": ("b", 0.0), "r2": ("b", 0.0)}
    assert report.nudges.failed == 2 and report.errors == [] and report.advanced == {"k": 2}


def test_a_released_record_due_at_once_is_nudged_no_sooner_than_the_floor() -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    seed(ledger, clock, "r1")
    start = clock.now()
    # b -> b due at once, no progress: released (not held), and must not become a busy loop of wake-ups
    reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": waiting_kind({"r1": 0.0})})
    assert [w - start for w, _ in nudger.sent] == [MIN_NUDGE_DELAY_S]


def test_a_held_record_is_nudged_only_when_the_hold_budget_releases_it() -> None:
    ledger, clock, nudger = InMemoryLedger(), ManualClock(), RecordingNudger()
    seed(ledger, clock, "r1")
    report = reconcile_once(make_ctx(ledger, clock, nudger), modules={"k": waiting_kind({"r1": 4.0})})
    record = ledger.get("k", "r1")
    assert record is not None and record.lease_until == 0.0
    assert report.held_s <= HOLD_BUDGET_S and report.held_s > 0
    assert len(nudger.sent) == 1
    (when, _), = nudger.sent
    assert when == wake_time(max(record.next_at, clock.now() + MIN_NUDGE_DELAY_S), now=clock.now())


def test_without_a_nudger_the_reconciler_works_as_before() -> None:
    ledger, clock = InMemoryLedger(), ManualClock()
    seed(ledger, clock, "r1")
    report = reconcile_once(make_ctx(ledger, clock, None), modules={"k": waiting_kind({"r1": 45.0})})
    assert report.advanced == {"k": 1} and report.nudges.pending == []


@pytest.mark.parametrize(("when", "now", "speed", "expected"), [
    pytest.param(100.0, 55.0, 1.0, 45, id="whole-seconds"),
    pytest.param(100.0, 54.5, 1.0, 46, id="rounded-up-never-early"),
    pytest.param(100.0, 120.0, 1.0, 0, id="already-due"),
    pytest.param(100.0, 40.0, 10.0, 6, id="scaled-fleet-clock"),
    pytest.param(100.0 + 30 * 86400, 100.0, 1.0, MAX_VISIBILITY_S, id="capped-below-seven-days"),
])
def test_the_visibility_timeout_is_the_wait_in_wall_clock_seconds(when: float, now: float, speed: float,
                                                                  expected: int) -> None:
    assert wall_delay_s(when, now=now, speed=speed) == expected


START = 1_764_684_000.0  # a whole minute


@pytest.mark.parametrize(("wait", "expected_wait"), [
    pytest.param(6.5, 7.0, id="short-wait-whole-seconds"),
    pytest.param(15.2, 16.0, id="pool-poll-two-second-grid"),
    pytest.param(45.0, 45.0, id="already-on-the-grid"),
    pytest.param(47.0, 50.0, id="five-second-grid"),
    pytest.param(301.0, 360.0, id="long-backoff-minute-grid"),
])
def test_wake_up_times_fall_on_a_grid_no_coarser_than_a_fifth_of_the_wait(wait: float, expected_wait: float) -> None:
    woken = wake_time(START + wait, now=START)
    assert woken - START == expected_wait
    assert wait <= woken - START <= wait * 1.2 + 1.0


@pytest.mark.parametrize(("value", "wired"), [
    pytest.param(None, True, id="on-by-default"),
    pytest.param("false", False, id="RECONCILE_DELAYED_NUDGES-false-timer-only"),
])
def test_the_process_context_sends_delayed_nudges_unless_the_setting_turns_them_off(value: str | None, wired: bool) -> None:
    from shared import wiring
    from shared.adapters.nudge_queue import QueueNudger
    from shared.settings import load

    env = {"FLEET_SUBSCRIPTIONS": "8f2d4c1e-5a3b-4c7d-9e0f-000000000001", "AzureWebJobsStorage": "UseDevelopmentStorage=true",
           "EVENTGRID_TOPIC_ENDPOINT": "https://127.0.0.1:8443/eventgrid/api/events"}
    if value is not None:
        env["RECONCILE_DELAYED_NUDGES"] = value
    settings = load(env)
    assert settings.reconcile_schedule == "0 */5 * * * *"  # the timer is a safety net
    ctx = wiring.build_context(settings, ledger=InMemoryLedger(), access=object(), events=object(), telemetry=object(),
                               clock=ManualClock())
    assert isinstance(ctx.nudge, QueueNudger) is wired and (ctx.nudge is None) is not wired

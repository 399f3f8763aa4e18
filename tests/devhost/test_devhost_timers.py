"""Timer triggers fire on their 6-field NCRONTAB schedules, on the app's clock, and on demand."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import ModuleType
from typing import Any

import pytest

from devhost.host import Host
from devhost.timers import ScheduleError, next_after, validate
from shared.kernel import clock as clocks
from shared.kernel.clock import ManualClock, ScaledClock
from tests.waiting import wait_until

START = 1_764_684_005.0  # 2025-12-02T14:00:05Z


def _ticks(app: ModuleType) -> list[dict[str, Any]]:
    return [c for c in list(app.CALLS) if c["function"] == "tick"]


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    wait_until(predicate, timeout=timeout, what="the timer invocations")


class WatchedClock(ManualClock):
    """A ManualClock that counts how often the host's timer scheduler reads it.

    The scheduler reads the clock at the top of each pass (and once more when it fires), so three
    reads after a mark prove that a whole pass begun after the mark has ended: the proof a test needs
    before it asserts that a timer did *not* fire.
    """

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self._reads = 0
        self._reads_lock = threading.Lock()

    def now(self) -> float:
        if threading.current_thread().name == "devhost-timers":
            with self._reads_lock:
                self._reads += 1
        return super().now()

    def scheduler_reads(self) -> int:
        with self._reads_lock:
            return self._reads


def _after_a_whole_scheduler_pass(clock: WatchedClock, host: Host) -> None:
    """Wait until nothing runs, then until the scheduler ended a pass begun after that; then nothing may run.

    A pass that fired has counted its invocation in ``running`` before it ended, and the invocation
    records its call before ``running`` drops: reading ``running`` first, then the calls, misses nothing.
    """
    wait_until(lambda: host.stats()["running"] == 0, timeout=10, what="running invocations to end")
    mark = clock.scheduler_reads()
    wait_until(lambda: clock.scheduler_reads() >= mark + 3, timeout=10, what="a whole pass of the timer scheduler")
    assert host.stats()["running"] == 0, "the scheduler fired a timer during the pass"


@pytest.mark.parametrize(("schedule", "after", "expected"), [
    pytest.param("*/30 * * * * *", START, START + 25, id="every-30-seconds"),
    pytest.param("0 * * * * *", START, START + 55, id="every-minute-on-the-minute"),
    pytest.param("0 */15 * * * *", START, START + 895, id="every-quarter-hour"),
    pytest.param("0 0 3 * * 1", START, 1_765_162_800.0, id="mondays-at-three"),
    pytest.param("*/30 * * * * *", START + 25, START + 55, id="strictly-after-an-occurrence"),
])
def test_ncrontab_schedules_have_the_seconds_field_first(schedule: str, after: float, expected: float) -> None:
    assert next_after(schedule, after) == expected


@pytest.mark.parametrize("schedule", [
    pytest.param("* * * * *", id="five-field-unix-cron"),
    pytest.param("61 * * * * *", id="second-out-of-range"),
    pytest.param("every minute", id="prose"),
])
def test_a_schedule_that_is_not_ncrontab_is_refused_naming_the_function(schedule: str) -> None:
    with pytest.raises(ScheduleError, match="function tick"):
        validate(schedule, function="tick")


def test_a_timer_fires_on_schedule_as_a_manual_clock_moves(make_host: Callable[..., Host], fake_app: ModuleType) -> None:
    clock = WatchedClock(START)
    host = make_host(clock=clock, settings={"TICK_SCHEDULE": "*/10 * * * * *"})
    _after_a_whole_scheduler_pass(clock, host)  # it looked at 14:00:05 ...
    assert _ticks(fake_app) == []  # ... and did not fire: the next occurrence is 14:00:10
    clock.advance(5)
    _wait_for(lambda: len(_ticks(fake_app)) == 1)
    clock.advance(10)
    _wait_for(lambda: len(_ticks(fake_app)) == 2)
    ticks = _ticks(fake_app)
    assert [t["past_due"] for t in ticks] == [False, False]
    assert ticks[0]["schedule_status"]["Next"] is not None


def test_missed_occurrences_collapse_into_one_past_due_run(make_host: Callable[..., Host], fake_app: ModuleType) -> None:
    clock = WatchedClock(START)
    host = make_host(clock=clock, settings={"TICK_SCHEDULE": "*/10 * * * * *"})
    clock.advance(40)  # 14:00:10, :20, :30 and :40 all passed at once
    _wait_for(lambda: len(_ticks(fake_app)) == 1)
    _after_a_whole_scheduler_pass(clock, host)  # the scheduler looked again at 14:00:45 and fired nothing more
    assert [t["past_due"] for t in _ticks(fake_app)] == [True]


def test_a_timer_follows_the_simulators_scaled_clock_from_endpoints(make_host: Callable[..., Host],
                                                                    fake_app: ModuleType) -> None:
    now = time.time()
    endpoints = {"clock": {"epoch_real": now, "epoch_sim": 1_764_684_000.0, "speed": 20.0}}
    host = make_host(endpoints=endpoints, settings={"TICK_SCHEDULE": "*/10 * * * * *"})
    assert isinstance(host.clock, ScaledClock) and clocks.current() is host.clock
    _wait_for(lambda: len(_ticks(fake_app)) >= 3, timeout=10)  # every 10 sim-seconds = 0.5 s of real time
    for tick in _ticks(fake_app)[:3]:
        following = datetime.fromisoformat(tick["schedule_status"]["Next"]).timestamp()
        assert following % 10 == 0  # occurrences are on 10-second boundaries of sim time
        assert following - 10 <= tick["at"] < following + 10  # fired at its occurrence, never before it
    nexts = [tick["schedule_status"]["Next"] for tick in _ticks(fake_app)[:3]]
    assert len(set(nexts)) == 3  # one run per occurrence
    host.stop()
    assert clocks.current() is not host.clock  # the previous clock is back


def test_run_on_startup_fires_once_when_the_host_starts(make_host: Callable[..., Host], fake_app: ModuleType) -> None:
    clock = WatchedClock(START)
    host = make_host(clock=clock)
    _wait_for(lambda: any(c["function"] == "startup" for c in fake_app.CALLS))
    _after_a_whole_scheduler_pass(clock, host)  # the schedule was looked at since, and fired nothing more
    assert [c["past_due"] for c in fake_app.CALLS if c["function"] == "startup"] == [False]


def test_a_timer_function_runs_on_demand(make_host: Callable[..., Host], fake_app: ModuleType) -> None:
    host = make_host(clock=ManualClock(START))
    host.trigger("tick").result(timeout=5)
    assert [t["past_due"] for t in _ticks(fake_app)] == [False]
    assert host.stats()["functions"]["tick"]["succeeded"] == 1

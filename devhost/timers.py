"""Timer triggers on their 6-field NCRONTAB schedules, evaluated on the app's clock.

The Functions host's timer schedules have a seconds field first (``{second} {minute} {hour} {day}
{month} {day-of-week}``); croniter reads that with ``second_at_beginning=True``. Time is
``shared.kernel.clock.current()`` (a ScaledClock from the simulator's endpoints.json, or a ManualClock in
tests), so a ``0 * * * * *`` sweep runs once per simulated minute however fast the fleet runs.

As in the host: a timer function never overlaps itself; ``runOnStartup`` fires once at start;
``IsPastDue`` is true when the invocation comes later than a whole missed occurrence (the previous
run overran, or the host fell behind), and missed occurrences are collapsed into that one run.
With ``useMonitor`` the TimerRequest carries ScheduleStatus (Last, Next, LastUpdated). Unlike
Azure, each local host fires its own timers (there is no singleton lock across hosts); the app's
ledger is what keeps two hosts from doing the same work twice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from croniter import croniter

from devhost import invoke
from devhost.indexing import FunctionSpec

if TYPE_CHECKING:
    from devhost.host import Host

log = logging.getLogger("devhost.timers")

MAX_WAIT_S = 0.1  # re-read the clock at least this often (a ManualClock moves without telling us)


class ScheduleError(ValueError):
    """A timer schedule that is not a 6-field NCRONTAB expression."""


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def validate(schedule: str, *, function: str) -> str:
    fields = schedule.split()
    if len(fields) != 6:
        raise ScheduleError(f"function {function}: schedule {schedule!r} must have 6 fields "
                            "(second minute hour day month day-of-week)")
    if not croniter.is_valid(schedule, second_at_beginning=True):
        raise ScheduleError(f"function {function}: schedule {schedule!r} is not a valid NCRONTAB expression")
    return schedule


def next_after(schedule: str, epoch: float) -> float:
    """The first occurrence strictly after ``epoch``."""
    return float(croniter(schedule, _dt(epoch), second_at_beginning=True).get_next(float))


@dataclass
class TimerState:
    spec: FunctionSpec
    schedule: str
    use_monitor: bool
    next_due: float
    last: float | None = None
    running: bool = False


class TimerScheduler:
    """One thread for all timer functions of a host."""

    def __init__(self, host: Host, specs: list[FunctionSpec]) -> None:
        self.host = host
        self.timers: dict[str, TimerState] = {}
        self._specs = specs
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        for spec in specs:
            validate(spec.trigger.properties.get("schedule", ""), function=spec.name)

    def start(self) -> None:
        now = self.host.clock.now()
        for spec in self._specs:
            schedule = str(spec.trigger.properties["schedule"])
            state = TimerState(spec=spec, schedule=schedule, use_monitor=spec.trigger.properties.get("useMonitor") is not False,
                               next_due=next_after(schedule, now))
            self.timers[spec.name] = state
            if spec.trigger.properties.get("runOnStartup"):
                self._fire(state, past_due=False, scheduled=now)
        self._thread = threading.Thread(target=self._run, name="devhost-timers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        clock = self.host.clock
        while not self.host.stopping:
            now = clock.now()
            wait = MAX_WAIT_S
            with self._lock:
                states = list(self.timers.values())
            for state in states:
                if state.running:
                    continue
                if now >= state.next_due:
                    scheduled = state.next_due
                    following = next_after(state.schedule, scheduled)
                    past_due = following <= now
                    state.next_due = next_after(state.schedule, now) if past_due else following
                    self._fire(state, past_due=past_due, scheduled=scheduled)
                speed = float(getattr(clock, "speed", 1.0) or 1.0)
                wait = min(wait, max(0.005, (state.next_due - now) / speed))
            self._wake.wait(wait)

    def _fire(self, state: TimerState, *, past_due: bool, scheduled: float) -> None:
        with self._lock:
            if state.running:
                return
            state.running = True
        now = self.host.clock.now()
        request = invoke.timer_request(past_due=past_due, last=_dt(state.last) if state.last else None,
                                       next_=_dt(state.next_due), last_updated=_dt(now), use_monitor=state.use_monitor)
        state.last = scheduled
        if past_due:
            log.info("%s: timer is past due (scheduled %s, now %s)", state.spec.name, _dt(scheduled), _dt(now))

        def done() -> None:
            with self._lock:
                state.running = False
            self._wake.set()

        try:
            self.host.submit(state.spec.name, lambda: self.host.run_invocation(state.spec, request), on_done=done,
                             swallow=True)
        except RuntimeError:
            done()

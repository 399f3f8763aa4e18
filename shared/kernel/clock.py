"""Injected time.

Every decision takes ``now`` from a :class:`Clock` so that tests and the simulator can run hours of
fleet life in seconds. The process-wide clock is :func:`current`; hosts and tests swap it with
:func:`use`. Product code never calls ``time.time()`` for decisions.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as the fleet sees them."""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of fleet time."""


class SystemClock:
    """Wall-clock time: what runs in Azure."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ScaledClock:
    """Fleet time that runs ``speed`` times faster than the wall clock from a common epoch.

    The simulator publishes its epoch and speed in ``endpoints.json`` so that the local host can run
    the app on the same time line as the simulated clusters.
    """

    def __init__(self, *, epoch_real: float, epoch_sim: float, speed: float) -> None:
        self.epoch_real = epoch_real
        self.epoch_sim = epoch_sim
        self.speed = speed

    def now(self) -> float:
        return self.epoch_sim + (time.time() - self.epoch_real) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it. For tables and unit tests."""

    def __init__(self, start: float = 1_764_684_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += max(0.0, seconds)


_current: Clock = SystemClock()


def current() -> Clock:
    """The process-wide clock."""
    return _current


def use(clock: Clock) -> Clock:
    """Install ``clock`` as the process-wide clock; returns the previous one."""
    global _current
    previous, _current = _current, clock
    return previous

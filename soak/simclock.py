"""The app's clock during an in-process soak run: the simulator's manual clock, seen from the app.

Running the app in this process against a simulator whose clock moves only on ``/_sim/advance``
makes a run independent of the machine's speed (an hour of fleet life costs what the app's work
costs, not an hour) and lets the driver jump over idle time. The app never waits for real: every
``sleep`` (retry back-off, a Retry-After) advances the simulator by the same amount, so the fleet
moves while the app waits, exactly as it would on a real clock.
"""

from __future__ import annotations

import threading
from typing import Any


class LinkedClock:
    """``shared.kernel.clock.Clock`` over a manual simulator clock: ``now`` is cached, ``sleep`` advances it."""

    def __init__(self, sim: Any) -> None:
        self._sim = sim
        self._lock = threading.Lock()
        self._now = float(sim.control("GET", "/clock")["now"])
        self.slept_s = 0.0

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the simulator (and this clock) forward; returns the new time."""
        if seconds <= 0:
            return self.now()
        answer = self._sim.control("POST", "/advance", {"seconds": float(seconds)})
        with self._lock:
            self._now = max(self._now, float(answer["now"]))
            return self._now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.slept_s += seconds
            self.advance(seconds)

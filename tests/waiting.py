"""The one way a test waits: for a condition, with a deadline that fails loudly.

Tests never sleep and then assert: a sleep long enough on a fast host is too short on a slow one,
and a test that sleeps and then asserts that *nothing* happened also passes when the system never
looked. A test waits here for a positive event instead (the N-th invocation completed, a record
reached a state, the scheduler marked a pod Unschedulable) and only then asserts. This module is the
only place under tests/ allowed to call ``time.sleep`` (tests/test_no_sleeps.py enforces it): the
pause between two looks at the condition.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_INTERVAL_S = 0.05


class WaitTimeout(AssertionError):
    """The condition was not reached before the deadline (an AssertionError, so pytest reports it as a failure)."""


def wait_until(check: Callable[[], T], *, timeout: float, what: str, interval: float = DEFAULT_INTERVAL_S,
               detail: Callable[[], object] | None = None) -> T:
    """Call ``check`` until it returns something truthy, and return that value.

    Raises :class:`WaitTimeout` naming ``what`` (and, when given, what ``detail()`` says about the
    state at that moment, e.g. a record's history or a host log's tail) once ``timeout`` wall
    seconds have passed. ``check`` is always called at least once, and once more after the deadline,
    so a slow last look is not lost.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            value = check()
            if value:
                return value
            extra = ""
            if detail is not None:
                extra = f"\n{detail()}"
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(interval)


def poll(check: Callable[[], T | None], *, timeout: float, interval: float = DEFAULT_INTERVAL_S) -> T | None:
    """Call ``check`` until it returns something truthy or ``timeout`` passes; return the last value.

    For callers that report a timeout themselves with a richer message (or return the last value
    seen so that the caller's assertion shows it); prefer :func:`wait_until` otherwise.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)

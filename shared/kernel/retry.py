"""One retry policy for every call to Azure and Kubernetes.

The SDK clients are built with their own retries switched off, so that this is the only place
that decides: only :class:`~shared.kernel.errors.Throttled` and :class:`~shared.kernel.errors.Transient` are
retried (everything else is an answer), the wait is the server's ``Retry-After`` when it gave one
and exponential backoff with full jitter otherwise, and the sleeping goes through the injected
clock so that tests never sleep for real and the simulator's scaled time is respected.

A hint longer than ``max_delay`` is honoured by *not* retrying: the error goes up to the caller,
which records ``next_at`` in the ledger and comes back later instead of holding an invocation.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from shared.kernel import clock as clocks
from shared.kernel.errors import RETRYABLE

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("steward.retry")

DEFAULT_ATTEMPTS = 5
DEFAULT_MAX_DELAY = 30.0
DEFAULT_BASE_DELAY = 0.5


def _hint(state: RetryCallState) -> float | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    hint = getattr(outcome.exception(), "retry_after", None)
    return float(hint) if hint is not None and hint >= 0 else None


def backoff(attempt: int, *, base: float, max_delay: float, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff for the ``attempt``-th retry (1-based), at most ``max_delay``."""
    ceiling = min(max_delay, base * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(0.0, ceiling)


def _policy(*, clock: clocks.Clock, attempts: int, max_delay: float, base: float,
            rng: random.Random | None) -> Retrying:
    def wait(state: RetryCallState) -> float:
        jitter = backoff(state.attempt_number, base=base, max_delay=max_delay, rng=rng)
        hint = _hint(state)
        return min(max_delay, max(hint or 0.0, jitter))

    def stop(state: RetryCallState) -> bool:
        if stop_after_attempt(attempts)(state):
            return True
        hint = _hint(state)
        return hint is not None and hint > max_delay  # honour a long hint by giving up now

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.info("retrying after %s", type(error).__name__, extra={
            "attempt": state.attempt_number, "wait_s": round(state.upcoming_sleep, 3),
            "error": str(error)[:200]})

    return Retrying(
        retry=retry_if_exception_type(RETRYABLE), stop=stop, wait=wait, sleep=clock.sleep,
        before_sleep=before_sleep, reraise=True,
    )


def call(fn: Callable[..., T], *args: Any, clock: clocks.Clock | None = None, attempts: int = DEFAULT_ATTEMPTS,
         max_delay: float = DEFAULT_MAX_DELAY, base_delay: float = DEFAULT_BASE_DELAY,
         rng: random.Random | None = None, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)``, retrying Throttled/Transient up to ``attempts`` times in all.

    The last error is re-raised unchanged when the attempts run out.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    policy = _policy(clock=clock or clocks.current(), attempts=attempts, max_delay=max_delay, base=base_delay, rng=rng)
    return policy(fn, *args, **kwargs)


def retrying(*, attempts: int = DEFAULT_ATTEMPTS, max_delay: float = DEFAULT_MAX_DELAY,
             base_delay: float = DEFAULT_BASE_DELAY, clock: clocks.Clock | None = None) -> Callable[[F], F]:
    """Decorator form of :func:`call`; the clock is the process-wide one at call time unless given."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return call(fn, *args, clock=clock or clocks.current(), attempts=attempts, max_delay=max_delay,
                        base_delay=base_delay, **kwargs)

        return wrapper  # type: ignore[return-value]

    return wrap

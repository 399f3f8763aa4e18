"""The retry policy: which errors are retried, how long it waits, and that it sleeps on the clock."""

from __future__ import annotations

import random

import pytest

from shared.kernel import retry
from shared.kernel.clock import ManualClock
from shared.kernel.errors import Conflict, Forbidden, Invalid, NotFound, StewardError, Throttled, Transient


class Script:
    """A callable that raises the scripted errors in order, then returns ``"ok"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.seen: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def __call__(self, *args: object, **kwargs: object) -> str:
        self.calls += 1
        self.seen.append((args, kwargs))
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_a_throttled_call_waits_at_least_retry_after_on_the_injected_clock() -> None:
    clock = ManualClock(start=0.0)
    fn = Script(Throttled(retry_after=7.0), Throttled(retry_after=3.0))
    assert retry.call(fn, "a", clock=clock, attempts=5, max_delay=30.0, key="v") == "ok"
    assert fn.calls == 3
    assert fn.seen[-1] == (("a",), {"key": "v"})
    assert 10.0 <= clock.now() <= 10.0 + 2 * 30.0


def test_the_wait_is_never_shorter_than_the_hint_even_when_backoff_is_smaller() -> None:
    clock = ManualClock(start=0.0)
    fn = Script(Throttled(retry_after=4.5))
    retry.call(fn, clock=clock, attempts=2, base_delay=0.001, max_delay=30.0, rng=random.Random(1))
    assert 4.5 <= clock.now() <= 4.5 + 0.002


def test_a_hint_longer_than_max_delay_is_honoured_by_giving_up_at_once() -> None:
    clock = ManualClock(start=0.0)
    fn = Script(Throttled(retry_after=120.0))
    with pytest.raises(Throttled) as raised:
        retry.call(fn, clock=clock, attempts=5, max_delay=30.0)
    assert raised.value.retry_after == 120.0
    assert fn.calls == 1 and clock.now() == 0.0


def test_transient_errors_back_off_exponentially_within_the_cap() -> None:
    clock = ManualClock(start=0.0)
    fn = Script(Transient(), Transient(), Transient())
    assert retry.call(fn, clock=clock, attempts=4, base_delay=1.0, max_delay=3.0) == "ok"
    assert fn.calls == 4
    assert 0.0 <= clock.now() <= 1.0 + 2.0 + 3.0


def test_attempts_run_out_and_the_last_error_is_raised_unchanged() -> None:
    clock = ManualClock(start=0.0)
    last = Transient("still down")
    fn = Script(Transient("down"), Transient("down"), last)
    with pytest.raises(Transient) as raised:
        retry.call(fn, clock=clock, attempts=3, max_delay=1.0)
    assert raised.value is last and fn.calls == 3


@pytest.mark.parametrize("error", [Conflict("etag"), NotFound("gone"), Invalid("bad", code="QuotaExceeded"),
                                   Forbidden("no"), StewardError("other"), ValueError("bug")],
                         ids=["conflict", "not-found", "invalid", "forbidden", "other-steward-error", "programming-error"])
def test_answers_are_never_retried(error: Exception) -> None:
    clock = ManualClock(start=0.0)
    fn = Script(error)
    with pytest.raises(type(error)):
        retry.call(fn, clock=clock, attempts=5)
    assert fn.calls == 1 and clock.now() == 0.0


def test_the_decorator_uses_the_process_clock_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.kernel import clock as clocks

    manual = ManualClock(start=0.0)
    previous = clocks.use(manual)
    try:
        fn = Script(Throttled(retry_after=2.0))

        @retry.retrying(attempts=3, max_delay=10.0)
        def wrapped(x: int) -> str:
            return fn(x)

        assert wrapped(5) == "ok"
        assert manual.now() >= 2.0 and fn.seen[-1] == ((5,), {})
    finally:
        clocks.use(previous)


def test_backoff_is_bounded_by_the_cap_and_grows_with_attempts() -> None:
    rng = random.Random(7)
    samples = {n: [retry.backoff(n, base=1.0, max_delay=10.0, rng=rng) for _ in range(200)] for n in (1, 3, 8)}
    assert max(samples[1]) <= 1.0 and max(samples[3]) <= 4.0 and max(samples[8]) <= 10.0
    assert max(samples[8]) > 4.0

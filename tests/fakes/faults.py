"""Fault injection shared by the port fakes: an error a method raises once, or until it is cleared.

Every fake of tests/fakes checks :meth:`Faults.check` with the name of the port method at the top of each
call, so a test can make any call fail the way the real adapter would (``Transient``, ``QuotaExceeded``,
``Forbidden``...) without a subclass or a monkeypatch.
"""

from __future__ import annotations


class Faults:
    """``fail_next[method]``: raised by the next call of ``method`` only; ``fail_always[method]``: raised by
    every call until the test removes it. Several fakes may share one instance (one fleet's ARM and
    Kubernetes), so one dict names every method a scenario can break."""

    def __init__(self) -> None:
        self.fail_next: dict[str, Exception] = {}
        self.fail_always: dict[str, Exception] = {}

    def check(self, method: str) -> None:
        error = self.fail_next.pop(method, None) or self.fail_always.get(method)
        if error is not None:
            raise error

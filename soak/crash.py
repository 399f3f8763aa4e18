"""Crashes between two steps, in process: a ledger that kills its host on the N-th write.

Every step of the app ends with a ledger write (create or save) after its effect on the world, so
the moments around a write are exactly "between two steps": a crash *before* the write loses the
step's record but not its effect (the next owner must recognise the effect), a crash *after* the
write loses nothing but the rest of the invocation (claims and leases stay behind until they
expire). :class:`CrashingLedger` raises :class:`HostCrashed` at the chosen write, before or after
it; the exception derives from ``BaseException`` so that no ``except Exception`` in the app can
swallow it, as no code survives a killed process. The dead host's context is then thrown away.

Rows that are notes, not steps (``decision``: a faulty node the sweep set aside, shared.remediation.decisions)
are written through without being counted: no step reads them, so there is no "between two steps" around
them, and counting them would move every later crash point whenever a skip is recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from shared.kernel.ports import Record
from shared.remediation import decisions

NOTE_KINDS = frozenset({decisions.KIND})


class HostCrashed(BaseException):
    """The host process died here (raised by :class:`CrashingLedger`)."""


class CrashingLedger:
    """A ``LedgerPort`` that forwards to ``inner`` and crashes at write number ``crash_at`` (1-based).

    ``when`` is ``"before"`` (the write never happens) or ``"after"`` (it happened, then the process
    died). After the crash every call raises :class:`HostCrashed`: a dead host does nothing more.
    """

    def __init__(self, inner: Any, *, crash_at: int | None, when: str = "before") -> None:
        if when not in ("before", "after"):
            raise ValueError("when must be 'before' or 'after'")
        self._inner = inner
        self._crash_at = crash_at
        self._when = when
        self._writes = 0
        self._lock = threading.Lock()
        self.crashed = False
        self.crashed_on = ""

    def _check_alive(self) -> None:
        if self.crashed:
            raise HostCrashed("this host already crashed")

    def _write(self, what: str, record: Record, fn: Any) -> Record:
        self._check_alive()
        if record.kind in NOTE_KINDS:
            return fn(record)  # type: ignore[no-any-return]
        with self._lock:
            self._writes += 1
            due = self._crash_at is not None and self._writes == self._crash_at
        if due and self._when == "before":
            self.crashed, self.crashed_on = True, f"before {what} {record.kind}/{record.state}"
            raise HostCrashed(self.crashed_on)
        result: Record = fn(record)
        if due:
            self.crashed, self.crashed_on = True, f"after {what} {record.kind}/{record.state}"
            raise HostCrashed(self.crashed_on)
        return result

    def create(self, record: Record) -> Record:
        return self._write("create", record, self._inner.create)

    def save(self, record: Record) -> Record:
        return self._write("save", record, self._inner.save)

    def delete(self, record: Record) -> None:
        self._check_alive()
        self._inner.delete(record)

    def get(self, kind: str, id_: str) -> Record | None:
        self._check_alive()
        return self._inner.get(kind, id_)  # type: ignore[no-any-return]

    def scan(self, kind: str, *, states: Sequence[str] | None = None, due_by: float | None = None,
             older_than: float | None = None, limit: int = 1000) -> list[Record]:
        self._check_alive()
        return list(self._inner.scan(kind, states=states, due_by=due_by, older_than=older_than, limit=limit))

    def list(self, kind: str, *, states: Sequence[str] | None = None) -> list[Record]:
        self._check_alive()
        return list(self._inner.list(kind, states=states))

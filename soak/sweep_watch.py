"""Which health sweeps the soak's host processes have run, read from their logs (process mode only).

The in-process driver runs every sweep itself, so it knows when the app last looked at the fleet. Host
processes run theirs on their own timers, and a host killed and replaced near the end of a scenario may
not have swept since: seed 962959 had one host, killed at t+346 s and t+381 s; the faults flipped at
t+327-334 s (due at t+347-354 s with a 20 s threshold) were never judged, because the first sweep of
the third host was still running when the ledger showed no active record at t+415 s, and the run ended
"quiet" with three faults lost. A run is quiet only once a sweep that *began* after the quiet was first
seen has finished clean (nothing still inside its threshold, no DCGM window re-check pending, no error
that may have hidden a node) and the ledger and Event Grid are still idle.

The host log lines read here are devhost's own (devhost/host.py ``run_invocation``: "Executing
'Functions.<name>' (Id=...)", "Executed 'Functions.<name>' (Succeeded, Id=...", after the sweep's
"steward.sweep: sweep: {...}" summary from shared/remediation/sweep.py).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SWEEP_FUNCTION = "health_sweep"  # functions/health_sweep.py
_STARTED = re.compile(r"Executing 'Functions\.(\w+)' \(Id=([\w-]+)\)")
_FINISHED = re.compile(r"Executed 'Functions\.(\w+)' \((Succeeded|Failed), Id=([\w-]+)")
_SUMMARY = re.compile(r"steward\.sweep: sweep: (\{.*\})\s*$")


@dataclass(frozen=True)
class FinishedSweep:
    id: str
    succeeded: bool
    summary: dict[str, Any] | None  # the sweep's own report (None when it failed before logging one)

    @property
    def clean(self) -> bool:
        """Finished with nothing it left for a later sweep: no fault still inside its threshold, no DCGM
        candidate awaiting its window re-check (what the in-process driver waits for too), and no error that
        may have hidden a cluster's nodes from it. A node short of GPUs inside its start-up grace is not
        waited for, as in process: the liveness oracle's faults are the conditions, series and events."""
        s = self.summary
        if not self.succeeded or s is None:
            return False
        dcgm = s.get("dcgm") or {}
        return not s.get("pending") and not s.get("errors") and not dcgm.get("pending") and not dcgm.get("errors")


@dataclass
class _Log:
    offset: int = 0
    partial: str = ""
    summary: dict[str, Any] | None = None  # the last sweep summary this host logged, not yet claimed


@dataclass
class SweepWatch:
    """Follows every host log in ``state_dir`` (``<host name>.log``, written by devstack.Stack.start_host)."""

    state_dir: Path
    pattern: str = "*.log"
    started: set[str] = field(default_factory=set)
    finished: dict[str, FinishedSweep] = field(default_factory=dict)
    _logs: dict[Path, _Log] = field(default_factory=dict)

    def poll(self) -> None:
        """Read what the hosts logged since the last poll (a line still being written waits for the next)."""
        for path in sorted(self.state_dir.glob(self.pattern)):
            log = self._logs.setdefault(path, _Log())
            with path.open("rb") as handle:
                handle.seek(log.offset)
                chunk = handle.read()
            log.offset += len(chunk)
            text = log.partial + chunk.decode("utf-8", errors="replace")
            lines = text.split("\n")
            log.partial = lines.pop()
            for line in lines:
                self._line(log, line)

    def _line(self, log: _Log, line: str) -> None:
        if (summary := _SUMMARY.search(line)) is not None:
            try:
                log.summary = ast.literal_eval(summary.group(1))
            except (ValueError, SyntaxError):
                log.summary = None
            return
        if (start := _STARTED.search(line)) is not None and start.group(1) == SWEEP_FUNCTION:
            self.started.add(start.group(2))
            return
        if (end := _FINISHED.search(line)) is not None and end.group(1) == SWEEP_FUNCTION:
            succeeded = end.group(2) == "Succeeded"
            # A host runs one sweep at a time (devhost/timers.py: a timer function never overlaps itself), so the
            # summary it logged last is this sweep's.
            self.finished[end.group(3)] = FinishedSweep(end.group(3), succeeded, log.summary if succeeded else None)
            log.summary = None

    def mark(self) -> frozenset[str]:
        """The sweeps begun so far: what a later :meth:`clean_since` does not count."""
        self.poll()
        return frozenset(self.started)

    def clean_since(self, mark: frozenset[str]) -> bool:
        """Whether a sweep begun after ``mark`` was taken has finished clean."""
        self.poll()
        return any(s.clean for i, s in self.finished.items() if i not in mark)


@dataclass
class QuietGate:
    """The process runner's end test: idle (no active record, nothing in flight, no action due, past the
    scenario's quiet time) is seen once, then a sweep begun after that must finish clean, and the run must
    still be idle when it has. Anything active in between starts it over."""

    watch: SweepWatch
    mark: frozenset[str] | None = None

    def quiet(self, idle: bool, still_idle: Callable[[], bool]) -> bool:
        if not idle:
            self.mark = None
            return False
        if self.mark is None:
            self.mark = self.watch.mark()
            return False
        return self.watch.clean_since(self.mark) and still_idle()

"""A process-mode soak run is quiet only after a sweep begun since the quiet was seen has finished clean
(soak/sweep_watch.py; seed 962959: a run ended while its only host, twice killed, had not swept since the
faults came due, and three faults were judged lost). The watch reads the hosts' logs as devhost writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from soak.report import failure_text
from soak.runner import Mix, run_seed
from soak.sweep_watch import QuietGate, SweepWatch

CLEAN = {"pending": 0, "errors": [], "unhealthy": 0, "dcgm": {"pending": 0, "errors": []}}


def _started(log: Path, sweep_id: str, function: str = "health_sweep") -> None:
    with log.open("a") as handle:
        handle.write(f"2026-12-06 01:18:22,002 INFO devhost: Executing 'Functions.{function}' (Id={sweep_id})\n")


def _finished(log: Path, sweep_id: str, summary: dict[str, Any] | None = None, *, ok: bool = True,
              function: str = "health_sweep") -> None:
    with log.open("a") as handle:
        if summary is not None:
            handle.write(f"2026-12-06 01:18:25,076 INFO steward.sweep: sweep: {summary!r}\n")
        outcome = "Succeeded" if ok else "Failed"
        handle.write(f"2026-12-06 01:18:25,077 INFO devhost: Executed 'Functions.{function}' ({outcome}, "
                     f"Id={sweep_id}, Duration=3074ms)\n")


def test_a_sweep_already_running_when_the_quiet_was_seen_does_not_count(tmp_path: Path) -> None:
    log = tmp_path / "soak-3.log"
    _started(log, "aaaa-1")
    watch = SweepWatch(tmp_path)
    mark = watch.mark()
    _finished(log, "aaaa-1", CLEAN)
    assert not watch.clean_since(mark)
    _started(log, "bbbb-2")
    assert not watch.clean_since(mark)  # begun, not finished
    _finished(log, "bbbb-2", CLEAN)
    assert watch.clean_since(mark)


def test_a_sweep_that_left_work_for_the_next_one_is_not_clean(tmp_path: Path) -> None:
    log = tmp_path / "soak-1.log"
    watch = SweepWatch(tmp_path)
    mark = watch.mark()
    left_over = [{**CLEAN, "pending": 2}, {**CLEAN, "errors": ["soak2: KubeTransient: 503"]},
                 {**CLEAN, "dcgm": {"pending": 1, "errors": []}}, {**CLEAN, "dcgm": {"pending": 0, "errors": ["ws"]}}]
    for n, summary in enumerate(left_over):
        _started(log, f"cccc-{n}")
        _finished(log, f"cccc-{n}", summary)
        assert not watch.clean_since(mark), summary
    _started(log, "dddd-1")
    _finished(log, "dddd-1", None, ok=False)  # failed: no summary
    assert not watch.clean_since(mark)
    _started(log, "eeee-1", function="reconcile_timer")
    _finished(log, "eeee-1", CLEAN, function="reconcile_timer")  # another function's run is no sweep
    assert not watch.clean_since(mark)


def test_a_sweep_of_a_killed_host_never_finishes_and_the_next_hosts_sweep_counts(tmp_path: Path) -> None:
    killed, next_host = tmp_path / "soak-1.log", tmp_path / "soak-2.log"
    watch = SweepWatch(tmp_path)
    mark = watch.mark()
    _started(killed, "ffff-1")
    assert not watch.clean_since(mark)
    _started(next_host, "ffff-2")
    with next_host.open("a") as handle:  # a line still being written waits for the next poll
        handle.write("2026-12-06 01:18:25,076 INFO steward.sweep: sweep: {'pending': 0, ")
    assert not watch.clean_since(mark)
    with next_host.open("a") as handle:
        handle.write("'errors': [], 'dcgm': {'pending': 0, 'errors': []}}\n")
    _finished(next_host, "ffff-2")
    assert watch.clean_since(mark)


def test_the_run_is_quiet_only_after_a_clean_sweep_begun_once_idle_was_seen_and_still_idle(tmp_path: Path) -> None:
    log = tmp_path / "soak-3.log"
    gate = QuietGate(SweepWatch(tmp_path))
    _started(log, "gggg-1")  # the sweep the new host began before the ledger looked idle
    assert not gate.quiet(True, lambda: True)  # idle seen: marks the sweeps begun so far
    _finished(log, "gggg-1", CLEAN)
    assert not gate.quiet(True, lambda: True)
    _started(log, "gggg-2")
    _finished(log, "gggg-2", CLEAN)
    assert not gate.quiet(True, lambda: False)  # the sweep published a fault: something is in flight again
    assert gate.quiet(True, lambda: True)


def test_anything_active_between_idle_and_the_clean_sweep_starts_the_wait_over(tmp_path: Path) -> None:
    log = tmp_path / "soak-1.log"
    gate = QuietGate(SweepWatch(tmp_path))
    assert not gate.quiet(True, lambda: True)
    _started(log, "hhhh-1")
    assert not gate.quiet(False, lambda: True)  # a remediation was admitted meanwhile
    _finished(log, "hhhh-1", CLEAN)
    assert not gate.quiet(True, lambda: True)  # idle again: a new mark, which includes hhhh-1
    assert not gate.quiet(True, lambda: True)
    _started(log, "hhhh-2")
    _finished(log, "hhhh-2", CLEAN)
    assert gate.quiet(True, lambda: True)


def test_seed_962959_faults_due_while_the_only_host_was_twice_killed_are_judged_before_the_run_ends(
        azurite: Any) -> None:
    """Found on fresh seed 962959 (process mode, one host killed at t+346 s and t+381 s): three faults flipped at
    t+327-334 s were never judged, because the run ended "quiet" at t+415 s while the third host's first sweep
    was still running. A timing failure, so this run guards it only sometimes (without the gate it ended this way
    in two runs of three); the tests above hold the gate itself."""
    result = run_seed(962959, mix=Mix(), azurite=azurite, wall_budget_s=240.0)
    assert result.mode == "processes"
    assert not result.failed, failure_text(result)

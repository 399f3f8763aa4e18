"""A sweep at the moment a pending finding crosses its threshold (shared.remediation.due_sweep)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from shared import entrypoints
from shared.kernel.errors import Transient
from shared.remediation import due_sweep, sweep
from shared.remediation import records as remediation
from shared.remediation.policy import DCGM, DEVICE_PLUGIN
from tests.fakes.nudge import RecordingNudger
from tests.unit.fakes_remediation import Fleet, make_node

THRESHOLD = 300  # RemediationPolicy's default threshold, as the faked fleet runs it


def _pending(fleet: Fleet, *, age: float = 60) -> float:
    """A node whose device plugin has been failing for ``age`` seconds; when it crosses its threshold."""
    now = fleet.clock.now()
    fleet.kube.add(make_node("aks-gpu-9", conditions={DEVICE_PLUGIN: ("True", now - age), DCGM: ("False", now - 9999)}))
    return now - age + THRESHOLD


def _ctx(fleet: Fleet, nudger: RecordingNudger, instance: str = "host-a") -> Any:
    return dataclasses.replace(fleet.ctx(instance), nudge=nudger)


def test_a_sweep_that_finds_a_pending_fault_asks_for_a_sweep_just_after_it_crosses_its_threshold() -> None:
    fleet, nudger = Fleet(), RecordingNudger()
    crosses = _pending(fleet)
    report = sweep.sweep(_ctx(fleet, nudger))
    when = math.ceil(crosses + due_sweep.MARGIN_S)
    assert report.pending == 1 and report.next_check == crosses
    assert nudger.sent == [(float(when), f"{due_sweep.SWEEP_HINT}{when}")] and report.due_sweep == when


def test_every_sweep_that_sees_the_same_pending_fault_asks_only_once_between_them() -> None:
    fleet, nudger = Fleet(), RecordingNudger()
    _pending(fleet)
    sweep.sweep(_ctx(fleet, nudger, "host-a"))
    fleet.clock.advance(60)
    again = sweep.sweep(_ctx(fleet, nudger, "host-b"))
    assert len(nudger.sent) == 1 and again.due_sweep is None


def test_the_sweep_asked_for_publishes_the_fault_at_its_crossing_not_a_timer_interval_later() -> None:
    fleet, nudger = Fleet(), RecordingNudger()
    crosses = _pending(fleet)
    sweep.sweep(_ctx(fleet, nudger))
    [(when, hint)] = nudger.sent
    fleet.clock.advance(when - fleet.clock.now())
    entrypoints.run_nudge(hint, ctx=_ctx(fleet, nudger))
    [event] = fleet.events.delivered(remediation.UNHEALTHY_EVENT)
    assert event["data"]["node"] == "aks-gpu-9" and fleet.clock.now() - crosses <= due_sweep.MARGIN_S + 1


def test_nothing_pending_asks_for_nothing_and_a_failed_ask_only_waits_for_the_timer() -> None:
    fleet, nudger = Fleet(), RecordingNudger()
    fleet.pool(3)
    assert sweep.sweep(_ctx(fleet, nudger)).due_sweep is None and nudger.sent == []
    _pending(fleet)
    nudger.fail = Transient("queue down")
    report = sweep.sweep(_ctx(fleet, nudger))
    assert report.due_sweep is None and report.errors == []


@pytest.mark.parametrize(("hint", "runs"), [("sweep-due:1893974400", "sweep"), ("remediation:abc-1", "reconcile"),
                                            ("anything", "reconcile")])
def test_a_nudge_runs_a_sweep_only_for_the_sweeps_hint(monkeypatch: pytest.MonkeyPatch, hint: str, runs: str) -> None:
    ran: list[str] = []
    monkeypatch.setattr(entrypoints, "run_health_sweep", lambda ctx=None: ran.append("sweep"))
    monkeypatch.setattr(entrypoints, "run_reconcile", lambda **kw: ran.append("reconcile"))
    entrypoints.run_nudge(hint, ctx=object())  # type: ignore[arg-type]
    assert ran == [runs]

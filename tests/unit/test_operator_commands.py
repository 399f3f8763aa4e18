"""Operator actions go through a validated command path, applied by the app's reconciler (issue 11).

fleetctl writes a ``command`` record; the reconciler validates it again (whoever wrote the row) and
applies it with the app's own code: the breaker reset publishes ``Steward.Breaker.Reset`` naming who
and why. A row that is not a valid command is rejected with the reason, and nothing changes.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import Invalid
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.remediation import breaker, commands
from shared.settings import Settings
from tests.fakes.ledger import InMemoryLedger
from tests.unit.fakes_remediation import FakeEvents

NOW = 1_764_684_000.0


def _ctx(ledger: InMemoryLedger, events: FakeEvents, clock: ManualClock) -> Context:
    settings = Settings(subscriptions=("00000000-0000-0000-0000-000000000001",),
                        eventgrid_topic_endpoint="https://topic.example/api/events")
    return Context(settings=settings, clock=clock, ledger=ledger, access=None, events=events,  # type: ignore[arg-type]
                   telemetry=None, instance="host-a")  # type: ignore[arg-type]


def _open_breaker(ledger: InMemoryLedger) -> None:
    ledger.create(Record(kind=breaker.KIND, id=breaker.ID, state=breaker.OPEN, created_at=NOW - 600,
                         data={"window": {"c/n1": NOW - 700}, "fleet_nodes": 20, "opened_at": NOW - 600,
                               "reason": "storm"}))


def _run(ctx: Context) -> Any:
    return reconcile_once(ctx, modules={commands.KIND: commands})


@pytest.fixture
def world() -> tuple[InMemoryLedger, FakeEvents, ManualClock]:
    return InMemoryLedger(), FakeEvents(), ManualClock(NOW)


def test_a_requested_breaker_reset_is_applied_by_the_reconciler_and_announced_with_who_and_why(world: Any) -> None:
    ledger, events, clock = world
    _open_breaker(ledger)
    asked = commands.request(ledger, command="breaker.reset", by="alice", reason="driver roll-back done", now=NOW - 5)
    assert breaker.current(_ctx(ledger, events, clock)).is_open  # asking changes nothing by itself
    report = _run(_ctx(ledger, events, clock))
    assert report.finished == [f"command/{asked.id} -> applied"]
    state = breaker.current(_ctx(ledger, events, clock))
    assert not state.is_open and state.reset_by == "alice" and state.reset_at == NOW  # the app's clock, not fleetctl's
    [reset] = [e for e in events.published if e["type"] == breaker.RESET_EVENT]
    assert reset["data"]["reset_by"] == "alice" and reset["data"]["reset_reason"] == "driver roll-back done"
    assert reset["data"]["command"] == asked.id
    done = ledger.get(commands.KIND, asked.id)
    assert done is not None and done.state == "applied" and done.data["result"]["breaker"] == "closed"
    assert _run(_ctx(ledger, events, clock)).finished == []  # applied once, never again
    assert sum(e["type"] == breaker.RESET_EVENT for e in events.published) == 1


FORGED = [
    ("unknown-command", {"command": "breaker.open", "by": "mallory", "reason": "x", "requested_at": NOW}, "breaker.open"),
    ("no-name", {"command": "breaker.reset", "by": "", "reason": "x", "requested_at": NOW}, "by must name"),
    ("no-reason", {"command": "breaker.reset", "by": "alice", "reason": " ", "requested_at": NOW}, "reason must"),
    ("extra-field", {"command": "breaker.reset", "by": "alice", "reason": "x", "requested_at": NOW,
                     "reset_at": 0.0}, "reset_at"),
    ("stale", {"command": "breaker.reset", "by": "alice", "reason": "x", "requested_at": NOW - 7200}, "ask again"),
    ("from-the-future", {"command": "breaker.reset", "by": "alice", "reason": "x", "requested_at": NOW + 3600},
     "in the future"),
    ("time-as-text", {"command": "breaker.reset", "by": "alice", "reason": "x", "requested_at": "now"}, "requested_at"),
]


@pytest.mark.parametrize(("data", "why"), [f[1:] for f in FORGED], ids=[f[0] for f in FORGED])
def test_a_row_that_is_not_a_valid_command_is_rejected_with_the_reason_and_changes_nothing(
        world: Any, data: dict[str, Any], why: str) -> None:
    ledger, events, clock = world
    _open_breaker(ledger)
    ledger.create(Record(kind=commands.KIND, id="forged", state="requested", data=data, created_at=NOW, next_at=NOW))
    _run(_ctx(ledger, events, clock))
    rec = ledger.get(commands.KIND, "forged")
    assert rec is not None and rec.state == "rejected" and why in rec.data["rejected_because"]
    assert breaker.current(_ctx(ledger, events, clock)).is_open
    assert events.published == []


def test_fleetctl_side_validation_refuses_before_writing(world: Any) -> None:
    ledger, _, _ = world
    with pytest.raises(Invalid, match="by must name the operator"):
        commands.request(ledger, command="breaker.reset", by="alice\nbob", reason="x", now=NOW)
    with pytest.raises(Invalid, match="not a valid command"):
        commands.request(ledger, command="rm -rf", by="alice", reason="x", now=NOW)
    assert ledger.list(commands.KIND) == []

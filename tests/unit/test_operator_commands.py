"""Operator actions go through a validated command path, applied by the app's reconciler (issue 11).

fleetctl writes a ``command`` record; the reconciler validates it again (whoever wrote the row) and
applies it with the app's own code: the breaker reset publishes ``Steward.Breaker.Reset`` naming who
and why. A row that is not a valid command is rejected with the reason and a ``Steward.Command.Rejected``
event, and nothing changes. A row written straight into any other state is never stepped (issue 19).
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
    ("command-in-another-case", {"command": "Breaker.Reset", "by": "alice", "reason": "x", "requested_at": NOW},
     "Breaker.Reset"),
    ("command-with-a-trailing-space", {"command": "breaker.reset ", "by": "alice", "reason": "x",
                                       "requested_at": NOW}, "breaker.reset "),
    ("a-result-written-in-advance", {"command": "breaker.reset", "by": "alice", "reason": "x", "requested_at": NOW,
                                     "result": {"breaker": "closed"}}, "result"),
    ("just-past-the-clock-skew", {"command": "breaker.reset", "by": "alice", "reason": "x",
                                  "requested_at": NOW + commands.FUTURE_SKEW_S + 1}, "in the future"),
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
    [rejected] = events.published  # the rejection is announced; no Reset
    assert rejected["type"] == commands.REJECTED_EVENT and rejected["subject"].endswith("/commands/forged")
    assert rejected["data"]["reason"] == rec.data["rejected_because"] and rejected["data"]["command_record"] == "forged"


def test_fleetctl_side_validation_refuses_before_writing(world: Any) -> None:
    ledger, _, _ = world
    with pytest.raises(Invalid, match="by must name the operator"):
        commands.request(ledger, command="breaker.reset", by="alice\nbob", reason="x", now=NOW)
    with pytest.raises(Invalid, match="not a valid command"):
        commands.request(ledger, command="rm -rf", by="alice", reason="x", now=NOW)
    assert ledger.list(commands.KIND) == []


def test_a_reset_stamped_within_the_clock_skew_ahead_is_applied_with_the_apps_clock(world: Any) -> None:
    ledger, events, clock = world
    _open_breaker(ledger)
    ahead = NOW + commands.FUTURE_SKEW_S - 1  # an operator's laptop a little fast
    ledger.create(Record(kind=commands.KIND, id="skewed", state="requested", created_at=NOW, next_at=NOW,
                         data={"command": "breaker.reset", "by": "alice", "reason": "x", "requested_at": ahead}))
    _run(_ctx(ledger, events, clock))
    state = breaker.current(_ctx(ledger, events, clock))
    assert not state.is_open and state.reset_at == NOW  # never the row's time


VALID = {"command": "breaker.reset", "by": "mallory", "reason": "written by hand", "requested_at": NOW}
# (id, the state a table writer wrote, the data) : none of these is ever stepped
WRITTEN_STATES = [
    ("applied-by-hand", "applied", {**VALID, "result": {"breaker": "closed", "reset_at": NOW}}),
    ("rejected-by-hand", "rejected", {**VALID, "rejected_because": "x"}),
    ("a-state-the-kind-does-not-have", "applying", VALID),
    ("blocked", "blocked", VALID),
    ("requested-in-capitals", "REQUESTED", VALID),
]


@pytest.mark.parametrize(("state", "data"), [w[1:] for w in WRITTEN_STATES], ids=[w[0] for w in WRITTEN_STATES])
def test_a_command_row_written_in_any_state_but_requested_is_never_stepped_and_changes_nothing(
        world: Any, state: str, data: dict[str, Any]) -> None:
    ledger, events, clock = world
    _open_breaker(ledger)
    written = ledger.create(Record(kind=commands.KIND, id="forged", state=state, data=data, created_at=NOW,
                                   next_at=NOW))
    report = _run(_ctx(ledger, events, clock))
    assert report.finished == [] and report.advanced == {}
    after = ledger.get(commands.KIND, "forged")
    assert after is not None and after.etag == written.etag and after.state == state  # not even touched
    assert breaker.current(_ctx(ledger, events, clock)).is_open and events.published == []


def test_a_requested_row_whose_state_changed_under_the_step_is_rejected_not_applied(world: Any) -> None:
    ledger, events, clock = world
    _open_breaker(ledger)
    row = Record(kind=commands.KIND, id="odd", state="applied", data=dict(VALID), created_at=NOW, next_at=NOW)
    stepped = commands.advance(row, _ctx(ledger, events, clock))  # called on a row the reconciler would never pass
    assert stepped.state == "rejected" and "state 'applied' is not applied" in stepped.data["rejected_because"]
    assert breaker.current(_ctx(ledger, events, clock)).is_open
    assert [e["type"] for e in events.published] == [commands.REJECTED_EVENT]


def test_a_command_given_up_by_the_reconciler_is_rejected_and_announced(world: Any) -> None:
    ledger, events, clock = world
    asked = commands.request(ledger, command="breaker.reset", by="alice", reason="x", now=NOW)
    ended = commands.give_up(asked, _ctx(ledger, events, clock), reason="failed 5 times: Forbidden")
    assert ended.state == "rejected" and ended.data["rejected_because"] == "failed 5 times: Forbidden"
    [event] = events.published
    assert event["type"] == commands.REJECTED_EVENT and event["data"]["by"] == "alice"

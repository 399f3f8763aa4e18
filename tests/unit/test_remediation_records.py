"""The remediation package's typed records: every row an earlier version stored still loads, and keeps
what the steps read.

tests/fixtures/stored_records/remediation.json holds one row of every (kind, state, key set) that the
code before issue 12 (commit 224ea3a) wrote through the ledger in its remediation, sweep and end-to-end
tests. Each decodes into its Struct, and the fields survive a load and a store unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.kernel.ports import Record
from shared.remediation import admission, breaker, records
from shared.remediation.records import (
    BudgetData,
    ClaimMarker,
    NodeData,
    OpMarker,
    RefusedMarker,
    RemediationData,
    ReplaceMode,
    Rung,
    RungPhase,
    State,
    TurnMarker,
)
from tests.unit.fakes_remediation import Fleet, unhealthy_event

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "stored_records" / "remediation.json"
ROWS: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["rows"]


def _rows(kind: str) -> list[dict[str, Any]]:
    return [r for r in ROWS if r["kind"] == kind]


def _record(row: dict[str, Any]) -> Record:
    return Record(kind=row["kind"], id=row["id"], state=row["state"], data=row["data"])


def test_the_fixture_holds_every_kind_remediation_writes() -> None:
    kinds = {r["kind"] for r in ROWS}
    assert {"remediation", "remediation-node", "budget", "dedupe", "breaker"} <= kinds
    assert {r["state"] for r in _rows("remediation")} <= {s.value for s in State}
    assert len({r["state"] for r in _rows("remediation")}) >= 8, "the capture should cover most states"


def _kept(stored: Any, typed: Any, where: str) -> None:
    """Everything ``stored`` says, ``typed`` says too (typed data may add the defaults of unset fields)."""
    if isinstance(stored, dict) and where != "drain":
        for key, value in stored.items():
            assert key in typed, f"{where}.{key} lost"
            _kept(value, typed[key], f"{where}.{key}")
    else:
        assert typed == stored, where


@pytest.mark.parametrize("row", _rows("remediation"), ids=lambda r: f"{r['state']}-{r['id'][-12:]}")
def test_every_stored_remediation_loads_and_keeps_what_the_steps_read(row: dict[str, Any]) -> None:
    data = records.load(_record(row))
    stored = records.upgrade(row["data"])
    again = records.to_data(data)
    for key, value in stored.items():
        if key.startswith("_"):
            continue  # the reconciler's own bookkeeping: not the kind's field
        assert key in RemediationData.__struct_fields__, f"stored field {key!r} has no typed field"
        _kept(value, again[key], key)
    # a round trip through the typed data changes nothing the steps read
    assert records.load(Record(kind="remediation", id=row["id"], state=row["state"], data=again)) == data
    assert data.rung_phase in set(RungPhase)
    assert all(r in set(Rung) for r in data.ladder)
    if data.replace.mode is not None:
        assert data.replace.mode in set(ReplaceMode)


@pytest.mark.parametrize("row", _rows("remediation-node"), ids=lambda r: r["id"])
def test_every_stored_node_record_loads(row: dict[str, Any]) -> None:
    node = records.decode(row["data"], NodeData)
    assert node.cluster and node.node and [a.id for a in node.attempts]
    assert records.to_data(node) == row["data"]


@pytest.mark.parametrize("row", _rows("budget"), ids=lambda r: r["id"])
def test_every_stored_budget_loads(row: dict[str, Any]) -> None:
    budget = records.decode(row["data"], BudgetData)
    assert set(budget.slots) == set(row["data"]["slots"])
    assert records.to_data(budget) == row["data"]


_MARKERS: dict[str, type[msgspec.Struct]] = {"refused-": RefusedMarker, "op-": OpMarker,
                                             "replace-turn-": TurnMarker, "replacement-": ClaimMarker}


@pytest.mark.parametrize("row", _rows("dedupe"), ids=lambda r: r["id"][:40])
def test_every_stored_marker_loads_as_the_struct_its_id_names(row: dict[str, Any]) -> None:
    kind = next(t for prefix, t in _MARKERS.items() if row["id"].startswith(prefix))
    marker = records.decode(row["data"], kind)
    stored = records.to_data(marker)
    assert {k: v for k, v in row["data"].items() if v not in ("", None)} == \
        {k: v for k, v in stored.items() if v not in ("", None)}


@pytest.mark.parametrize("row", _rows("breaker"), ids=lambda r: r["state"])
def test_every_stored_breaker_loads(row: dict[str, Any]) -> None:
    state = breaker.BreakerState.from_record(_record(row))
    assert state.state == row["state"]


@pytest.mark.parametrize(("stored", "expected"), [
    pytest.param({"replace": {}}, {}, id="an empty replace is no replace"),
    pytest.param({"replace": None, "escalation": None, "refusal": {}}, {}, id="None and {} mean none"),
    pytest.param({"since": "2026-01-01T00:00:10Z"}, {"since": "2026-01-01T00:00:10Z", "since_ts": 1767225610.0},
                 id="since_ts derived from since"),
    pytest.param({"since": "2026-01-01T00:00:10Z", "since_ts": 5.0}, {"since": "2026-01-01T00:00:10Z", "since_ts": 5.0},
                 id="a stored since_ts wins"),
    pytest.param({"drain": None, "escalation": {"from": "restart", "code": "X", "reason": "r", "at": 1.0}},
                 {"escalation": {"from": "restart", "code": "X", "reason": "r", "at": 1.0}}, id="kept as stored"),
])
def test_upgrade_turns_old_shapes_into_todays(stored: dict[str, Any], expected: dict[str, Any]) -> None:
    assert records.upgrade(stored) == expected
    loaded = records.load(Record(kind="remediation", id="x", state="admitted", data={"cluster": "c", "node": "n", **stored}))
    assert loaded.replace == records.ReplaceData()


def test_an_escalation_keeps_its_stored_key_from() -> None:
    escalation = records.Escalation(from_="restart", code="KarpenterNode", reason="standalone VM", at=3.0)
    assert records.fields(escalation=escalation) == {
        "escalation": {"from": "restart", "code": "KarpenterNode", "reason": "standalone VM", "at": 3.0}}


def test_fields_refuse_a_key_the_typed_data_does_not_have() -> None:
    with pytest.raises(TypeError, match="vmSize"):
        records.fields(vmSize="Standard_NC24ads_A100_v4")
    assert records.fields(rung_phase=RungPhase.SURGE_WAIT, ladder=[Rung.RESTART]) == {
        "rung_phase": "surge_wait", "ladder": ["restart"]}


@pytest.mark.parametrize(("ladder", "index", "rung"), [
    ((Rung.RESTART, Rung.REIMAGE, Rung.REPLACE), 0, Rung.RESTART),
    ((Rung.RESTART, Rung.REIMAGE, Rung.REPLACE), 2, Rung.REPLACE),
    ((Rung.RESTART,), 1, None),
    ((), 0, None),
])
def test_the_current_rung_is_the_ladders_entry_at_the_index(ladder: tuple[Rung, ...], index: int,
                                                            rung: Rung | None) -> None:
    assert RemediationData(cluster="c", node="n", ladder=list(ladder), rung_index=index).rung == rung


def _fleet_event(how: str) -> tuple[Fleet, dict[str, Any]]:
    fleet = Fleet()
    fleet.pool(5, unhealthy=[1])
    event = unhealthy_event("aks-gpu-1", fleet=fleet)
    if how == "foreign source":
        event["source"] = "/someone-else"
    if how == "malformed":
        event["data"] = {"node": "aks-gpu-1"}
    if how == "paused":
        fleet.tag("gpu-fleet-steward/paused", "true")
    return fleet, event


@pytest.mark.parametrize(("how", "outcome", "detail"), [
    ("admitted", admission.Handling.ADMITTED, "admitted: "),
    ("foreign source", admission.Handling.IGNORED, "ignored: source"),
    ("malformed", admission.Handling.IGNORED, "ignored: malformed event"),
    ("paused", admission.Handling.REFUSED, "refused (paused)"),
    ("twice", admission.Handling.DUPLICATE, "duplicate: "),
])
def test_handle_event_answers_an_outcome_and_the_sentence_the_log_shows(how: str, outcome: admission.Handling,
                                                                      detail: str) -> None:
    fleet, event = _fleet_event(how)
    if how == "twice":
        assert admission.handle_event(event, fleet.ctx()).outcome is admission.Handling.ADMITTED
    handled = admission.handle_event(event, fleet.ctx())
    assert handled.outcome is outcome and handled.detail.startswith(detail), handled
    assert str(handled) == handled.detail
    written = fleet.ledger.list(records.KIND)
    assert len(written) == (1 if outcome is admission.Handling.ADMITTED or how == "twice" else 0)

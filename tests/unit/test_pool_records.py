"""The pool-request record: typed data, rows stored by older versions still load, and the events keep their wire names.

``tests/fixtures/stored_records/pool-request.json`` holds one row per distinct shape (state and key set,
nested keys included) that the code before issue 12 stored, captured from its pool unit and end-to-end
tests. Every one must decode into :class:`shared.pools.records.PoolRequestData`, and what the steps read
must be the same after a round trip through the new encoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.kernel.ports import Record
from shared.pools import records
from shared.pools.records import (
    Cleanup,
    CleanupAction,
    JobRef,
    Outcome,
    PoolRequestData,
    SampleJobResult,
    StackReport,
    State,
    upgrade_keys,
    wire,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "stored_records" / "pool-request.json"
ROWS: list[dict[str, Any]] = json.loads(FIXTURE.read_text(encoding="utf-8"))["rows"]


def _row_id(row: dict[str, Any]) -> str:
    return f"{row['state']}-{row['id']}-{len(row['data'])}keys"


def _read(data: PoolRequestData) -> dict[str, Any]:
    """What the steps, intake, team usage and the reconciler read of a record."""
    return {
        "request": data.request, "fingerprint": data.fingerprint, "cluster": data.cluster, "pool": data.pool,
        "requester": data.requester, "vm_size": data.vm_size, "dequeue_count": data.dequeue_count,
        "announced": data.announced, "team": data.team, "claimed_requester": data.claimed_requester,
        "puts": data.puts, "nap": data.nap, "deadline": data.deadline, "location": data.location,
        "stack": data.stack, "job": data.job, "paused_since": data.paused_since, "failing": data.failing,
        "error": data.error, "outcome": data.outcome, "cleanup": data.cleanup, "digest": data.digest,
        "problem_count": data.problem_count, "reasons": data.reasons, "request_id": data.request_id,
        "error_streak": data.error_streak, "permanent_tries": data.permanent_tries,
    }


def test_the_fixture_covers_every_state_and_the_shapes_that_changed_names() -> None:
    # ``blocked`` is newer than the stored rows (a refusal of a row the world does not bear out: shared.pools.proof);
    # tests/unit/test_pool_forged_states.py round-trips the rows it writes.
    assert {row["state"] for row in ROWS} == {str(s) for s in State} - {State.BLOCKED}
    keys = {k for row in ROWS for k in row["data"]}
    assert {"vmSize", "dequeueCount", "claimedRequester", "provisioningState", "problemCount", "messageHead",
            "failing", "job", "paused_since", "_error_streak"} <= keys


@pytest.mark.parametrize("row", ROWS, ids=_row_id)
def test_every_stored_row_decodes_and_what_the_steps_read_survives_a_round_trip(row: dict[str, Any]) -> None:
    record = msgspec.convert(row, Record)
    data = records.decode(record.data)
    if record.state in records.ACTIVE_STATES:
        assert data.request is not None and data.request.request_id == record.id
        assert records.typed(record)[1] == data.request
    stored = records.normalised(record)
    again = records.decode(stored.data)
    assert _read(again) == _read(data)
    assert records.encode(again) == stored.data  # the new encoding is a fixed point
    assert not set(stored.data) & set(records.RENAMED_KEYS), "an old key name was stored again"
    # the values themselves, not only their presence, carried over from the old names
    old = row["data"]
    for old_key, new_key in records.RENAMED_KEYS.items():
        if old_key in old:
            assert stored.data.get(new_key) == old[old_key]  # None is left out of the new encoding
    if isinstance(old.get("stack"), dict):
        assert again.stack is not None and again.stack.ready_nodes == old["stack"]["readyNodes"]
    if isinstance(old.get("outcome"), dict) and "sampleJob" in old["outcome"]:
        assert again.outcome is not None and again.outcome.sample_job == old["outcome"]["sampleJob"]
    if isinstance(old.get("failing"), dict):
        assert again.failing is not None and again.failing.code == old["failing"]["code"]
        assert (again.failing.stack is not None) == ("stack" in (old["failing"].get("data") or {}))


@pytest.mark.parametrize(("old", "new"), [
    pytest.param({"vmSize": "Standard_NC4as_T4_v3", "dequeueCount": 2}, {"vm_size": "Standard_NC4as_T4_v3",
                                                                          "dequeue_count": 2}, id="top-level"),
    pytest.param({"vm_size": "a", "vmSize": "b"}, {"vm_size": "a"}, id="the-new-key-wins"),
    pytest.param({"stack": {"readyNodes": 1, "gpuAllocatable": 1}}, {"stack": {"ready_nodes": 1, "gpu_allocatable": 1}},
                 id="stack"),
    pytest.param({"outcome": {"sampleJob": "succeeded", "stack": {"readyNodes": 2}}},
                 {"outcome": {"sample_job": "succeeded", "stack": {"ready_nodes": 2}}}, id="outcome-and-its-stack"),
    pytest.param({"job": {"name": "j", "foundUid": "u"}}, {"job": {"name": "j", "found_uid": "u"}}, id="job"),
    pytest.param({"failing": {"code": "X", "since": 1.0, "data": {"stack": {"readyNodes": 0}}}},
                 {"failing": {"code": "X", "since": 1.0, "stack": {"ready_nodes": 0}}}, id="failing-data-flattened"),
    pytest.param({"request": {"requestId": "r", "vmSize": "v"}}, {"request": {"requestId": "r", "vmSize": "v"}},
                 id="the-request-keeps-its-wire-schema"),
    pytest.param({"job": None, "stack": None}, {}, id="unset-nested"),
])
def test_old_key_names_are_mapped_on_read(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert upgrade_keys(old) == new


def test_a_row_that_is_not_a_pool_request_does_not_decode() -> None:
    with pytest.raises(msgspec.ValidationError):
        records.decode({"puts": "three"})
    with pytest.raises(msgspec.ValidationError):
        records.typed(Record(kind=records.KIND, id="r", state=State.ACCEPTED, data={"cluster": "c"}))


def test_events_carry_the_outcome_in_their_camel_case_wire_names_and_resource_names_untouched() -> None:
    stack = StackReport(ok=True, problems=[], ready_nodes=1, gpu_allocatable=7,
                        resources={"nvidia.com/mig-1g.10gb": 7, "example.com/odd_name": 1})
    outcome = Outcome(state=State.SUCCEEDED, nodes=1, resources=dict(stack.resources),
                      sample_job=SampleJobResult.SUCCEEDED, stack=stack)
    assert wire(outcome) == {
        "state": "succeeded", "nodes": 1, "resources": {"nvidia.com/mig-1g.10gb": 7, "example.com/odd_name": 1},
        "sampleJob": "succeeded",
        "stack": {"ok": True, "problems": [], "readyNodes": 1, "gpuAllocatable": 7,
                  "resources": {"nvidia.com/mig-1g.10gb": 7, "example.com/odd_name": 1}}}
    assert wire(JobRef(name="j", namespace="n", uid="u")) == {"name": "j", "namespace": "n", "uid": "u"}
    assert wire(Cleanup(action=CleanupAction.SCALED_TO_ZERO, note="n")) == {"action": "scaledToZero", "note": "n"}

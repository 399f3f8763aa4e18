"""Migration rows already stored in Table storage still load into the typed record (issue 12, item 3).

tests/fixtures/stored_records/migration.json holds a row of every shape the code wrote before the
typed record existed (commit 224ea3a), captured from its ledger writes during its migration unit
tests and its end-to-end test. Each must decode, and what the steps read must survive a round trip.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.kernel.errors import Invalid
from shared.migration.records import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    AutoscalerBounds,
    MigrationData,
    MigrationState,
    Phase,
    Strategy,
    read,
    upgrade,
    written,
)

ROWS: list[dict[str, Any]] = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "stored_records" / "migration.json").read_text())["rows"]
FIELDS = set(MigrationData.__struct_fields__)


def _id(row: dict[str, Any]) -> str:
    return f"{row['state']}-{ROWS.index(row)}"


def test_the_fixture_covers_every_state_the_code_wrote() -> None:
    assert {r["state"] for r in ROWS} == {s.value for s in MigrationState}
    assert 60 <= len(ROWS) <= 100


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_every_stored_row_decodes_and_what_the_steps_read_survives_a_round_trip(row: dict[str, Any]) -> None:
    MigrationState(row["state"])
    data = read(row["data"])
    again = written(data)
    assert read(again) == data
    for key, value in row["data"].items():
        if key.startswith("_"):
            continue  # the reconciler's own keys (_last_error...): kept in the record, never typed
        assert key in FIELDS, f"{key} was stored but the struct would drop it"
        if value is None and key not in ("autoscaler_was", "progress"):
            assert again[key] == msgspec.to_builtins(getattr(MigrationData(), key))
        else:
            assert again[key] == value, key


def test_enums_and_nested_structs_come_back_typed() -> None:
    draining = next(r for r in ROWS if r["data"].get("autoscaler_was") and r["data"].get("progress"))
    data = read(draining["data"])
    assert isinstance(data.strategy, Strategy) and isinstance(data.phase, Phase)
    assert isinstance(data.autoscaler_was, AutoscalerBounds) and data.progress is not None
    assert data.progress.nodes_total == draining["data"]["progress"]["nodes_total"]


@pytest.mark.parametrize(("stored", "expected"), [
    ({"autoscaler": None}, {}),
    ({"autoscaler_was": None, "progress": None}, {"autoscaler_was": None, "progress": None}),
    ({"_last_error": "Transient: ARM 503", "pool": "gpu"}, {"_last_error": "Transient: ARM 503", "pool": "gpu"}),
], ids=["a null that is not optional reads as the default", "optional nulls stay", "unknown keys stay"])
def test_upgrade_maps_stored_spellings_to_the_structs(stored: dict[str, Any], expected: dict[str, Any]) -> None:
    assert upgrade(stored) == expected


def test_a_row_with_a_value_of_the_wrong_type_is_refused_naming_the_field() -> None:
    with pytest.raises(Invalid, match="batch_size"):
        read({**ROWS[0]["data"], "batch_size": "two"})
    with pytest.raises(Invalid, match="phase"):
        read({**ROWS[0]["data"], "phase": "explode"})


def test_the_state_sets_partition_the_states() -> None:
    assert {s.value for s in MigrationState} == ACTIVE_STATES | TERMINAL_STATES
    assert not ACTIVE_STATES & TERMINAL_STATES

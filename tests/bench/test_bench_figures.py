"""The benchmark runner's own logic: figures, ratios, the table, the JSON, and request attribution."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.figures import measured, not_measured, ratio_at_most
from bench.reaction import next_sweep
from bench.remediation_run import RemediationRun, timings
from bench.requests import SWEEP_ROUTE, net_of_sweeps
from bench.scale import TINY as TINY_SCALE


def test_the_ratio_is_the_value_over_the_baseline() -> None:
    assert measured("x", 2.0, "s", baseline=8.0).ratio == pytest.approx(0.25)


@pytest.mark.parametrize("baseline", [None, 0.0], ids=["no-baseline", "zero-baseline"])
def test_a_figure_without_a_usable_baseline_has_no_ratio(baseline: float | None) -> None:
    assert measured("x", 2.0, "s", baseline=baseline).ratio is None


@pytest.mark.parametrize(("value", "met"), [(0.9, True), (1.0, True), (1.3, False)], ids=["under", "at", "over"])
def test_a_ratio_target_is_met_only_at_or_below_its_limit(value: float, met: bool) -> None:
    assert measured("x", value, "s", baseline=1.0, target="<= 1", check=ratio_at_most(1.0)).met is met


def test_a_figure_that_was_not_measured_says_why_and_has_no_number() -> None:
    figure = not_measured("drain", "s", "the remediation job is missing")
    doc = figure.as_json()
    assert doc["value"] is None and doc["ratio"] is None
    assert doc["not_measured"] == "the remediation job is missing"


def test_the_json_document_has_one_entry_per_figure_with_the_required_keys(tmp_path: Path) -> None:
    figures = [measured("a", 1.0, "ms", baseline=4.0, baseline_name="eager"), not_measured("b", "s", "not ready")]
    path = tmp_path / "bench-results.json"
    report.write(path, figures, scale="tiny", elapsed_s=1.0)
    doc = json.loads(path.read_text())
    assert [f["name"] for f in doc["figures"]] == ["a", "b"]
    for entry in doc["figures"]:
        assert {"name", "value", "unit", "baseline_value", "ratio"} <= set(entry)
    assert doc["figures"][0]["ratio"] == pytest.approx(0.25)


def test_the_table_shows_every_figure_and_why_one_was_not_measured() -> None:
    text = report.table([measured("cold import", 500.0, "ms", baseline=3500.0, baseline_name="eager"),
                         not_measured("migration", "s", "shared.migration.steps is not finished")])
    assert "cold import" in text and "7.0x less" in text
    assert "migration" in text and "not measured: shared.migration.steps is not finished" in text


@pytest.mark.parametrize(("after", "expected"), [(90.0, 90.0), (91.0, 120.0), (119.9, 120.0)],
                         ids=["on-a-sweep", "just-after", "just-before-next"])
def test_the_next_sweep_is_the_first_schedule_tick_at_or_after_the_threshold(after: float, expected: float) -> None:
    assert next_sweep(after, interval=30) == expected


def test_requests_of_the_sweeps_in_a_remediation_window_are_subtracted_route_by_route() -> None:
    quiet = {"arm": {SWEEP_ROUTE: 3, "total": 3, "reads": 3}, "kube": {"GET /k8s/{}/api/v1/nodes": 3, "total": 3}}
    window = {"arm": {SWEEP_ROUTE: 5, "POST restart": 1, "total": 6},
              "kube": {"GET /k8s/{}/api/v1/nodes": 5, "POST eviction": 100, "total": 105}}
    assert net_of_sweeps(window, quiet, "arm") == (1.0, 5)
    assert net_of_sweeps(window, quiet, "kube") == (100.0, 5)
    assert math.isclose(net_of_sweeps(window, {}, "kube")[0], 105.0)


def test_the_time_to_repair_floor_is_threshold_grace_action_and_verification() -> None:
    from bench.time_to_repair import floor_s

    assert floor_s(threshold_s=60, longest_grace_s=60, action_s=20, settle_s=10, poll_s=2) == 150
    assert floor_s(threshold_s=60, longest_grace_s=60, action_s=20, settle_s=1, poll_s=2) == 144  # 2 polls at least


# Issue 24's floor per rung, from the runs' timings (threshold 60, longest grace 60, settle 10, poll 2: the
# verification is 10): restart and reimage add their VM action after the drain; a surge-first replace runs
# the surge beside the drain (the longer of the two counts), then deleteMachines; a delete-first replace
# deletes, then restores the count and waits for the new node, all after the drain.
_TIMINGS = {"restart_s": 20, "reimage_s": 60, "pool_scale_s": 30, "node_ready_s": 5, "delete_machines_s": 30}


@pytest.mark.parametrize(("rung", "changed", "mode", "expected"), [
    ("restart", {}, "surge", 60 + 60 + 20 + 10),
    ("reimage", {}, "surge", 60 + 60 + 60 + 10),
    ("replace", {}, "surge", 60 + max(60, 30 + 5) + 30 + 10),
    ("replace", {"pool_scale_s": 90, "node_ready_s": 20}, "surge", 60 + (90 + 20) + 30 + 10),
    ("replace", {}, "delete-first", 60 + 60 + 30 + (30 + 5) + 10),
], ids=["restart", "reimage", "replace-surge-hidden-by-the-drain", "replace-surge-longer-than-the-drain",
        "replace-delete-first"])
def test_the_time_to_repair_floor_of_each_rung(rung: str, changed: dict[str, float], mode: str, expected: float) -> None:
    from bench.time_to_repair import rung_floor

    floor, terms = rung_floor(rung, timings={**_TIMINGS, **changed}, threshold_s=60, longest_grace_s=60,
                              settle_s=10, poll_s=2, mode=mode)
    assert floor == expected
    assert terms.startswith("threshold 60 + ") and terms.endswith("verification 10")


def test_the_floor_of_a_rung_reads_its_timings_from_the_run_that_measured_it() -> None:
    from bench import remediation_run
    from bench.time_to_repair import RUNGS, rung_floor

    assert RUNGS == ("restart", "reimage", "replace")
    for rung in RUNGS:
        profile = remediation_run.profile(rung)
        assert profile["REMEDIATION_LADDER"] == ("restart,reimage,replace" if rung == "restart" else rung)
        floor, _ = rung_floor(rung, timings=remediation_run.timings(rung), threshold_s=remediation_run.THRESHOLD_S,
                              longest_grace_s=max(remediation_run.GRACES), settle_s=float(profile["REMEDIATION_SETTLE_S"]),
                              poll_s=float(profile["REMEDIATION_POLL_S"]))
        assert floor > remediation_run.THRESHOLD_S + max(remediation_run.GRACES)
    assert remediation_run.scenario(TINY_SCALE, "replace")["timings"]["delete_machines_s"] == remediation_run.DELETE_MACHINES_S
    assert "pool_scale_s" not in remediation_run.scenario(TINY_SCALE)["timings"]  # the restart run's scenario as before


def test_an_unknown_rung_has_no_floor() -> None:
    from bench.time_to_repair import rung_floor

    with pytest.raises(ValueError, match="unknown rung"):
        rung_floor("reboot", timings=_TIMINGS, threshold_s=60, longest_grace_s=60, settle_s=10, poll_s=2)


def _run(**changes: Any) -> RemediationRun:
    history = [{"at": 1075.0, "state": "admitted"}, {"at": 1076.0, "state": "cordoned"},
               {"at": 1080.0, "state": "draining"}, {"at": 1145.0, "state": "repairing"},
               {"at": 1180.0, "state": "repairing", "note": "replacement n1 is Ready with GPUs: deleting n0"},
               {"at": 1215.0, "state": "verifying"}, {"at": 1275.0, "state": "done"}]
    base = RemediationRun(speed=10.0, sweep_interval_s=30, threshold_s=60, rung="replace", timings=timings("replace"),
                          flip_at=1000.0, done_at=1275.0, record_state="done", history=history, target="n1",
                          target_ready_at=1179.0, replace={"mode": "surge", "replacement": "n1"})
    return dataclasses.replace(base, **changes)


def test_a_rung_is_measured_from_the_flip_to_back_in_service_and_split_by_its_history() -> None:
    from bench.time_to_repair import figure_of

    figure = figure_of("replace", _run())
    assert figure.value == 275.0 and figure.baseline == 160.0 and figure.met is False
    assert "threshold 60 + to the cordon 16 + to the drain's start 4 + drain 65 + surge until Ready 35 + deletion 35 " \
           "+ verification 60 s" in figure.note
    assert "as the app orders them, the floor would be 195 s" in figure.note


@pytest.mark.parametrize(("changes", "why"), [
    ({"error": "RuntimeError: the host never swept the fleet"}, "RuntimeError: the host never swept the fleet"),
    ({"record_state": "gave_up"}, "the run's remediation ended gave_up, not done"),
    ({"in_service": "n1 is not Ready"}, "not back in service: n1 is not Ready"),
    ({"replace": {"mode": "surge", "replacement": ""}, "target": "n0"}, "without a replacement node"),
], ids=["run-failed", "not-done", "not-in-service", "no-replacement"])
def test_a_rung_whose_run_did_not_repair_is_not_measured_with_the_reason(changes: dict[str, Any], why: str) -> None:
    from bench.time_to_repair import figure_of

    figure = figure_of("replace", _run(**changes))
    assert figure.value is None and why in figure.not_measured

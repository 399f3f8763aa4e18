"""The benchmark runner's own logic: figures, ratios, the table, the JSON, and request attribution."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import report
from bench.figures import measured, not_measured, ratio_at_most
from bench.reaction import next_sweep
from bench.requests import SWEEP_ROUTE, net_of_sweeps


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

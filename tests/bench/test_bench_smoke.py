"""Every benchmark runs at a tiny size and produces well-formed figures (no timing is asserted).

``make bench`` is only useful if each benchmark keeps running as the app changes, so this runs the
whole suite once at ``--scale tiny`` (small fleets, a fast simulated clock) and checks the shape of
what comes out: each benchmark yields figures, every figure is measured (a "not measured" at this
size means the benchmark itself is broken), values and ratios are finite numbers, and the JSON has
one entry per figure. The numbers are not judged: they are the benchmark's business, not a test's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from bench.__main__ import BENCHMARKS, main
from bench.figures import Figure
from realkube import build as realkube_build


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    out = tmp_path_factory.mktemp("bench") / "bench-results.json"
    assert main(["--scale", "tiny", "--out", str(out)]) == 0
    yield json.loads(out.read_text())


def _figures(results: dict[str, object]) -> list[dict[str, object]]:
    return list(results["figures"])  # type: ignore[call-overload]


def test_the_run_writes_one_json_entry_per_figure_with_unique_names(results: dict[str, object]) -> None:
    figures = _figures(results)
    names = [f["name"] for f in figures]
    assert len(names) == len(set(names)) and len(names) >= len(BENCHMARKS)
    assert results["scale"] == "tiny"


def test_every_figure_at_the_tiny_size_is_measured(results: dict[str, object]) -> None:
    missing = {f["name"]: f["not_measured"] for f in _figures(results) if f["not_measured"]}
    if not realkube_build.built():
        # realkube_list needs the real control plane (make realkube-build), which `make test` does not
        # build: there it must say so, and only there may it be unmeasured.
        real = {name: why for name, why in missing.items() if "kube-apiserver" in name}
        assert real and all("make realkube-build" in str(why) for why in real.values()), real
        missing = {name: why for name, why in missing.items() if name not in real}
    assert missing == {}


def test_realkube_list_without_the_real_control_plane_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import realkube_list
    from bench.scale import TINY

    monkeypatch.setattr(realkube_build, "built", lambda: False)
    figures = realkube_list.run(TINY)
    assert len(figures) == 2 * len(TINY.realkube_nodes)
    assert all(f.value is None and "make realkube-build" in f.not_measured for f in figures)


def _unbuilt_realkube(figure: dict[str, object]) -> bool:
    """realkube_list's figures on a machine without the real control plane (make test runs before the
    lane builds it): not measured, saying how to build it (test_every_figure_at_the_tiny_size_is_measured)."""
    return not realkube_build.built() and "kube-apiserver" in str(figure["name"]) and bool(figure["not_measured"])


def test_every_measured_value_and_ratio_is_a_finite_number_with_a_unit(results: dict[str, object]) -> None:
    for f in _figures(results):
        assert isinstance(f["unit"], str) and f["unit"], f
        if _unbuilt_realkube(f):
            continue
        assert isinstance(f["value"], int | float) and math.isfinite(f["value"]), f
        if f["baseline_value"] is not None:
            assert math.isfinite(f["baseline_value"]), f  # type: ignore[arg-type]
            if f["baseline_value"]:
                assert f["ratio"] == pytest.approx(f["value"] / f["baseline_value"], rel=1e-4), f  # type: ignore[operator]


@pytest.mark.parametrize("prefix", ["function_app cold import", "sweep CPU per node", "sweep peak memory",
                                    "simulator share", "(real kube-apiserver,", "kube-apiserver wall time per page",
                                    "reaction:", "drain of a node", "pool migration vs its critical path",
                                    "time to repair vs its physical floor, restart rung",
                                    "time to repair vs its physical floor, reimage rung",
                                    "time to repair vs its physical floor, replace rung",
                                    "ARM writes per migrated pool", "requests per remediation", "requests per migration"])
def test_each_benchmark_contributes_its_figures(results: dict[str, object], prefix: str) -> None:
    assert any(prefix in str(f["name"]) for f in _figures(results)), prefix


def test_the_figures_that_have_a_natural_baseline_carry_it(results: dict[str, object]) -> None:
    with_baseline = {str(f["name"]) for f in _figures(results) if f["baseline_value"] is not None}
    prefixes = ["function_app cold import time", "sweep CPU per node, ", "drain of a node",
                "pool migration vs its critical path", *(f"time to repair vs its physical floor, {rung} rung"
                                                         for rung in ("restart", "reimage", "replace"))]
    if realkube_build.built():
        prefixes.append("client CPU per node, our msgspec client")
    for prefix in prefixes:
        assert any(name.startswith(prefix) or prefix in name for name in with_baseline), prefix


def test_a_figure_round_trips_through_the_json_shape() -> None:
    figure = Figure(name="n", unit="s", value=1.0, baseline=2.0, baseline_name="b")
    assert json.loads(json.dumps(figure.as_json()))["ratio"] == 0.5

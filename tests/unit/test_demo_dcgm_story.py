"""The demo's DCGM story (demo/dcgm_story.py): its setting is one the app accepts, its end waits for the
app's refusals, and its report fails when a node a forgery names was touched. Fakes only: milliseconds."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from demo import dcgm_story as story
from demo.__main__ import _with_node
from shared.remediation import dcgm_config
from shared.remediation import dcgm_provenance as prov

SUB = "8f2d4c1e-5a3b-4c7d-9e0f-000000000001"
ENDPOINTS: dict[str, Any] = {"arm_endpoint": "https://127.0.0.1:4443/",
             "clusters": [{"name": name, "id": f"/subscriptions/{SUB}/resourceGroups/rg-{name}/providers/"
                                                f"Microsoft.ContainerService/managedClusters/{name}"}
                          for name in ("ml-serve", "ml-eval", "research-lab", "ml-train")]}
VICTIMS = {"pod-annotations": "aks-vision-1-vmss000000", "podmonitor": "aks-vision-1-vmss000001",
           "cluster-alias": "aks-eval-2-vmss000000"}
XID_NODE = "aks-infer-3-vmss000000"


class _Workspace:
    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = answers

    def query(self, promql: str, *, at: float | None = None) -> list[Any]:
        return next((v for k, v in self.answers.items() if k in promql), [])


def _ctx(*, cordoned: frozenset[str] = frozenset()) -> Any:
    settings = story.signal_settings(ENDPOINTS)
    targets = dcgm_config.parse_targets(settings["SIGNALS_PROMETHEUS"], subscriptions=(SUB,))
    xid = {"__name__": story.XID, "cluster": "ml-serve", "gpu": "0", "instance": XID_NODE, "job": "dcgm-exporter"}
    workspace = _Workspace({
        "min_over_time": [SimpleNamespace(labels={}, value=0.0)],
        "max_over_time": [SimpleNamespace(labels={}, value=79.0)],
        XID_NODE: [SimpleNamespace(labels=xid, value=79.0)],
        VICTIMS["cluster-alias"]: [SimpleNamespace(labels={**xid, "instance": VICTIMS["cluster-alias"]}, value=79.0)],
    })
    kube = SimpleNamespace(get_node=lambda name: SimpleNamespace(unschedulable=name in cordoned))
    access = SimpleNamespace(metrics=lambda endpoint: workspace, kube=lambda cluster_id: kube)
    return SimpleNamespace(settings=SimpleNamespace(signals_prometheus=targets), access=access)


def _played(ctx: Any) -> story.DcgmStory:
    s = story.DcgmStory(ctx, ENDPOINTS)
    s.on_played({"path": "/dcgm/xid", "cluster": "ml-serve"}, XID_NODE, {}, at=100.0)
    for f in story.FORGERIES:
        labels = {"instance": VICTIMS[f["forgery"]]} if f["path"] == "/dcgm/tenant-series" else None
        s.on_played(f, VICTIMS[f["forgery"]], {"labels": labels} if labels else {}, at=100.0 + float(f["at"]) / 100)
    s.watch()
    return s


def _refused(code: str, node: str) -> dict[str, Any]:
    return {"type": story.SERIES_REFUSED, "data": {"code": code, "count": 1, "examples": [f'{{instance="{node}"}}: why']}}


SERVE_ID = f"/subscriptions/{SUB}/resourceGroups/rg-ml-serve/providers/Microsoft.ContainerService/managedClusters/ml-serve"
INACTIVE: dict[str, Any] = {"type": story.COUNTERS_INACTIVE,
                            "data": {"cluster": SERVE_ID, "exporter": "managed", "inactive": ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"],
                                     "exported": [story.XID], "remedy": "run your own"}}
EVENTS: list[dict[str, Any]] = [_refused(prov.FOREIGN_LABELS, VICTIMS["pod-annotations"]),
                                _refused(prov.PHANTOM_NODE, VICTIMS["cluster-alias"]), INACTIVE]
REPAIRED = [SimpleNamespace(kind="remediation", state="done",
                            data={"node": XID_NODE, "signal": "dcgm", "condition": "Xid79", "policy_row": "xid:79"})]
CLEAN = {"repairs": [{"node": XID_NODE, "rung": "restart"}], "nodes_removed": [], "terminations": [],
         "max_cordoned_per_pool": {"ml-serve/vision": 0}, "max_disrupted_per_pool": {"ml-serve/vision": 0},
         "pdb_violations": [], "pods_killed_without_eviction": [], "workload_pods_lost": []}


def _report(s: story.DcgmStory, *, events: list[dict[str, Any]] = EVENTS, oracles: dict[str, Any] = CLEAN) -> bool:
    _, ok = s.report_lines(records=REPAIRED, events=events, oracles=oracles, host_log=None,
                           setting=story.signal_settings(ENDPOINTS)["SIGNALS_PROMETHEUS"])
    return ok


def test_the_demos_dcgm_setting_is_the_managed_default_the_app_accepts() -> None:
    raw = json.loads(story.signal_settings(ENDPOINTS)["SIGNALS_PROMETHEUS"])
    assert all(set(body) == {"endpoint"} for body in raw.values())
    targets = dcgm_config.parse_targets(json.dumps(raw), subscriptions=(SUB,))
    assert {(t.exporter, t.job, t.node_label) for t in targets.values()} == {("managed", "dcgm-exporter", "instance")}
    assert len(targets) == len(story.DCGM_CLUSTERS)


def test_every_forgery_is_expected_to_be_refused_with_a_known_code_or_said_to_have_none() -> None:
    assert {str(f["forgery"]) for f in story.FORGERIES} == set(story.EXPECTED_CODE)
    assert {c for c in story.EXPECTED_CODE.values() if c} <= set(prov.REFUSAL_CODES)


def test_the_story_waits_for_each_expected_refusal_and_for_the_judging_time() -> None:
    s = _played(_ctx())
    late = s.last_at + story.JUDGED_AFTER_S
    assert s.missing([], now=late) == [f"no SeriesRefused {prov.FOREIGN_LABELS} yet", f"no SeriesRefused {prov.PHANTOM_NODE} yet"]
    assert s.missing(EVENTS, now=late - 1) == [f"forgeries judged for {story.JUDGED_AFTER_S - 1} of {story.JUDGED_AFTER_S} "
                                               "fleet seconds"]
    assert s.missing(EVENTS, now=late) == []


def test_an_untouched_fleet_with_every_refusal_makes_the_report_hold() -> None:
    lines, ok = _played(_ctx()).report_lines(records=REPAIRED, events=EVENTS, oracles=CLEAN, host_log=None,
                                             setting=story.signal_settings(ENDPOINTS)["SIGNALS_PROMETHEUS"])
    text = "\n".join(lines)
    assert ok, text
    assert f'instance="{XID_NODE}"' in text and "Hostname label: absent" in text and "policy row xid:79" in text
    assert f"refused: {prov.FOREIGN_LABELS}" in text and f"refused: {prov.PHANTOM_NODE}" in text
    assert "reads 0 (max over the same window: 79)" in text


@pytest.mark.parametrize("touched", [
    pytest.param({"repairs": [{"node": VICTIMS["podmonitor"], "rung": "restart"}]}, id="a victim restarted"),
    pytest.param({"terminations": [{"node": VICTIMS["pod-annotations"], "cause": "eviction"}]}, id="a victim drained"),
    pytest.param({"nodes_removed": [{"node": VICTIMS["cluster-alias"]}]}, id="the aliased cluster's node removed"),
    pytest.param({"max_cordoned_per_pool": {"ml-serve/vision": 1}}, id="the victims' pool cordoned once"),
    pytest.param({"pdb_violations": [{"pdb": "vision-api"}]}, id="a PDB violated"),
])
def test_a_node_a_forgery_names_being_touched_fails_the_report(touched: dict[str, Any]) -> None:
    assert not _report(_played(_ctx()), oracles={**CLEAN, **touched})


def test_a_victim_cordoned_now_or_a_missing_refusal_fails_the_report() -> None:
    assert not _report(_played(_ctx(cordoned=frozenset({VICTIMS["podmonitor"]}))))
    assert not _report(_played(_ctx()), events=[e for e in EVENTS if e["data"].get("code") != prov.PHANTOM_NODE])


def test_signal_bodies_get_the_resolved_node_wherever_they_name_it() -> None:
    body = {"pod_labels": {"instance": "{node}"}, "drop": ["{node}", 1], "value": 79}
    assert _with_node(body, "aks-n-0") == {"pod_labels": {"instance": "aks-n-0"}, "drop": ["aks-n-0", 1], "value": 79}


def test_unhealthy_events_about_the_exact_shape_victim_are_said_but_disrupt_nothing() -> None:
    published = [*EVENTS, {"type": story.UNHEALTHY, "data": {"node": VICTIMS["podmonitor"], "condition": "Xid79"}}]
    lines, ok = _played(_ctx()).report_lines(records=REPAIRED, events=published, oracles=CLEAN, host_log=None,
                                             setting=story.signal_settings(ENDPOINTS)["SIGNALS_PROMETHEUS"])
    assert ok
    assert any(f"publish 1 {story.UNHEALTHY} event(s)" in line for line in lines)


def test_only_this_runs_part_of_the_host_log_is_counted(tmp_path: Path) -> None:
    sweep = "x steward.sweep: sweep: {'dcgm': {'refused': {'phantom-node': 2}, 'contested': 0}}\n"
    log = tmp_path / "host-1.log"
    log.write_text(sweep * 3)
    s = _played(_ctx())
    s.log_offset = len(sweep) * 2
    lines, _ = s.report_lines(records=REPAIRED, events=EVENTS, oracles=CLEAN, host_log=log,
                              setting=story.signal_settings(ENDPOINTS)["SIGNALS_PROMETHEUS"])
    assert any("host log, 1 sweeps" in line and "phantom-node in 1 sweeps (up to 2 series each)" in line for line in lines)

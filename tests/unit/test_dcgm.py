"""DCGM error counters from an Azure Monitor workspace: what the sweep publishes and what admission does,
for every XID row and every counter row, nothing at all from a workspace that fails, and nothing from a
series that is not the exporter's own (a tenant's, another cluster's, a phantom node's).

The workspace is the simulator's PromQL model (sim/prometheus/api.py, sim/prometheus/promql.py) answering the app's own
queries in AKS managed Prometheus's shape (``job="dcgm-exporter"``, the node in ``instance``, labelkeep
``cluster|instance|gpu|job|__name__``, the default CSV's counters), so a query the subset (or Azure's
one-``__name__``-matcher rule) would refuse fails here too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from shared.kernel.errors import Forbidden, Invalid, Transient
from shared.kernel.timefmt import iso
from shared.remediation import admission, dcgm, dcgm_recheck, sweep
from shared.remediation import dcgm_provenance as prov
from shared.remediation import signal_policy as sp
from shared.remediation.dcgm_config import PrometheusTarget, parse_targets
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import KIND, UNHEALTHY_EVENT, Rung, State
from shared.remediation.signals import ladder_for
from shared.settings import SettingError, Settings
from sim.prometheus.api import ExporterShape
from tests.fakes.metrics import FakeWorkspace
from tests.unit.fakes_remediation import CLUSTER, SUB, FakeAccess, Fleet

ENDPOINT = "https://ws-1.eastus.prometheus.monitor.azure.com"
THRESHOLD = 300
POLICY = RemediationPolicy(default_threshold_s=THRESHOLD)
TARGET = PrometheusTarget(cluster_id=CLUSTER, endpoint=ENDPOINT, cluster_value="c1")
CUSTOM_JOB = "gpu-monitoring/dcgm-exporter"
CUSTOM = PrometheusTarget(cluster_id=CLUSTER, endpoint=ENDPOINT, cluster_value="c1", exporter="custom", job=CUSTOM_JOB,
                          node_label="Hostname", namespace="gpu-monitoring", counters=tuple(prov.POLICY_METRICS))


class DcgmAccess(FakeAccess):
    def __init__(self, fleet: DcgmFleet) -> None:
        super().__init__(fleet)
        self.workspace = fleet.workspace

    def metrics(self, endpoint: str) -> FakeWorkspace:
        if endpoint.lower() != ENDPOINT.lower():
            raise Forbidden(endpoint)
        return self.workspace


class DcgmFleet(Fleet):
    """Three GPU nodes of cluster c1 exporting through AKS's managed exporter (or an operator's own, with
    ``custom``); a node of the same name in another cluster sends to the same workspace."""

    def __init__(self, *, overrides: Mapping[int, str] | None = None, policy: RemediationPolicy = POLICY,
                 custom: bool = False) -> None:
        super().__init__(policy=policy)
        self.workspace = FakeWorkspace(self.clock.now)
        self.overrides = dict(overrides or {})
        self.target = CUSTOM if custom else TARGET
        shape = ExporterShape.custom(job=CUSTOM_JOB) if custom else ExporterShape()
        self.nodes = self.pool(3)
        if not custom:  # AKS labels the nodes its managed exporter runs on (the managed scrape keeps only those)
            for name in self.nodes:
                view = self.kube.nodes[name]
                self.kube.nodes[name] = msgspec.structs.replace(
                    view, labels={**view.labels, prov.EXPORTER_NODE_LABEL: "enabled"})
        for name in self.nodes:
            self.workspace.model.add_node(name, gpus=2, cluster="c1", shape=shape)
        self.workspace.model.add_node(self.nodes[0], gpus=2, cluster="other-cluster")  # same name, other cluster

    def settings(self, *, paused: bool = False) -> Settings:
        return replace(super().settings(paused=paused), signals_prometheus={CLUSTER.lower(): self.target},
                       xid_overrides=self.overrides, remediation=self.policy)

    def ctx(self, instance: str = "host-a", *, paused: bool = False) -> Any:
        return replace(super().ctx(instance, paused=paused), access=DcgmAccess(self))

    def sweep_twice(self) -> sweep.SweepReport:
        """A first sighting, then a sweep one threshold later: a fault still there is due."""
        sweep.sweep(self.ctx())
        self.clock.advance(THRESHOLD)
        return sweep.sweep(self.ctx())

    def unhealthy(self) -> list[dict[str, Any]]:
        return self.events.delivered(UNHEALTHY_EVENT)

    def forge(self, node: str, *, xid: int = 79, gpu: str = "0", cluster_label: str = "c1", **labels: str) -> None:
        """A PodMonitor's series with honorLabels and every other label dropped: the managed shape exactly."""
        self.workspace.model.add_scraped("", exposed={"__name__": sp.XID_METRIC, "job": prov.MANAGED_JOB,
                                                      "instance": node, "gpu": gpu, "cluster": cluster_label, **labels},
                                         target={}, value=xid, honor=True)


def _expected_ladder(action: str) -> list[str]:
    return [str(r) for r in ladder_for(action, tuple(POLICY.ladder))]


# --------------------------------------------------------------------------- every XID row
@pytest.mark.parametrize("row", sp.XID_TABLE, ids=lambda r: f"xid{r.xid}")
def test_every_xid_row_is_published_and_admitted_as_its_row_says(row: sp.XidRow) -> None:
    fleet = DcgmFleet()
    node = fleet.nodes[1]
    fleet.workspace.model.inject_xid(node, 1, row.xid, cluster="c1")
    report = fleet.sweep_twice()
    assert report.errors == []
    events = fleet.unhealthy()
    if row.action == sp.IGNORE:
        assert events == [] and fleet.ledger.list(KIND) == []  # an application fault: nothing, not even a record
        return
    assert len(events) == 1, events
    data = events[0]["data"]
    assert (data["node"], data["condition"], data["signal"], data["xid"], data["gpu"]) == (node, f"Xid{row.xid}", "dcgm",
                                                                                           row.xid, "1")
    assert (data["policy_row"], data["action"]) == (row.id, row.action)
    handled = admission.handle_event(events[0], fleet.ctx())
    if row.action == sp.RECORD_ONLY:
        assert handled.outcome == admission.Handling.RECORDED, handled
        assert fleet.ledger.list(KIND) == []
        recorded = fleet.events.delivered("Steward.Remediation.SignalRecorded")
        assert [e["data"]["policy_row"] for e in recorded] == [row.id]
        fleet.events.published.clear()
        sweep.sweep(fleet.ctx())  # recorded once: the sweep has nothing more to say about it
        assert fleet.unhealthy() == []
        return
    assert handled.outcome == admission.Handling.ADMITTED, handled
    [record] = fleet.ledger.list(KIND)
    assert (record.data["signal"], record.data["policy_row"], record.data["condition"]) == ("dcgm", row.id, f"Xid{row.xid}")
    assert record.data["ladder"] == _expected_ladder(row.action)


def test_an_xid_override_wins_over_the_table() -> None:
    fleet = DcgmFleet(overrides={13: sp.REPLACE})
    fleet.workspace.model.inject_xid(fleet.nodes[0], 0, 13, cluster="c1")
    fleet.sweep_twice()
    [event] = fleet.unhealthy()
    assert event["data"]["policy_row"] == "xid:13:override"
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    assert fleet.ledger.list(KIND)[0].data["ladder"] == ["replace"]


def test_an_xid_the_table_does_not_know_is_recorded_only() -> None:
    fleet = DcgmFleet()
    fleet.workspace.model.inject_xid(fleet.nodes[0], 0, 999, cluster="c1")
    fleet.sweep_twice()
    [event] = fleet.unhealthy()
    assert event["data"]["policy_row"] == "xid:default"
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.RECORDED


# --------------------------------------------------------------------------- every counter row
@pytest.mark.parametrize("row", sp.COUNTER_TABLE, ids=lambda r: r.metric)
def test_every_counter_row_is_published_and_admitted_as_its_row_says_from_an_exporter_that_exports_it(
        row: sp.CounterRow) -> None:
    fleet = DcgmFleet(custom=True)
    node = fleet.nodes[2]
    sweep.sweep(fleet.ctx())  # the node is known at 0 (the lifetime counter's baseline)
    fleet.workspace.model.set(node, 0, row.metric, 3, cluster="c1")
    report = fleet.sweep_twice()
    assert report.errors == []
    [event] = fleet.unhealthy()
    data = event["data"]
    assert (data["condition"], data["metric"], data["value"], data["policy_row"]) == (row.metric, row.metric, 3.0, row.id)
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    [record] = fleet.ledger.list(KIND)
    assert record.data["ladder"] == _expected_ladder(row.action)


def test_a_lifetime_count_seen_first_is_history_not_a_fault_and_its_growth_is_one_until_handled() -> None:
    fleet = DcgmFleet(custom=True)
    node = fleet.nodes[0]
    fleet.workspace.model.set(node, 0, sp.DBE_AGGREGATE, 7, cluster="c1")
    fleet.sweep_twice()
    assert fleet.unhealthy() == []
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert row is not None and row.data["baselines"]["0"] == 7.0
    fleet.workspace.model.set(node, 0, sp.DBE_AGGREGATE, 9, cluster="c1")
    fleet.sweep_twice()
    [event] = fleet.unhealthy()
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    sweep.sweep(fleet.ctx())  # while its remediation runs, the growth stays a fault its steps can re-read
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert row is not None and row.data["baselines"]["0"] == 7.0 and sp.DBE_AGGREGATE in row.data["seen"]
    [record] = fleet.ledger.list(KIND)
    assert dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node, key=sp.DBE_AGGREGATE)[0] is True
    fleet.ledger.save(record.moved(State.DONE, at=fleet.clock.now()))
    sweep.sweep(fleet.ctx())  # the remediation ended: the handled growth becomes the new baseline
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert row is not None and row.data["baselines"]["0"] == 9.0 and sp.DBE_AGGREGATE not in row.data["seen"]


# --------------------------------------------------------------------------- debouncing and re-checks
def test_a_fault_seen_once_is_not_published_and_one_that_cleared_is_forgotten() -> None:
    fleet = DcgmFleet()
    model, node = fleet.workspace.model, fleet.nodes[0]
    model.inject_xid(node, 0, 79, cluster="c1")
    report = sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == [] and report.dcgm["pending"] == 1
    first = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node)).data["seen"]["Xid79"]  # type: ignore[union-attr]
    fleet.clock.advance(THRESHOLD - 1)
    sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == []
    model.reboot(node, cluster="c1")
    fleet.clock.advance(30)  # the next scrape
    sweep.sweep(fleet.ctx())  # cleared: forgotten
    assert fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node)).data["seen"] == {}  # type: ignore[union-attr]
    model.inject_xid(node, 0, 79, cluster="c1")
    fleet.clock.advance(30)  # scraped
    fleet.sweep_twice()
    [event] = fleet.unhealthy()
    assert event["data"]["since"] == iso(first + THRESHOLD - 1 + 60)  # a new first sighting, a new fault


def test_a_last_xid_gauge_flipping_between_two_faults_keeps_each_first_sighting_and_comes_due() -> None:
    """Soak seed 952019: a GPU's last-XID gauge read 48 (an ECC storm) at one sweep and 95 (a forged copy) at
    the next. Each value was forgotten when the other showed, so neither ever reached its threshold and the
    storm was never acted on, nor reported. A value is kept while its counter shows another fault, so it
    comes due when it shows again past its threshold; the window re-check then judges every sample and copy
    as for any fault (here it holds: the lowest XID over the window is 48 in every sample)."""
    fleet = DcgmFleet()
    model, node = fleet.workspace.model, fleet.nodes[0]
    step = THRESHOLD / 5
    model.inject_xid(node, 0, 48, cluster="c1")
    sweep.sweep(fleet.ctx())
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert row is not None
    first = row.data["seen"]["Xid48"]
    for i in range(1, 7):  # flips at every sweep, until past the threshold
        model.inject_xid(node, 0, 95 if i % 2 else 48, cluster="c1")
        fleet.clock.advance(step)
        sweep.sweep(fleet.ctx())
        seen = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node)).data["seen"]  # type: ignore[union-attr]
        assert seen["Xid48"] == first, f"sweep {i}: the first sighting of XID 48 was forgotten"
    [event] = [e for e in fleet.unhealthy() if e["data"]["condition"] == "Xid48"]
    assert event["data"]["since"] == iso(first)


def test_a_fault_whose_counter_shows_nothing_any_more_is_still_forgotten() -> None:
    fleet = DcgmFleet()
    model, node = fleet.workspace.model, fleet.nodes[0]
    model.inject_xid(node, 0, 48, cluster="c1")
    sweep.sweep(fleet.ctx())
    model.inject_xid(node, 0, 95, cluster="c1")
    fleet.clock.advance(60)
    sweep.sweep(fleet.ctx())
    model.reboot(node, cluster="c1")
    fleet.clock.advance(60)
    sweep.sweep(fleet.ctx())
    assert fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node)).data["seen"] == {}  # type: ignore[union-attr]


def test_admission_trusts_the_workspace_not_the_event() -> None:
    fleet = DcgmFleet()
    fleet.workspace.model.inject_xid(fleet.nodes[0], 0, 79, cluster="c1")
    fleet.sweep_twice()
    [event] = fleet.unhealthy()
    fleet.workspace.model.reboot(fleet.nodes[0], cluster="c1")  # gone by the time the event arrives
    handled = admission.handle_event(event, fleet.ctx())
    assert handled.outcome == admission.Handling.IGNORED and "does not show" in handled.detail
    forged = json.loads(json.dumps(event))
    forged["data"]["condition"] = "Xid48"
    forged["id"] = "forged"
    assert admission.handle_event(forged, fleet.ctx()).outcome == admission.Handling.IGNORED
    assert fleet.ledger.list(KIND) == []
    recheck = fleet.workspace.queries[-1]
    assert recheck.startswith("min_over_time(") and f'instance="{fleet.nodes[0]}"' in recheck
    assert 'cluster="c1"' in recheck and 'job="dcgm-exporter"' in recheck  # one node, its exporter, its window


def test_a_workspace_that_fails_at_admission_is_retried_never_read_as_healthy() -> None:
    fleet = DcgmFleet()
    fleet.workspace.model.inject_xid(fleet.nodes[0], 0, 79, cluster="c1")
    fleet.sweep_twice()
    [event] = fleet.unhealthy()
    fleet.workspace.error = Transient("HTTP 503 unavailable")
    with pytest.raises(Transient):
        admission.handle_event(event, fleet.ctx())
    fleet.workspace.error = None
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED


def test_restart_then_replace_escalates_when_the_fault_comes_back_after_a_done_restart() -> None:
    fleet = DcgmFleet()
    node = fleet.nodes[0]
    fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    fleet.sweep_twice()
    admission.handle_event(fleet.unhealthy()[0], fleet.ctx())
    [first] = fleet.ledger.list(KIND)
    assert first.data["ladder"] == ["restart", "replace"]
    fleet.ledger.save(first.moved(State.DONE, at=fleet.clock.now(), rung_index=0))  # the restart repaired it
    fleet.clock.advance(POLICY.cooldown_s)
    fleet.events.published.clear()
    fleet.sweep_twice()  # still there after the remediation ended: a new fault
    [again] = fleet.unhealthy()
    assert again["id"] != first.data["fault"]
    assert admission.handle_event(again, fleet.ctx()).outcome == admission.Handling.ADMITTED
    second = next(r for r in fleet.ledger.list(KIND) if r.id != first.id)
    assert second.data["ladder"] == [Rung.REPLACE] and second.data["policy_row"] == "xid:79:repeat"


# --------------------------------------------------------------------------- nothing from missing data
@pytest.mark.parametrize("error", [Transient("HTTP 503 unavailable"), Invalid("HTTP 400 bad_data", code="bad_data"),
                                   Forbidden("HTTP 401"), Transient("partial answer, the server warned: x")],
                         ids=["outage", "bad-request", "unauthorized", "partial"])
def test_a_failing_workspace_publishes_nothing_counts_nothing_and_reports_its_error(error: Exception) -> None:
    fleet = DcgmFleet()
    fleet.workspace.model.inject_xid(fleet.nodes[0], 0, 79, cluster="c1")
    sweep.sweep(fleet.ctx())
    fleet.workspace.error = error
    fleet.clock.advance(THRESHOLD)
    report = sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == []
    assert [e for e in report.errors if ENDPOINT in e and type(error).__name__ in e]
    found = dcgm.sweep(fleet.ctx(), [fleet.cluster()], policy=POLICY,
                       known={CLUSTER.lower(): dict.fromkeys(fleet.nodes)})
    assert (found.faults, found.observations, found.pending) == ([], {}, 0)  # nor anything for the breaker
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, fleet.nodes[0]))
    assert row is not None and "Xid79" in row.data["seen"]  # not forgotten either: nothing was learnt
    fleet.workspace.error = None
    sweep.sweep(fleet.ctx())
    assert [e["data"]["condition"] for e in fleet.unhealthy()] == ["Xid79"]


def test_a_node_without_series_is_neither_healthy_nor_faulty() -> None:
    fleet = DcgmFleet()
    node = fleet.nodes[0]
    fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    sweep.sweep(fleet.ctx())
    fleet.workspace.model.remove_node(node, cluster="c1")
    fleet.clock.advance(THRESHOLD)
    report = sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == [] and report.dcgm["nodes"] == 2
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert row is not None and "Xid79" in row.data["seen"]


def test_one_query_per_workspace_and_series_of_other_clusters_are_not_ours() -> None:
    fleet = DcgmFleet()
    fleet.workspace.model.inject_xid(fleet.nodes[0], 0, 79, cluster="other-cluster")
    report = fleet.sweep_twice()
    assert len(fleet.workspace.queries) == 2 and fleet.unhealthy() == []
    assert fleet.workspace.queries[0] == ('{__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_ROW_REMAP_FAILURE", '
                                          'job="dcgm-exporter"}')
    assert report.dcgm["refused"] == {}  # another cluster's series: not ours, and no forgery either


# --------------------------------------------------------------------------- the setting
def _settings(value: str) -> dict[str, str]:
    return {"FLEET_SUBSCRIPTIONS": SUB, "EVENTGRID_TOPIC_ENDPOINT": "https://t.example/api/events",
            "AzureWebJobsStorage": "UseDevelopmentStorage=true", "SIGNALS_PROMETHEUS": value}


def test_the_setting_is_read_with_its_defaults() -> None:
    from shared.settings import load

    settings = load({**_settings(json.dumps({CLUSTER: {"endpoint": ENDPOINT + "/"}})), "SIGNALS_XID_OVERRIDES": "13=replace"})
    target = settings.signals_prometheus[CLUSTER.lower()]
    assert (target.endpoint, target.exporter, target.job, target.node_label, target.cluster_label,
            target.cluster_value) == (ENDPOINT, "managed", "dcgm-exporter", "instance", "cluster", "c1")
    assert target.counters == (sp.XID_METRIC, sp.REMAP_FAILURE)
    assert target.inactive == (sp.DBE_VOLATILE, sp.DBE_AGGREGATE, sp.REMAP_PENDING)
    assert settings.xid_overrides == {13: "replace"}
    assert load(_settings("")).signals_prometheus == {}


OTHER = CLUSTER.replace("/c1", "/c2")


@pytest.mark.parametrize(("value", "says"), [
    ("not json", "JSON object"),
    ("[1]", "JSON object"),
    (json.dumps({"/subscriptions/x/nope": {"endpoint": ENDPOINT}}), "not a managed cluster ARM id"),
    (json.dumps({CLUSTER.replace(SUB, "00000000-0000-0000-0000-00000000ffff"): {"endpoint": ENDPOINT}}),
     "FLEET_SUBSCRIPTIONS"),
    (json.dumps({CLUSTER: "https://x"}), "must be an object"),
    (json.dumps({CLUSTER: {"endpoint": "http://ws.example"}}), "https://"),
    (json.dumps({CLUSTER: {}}), "https://"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "nodelabel": "x"}}), "unknown keys"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "nodeLabel": "Hostname"}}), "fixed by AKS's managed exporter"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "exporter": "mine"}}), "exporter must be"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "exporter": "custom", "counters": [sp.XID_METRIC]}}), "needs job"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "exporter": "custom", "job": "j"}}), "needs counters"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "exporter": "custom", "job": "j", "counters": ["DCGM_FI_DEV_GPU_UTIL"]}}),
     "not read by the policy tables"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "exporter": "custom", "job": "j", "counters": [sp.XID_METRIC],
                           "nodeLabel": "host-name"}}), "label name"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "windowSeconds": 10}}), "windowSeconds"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "clusterValue": ""}}), "clusterValue"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "clusterValue": "x"}, OTHER: {"endpoint": ENDPOINT, "clusterValue": "x"}}),
     "distinct"),
    (json.dumps({CLUSTER: {"endpoint": ENDPOINT, "clusterLabel": ""}, OTHER: {"endpoint": ENDPOINT, "clusterLabel": ""}}),
     "clusterLabel"),
])
def test_a_bad_setting_is_refused_naming_it(value: str, says: str) -> None:
    with pytest.raises(SettingError, match="SIGNALS_PROMETHEUS") as info:
        parse_targets(value, subscriptions=(SUB,))
    assert says in str(info.value)


def test_the_app_never_queries_an_endpoint_the_setting_does_not_name() -> None:
    from shared.wiring import FleetAccess

    fleet = DcgmFleet()
    access = FleetAccess(fleet.settings(), metrics_factory=lambda endpoint: fleet.workspace)
    assert access.metrics(ENDPOINT + "/") is fleet.workspace
    with pytest.raises(Forbidden):
        access.metrics("https://attacker.example")


def test_a_storm_is_one_remediation_decided_by_the_fault_that_asks_the_most() -> None:
    fleet = DcgmFleet(custom=True)
    node = fleet.nodes[0]
    sweep.sweep(fleet.ctx())  # the lifetime count is known at 0
    fleet.workspace.model.ecc_storm(node, 0, cluster="c1")
    fleet.sweep_twice()
    events = fleet.unhealthy()
    assert sorted(e["data"]["condition"] for e in events) == sorted(
        ["Xid48", sp.DBE_VOLATILE, sp.DBE_AGGREGATE, sp.REMAP_PENDING])
    outcomes = {e["data"]["condition"]: admission.handle_event(e, fleet.ctx()).outcome
                for e in sorted(events, key=lambda e: e["data"]["condition"] != sp.REMAP_PENDING)}
    assert outcomes[sp.REMAP_PENDING] == admission.Handling.IGNORED  # a restart-only row never takes the turn
    assert sorted(outcomes.values()).count(admission.Handling.ADMITTED) == 1
    [record] = fleet.ledger.list(KIND)
    assert record.data["ladder"] == ["restart", "replace"]


# --------------------------------------------------------------------------- an XID a later XID replaced
def _storm_confirmed_then_replaced(fleet: DcgmFleet, *, later_xid: int = 13) -> tuple[str, dict[str, Any]]:
    """Soak seed 964797's story: an ECC storm's XID 48 is confirmed and published; then an application's
    XID (13: the table ignores it) replaces it on the last-XID gauge, and a whole window passes (the event
    is still on its way: Event Grid delivered it 300 s late)."""
    model, node = fleet.workspace.model, fleet.nodes[0]
    model.ecc_storm(node, 0, cluster="c1")
    fleet.sweep_twice()
    [event] = [e for e in fleet.unhealthy() if e["data"]["condition"] == "Xid48"]
    fleet.events.published.clear()
    fleet.clock.advance(30)
    model.inject_xid(node, 0, later_xid, cluster="c1")
    fleet.clock.advance(270)
    return node, event


def test_an_xid_a_later_xid_replaced_after_it_was_confirmed_is_admitted_when_its_event_comes_late() -> None:
    fleet = DcgmFleet()
    node, event = _storm_confirmed_then_replaced(fleet)
    handled = admission.handle_event(event, fleet.ctx())
    assert handled.outcome == admission.Handling.ADMITTED, handled
    [record] = fleet.ledger.list(KIND)
    assert (record.data["node"], record.data["condition"]) == (node, "Xid48")
    assert "a later XID has replaced it" in record.data["signal_detail"], record.data["signal_detail"]


def test_the_sweep_publishes_an_xid_a_later_xid_replaced_again_until_it_is_handled() -> None:
    """The events were lost, or refused: the sweep keeps saying so while the workspace stands behind it."""
    fleet = DcgmFleet()
    node, event = _storm_confirmed_then_replaced(fleet)
    sweep.sweep(fleet.ctx())
    [again] = fleet.unhealthy()
    assert (again["data"]["node"], again["data"]["condition"], again["data"]["since"], again["id"]) == (
        node, "Xid48", event["data"]["since"], event["id"])
    assert admission.handle_event(again, fleet.ctx()).outcome == admission.Handling.ADMITTED
    fleet.events.published.clear()
    sweep.sweep(fleet.ctx())  # handled: its remediation's own re-reads decide from now on
    assert fleet.unhealthy() == []


def test_a_remediation_of_a_replaced_xid_finds_its_fault_still_there_until_a_reset() -> None:
    fleet = DcgmFleet()
    node, event = _storm_confirmed_then_replaced(fleet)
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    [record] = fleet.ledger.list(KIND)
    since = record.data["since_ts"]
    present, why = dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node, key="Xid48", since=since)
    assert present is True, why
    fleet.workspace.model.reboot(node, cluster="c1")  # the restart: the driver reloads, the gauge reads 0
    fleet.clock.advance(30)
    fleet.workspace.model.inject_xid(node, 0, 13, cluster="c1")  # and an application errs again at once
    fleet.clock.advance(120)
    present, why = dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node, key="Xid48", since=since)
    assert present is False, why


def test_an_xid_replaced_after_a_reset_is_gone_and_forgotten() -> None:
    fleet = DcgmFleet()
    model = fleet.workspace.model
    node, event = _storm_confirmed_then_replaced(fleet)
    model.reboot(node, cluster="c1")  # someone reset the GPU before the event came: the gauge read 0
    fleet.clock.advance(30)
    model.inject_xid(node, 0, 13, cluster="c1")
    fleet.clock.advance(120)
    handled = admission.handle_event(event, fleet.ctx())
    assert handled.outcome == admission.Handling.IGNORED, handled
    sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == [] and fleet.ledger.list(KIND) == []
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert row is not None and "Xid48" not in row.data["seen"] and "Xid48" not in row.data["confirmed"]


def test_an_xid_replaced_before_any_sweep_confirmed_it_is_not_acted_on() -> None:
    """The gauge keeps only the last XID: one replaced within its threshold was never confirmed by a window,
    and nothing proves it now (soak seed 950079: the limit of a design that resists forged series)."""
    fleet = DcgmFleet()
    model, node = fleet.workspace.model, fleet.nodes[0]
    model.ecc_storm(node, 0, cluster="c1")
    sweep.sweep(fleet.ctx())
    fleet.clock.advance(THRESHOLD / 2)
    model.inject_xid(node, 0, 13, cluster="c1")
    for _ in range(4):
        fleet.clock.advance(THRESHOLD / 2)
        sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == [] and fleet.ledger.list(KIND) == []


def test_a_row_claiming_a_confirmation_the_workspace_never_saw_admits_nothing() -> None:
    """A ``dcgm-node`` row is only a claim (anyone with the storage role can write one): the gauge read only an
    application's XID 13, and a row says XID 48 was first seen and confirmed before it."""
    fleet = DcgmFleet()
    model, node = fleet.workspace.model, fleet.nodes[0]
    model.inject_xid(node, 0, 13, cluster="c1")
    sweep.sweep(fleet.ctx())
    first = fleet.clock.now()
    row = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert row is None  # an ignored XID alone leaves nothing to remember
    fleet.ledger.create(dcgm.Record(kind=dcgm.DCGM_KIND, id=dcgm.node_key(CLUSTER, node), state="known", data={
        "cluster": CLUSTER, "node": node, "seen": {"Xid48": first}, "confirmed": {"Xid48": first + THRESHOLD}},
        created_at=first))
    fleet.clock.advance(THRESHOLD + 60)
    sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == []
    stored = fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, node))
    assert stored is not None and "Xid48" not in stored.data["seen"]  # the workspace did not bear it out
    forged = {"id": "forged", "source": fleet.settings().event_source, "type": UNHEALTHY_EVENT, "data": {
        "cluster": CLUSTER, "node": node, "condition": "Xid48", "signal": "dcgm", "since": iso(first)}}
    assert admission.handle_event(forged, fleet.ctx()).outcome == admission.Handling.IGNORED
    assert fleet.ledger.list(KIND) == []

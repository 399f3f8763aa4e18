"""Whose DCGM series the steward believes: the exporter's own, in the shape AKS managed Prometheus gives
them, about a node its cluster lists and ARM vouches for; never a tenant's, another cluster's or a
phantom's, and never one the node's own exporter contradicts (shared.remediation.dcgm_provenance).

Each forgery is built the way its scrape would really label it (sim/prometheus/api.py ``add_scraped``:
target labels, ``honor_labels``, metric relabelling), and judged by the app's own sweep and admission.
"""

from __future__ import annotations

import msgspec
import pytest

from shared.remediation import admission, breaker, dcgm, dcgm_recheck, dcgm_reports, sweep
from shared.remediation import dcgm_provenance as prov
from shared.remediation import signal_policy as sp
from shared.remediation.records import KIND
from tests.unit.fakes_remediation import CLUSTER
from tests.unit.test_dcgm import CUSTOM, TARGET, THRESHOLD, DcgmFleet

MANAGED_SHAPE = {"__name__": sp.XID_METRIC, "cluster": "c1", "instance": "aks-gpu-1", "gpu": "0", "job": "dcgm-exporter"}


# --------------------------------------------------------------------------- the shape, a table
@pytest.mark.parametrize(("labels", "code"), [
    (MANAGED_SHAPE, None),
    ({**MANAGED_SHAPE, "Hostname": "aks-gpu-1"}, prov.FOREIGN_LABELS),  # labelkeep drops it from the real one
    ({**MANAGED_SHAPE, "kubernetes_namespace": "team-a", "kubernetes_pod_name": "p"}, prov.FOREIGN_LABELS),
    ({**MANAGED_SHAPE, "exported_instance": "10.0.0.1:9400"}, prov.FOREIGN_LABELS),
    ({**MANAGED_SHAPE, "job": "kubernetes-pods"}, prov.WRONG_JOB),
    ({k: v for k, v in MANAGED_SHAPE.items() if k != "instance"}, prov.NO_NODE),
    ({**MANAGED_SHAPE, "cluster": "c2"}, prov.UNKNOWN_CLUSTER),
    ({**MANAGED_SHAPE, "gpu": "GPU-1234"}, prov.BAD_GPU),
], ids=["aks-shape", "hostname-kept", "pod-annotations", "renamed-clash", "other-job", "no-instance", "other-cluster",
        "uuid-as-gpu"])
def test_only_the_managed_scrapes_shape_is_the_exporters(labels: dict[str, str], code: str | None) -> None:
    verdict = prov.check(labels, [TARGET])
    if code is None:
        assert verdict == prov.Accepted(CLUSTER, "aks-gpu-1", "0", sp.XID_METRIC)
    else:
        assert isinstance(verdict, prov.Refused) and verdict.code == code, verdict


def test_a_custom_exporters_series_must_come_from_its_job_and_namespace() -> None:
    base = {"__name__": sp.XID_METRIC, "cluster": "c1", "Hostname": "aks-gpu-1", "gpu": "0", "job": CUSTOM.job,
            "namespace": "gpu-monitoring", "pod": "dcgm-exporter-x", "instance": "10.244.1.1:9400"}
    assert isinstance(prov.check(base, [CUSTOM]), prov.Accepted)
    assert prov.check({**base, "namespace": "team-a"}, [CUSTOM]).code == prov.WRONG_NAMESPACE  # type: ignore[union-attr]
    assert prov.check({**base, "exported_job": "x"}, [CUSTOM]).code == prov.FOREIGN_LABELS  # type: ignore[union-attr]


# --------------------------------------------------------------------------- forgeries, through the app
def test_a_tenant_pod_scraped_by_annotations_cannot_pose_as_the_exporter() -> None:
    fleet = DcgmFleet()
    victim = fleet.nodes[1]
    # ama-metrics' kubernetes-pods job labelmaps pod labels: pod labels job and instance set both...
    labels = fleet.workspace.model.add_scraped(
        "c1", exposed={"__name__": sp.XID_METRIC, "gpu": "0"},
        target={"job": "dcgm-exporter", "instance": victim, "kubernetes_namespace": "team-a",
                "kubernetes_pod_name": "evil"}, value=79)
    assert labels["job"] == "dcgm-exporter" and labels["instance"] == victim and labels["kubernetes_namespace"] == "team-a"
    for _ in range(4):
        report = fleet.sweep_twice()
    assert fleet.unhealthy() == [] and fleet.ledger.list(KIND) == []
    assert report.dcgm["refused"] == {prov.FOREIGN_LABELS: 1}
    [said] = fleet.events.delivered(dcgm_reports.SERIES_REFUSED_EVENT)  # once a day per workspace and code
    assert said["data"]["code"] == prov.FOREIGN_LABELS and victim in said["data"]["examples"][0]


def test_an_exact_copy_of_a_healthy_nodes_series_is_contradicted_by_its_own_exporter() -> None:
    fleet = DcgmFleet()
    victim = fleet.nodes[1]
    fleet.forge(victim, xid=79)  # a PodMonitor with honorLabels and labeldrop: the same series, interleaved
    for _ in range(3):
        fleet.sweep_twice()
        for event in fleet.unhealthy():
            handled = admission.handle_event(event, fleet.ctx())
            assert handled.outcome == admission.Handling.IGNORED and "every sample and copy" in handled.detail
        fleet.events.published.clear()
    assert fleet.ledger.list(KIND) == []
    assert dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=victim, key="Xid79")[0] is False


def test_copies_of_one_gpu_are_folded_with_min_so_all_must_agree() -> None:
    from shared.kernel.ports import Sample

    one = {"__name__": sp.XID_METRIC, "cluster": "c1", "instance": "aks-gpu-1", "gpu": "0", "job": "dcgm-exporter"}
    found, contested = dcgm.readings_by_node([Sample(one, 79.0, 0.0), Sample(dict(one), 0.0, 0.0)], [TARGET])
    assert found[(CLUSTER, "aks-gpu-1")] == [dcgm.Reading(sp.XID_METRIC, "0", 0.0)] and contested == 1


def test_a_cluster_alias_forgery_names_phantoms_or_is_contradicted() -> None:
    fleet = DcgmFleet()
    # another cluster's admin sets cluster_alias=c1: its own nodes appear under c1, where they do not exist...
    fleet.workspace.model.add_node("aks-other-7", gpus=2, cluster="c2")
    fleet.workspace.model.set_alias("c2", "c1")
    fleet.workspace.model.inject_xid("aks-other-7", 0, 79, cluster="c2")
    # ...and its fake Node named like one of c1's nodes exports XID 79 under c1's name: the same series
    fleet.workspace.model.set_alias("other-cluster", "c1")
    fleet.workspace.model.inject_xid(fleet.nodes[0], 1, 79, cluster="other-cluster")
    for _ in range(3):
        report = fleet.sweep_twice()
        for event in fleet.unhealthy():
            assert event["data"]["node"] == fleet.nodes[0]
            assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.IGNORED
        fleet.events.published.clear()
    assert fleet.ledger.list(KIND) == []
    assert [r.data["node"] for r in fleet.ledger.list(dcgm.DCGM_KIND)] in ([], [fleet.nodes[0]])  # never the phantom
    assert report.dcgm["refused"].get(prov.PHANTOM_NODE) == 1
    assert set(report.dcgm["refused"]) <= {prov.PHANTOM_NODE, prov.CONTESTED}


def test_a_node_the_managed_exporter_does_not_run_on_has_no_series_to_believe() -> None:
    """A driver-only node has no genuine writer to contradict an exact-shape forgery: refused by its label."""
    fleet = DcgmFleet()
    victim = fleet.nodes[2]
    view = fleet.kube.nodes[victim]
    fleet.kube.nodes[victim] = msgspec.structs.replace(
        view, labels={k: v for k, v in view.labels.items() if k != prov.EXPORTER_NODE_LABEL})
    fleet.workspace.model.remove_node(victim, cluster="c1")  # no exporter: no genuine series at all
    fleet.forge(victim, xid=79)
    for _ in range(3):
        report = fleet.sweep_twice()
    assert fleet.unhealthy() == [] and fleet.ledger.list(KIND) == [] and fleet.ledger.list(dcgm.DCGM_KIND) == []
    assert report.dcgm["refused"] == {prov.NO_EXPORTER: 1}
    forged_event = {"specversion": "1.0", "id": "forged", "type": "Steward.GpuNode.Unhealthy", "source": "/gpu-fleet-steward",
                    "data": {"signal": "dcgm", "cluster": CLUSTER, "node": victim, "condition": "Xid79",
                             "since": "2025-12-02T14:00:00Z"}}
    handled = admission.handle_event(forged_event, fleet.ctx())
    assert handled.outcome == admission.Handling.IGNORED and "does not run" in handled.detail


def test_a_fault_that_does_not_hold_over_the_window_is_never_published() -> None:
    fleet = DcgmFleet()
    victim = fleet.nodes[1]
    fleet.forge(victim, xid=79)  # scraped at :15 and :45, the node's own exporter at :00 and :30
    fleet.clock.advance(15)  # every sweep now reads just after the forger's scrape: the instant sample is 79
    report = fleet.sweep_twice()
    assert report.dcgm["pending"] == 0 and fleet.ledger.get(dcgm.DCGM_KIND, dcgm.node_key(CLUSTER, victim)) is not None
    assert fleet.unhealthy() == []  # due, but not in every sample of the window: not even an Unhealthy event
    assert report.dcgm["refused"] == {prov.CONTESTED: 1} and report.dcgm["contested"] == 1
    assert not breaker.current(fleet.ctx()).window  # a sighting the window does not confirm never feeds the breaker


def test_a_thousand_phantom_names_cost_nothing() -> None:
    fleet = DcgmFleet()
    for i in range(1000):
        fleet.forge(f"aks-gpu-{1000 + i}", xid=79)
    for _ in range(3):
        report = fleet.sweep_twice()
    assert report.breaker == breaker.CLOSED and fleet.unhealthy() == []
    assert fleet.ledger.list(dcgm.DCGM_KIND) == [] and fleet.ledger.list(KIND) == []
    assert report.dcgm["refused"] == {prov.PHANTOM_NODE: 1000}
    assert len(fleet.events.delivered(dcgm_reports.SERIES_REFUSED_EVENT)) == 1
    assert len(fleet.ledger.list(dcgm_reports.REPORT_KIND)) == 2  # that report, and the inactive counters' one


def test_a_node_arm_does_not_vouch_for_is_neither_remembered_nor_counted() -> None:
    fleet = DcgmFleet()
    node = fleet.nodes[1]
    fleet.kube.nodes[node] = msgspec.structs.replace(fleet.kube.nodes[node], provider_id="azure:///subscriptions/x/resourceGroups/"
                                                                         "elsewhere/providers/Microsoft.Compute/"
                                                                         "virtualMachines/vm")
    fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    report = fleet.sweep_twice()
    assert fleet.unhealthy() == [] and fleet.ledger.list(dcgm.DCGM_KIND) == []
    assert report.dcgm["refused"] == {prov.UNVERIFIED_NODE: 1} and report.breaker == breaker.CLOSED


def test_faulty_nodes_verified_per_sweep_are_capped_and_the_rest_wait() -> None:
    from dataclasses import replace

    from tests.unit.test_dcgm import POLICY

    fleet = DcgmFleet(policy=replace(POLICY, dcgm_max_nodes=1))
    for node in fleet.nodes[:2]:
        fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    report = sweep.sweep(fleet.ctx())
    assert report.dcgm["refused"] == {prov.OVER_CAP: 1} and len(fleet.ledger.list(dcgm.DCGM_KIND)) == 1


# --------------------------------------------------------------------------- what the exporter exports
def test_counters_the_managed_exporter_does_not_export_are_inactive_and_said_once() -> None:
    fleet = DcgmFleet()
    fleet.workspace.model.set(fleet.nodes[0], 0, sp.DBE_VOLATILE, 3, cluster="c1")  # the GPU errs, unexported
    for _ in range(2):
        report = fleet.sweep_twice()
    assert fleet.unhealthy() == []
    assert report.dcgm["inactive"] == {CLUSTER: [sp.DBE_VOLATILE, sp.DBE_AGGREGATE, sp.REMAP_PENDING]}
    [said] = fleet.events.delivered(dcgm_reports.COUNTERS_INACTIVE_EVENT)
    assert said["data"]["inactive"] == [sp.DBE_VOLATILE, sp.DBE_AGGREGATE, sp.REMAP_PENDING]
    assert "custom" in said["data"]["remedy"]
    [line] = dcgm_reports.inactive_lines([TARGET])
    assert "c1" in line and sp.DBE_VOLATILE in line
    assert dcgm_reports.inactive_lines([CUSTOM]) == []


def test_an_exporter_of_ones_own_makes_those_rows_act() -> None:
    fleet = DcgmFleet(custom=True)
    fleet.workspace.model.set(fleet.nodes[0], 0, sp.DBE_VOLATILE, 3, cluster="c1")
    report = fleet.sweep_twice()
    assert report.dcgm["inactive"] == {}
    [event] = fleet.unhealthy()
    assert event["data"]["condition"] == sp.DBE_VOLATILE
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    assert fleet.events.delivered(dcgm_reports.COUNTERS_INACTIVE_EVENT) == []


# --------------------------------------------------------------------------- re-read, and rows that end
def test_the_fault_is_re_read_from_the_workspace_on_demand() -> None:
    fleet = DcgmFleet()
    node = fleet.nodes[0]
    fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    fleet.clock.advance(THRESHOLD)
    assert dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node, key="Xid79")[0] is True
    assert dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node, key="Xid48")[0] is False
    fleet.workspace.error = dcgm_recheck.Transient("HTTP 503")
    assert dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node, key="Xid79")[0] is None
    fleet.workspace.error = None
    fleet.workspace.model.reboot(node, cluster="c1")
    fleet.clock.advance(30)
    assert dcgm_recheck.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node, key="Xid79")[0] is False


def test_the_row_of_a_node_that_is_gone_expires() -> None:
    fleet = DcgmFleet()
    node = fleet.nodes[0]
    fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    sweep.sweep(fleet.ctx())
    assert len(fleet.ledger.list(dcgm.DCGM_KIND)) == 1
    fleet.kube.nodes.pop(node)
    fleet.workspace.model.remove_node(node, cluster="c1")
    fleet.clock.advance(dcgm_reports.GONE_NODE_ROW_TTL_S - 60)
    sweep.sweep(fleet.ctx())
    assert len(fleet.ledger.list(dcgm.DCGM_KIND)) == 1  # not yet: the node may be re-registering
    fleet.clock.advance(120)
    report = sweep.sweep(fleet.ctx())
    assert fleet.ledger.list(dcgm.DCGM_KIND) == [] and report.dcgm["expired"] >= 1

"""The fleet's Azure Monitor workspace (sim/prometheus/dcgm.py): series that follow the simulated nodes in AKS managed
Prometheus's shape, the control routes that inject DCGM faults, tenants' series and cluster aliases, and the
endpoint's answers (token audience, outage) as the app meets them."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from shared.remediation import dcgm_provenance as prov
from shared.remediation import signal_policy as sp
from sim.core.control import ControlApi
from sim.core.http import Headers, Request, Response
from sim.model import Fleet, SimClock
from sim.prometheus.dcgm import FleetDcgm
from sim.scenario import add_pool

QUERY = '{__name__=~"DCGM_FI_DEV_.*", job=~".+"}'
MANAGED = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}


def world() -> tuple[Fleet, FleetDcgm, ControlApi]:
    fleet = Fleet(seed=3, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 1, "restart_s": 5, "reimage_s": 5})
    cluster = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    with fleet.lock:
        add_pool(cluster, {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1})
        add_pool(cluster, {"name": "gpu", "mode": "User", "vmSize": "Standard_NC4as_T4_v3", "count": 2,
                           "gpuProfile": MANAGED})
        add_pool(cluster, {"name": "byo", "mode": "User", "vmSize": "Standard_NC4as_T4_v3", "count": 1})
    fleet.advance(2)
    dcgm = FleetDcgm(fleet)
    control = ControlApi(fleet)
    control.handlers["dcgm"] = dcgm
    return fleet, dcgm, control


def control_call(control: ControlApi, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    raw = b"" if body is None else json.dumps(body).encode()
    resp = control.handle(Request(method, path, Headers({"Content-Type": "application/json"}), raw))
    return resp.status, json.loads(resp.body)


def query(fleet: Fleet, dcgm: FleetDcgm, text: str = QUERY, *,
          audience: str = "https://prometheus.monitor.azure.com") -> Response:
    token, _ = fleet.tokens.issue(audience, principal="app")
    return dcgm.handle(Request("GET", "/prometheus/ws1/api/v1/query?" + urlencode({"query": text}),
                               Headers({"Authorization": f"Bearer {token}"})))


def results(resp: Response) -> list[dict[str, Any]]:
    body = json.loads(resp.body)
    assert resp.status == 200 and body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def node_of(labels: dict[str, str]) -> str:
    return labels["instance"] if labels["job"] == prov.MANAGED_JOB else labels["Hostname"]


def faulty(resp: Response) -> dict[tuple[str, str, str], str]:
    return {(node_of(r["metric"]), r["metric"]["gpu"], r["metric"]["__name__"]): r["value"][1]
            for r in results(resp) if r["value"][1] != "0"}


def scraped(fleet: Fleet) -> None:
    """Let the next scrape (every 30 s) pick up what changed."""
    fleet.advance(30)


def test_managed_gpu_nodes_export_in_aks_shape_and_other_nodes_nothing() -> None:
    fleet, dcgm, _ = world()
    managed = {n.name for c in fleet.clusters.values() for n in c.nodes.values() if n.pool == "gpu"}
    series = results(query(fleet, dcgm))
    assert {r["metric"]["instance"] for r in series} == managed and len(managed) == 2
    assert {frozenset(r["metric"]) for r in series} == {prov.MANAGED_LABELS}
    assert {(r["metric"]["job"], r["metric"]["cluster"]) for r in series} == {("dcgm-exporter", "c")}
    assert {r["metric"]["__name__"] for r in series} == set(prov.DEFAULT_CSV_COUNTERS)


def test_a_token_for_another_audience_is_refused() -> None:
    fleet, dcgm, _ = world()
    assert query(fleet, dcgm, audience="https://management.azure.com/").status == 401


def test_an_injected_xid_reads_back_and_a_restart_clears_it() -> None:
    fleet, dcgm, control = world()
    status, answer = control_call(control, "POST", "/_sim/dcgm/xid", {"cluster": "c", "pool": "gpu", "xid": 79})
    assert status == 200
    node = answer["node"]
    scraped(fleet)
    assert faulty(query(fleet, dcgm)) == {(node, "0", sp.XID_METRIC): "79"}
    cluster = next(iter(fleet.clusters.values()))
    cluster.restart_node(node)
    scraped(fleet)
    assert faulty(query(fleet, dcgm)) == {}


def test_a_storm_comes_back_after_a_restart_and_a_remap_failure_survives_it() -> None:
    fleet, dcgm, control = world()
    control_call(control, "POST", "/_sim/dcgm/exporter", {"cluster": "c", "pool": "gpu", "kind": "custom"})
    _, storm = control_call(control, "POST", "/_sim/dcgm/ecc-storm", {"cluster": "c", "pool": "gpu", "node_index": 0})
    _, remap = control_call(control, "POST", "/_sim/dcgm/row-remap", {"cluster": "c", "pool": "gpu", "node_index": 1,
                                                                      "failure": True})
    cluster = next(iter(fleet.clusters.values()))
    for name in (storm["node"], remap["node"]):
        cluster.restart_node(name)
    scraped(fleet)
    after = faulty(query(fleet, dcgm))
    assert after[(storm["node"], "0", sp.XID_METRIC)] == "48"
    assert after[(storm["node"], "0", sp.DBE_AGGREGATE)] == "8"  # the lifetime count keeps growing
    assert after[(remap["node"], "0", sp.REMAP_FAILURE)] == "1"


def test_a_node_that_is_gone_has_no_series() -> None:
    fleet, dcgm, control = world()
    _, answer = control_call(control, "POST", "/_sim/dcgm/xid", {"cluster": "c", "pool": "gpu", "xid": 79})
    cluster = next(iter(fleet.clusters.values()))
    with fleet.lock:
        cluster.delete_node(answer["node"], cause="test")
    assert answer["node"] not in {node_of(r["metric"]) for r in results(query(fleet, dcgm))}


def test_an_outage_is_a_503_until_it_ends_and_a_bad_target_is_a_400() -> None:
    fleet, dcgm, control = world()
    assert control_call(control, "POST", "/_sim/dcgm/outage", {"down": True})[0] == 200
    resp = query(fleet, dcgm)
    assert resp.status == 503 and json.loads(resp.body)["errorType"] == "unavailable"
    control_call(control, "POST", "/_sim/dcgm/outage", {"down": False})
    assert query(fleet, dcgm).status == 200
    status, _ = control_call(control, "POST", "/_sim/dcgm/xid", {"cluster": "c", "pool": "gpu", "xid": 79, "gpu": 5})
    assert status == 400
    assert "/_sim/dcgm" in control_call(control, "GET", "/_sim")[1]["endpoints"]


def test_an_operators_own_exporter_exports_every_counter_it_is_given() -> None:
    fleet, dcgm, control = world()
    status, _ = control_call(control, "POST", "/_sim/dcgm/exporter",
                             {"cluster": "c", "pool": "byo", "kind": "custom", "job": "mon/dcgm"})
    assert status == 200
    for metric in (sp.DBE_VOLATILE, sp.DBE_AGGREGATE, sp.REMAP_FAILURE, sp.REMAP_PENDING):
        status, answer = control_call(control, "POST", "/_sim/dcgm/counter",
                                      {"cluster": "c", "pool": "byo", "metric": metric, "value": 3})
        assert status == 200, answer
        scraped(fleet)
        assert faulty(query(fleet, dcgm)) == {(answer["node"], "0", metric): "3"}
        control_call(control, "POST", "/_sim/dcgm/counter", {"cluster": "c", "pool": "byo", "metric": metric, "value": 0})
        scraped(fleet)
    for bad in ({"metric": sp.XID_METRIC, "value": 79}, {"metric": "DCGM_FI_DEV_GPU_TEMP"},
                {"metric": sp.DBE_VOLATILE, "value": -1}):
        assert control_call(control, "POST", "/_sim/dcgm/counter", {"cluster": "c", "pool": "byo", **bad})[0] == 400
    assert control_call(control, "POST", "/_sim/dcgm/exporter", {"cluster": "c", "pool": "nope"})[0] == 400


def test_a_tenant_pod_scraped_by_annotations_and_by_a_pod_monitor() -> None:
    fleet, _dcgm, control = world()
    victim = next(n.name for c in fleet.clusters.values() for n in c.nodes.values() if n.pool == "gpu")
    _, annotated = control_call(control, "POST", "/_sim/dcgm/tenant-series", {
        "cluster": "c", "scrape": "annotations", "pod_labels": {"job": "dcgm-exporter", "instance": victim},
        "labels": {"gpu": "0"}, "value": 79})
    assert annotated["labels"]["job"] == "dcgm-exporter" and annotated["labels"]["instance"] == victim
    assert annotated["labels"]["kubernetes_namespace"] == "team-a"  # the pod annotations job always adds it
    _, monitored = control_call(control, "POST", "/_sim/dcgm/tenant-series", {
        "cluster": "c", "scrape": "podmonitor", "honor_labels": True,
        "drop_labels": ["namespace", "pod", "container", "endpoint"],
        "labels": {"job": "dcgm-exporter", "instance": victim, "gpu": "0"}, "value": 79})
    assert set(monitored["labels"]) == prov.MANAGED_LABELS  # the exporter's own shape exactly
    assert control_call(control, "POST", "/_sim/dcgm/tenant-series/clear")[1] == {"removed": 2}


def test_a_cluster_alias_is_the_cluster_label_of_everything_it_sends() -> None:
    fleet, dcgm, control = world()
    assert control_call(control, "POST", "/_sim/dcgm/cluster-alias", {"cluster": "c", "alias": "prod"})[1]["label"] == \
        "prod"
    assert {r["metric"]["cluster"] for r in results(query(fleet, dcgm))} == {"prod"}
    control_call(control, "POST", "/_sim/dcgm/cluster-alias", {"cluster": "c", "alias": ""})
    assert {r["metric"]["cluster"] for r in results(query(fleet, dcgm))} == {"c"}

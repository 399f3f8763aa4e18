"""The fleet's Azure Monitor workspace (sim/dcgm.py): series that follow the simulated nodes, the control
routes that inject DCGM faults, and the endpoint's answers (token audience, outage) as the app meets them."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from shared.remediation import signal_policy as sp
from sim.control import ControlApi
from sim.dcgm import FleetDcgm
from sim.http import Headers, Request, Response
from sim.model import Fleet, SimClock
from sim.scenario import add_pool

QUERY = sp.dcgm_query("Hostname", cluster_label="cluster")


def world() -> tuple[Fleet, FleetDcgm, ControlApi]:
    fleet = Fleet(seed=3, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 1, "restart_s": 5, "reimage_s": 5})
    cluster = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    with fleet.lock:
        add_pool(cluster, {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1})
        add_pool(cluster, {"name": "gpu", "mode": "User", "vmSize": "Standard_NC4as_T4_v3", "count": 2})
    fleet.advance(2)
    dcgm = FleetDcgm(fleet)
    control = ControlApi(fleet)
    control.handlers["dcgm"] = dcgm
    return fleet, dcgm, control


def control_call(control: ControlApi, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    raw = b"" if body is None else json.dumps(body).encode()
    resp = control.handle(Request(method, path, Headers({"Content-Type": "application/json"}), raw))
    return resp.status, json.loads(resp.body)


def query(fleet: Fleet, dcgm: FleetDcgm, *, audience: str = "https://prometheus.monitor.azure.com") -> Response:
    token, _ = fleet.tokens.issue(audience, principal="app")
    return dcgm.handle(Request("GET", "/prometheus/ws1/api/v1/query?" + urlencode({"query": QUERY}),
                               Headers({"Authorization": f"Bearer {token}"})))


def faulty(resp: Response) -> dict[tuple[str, str, str], str]:
    body = json.loads(resp.body)
    assert resp.status == 200 and body["status"] == "success", body
    return {(r["metric"]["Hostname"], r["metric"]["gpu"], r["metric"]["__name__"]): r["value"][1]
            for r in body["data"]["result"] if r["value"][1] != "0"}


def series_nodes(resp: Response) -> set[str]:
    return {r["metric"]["Hostname"] for r in json.loads(resp.body)["data"]["result"]}


def test_every_gpu_node_has_series_and_the_cpu_nodes_none() -> None:
    fleet, dcgm, _ = world()
    gpu_nodes = {n.name for c in fleet.clusters.values() for n in c.nodes.values() if n.pool == "gpu"}
    resp = query(fleet, dcgm)
    assert series_nodes(resp) == gpu_nodes and len(gpu_nodes) == 2
    assert {r["metric"]["cluster"] for r in json.loads(resp.body)["data"]["result"]} == {"c"}
    assert faulty(resp) == {}


def test_a_token_for_another_audience_is_refused() -> None:
    fleet, dcgm, _ = world()
    assert query(fleet, dcgm, audience="https://management.azure.com/").status == 401


def test_an_injected_xid_reads_back_and_a_restart_clears_it() -> None:
    fleet, dcgm, control = world()
    status, answer = control_call(control, "POST", "/_sim/dcgm/xid", {"cluster": "c", "pool": "gpu", "xid": 79})
    assert status == 200
    node = answer["node"]
    assert faulty(query(fleet, dcgm)) == {(node, "0", sp.XID_METRIC): "79"}
    cluster = next(iter(fleet.clusters.values()))
    cluster.restart_node(node)
    assert faulty(query(fleet, dcgm)) == {}


def test_a_storm_comes_back_after_a_restart_and_a_remap_failure_survives_it() -> None:
    fleet, dcgm, control = world()
    _, storm = control_call(control, "POST", "/_sim/dcgm/ecc-storm", {"cluster": "c", "pool": "gpu", "node_index": 0})
    _, remap = control_call(control, "POST", "/_sim/dcgm/row-remap", {"cluster": "c", "pool": "gpu", "node_index": 1,
                                                                      "failure": True})
    cluster = next(iter(fleet.clusters.values()))
    for name in (storm["node"], remap["node"]):
        cluster.restart_node(name)
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
    assert answer["node"] not in series_nodes(query(fleet, dcgm))


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


def test_one_counter_is_set_alone_and_an_unknown_one_is_a_400() -> None:
    fleet, dcgm, control = world()
    for metric in (sp.DBE_VOLATILE, sp.DBE_AGGREGATE, sp.REMAP_FAILURE, sp.REMAP_PENDING):
        status, answer = control_call(control, "POST", "/_sim/dcgm/counter",
                                      {"cluster": "c", "pool": "gpu", "metric": metric, "value": 3})
        assert status == 200, answer
        assert faulty(query(fleet, dcgm)) == {(answer["node"], "0", metric): "3"}
        control_call(control, "POST", "/_sim/dcgm/counter", {"cluster": "c", "pool": "gpu", "metric": metric, "value": 0})
    for bad in ({"metric": sp.XID_METRIC, "value": 79}, {"metric": "DCGM_FI_DEV_GPU_TEMP"},
                {"metric": sp.DBE_VOLATILE, "value": -1}):
        assert control_call(control, "POST", "/_sim/dcgm/counter", {"cluster": "c", "pool": "gpu", **bad})[0] == 400

"""The oracles record what really happened: kills, PDB violations, lost pods, capacity, requests."""

from __future__ import annotations

from typing import Any

from sim.core.http import Headers, Request
from sim.core.oracles import kube_route, route_template
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube.api import KubeApi
from sim.model import Cluster, Fleet, SimClock
from sim.scenario import add_pool, add_workload


def setup(replicas: int = 3, pdb: dict[str, Any] | None = None) -> tuple[Fleet, Cluster]:
    fleet = Fleet(seed=1, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 5, "pod_start_s": 1})
    c = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    with fleet.lock:
        add_pool(c, {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 3,
                     "gpuProfile": {"nvidia": {"managementMode": "Managed"}}})
        add_workload(c, {"kind": "Deployment", "name": "web", "replicas": replicas, "resources": {"cpu": "100m"},
                         "pdb": pdb or {"maxUnavailable": 1}, "terminationGracePeriodSeconds": 10})
        add_workload(c, {"kind": "DaemonSet", "name": "agent"})
    fleet.advance(10)
    return fleet, c


def web_pods(c: Cluster) -> list[Any]:
    return [p for p in c.items("pods") if p.name.startswith("web-") and not p.terminating]


def test_deleting_pods_past_the_budget_is_a_violation_and_a_kill_without_eviction() -> None:
    fleet, c = setup()
    with fleet.lock:
        a, b = web_pods(c)[:2]
        c.delete_pod(a, cause="delete")
        c.delete_pod(b, cause="delete")
    report = fleet.oracles.report()
    assert [v["pod"] for v in report["pdb_violations"]] == [b.name]
    assert report["pdb_violations"][0]["desiredHealthy"] == 2
    assert sorted(k["pod"] for k in report["pods_killed_without_eviction"]) == sorted([a.name, b.name])


def test_evictions_through_the_api_never_violate_and_are_not_kills() -> None:
    fleet, c = setup()
    api = KubeApi(fleet)
    token = fleet.tokens.issue(AKS_AUDIENCES[0])[0]
    codes = []
    for pod in web_pods(c):
        req = Request("POST", f"/k8s/s/rg/c/api/v1/namespaces/default/pods/{pod.name}/eviction",
                      Headers({"Authorization": f"Bearer {token}"}), b'{"apiVersion":"policy/v1","kind":"Eviction"}')
        codes.append(api.handle(req).status)
    assert sorted(codes) == [201, 429, 429]
    report = fleet.oracles.report()
    assert report["pdb_violations"] == [] and report["pods_killed_without_eviction"] == []
    assert report["termination_causes"] == {"eviction": 1}


def test_removing_a_node_loses_its_workload_pods_but_not_its_daemonset_pods() -> None:
    fleet, c = setup(replicas=3, pdb={"minAvailable": 3})
    node = web_pods(c)[0].node_name
    with fleet.lock:
        c.delete_node(node, cause="machine_deleted")
    report = fleet.oracles.report()
    assert [x["node"] for x in report["workload_pods_lost"]] == [node]
    assert [v["cause"] for v in report["pdb_violations"]] == ["node_removal"]
    assert report["nodes_removed"][0]["cause"] == "machine_deleted"
    assert any(t["pod"].startswith("agent-") and t["cause"] == "node_removal" for t in report["terminations"])


def test_completed_job_pods_are_recorded_as_completions_only() -> None:
    fleet, c = setup()
    with fleet.lock:
        add_workload(c, {"kind": "Job", "name": "j", "run_s": 5})
    fleet.advance(10)
    report = fleet.oracles.report()
    assert report["termination_causes"].get("completion") == 1
    assert report["pods_killed_without_eviction"] == []


def test_the_most_unavailable_nodes_at_once_per_pool_is_tracked() -> None:
    fleet, c = setup()
    names = [n.name for n in c.pool_nodes("gpu")]
    with fleet.lock:
        for name in names[:2]:
            c.nodes[name].obj["spec"]["unschedulable"] = True
            c.sync_node(c.nodes[name])
        for name in names[:2]:
            c.nodes[name].obj["spec"]["unschedulable"] = False
            c.sync_node(c.nodes[name])
        c.restart_node(names[2])
    assert fleet.oracles.report()["max_unavailable_per_pool"]["c/gpu"] == 3  # 3 NotReady while joining
    fleet2, _ = setup()
    assert fleet2.oracles.report()["max_unavailable_per_pool"]["c/gpu"] == 3


def test_gpu_capacity_is_sampled_as_allocatable_and_schedulable() -> None:
    fleet, c = setup()
    assert fleet.oracles.report()["gpu_capacity_now"]["c"] == {"allocatable": 3, "schedulable": 3}
    name = c.pool_nodes("gpu")[0].name
    fleet.advance(5)
    with fleet.lock:
        c.nodes[name].obj["spec"]["unschedulable"] = True
        c.sync_node(c.nodes[name])
    series = fleet.oracles.report()["gpu_capacity"]["c"]
    assert series[-1]["allocatable"] == 3 and series[-1]["schedulable"] == 2
    assert series[0]["schedulable"] == 0  # the nodes joined NotReady
    assert [s["t"] for s in series] == sorted(s["t"] for s in series)


def test_requests_are_counted_per_service_route_and_kind() -> None:
    fleet, _ = setup()
    api = KubeApi(fleet)
    token = fleet.tokens.issue(AKS_AUDIENCES[0])[0]
    for path in ("/k8s/s/rg/c/api/v1/nodes", "/k8s/s/rg/c/api/v1/nodes"):
        req = Request("GET", path, Headers({"Authorization": f"Bearer {token}"}))
        fleet.oracles.record_request(service="kube", method="GET", route=api.route(req), status=api.handle(req).status)
    fleet.oracles.record_request(service="arm", method="PUT", route="/subscriptions/{}/x", status=201)
    fleet.oracles.record_request(service="arm", method="POST", status=200,
                                 route="/subscriptions/{}/resourceGroups/{}/providers/Microsoft.ContainerService"
                                       "/managedClusters/{}/listClusterUserCredential")
    report = fleet.oracles.report()
    assert report["requests"]["GET /k8s/{}/api/v1/nodes"] == 2
    assert report["requests_by_service"]["kube"]["reads"] == 2
    assert report["requests_by_service"]["arm"]["writes"] == 1  # listing credentials is a read
    assert report["requests_by_service"]["arm"]["reads"] == 1


def test_route_templates_hide_names() -> None:
    assert kube_route("/k8s/s/rg/c/api/v1/namespaces/ml/pods/p-1/eviction") == \
        "/k8s/{}/api/v1/namespaces/{}/pods/{}/eviction"
    assert kube_route("/k8s/s/rg/c/apis/coordination.k8s.io/v1/namespaces/x/leases/l") == \
        "/k8s/{}/apis/coordination.k8s.io/v1/namespaces/{}/leases/{}"
    assert route_template("arm", "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.ContainerService/"
                                 "managedClusters/c/agentPools/gpu") == \
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.ContainerService/managedClusters/{}/agentPools/{}"


def test_cordoned_nodes_are_tracked_apart_from_not_ready_ones() -> None:
    fleet, c = setup()
    names = [n.name for n in c.pool_nodes("gpu")]
    with fleet.lock:
        for name in names[:2]:
            c.nodes[name].obj["spec"]["unschedulable"] = True
            c.sync_node(c.nodes[name])
    report = fleet.oracles.report()
    assert report["max_cordoned_per_pool"]["c/gpu"] == 2
    assert report["max_unavailable_per_pool"]["c/gpu"] == 3


def test_a_scenario_starts_its_oracles_after_its_own_nodes_joined() -> None:
    from sim.scenario import build_fleet, load

    report = build_fleet(load("drain")).oracles.report()
    assert set(report["max_unavailable_per_pool"].values()) == {0}
    assert report["terminations"] == [] and report["pdb_violations"] == []

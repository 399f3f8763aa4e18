"""Pod deletion as the API server, the kubelet and pod GC carry it out: grace periods, finalizers, and
pods whose node cannot confirm their end (in-process, manual clock)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.core.http import Headers, Request
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube.api import KubeApi
from sim.model import Cluster, Fleet, Node, Pod, SimClock
from sim.scenario import ScenarioError, add_pool, add_workload

BASE = "/k8s/s/rg/c/api/v1/namespaces/shop/pods"


def new_fleet(**timings: float) -> tuple[Fleet, Cluster]:
    fleet = Fleet(seed=5, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 10, "pod_start_s": 2, **timings})
    c = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    with fleet.lock:
        add_pool(c, {"name": "cpu", "vmSize": "Standard_D8s_v5", "count": 2})
    fleet.advance(11)
    return fleet, c


def workload(fleet: Fleet, c: Cluster, **spec: Any) -> list[Pod]:
    with fleet.lock:
        add_workload(c, {"namespace": "shop", **spec})
        fleet.settle()
    fleet.advance(3)
    return [p for p in c.items("pods", "shop") if (p.meta.get("labels") or {}).get("app") == spec["name"]]


def call(fleet: Fleet, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
    token = fleet.tokens.issue(AKS_AUDIENCES[0])[0]
    resp = KubeApi(fleet).handle(Request(method, path, Headers({"Authorization": f"Bearer {token}",
                                                                "Content-Type": ctype}),
                                         b"" if body is None else json.dumps(body).encode()))
    return resp.status, json.loads(resp.body) if resp.body else None


def node_of(c: Cluster, pod: Pod) -> Node:
    return c.nodes[pod.node_name]


# --------------------------------------------------------------------------- finalizers


def test_a_deleted_pod_with_a_finalizer_stays_until_the_finalizer_is_removed() -> None:
    fleet, c = new_fleet()
    (pod,) = workload(fleet, c, kind="Pod", name="held", pod_finalizers=["example.com/hold"],
                      terminationGracePeriodSeconds=5)
    status, obj = call(fleet, "DELETE", f"{BASE}/held")
    assert status == 200 and obj["metadata"]["deletionGracePeriodSeconds"] == 5
    fleet.advance(60)
    status, obj = call(fleet, "GET", f"{BASE}/held")
    assert status == 200
    assert obj["metadata"]["deletionTimestamp"] and obj["metadata"]["deletionGracePeriodSeconds"] == 0
    assert obj["metadata"]["finalizers"] == ["example.com/hold"]
    assert obj["status"]["phase"] == "Failed"
    status, obj = call(fleet, "PATCH", f"{BASE}/held", {"metadata": {"finalizers": None}},
                       ctype="application/merge-patch+json")
    assert status == 200
    assert call(fleet, "GET", f"{BASE}/held")[0] == 404
    assert ("shop", "held") not in c.pods and pod.key not in c.finalizing


def test_removing_the_finalizer_during_the_grace_period_lets_the_pod_go_at_its_end() -> None:
    fleet, c = new_fleet()
    workload(fleet, c, kind="Pod", name="held", pod_finalizers=["example.com/hold"], terminationGracePeriodSeconds=10)
    call(fleet, "DELETE", f"{BASE}/held")
    call(fleet, "PATCH", f"{BASE}/held", {"metadata": {"finalizers": []}}, ctype="application/merge-patch+json")
    fleet.advance(5)
    assert ("shop", "held") in c.pods
    fleet.advance(6)
    assert ("shop", "held") not in c.pods


def test_a_force_delete_does_not_remove_a_pod_held_by_a_finalizer() -> None:
    fleet, c = new_fleet()
    workload(fleet, c, kind="Pod", name="held", pod_finalizers=["example.com/hold"])
    status, _obj = call(fleet, "DELETE", f"{BASE}/held?gracePeriodSeconds=0")
    assert status == 200
    pod = c.pods[("shop", "held")]
    assert pod.terminating and pod.meta["deletionGracePeriodSeconds"] == 0


def test_controller_pods_get_the_template_finalizers_and_are_replaced_while_held() -> None:
    fleet, c = new_fleet()
    pods = workload(fleet, c, kind="Deployment", name="web", replicas=2, pod_finalizers=["example.com/hold"])
    assert all(p.meta["finalizers"] == ["example.com/hold"] for p in pods)
    with fleet.lock:
        c.delete_pod(pods[0], grace=0, cause="delete")
        fleet.settle()
    fleet.advance(3)
    live = [p for p in c.items("pods", "shop") if not p.terminating]
    assert len(live) == 2 and pods[0].key in c.pods


def test_a_finalizer_release_time_lets_the_owner_remove_it() -> None:
    fleet, c = new_fleet()
    workload(fleet, c, kind="Pod", name="held", pod_finalizers=["example.com/hold"], pod_finalizers_release_s=30,
             terminationGracePeriodSeconds=5)
    call(fleet, "DELETE", f"{BASE}/held")
    fleet.advance(20)
    assert ("shop", "held") in c.pods
    fleet.advance(20)
    assert ("shop", "held") not in c.pods


# --------------------------------------------------------------------------- grace periods


def test_a_second_delete_may_shorten_the_grace_period() -> None:
    fleet, c = new_fleet()
    workload(fleet, c, kind="Pod", name="slow", terminationGracePeriodSeconds=60)
    call(fleet, "DELETE", f"{BASE}/slow")
    status, obj = call(fleet, "DELETE", f"{BASE}/slow?gracePeriodSeconds=5")
    assert status == 200 and obj["metadata"]["deletionGracePeriodSeconds"] == 5
    fleet.advance(6)
    assert ("shop", "slow") not in c.pods


def test_a_second_delete_never_lengthens_it() -> None:
    fleet, c = new_fleet()
    workload(fleet, c, kind="Pod", name="quick", terminationGracePeriodSeconds=5)
    call(fleet, "DELETE", f"{BASE}/quick")
    call(fleet, "DELETE", f"{BASE}/quick?gracePeriodSeconds=100")
    assert c.pods[("shop", "quick")].meta["deletionGracePeriodSeconds"] == 5
    fleet.advance(6)
    assert ("shop", "quick") not in c.pods


# --------------------------------------------------------------------------- nodes that cannot confirm


def _stop_kubelet(fleet: Fleet, c: Cluster, node: Node) -> None:
    with fleet.lock:
        c._set_ready(node, False)
        fleet.settle()


@pytest.mark.parametrize("how", ["delete", "evict"])
def test_a_pod_on_a_not_ready_node_stays_terminating_after_its_grace_period(how: str) -> None:
    fleet, c = new_fleet()
    (pod,) = workload(fleet, c, kind="Pod", name="stuck", terminationGracePeriodSeconds=5)
    _stop_kubelet(fleet, c, node_of(c, pod))
    if how == "delete":
        assert call(fleet, "DELETE", f"{BASE}/stuck")[0] == 200
    else:
        assert call(fleet, "POST", f"{BASE}/stuck/eviction",
                    {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "stuck"}})[0] == 201
    fleet.advance(3600)
    status, obj = call(fleet, "GET", f"{BASE}/stuck")
    assert status == 200 and obj["metadata"]["deletionTimestamp"]


def test_the_node_coming_back_lets_its_kubelet_finish_the_deletion() -> None:
    fleet, c = new_fleet()
    (pod,) = workload(fleet, c, kind="Pod", name="stuck", terminationGracePeriodSeconds=5)
    node = node_of(c, pod)
    _stop_kubelet(fleet, c, node)
    call(fleet, "DELETE", f"{BASE}/stuck")
    fleet.advance(30)
    assert ("shop", "stuck") in c.pods
    with fleet.lock:
        c._set_ready(node, True)
        fleet.settle()
    assert ("shop", "stuck") not in c.pods


def test_a_node_back_before_the_grace_period_ends_finishes_it_on_time() -> None:
    fleet, c = new_fleet()
    (pod,) = workload(fleet, c, kind="Pod", name="p", terminationGracePeriodSeconds=20)
    node = node_of(c, pod)
    _stop_kubelet(fleet, c, node)
    call(fleet, "DELETE", f"{BASE}/p")
    fleet.advance(5)
    with fleet.lock:
        c._set_ready(node, True)
    assert ("shop", "p") in c.pods
    fleet.advance(16)
    assert ("shop", "p") not in c.pods


def test_deleting_the_node_object_garbage_collects_its_terminating_pods_without_counting_them_lost() -> None:
    fleet, c = new_fleet()
    (pod,) = workload(fleet, c, kind="Deployment", name="web", replicas=1, terminationGracePeriodSeconds=5)
    node = node_of(c, pod)
    _stop_kubelet(fleet, c, node)
    with fleet.lock:
        c.delete_pod(pod, cause="eviction")
    fleet.advance(30)
    assert pod.key in c.pods
    assert call(fleet, "DELETE", f"/k8s/s/rg/c/api/v1/nodes/{node.name}")[0] == 200
    assert pod.key not in c.pods
    assert fleet.oracles.workload_pods_lost == []


def test_a_force_delete_removes_a_pod_stuck_on_a_not_ready_node() -> None:
    fleet, c = new_fleet()
    (pod,) = workload(fleet, c, kind="Pod", name="stuck", terminationGracePeriodSeconds=5)
    _stop_kubelet(fleet, c, node_of(c, pod))
    call(fleet, "DELETE", f"{BASE}/stuck")
    fleet.advance(60)
    assert call(fleet, "DELETE", f"{BASE}/stuck", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                  "gracePeriodSeconds": 0})[0] == 200
    assert ("shop", "stuck") not in c.pods


# --------------------------------------------------------------------------- scenario fields


def test_a_never_ready_workload_runs_but_stays_unready_even_after_its_node_returns() -> None:
    fleet, c = new_fleet()
    (pod,) = workload(fleet, c, kind="Pod", name="sick", ready=False)
    assert pod.phase == "Running"
    ready = {x["type"]: x for x in pod.obj["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "ContainersNotReady",
                                                                   "containers with unready status: [main]")
    assert pod.obj["status"]["containerStatuses"][0]["ready"] is False
    node = node_of(c, pod)
    _stop_kubelet(fleet, c, node)
    with fleet.lock:
        c._set_ready(node, True)
    assert {x["type"]: x["status"] for x in pod.obj["status"]["conditions"]}["Ready"] == "False"


def test_a_pdb_carries_its_unhealthy_pod_eviction_policy() -> None:
    fleet, c = new_fleet()
    workload(fleet, c, kind="Deployment", name="web", pdb={"minAvailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"})
    pdb = c.get("poddisruptionbudgets.policy", "shop", "web")
    assert pdb is not None and pdb.obj["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


@pytest.mark.parametrize(("spec", "message"), [
    ({"pod_finalizers": "example.com/hold"}, "pod_finalizers must be a list"),
    ({"pod_finalizers": ["hold"]}, "pod_finalizers must be a list"),
    ({"pod_finalizers_release_s": 10}, "pod_finalizers_release_s must be a positive number"),
    ({"ready": "no"}, "ready must be true or false"),
    ({"pdb": {"minAvailable": 1, "unhealthyPodEvictionPolicy": "Sometimes"}}, "unhealthyPodEvictionPolicy must be"),
], ids=["finalizers-not-a-list", "finalizer-not-qualified", "release-without-finalizers", "ready-not-bool",
        "unknown-policy"])
def test_bad_workload_fields_are_refused_with_their_path(spec: dict[str, Any], message: str) -> None:
    _fleet, c = new_fleet()
    with pytest.raises(ScenarioError, match=message):
        add_workload(c, {"kind": "Deployment", "name": "web", **spec}, "w[0]")

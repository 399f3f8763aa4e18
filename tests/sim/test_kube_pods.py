"""Pods, evictions, PDBs and controllers through the kubernetes Python client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.testing import SimHandle, start_sim
from tests.waiting import wait_until

SCENARIO: dict[str, Any] = {
    "seed": 5,
    "clock": {"speed": 20},
    "timings": {"node_ready_s": 2, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000p1", "clusters": [{
        "name": "pods", "resource_group": "rg-pods", "tags": {"gpu-fleet-steward": "enabled"},
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 3},
                  {"name": "tight", "vmSize": "Standard_D4s_v5", "count": 2},
                  {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 1, "nodeTaints": ["sku=gpu:NoSchedule"],
                   "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}],
        "workloads": [
            {"kind": "Deployment", "name": "web", "namespace": "shop", "replicas": 3, "resources": {"cpu": "250m"},
             "pdb": {"minAvailable": 3}, "terminationGracePeriodSeconds": 2},
            # one batch pod fits a `tight` node: a replacement waits for the evicted pod to be gone
            {"kind": "Deployment", "name": "batch", "namespace": "shop", "replicas": 2, "resources": {"cpu": "3"},
             "nodeSelector": {"agentpool": "tight"}, "pdb": {"maxUnavailable": 1},
             "terminationGracePeriodSeconds": 40},
            {"kind": "StatefulSet", "name": "db", "namespace": "shop", "replicas": 2, "resources": {"cpu": "100m"},
             "terminationGracePeriodSeconds": 2},
            {"kind": "Job", "name": "quick", "namespace": "shop", "run_s": 4, "resources": {"cpu": "100m"}},
            {"kind": "Pod", "name": "lonely", "namespace": "shop", "resources": {"cpu": "100m"},
             "terminationGracePeriodSeconds": 2},
        ]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=5) as handle:
        yield handle


@pytest.fixture(scope="module")
def core(sim: SimHandle) -> client.CoreV1Api:
    return client.CoreV1Api(sim.kube_client("pods"))


@pytest.fixture(scope="module")
def policy(sim: SimHandle) -> client.PolicyV1Api:
    return client.PolicyV1Api(sim.kube_client("pods"))


def wait_for(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    return wait_until(check, timeout=timeout, what="the simulated cluster to get there")


def app_pods(core: client.CoreV1Api, app: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod("shop", label_selector=f"app={app}").items
            if p.metadata.deletion_timestamp is None]


def ready(p: Any) -> bool:
    return p.status.phase == "Running" and any(c.type == "Ready" and c.status == "True"
                                                for c in p.status.conditions or [])


def evict(core: client.CoreV1Api, pod: Any, grace: int | None = None) -> None:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace="shop"),
                             delete_options=client.V1DeleteOptions(grace_period_seconds=grace) if grace is not None
                             else None)
    core.create_namespaced_pod_eviction(pod.metadata.name, "shop", body)


def test_scenario_workloads_are_running_and_pdb_status_is_computed(core: client.CoreV1Api,
                                                                    policy: client.PolicyV1Api) -> None:
    wait_for(lambda: len([p for p in app_pods(core, "web") if ready(p)]) == 3)
    pdbs = {p.metadata.name: p.status for p in policy.list_namespaced_pod_disruption_budget("shop").items}
    assert (pdbs["web"].current_healthy, pdbs["web"].desired_healthy, pdbs["web"].disruptions_allowed,
            pdbs["web"].expected_pods) == (3, 3, 0, 3)
    assert (pdbs["batch"].current_healthy, pdbs["batch"].desired_healthy, pdbs["batch"].disruptions_allowed) == (2, 1, 1)


def test_field_selectors_list_the_pods_of_one_node_and_skip_finished_ones(core: client.CoreV1Api) -> None:
    node = app_pods(core, "web")[0].spec.node_name
    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    assert on_node and all(p.spec.node_name == node for p in on_node)
    wait_for(lambda: any(p.status.phase == "Succeeded" for p in core.list_namespaced_pod(
        "shop", label_selector="job-name=quick").items))
    live = core.list_namespaced_pod("shop", field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    assert all(p.status.phase not in ("Succeeded", "Failed") for p in live)
    assert not any(p.metadata.labels.get("job-name") == "quick" for p in live)


def test_an_unknown_field_selector_is_a_400(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as e:
        core.list_pod_for_all_namespaces(field_selector="spec.color=blue")
    assert e.value.status == 400


def test_an_eviction_that_would_violate_a_pdb_gets_429_naming_the_budget(core: client.CoreV1Api, sim: SimHandle) -> None:
    victim = app_pods(core, "web")[0]
    with pytest.raises(ApiException) as e:
        evict(core, victim)
    assert e.value.status == 429
    body = json.loads(e.value.body)
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert "The disruption budget web needs 3 healthy pods and has 3 currently" in body["details"]["causes"][0]["message"]
    assert core.read_namespaced_pod(victim.metadata.name, "shop").metadata.deletion_timestamp is None


def test_an_allowed_eviction_terminates_the_pod_and_the_controller_replaces_it(core: client.CoreV1Api,
                                                                             sim: SimHandle) -> None:
    wait_for(lambda: len([p for p in app_pods(core, "batch") if ready(p)]) == 2)
    victim = app_pods(core, "batch")[0]
    evict(core, victim)
    gone = core.read_namespaced_pod(victim.metadata.name, "shop")
    assert gone.metadata.deletion_timestamp is not None
    survivor = next(p for p in app_pods(core, "batch") if ready(p))
    replacement = next(p for p in app_pods(core, "batch") if p.metadata.name != survivor.metadata.name)
    assert replacement.status.phase == "Pending"  # its node is still taken by the terminating pod
    with pytest.raises(ApiException) as second:
        evict(core, survivor)
    assert second.value.status == 429  # the first eviction used the budget's only disruption
    wait_for(lambda: len([p for p in app_pods(core, "batch") if ready(p)]) == 2)
    names = {p.metadata.name for p in app_pods(core, "batch")}
    assert victim.metadata.name not in names

    def vanished() -> bool:
        try:
            core.read_namespaced_pod(victim.metadata.name, "shop")
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(vanished)
    causes = [(t["pod"], t["cause"]) for t in sim.oracles()["terminations"]]
    assert (victim.metadata.name, "eviction") in causes


def test_evicting_a_missing_pod_is_a_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod_eviction("nope", "shop", client.V1Eviction(
            metadata=client.V1ObjectMeta(name="nope", namespace="shop")))
    assert e.value.status == 404


def test_delete_with_a_grace_period_answers_the_pod_with_a_deletion_timestamp(core: client.CoreV1Api,
                                                                           sim: SimHandle) -> None:
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="tmp", labels={"app": "tmp"}),
                       spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")],
                                             termination_grace_period_seconds=30))
    core.create_namespaced_pod("shop", pod)
    wait_for(lambda: core.read_namespaced_pod("tmp", "shop").status.phase == "Running")
    resp = core.delete_namespaced_pod("tmp", "shop", grace_period_seconds=4, _preload_content=False)
    assert resp.status == 200
    obj = json.loads(resp.data)
    assert obj["kind"] == "Pod" and obj["metadata"]["deletionTimestamp"]
    assert obj["metadata"]["deletionGracePeriodSeconds"] == 4
    with pytest.raises(ApiException) as e:
        wait_for(lambda: not core.read_namespaced_pod("tmp", "shop"), timeout=5)
    assert e.value.status == 404
    killed = [k["pod"] for k in sim.oracles()["pods_killed_without_eviction"]]
    assert "tmp" in killed


def test_a_deleted_statefulset_pod_comes_back_with_the_same_name(core: client.CoreV1Api) -> None:
    wait_for(lambda: len([p for p in app_pods(core, "db") if ready(p)]) == 2)
    old = core.read_namespaced_pod("db-0", "shop")
    core.delete_namespaced_pod("db-0", "shop", grace_period_seconds=0)
    new = wait_for(lambda: next((p for p in app_pods(core, "db") if p.metadata.name == "db-0" and ready(p)
                                 and p.metadata.uid != old.metadata.uid), None))
    assert new.metadata.labels["statefulset.kubernetes.io/pod-name"] == "db-0"


def test_a_new_bare_pod_is_scheduled_and_runs(core: client.CoreV1Api) -> None:
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="fresh"),
                       spec=client.V1PodSpec(containers=[client.V1Container(
                           name="c", image="busybox", resources=client.V1ResourceRequirements(requests={"cpu": "100m"}))]))
    created = core.create_namespaced_pod("shop", pod)
    assert created.status.phase == "Pending"
    running = wait_for(lambda: (p := core.read_namespaced_pod("fresh", "shop")).status.phase == "Running" and p)
    assert running.spec.node_name.startswith("aks-system-")


def test_a_gpu_pod_without_the_toleration_stays_pending(core: client.CoreV1Api) -> None:
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="wants-gpu"),
                       spec=client.V1PodSpec(containers=[client.V1Container(
                           name="c", image="cuda", resources=client.V1ResourceRequirements(
                               limits={"nvidia.com/gpu": "1"}))]))
    core.create_namespaced_pod("shop", pod)

    def refused() -> Any:
        """The pod once the scheduler (it runs after every write) looked and found no node for it."""
        found = core.read_namespaced_pod("wants-gpu", "shop")
        conditions = found.status.conditions or []
        return found if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions) else None

    p = wait_for(refused)
    assert p.status.phase == "Pending" and not p.spec.node_name
    assert p.status.conditions[0].reason == "Unschedulable"
    core.patch_namespaced_pod("wants-gpu", "shop", {"spec": {"tolerations": [
        {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}})
    placed = wait_for(lambda: core.read_namespaced_pod("wants-gpu", "shop").spec.node_name)
    assert placed.startswith("aks-gpu-")


def test_changing_an_immutable_pod_field_is_invalid(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_pod("lonely", "shop", {"spec": {"nodeName": "elsewhere"}})
    assert e.value.status == 422


def test_deployments_report_ready_replicas(sim: SimHandle) -> None:
    apps = client.AppsV1Api(sim.kube_client("pods"))
    dep = apps.read_namespaced_deployment("web", "shop")
    assert dep.status.ready_replicas == 3
    assert {d.metadata.name for d in apps.list_namespaced_deployment("shop").items} == {"web", "batch"}
    rs = apps.list_namespaced_replica_set("shop", label_selector="app=web").items
    assert len(rs) == 1 and rs[0].metadata.owner_references[0].kind == "Deployment"


def test_scaling_a_deployment_by_patch_changes_its_pods(sim: SimHandle, core: client.CoreV1Api) -> None:
    apps = client.AppsV1Api(sim.kube_client("pods"))
    apps.patch_namespaced_deployment("web", "shop", {"spec": {"replicas": 4}})
    wait_for(lambda: len([p for p in app_pods(core, "web") if ready(p)]) == 4)
    apps.patch_namespaced_deployment("web", "shop", {"spec": {"replicas": 3}})
    wait_for(lambda: len(app_pods(core, "web")) == 3)

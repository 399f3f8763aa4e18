"""Watch streams: the kubernetes client's Watch and kubectl see additions, changes and deletions."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from sim.testing import SimHandle, start_sim
from tests.waiting import wait_until

SCENARIO: dict[str, Any] = {
    "seed": 12,
    "clock": {"speed": 20},
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000w1", "clusters": [{
        "name": "watched", "resource_group": "rg-w",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 2}],
        "workloads": [{"kind": "Deployment", "name": "web", "replicas": 2, "terminationGracePeriodSeconds": 1}]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=12) as handle:
        yield handle


@pytest.fixture(scope="module")
def core(sim: SimHandle) -> client.CoreV1Api:
    return client.CoreV1Api(sim.kube_client("watched"))


def answered(sim: SimHandle, route: str) -> int:
    """How many ``route`` requests the simulated API server has answered. A watch is counted once its
    stream is open and registered (before its first event), so one more than before proves it listens."""
    return int(sim.oracles()["requests"].get(route, 0))


NODES = "GET /k8s/{}/api/v1/nodes"
PODS = "GET /k8s/{}/api/v1/namespaces/{}/pods"
POD = "GET /k8s/{}/api/v1/namespaces/{}/pods/{}"


def test_a_watch_without_resource_version_starts_with_every_object_added(core: client.CoreV1Api) -> None:
    events = list(watch.Watch().stream(core.list_node, timeout_seconds=1))
    assert [e["type"] for e in events] == ["ADDED", "ADDED"]
    assert all(e["object"].metadata.name.startswith("aks-system-") for e in events)


def test_a_watch_from_a_list_sees_a_cordon_as_modified(sim: SimHandle, core: client.CoreV1Api) -> None:
    listed = core.list_node()
    name = listed.items[0].metadata.name
    seen: list[tuple[str, bool]] = []

    def collect() -> None:
        for e in watch.Watch().stream(core.list_node, resource_version=listed.metadata.resource_version,
                                      field_selector=f"metadata.name={name}", timeout_seconds=3):
            seen.append((e["type"], bool(e["object"].spec.unschedulable)))
            if e["object"].spec.unschedulable:
                return

    watches = answered(sim, NODES)
    t = threading.Thread(target=collect)
    t.start()
    wait_until(lambda: answered(sim, NODES) > watches, timeout=10, what="the watch to be open")
    core.patch_node(name, {"spec": {"unschedulable": True}})
    t.join(timeout=10)
    assert ("MODIFIED", True) in seen
    core.patch_node(name, {"spec": {"unschedulable": False}})


def test_a_watch_sees_a_pod_deleted(sim: SimHandle, core: client.CoreV1Api) -> None:
    pods = core.list_namespaced_pod("default", label_selector="app=web")
    victim = pods.items[0].metadata.name
    kinds: list[str] = []

    def collect() -> None:
        for e in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=pods.metadata.resource_version,
                                      field_selector=f"metadata.name={victim}", timeout_seconds=5):
            kinds.append(e["type"])
            if e["type"] == "DELETED":
                return

    watches = answered(sim, PODS)
    t = threading.Thread(target=collect)
    t.start()
    wait_until(lambda: answered(sim, PODS) > watches, timeout=10, what="the watch to be open")
    core.delete_namespaced_pod(victim, "default")
    t.join(timeout=10)
    assert kinds[-1:] == ["DELETED"] and "MODIFIED" in kinds


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_kubectl_rollout_status_and_wait_for_delete_finish(sim: SimHandle, core: client.CoreV1Api) -> None:
    env = dict(os.environ, KUBECONFIG=sim.kubeconfig("watched"), HOME=str(sim.state_dir))
    rollout = subprocess.run(["kubectl", "rollout", "status", "deployment/web", "--timeout=30s"], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    assert rollout.returncode == 0, rollout.stderr
    assert "successfully rolled out" in rollout.stdout
    pod = core.list_namespaced_pod("default", label_selector="app=web").items[0].metadata.name
    reads = answered(sim, POD)
    waiter = subprocess.Popen(["kubectl", "wait", "--for=delete", f"pod/{pod}", "--timeout=30s"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # kubectl found the pod (a pod already gone when it looks is no "condition met"); from here on it
    # lists and watches from that list's resourceVersion, so a deletion is seen whenever it comes
    wait_until(lambda: answered(sim, POD) > reads or waiter.poll() is not None, timeout=30, what="kubectl to read the pod")
    core.delete_namespaced_pod(pod, "default")
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert f"pod/{pod} condition met" in out

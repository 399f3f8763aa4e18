"""The app's drain against the simulator's Kubernetes API (issue 10, "Kubernetes: the app" 1 and 2).

The simulator answers evictions as kube-apiserver does (sim/kube/api.py ``_evict``: NamespaceLifecycle
admission's 403 ``NamespaceTerminating``, the budget's 429/403, the multi-PDB 500). These tests run
the real Kubernetes adapter and the real remediation step against it:
- an eviction in a namespace being deleted is a 403 that the app waits out (no "check RBAC");
- a node with a pod that fails a drain filter is refused before any eviction is sent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from shared.drain.settings import DrainSettings
from shared.drain.state import DRAINED, DrainState, drain_step, record_eviction
from shared.kernel.clock import ScaledClock
from shared.kernel.ports import Record
from shared.remediation import records as remediation
from shared.remediation import steps as remediation_steps
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import State
from shared.settings import Settings
from tests.fakes.ledger import InMemoryLedger

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover - only while the simulator is being written
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app
from tests.waiting import wait_until

SUB = "8f2d4c1e-5a3b-4c7d-9e0f-0000000000d1"
GPU_POOL = "gput4"
SCENARIO: dict[str, Any] = {
    "seed": 7,
    "clock": {"speed": 1.0},
    "timings": {"node_ready_s": 1, "pod_start_s": 1, "pdb_observe_s": 60},
    "subscriptions": [{
        "id": SUB,
        "quotas": [{"location": "eastus", "family": "standardNCASv3_T4Family", "limit": 64},
                   {"location": "eastus", "family": "standardDSv5Family", "limit": 64}],
        "clusters": [{
            "name": "drain-lab", "resource_group": "rg-drain-lab", "location": "eastus",
            "tags": {"gpu-fleet-steward": "enabled"},
            "pools": [
                {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                {"name": GPU_POOL, "mode": "User", "vmSize": "Standard_NC8as_T4_v3", "count": 2,
                 "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}},
                 "nodeTaints": ["sku=gpu:NoSchedule"]},
            ],
            "workloads": [{
                "kind": "Deployment", "name": "trainer", "namespace": "ml", "replicas": 2,
                "resources": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"},
                "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
                "nodeSelector": {"kubernetes.azure.com/agentpool": GPU_POOL},
                "pdb": {"maxUnavailable": 1}, "terminationGracePeriodSeconds": 5,
            }],
        }],
    }],
}


class _Events:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, *, type_: str, subject: str, data: Any, id_: str | None = None, **_: Any) -> None:
        self.published.append({"type": type_, "subject": subject, "data": data})


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=SCENARIO) as handle:
        yield handle


@pytest.fixture(scope="module")
def clock(sim: SimHandle) -> ScaledClock:
    c = sim.endpoints["clock"]
    return ScaledClock(epoch_real=c["epoch_real"], epoch_sim=c["epoch_sim"], speed=c["speed"])


@pytest.fixture(scope="module")
def settings(sim: SimHandle) -> Settings:
    return app_settings(sim)


@pytest.fixture(scope="module")
def access(settings: Settings, clock: ScaledClock) -> Any:
    from shared.wiring import FleetAccess

    return FleetAccess(settings, clock=clock)


@pytest.fixture(scope="module")
def cid(sim: SimHandle) -> str:
    return str(sim.cluster("drain-lab")["id"])


def evictions_sent(sim: SimHandle) -> int:
    counts: dict[str, int] = sim.oracles()["requests"]
    return sum(n for route, n in counts.items() if route.startswith("POST ") and route.endswith("/eviction"))


def gpu_nodes(kube: Any) -> list[Any]:
    def both_ready() -> list[Any]:
        nodes = [n for n in kube.list_nodes(label_selector=f"kubernetes.azure.com/agentpool={GPU_POOL}") if n.ready]
        return nodes if len(nodes) == 2 else []

    return wait_until(both_ready, timeout=30, interval=0.2, what=f"both {GPU_POOL} nodes to be Ready")


@pytest.fixture(scope="module")
def core(sim: SimHandle) -> Any:
    """The plain Kubernetes client, as a user with kubectl would set the scene."""
    from kubernetes import client

    return client.CoreV1Api(sim.kube_client("drain-lab"))


def bare_pod(namespace: str, name: str, node: str, *, grace: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace,
                     "tolerations": [{"key": "sku", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "busybox"}]}}


def test_an_eviction_in_a_terminating_namespace_is_waited_out_not_failed_as_rbac(sim: SimHandle, access: Any, core: Any,
                                                                                 cid: str, clock: ScaledClock) -> None:
    kube = access.kube(cid)
    node = gpu_nodes(kube)[0].name
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}})
    core.create_namespaced_pod("doomed", bare_pod("doomed", "notebook", node, grace=2))
    rules = DrainSettings(unmanaged_pods="evict", drain_timeout_s=600)
    pods = [p for p in kube.list_pods(node_name=node) if p.namespace == "doomed"]
    state, actions = drain_step(node=node, pods=pods, previous=DrainState(), now=clock.now(), settings=rules)
    assert [a.name for a in actions] == ["notebook"]
    # the namespace is deleted between the plan and the eviction (the namespace controller is not done yet)
    core.delete_namespace("doomed")
    result = kube.evict("doomed", "notebook")  # an RBAC 403 would raise Forbidden here
    assert result.outcome == "namespace_terminating", result
    state = record_eviction(state, actions[0], result, now=clock.now(), grace=2, settings=rules)
    assert "namespace is being deleted" in state.messages["doomed/notebook"]

    def drained() -> bool:
        nonlocal state
        pods = [p for p in kube.list_pods(node_name=node) if p.namespace == "doomed"]
        state, actions = drain_step(node=node, pods=pods, previous=state, now=clock.now(), settings=rules)
        assert state.outcome in ("", DRAINED), state.reason
        for action in actions:
            state = record_eviction(state, action, kube.evict(action.namespace, action.name), now=clock.now(),
                                    grace=2, settings=rules)
        return state.outcome == DRAINED

    wait_until(drained, timeout=30, interval=0.25, what="the drain to end once the namespace's pod is gone")
    assert state.outcome == DRAINED
    assert sim.oracles()["pods_killed_without_eviction"] == []


def test_a_node_with_an_unmanaged_pod_is_refused_before_any_eviction_is_sent(sim: SimHandle, access: Any, core: Any,
                                                                            settings: Settings, cid: str,
                                                                            clock: ScaledClock) -> None:
    import dataclasses

    from shared.kernel.context import Context

    kube = access.kube(cid)
    nodes = gpu_nodes(kube)
    node = next(n for n in nodes if any(p.namespace == "ml" for p in kube.list_pods(node_name=n.name)))
    core.create_namespaced_pod("default", bare_pod("default", "scratch", node.name))
    trainers_before = {p.uid for p in kube.list_pods(namespace="ml") if p.deletion_timestamp is None}
    sent_before = evictions_sent(sim)

    policy = RemediationPolicy(drain_fallback="hold")
    ctx = Context(settings=dataclasses.replace(settings, remediation=policy), clock=clock, ledger=InMemoryLedger(),
                  access=access, events=_Events(), telemetry=None, instance="drain-sim")  # type: ignore[arg-type]
    # The world a real remediation in `draining` stands in (shared.remediation.preconditions): its fault on the
    # node, and the node cordoned under this record's marker.
    condition = {"cluster": cid.rsplit("/", 1)[-1], "node": node.name, "type": "UnhealthyNvidiaDevicePlugin"}
    sim.control("POST", "/conditions", {**condition, "status": "True", "fixed_by": "restart"})
    kube.patch_node(node.name, {"metadata": {"annotations": {"gpu-fleet-steward/cordoned-for": "rem-drain-sim"}},
                                "spec": {"unschedulable": True}})
    now = clock.now()
    record = Record(kind=remediation.KIND, id="rem-drain-sim", state=State.DRAINING, next_at=now,
                    created_at=now, updated_at=now,
                    data={"cluster": cid, "node": node.name, "node_uid": node.uid, "pool": GPU_POOL,
                          "arm_vm_id": node.provider_id.removeprefix("azure://"),
                          "pool_selector": f"kubernetes.azure.com/agentpool={GPU_POOL}",
                          "condition": "UnhealthyNvidiaDevicePlugin", "dry_run": False, "cordoned_by_us": False,
                          "drain": {}, "drain_started_at": now, "ladder": ["restart"], "attempt": 1})
    try:
        after = remediation_steps.advance(record, ctx)
    finally:
        sim.control("POST", "/conditions", {**condition, "status": "False", "fixed_by": "restart"})
        kube.patch_node(node.name, {"metadata": {"annotations": {"gpu-fleet-steward/cordoned-for": None}},
                                    "spec": {"unschedulable": False}})

    assert after.state == State.GAVE_UP, after.data.get("last_note")
    note = after.data["last_note"]
    assert "default/scratch" in note and "REMEDIATION_UNMANAGED_PODS=evict" in note
    assert evictions_sent(sim) == sent_before, "no eviction may be sent for a node that cannot be drained"
    assert {p.uid for p in kube.list_pods(namespace="ml") if p.deletion_timestamp is None} == trainers_before
    core.delete_namespaced_pod("scratch", "default", grace_period_seconds=0)


def test_a_pod_held_terminating_by_a_finalizer_is_skipped_after_the_skip_wait_timeout(sim: SimHandle, access: Any,
                                                                                      core: Any, cid: str,
                                                                                      clock: ScaledClock) -> None:
    kube = access.kube(cid)
    node = gpu_nodes(kube)[-1].name
    pod = bare_pod("default", "held", node, grace=1)
    pod["metadata"]["finalizers"] = ["example.com/hold"]
    core.create_namespaced_pod("default", pod)
    core.delete_namespaced_pod("held", "default")  # grace 1 s: deletionTimestamp = now + 1 s
    rules = DrainSettings(skip_wait_for_delete_timeout_s=2, drain_timeout_s=600)
    state = DrainState()
    looks = 0

    def skipped() -> bool:
        nonlocal state, looks
        pods = [p for p in kube.list_pods(node_name=node) if p.name == "held"]
        assert pods and pods[0].deletion_timestamp is not None, "the finalizer keeps the pod, Terminating"
        state, actions = drain_step(node=node, pods=pods, previous=state, now=clock.now(), settings=rules)
        assert actions == []
        looks += 1
        return state.outcome == DRAINED

    wait_until(skipped, timeout=20, interval=0.25, what="the drain to skip the pod held by its finalizer")
    assert looks > 1 and state.outcome == DRAINED  # the first look waited for the pod; a later one skipped it
    assert "DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S=2" in state.messages["default/held"]
    core.patch_namespaced_pod("held", "default", {"metadata": {"finalizers": None}})


def test_a_pdb_not_yet_observed_is_retried_after_the_servers_retry_after(sim: SimHandle, access: Any, core: Any,
                                                                       cid: str, clock: ScaledClock) -> None:
    from kubernetes import client

    kube = access.kube(cid)
    node = gpu_nodes(kube)[0].name
    pod = bare_pod("default", "probe", node)
    pod["metadata"]["labels"] = {"app": "probe"}
    core.create_namespaced_pod("default", pod)
    wait_until(lambda: core.read_namespaced_pod("probe", "default").status.phase == "Running", timeout=20,
               interval=0.2, what="the probe pod to run")
    policy_api = client.PolicyV1Api(sim.kube_client("drain-lab"))
    policy_api.create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "probe"},
        "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "probe"}}}})
    result = kube.evict("default", "probe")  # the disruption controller has not observed the new PDB yet
    assert (result.outcome, result.retry_after) == ("blocked", 10.0), result
    rules = DrainSettings(unmanaged_pods="evict")
    (probe,) = [p for p in kube.list_pods(node_name=node) if p.name == "probe"]
    now = clock.now()
    state, actions = drain_step(node=node, pods=[probe], previous=DrainState(), now=now, settings=rules)
    state = record_eviction(state, actions[0], result, now=now, grace=1, settings=rules)
    assert state.retry_at[probe.uid] == now + 10.0
    policy_api.delete_namespaced_pod_disruption_budget("probe", "default")
    core.delete_namespaced_pod("probe", "default", grace_period_seconds=0)

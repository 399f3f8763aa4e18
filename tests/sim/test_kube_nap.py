"""Node auto-provisioning: Karpenter NodePool / AKSNodeClass served, pending GPU pods get nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.scenario import SCENARIO_DIR
from sim.testing import SimHandle, start_sim
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO_DIR / "nap.yaml", seed=3) as handle:
        yield handle


@pytest.fixture(scope="module")
def api(sim: SimHandle) -> client.ApiClient:
    return sim.kube_client("auto")


def wait_for(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    return wait_until(check, timeout=timeout, what="the simulated cluster to get there")


def unschedulable(core: client.CoreV1Api, name: str) -> bool:
    """The scheduler looked at the pod and found no node for it. The simulator's controllers run in one
    pass after every write, the scheduler then the autoprovisioner (sim.model Cluster.reconcile), so a
    pod marked Unschedulable has also been offered to every NodePool."""
    conditions = core.read_namespaced_pod(name, "default").status.conditions or []
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)


def gpu_pod(name: str, toleration_value: str) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"app": name}), spec=client.V1PodSpec(
        containers=[client.V1Container(name="c", image="cuda", resources=client.V1ResourceRequirements(
            limits={"nvidia.com/gpu": "1"}))],
        tolerations=[client.V1Toleration(key="sku", operator="Equal", value=toleration_value, effect="NoSchedule")]))


def test_karpenter_kinds_are_in_discovery(api: client.ApiClient) -> None:
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["karpenter.sh"].preferred_version.version == "v1"
    assert groups["karpenter.azure.com"].preferred_version.version == "v1beta1"


def test_nodepools_and_nodeclasses_can_be_listed_created_patched_and_deleted(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    pools = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodepools")["items"]
    assert sorted(p["metadata"]["name"] for p in pools) == ["a100", "gpu"]
    classes = custom.list_cluster_custom_object("karpenter.azure.com", "v1beta1", "aksnodeclasses")["items"]
    managed = next(c for c in classes if c["metadata"]["name"] == "managed")
    assert managed["spec"]["tags"]["EnableManagedGPUExperience"] == "true"
    body = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "extra"},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.azure.com", "kind": "AKSNodeClass",
                                                             "name": "plain"}, "requirements": []}}}}
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", body)
    patched = custom.patch_cluster_custom_object("karpenter.sh", "v1", "nodepools", "extra",
                                                 {"spec": {"limits": {"cpu": "100"}}})
    assert patched["spec"]["limits"] == {"cpu": "100"}
    custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", "extra")
    with pytest.raises(ApiException) as e:
        custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", "extra")
    assert e.value.status == 404


def test_a_pending_gpu_pod_gets_a_managed_gpu_node_from_its_nodepool(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", gpu_pod("infer", "gpu"))
    node_name = wait_for(lambda: core.read_namespaced_pod("infer", "default").spec.node_name)
    node = core.read_node(node_name)
    labels = node.metadata.labels
    assert labels["karpenter.sh/nodepool"] == "gpu"
    assert labels["karpenter.azure.com/sku-family"] == "N"
    assert labels["karpenter.azure.com/sku-gpu-manufacturer"] == "nvidia"
    assert labels["kubernetes.azure.com/dcgm-exporter"] == "enabled"
    assert {"UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices"} <= {c.type for c in node.status.conditions}
    assert int(node.status.allocatable["nvidia.com/gpu"]) >= 1
    assert any(t.key == "sku" and t.value == "gpu" for t in node.spec.taints)
    wait_for(lambda: core.read_namespaced_pod("infer", "default").status.phase == "Running")
    claims = client.CustomObjectsApi(api).list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")["items"]
    assert node_name in [c["status"]["nodeName"] for c in claims]


def test_a_nodepool_pinned_to_an_instance_type_without_the_managed_tag_gets_no_dcgm(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", gpu_pod("a100-job", "a100"))
    node_name = wait_for(lambda: core.read_namespaced_pod("a100-job", "default").spec.node_name)
    labels = core.read_node(node_name).metadata.labels
    assert labels["node.kubernetes.io/instance-type"] == "Standard_NC24ads_A100_v4"
    assert labels["karpenter.sh/nodepool"] == "a100"
    assert "kubernetes.azure.com/dcgm-exporter" not in labels


def test_a_pod_no_nodepool_admits_stays_pending(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    before = len(core.list_node().items)
    core.create_namespaced_pod("default", gpu_pod("stranded", "nothing-tolerates-this"))
    wait_for(lambda: unschedulable(core, "stranded"))
    assert core.read_namespaced_pod("stranded", "default").spec.node_name is None
    assert len(core.list_node().items) == before


def test_an_app_style_nodepool_with_zones_spot_and_limits_provisions_within_its_limits(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "team-t4"},
        "spec": {"template": {"metadata": {"labels": {"team": "t4"}}, "spec": {
            "nodeClassRef": {"group": "karpenter.azure.com", "kind": "AKSNodeClass", "name": "managed"},
            "requirements": [
                {"key": "karpenter.azure.com/sku-family", "operator": "In", "values": ["N"]},
                {"key": "karpenter.azure.com/sku-gpu-manufacturer", "operator": "In", "values": ["nvidia"]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["Standard_NC8as_T4_v3"]},
                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eastus-2", "eastus-3"]}],
            "taints": [{"key": "sku", "value": "t4", "effect": "NoSchedule"}]}},
            "limits": {"cpu": "8", "nvidia.com/gpu": "1"}}})
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", gpu_pod("t4-a", "t4"))
    core.create_namespaced_pod("default", gpu_pod("t4-b", "t4"))
    node_name = wait_for(lambda: core.read_namespaced_pod("t4-a", "default").spec.node_name)
    labels = core.read_node(node_name).metadata.labels
    assert (labels["node.kubernetes.io/instance-type"], labels["karpenter.sh/capacity-type"],
            labels["topology.kubernetes.io/zone"], labels["team"]) == ("Standard_NC8as_T4_v3", "spot", "eastus-2", "t4")
    wait_for(lambda: unschedulable(core, "t4-b"))  # looked at, with the NodePool's node for t4-a already made
    assert core.read_namespaced_pod("t4-b", "default").spec.node_name is None  # the NodePool's limits are reached
    assert len(core.list_node(label_selector="karpenter.sh/nodepool=team-t4").items) == 1

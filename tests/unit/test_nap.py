"""A request for a node-auto-provisioning cluster becomes a Karpenter NodePool and AKSNodeClass."""

from __future__ import annotations

from typing import Any

import pytest

from shared.fleet import gpu_sizes
from shared.pools import nap
from shared.pools.policy import PoolRequestPolicy
from shared.pools.request import PoolRequest
from shared.pools.validation import ValidatedRequest, parse_and_validate
from tests.unit.fakes_pool import NAP_CLUSTER, message


def req(**overrides: Any) -> PoolRequest:
    result = parse_and_validate(message(cluster=NAP_CLUSTER, **overrides), policy=PoolRequestPolicy(),
                                in_scope=lambda _: True)
    assert isinstance(result, ValidatedRequest), result
    return result.request


def requirements(pool: dict[str, Any]) -> dict[str, list[str]]:
    return {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}


def build_pool(request: PoolRequest) -> dict[str, Any]:
    size = gpu_sizes.lookup(request.vm_size)
    assert size is not None
    return nap.node_pool(request, size=size, location="westeurope")


@pytest.mark.parametrize(("install", "managed_tag", "gpu_mode"), [
    pytest.param("managed", True, "driver", id="managed: the managed-GPU tag and the driver"),
    pytest.param("driverOnly", False, "driver", id="driver only: the driver, no tag"),
    pytest.param("none", False, "none", id="none: no driver, no tag"),
])
def test_the_node_class_carries_the_managed_gpu_tag_and_driver_mode(install: str, managed_tag: bool,
                                                                     gpu_mode: str) -> None:
    cls = nap.node_class(req(installProfile=install))
    assert (cls["apiVersion"], cls["kind"], cls["metadata"]["name"]) == ("karpenter.azure.com/v1beta1", "AKSNodeClass", "gpunp")
    assert (cls["spec"]["tags"].get("EnableManagedGPUExperience") == "true") is managed_tag
    assert cls["spec"]["gpu"] == {"mode": gpu_mode}


def test_the_node_class_uses_the_requested_image_family_and_max_pods() -> None:
    cls = nap.node_class(req(osSku="AzureLinux", maxPods=50))
    assert cls["spec"]["imageFamily"] == "AzureLinux" and cls["spec"]["maxPods"] == 50


def test_the_node_pool_restricts_karpenter_to_the_requested_nvidia_size() -> None:
    pool = build_pool(req(vmSize="Standard_NC24ads_A100_v4"))
    assert (pool["apiVersion"], pool["kind"]) == ("karpenter.sh/v1", "NodePool")
    found = requirements(pool)
    assert found["karpenter.azure.com/sku-family"] == ["N"]
    assert found["karpenter.azure.com/sku-gpu-manufacturer"] == ["nvidia"]
    assert found["node.kubernetes.io/instance-type"] == ["Standard_NC24ads_A100_v4"]
    assert found["karpenter.sh/capacity-type"] == ["on-demand"]
    assert pool["spec"]["template"]["spec"]["nodeClassRef"] == {"group": "karpenter.azure.com", "kind": "AKSNodeClass",
                                                                "name": "gpunp"}


def test_the_node_pool_carries_taints_labels_and_limits() -> None:
    pool = build_pool(req(count=3, labels={"team": "vision"}, taints=["sku=gpu:NoSchedule", "solo:NoExecute"]))
    spec = pool["spec"]
    assert spec["template"]["spec"]["taints"] == [{"key": "sku", "value": "gpu", "effect": "NoSchedule"},
                                                  {"key": "solo", "effect": "NoExecute"}]
    assert spec["template"]["metadata"]["labels"] == {"team": "vision"}
    assert spec["limits"] == {"cpu": "12", "nvidia.com/gpu": "3"}


def test_zones_and_spot_become_requirements() -> None:
    found = requirements(build_pool(req(zones=["1", "2"], spot={})))
    assert found["topology.kubernetes.io/zone"] == ["westeurope-1", "westeurope-2"]
    assert found["karpenter.sh/capacity-type"] == ["spot"]


def test_both_objects_record_the_request_that_made_them() -> None:
    request = req()
    for obj in (nap.node_class(request), build_pool(request)):
        assert nap.made_by(obj, "req-0001") and not nap.made_by(obj, "someone-else")


def test_mig_is_refused_on_node_auto_provisioning() -> None:
    assert nap.unsupported(req(vmSize="Standard_NC24ads_A100_v4", mig={"strategy": "Single", "profile": "MIG1g"}))
    assert nap.unsupported(req()) is None

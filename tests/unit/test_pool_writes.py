"""Issue 10, AKS/ARM 5: a write to an existing pool starts from its full GET body and changes only what it means to.

A pool PUT is create-or-replace: a field left out is reset (Azure/azure-resource-manager-rpc
v1.0/version-change.md, the GET-PUT pipeline). So the surge of a remediation (shared.remediation.replace
``pool_body``) and the freeze of an old pool during a migration (shared.fleet.pool_clone.frozen_old_pool)
send back every field of the pool as read, known to this app or not, minus only what ARM owns; a
body is sent on the first api-version that carries every property of it (shared.kernel.definitions.api_version_for).
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.fleet.pool_clone import NOT_WRITTEN_BACK, frozen_old_pool, update_properties
from shared.kernel.definitions import PREVIEW_API_VERSION, STABLE_API_VERSION, api_version_for
from shared.kernel.ports import PoolInfo
from shared.remediation.replace import pool_body as _pool_body

CID = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1"


def read_pool(**extra: Any) -> dict[str, Any]:
    """An agent pool as the preview api-version returns it, with fields this app has no list of."""
    return {
        "count": 3, "vmSize": "Standard_ND96asr_v4", "osType": "Linux", "osSKU": "AzureLinux", "mode": "User",
        "maxPods": 50, "availabilityZones": ["1", "2"], "scaleSetPriority": "Regular",
        "enableAutoScaling": True, "minCount": 1, "maxCount": 5,
        "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single",
                                                       "migProfiles": ["MIG3g"]}},
        "nodeInitializationTaints": ["boot=wait:NoSchedule"], "gatewayProfile": {"publicIPPrefixSize": 31},
        "artifactStreamingProfile": {"enabled": True}, "powerState": {"code": "Running"},
        "tags": {"team": "vision"}, "upgradeSettings": {"maxSurge": "33%", "drainTimeoutInMinutes": 45},
        # what ARM owns
        "provisioningState": "Succeeded", "eTag": "\"abc\"", "currentOrchestratorVersion": "1.33.2",
        "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202611.05.0",
        "status": {"provisioningError": None}, **extra,
    }


def pool(**extra: Any) -> PoolInfo:
    return PoolInfo(cluster_id=CID, name="gpu", properties=read_pool(**extra))


def kept(body: dict[str, Any], *, changed: set[str]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in changed}


def test_a_surge_body_is_the_whole_pool_with_only_the_count_changed() -> None:
    body = _pool_body(pool(), 4)["properties"]
    expected = {k: v for k, v in read_pool().items() if k not in NOT_WRITTEN_BACK}
    assert body["count"] == 4
    assert kept(body, changed={"count"}) == kept(expected, changed={"count"})


@pytest.mark.parametrize("field", ["nodeInitializationTaints", "gatewayProfile", "artifactStreamingProfile",
                                   "powerState", "upgradeSettings", "osSKU", "availabilityZones", "maxPods"])
def test_freezing_the_old_pool_keeps_fields_this_app_has_no_list_of(field: str) -> None:
    frozen = frozen_old_pool(pool(), enable_autoscaling=False)
    assert frozen[field] == read_pool()[field]


def test_freezing_changes_only_the_autoscaler_and_its_bounds() -> None:
    frozen = frozen_old_pool(pool(), enable_autoscaling=False)
    assert (frozen["enableAutoScaling"], frozen["count"]) == (False, 3)
    assert "minCount" not in frozen and "maxCount" not in frozen
    expected = {k: v for k, v in read_pool().items() if k not in NOT_WRITTEN_BACK}
    assert kept(frozen, changed={"enableAutoScaling", "minCount", "maxCount"}) == \
        kept(expected, changed={"enableAutoScaling", "minCount", "maxCount"})
    restored = frozen_old_pool(PoolInfo(cluster_id=CID, name="gpu", properties=frozen), enable_autoscaling=True,
                               min_count=1, max_count=5)
    assert kept(restored, changed=set()) == expected


@pytest.mark.parametrize("field", sorted(NOT_WRITTEN_BACK))
def test_what_arm_owns_is_never_written_back(field: str) -> None:
    assert field not in update_properties(pool(), count=1)


def test_a_mig_pools_body_needs_the_preview_api_version_and_a_plain_one_does_not() -> None:
    assert api_version_for(_pool_body(pool(), 4)["properties"]) == PREVIEW_API_VERSION
    plain = {k: v for k, v in read_pool().items() if k not in ("nodeInitializationTaints",)}
    plain["gpuProfile"] = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
    body = _pool_body(PoolInfo(cluster_id=CID, name="gpu", properties=plain), 4)["properties"]
    assert api_version_for(body) == STABLE_API_VERSION


@pytest.mark.parametrize("kubelet", [
    {"kubeReserved": {"cpuMillicores": 200, "memoryMB": 1024}},
    {"hardEvictionThreshold": {"memoryAvailable": "500Mi"}},
    {"softEvictionThreshold": {"memoryAvailable": "1Gi"}, "softEvictionGracePeriod": {"memoryAvailable": "1m30s"}},
    {"evictionMaxPodGracePeriodInSeconds": 60},
    {"seccompDefault": "RuntimeDefault"},
], ids=["kubeReserved", "hardEvictionThreshold", "softEviction", "evictionMaxPodGracePeriod", "seccompDefault"])
def test_a_pool_with_a_preview_kubelet_setting_is_written_back_on_the_preview_api_version(kubelet: dict) -> None:
    plain = {k: v for k, v in read_pool().items() if k not in ("nodeInitializationTaints",)}
    plain["gpuProfile"] = {"driver": "Install"}
    plain["kubeletConfig"] = {"cpuManagerPolicy": "static", **kubelet}
    body = _pool_body(PoolInfo(cluster_id=CID, name="gpu", properties=plain), 4)["properties"]
    assert body["kubeletConfig"] == plain["kubeletConfig"]
    assert api_version_for(body) == PREVIEW_API_VERSION

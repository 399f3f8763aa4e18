"""The replacement pool is the old pool field by field, except the GPU profile and the documented exceptions."""

from __future__ import annotations

from typing import Any

import pytest

from shared.fleet.pool_clone import (
    CLONE_TABLE,
    COPY,
    MANAGED_GPU_PROFILE,
    NAME_PATTERN,
    OMIT,
    TAG_AUTOSCALER,
    TAG_MIGRATED_FROM,
    clone_differences,
    clone_for_managed,
    frozen_old_pool,
    replacement_name,
)
from shared.kernel.ports import PoolInfo

CID = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1"


def arm_pool(**props: Any) -> dict[str, Any]:
    """An agent pool's properties as ARM returns them, read-only fields included."""
    base: dict[str, Any] = {
        "count": 3, "vmSize": "Standard_NC4as_T4_v3", "osType": "Linux", "osSKU": "Ubuntu", "osDiskSizeGB": 128,
        "osDiskType": "Managed", "kubeletDiskType": "OS", "maxPods": 30, "mode": "User", "type": "VirtualMachineScaleSets",
        "orchestratorVersion": "1.33", "currentOrchestratorVersion": "1.33.2", "provisioningState": "Succeeded",
        "powerState": {"code": "Running"}, "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202611.01.0",
        "availabilityZones": ["1", "2"], "vnetSubnetID": "/subscriptions/s/.../subnets/gpu",
        "enableNodePublicIP": False, "scaleDownMode": "Delete",
        "nodeLabels": {"team": "vision", "kubernetes.azure.com/scalesetpriority": "spot", "kubernetes.io/role": "gpu",
                       "workload": "training"},
        "nodeTaints": ["sku=gpu:NoSchedule"], "tags": {"cost-center": "42"},
        "upgradeSettings": {"maxSurge": "10%"}, "enableEncryptionAtHost": True, "enableFIPS": False,
        "kubeletConfig": {"cpuManagerPolicy": "static"}, "linuxOSConfig": {"swapFileSizeMB": 0},
        "securityProfile": {"enableSecureBoot": False}, "enableAutoScaling": False,
        "gpuProfile": {"driver": "Install"}, "status": {"provisioningError": None},
        "creationData": {"sourceResourceId": "/snapshots/x"}, "eTag": "abc",
    }
    base.update(props)
    return base


CASES = {
    "T4 Ubuntu, taints and labels, two zones": arm_pool(),
    "A100 AzureLinux spot": arm_pool(vmSize="Standard_NC24ads_A100_v4", osSKU="AzureLinux", scaleSetPriority="Spot",
                                     scaleSetEvictionPolicy="Delete", spotMaxPrice=-1,
                                     nodeTaints=["sku=gpu:NoSchedule", "kubernetes.azure.com/scalesetpriority=spot:NoSchedule"]),
    "H100 Ubuntu autoscaler on": arm_pool(vmSize="Standard_NC40ads_H100_v5", enableAutoScaling=True, minCount=2, maxCount=6,
                                          count=4, availabilityZones=["3"]),
    "H100 AzureLinux autoscaler on, count below min": arm_pool(vmSize="Standard_NC40ads_H100_v5", osSKU="AzureLinux",
                                                               enableAutoScaling=True, minCount=2, maxCount=6, count=1),
    "T4 with no labels or zones": arm_pool(nodeLabels=None, availabilityZones=None, gpuProfile=None),
}


@pytest.mark.parametrize("props", CASES.values(), ids=CASES.keys())
def test_the_clone_equals_the_old_pool_field_by_field_except_the_gpu_profile_and_documented_exceptions(props: dict) -> None:
    old = PoolInfo(cluster_id=CID, name="gpu", properties=props)
    body = clone_for_managed(old, new_name="gpum1")
    assert body["gpuProfile"] == MANAGED_GPU_PROFILE
    for key, rule in CLONE_TABLE.items():
        if rule.action == COPY:
            assert body.get(key) == props.get(key), key
        elif rule.action == OMIT:
            assert key not in body, key
    differences = clone_differences(old, body)
    assert "changed" not in differences.values()
    assert all(CLONE_TABLE[key].action != COPY for key in differences)


def test_reserved_node_labels_are_dropped_and_the_others_copied() -> None:
    body = clone_for_managed(PoolInfo(cluster_id=CID, name="gpu", properties=arm_pool()), new_name="gpum1")
    assert body["nodeLabels"] == {"team": "vision", "workload": "training"}


def test_the_replacement_is_tagged_as_a_migration_and_keeps_the_old_tags() -> None:
    body = clone_for_managed(PoolInfo(cluster_id=CID, name="gpu", properties=arm_pool()), new_name="gpum1")
    assert body["tags"] == {"cost-center": "42", TAG_MIGRATED_FROM: "gpu"}


@pytest.mark.parametrize(("props", "count"), [
    (arm_pool(count=3), 3),
    (arm_pool(enableAutoScaling=True, minCount=2, maxCount=6, count=4), 4),
    (arm_pool(enableAutoScaling=True, minCount=2, maxCount=6, count=1), 2),
    (arm_pool(enableAutoScaling=True, minCount=0, maxCount=3, count=5), 3),
], ids=["fixed count", "autoscaler within bounds", "autoscaler below min", "autoscaler above max"])
def test_the_autoscaler_is_off_and_the_count_is_what_runs_now_within_the_old_bounds(props: dict, count: int) -> None:
    body = clone_for_managed(PoolInfo(cluster_id=CID, name="gpu", properties=props), new_name="gpum1")
    assert body["enableAutoScaling"] is False
    assert body["count"] == count
    if props.get("enableAutoScaling"):
        assert body["tags"][TAG_AUTOSCALER] == f"{props['minCount']}-{props['maxCount']}"


def test_a_rolling_start_overrides_the_count() -> None:
    body = clone_for_managed(PoolInfo(cluster_id=CID, name="gpu", properties=arm_pool()), new_name="gpum1", count=1)
    assert body["count"] == 1


def test_an_invalid_replacement_name_is_refused() -> None:
    with pytest.raises(ValueError, match="does not match"):
        clone_for_managed(PoolInfo(cluster_id=CID, name="gpu", properties=arm_pool()), new_name="GPU-new")


def test_freezing_the_old_pool_changes_only_its_scaling() -> None:
    props = arm_pool(enableAutoScaling=True, minCount=1, maxCount=5, count=3, gpuProfile={"driver": "Install"})
    frozen = frozen_old_pool(PoolInfo(cluster_id=CID, name="gpu", properties=props), enable_autoscaling=False)
    assert frozen["enableAutoScaling"] is False and "minCount" not in frozen and frozen["count"] == 3
    assert frozen["gpuProfile"] == {"driver": "Install"} and "nodeImageVersion" not in frozen
    restored = frozen_old_pool(PoolInfo(cluster_id=CID, name="gpu", properties=frozen), enable_autoscaling=True,
                               min_count=1, max_count=5)
    assert (restored["enableAutoScaling"], restored["minCount"], restored["maxCount"]) == (True, 1, 5)


@pytest.mark.parametrize(("old", "existing", "expected"), [
    ("gpu", [], "gpum1"),
    ("gpu", ["gpum1"], "gpum2"),
    ("gpupool", ["gpupoolm1", "gpupoolm2"], "gpupoolm3"),
    ("verylongname", [], "verylongnam1"),
    ("verylongname", ["verylongnam1"], "verylongnam2"),
    ("abcdefghijkl", [f"abcdefghijm{i}" for i in range(1, 10)], "abcdefghim10"),
    ("t4", ["T4M1"], "t4m2"),
], ids=["short name", "first suffix taken", "two taken", "twelve characters cut", "cut and taken",
        "two-digit suffix", "case-insensitive collision"])
def test_replacement_names_are_valid_deterministic_and_free(old: str, existing: list[str], expected: str) -> None:
    name = replacement_name(old, existing)
    assert name == expected
    assert NAME_PATTERN.match(name)
    assert name.lower() not in {e.lower() for e in existing}
    assert replacement_name(old, existing) == name

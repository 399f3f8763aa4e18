"""The AgentPool body sends the GPU profile explicitly and asks for the preview api only for MIG."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.definitions import PREVIEW_API_VERSION, STABLE_API_VERSION
from shared.pools.policy import PoolRequestPolicy
from shared.pools.request import PoolRequest
from shared.pools.spec import (
    SPOT_TAINT,
    TAG_MANAGED_GPU,
    TAG_REQUEST_ID,
    TAG_REQUESTER,
    agent_pool_body,
    created_by,
    pool_taints,
    spec_differences,
)
from shared.pools.validation import ValidatedRequest, parse_and_validate
from tests.unit.fakes_pool import message

A100 = "Standard_NC24ads_A100_v4"


def req(**overrides: Any) -> PoolRequest:
    result = parse_and_validate(message(**overrides), policy=PoolRequestPolicy(), in_scope=lambda _: True)
    assert isinstance(result, ValidatedRequest), result
    return result.request


@pytest.mark.parametrize(("overrides", "gpu_profile", "preview"), [
    pytest.param({}, {"driver": "Install", "nvidia": {"managementMode": "Managed"}}, False,
                 id="managed: driver Install and Managed, stable api"),
    # Issue 10 ARM 4: driver-only and no-driver pools carry no nvidia block (it is the managed experience's).
    pytest.param({"installProfile": "driverOnly"}, {"driver": "Install"},
                 False, id="driver only: Install and no nvidia block"),
    pytest.param({"installProfile": "none"}, {"driver": "None"}, False,
                 id="none: driver None and no nvidia block"),
    # Issue 10 ARM 3: managed MIG as 2026-08-02-preview documents it (examples/AgentPoolsCreate_SingleMIG.json).
    pytest.param({"vmSize": A100, "mig": {"strategy": "Single", "profile": "MIG3g"}},
                 {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single",
                                                  "migProfiles": ["MIG3g"]}}, True,
                 id="MIG single needs the preview api"),
    pytest.param({"vmSize": A100, "mig": {"strategy": "Mixed", "profile": "MIG1g"}},
                 {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Mixed",
                                                  "migProfiles": ["MIG1g"]}}, True,
                 id="MIG mixed needs the preview api"),
    pytest.param({"vmSize": A100, "installProfile": "driverOnly", "mig": {"profile": "MIG2g"}},
                 {"driver": "Install"}, False,
                 id="classic MIG (profile only) stays on the stable api"),
])
def test_each_install_profile_becomes_an_explicit_gpu_profile(overrides: dict[str, Any], gpu_profile: dict[str, Any],
                                                              preview: bool) -> None:
    body, api_version = agent_pool_body(req(**overrides))
    assert body["properties"]["gpuProfile"] == gpu_profile
    assert api_version == (PREVIEW_API_VERSION if preview else STABLE_API_VERSION)


@pytest.mark.parametrize(("mig", "profile"), [
    pytest.param({"strategy": "Single", "profile": "MIG3g"}, "MIG3g", id="single"),
    pytest.param({"strategy": "Mixed", "profile": "MIG1g"}, "MIG1g", id="mixed"),
])
def test_managed_mig_sends_mig_profiles_and_never_the_exclusive_gpu_instance_profile(mig: dict[str, str],
                                                                                    profile: str) -> None:
    # 2026-08-02-preview: migProfiles "is mutually exclusive with the top-level gpuInstanceProfile property".
    body, _ = agent_pool_body(req(vmSize=A100, mig=mig))
    assert body["properties"]["gpuProfile"]["nvidia"]["migProfiles"] == [profile]
    assert "gpuInstanceProfile" not in body["properties"]


def test_classic_mig_keeps_the_top_level_gpu_instance_profile() -> None:
    body, api_version = agent_pool_body(req(vmSize=A100, installProfile="driverOnly", mig={"profile": "MIG2g"}))
    assert body["properties"]["gpuInstanceProfile"] == "MIG2g" and api_version == STABLE_API_VERSION


def test_the_minimal_request_is_the_seeds_az_aks_nodepool_add() -> None:
    props = agent_pool_body(req())[0]["properties"]
    assert props["vmSize"] == "Standard_NC4as_T4_v3" and props["count"] == 1
    assert props["nodeTaints"] == ["sku=gpu:NoSchedule"]
    assert (props["osType"], props["osSKU"], props["mode"]) == ("Linux", "Ubuntu", "User")
    assert props["enableAutoScaling"] is False
    for absent in ("gpuInstanceProfile", "availabilityZones", "maxPods", "scaleSetPriority", "minCount"):
        assert absent not in props


def test_every_requested_setting_reaches_the_body() -> None:
    props = agent_pool_body(req(osSku="AzureLinux", zones=["1", "3"], maxPods=60, count=2,
                                labels={"team": "vision"}, taints=["dedicated=ml:NoExecute"],
                                tags={"costCenter": "42"}))[0]["properties"]
    assert props["osSKU"] == "AzureLinux" and props["availabilityZones"] == ["1", "3"]
    assert props["maxPods"] == 60 and props["count"] == 2
    assert props["nodeLabels"] == {"team": "vision"} and props["nodeTaints"] == ["dedicated=ml:NoExecute"]
    assert props["tags"]["costCenter"] == "42"


def test_the_pool_is_tagged_with_the_request_and_the_requester() -> None:
    tags = agent_pool_body(req())[0]["properties"]["tags"]
    assert tags[TAG_REQUEST_ID] == "req-0001" and tags[TAG_REQUESTER] == "team-vision@contoso.com"
    assert tags[TAG_MANAGED_GPU] == "true"
    assert TAG_MANAGED_GPU not in agent_pool_body(req(installProfile="driverOnly"))[0]["properties"]["tags"]


def test_spot_fields_are_sent_for_a_spot_request() -> None:
    props = agent_pool_body(req(spot={"maxPrice": 0.5, "evictionPolicy": "Deallocate"}))[0]["properties"]
    assert (props["scaleSetPriority"], props["scaleSetEvictionPolicy"], props["spotMaxPrice"]) == ("Spot", "Deallocate", 0.5)
    assert "scaleSetPriority" not in agent_pool_body(req(spot={"enabled": False}))[0]["properties"]


def test_autoscale_sets_min_and_max_and_starts_at_min() -> None:
    props = agent_pool_body(req(installProfile="driverOnly", count=..., autoscale={"min": 2, "max": 5}))[0]["properties"]
    assert (props["enableAutoScaling"], props["minCount"], props["maxCount"], props["count"]) == (True, 2, 5, 2)


def test_a_spot_pool_carries_the_spot_taint_too() -> None:
    assert ("kubernetes.azure.com/scalesetpriority", "spot", "NoSchedule") in pool_taints(req(spot={}))
    assert SPOT_TAINT.startswith("kubernetes.azure.com/scalesetpriority")
    assert pool_taints(req()) == [("sku", "gpu", "NoSchedule")]


def test_a_pool_is_recognised_by_its_request_tag() -> None:
    props = agent_pool_body(req())[0]["properties"]
    assert created_by(props, "req-0001") and not created_by(props, "req-0002") and not created_by({}, "req-0001")


def test_an_existing_pool_with_another_gpu_profile_is_a_difference() -> None:
    managed = req()
    assert spec_differences(agent_pool_body(managed)[0]["properties"], managed) == []
    other = agent_pool_body(req(installProfile="driverOnly"))[0]["properties"]
    assert any("managementMode" in d for d in spec_differences(other, managed))
    bigger = {**agent_pool_body(managed)[0]["properties"], "vmSize": "Standard_NC8as_T4_v3"}
    assert any("vmSize" in d for d in spec_differences(bigger, managed))

"""Issue 10, AKS/ARM 3, 4, 5, 7: the real ARM adapter (azure-mgmt-containerservice) against the simulator.

- Pools are read on the api-version that shows all their fields, and the writes to existing pools
  (a migration freezing the old pool, a remediation's surge) send every field back, known to the app
  or not, on the api-version the body needs: nothing is reset by the create-or-replace PUT.
- A managed pool on a subscription without ``ManagedGPUExperiencePreview`` is FeatureNotRegistered,
  naming the feature; a driver-only pool does not need it.
- Quota and busy answers come back as QuotaExceeded / OperationInProgress, by code.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.kernel.clock import ManualClock
from shared.kernel.errors import FeatureNotRegistered, OperationInProgress, QuotaExceeded
from shared.kernel.ports import PoolInfo
from shared.settings import Settings

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app
from tests.waiting import wait_until

FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"
PREVIEW_SUB = "8f2d4c1e-5a3b-4c7d-9e0f-0000000000f9"
SPEED = 60.0  # a pool operation of 60 sim seconds takes one real second
A100 = "Standard_ND96asr_v4"
MIG_GPU = {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single", "migProfiles": ["MIG3g"]}}


def scenario() -> dict[str, Any]:
    """The default fleet plus a subscription that has not registered the managed GPU preview feature."""
    sc = yaml.safe_load(Path("sim/scenarios/default.yaml").read_text())
    sc = copy.deepcopy(sc)
    for quota in sc["subscriptions"][0]["quotas"]:  # room for this module's A100 pool
        if quota["family"] == "standardNDASv4_A100Family":
            quota["limit"] = 1000
    sc["capacity"] = [{"location": "eastus", "vmSize": A100, "available": 10}]
    sc["subscriptions"].append({
        "id": PREVIEW_SUB, "features": {FEATURE: "NotRegistered"},
        "quotas": [{"location": "eastus", "family": "standardNCASv3_T4Family", "limit": 64}],
        "clusters": [{"name": "no-preview", "resource_group": "rg-no-preview", "location": "eastus",
                      "tags": {"gpu-fleet-steward": "enabled"},
                      "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}]})
    return sc


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=scenario(), speed=SPEED) as handle:
        yield handle


@pytest.fixture(scope="module")
def settings(sim: SimHandle) -> Settings:
    return app_settings(sim)


@pytest.fixture(scope="module")
def aks(settings: Settings) -> Any:
    from shared.wiring import FleetAccess

    return FleetAccess(settings, clock=ManualClock()).aks()


def cid(sim: SimHandle, name: str) -> str:
    return str(sim.cluster(name)["id"])


def settled(aks: Any, cluster: str, pool: str, *, timeout_s: float = 30.0) -> PoolInfo:
    def look() -> PoolInfo | None:
        info = aks.get_pool(cluster, pool)
        assert info is not None
        return info if info.provisioning_state in ("Succeeded", "Failed") else None

    return wait_until(look, timeout=timeout_s, interval=0.2, what=f"{pool} to finish provisioning")  # type: ignore[no-any-return]


def test_freezing_an_old_pool_through_the_adapter_keeps_the_fields_the_app_does_not_know(sim: SimHandle,
                                                                                       aks: Any) -> None:
    from shared.fleet.pool_clone import frozen_old_pool

    platform = cid(sim, "ml-platform")
    aks.begin_put_pool(platform, "frozen", {
        "vmSize": "Standard_NC4as_T4_v3", "count": 1, "mode": "User", "osType": "Linux", "osSKU": "AzureLinux",
        "gpuProfile": {"driver": "Install"}, "enableAutoScaling": True, "minCount": 1, "maxCount": 3,
        "nodeInitializationTaints": ["boot=wait:NoSchedule"], "upgradeSettings": {"maxSurge": "33%"},
        "nodeLabels": {"team": "vision"}})
    old = settled(aks, platform, "frozen")
    assert old.properties["nodeInitializationTaints"] == ["boot=wait:NoSchedule"]
    aks.begin_put_pool(platform, "frozen", {"properties": frozen_old_pool(old, enable_autoscaling=False)})
    after = settled(aks, platform, "frozen").properties
    assert after["enableAutoScaling"] is False and after["count"] == 1
    assert after["nodeInitializationTaints"] == ["boot=wait:NoSchedule"]
    assert after["upgradeSettings"] == {"maxSurge": "33%"} and after["osSKU"] == "AzureLinux"
    assert after["nodeLabels"] == {"team": "vision"}


def test_a_surge_of_a_mig_pool_reads_and_writes_its_mig_fields_on_the_preview_api(sim: SimHandle, aks: Any) -> None:
    from shared.remediation.replace import pool_body as _pool_body

    platform = cid(sim, "ml-platform")
    aks.begin_put_pool(platform, "migsurge", {"vmSize": A100, "count": 1, "mode": "User", "osType": "Linux",
                                              "gpuProfile": MIG_GPU})
    pool = settled(aks, platform, "migsurge")
    assert pool.properties["gpuProfile"] == MIG_GPU  # read on the api-version that shows it
    aks.begin_put_pool(platform, "migsurge", _pool_body(pool, 2))
    after = settled(aks, platform, "migsurge")
    assert after.count == 2 and after.properties["gpuProfile"] == MIG_GPU


def test_a_managed_pool_without_the_preview_feature_is_feature_not_registered(sim: SimHandle, aks: Any) -> None:
    cluster = cid(sim, "no-preview")
    with pytest.raises(FeatureNotRegistered) as raised:
        aks.begin_put_pool(cluster, "gpu", {"vmSize": "Standard_NC4as_T4_v3", "count": 1,
                                            "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}})
    assert raised.value.feature == FEATURE and raised.value.code == "PreviewFeatureNotRegistered"
    aks.begin_put_pool(cluster, "drv", {"vmSize": "Standard_NC4as_T4_v3", "count": 1, "gpuProfile": {"driver": "Install"}})
    assert aks.get_pool(cluster, "drv") is not None


def test_an_aks_pre_flight_quota_refusal_is_quota_exceeded(sim: SimHandle, aks: Any) -> None:
    sim.control("POST", "/faults", {"target": "arm", "method": "PUT", "path": "agentPools/preflight", "status": 400,
                                    "code": "InsufficientVCPUQuota", "count": 1,
                                    "message": "Insufficient vcpu quota requested 4, remaining 0 for family "
                                               "standardNCASv3_T4Family for region eastus."})
    with pytest.raises(QuotaExceeded) as raised:
        aks.begin_put_pool(cid(sim, "ml-platform"), "preflight", {"vmSize": "Standard_NC4as_T4_v3", "count": 1})
    assert raised.value.code == "InsufficientVCPUQuota"


def test_a_quota_refused_at_deployment_fails_the_pool_with_quota_exceeded_in_its_details(sim: SimHandle,
                                                                                          aks: Any) -> None:
    sim.control("POST", "/faults", {"target": "lro", "path": "agentPools/deployquota", "code": "QuotaExceeded",
                                    "count": 1, "message": "Operation could not be completed as it results in "
                                                           "exceeding approved standardNCASv3_T4Family Cores quota."})
    platform = cid(sim, "ml-platform")
    aks.begin_put_pool(platform, "deployquota", {"vmSize": "Standard_NC4as_T4_v3", "count": 1})
    failed = settled(aks, platform, "deployquota")
    assert failed.provisioning_state == "Failed"
    assert failed.provisioning_error[0] == "QuotaExceeded"


def test_a_write_while_the_pool_is_busy_is_operation_in_progress(sim: SimHandle, aks: Any) -> None:
    platform = cid(sim, "ml-platform")
    body = {"vmSize": "Standard_D4s_v5", "count": 1, "mode": "User"}
    aks.begin_put_pool(platform, "busy", body)
    with pytest.raises(OperationInProgress):
        aks.begin_put_pool(platform, "busy", dict(body, count=2))


def test_deleting_a_machine_that_is_already_gone_is_done_without_reading_the_error_text(sim: SimHandle,
                                                                                        aks: Any) -> None:
    from shared.kernel.errors import Invalid

    train = cid(sim, "ml-train")
    aks.begin_delete_machines(train, "gput4", ["aks-gput4-00000000-vmss00zzzz"])  # never existed: nothing to do
    present = aks.list_machines(train, "gput4")[0].name
    with pytest.raises(Invalid):  # one of them still exists: ARM's refusal stands
        aks.begin_delete_machines(train, "gput4", [present, "aks-gput4-00000000-vmss00zzzz"])

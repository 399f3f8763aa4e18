"""Issue 10, AKS/ARM 3, 4, 5, 7: the simulated AKS agent-pool writes are as strict as the real ones.

- MIG on 2026-08-02-preview is ``gpuProfile.nvidia.migProfiles`` (spec: "mutually exclusive with the
  top-level gpuInstanceProfile", Single = exactly one profile, Mixed = a combination that fits the GPU).
- A managed GPU pool needs the subscription's ``ManagedGPUExperiencePreview`` feature; AKS answers
  ``PreviewFeatureNotRegistered`` otherwise, and Microsoft.Features shows and registers it.
- A PUT is create-or-replace: a field left out is reset (an immutable one left out is a change),
  except fields the request's api-version cannot express.
- Compute's quota refusal at deployment time comes back wrapped (InvalidTemplateDeployment with
  ``details[].code == QuotaExceeded``), on the operation and on the pool's ``status.provisioningError``.

In-process on a manual sim clock (milliseconds each), like test_arm_handler.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.arm.api import ArmApi
from sim.core.http import Headers, Request, Response
from sim.model import Fleet, SimClock
from sim.scenario import build_fleet

SUB = "00000000-0000-0000-0000-00000000aaaa"
MANAGED_GPU_FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"
ARM = "https://management.azure.com/"
HOST = "127.0.0.1:8443"
T4 = "Standard_NC4as_T4_v3"
A100 = "Standard_ND96asr_v4"
PREVIEW = "2026-08-02-preview"
MANAGED = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
# specification/.../aks/preview/2026-08-02-preview/examples/AgentPoolsCreate_SingleMIG.json, request body.
SINGLE_MIG_EXAMPLE = {"count": 3, "mode": "User", "osType": "Linux", "vmSize": A100,
                      "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single",
                                                                     "migProfiles": ["MIG3g"]}}}


class Arm:
    def __init__(self, fleet: Fleet | None = None, *, cluster: Any = None) -> None:
        self.fleet = fleet or Fleet(seed=7, clock=SimClock(manual=True))
        if cluster is None:
            cluster = self.fleet.add_cluster(subscription=SUB, resource_group="rg1", name="c1")
        self.cluster = cluster
        self.api = ArmApi(self.fleet)
        self.token = self.fleet.tokens.issue(ARM)[0]

    def call(self, method: str, path: str, body: Any = None, *, api_version: str | None = "2026-08-01") -> Response:
        if api_version is not None:
            path += ("&" if "?" in path else "?") + f"api-version={api_version}"
        h = Headers({"Host": HOST, "Authorization": f"Bearer {self.token}"})
        payload = json.dumps(body).encode() if body is not None else b""
        return self.api.handle(Request(method, path, h, payload))

    def pool_path(self, name: str) -> str:
        return f"{self.cluster.id}/agentPools/{name}"

    def put(self, name: str, props: dict[str, Any], *, api_version: str = "2026-08-01") -> Response:
        return self.call("PUT", self.pool_path(name), {"properties": props}, api_version=api_version)

    def props(self, name: str, *, api_version: str = PREVIEW) -> dict[str, Any]:
        resp = self.call("GET", self.pool_path(name), api_version=api_version)
        assert resp.status == 200, resp.body
        return dict(body(resp)["properties"])

    def created(self, name: str, props: dict[str, Any], *, api_version: str = "2026-08-01") -> dict[str, Any]:
        resp = self.put(name, props, api_version=api_version)
        assert resp.status == 201, resp.body
        self.fleet.advance(120)
        return self.props(name)

    def feature(self, name: str = "ManagedGPUExperiencePreview", *, action: str = "") -> Response:
        path = (f"/subscriptions/{self.cluster.subscription}/providers/Microsoft.Features/providers/"
                f"Microsoft.ContainerService/features/{name}")
        return self.call("POST" if action else "GET", path + (f"/{action}" if action else ""), api_version="2021-07-01")


def body(resp: Response) -> dict[str, Any]:
    return json.loads(resp.body) if resp.body else {}


def arm_error(resp: Response) -> dict[str, Any]:
    """The error object: wrapped by ARM's gateway, flat from the AKS resource provider (test_arm_recorded_shapes.py)."""
    b = body(resp)
    return dict(b["error"]) if isinstance(b.get("error"), dict) else b


def error(resp: Response) -> tuple[int, str, str]:
    err = arm_error(resp)
    return resp.status, err.get("code", ""), err.get("target", "")


def writable(props: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k not in ("provisioningState", "eTag", "nodeImageVersion",
                                                        "currentOrchestratorVersion", "powerState")}


@pytest.fixture
def arm() -> Arm:
    return Arm()


# --------------------------------------------------------------------------- ARM 3: MIG on the preview api-version


def test_the_documented_single_mig_example_is_accepted_and_read_back_as_sent(arm: Arm) -> None:
    resp = arm.put("mig", dict(SINGLE_MIG_EXAMPLE), api_version=PREVIEW)
    assert resp.status == 201, resp.body
    assert body(resp)["properties"]["gpuProfile"] == SINGLE_MIG_EXAMPLE["gpuProfile"]
    assert "gpuInstanceProfile" not in body(resp)["properties"]


@pytest.mark.parametrize(("nvidia", "extra", "target"), [
    pytest.param({"migStrategy": "Single"}, {"gpuInstanceProfile": "MIG3g"}, "properties.gpuInstanceProfile",
                 id="managed MIG through the top-level gpuInstanceProfile"),
    pytest.param({"migStrategy": "Single", "migProfiles": ["MIG3g"]}, {"gpuInstanceProfile": "MIG3g"},
                 "properties.gpuInstanceProfile", id="migProfiles and gpuInstanceProfile together"),
    pytest.param({"migStrategy": "Single", "migProfiles": ["MIG3g", "MIG3g"]}, {},
                 "properties.gpuProfile.nvidia.migProfiles", id="Single with two profiles, even the same one"),
    pytest.param({"migStrategy": "Mixed", "migProfiles": []}, {}, "properties.gpuProfile.nvidia.migProfiles",
                 id="an empty list (minItems 1)"),
    pytest.param({"migStrategy": "Mixed", "migProfiles": ["MIG4g", "MIG4g"]}, {},
                 "properties.gpuProfile.nvidia.migProfiles", id="Mixed over the GPU's seven slices"),
    pytest.param({"migProfiles": ["MIG1g"]}, {}, "properties.gpuProfile.nvidia.migProfiles",
                 id="profiles without a strategy"),
])
def test_mig_shapes_that_2026_08_02_preview_does_not_document_are_refused(arm: Arm, nvidia: dict[str, Any],
                                                                         extra: dict[str, Any], target: str) -> None:
    gpu = {"driver": "Install", "nvidia": {"managementMode": "Managed", **nvidia}}
    resp = arm.put("mig", {"vmSize": A100, "count": 1, "gpuProfile": gpu, **extra}, api_version=PREVIEW)
    assert error(resp) == (400, "InvalidParameter", target), resp.body
    assert "mig" not in arm.cluster.pools


def test_a_mixed_combination_that_fits_the_gpu_is_accepted(arm: Arm) -> None:
    gpu = {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Mixed",
                                           "migProfiles": ["MIG4g", "MIG2g", "MIG1g"]}}
    assert arm.put("mig", {"vmSize": A100, "count": 1, "gpuProfile": gpu}, api_version=PREVIEW).status == 201


def test_the_older_preview_still_takes_managed_mig_from_gpu_instance_profile(arm: Arm) -> None:
    gpu = {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single"}}
    resp = arm.put("mig", {"vmSize": A100, "count": 1, "gpuProfile": gpu, "gpuInstanceProfile": "MIG3g"},
                   api_version="2026-01-02-preview")
    assert resp.status == 201, resp.body


def test_mig_profiles_that_are_not_a_list_of_strings_cannot_be_deserialised(arm: Arm) -> None:
    gpu = {"nvidia": {"managementMode": "Managed", "migStrategy": "Single", "migProfiles": "MIG3g"}}
    resp = arm.put("mig", {"vmSize": A100, "count": 1, "gpuProfile": gpu}, api_version=PREVIEW)
    assert error(resp)[:2] == (400, "InvalidRequestContent")


# --------------------------------------------------------------------------- ARM 4: the preview feature


def fleet_without_the_feature() -> Arm:
    scenario = {"clock": {"manual": True}, "subscriptions": [{
        "id": SUB, "features": {MANAGED_GPU_FEATURE: "NotRegistered"},
        "clusters": [{"name": "c1", "resource_group": "rg1", "location": "eastus",
                      "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}]}]}
    fleet = build_fleet(scenario)
    cluster = next(iter(fleet.clusters.values()))
    return Arm(fleet, cluster=cluster)


def test_a_managed_pool_on_a_subscription_without_the_preview_feature_is_refused_as_aks_does() -> None:
    arm = fleet_without_the_feature()
    resp = arm.put("gpu", {"vmSize": T4, "count": 1, "gpuProfile": MANAGED})
    assert error(resp)[:2] == (400, "PreviewFeatureNotRegistered")
    assert arm_error(resp)["message"] == \
        "Preview feature Microsoft.ContainerService/ManagedGPUExperiencePreview not registered."
    assert "gpu" not in arm.cluster.pools
    # a driver-only pool (no nvidia block) does not need the feature
    assert arm.put("drv", {"vmSize": T4, "count": 1, "gpuProfile": {"driver": "Install"}}).status == 201


def test_the_feature_is_shown_registered_through_microsoft_features_and_then_allows_the_pool() -> None:
    arm = fleet_without_the_feature()
    shown = body(arm.feature())
    assert shown["name"] == MANAGED_GPU_FEATURE and shown["properties"]["state"] == "NotRegistered"
    assert shown["type"] == "Microsoft.Features/providers/features"
    assert body(arm.feature(action="register"))["properties"]["state"] == "Registering"
    assert error(arm.put("gpu", {"vmSize": T4, "count": 1, "gpuProfile": MANAGED}))[:2] == \
        (400, "PreviewFeatureNotRegistered")
    arm.fleet.advance(300)
    assert body(arm.feature())["properties"]["state"] == "Registered"
    assert arm.put("gpu", {"vmSize": T4, "count": 1, "gpuProfile": MANAGED}).status == 201


def test_subscriptions_have_the_feature_registered_unless_the_scenario_says_otherwise(arm: Arm) -> None:
    assert body(arm.feature())["properties"]["state"] == "Registered"
    listed = body(arm.call("GET", f"/subscriptions/{SUB}/providers/Microsoft.Features/providers/"
                                  "Microsoft.ContainerService/features", api_version="2021-07-01"))["value"]
    assert [f["name"] for f in listed] == [MANAGED_GPU_FEATURE]


# --------------------------------------------------------------------------- ARM 5: a PUT replaces


def test_a_put_that_leaves_out_a_field_resets_it_to_its_default(arm: Arm) -> None:
    before = arm.created("gpu", {"vmSize": T4, "count": 2, "osSKU": "AzureLinux", "osDiskSizeGB": 256,
                                 "nodeLabels": {"team": "vision"}, "upgradeSettings": {"maxSurge": "33%"},
                                 "messageOfTheDay": "aGk="})
    partial = {k: v for k, v in writable(before).items()
               if k not in ("osSKU", "osDiskSizeGB", "nodeLabels", "upgradeSettings", "messageOfTheDay", "count")}
    assert arm.put("gpu", partial).status == 200
    after = arm.props("gpu")
    assert after["osSKU"] == "Ubuntu" and after["osDiskSizeGB"] == 128 and after["count"] == 1
    assert after["upgradeSettings"] == {"maxSurge": "10%"}
    assert "nodeLabels" not in after and "messageOfTheDay" not in after


@pytest.mark.parametrize(("props", "left_out"), [
    pytest.param({"vmSize": T4, "availabilityZones": ["1", "2"]}, "availabilityZones", id="zones"),
    pytest.param({"vmSize": T4, "scaleSetPriority": "Spot", "scaleSetEvictionPolicy": "Delete"}, "scaleSetPriority",
                 id="spot priority"),
    pytest.param({"vmSize": A100, "gpuInstanceProfile": "MIG2g", "gpuProfile": {"driver": "Install"}},
                 "gpuInstanceProfile", id="classic MIG profile"),
    pytest.param({"vmSize": T4, "gpuProfile": MANAGED}, "gpuProfile", id="the managed GPU profile"),
])
def test_leaving_out_an_immutable_field_is_a_change_and_is_refused(arm: Arm, props: dict[str, Any],
                                                                  left_out: str) -> None:
    before = arm.created("pool", {"count": 1, **props})
    partial = {k: v for k, v in writable(before).items() if k != left_out}
    status, code, target = error(arm.put("pool", partial))
    assert (status, code) == (400, "PropertyChangeNotAllowed")
    assert target.startswith(f"properties.{left_out}")


def test_fields_the_api_version_cannot_express_are_kept_by_a_put_on_it(arm: Arm) -> None:
    arm.created("mig", dict(SINGLE_MIG_EXAMPLE, count=1), api_version=PREVIEW)
    stable_view = arm.props("mig", api_version="2026-08-01")
    assert "migProfiles" not in stable_view["gpuProfile"]["nvidia"]
    assert arm.put("mig", dict(writable(stable_view), count=2)).status == 200
    assert arm.props("mig")["gpuProfile"] == SINGLE_MIG_EXAMPLE["gpuProfile"]


def test_the_full_body_read_on_the_preview_api_round_trips_unchanged(arm: Arm) -> None:
    before = arm.created("mig", dict(SINGLE_MIG_EXAMPLE, count=1, nodeInitializationTaints=["boot=wait:NoSchedule"]),
                         api_version=PREVIEW)
    assert arm.put("mig", dict(writable(before), count=2), api_version=PREVIEW).status == 200
    arm.fleet.advance(120)
    after = arm.props("mig")
    assert after["count"] == 2 and after["nodeInitializationTaints"] == ["boot=wait:NoSchedule"]
    assert after["gpuProfile"] == SINGLE_MIG_EXAMPLE["gpuProfile"]


# --------------------------------------------------------------------------- issue 21: each version sees its definition

PREVIEW_ONLY_SETTINGS = {
    "kubeletConfig": {"cpuManagerPolicy": "static", "kubeReserved": {"cpuMillicores": 250, "memoryMB": 1536},
                      "hardEvictionThreshold": {"memoryAvailable": "500Mi"}, "seccompDefault": "RuntimeDefault"},
    "nodeInitializationTaints": ["boot=wait:NoSchedule"],
    "upgradeSettings": {"maxSurge": "10%", "maxBlockedNodes": "1"},
}


def test_a_pool_shows_on_each_api_version_only_what_its_definition_has(arm: Arm) -> None:
    from shared.kernel import definitions

    arm.created("tuned", {"vmSize": T4, "count": 1, **PREVIEW_ONLY_SETTINGS}, api_version=PREVIEW)
    for version in definitions.API_VERSIONS:
        view = arm.props("tuned", api_version=version)
        assert definitions.definitions(version).problems(view, request=False) == [], version
    stable = arm.props("tuned", api_version="2026-08-01")
    assert stable["kubeletConfig"] == {"cpuManagerPolicy": "static"} and "nodeInitializationTaints" not in stable
    assert stable["upgradeSettings"] == {"maxSurge": "10%"}
    preview = arm.props("tuned")
    assert preview["kubeletConfig"] == PREVIEW_ONLY_SETTINGS["kubeletConfig"]
    assert preview["nodeInitializationTaints"] == PREVIEW_ONLY_SETTINGS["nodeInitializationTaints"]


def test_a_property_the_request_version_lacks_is_ignored_on_create(arm: Arm) -> None:
    arm.created("ignored", {"vmSize": T4, "count": 1, **PREVIEW_ONLY_SETTINGS})  # sent on the stable api-version
    preview = arm.props("ignored")
    assert preview["kubeletConfig"] == {"cpuManagerPolicy": "static"} and "nodeInitializationTaints" not in preview


def test_a_put_on_a_version_that_lacks_a_setting_resets_it(arm: Arm) -> None:
    """microsoft/api-guidelines azure/Guidelines.md, rest-put-for-create-or-replace: "If a v1 client PUTs a
    resource; any fields introduced in V2+ should be reset to their default values (the equivalent to DELETE
    followed by PUT)". The GPU fields AKS refuses to change are the exception (kept: the test above)."""
    arm.created("reset", {"vmSize": T4, "count": 1, **PREVIEW_ONLY_SETTINGS}, api_version=PREVIEW)
    stable_view = arm.props("reset", api_version="2026-08-01")
    assert arm.put("reset", dict(writable(stable_view), count=2)).status == 200
    arm.fleet.advance(120)
    after = arm.props("reset")
    assert after["kubeletConfig"] == {"cpuManagerPolicy": "static"} and "nodeInitializationTaints" not in after


# --------------------------------------------------------------------------- ARM 7: quota at deployment time


def test_a_quota_refused_while_the_scale_set_is_deployed_comes_back_wrapped_in_a_deployment_error(arm: Arm) -> None:
    arm.fleet.faults.add({"target": "lro", "code": "QuotaExceeded", "count": 1,
                          "message": "Operation could not be completed as it results in exceeding approved "
                                     "standardNCASv3_T4Family Cores quota."})
    resp = arm.put("gpu", {"vmSize": T4, "count": 1})
    arm.fleet.advance(120)
    status_url = resp.headers["Azure-AsyncOperation"][len(f"https://{HOST}"):]
    status = body(arm.call("GET", status_url, api_version=None))
    assert status["status"] == "Failed"
    assert status["error"]["code"] == "InvalidTemplateDeployment"
    assert [d["code"] for d in status["error"]["details"]] == ["QuotaExceeded"]
    failed = arm.props("gpu")
    assert failed["provisioningState"] == "Failed"
    assert failed["status"]["provisioningError"]["details"][0]["code"] == "QuotaExceeded"

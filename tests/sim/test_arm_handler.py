"""The simulated ARM answers what ARM answers: routes, auth, api-versions, AKS agent-pool rules, LROs.

These tests call :class:`sim.arm.api.ArmApi` in-process on a manual sim clock (milliseconds each); the
SDK-over-HTTPS tests are in test_arm_sdk.py.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.arm.api import ArmApi
from sim.core.http import Headers, Request, Response
from sim.model import Fleet, SimClock

SUB = "00000000-0000-0000-0000-00000000aaaa"
ARM = "https://management.azure.com/"
HOST = "127.0.0.1:8443"
T4 = "Standard_NC4as_T4_v3"
A100 = "Standard_ND96asr_v4"
MANAGED = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}


class Arm:
    """A fleet with one cluster (c1, a System pool of 2 nodes) and its ARM handler."""

    def __init__(self, *, quotas: dict[tuple[str, str, str], int] | None = None,
                 capacity: dict[tuple[str, str], int] | None = None, faults: list[dict[str, Any]] | None = None) -> None:
        self.fleet = Fleet(seed=7, clock=SimClock(manual=True))
        self.fleet.quotas.update(quotas or {})
        self.fleet.capacity.update(capacity or {})
        self.cluster = self.fleet.add_cluster(subscription=SUB, resource_group="rg1", name="c1",
                                              tags={"gpu-fleet-steward": "enabled"})
        self.cluster.maintenance_configurations["aksManagedNodeOSUpgradeSchedule"] = {
            "maintenanceWindow": {"durationHours": 4, "startTime": "00:00", "schedule": {"weekly": {"dayOfWeek": "Sunday"}}}}
        self.api = ArmApi(self.fleet)
        self.token = self.fleet.tokens.issue(ARM)[0]
        assert self.create("sys", {"vmSize": "Standard_D4s_v5", "count": 2, "mode": "System"}).status == 201
        self.advance(120)
        for rule in faults or ():
            self.fleet.faults.add(rule)

    def call(self, method: str, path: str, body: Any = None, *, api_version: str | None = "2026-08-01",
             token: str | None = "", headers: dict[str, str] | None = None, raw: bytes | None = None) -> Response:
        if api_version is not None:
            path += ("&" if "?" in path else "?") + f"api-version={api_version}"
        h = Headers({"Host": HOST})
        bearer = self.token if token == "" else token
        if bearer:
            h["Authorization"] = f"Bearer {bearer}"
        h.update({k.lower(): v for k, v in (headers or {}).items()})
        payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        return self.api.handle(Request(method, path, h, payload))

    def pool_path(self, name: str) -> str:
        return f"{self.cluster.id}/agentPools/{name}"

    def create(self, name: str, props: dict[str, Any], *, api_version: str = "2026-08-01") -> Response:
        return self.call("PUT", self.pool_path(name), {"properties": props}, api_version=api_version)

    def pool(self, name: str, *, api_version: str = "2026-08-01") -> dict[str, Any]:
        resp = self.call("GET", self.pool_path(name), api_version=api_version)
        assert resp.status == 200, resp.body
        return body(resp)

    def advance(self, seconds: float) -> None:
        self.fleet.advance(seconds)

    def follow(self, url: str) -> Response:
        """GET an absolute URL this handler put in a header."""
        assert url.startswith(f"https://{HOST}/")
        return self.call("GET", url[len(f"https://{HOST}"):], api_version=None)


def body(resp: Response) -> dict[str, Any]:
    return json.loads(resp.body) if resp.body else {}


def arm_error(resp: Response) -> dict[str, Any]:
    """The error object of an answer: ARM's gateway wraps it (``{"error": {...}}``), the AKS resource provider
    answers it flat (``{"code", "message", "subcode", "details"}``); test_arm_recorded_shapes.py pins which is which."""
    b = body(resp)
    return dict(b["error"]) if isinstance(b.get("error"), dict) else b


def error(resp: Response) -> tuple[int, str]:
    return resp.status, str(arm_error(resp).get("code", ""))


@pytest.fixture
def arm() -> Arm:
    return Arm()


# --------------------------------------------------------------------------- auth, api-version, routes


def test_a_request_without_a_token_is_refused_with_authentication_failed(arm: Arm) -> None:
    resp = arm.call("GET", arm.cluster.id, token=None)
    assert error(resp) == (401, "AuthenticationFailed")
    assert "WWW-Authenticate" in resp.headers


def test_a_forged_token_is_refused_as_invalid(arm: Arm) -> None:
    assert error(arm.call("GET", arm.cluster.id, token="abc.def")) == (401, "InvalidAuthenticationToken")


def test_a_token_for_another_audience_is_refused_with_401(arm: Arm) -> None:
    # ARM answers 401 InvalidAuthenticationTokenAudience: an authentication failure (issue 11)
    eventgrid_token = arm.fleet.tokens.issue("https://eventgrid.azure.net")[0]
    assert error(arm.call("GET", arm.cluster.id, token=eventgrid_token)) == (401, "InvalidAuthenticationTokenAudience")


@pytest.mark.parametrize(("api_version", "expected"), [
    pytest.param(None, (400, "MissingApiVersionParameter"), id="missing"),
    pytest.param("2019-04-01", (400, "InvalidApiVersionParameter"), id="unsupported"),
    pytest.param("2026-04-01", (400, "InvalidApiVersionParameter"), id="compute-version-on-aks"),
])
def test_the_api_version_is_required_and_must_be_supported(arm: Arm, api_version: str | None,
                                                           expected: tuple[int, str]) -> None:
    assert error(arm.call("GET", arm.cluster.id, api_version=api_version)) == expected


@pytest.mark.parametrize("api_version", ["2025-10-01", "2026-01-02-preview", "2026-08-01", "2026-08-02-preview"])
def test_every_api_version_the_sdks_use_is_served(arm: Arm, api_version: str) -> None:
    assert arm.call("GET", arm.cluster.id, api_version=api_version).status == 200


@pytest.mark.parametrize(("method", "path", "expected"), [
    pytest.param("GET", "/subscriptions/x/providers/Microsoft.Nope/things", (404, "NotFound"), id="unknown-route"),
    pytest.param("GET", f"/subscriptions/{SUB}/resourceGroups/rg1/providers/Microsoft.ContainerService/managedClusters/zz",
                 (404, "ResourceNotFound"), id="unknown-cluster"),
    pytest.param("GET", "{cluster}/agentPools/nope", (404, "NotFound"), id="unknown-pool"),
    pytest.param("GET", "{cluster}/agentPools/sys/machines/nope", (404, "NotFound"), id="unknown-machine"),
    pytest.param("GET", "{cluster}/maintenanceConfigurations/nope", (404, "NotFound"), id="unknown-maintenance"),
    pytest.param("PATCH", "{cluster}/agentPools/sys", (405, "MethodNotAllowed"), id="patch-pool"),
    pytest.param("DELETE", "{cluster}", (405, "MethodNotAllowed"), id="delete-cluster"),
    pytest.param("GET", f"/subscriptions/{SUB}/providers/Microsoft.ContainerService/locations/eastus/operations/x",
                 (404, "NotFound"), id="unknown-operation"),
])
def test_unknown_routes_resources_and_methods_get_arm_errors(arm: Arm, method: str, path: str,
                                                             expected: tuple[int, str]) -> None:
    assert error(arm.call(method, path.format(cluster=arm.cluster.id))) == expected


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'{"properties": 3}'], ids=["malformed", "array", "props"])
def test_a_malformed_body_is_invalid_request_content(arm: Arm, raw: bytes) -> None:
    assert error(arm.call("PUT", arm.pool_path("gpu"), raw=raw)) == (400, "InvalidRequestContent")


# --------------------------------------------------------------------------- reads


def test_clusters_are_listed_by_subscription_and_by_resource_group_with_their_tags(arm: Arm) -> None:
    arm.fleet.add_cluster(subscription=SUB, resource_group="rg2", name="c2")
    by_sub = body(arm.call("GET", f"/subscriptions/{SUB}/providers/Microsoft.ContainerService/managedClusters"))
    by_rg = body(arm.call("GET", f"/subscriptions/{SUB}/resourceGroups/rg1/providers/Microsoft.ContainerService"
                                 "/managedClusters"))
    assert [c["name"] for c in by_sub["value"]] == ["c1", "c2"]
    assert [c["name"] for c in by_rg["value"]] == ["c1"]
    assert by_rg["value"][0]["tags"] == {"gpu-fleet-steward": "enabled"}


def test_a_cluster_shows_its_node_resource_group_provisioning_mode_version_and_pools(arm: Arm) -> None:
    c = body(arm.call("GET", arm.cluster.id))
    props = c["properties"]
    assert c["id"] == arm.cluster.id
    assert props["nodeResourceGroup"] == arm.cluster.node_resource_group
    assert props["nodeProvisioningProfile"] == {"mode": "Manual"}
    assert props["kubernetesVersion"] == arm.cluster.kubernetes_version
    assert props["provisioningState"] == "Succeeded"
    assert [(p["name"], p["count"], p["mode"]) for p in props["agentPoolProfiles"]] == [("sys", 2, "System")]


def test_maintenance_configurations_are_listed_and_read(arm: Arm) -> None:
    listed = body(arm.call("GET", f"{arm.cluster.id}/maintenanceConfigurations"))["value"]
    one = body(arm.call("GET", f"{arm.cluster.id}/maintenanceConfigurations/aksManagedNodeOSUpgradeSchedule"))
    assert [m["name"] for m in listed] == ["aksManagedNodeOSUpgradeSchedule"]
    assert one["properties"]["maintenanceWindow"]["durationHours"] == 4


def test_the_user_credential_is_a_kubeconfig_for_the_simulated_api_server_with_kubelogin_exec(arm: Arm) -> None:
    arm.fleet.ca_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    resp = arm.call("POST", f"{arm.cluster.id}/listClusterUserCredential?format=exec")
    kubeconfigs = body(resp)["kubeconfigs"]
    config = yaml.safe_load(base64.b64decode(kubeconfigs[0]["value"]))
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    assert kubeconfigs[0]["name"] == "clusterUser"
    assert cluster["server"] == f"https://{HOST}/k8s/{SUB}/rg1/c1"
    assert base64.b64decode(cluster["certificate-authority-data"]).decode() == arm.fleet.ca_pem
    assert user["exec"]["command"] == "kubelogin"
    assert "6dae42f8-4368-4678-94ff-3960e28e3630" in user["exec"]["args"]


def test_machines_are_the_pool_nodes_with_their_vmss_instance_ids(arm: Arm) -> None:
    machines = body(arm.call("GET", f"{arm.pool_path('sys')}/machines"))["value"]
    nodes = [n.name for n in arm.cluster.pool_nodes("sys")]
    assert [m["name"] for m in machines] == nodes
    vmss = arm.cluster.vmss_name(arm.cluster.pools["sys"])
    assert machines[1]["properties"]["resourceId"].endswith(f"/virtualMachineScaleSets/{vmss}/virtualMachines/1")
    one = body(arm.call("GET", f"{arm.pool_path('sys')}/machines/{nodes[0]}"))
    assert one["name"] == nodes[0]


# --------------------------------------------------------------------------- create rules


@pytest.mark.parametrize(("name", "props", "ok"), [
    pytest.param("gpu1", {}, True, id="lowercase-alnum"),
    pytest.param("abcdefghijkl", {}, True, id="twelve-chars"),
    pytest.param("abcdefghijklm", {}, False, id="thirteen-chars"),
    pytest.param("Gpu1", {}, False, id="uppercase"),
    pytest.param("1gpu", {}, False, id="starts-with-digit"),
    pytest.param("gpu-1", {}, False, id="hyphen"),
    pytest.param("win123", {"osType": "Windows"}, True, id="windows-six"),
    pytest.param("win1234", {"osType": "Windows"}, False, id="windows-seven"),
])
def test_agent_pool_names_follow_the_aks_naming_rules(arm: Arm, name: str, props: dict[str, Any], ok: bool) -> None:
    resp = arm.create(name, {"vmSize": "Standard_D4s_v5", "count": 1, **props})
    if ok:
        assert resp.status == 201
    else:
        assert error(resp) == (400, "InvalidParameter")
        assert arm_error(resp)["target"] == "agentPoolProfile.name"


@pytest.mark.parametrize(("props", "api_version", "target"), [
    pytest.param({"vmSize": "Standard_D4s_v5", "gpuProfile": MANAGED}, "2026-08-01", "gpuProfile.nvidia",
                 id="nvidia-on-cpu-size"),
    pytest.param({"vmSize": "Standard_NV32as_v4", "gpuProfile": MANAGED}, "2026-08-01", "gpuProfile.nvidia",
                 id="nvidia-on-amd-gpu"),
    pytest.param({"vmSize": T4, "osType": "Windows", "gpuProfile": MANAGED}, "2026-08-01",
                 "gpuProfile.nvidia.managementMode", id="managed-on-windows"),
    pytest.param({"vmSize": T4, "gpuProfile": {"nvidia": {"managementMode": "Auto"}}}, "2026-08-01",
                 "gpuProfile.nvidia.managementMode", id="unknown-management-mode"),
    pytest.param({"vmSize": T4, "gpuProfile": {"driver": "Maybe"}}, "2026-08-01", "gpuProfile.driver",
                 id="unknown-driver"),
    pytest.param({"vmSize": T4, "gpuProfile": {"nvidia": {"managementMode": "Managed", "migStrategy": "Single"}},
                  "gpuInstanceProfile": "MIG1g"}, "2026-08-02-preview", "gpuInstanceProfile", id="mig-profile-on-t4"),
    pytest.param({"vmSize": T4, "gpuProfile": {"nvidia": {"managementMode": "Managed", "migStrategy": "Single"}}},
                 "2026-01-02-preview", "gpuProfile.nvidia.migStrategy", id="mig-strategy-on-t4"),
    pytest.param({"vmSize": A100, "gpuProfile": {"nvidia": {"managementMode": "Managed", "migStrategy": "Single",
                                                            "migProfiles": ["MIG1g", "MIG3g"]}}},
                 "2026-08-02-preview", "gpuProfile.nvidia.migProfiles", id="single-with-two-profiles"),
    pytest.param({"vmSize": A100, "gpuProfile": {"nvidia": {"managementMode": "Managed", "migStrategy": "Mixed"}}},
                 "2026-08-02-preview", "gpuProfile.nvidia.migProfiles", id="mig-without-a-profile"),
    pytest.param({"vmSize": A100, "gpuProfile": {"nvidia": {"managementMode": "Unmanaged", "migStrategy": "Single",
                                                            "migProfiles": ["MIG3g"]}}},
                 "2026-08-02-preview", "gpuProfile.nvidia.migStrategy", id="mig-strategy-unmanaged"),
    pytest.param({"vmSize": T4, "gpuProfile": MANAGED, "enableAutoScaling": True, "minCount": 1, "maxCount": 3},
                 "2026-08-01", "enableAutoScaling", id="autoscaler-on-managed"),
    pytest.param({"vmSize": "Standard_D4s_v5", "enableAutoScaling": True, "count": 5, "minCount": 1, "maxCount": 3},
                 "2026-08-01", "count", id="count-above-max"),
    pytest.param({"vmSize": "Standard_D4s_v5", "enableAutoScaling": True, "count": None, "minCount": 1, "maxCount": 3},
                 "2026-08-01", "count", id="autoscale-without-count"),
    pytest.param({"vmSize": "Standard_Unicorn_v9"}, "2026-08-01", "vmSize", id="unknown-size"),
    pytest.param({"vmSize": "Standard_D4s_v5", "count": -1}, "2026-08-01", "count", id="negative-count"),
])
def test_agent_pool_gpu_and_scaling_rules_are_enforced(arm: Arm, props: dict[str, Any], api_version: str,
                                                        target: str) -> None:
    props = {"count": 1, **props}
    if props["count"] is None:
        del props["count"]
    resp = arm.create("gpu", props, api_version=api_version)
    assert error(resp) == (400, "InvalidParameter"), resp.body
    assert arm_error(resp)["target"] == f"properties.{target}"
    assert "gpu" not in arm.cluster.pools


def test_a_managed_single_mig_pool_is_accepted_on_an_a100_with_the_preview_api(arm: Arm) -> None:
    gpu = {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single", "migProfiles": ["MIG3g"]}}
    resp = arm.create("mig", {"vmSize": A100, "count": 1, "gpuProfile": gpu}, api_version="2026-08-02-preview")
    assert resp.status == 201
    assert arm.pool("mig", api_version="2026-08-02-preview")["properties"]["gpuProfile"] == gpu


def test_mig_strategy_is_ignored_on_the_stable_api_that_lacks_it(arm: Arm) -> None:
    gpu = {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single"}}
    resp = arm.create("mig", {"vmSize": A100, "count": 1, "gpuProfile": gpu, "gpuInstanceProfile": "MIG3g"})
    assert resp.status == 201
    assert body(resp)["properties"]["gpuProfile"] == MANAGED
    assert "migStrategy" not in arm.pool("mig", api_version="2026-08-02-preview")["properties"]["gpuProfile"]["nvidia"]


def test_the_nvidia_profile_is_ignored_on_an_api_version_without_it(arm: Arm) -> None:
    resp = arm.create("gpu", {"vmSize": T4, "count": 1, "gpuProfile": MANAGED}, api_version="2025-10-01")
    assert resp.status == 201
    assert arm.pool("gpu")["properties"]["gpuProfile"] == {"driver": "Install"}
    assert not arm.cluster.pools["gpu"].managed_gpu


def test_a_managed_pool_keeps_its_nvidia_profile_when_updated_with_an_older_api_version(arm: Arm) -> None:
    arm.create("gpu", {"vmSize": T4, "count": 1, "gpuProfile": MANAGED})
    arm.advance(120)
    old_view = arm.pool("gpu", api_version="2025-10-01")
    assert "nvidia" not in old_view["properties"]["gpuProfile"]
    old_view["properties"]["count"] = 2
    assert arm.call("PUT", arm.pool_path("gpu"), old_view, api_version="2025-10-01").status == 200
    assert arm.pool("gpu")["properties"]["gpuProfile"] == MANAGED


# --------------------------------------------------------------------------- update rules


@pytest.mark.parametrize(("before", "change", "field"), [
    pytest.param({"vmSize": "Standard_D4s_v5"}, {"vmSize": "Standard_D8s_v5"}, "vmSize", id="vm-size"),
    pytest.param({"vmSize": "Standard_D4s_v5"}, {"vmSize": T4}, "vmSize", id="general-purpose-to-gpu"),
    pytest.param({"vmSize": T4, "gpuProfile": {"driver": "Install"}}, {"gpuProfile": {"driver": "None"}},
                 "gpuProfile.driver", id="driver"),
    pytest.param({"vmSize": T4, "gpuProfile": MANAGED}, {"gpuProfile": {"driver": "Install", "nvidia": {
        "managementMode": "Unmanaged"}}}, "gpuProfile.nvidia.managementMode", id="management-mode"),
    pytest.param({"vmSize": T4, "gpuProfile": {"driver": "Install"}}, {"gpuProfile": MANAGED},
                 "gpuProfile.nvidia.managementMode", id="managed-added-later"),
    pytest.param({"vmSize": "Standard_D4s_v5"}, {"maxPods": 30}, "maxPods", id="max-pods"),
])
def test_immutable_properties_cannot_change_after_creation(arm: Arm, before: dict[str, Any], change: dict[str, Any],
                                                           field: str) -> None:
    assert arm.create("pool", {"count": 1, **before}).status == 201
    arm.advance(120)
    current = arm.pool("pool")
    current["properties"].update(change)
    resp = arm.call("PUT", arm.pool_path("pool"), current)
    assert error(resp) == (400, "PropertyChangeNotAllowed")
    assert arm_error(resp)["target"] == f"properties.{field}"
    if change.get("vmSize") == T4:
        assert "general-purpose" in arm_error(resp)["message"]


def test_mig_strategy_cannot_change_after_creation(arm: Arm) -> None:
    gpu = {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single", "migProfiles": ["MIG3g"]}}
    arm.create("mig", {"vmSize": A100, "count": 1, "gpuProfile": gpu}, api_version="2026-08-02-preview")
    arm.advance(120)
    current = arm.pool("mig", api_version="2026-08-02-preview")
    current["properties"]["gpuProfile"]["nvidia"]["migStrategy"] = "Mixed"
    resp = arm.call("PUT", arm.pool_path("mig"), current, api_version="2026-08-02-preview")
    assert error(resp) == (400, "PropertyChangeNotAllowed")


def test_count_cannot_change_while_the_autoscaler_is_on_but_can_when_turning_it_off(arm: Arm) -> None:
    arm.create("auto", {"vmSize": "Standard_D4s_v5", "count": 1, "enableAutoScaling": True, "minCount": 1, "maxCount": 3})
    arm.advance(120)
    current = arm.pool("auto")
    current["properties"]["count"] = 2
    assert error(arm.call("PUT", arm.pool_path("auto"), current)) == (400, "OperationNotAllowed")
    current["properties"]["enableAutoScaling"] = False
    assert arm.call("PUT", arm.pool_path("auto"), current).status == 200


def test_a_second_write_while_an_operation_runs_is_a_409(arm: Arm) -> None:
    arm.create("gpu", {"vmSize": T4, "count": 1})
    again = arm.create("gpu", {"vmSize": T4, "count": 2})
    machines = arm.call("POST", f"{arm.pool_path('gpu')}/deleteMachines", {"machineNames": ["x"]})
    assert error(again) == (409, "OperationNotAllowed")
    assert error(machines) == (409, "OperationNotAllowed")
    assert "aka.ms/aks-pending-operation" in arm_error(again)["message"]


def test_a_pool_write_while_the_cluster_is_busy_is_a_409(arm: Arm) -> None:
    arm.cluster.busy_until = arm.fleet.now() + 60
    assert error(arm.create("gpu", {"vmSize": T4, "count": 1})) == (409, "OperationNotAllowed")
    assert body(arm.call("GET", arm.cluster.id))["properties"]["provisioningState"] == "Updating"


def test_a_stale_etag_is_a_precondition_failure(arm: Arm) -> None:
    current = arm.pool("sys")
    resp = arm.call("PUT", arm.pool_path("sys"), current, headers={"If-Match": '"stale"'})
    ok = arm.call("PUT", arm.pool_path("sys"), current, headers={"If-Match": current["properties"]["eTag"]})
    assert error(resp) == (412, "PreconditionFailed")
    assert ok.status == 200


# --------------------------------------------------------------------------- quota and capacity


def test_gpu_family_vcpu_quota_refuses_a_pool_that_would_exceed_it() -> None:
    arm = Arm(quotas={(SUB, "eastus", "standardNCASv3_T4Family"): 8})
    assert arm.create("gpu", {"vmSize": T4, "count": 2}).status == 201
    resp = arm.create("gpu2", {"vmSize": T4, "count": 1})
    assert error(resp) == (400, "ErrCode_InsufficientVCPUQuota")
    assert "standardNCASv3_T4Family" in arm_error(resp)["message"]
    assert "requested 4, remaining 0" in arm_error(resp)["message"]


def test_scaling_up_is_checked_against_the_quota_too() -> None:
    arm = Arm(quotas={(SUB, "eastus", "standardNCASv3_T4Family"): 8})
    arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    current = arm.pool("gpu")
    current["properties"]["count"] = 3
    assert error(arm.call("PUT", arm.pool_path("gpu"), current)) == (400, "ErrCode_InsufficientVCPUQuota")
    current["properties"]["count"] = 2
    assert arm.call("PUT", arm.pool_path("gpu"), current).status == 200


def test_too_little_capacity_fails_the_operation_with_allocation_failed() -> None:
    arm = Arm(capacity={("eastus", T4): 1})
    resp = arm.create("gpu", {"vmSize": T4, "count": 2})
    arm.advance(120)
    status = body(arm.follow(resp.headers["Azure-AsyncOperation"]))
    assert status["status"] == "Failed"
    assert status["error"]["code"] == "AllocationFailed"
    assert arm.pool("gpu")["properties"]["provisioningState"] == "Failed"
    assert arm.cluster.pool_nodes("gpu") == []
    assert arm.fleet.capacity[("eastus", T4)] == 1


def test_capacity_is_consumed_by_new_nodes_and_returned_by_deleted_ones() -> None:
    arm = Arm(capacity={("eastus", T4): 3})
    arm.create("gpu", {"vmSize": T4, "count": 2})
    arm.advance(120)
    assert arm.fleet.capacity[("eastus", T4)] == 1
    arm.call("DELETE", arm.pool_path("gpu"))
    arm.advance(120)
    assert arm.fleet.capacity[("eastus", T4)] == 3


# --------------------------------------------------------------------------- long-running operations


def test_a_create_answers_201_creating_and_its_operation_succeeds_after_the_scenario_duration(arm: Arm) -> None:
    resp = arm.create("gpu", {"vmSize": T4, "count": 2, "gpuProfile": MANAGED})
    assert resp.status == 201
    assert body(resp)["properties"]["provisioningState"] == "Creating"
    running = arm.follow(resp.headers["Azure-AsyncOperation"])
    assert body(running)["status"] == "InProgress"
    arm.advance(arm.fleet.timings["pool_create_s"])
    done = body(arm.follow(resp.headers["Azure-AsyncOperation"]))
    assert (done["status"], "endTime" in done) == ("Succeeded", True)
    assert arm.pool("gpu")["properties"]["provisioningState"] == "Succeeded"
    assert len(arm.cluster.pool_nodes("gpu")) == 2


def test_a_count_change_is_a_scaling_operation_that_changes_the_nodes(arm: Arm) -> None:
    current = arm.pool("sys")
    current["properties"]["count"] = 3
    resp = arm.call("PUT", arm.pool_path("sys"), current)
    assert (resp.status, body(resp)["properties"]["provisioningState"]) == (200, "Scaling")
    arm.advance(arm.fleet.timings["pool_scale_s"])
    assert arm.pool("sys")["properties"]["provisioningState"] == "Succeeded"
    assert len(arm.cluster.pool_nodes("sys")) == 3


def test_a_delete_answers_202_with_both_headers_and_removes_the_pool_and_its_nodes(arm: Arm) -> None:
    arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    resp = arm.call("DELETE", arm.pool_path("gpu"))
    assert resp.status == 202
    assert arm.pool("gpu")["properties"]["provisioningState"] == "Deleting"
    assert arm.follow(resp.headers["Location"]).status == 202
    arm.advance(arm.fleet.timings["pool_delete_s"])
    assert arm.follow(resp.headers["Location"]).status == 204
    assert body(arm.follow(resp.headers["Azure-AsyncOperation"]))["status"] == "Succeeded"
    assert error(arm.call("GET", arm.pool_path("gpu"))) == (404, "NotFound")
    assert arm.cluster.pool_nodes("gpu") == []


def test_deleting_a_missing_pool_is_a_204(arm: Arm) -> None:
    assert arm.call("DELETE", arm.pool_path("ghost")).status == 204


def test_the_last_system_pool_cannot_be_deleted(arm: Arm) -> None:
    assert error(arm.call("DELETE", arm.pool_path("sys"))) == (400, "OperationNotAllowed")


def test_a_delete_during_a_create_cancels_the_create(arm: Arm) -> None:
    create = arm.create("gpu", {"vmSize": T4, "count": 1})
    delete = arm.call("DELETE", arm.pool_path("gpu"))
    assert delete.status == 202
    assert body(arm.follow(create.headers["Azure-AsyncOperation"]))["status"] == "Canceled"
    arm.advance(120)
    assert "gpu" not in arm.cluster.pools
    assert arm.cluster.pool_nodes("gpu") == []


def test_delete_machines_removes_exactly_those_nodes_and_lowers_the_count(arm: Arm) -> None:
    current = arm.pool("sys")
    current["properties"]["count"] = 3
    arm.call("PUT", arm.pool_path("sys"), current)
    arm.advance(120)
    victim = arm.cluster.pool_nodes("sys")[1].name
    resp = arm.call("POST", f"{arm.pool_path('sys')}/deleteMachines", {"machineNames": [victim]})
    assert resp.status == 202
    assert {"Location", "Azure-AsyncOperation"} <= set(resp.headers)
    arm.advance(arm.fleet.timings["delete_machines_s"])
    assert victim not in [n.name for n in arm.cluster.pool_nodes("sys")]
    assert len(arm.cluster.pool_nodes("sys")) == 2
    assert arm.pool("sys")["properties"]["count"] == 2


@pytest.mark.parametrize("payload", [{"machineNames": ["aks-sys-00000000-vmss00000z"]}, {"machineNames": []}, {}],
                         ids=["unknown-machine", "empty", "missing"])
def test_delete_machines_refuses_unknown_or_missing_machine_names(arm: Arm, payload: dict[str, Any]) -> None:
    assert error(arm.call("POST", f"{arm.pool_path('sys')}/deleteMachines", payload)) == (400, "InvalidParameter")


def test_a_failing_lro_fault_ends_the_operation_failed_with_its_code() -> None:
    arm = Arm(faults=[{"target": "lro", "path": "agentPools/gpu$", "code": "AllocationFailed",
                       "message": "No capacity in zone 1."}])
    resp = arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    status = body(arm.follow(resp.headers["Azure-AsyncOperation"]))
    assert (status["status"], status["error"]["code"]) == ("Failed", "AllocationFailed")
    assert arm.pool("gpu")["properties"]["provisioningState"] == "Failed"
    assert arm.fleet.faults.fired[0]["target"] == "lro"


def test_a_failed_operation_leaves_its_error_readable_on_the_pool_until_a_later_success() -> None:
    arm = Arm(faults=[{"target": "lro", "path": "agentPools/gpu$", "code": "AllocationFailed",
                       "message": "No capacity in zone 1.", "count": 1}])
    arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    error = arm.pool("gpu")["properties"]["status"]["provisioningError"]
    assert (error["code"], error["message"]) == ("AllocationFailed", "No capacity in zone 1.")
    arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    assert "status" not in arm.pool("gpu")["properties"]


# --------------------------------------------------------------------------- Microsoft.Compute


def _vm_path(arm: Arm, instance: int, action: str) -> str:
    vmss = arm.cluster.vmss_name(arm.cluster.pools["sys"])
    return (f"/subscriptions/{SUB}/resourceGroups/{arm.cluster.node_resource_group}/providers/Microsoft.Compute"
            f"/virtualMachineScaleSets/{vmss}/virtualMachines/{instance}/{action}")


@pytest.mark.parametrize("action", ["restart", "reimage"])
def test_a_vmss_vm_restart_or_reimage_takes_the_node_down_until_the_operation_completes(arm: Arm, action: str) -> None:
    node = arm.cluster.pool_nodes("sys")[0]
    resp = arm.call("POST", _vm_path(arm, 0, action), api_version="2026-04-01")
    assert resp.status == 202
    assert "monitor=true" in resp.headers["Location"]
    assert not node.ready
    assert arm.follow(resp.headers["Location"]).status == 202
    arm.advance(arm.fleet.timings[f"{action}_s"] + 1)
    assert node.ready
    assert body(arm.follow(resp.headers["Azure-AsyncOperation"]))["status"] == "Succeeded"
    assert arm.follow(resp.headers["Location"]).status == 200


@pytest.mark.parametrize(("vmss", "instance", "code"), [
    pytest.param("aks-nope-1-vmss", 0, "ResourceNotFound", id="unknown-vmss"),
    pytest.param(None, 99, "NotFound", id="unknown-instance"),
])
def test_a_vm_action_on_an_unknown_vm_is_a_404(arm: Arm, vmss: str | None, instance: int, code: str) -> None:
    path = _vm_path(arm, instance, "restart")
    if vmss:
        path = path.replace(arm.cluster.vmss_name(arm.cluster.pools["sys"]), vmss)
    assert error(arm.call("POST", path, api_version="2026-04-01")) == (404, code)


def test_a_vm_action_needs_a_compute_api_version(arm: Arm) -> None:
    assert error(arm.call("POST", _vm_path(arm, 0, "restart"))) == (400, "InvalidApiVersionParameter")


# --------------------------------------------------------------------------- faults on ARM


def test_a_throttling_fault_answers_429_with_retry_after_then_stops_after_its_count() -> None:
    arm = Arm(faults=[{"target": "arm", "method": "GET", "path": "/agentPools/sys$", "status": 429, "retry_after": 3,
                       "count": 1}])
    first = arm.call("GET", arm.pool_path("sys"))
    second = arm.call("GET", arm.pool_path("sys"))
    assert error(first) == (429, "TooManyRequests")
    assert first.headers["Retry-After"] == "3"
    assert second.status == 200


@pytest.mark.parametrize(("rule", "check"), [
    pytest.param({"status": 503}, lambda r: r.status == 503 and not r.drop, id="503"),
    pytest.param({"status": 500, "code": "InternalServerError"}, lambda r: r.status == 500, id="500"),
    pytest.param({"drop": True}, lambda r: r.drop, id="dropped-connection"),
    pytest.param({"delay_s": 2.5}, lambda r: r.status == 200 and r.delay_s == 2.5, id="slow-answer"),
])
def test_arm_faults_replace_or_slow_the_answer(rule: dict[str, Any], check: Any) -> None:
    arm = Arm(faults=[{"target": "arm", "cluster": "c1", **rule}])
    assert check(arm.call("GET", arm.cluster.id))


# --------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("props", [
    pytest.param({"vmSize": T4, "count": "2"}, id="count-as-string"),
    pytest.param({"vmSize": T4, "count": True}, id="count-as-bool"),
    pytest.param({"vmSize": 5, "count": 1}, id="size-as-number"),
    pytest.param({"vmSize": T4, "count": 1, "enableAutoScaling": "false"}, id="autoscale-as-string"),
    pytest.param({"vmSize": T4, "count": 1, "gpuProfile": "Managed"}, id="gpu-profile-as-string"),
    pytest.param({"vmSize": T4, "count": 1, "gpuProfile": {"nvidia": "Managed"}}, id="nvidia-as-string"),
])
def test_a_body_of_the_wrong_json_types_is_invalid_request_content(arm: Arm, props: dict[str, Any]) -> None:
    assert error(arm.create("gpu", props)) == (400, "InvalidRequestContent")


def test_null_gpu_profiles_are_accepted_on_create_and_update(arm: Arm) -> None:
    assert arm.create("gpu", {"vmSize": T4, "count": 1, "gpuProfile": None}).status == 201
    arm.advance(120)
    resp = arm.call("PUT", arm.pool_path("gpu"), {"properties": {"vmSize": T4, "count": 1, "gpuProfile": None}},
                    api_version="2025-10-01")
    assert resp.status == 200


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2000) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=8)
_PROPS = st.fixed_dictionaries({}, optional={
    "vmSize": st.sampled_from([T4, A100, "Standard_D4s_v5", "Standard_NV32as_v4", "bogus"]) | _JSON,
    "count": st.integers(-1, 5) | _JSON,
    "osType": st.sampled_from(["Linux", "Windows"]) | _JSON,
    "mode": st.sampled_from(["User", "System"]) | _JSON,
    "enableAutoScaling": st.booleans() | _JSON, "minCount": st.integers(0, 3), "maxCount": st.integers(0, 5),
    "gpuInstanceProfile": st.sampled_from(["MIG1g", "MIG3g", "MIG9g"]) | _JSON,
    "gpuProfile": st.fixed_dictionaries({}, optional={
        "driver": st.sampled_from(["Install", "None", "x"]) | _JSON,
        "nvidia": st.fixed_dictionaries({}, optional={
            "managementMode": st.sampled_from(["Managed", "Unmanaged", "x"]) | _JSON,
            "migStrategy": st.sampled_from(["None", "Single", "Mixed"]) | _JSON,
            "migProfiles": st.lists(st.sampled_from(["MIG1g", "MIG3g", "MIGx"]), max_size=3) | _JSON,
        }) | _JSON,
    }) | _JSON,
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(props=_PROPS, update=_PROPS, api_version=st.sampled_from(["2025-10-01", "2026-08-01", "2026-08-02-preview"]))
def test_no_agent_pool_body_makes_the_handler_fail(arm: Arm, props: dict[str, Any], update: dict[str, Any],
                                                   api_version: str) -> None:
    created = arm.create("fuzz", props, api_version=api_version)
    assert created.status in (201, 400, 409), created.body
    arm.advance(120)
    updated = arm.create("fuzz", update, api_version=api_version)
    assert updated.status in (200, 201, 400, 409), updated.body
    arm.advance(120)
    if "fuzz" in arm.cluster.pools:
        assert arm.call("DELETE", arm.pool_path("fuzz")).status == 202
        arm.advance(120)
    assert "fuzz" not in arm.cluster.pools


def test_a_bug_behind_a_route_is_a_500_with_an_arm_error_not_a_crash(arm: Arm, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(pool: Any) -> list[dict[str, Any]]:
        raise RuntimeError("model exploded")

    monkeypatch.setattr(arm.cluster, "machines", broken)
    resp = arm.call("GET", f"{arm.pool_path('sys')}/machines")
    assert error(resp) == (500, "InternalServerError")
    assert "model exploded" in arm_error(resp)["message"]
    assert arm.call("GET", arm.pool_path("sys")).status == 200


def test_every_answer_carries_arm_request_ids_and_echoes_the_client_request_id(arm: Arm) -> None:
    resp = arm.call("GET", arm.cluster.id, headers={"x-ms-client-request-id": "abc"})
    failed = arm.call("GET", arm.cluster.id, token=None)
    assert resp.headers["x-ms-client-request-id"] == "abc"
    assert resp.headers["x-ms-request-id"] and failed.headers["x-ms-request-id"]


@pytest.mark.parametrize(("size", "gpus", "family", "nvidia", "mig"), [
    pytest.param("Standard_NC4as_T4_v3", 1, "standardNCASv3_T4Family", True, False, id="t4"),
    pytest.param("standard_nd96asr_v4", 8, "standardNDASv4_A100Family", True, True, id="a100-any-case"),
    pytest.param("Standard_ND96isr_H200_v5", 8, "standardNDSH200v5Family", True, True, id="h200"),
    pytest.param("Standard_NV32as_v4", 1, "standardNVSv4Family", False, False, id="amd"),
    pytest.param("Standard_D4s_v5", 0, "standardDSv5Family", False, False, id="general-purpose"),
])
def test_the_catalogue_knows_gpus_quota_families_and_mig(size: str, gpus: int, family: str, nvidia: bool,
                                                         mig: bool) -> None:
    from sim.core import gpu_catalog

    info = gpu_catalog.lookup(size)
    assert info is not None
    assert (info.gpus, info.family, info.nvidia, info.mig_capable) == (gpus, family, nvidia, mig)
    if mig:
        assert set(info.mig_profiles) == set(gpu_catalog.MIG_NAMES)
    assert gpu_catalog.lookup("Standard_Nope") is None

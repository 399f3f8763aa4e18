"""The simulated ARM serves maintenance configurations as AKS does, and checks linked permissions.

- Maintenance configurations: a ``default`` with ``maintenanceWindow`` is served in that shape; one written in the
  legacy ``timeInWeek`` shape is answered as written, not migrated (recorded at api-version 2026-07-01:
  tests/replay/recordings/test_aks_maintenanceconfiguration.json); bodies are ``id``, ``name``, ``properties``;
  ``startDate`` defaults to the date the window was created, and stays.
- An agent-pool PUT naming a subnet, a public IP prefix or a proximity placement group is refused with
  403 ``LinkedAuthorizationFailed`` unless the app's role (shared.adapters.permissions) grants the linked action.

In-process, on a manual sim clock.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.permissions import collect_arm_actions, linked_actions
from sim.arm.api import ArmApi, granted_arm_actions
from sim.core.http import Headers, Request, Response
from sim.identity import APP_PRINCIPAL_ID
from sim.model import Fleet, SimClock
from tests.grants import steward_role_actions

SUB = "00000000-0000-0000-0000-00000000abcd"
ARM = "https://management.azure.com/"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/gpu"
POD_SUBNET = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/pods"
PREFIX = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Network/publicIPPrefixes/gpu-ips"
PPG = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Compute/proximityPlacementGroups/gpu-ppg"
JOIN_SUBNET = "Microsoft.Network/virtualNetworks/subnets/join/action"
JOIN_PREFIX = "Microsoft.Network/publicIPPrefixes/join/action"
SYSTEM = {"vmSize": "Standard_D4s_v5", "count": 1, "mode": "User"}
# the resource group of the linked resources above; infra/main.bicep assigns the linked-resources role only on
# the groups listed in linkedResourceGroupIds (default []), so the tests that want it held list this one
NET_RG = f"/subscriptions/{SUB}/resourceGroups/rg-net"


RECORDINGS = Path(__file__).resolve().parents[1] / "replay" / "recordings"
APP_CLIENT_ID = "00000000-0000-0000-0000-00000000c11d"


def app_token(fleet: Fleet) -> str:
    """A token of the app's managed identity (the linked checks apply to it; the harness is owner)."""
    return fleet.tokens.issue(ARM, principal=APP_PRINCIPAL_ID, client_id=APP_CLIENT_ID, groups=())[0]


class Arm:
    def __init__(self) -> None:
        self.fleet = Fleet(seed=3, clock=SimClock(manual=True))
        self.cluster = self.fleet.add_cluster(subscription=SUB, resource_group="rg1", name="c1")
        self.api = ArmApi(self.fleet)
        self.token = app_token(self.fleet)

    def call(self, method: str, path: str, body: Any = None, *, api_version: str = "2026-08-01") -> Response:
        headers = Headers({"Host": "127.0.0.1:8443", "Authorization": f"Bearer {self.token}"})
        payload = json.dumps(body).encode() if body is not None else b""
        return self.api.handle(Request(method, f"{path}?api-version={api_version}", headers, payload))

    def configs(self) -> dict[str, dict[str, Any]]:
        resp = self.call("GET", f"{self.cluster.id}/maintenanceConfigurations")
        assert resp.status == 200, resp.body
        return {c["name"]: c["properties"] for c in json.loads(resp.body)["value"]}

    def put_pool(self, name: str, props: dict[str, Any]) -> Response:
        return self.call("PUT", f"{self.cluster.id}/agentPools/{name}", {"properties": props})


@pytest.fixture
def arm() -> Arm:
    return Arm()


def error(resp: Response) -> dict[str, Any]:
    return dict(json.loads(resp.body)["error"])


# --------------------------------------------------------------------------- maintenance configurations


def test_a_default_with_maintenance_window_is_served_in_that_shape(arm: Arm) -> None:
    window = {"schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}, "durationHours": 4,
              "utcOffset": "+00:00", "startTime": "01:00", "startDate": "2026-01-03"}
    arm.cluster.maintenance_configurations["default"] = {"maintenanceWindow": window}
    assert arm.configs()["default"] == {"maintenanceWindow": window}


def _recorded(name: str) -> dict[str, Any]:
    doc = json.loads((RECORDINGS / "test_aks_maintenanceconfiguration.json").read_text())
    return next(e for e in doc["exchanges"] if e["name"] == name)


@pytest.mark.parametrize("exchange", ["put_maintenance_default_legacy", "put_maintenance_default_legacy_not_allowed_time"])
def test_a_legacy_default_is_answered_as_written_not_migrated_as_recorded(arm: Arm, exchange: str) -> None:
    # Recorded at api-version 2026-07-01 (test_aks_maintenanceconfiguration.json): the timeInWeek shape comes back
    # as written, with no maintenanceWindow; an empty notAllowedTime is left out and times lose their ".000".
    recorded = _recorded(exchange)
    arm.cluster.maintenance_configurations["default"] = recorded["request"]["body"]["properties"]
    one = arm.call("GET", f"{arm.cluster.id}/maintenanceConfigurations/default", api_version="2026-07-01")
    served = json.loads(one.body)
    assert set(served) == {"id", "name", "properties"}, "no type, as recorded"
    assert served["name"] == "default" and served["id"] == f"{arm.cluster.id}/maintenanceConfigurations/default"
    assert served["properties"] == recorded["response"]["body"]["properties"]
    assert arm.configs()["default"] == recorded["response"]["body"]["properties"]


def test_the_recorded_legacy_default_reads_back_identically(arm: Arm) -> None:
    written = _recorded("put_maintenance_default_legacy_not_allowed_time")["request"]["body"]["properties"]
    arm.cluster.maintenance_configurations["default"] = written
    assert arm.configs()["default"] == _recorded("get_maintenance_default_legacy")["response"]["body"]["properties"]
    assert "maintenanceWindow" not in arm.configs()["default"]


def test_a_window_without_start_date_gets_the_creation_date_and_keeps_it(arm: Arm) -> None:
    window = {"schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Sunday"}}, "durationHours": 4,
              "startTime": "02:00", "utcOffset": "-08:00"}
    arm.cluster.maintenance_configurations["aksManagedNodeOSUpgradeSchedule"] = {"maintenanceWindow": window}
    first = arm.configs()["aksManagedNodeOSUpgradeSchedule"]["maintenanceWindow"]["startDate"]
    local_today = datetime.fromtimestamp(arm.fleet.clock.now() - 8 * 3600, UTC).date().isoformat()
    assert first == local_today
    arm.fleet.advance(3 * 86400)
    arm.token = app_token(arm.fleet)  # the first one expired meanwhile
    one = arm.call("GET", f"{arm.cluster.id}/maintenanceConfigurations/aksManagedNodeOSUpgradeSchedule")
    assert json.loads(one.body)["properties"]["maintenanceWindow"]["startDate"] == first


# --------------------------------------------------------------------------- linked access checks


def test_the_simulator_grants_the_role_the_project_declares() -> None:
    import shared.adapters.aks
    import shared.adapters.compute

    fleet = Fleet(seed=1, clock=SimClock(manual=True))
    assert granted_arm_actions(fleet) == steward_role_actions()
    assert steward_role_actions() == collect_arm_actions(shared.adapters.aks, shared.adapters.compute) | linked_actions()
    fleet.revoked_arm_actions = {JOIN_SUBNET}
    assert JOIN_SUBNET not in granted_arm_actions(fleet)


def test_a_pool_on_a_custom_subnet_is_created_when_the_role_grants_the_join(arm: Arm) -> None:
    arm.fleet.arm_linked_resource_groups = {NET_RG}
    resp = arm.put_pool("gpuvnet", {**SYSTEM, "vnetSubnetID": SUBNET})
    assert resp.status == 201, resp.body


def test_without_the_subnet_join_the_put_is_refused_as_arm_does_and_nothing_is_created(arm: Arm) -> None:
    arm.fleet.arm_linked_resource_groups = {NET_RG}
    arm.fleet.revoked_arm_actions = {JOIN_SUBNET}
    resp = arm.put_pool("gpuvnet", {**SYSTEM, "vnetSubnetID": SUBNET})
    assert resp.status == 403
    err = error(resp)
    assert err["code"] == "LinkedAuthorizationFailed"
    assert err["message"] == (
        f"The client '{APP_CLIENT_ID}' with object id '{APP_PRINCIPAL_ID}' has permission to perform action "
        "'Microsoft.ContainerService/managedClusters/agentPools/write' on scope "
        f"'{arm.cluster.id}/agentPools/gpuvnet'; however, it does not have permission to perform action(s) "
        f"'{JOIN_SUBNET}' on the linked scope(s) '{SUBNET}' or the linked scope(s) are invalid.")
    assert arm.call("GET", f"{arm.cluster.id}/agentPools/gpuvnet").status == 404


def test_every_missing_linked_action_and_scope_is_named(arm: Arm) -> None:
    arm.fleet.arm_linked_resource_groups = {NET_RG}
    arm.fleet.revoked_arm_actions = {JOIN_SUBNET, JOIN_PREFIX}
    resp = arm.put_pool("gpuvnet", {**SYSTEM, "vnetSubnetID": SUBNET, "podSubnetID": POD_SUBNET,
                                    "enableNodePublicIP": True, "nodePublicIPPrefixID": PREFIX,
                                    "proximityPlacementGroupID": PPG})
    assert resp.status == 403
    message = error(resp)["message"]
    assert f"action(s) '{JOIN_SUBNET},{JOIN_PREFIX}'" in message
    assert f"linked scope(s) '{SUBNET},{POD_SUBNET},{PREFIX}'" in message
    assert PPG not in message  # proximityPlacementGroups/write is still granted


def test_an_update_that_still_names_the_subnet_is_checked_too(arm: Arm) -> None:
    arm.fleet.arm_linked_resource_groups = {NET_RG}
    assert arm.put_pool("gpuvnet", {**SYSTEM, "vnetSubnetID": SUBNET}).status == 201
    arm.fleet.advance(600)
    arm.fleet.revoked_arm_actions = {JOIN_SUBNET}
    resp = arm.put_pool("gpuvnet", {**SYSTEM, "count": 2, "vnetSubnetID": SUBNET})
    assert resp.status == 403 and error(resp)["code"] == "LinkedAuthorizationFailed"


def test_a_pool_without_linked_resources_needs_no_linked_action(arm: Arm) -> None:
    arm.fleet.revoked_arm_actions = set(linked_actions())
    assert arm.put_pool("plain", dict(SYSTEM)).status == 201


def test_by_default_the_linked_role_is_assigned_nowhere_so_a_custom_subnet_is_refused(arm: Arm) -> None:
    # infra/main.bicep: param linkedResourceGroupIds array = [] -> the linked-resources role has no assignment
    assert arm.fleet.arm_linked_resource_groups == set()
    resp = arm.put_pool("gpuvnet", {**SYSTEM, "vnetSubnetID": SUBNET})
    assert resp.status == 403
    err = error(resp)
    assert err["code"] == "LinkedAuthorizationFailed"
    assert f"action(s) '{JOIN_SUBNET}' on the linked scope(s) '{SUBNET}'" in err["message"]
    assert arm.call("GET", f"{arm.cluster.id}/agentPools/gpuvnet").status == 404


def test_the_linked_role_holds_only_inside_the_listed_groups(arm: Arm) -> None:
    arm.fleet.arm_linked_resource_groups = {f"/subscriptions/{SUB}/resourceGroups/rg-other",
                                            f"/subscriptions/{SUB}/resourceGroups/rg-ne"}  # a prefix, not rg-net
    resp = arm.put_pool("gpuvnet", {**SYSTEM, "vnetSubnetID": SUBNET, "proximityPlacementGroupID": PPG})
    assert resp.status == 403
    message = error(resp)["message"]
    assert f"linked scope(s) '{SUBNET},{PPG}'" in message
    arm.fleet.arm_linked_resource_groups.add(NET_RG.upper())  # ARM ids compare case-insensitively
    assert arm.put_pool("gpuvnet", {**SYSTEM, "vnetSubnetID": SUBNET, "proximityPlacementGroupID": PPG}).status == 201


def test_a_scenario_lists_the_linked_resource_groups() -> None:
    from sim.scenario import ScenarioError, build_fleet

    fleet = build_fleet({"seed": 1, "clock": {"manual": True}, "arm_linked_resource_groups": [NET_RG]})
    assert fleet.arm_linked_resource_groups == {NET_RG}
    assert build_fleet({"seed": 1, "clock": {"manual": True}}).arm_linked_resource_groups == set()
    with pytest.raises(ScenarioError):
        build_fleet({"seed": 1, "clock": {"manual": True}, "arm_linked_resource_groups": NET_RG})

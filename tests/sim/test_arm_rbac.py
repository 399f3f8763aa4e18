"""The simulated ARM authorizes the app's identity with the project's own role, on the scopes infra/ assigns it.

- The actions held are read from infra/app/steward-role.bicep (``actions``, ``linkedActions``), minus
  what a test revoked; the role is assigned on each cluster and on its node resource group.
- A request whose action the app does not hold over the scope is refused with ARM's 403
  ``AuthorizationFailed``, naming the client id, object id, action and scope.
- Every simulator route maps to its resource-provider operation.
- A token for another audience fails authentication with 401 ``InvalidAuthenticationTokenAudience``.
- The harness (tokens without the app's object id, group ``system:masters``) acts as the owner.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.arm import rbac as armrbac
from sim.arm.api import ArmApi, granted_arm_actions
from sim.core.http import Headers, Request, Response
from sim.identity import APP_PRINCIPAL_ID
from sim.model import Fleet, SimClock
from tests.grants import steward_role_actions

SUB = "00000000-0000-0000-0000-0000000000a8"
ARM = "https://management.azure.com/"
CLIENT = "00000000-0000-0000-0000-00000000c11d"
MC = "Microsoft.ContainerService/managedClusters"


class Arm:
    def __init__(self) -> None:
        self.fleet = Fleet(seed=8, clock=SimClock(manual=True))
        self.cluster = self.fleet.add_cluster(subscription=SUB, resource_group="rg1", name="c1",
                                              tags={"gpu-fleet-steward": "enabled"})
        self.other = self.fleet.add_cluster(subscription=SUB, resource_group="rg2", name="c2")
        self.api = ArmApi(self.fleet)
        self.app = self.fleet.tokens.issue(ARM, principal=APP_PRINCIPAL_ID, client_id=CLIENT, groups=())[0]
        self.admin = self.fleet.tokens.issue(ARM)[0]

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None,
             api_version: str = "2026-08-01") -> Response:
        headers = Headers({"Host": "127.0.0.1:8443", "Authorization": f"Bearer {token or self.app}"})
        payload = json.dumps(body).encode() if body is not None else b""
        return self.api.handle(Request(method, f"{path}?api-version={api_version}", headers, payload))

    def node_rg(self, cluster: Any | None = None) -> str:
        c = cluster or self.cluster
        return f"/subscriptions/{SUB}/resourceGroups/{c.node_resource_group}"


@pytest.fixture
def arm() -> Arm:
    return Arm()


def error(resp: Response) -> tuple[int, str, str]:
    err = json.loads(resp.body)["error"]
    return resp.status, err["code"], err["message"]


def refusal(action: str, scope: str) -> tuple[int, str, str]:
    return (403, "AuthorizationFailed",
            f"The client '{CLIENT}' with object id '{APP_PRINCIPAL_ID}' does not have authorization to perform action "
            f"'{action}' over scope '{scope}' or the scope is invalid. If access was recently granted, please refresh "
            "your credentials.")


def test_the_app_holds_exactly_the_roles_infra_defines() -> None:
    fleet = Fleet(seed=1, clock=SimClock(manual=True))
    steward, linked = armrbac.project_roles()
    assert set(steward.actions) | set(linked.actions) == granted_arm_actions(fleet)
    # tests/infra keeps the bicep equal to the adapters' declarations: the two sources agree
    assert granted_arm_actions(fleet) == steward_role_actions()


def test_the_role_is_assigned_on_each_cluster_and_its_node_resource_group(arm: Arm) -> None:
    assert armrbac.assignment_scopes(arm.fleet) == [arm.cluster.id, arm.node_rg(arm.cluster),
                                                    arm.other.id, arm.node_rg(arm.other)]
    arm.fleet.arm_access_clusters = {arm.cluster.id}
    assert armrbac.assignment_scopes(arm.fleet) == [arm.cluster.id, arm.node_rg(arm.cluster)]


# (route, method, path under the cluster or node resource group, action)
def _routes(arm: Arm) -> list[tuple[str, str, str, str]]:
    c, pool = arm.cluster.id, f"{arm.cluster.id}/agentPools/gpu"
    vm = f"{arm.node_rg()}/providers/Microsoft.Compute/virtualMachineScaleSets/aks-gpu-1-vmss/virtualMachines/0"
    return [
        ("GET", c, c, f"{MC}/read"),
        ("GET", f"{c}/agentPools", f"{c}/agentPools", f"{MC}/agentPools/read"),
        ("GET", pool, pool, f"{MC}/agentPools/read"),
        ("PUT", pool, pool, f"{MC}/agentPools/write"),
        ("DELETE", pool, pool, f"{MC}/agentPools/delete"),
        ("POST", f"{pool}/deleteMachines", pool, f"{MC}/agentPools/deleteMachines/action"),
        ("GET", f"{pool}/machines", f"{pool}/machines", f"{MC}/agentPools/machines/read"),
        ("POST", f"{c}/listClusterUserCredential", c, f"{MC}/listClusterUserCredential/action"),
        ("GET", f"{c}/maintenanceConfigurations", f"{c}/maintenanceConfigurations",
         f"{MC}/maintenanceConfigurations/read"),
        ("POST", f"{vm}/restart", vm, "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/restart/action"),
        ("POST", f"{vm}/reimage", vm, "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/reimage/action"),
    ]


ROUTE_IDS = ["cluster-read", "pools-list", "pool-read", "pool-write", "pool-delete", "delete-machines",
             "machines-read", "user-credential", "maintenance-read", "vm-restart", "vm-reimage"]


@pytest.mark.parametrize("index", range(len(ROUTE_IDS)), ids=ROUTE_IDS)
def test_each_route_is_authorized_by_its_operation_and_refused_without_it(arm: Arm, index: int) -> None:
    method, path, scope, action = _routes(arm)[index]
    api_version = "2026-04-01" if "Microsoft.Compute" in path else "2026-08-01"
    body = {"properties": {"vmSize": "Standard_D4s_v5", "count": 1, "mode": "User"}} if method == "PUT" else \
        ({"machineNames": ["m"]} if path.endswith("deleteMachines") else None)
    allowed = arm.call(method, path, body, api_version=api_version)
    assert allowed.status != 403, allowed.body  # held: whatever the resource provider then says
    arm.fleet.revoked_arm_actions = {action}
    assert error(arm.call(method, path, body, api_version=api_version)) == refusal(action, scope)


@pytest.mark.parametrize(("method", "path", "action"), [
    pytest.param("GET", "", f"{MC}/read", id="read"),
    pytest.param("POST", "/listClusterUserCredential", f"{MC}/listClusterUserCredential/action", id="credentials"),
    pytest.param("PUT", "/agentPools/gpu", f"{MC}/agentPools/write", id="pool-write"),
])
def test_a_cluster_without_the_assignment_is_out_of_reach(arm: Arm, method: str, path: str, action: str) -> None:
    arm.fleet.arm_access_clusters = {arm.cluster.id}
    body = {"properties": {"vmSize": "Standard_D4s_v5", "count": 1, "mode": "User"}} if method == "PUT" else None
    scope = arm.other.id + (path if method != "POST" else "")
    assert error(arm.call(method, arm.other.id + path, body)) == refusal(action, scope)
    assert arm.call(method, arm.other.id + path, body, token=arm.admin).status != 403  # the owner may


def test_a_vm_outside_every_node_resource_group_is_refused(arm: Arm) -> None:
    vm = (f"/subscriptions/{SUB}/resourceGroups/rg-elsewhere/providers/Microsoft.Compute/virtualMachineScaleSets/"
          "vmss/virtualMachines/0")
    assert error(arm.call("POST", f"{vm}/restart", api_version="2026-04-01")) == refusal(
        "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/restart/action", vm)


def test_a_cluster_that_does_not_exist_is_authorization_failed_not_404(arm: Arm) -> None:
    missing = f"/subscriptions/{SUB}/resourceGroups/rg1/providers/{MC}/gone"
    assert error(arm.call("GET", missing)) == refusal(f"{MC}/read", missing)
    assert arm.call("GET", missing, token=arm.admin).status == 404


def test_the_subscription_list_holds_only_the_clusters_the_app_may_read(arm: Arm) -> None:
    path = f"/subscriptions/{SUB}/providers/{MC}"
    names = lambda resp: sorted(c["name"] for c in json.loads(resp.body)["value"])  # noqa: E731
    assert names(arm.call("GET", path)) == ["c1", "c2"]
    arm.fleet.arm_access_clusters = {arm.cluster.id}
    assert names(arm.call("GET", path)) == ["c1"]
    assert names(arm.call("GET", path, token=arm.admin)) == ["c1", "c2"]
    arm.fleet.revoked_arm_actions = {f"{MC}/read"}
    assert names(arm.call("GET", path)) == []


def test_the_app_may_not_read_or_register_preview_features(arm: Arm) -> None:
    path = f"/subscriptions/{SUB}/providers/Microsoft.Features/providers/Microsoft.ContainerService/features"
    assert error(arm.call("GET", path, api_version="2021-07-01")) == refusal("Microsoft.Features/features/read", path)


def test_another_principal_holds_nothing(arm: Arm) -> None:
    stranger = arm.fleet.tokens.issue(ARM, principal="11111111-1111-1111-1111-111111111111", groups=())[0]
    status, code, message = error(arm.call("GET", arm.cluster.id, token=stranger))
    assert (status, code) == (403, "AuthorizationFailed")
    assert "11111111-1111-1111-1111-111111111111" in message


def test_a_token_for_another_audience_is_401_invalid_audience(arm: Arm) -> None:
    kube = arm.fleet.tokens.issue("6dae42f8-4368-4678-94ff-3960e28e3630", principal=APP_PRINCIPAL_ID, groups=())[0]
    resp = arm.call("GET", arm.cluster.id, token=kube)
    status, code, message = error(resp)
    assert (status, code) == (401, "InvalidAuthenticationTokenAudience")
    assert message.startswith("The access token has been obtained for wrong audience or resource "
                              "'6dae42f8-4368-4678-94ff-3960e28e3630'.")
    assert "WWW-Authenticate" in resp.headers


def test_a_grant_on_a_whole_resource_group_covers_its_clusters(arm: Arm) -> None:
    # main.bicep accessResourceGroupIds -> app/resource-group-access.bicep
    arm.fleet.arm_access_clusters = set()
    arm.fleet.arm_access_resource_groups = {f"/subscriptions/{SUB}/resourceGroups/rg1"}
    assert arm.call("GET", arm.cluster.id).status == 200
    assert arm.call("GET", f"/subscriptions/{SUB}/resourceGroups/rg1/providers/{MC}/gone").status == 404
    assert error(arm.call("GET", arm.other.id)) == refusal(f"{MC}/read", arm.other.id)

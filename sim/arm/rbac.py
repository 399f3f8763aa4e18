"""Azure role-based access control in the simulated ARM: the project's own roles, on the scopes it assigns them.

ARM authorizes every request before the resource provider sees it: the caller's role assignments at
the request's scope or above must hold the operation's action (and none of the role's
``notActions`` may exclude it), else 403 ``AuthorizationFailed``
(https://learn.microsoft.com/azure/role-based-access-control/overview#how-azure-rbac-determines-if-a-user-has-access-to-a-resource,
https://learn.microsoft.com/azure/role-based-access-control/troubleshooting#symptom---authorization-failed),
with the message "The client '<client id>' with object id '<object id>' does not have authorization
to perform action '<action>' over scope '<scope>' or the scope is invalid. If access was recently
granted, please refresh your credentials."

What the app's identity holds is read from the deployment itself: the custom role's ``actions`` (and
the linked-resources role's ``linkedActions``) in ``infra/app/steward-role.bicep``, minus what a test
revoked (``fleet.revoked_arm_actions``), assigned as ``infra/main.bicep`` assigns it: on each
cluster (app/cluster-access.bicep) and on its node resource group (app/resource-group-access.bicep).
The simulated fleet's clusters are all "access clusters" unless ``fleet.arm_access_clusters`` (a set
of cluster ids) narrows them. The linked-resources role is assigned only on the resource groups the
operator lists (main.bicep ``linkedResourceGroupIds``, default ``[]``): ``fleet.arm_linked_resource_groups``
(resource group ids, empty by default, scenario key ``arm_linked_resource_groups``), so by default a pool
naming a subnet, a public IP prefix or a proximity placement group is refused with LinkedAuthorizationFailed.

Harness tokens (group ``system:masters``, sim/identity/tokens.py) act as the subscriptions' owner. Any other
principal holds nothing.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INFRA = Path(__file__).resolve().parents[2] / "infra"
STEWARD_ROLE = INFRA / "app" / "steward-role.bicep"

_MC = "Microsoft.ContainerService/managedClusters"
# simulator route (sim.arm.api._ROUTES) and method -> the operation's action. From the resource provider
# operations list (https://learn.microsoft.com/azure/role-based-access-control/permissions/containers
# #microsoftcontainerservice and .../permissions/compute, .../permissions/management-and-governance
# #microsoftfeatures).
ROUTE_ACTIONS: dict[tuple[str, str], str] = {
    ("clusters_in_sub", "GET"): f"{_MC}/read",
    ("clusters_in_rg", "GET"): f"{_MC}/read",
    ("cluster", "GET"): f"{_MC}/read",
    ("cluster_abort", "POST"): f"{_MC}/abort/action",
    ("pools", "GET"): f"{_MC}/agentPools/read",
    ("pool", "GET"): f"{_MC}/agentPools/read",
    ("pool", "PUT"): f"{_MC}/agentPools/write",
    ("pool", "DELETE"): f"{_MC}/agentPools/delete",
    ("delete_machines", "POST"): f"{_MC}/agentPools/deleteMachines/action",
    ("pool_abort", "POST"): f"{_MC}/agentPools/abort/action",
    ("machines", "GET"): f"{_MC}/agentPools/machines/read",
    ("machine", "GET"): f"{_MC}/agentPools/machines/read",
    ("user_credential", "POST"): f"{_MC}/listClusterUserCredential/action",
    ("maintenance_list", "GET"): f"{_MC}/maintenanceConfigurations/read",
    ("maintenance", "GET"): f"{_MC}/maintenanceConfigurations/read",
    ("features", "GET"): "Microsoft.Features/features/read",
    ("feature", "GET"): "Microsoft.Features/features/read",
    ("feature_action", "POST"): "Microsoft.Features/providers/features/{action}/action",
    ("vm_action", "POST"): "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/{action}/action",
    ("vm_availability", "GET"): "Microsoft.ResourceHealth/availabilityStatuses/read",
}
# Polling a long-running operation's status (…/locations/<loc>/operations/<id>) is not checked here:
# ARM authorizes it for the principal that started the operation (the URL carries a signature of the
# caller; learn.microsoft.com/azure/azure-resource-manager/management/async-operations "Permission for
# tracking async status"), which the simulator does not model.
UNCHECKED_ROUTES = frozenset({"aks_operation", "aks_operation_result", "compute_operation"})
# Collection GETs above the assigned scopes: answered with the items the caller may read (see
# filter_readable); whether ARM filters such a list or refuses it for a principal holding only
# resource-scoped assignments is not documented for Microsoft.ContainerService.
FILTERED_ROUTES = frozenset({"clusters_in_sub", "clusters_in_rg"})


@dataclass(frozen=True)
class Role:
    name: str
    actions: tuple[str, ...]
    not_actions: tuple[str, ...] = ()
    data_actions: tuple[str, ...] = ()

    def allows(self, action: str) -> bool:
        def hit(patterns: Iterable[str]) -> bool:
            return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in patterns)

        return hit(self.actions) and not hit(self.not_actions)


def _bicep_array(text: str, name: str) -> tuple[str, ...]:
    match = re.search(rf"^var {re.escape(name)} = \[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise ValueError(f"{STEWARD_ROLE}: no array variable {name!r}")
    return tuple(re.findall(r"'([^']*)'", match.group(1)))


_ROLES: tuple[Role, Role] | None = None


def project_roles() -> tuple[Role, Role]:
    """(steward role, linked-resources role) as infra/app/steward-role.bicep defines them."""
    global _ROLES
    if _ROLES is None:
        text = STEWARD_ROLE.read_text(encoding="utf-8")
        # both roles list their actions by variable and exclude nothing (notActions: []); tests/infra
        # checks that shape (test_the_custom_role_grants_no_wildcard_no_data_action_and_no_exclusion)
        _ROLES = (Role("steward", _bicep_array(text, "actions")), Role("steward-linked", _bicep_array(text, "linkedActions")))
    return _ROLES


def granted_actions(fleet: Any) -> set[str]:
    """The actions of the app's roles, minus what a test revoked (``fleet.revoked_arm_actions``)."""
    steward, linked = project_roles()
    revoked = {a.lower() for a in getattr(fleet, "revoked_arm_actions", ()) or ()}
    return {a for a in (*steward.actions, *linked.actions) if a.lower() not in revoked}


def _revoked(fleet: Any, action: str) -> bool:
    return action.lower() in {a.lower() for a in getattr(fleet, "revoked_arm_actions", ()) or ()}


def assignment_scopes(fleet: Any) -> list[str]:
    """Where the steward role is assigned: each access cluster and its node resource group
    (main.bicep accessClusters), and whole resource groups (``fleet.arm_access_resource_groups``:
    main.bicep accessResourceGroupIds, app/resource-group-access.bicep)."""
    wanted = getattr(fleet, "arm_access_clusters", None)
    wanted_ids = None if wanted is None else {str(i).lower() for i in wanted}
    scopes: list[str] = [str(g) for g in sorted(getattr(fleet, "arm_access_resource_groups", None) or ())]
    for key in sorted(fleet.clusters):
        c = fleet.clusters[key]
        if wanted_ids is not None and c.id.lower() not in wanted_ids:
            continue
        scopes += [c.id, f"/subscriptions/{c.subscription}/resourceGroups/{c.node_resource_group}"]
    return scopes


def _within(scope: str, assigned: str) -> bool:
    s, a = scope.lower().rstrip("/"), assigned.lower().rstrip("/")
    return s == a or s.startswith(a + "/")


def app_may(fleet: Any, action: str, scope: str) -> bool:
    """Whether the app's identity holds ``action`` over ``scope``."""
    steward, linked = project_roles()
    if _revoked(fleet, action):
        return False
    if linked.allows(action) and any(_within(scope, g) for g in linked_scopes(fleet)):
        return True  # the linked-resources role, on the groups main.bicep's linkedResourceGroupIds names
    return steward.allows(action) and any(_within(scope, a) for a in assignment_scopes(fleet))


def linked_scopes(fleet: Any) -> list[str]:
    """Where the linked-resources role is assigned: the resource groups of ``fleet.arm_linked_resource_groups``
    (infra/main.bicep ``linkedResourceGroupIds``, ``[]`` by default: assigned nowhere)."""
    return [str(g) for g in sorted(getattr(fleet, "arm_linked_resource_groups", None) or ())]


def authorization_failed(*, client_id: str, object_id: str, action: str, scope: str) -> tuple[int, str, str]:
    """(status, code, message) of ARM's refusal."""
    return (403, "AuthorizationFailed",
            f"The client '{client_id}' with object id '{object_id}' does not have authorization to perform action "
            f"'{action}' over scope '{scope}' or the scope is invalid. If access was recently granted, please "
            "refresh your credentials.")


def route_action(route: str, method: str, params: dict[str, str]) -> str | None:
    template = ROUTE_ACTIONS.get((route, method))
    if template is None:
        return None
    return template.replace("{action}", str(params.get("action", "")).lower())


def route_scope(route: str, path: str) -> str:
    """The scope ARM names: the resource the request addresses (an action's path without the action)."""
    clean = path.split("?", 1)[0].rstrip("/")
    if route in ("delete_machines", "user_credential", "vm_action", "feature_action", "cluster_abort", "pool_abort"):
        clean = clean.rsplit("/", 1)[0]
    return clean


# --------------------------------------------------------------------------- Azure RBAC for Kubernetes
# A cluster with Azure RBAC for Kubernetes authorization (aadProfile.enableAzureRBAC) also asks Azure,
# through the AKS authorization webhook (kubeguard/guard, authz/providers/azure/rbac/checkaccessreqhelper.go
# getDataActions, getResourceAndAction, getActionName), whether the caller holds the request's *data
# action*: Microsoft.ContainerService/managedClusters/<group>/<resource>/<read|write|delete>, over the
# cluster, or over `<cluster id>/namespaces/<namespace>` for a namespaced request (getScope). The
# sub-resource is dropped (pods/exec alone maps to pods/exec/action), so there is no eviction data action:
# an eviction (pods/eviction create) is checked as pods/write, the data action of a pod create.
# Kubernetes RBAC stays in force next to it for Entra identities: "AKS authorizes the request using one
# (or both) of two models" (learn.microsoft.com/azure/aks/concepts-identity), "You can use both models on
# the same cluster" (.../aks/concepts-cluster-authorization). Modelled as kube-apiserver's authorizer
# union with RBAC ahead of the webhook, so either one allowing is enough (sim/kube/rbac.py authorize). guard
# answers a denial with ``Denied: true`` (checkaccessreqhelper.go ConvertCheckAccessResponse), which ends
# a union at the webhook; AKS does not publish its --authorization-mode order, and the union is what its
# documentation describes (docs/fidelity.md). What the app holds comes from
# infra/app/kubernetes-role.bicep (``dataActions`` assigned on the cluster, ``namespaceDataActions`` on
# the app's namespace only: app/cluster-access.bicep), minus ``fleet.revoked_arm_actions``.

KUBERNETES_ROLE = INFRA / "app" / "kubernetes-role.bicep"
CLUSTER_ACCESS = INFRA / "app" / "cluster-access.bicep"
AKS_DATA_PREFIX = "Microsoft.ContainerService/managedClusters/"
# the denial's reason as AKS answers it (seen in kubectl's "... is forbidden: User ... : <reason>")
GUARD_DENIED = "User does not have access to the resource in Azure. Update role assignment to allow access."
_FOLD = {"get": "read", "list": "read", "watch": "read", "create": "write", "update": "write", "patch": "write",
         "delete": "delete", "deletecollection": "delete"}

_KUBE_ROLES: tuple[Role, Role, str] | None = None


def kubernetes_roles() -> tuple[Role, Role, str]:
    """(cluster-wide data role, own-namespace data role, the namespace it is assigned on)."""
    global _KUBE_ROLES
    if _KUBE_ROLES is None:
        text = KUBERNETES_ROLE.read_text(encoding="utf-8")
        access = CLUSTER_ACCESS.read_text(encoding="utf-8")
        match = re.search(r"^param stewardNamespace string = '([^']+)'", access, re.MULTILINE)
        if match is None:
            raise ValueError(f"{CLUSTER_ACCESS}: no default for param stewardNamespace")
        _KUBE_ROLES = (Role("kubernetes", (), data_actions=_bicep_array(text, "dataActions")),
                       Role("kubernetes-namespace", (), data_actions=_bicep_array(text, "namespaceDataActions")),
                       match.group(1))
    return _KUBE_ROLES


def kubernetes_data_action(group: str, resource: str, subresource: str, verb: str) -> str:
    """The data action the AKS webhook checks for a Kubernetes request: the group (none for core), the
    resource without its subresource (pods/exec excepted: an eviction is ``pods/write``, like a pod
    create), the verb folded to read/write/delete (guard checkaccessreqhelper.go getResourceAndAction)."""
    if resource == "pods" and subresource == "exec":
        tail = "pods/exec/action"
    else:
        tail = f"{resource}/{_FOLD.get(verb, verb + '/action')}"
    return AKS_DATA_PREFIX + (f"{group}/" if group else "") + tail


def app_may_in_cluster(fleet: Any, cluster: Any, action: str, namespace: str) -> bool:
    """Whether the app's Azure role assignments grant the data action in ``cluster`` (and ``namespace``)."""
    if _revoked(fleet, action):
        return False
    if not any(_within(cluster.id, a) for a in assignment_scopes(fleet)):
        return False
    cluster_role, namespace_role, app_namespace = kubernetes_roles()

    def holds(role: Role) -> bool:
        return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in role.data_actions)

    return holds(cluster_role) or (namespace == app_namespace and holds(namespace_role))

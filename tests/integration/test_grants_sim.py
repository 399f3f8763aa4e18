"""Each grant the deployment gives the app is needed, and is enough: taken away, its call fails, clearly.

One in-process simulator (HTTPS, manual clock) authorizes the app's identity exactly as infra/ grants it
(sim/kube/rbac.py over infra/kubernetes/*.yaml, sim/arm/rbac.py over infra/app/steward-role.bicep). For
every Kubernetes rule verb (ClusterRole and the namespaced Roles) and every ARM action, the test drives
the production adapter method that needs it (shared.adapters.kube.client.KubeClient, shared.adapters.aks.AksClient,
shared.adapters.compute.ComputeClient, through ManagedIdentityCredential): with the grant taken away the call
raises the project's Forbidden naming the verb and resource, or the action; with it back, the same call
goes through. The tables are checked against the declarations (shared.adapters.permissions) so that a new grant
without a test here fails.

On clusters with Azure RBAC for Kubernetes the app holds no pod write (issue 19): its own token, got from the
managed-identity endpoint as the app gets it, is refused a pod create in every namespace, and evictions are
granted by the ClusterRole alone (infra/app/kubernetes-role.bicep explains why pods/write is not granted).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from shared.adapters.kube.client import NODE_EVENTS_NAMESPACE
from shared.adapters.permissions import APP_NAMESPACE, CLUSTER, collect_scoped_kube_rules, in_namespace, namespace_of
from shared.kernel.clock import ManualClock
from shared.kernel.errors import Forbidden
from shared.settings import load

if importlib.util.find_spec("sim.core.server") is None:  # pragma: no cover
    pytest.skip("the simulator is not in this checkout", allow_module_level=True)

from sim.arm.rbac import granted_actions
from sim.core.certs import make_certs
from sim.core.server import SimServer
from sim.kube import rbac
from sim.scenario import build_fleet

pytestmark = pytest.mark.timeout(300)

SUB = "00000000-0000-0000-0000-0000000000c8"
NS = "gpu-fleet-steward"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/gpu"
PREFIX = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Network/publicIPPrefixes/gpu-ips"
PPG = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Compute/proximityPlacementGroups/gpu-ppg"
SCENARIO: dict[str, Any] = {
    "seed": 11, "clock": {"manual": True},
    # infra/main.bicep linkedResourceGroupIds: the linked-resources role is assigned on rg-net only
    "arm_linked_resource_groups": [f"/subscriptions/{SUB}/resourceGroups/rg-net"],
    "subscriptions": [{"id": SUB, "clusters": [
        {"name": "plain", "resource_group": "rg-gpu", "tags": {"gpu-fleet-steward": "enabled"},
         "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                   {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 3,
                    "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}},
                   {"name": "doomed", "vmSize": "Standard_D4s_v5", "count": 1}],
         "workloads": [{"kind": "Deployment", "name": "api", "namespace": "ml", "replicas": 2,
                        "resources": {"cpu": "100m"}, "pdb": {"maxUnavailable": 1}}]},
        {"name": "azrbac", "resource_group": "rg-gpu", "tags": {"gpu-fleet-steward": "enabled"},
         "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                   {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 1}],
         "workloads": [{"kind": "Deployment", "name": "api", "namespace": "ml", "replicas": 1,
                        "resources": {"cpu": "100m"}, "pdb": {"maxUnavailable": 1}}]},
        # Azure RBAC for Kubernetes as docs/deploy.md deploys it: the Azure data roles and the manifests
        {"name": "azdeployed", "resource_group": "rg-gpu", "tags": {"gpu-fleet-steward": "enabled"},
         "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                   {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 1}],
         "workloads": [{"kind": "Deployment", "name": "api", "namespace": "ml", "replicas": 3,
                        "resources": {"cpu": "100m"}, "pdb": {"maxUnavailable": 1}}]},
        {"name": "nap", "resource_group": "rg-gpu", "tags": {"gpu-fleet-steward": "enabled"},
         "node_provisioning_mode": "Auto",
         "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}],
         "karpenter": {"nodeclasses": [{"name": "gpu", "tags": {"EnableManagedGPUExperience": "true"}}],
                       "nodepools": [{"name": "gpu", "node_class": "gpu", "requirements": [
                           {"key": "karpenter.azure.com/sku-gpu-manufacturer", "operator": "In",
                            "values": ["nvidia"]}]}]},
         "workloads": [{"kind": "Deployment", "name": "llm", "namespace": "genai", "replicas": 1,
                        "resources": {"cpu": "1", "nvidia.com/gpu": "1"}}]},
    ]}],
}


@dataclass
class World:
    fleet: Any
    server: Any
    aks: Any
    compute: Any
    plain: Any  # KubeClient of the plain cluster
    nap: Any  # KubeClient of the node auto-provisioning cluster
    azure: Any  # KubeClient of the cluster with Azure RBAC for Kubernetes authorization (the Azure roles alone)
    deployed: Any  # KubeClient of the Azure RBAC cluster as deployed (Azure roles and infra/kubernetes)
    app_token: Callable[[], str]  # the app's own token for the AKS audience, from the managed-identity endpoint
    ca: str  # the simulator's CA bundle

    def cluster(self, name: str) -> Any:
        return self.fleet.cluster(SUB, "rg-gpu", name)

    def api_server(self, name: str) -> str:
        from shared.adapters.kube.auth import server_and_ca

        return server_and_ca(self.aks.kubeconfig(self.cluster(name).id))[0].rstrip("/")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from shared.adapters import identity
    from shared.adapters.aks import AksClient
    from shared.adapters.compute import ComputeClient
    from shared.adapters.kube.client import KubeClient

    fleet = build_fleet(SCENARIO)
    rbac.use_azure_rbac(fleet.cluster(SUB, "rg-gpu", "azrbac"))
    rbac.use_azure_rbac(fleet.cluster(SUB, "rg-gpu", "azdeployed"), as_deployed=True)
    fleet.advance(900)  # NAP provisions a node (and its NodeClaim) for the pending GPU pod
    certs = make_certs(tmp_path_factory.mktemp("sim-grants"))
    fleet.ca_pem = certs.ca.read_bytes()
    server = SimServer(fleet, certs)
    server.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IDENTITY_ENDPOINT", f"http://127.0.0.1:{server.http_port}/msi/token")
        mp.setenv("IDENTITY_HEADER", fleet.identity_header)
        mp.delenv("MSI_ENDPOINT", raising=False)
        identity.reset()
        settings = load({"FLEET_SUBSCRIPTIONS": SUB, "ARM_ENDPOINT": server.base_url, "STEWARD_CA_BUNDLE": str(certs.ca),
                         "AzureWebJobsStorage": "UseDevelopmentStorage=true",
                         "EVENTGRID_TOPIC_ENDPOINT": f"{server.base_url}/eventgrid/api/events",
                         "IDENTITY_ENDPOINT": f"http://127.0.0.1:{server.http_port}/msi/token"})
        credential = identity.get_credential(settings)
        clock = ManualClock()
        aks = AksClient(credential, settings, clock=clock, retry_attempts=1)
        compute = ComputeClient(credential, settings, clock=clock, retry_attempts=1)

        def kube(name: str) -> Any:
            cid = fleet.cluster(SUB, "rg-gpu", name).id
            return KubeClient(aks.kubeconfig(cid), credential, server_app_id=settings.aks_server_app_id,
                              ca_bundle=str(certs.ca), clock=clock, cluster_id=cid, retry_attempts=1)

        try:
            yield World(fleet, server, aks, compute, kube("plain"), kube("nap"), kube("azrbac"), kube("azdeployed"),
                        lambda: str(credential.get_token(settings.aks_scope).token), str(certs.ca))
        finally:
            identity.reset()
            server.stop()


# --------------------------------------------------------------------------- Kubernetes


def _gpu_node(w: World) -> Any:
    return next(iter(w.plain.list_nodes(label_selector="kubernetes.azure.com/agentpool=gpu")))


def _api_pod(w: World) -> Any:
    return next(p for p in w.plain.list_pods(namespace="ml") if p.deletion_timestamp is None)


def _nodepool(name: str) -> dict[str, Any]:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.azure.com", "kind": "AKSNodeClass",
                                                            "name": "gpu"}, "requirements": []}}}}


def _nodeclass(name: str) -> dict[str, Any]:
    return {"apiVersion": "karpenter.azure.com/v1beta1", "kind": "AKSNodeClass", "metadata": {"name": name},
            "spec": {"imageFamily": "Ubuntu2204"}}


def _job(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "c", "image": "busybox"}]}}}}


def _nap_node_and_claim(w: World) -> tuple[str, str]:
    c = w.cluster("nap")
    claim = next(iter(c.items("nodeclaims.karpenter.sh")))
    status = claim.obj.get("status") or {}
    return str(status.get("nodeName") or ""), str(status.get("providerID") or "")


def _lease_update(w: World) -> None:
    assert w.plain.acquire_lease("grants-renew", holder="me", duration_s=60)  # may be created already


KUBE_DRIVERS: dict[tuple[str, str, str, str], Callable[[World], Any]] = {
    (CLUSTER, "", "nodes", "get"): lambda w: w.plain.get_node(_gpu_node(w).name),
    (CLUSTER, "", "nodes", "list"): lambda w: list(w.plain.list_nodes()),
    (CLUSTER, "", "nodes", "patch"): lambda w: w.plain.patch_node(_gpu_node(w).name, {"metadata": {"labels": {
        "grants": "checked"}}}),
    (CLUSTER, "", "pods", "list"): lambda w: w.plain.list_pods(node_name=_gpu_node(w).name),
    (CLUSTER, "", "pods/eviction", "create"): lambda w: w.plain.evict("ml", "no-such-pod"),
    (CLUSTER, "policy", "poddisruptionbudgets", "list"): lambda w: w.plain.list_pdbs(),
    (CLUSTER, "karpenter.sh", "nodepools", "get"): lambda w: w.nap.get_object("karpenter.sh/v1", "NodePool", "gpu"),
    (CLUSTER, "karpenter.sh", "nodepools", "create"): lambda w: w.nap.apply_object(_nodepool("grants-new")),
    (CLUSTER, "karpenter.sh", "nodepools", "update"): lambda w: w.nap.apply_object(_nodepool("gpu")),
    (CLUSTER, "karpenter.sh", "nodepools", "delete"): lambda w: w.nap.delete_object("karpenter.sh/v1", "NodePool",
                                                                                    "grants-gone"),
    (CLUSTER, "karpenter.azure.com", "aksnodeclasses", "get"): lambda w: w.nap.get_object(
        "karpenter.azure.com/v1beta1", "AKSNodeClass", "gpu"),
    (CLUSTER, "karpenter.azure.com", "aksnodeclasses", "create"): lambda w: w.nap.apply_object(_nodeclass("grants-new")),
    (CLUSTER, "karpenter.azure.com", "aksnodeclasses", "update"): lambda w: w.nap.apply_object(_nodeclass("gpu")),
    (CLUSTER, "karpenter.azure.com", "aksnodeclasses", "delete"): lambda w: w.nap.delete_object(
        "karpenter.azure.com/v1beta1", "AKSNodeClass", "grants-gone"),
    (CLUSTER, "karpenter.sh", "nodeclaims", "list"): lambda w: w.nap.delete_nodeclaim(node_name="no-such-node",
                                                                                      provider_id="azure:///none"),
    (CLUSTER, "karpenter.sh", "nodeclaims", "delete"): lambda w: w.nap.delete_nodeclaim(
        node_name=_nap_node_and_claim(w)[0], provider_id=_nap_node_and_claim(w)[1]),
    (APP_NAMESPACE, "coordination.k8s.io", "leases", "get"): lambda w: w.plain.acquire_lease(
        "grants-get", holder="me", duration_s=60),
    (APP_NAMESPACE, "coordination.k8s.io", "leases", "create"): lambda w: w.plain.acquire_lease(
        "grants-create", holder="me", duration_s=60),
    (APP_NAMESPACE, "coordination.k8s.io", "leases", "update"): _lease_update,
    (APP_NAMESPACE, "batch", "jobs", "create"): lambda w: w.plain.create_object(_job("grants-create")),
    (APP_NAMESPACE, "batch", "jobs", "get"): lambda w: w.plain.get_object("batch/v1", "Job", "grants-get", NS),
    (APP_NAMESPACE, "batch", "jobs", "delete"): lambda w: w.plain.delete_object("batch/v1", "Job", "grants-gone", NS),
}
# Events about Nodes live in `default` (the API server refuses them elsewhere), granted by the Role there alone.
# Best effort: refused, it is logged, never raised.
EVENT_RULE = (in_namespace(NODE_EVENTS_NAMESPACE), "", "events", "create")


def test_every_kubernetes_grant_has_a_driver_here() -> None:
    import shared.adapters.kube.client

    assert set(KUBE_DRIVERS) | {EVENT_RULE} == collect_scoped_kube_rules(shared.adapters.kube.client)


def _role_of(scope: str) -> tuple[str, str, str]:
    """(kind, namespace, name) of the deployed role granting ``scope``'s rules (infra/kubernetes)."""
    if scope == CLUSTER:
        return "ClusterRole", "", "gpu-fleet-steward"
    ns = NS if scope == APP_NAMESPACE else namespace_of(scope)
    [name] = [n for kind, namespace, n in rbac.namespaced_grants() if (kind, namespace) == ("Role", ns)]
    return "Role", str(ns), name


def _revoke_kube(w: World, scope: str, group: str, resource: str, verb: str) -> None:
    kind, ns, role = _role_of(scope)
    for name in ("plain", "nap"):
        with w.fleet.lock:
            rbac.revoke(w.cluster(name), kind=kind, name=role, namespace=ns, group=group, resource=resource, verb=verb)


def _redeploy(w: World) -> None:
    """Put the manifests back as deployed (the revoked rule returns)."""
    from sim.identity import app_principal_id

    with w.fleet.lock:
        for name in ("plain", "nap"):
            c = w.cluster(name)
            c.remove(rbac.RBAC_KEYS["ClusterRole"], "", "gpu-fleet-steward")
            for kind, ns, role in rbac.namespaced_grants():
                if kind == "Role":
                    c.remove(rbac.RBAC_KEYS[kind], ns, role)
            rbac.deploy_app_manifests(c, app_principal_id(w.fleet))


@pytest.mark.parametrize("rule", list(KUBE_DRIVERS), ids=["/".join(filter(None, r)) for r in KUBE_DRIVERS])
def test_without_one_kubernetes_grant_its_call_is_forbidden_and_with_it_the_call_goes_through(
        world: World, rule: tuple[str, str, str, str]) -> None:
    scope, group, resource, verb = rule
    drive = KUBE_DRIVERS[rule]
    if rule == (APP_NAMESPACE, "coordination.k8s.io", "leases", "update"):
        drive(world)  # the lease exists and is held: renewing it is a get + update
    _revoke_kube(world, scope, group, resource, verb)
    try:
        with pytest.raises(Forbidden) as refused:
            drive(world)
    finally:
        _redeploy(world)
    where = f'in the namespace "{NS}"' if scope == APP_NAMESPACE else ("at the cluster scope" if resource not in (
        "pods/eviction",) else 'in the namespace "ml"')
    assert f'cannot {verb} resource "{resource}" in API group "{group}" {where}' in str(refused.value)
    drive(world)  # granted again: the same call goes through


def test_without_the_event_grant_recording_an_event_is_logged_not_raised(world: World,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    _revoke_kube(world, *EVENT_RULE)
    try:
        with caplog.at_level(logging.WARNING):
            world.plain.create_event(node=_gpu_node(world), reason="GrantsCheck", message="refused")
    finally:
        _redeploy(world)
    logged = " ".join(str(getattr(r, "error", "")) for r in caplog.records)
    assert f'cannot create resource "events" in API group "" in the namespace "{NODE_EVENTS_NAMESPACE}"' in logged
    caplog.clear()
    before = len(world.cluster("plain").items("events", NODE_EVENTS_NAMESPACE))
    with caplog.at_level(logging.WARNING):
        world.plain.create_event(node=_gpu_node(world), reason="GrantsCheck", message="allowed")
    assert not [r for r in caplog.records if r.name == "steward.kube"], [getattr(r, "error", "") for r in caplog.records]
    events = [o.obj for o in world.cluster("plain").items("events", NODE_EVENTS_NAMESPACE)]
    assert len(events) == before + 1
    assert [e["involvedObject"]["kind"] for e in events if e.get("reason") == "GrantsCheck"] == ["Node"]
    assert not [o for o in world.cluster("plain").items("events", NS) if o.obj.get("reason") == "GrantsCheck"]


# --------------------------------------------------------------------------- ARM

MC = "Microsoft.ContainerService/managedClusters"
VMSS_VM = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines"


def _cid(w: World) -> str:
    return str(w.cluster("plain").id)


def _vm(w: World, index: int) -> str:
    return str(w.aks.list_machines(_cid(w), "gpu")[index].resource_id)


def _pool_body(**extra: Any) -> dict[str, Any]:
    return {"properties": {"vmSize": "Standard_D4s_v5", "count": 1, "mode": "User", "osType": "Linux", **extra}}


ARM_DRIVERS: dict[str, Callable[[World], Any]] = {
    f"{MC}/read": lambda w: w.aks.get_cluster(_cid(w)),
    f"{MC}/listClusterUserCredential/action": lambda w: w.aks.kubeconfig(_cid(w)),
    f"{MC}/maintenanceConfigurations/read": lambda w: w.aks.list_maintenance_configurations(_cid(w)),
    f"{MC}/agentPools/read": lambda w: w.aks.list_pools(_cid(w)),
    f"{MC}/agentPools/write": lambda w: w.aks.begin_put_pool(_cid(w), "scratch", _pool_body()),
    f"{MC}/agentPools/delete": lambda w: w.aks.begin_delete_pool(_cid(w), "doomed"),
    f"{MC}/agentPools/deleteMachines/action": lambda w: w.aks.begin_delete_machines(
        _cid(w), "gpu", [w.aks.list_machines(_cid(w), "gpu")[-1].name]),
    f"{MC}/agentPools/machines/read": lambda w: w.aks.list_machines(_cid(w), "gpu"),
    f"{VMSS_VM}/restart/action": lambda w: w.compute.begin_restart(_vm(w, 0)),
    f"{VMSS_VM}/reimage/action": lambda w: w.compute.begin_reimage(_vm(w, 1)),
    "Microsoft.ResourceHealth/availabilityStatuses/read": lambda w: w.compute.get_availability(_vm(w, 0)),
    "Microsoft.Network/virtualNetworks/subnets/join/action": lambda w: w.aks.begin_put_pool(
        _cid(w), "vnetpool", _pool_body(vnetSubnetID=SUBNET)),
    "Microsoft.Network/publicIPPrefixes/join/action": lambda w: w.aks.begin_put_pool(
        _cid(w), "ippool", _pool_body(enableNodePublicIP=True, nodePublicIPPrefixID=PREFIX)),
    "Microsoft.Compute/proximityPlacementGroups/write": lambda w: w.aks.begin_put_pool(
        _cid(w), "ppgpool", _pool_body(proximityPlacementGroupID=PPG)),
}


def test_every_arm_action_has_a_driver_here(world: World) -> None:
    assert set(ARM_DRIVERS) == granted_actions(world.fleet)


@pytest.mark.parametrize("action", list(ARM_DRIVERS), ids=[a.split("/", 1)[1] for a in ARM_DRIVERS])
def test_without_one_arm_action_its_call_is_forbidden_and_with_it_the_call_goes_through(world: World,
                                                                                        action: str) -> None:
    drive = ARM_DRIVERS[action]
    world.fleet.advance(600)  # earlier writes on the cluster are done (AKS allows one operation at a time)
    world.fleet.revoked_arm_actions = {action}
    try:
        with pytest.raises(Forbidden) as refused:
            drive(world)
    finally:
        world.fleet.revoked_arm_actions = set()
    message = str(refused.value)
    assert f"'{action}'" in message
    # AuthorizationFailed ("does not have authorization to perform action") or, for a linked resource,
    # LinkedAuthorizationFailed ("does not have permission to perform action(s)")
    assert "does not have authorization to perform action" in message or \
        "does not have permission to perform action(s)" in message
    drive(world)  # granted again: the same call goes through


# --------------------------------------------------------------------------- Azure RBAC for Kubernetes

K8S = "Microsoft.ContainerService/managedClusters"


def _azure_node(w: World) -> Any:
    return next(iter(w.azure.list_nodes(label_selector="kubernetes.azure.com/agentpool=gpu")))


def _azure_lease(w: World) -> None:
    assert w.azure.acquire_lease("grants-azure", holder="me", duration_s=60)


DATA_DRIVERS: dict[str, Callable[[World], Any]] = {
    f"{K8S}/nodes/read": lambda w: list(w.azure.list_nodes()),
    f"{K8S}/nodes/write": lambda w: w.azure.patch_node(_azure_node(w).name, {"metadata": {"labels": {"g": "ok"}}}),
    f"{K8S}/pods/read": lambda w: w.azure.list_pods(namespace="ml"),
    f"{K8S}/policy/poddisruptionbudgets/read": lambda w: w.azure.list_pdbs(),
    f"{K8S}/batch/jobs/write": lambda w: w.azure.create_object(_job("azure-create")),
    f"{K8S}/batch/jobs/read": lambda w: w.azure.get_object("batch/v1", "Job", "azure-get", NS),
    f"{K8S}/batch/jobs/delete": lambda w: w.azure.delete_object("batch/v1", "Job", "azure-gone", NS),
    f"{K8S}/coordination.k8s.io/leases/read": _azure_lease,
    f"{K8S}/coordination.k8s.io/leases/write": lambda w: w.azure.acquire_lease("grants-azure-new", holder="me",
                                                                                duration_s=60),
}
# Not held by the Azure roles: the node Events in `default` are left to the Kubernetes Role there (applied on
# every cluster), as the evictions are to the ClusterRole (infra/app/kubernetes-role.bicep).
EVENT_DATA_ACTION = f"{K8S}/events/write"


def test_every_kubernetes_data_action_has_a_driver_here() -> None:
    from sim.arm.rbac import kubernetes_roles

    cluster_role, namespace_role, _ = kubernetes_roles()
    held = set(cluster_role.data_actions) | set(namespace_role.data_actions)
    assert set(DATA_DRIVERS) == held
    assert EVENT_DATA_ACTION not in held


def test_on_an_azure_rbac_cluster_as_deployed_node_events_are_granted_by_the_kubernetes_role(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    node = next(iter(world.deployed.list_nodes(label_selector="kubernetes.azure.com/agentpool=gpu")))
    before = len(world.cluster("azdeployed").items("events", NODE_EVENTS_NAMESPACE))
    with caplog.at_level(logging.WARNING):
        world.deployed.create_event(node=node, reason="GrantsCheck", message="allowed")
    assert not [r for r in caplog.records if r.name == "steward.kube"], [getattr(r, "error", "") for r in caplog.records]
    assert len(world.cluster("azdeployed").items("events", NODE_EVENTS_NAMESPACE)) == before + 1
    # the Azure roles alone hold no event write: refused (logged, never raised)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        world.azure.create_event(node=_azure_node(world), reason="GrantsCheck", message="refused")
    logged = " ".join(str(getattr(r, "error", "")) for r in caplog.records)
    assert f'cannot create resource "events" in API group "" in the namespace "{NODE_EVENTS_NAMESPACE}"' in logged


@pytest.mark.parametrize("action", list(DATA_DRIVERS), ids=[a.removeprefix(K8S + "/") for a in DATA_DRIVERS])
def test_with_azure_rbac_without_one_data_action_its_call_is_forbidden(world: World, action: str) -> None:
    from sim.arm.rbac import GUARD_DENIED

    drive = DATA_DRIVERS[action]
    world.fleet.revoked_arm_actions = {action}
    try:
        with pytest.raises(Forbidden) as refused:
            drive(world)
    finally:
        world.fleet.revoked_arm_actions = set()
    assert GUARD_DENIED in str(refused.value)
    drive(world)  # granted again: the same call goes through


# --------------------------------------------------------------------------- Azure RBAC: no pod writes (issue 19)

PODS_WRITE = f"{K8S}/pods/write"


def _privileged_pod(name: str, namespace: str) -> dict[str, Any]:
    """What a stolen token would start: a privileged, host-PID pod mounting the node's root."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"hostPID": True, "containers": [{"name": "c", "image": "busybox",
                                                      "securityContext": {"privileged": True},
                                                      "volumeMounts": [{"name": "root", "mountPath": "/host"}]}],
                     "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}


def _post_pod(w: World, cluster: str, namespace: str, name: str, token: str) -> tuple[int, dict[str, Any]]:
    """POST a pod to the cluster's API server with ``token``, as any Kubernetes client would."""
    url = f"{w.api_server(cluster)}/api/v1/namespaces/{namespace}/pods"
    request = urllib.request.Request(url, data=json.dumps(_privileged_pod(name, namespace)).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=w.ca)
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return int(answer.status), json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as refused:
        return int(refused.code), json.loads(refused.read() or b"{}")


def _admin_token(w: World) -> str:
    from sim.identity.tokens import AKS_AUDIENCES

    return str(w.fleet.tokens.issue(AKS_AUDIENCES[0])[0])  # the harness: system:masters


def _remove_pod(w: World, cluster: str, namespace: str, name: str) -> None:
    with w.fleet.lock:
        w.cluster(cluster).remove("pods", namespace, name)


@pytest.mark.parametrize("cluster", ["azrbac", "azdeployed"], ids=["azure-roles-alone", "as-deployed"])
@pytest.mark.parametrize("namespace", ["kube-system", "ml", NS], ids=["kube-system", "a-teams-namespace",
                                                                      "the-apps-own-namespace"])
def test_on_an_azure_rbac_cluster_the_apps_token_is_refused_a_pod_create(world: World, cluster: str,
                                                                         namespace: str) -> None:
    from sim.arm.rbac import GUARD_DENIED
    from sim.identity import app_principal_id

    name = f"grants-{cluster}-{namespace}"[:63]
    status, body = _post_pod(world, cluster, namespace, name, world.app_token())
    assert status == 403, body
    assert body["reason"] == "Forbidden"
    assert body["message"] == (
        f'pods is forbidden: User "{app_principal_id(world.fleet)}" cannot create resource "pods" in API group "" '
        f'in the namespace "{namespace}": {GUARD_DENIED}')
    assert world.cluster(cluster).get("pods", namespace, name) is None
    # the same request with an administrator's token passes authorization: created, or (in the app's own
    # namespace, which enforces Pod Security "restricted") refused by admission, not by RBAC
    status, body = _post_pod(world, cluster, namespace, name, _admin_token(world))
    try:
        if namespace == NS:
            assert status == 403 and 'violates PodSecurity "restricted:latest"' in body["message"], body
        else:
            assert status == 201, body
    finally:
        _remove_pod(world, cluster, namespace, name)


def test_with_the_pods_write_data_action_the_apps_token_could_create_a_privileged_pod_in_kube_system(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """What dropping pods/write from the Azure role closed (and proof that the refusal above can fail)."""
    from sim.arm import rbac as armrbac

    cluster_role, namespace_role, namespace = armrbac.kubernetes_roles()
    assert PODS_WRITE not in cluster_role.data_actions
    widened = armrbac.Role(cluster_role.name, (), data_actions=(*cluster_role.data_actions, PODS_WRITE))
    monkeypatch.setattr(armrbac, "_KUBE_ROLES", (widened, namespace_role, namespace))
    status, body = _post_pod(world, "azrbac", "kube-system", "grants-widened", world.app_token())
    try:
        assert status == 201, body
        assert body["spec"]["containers"][0]["securityContext"] == {"privileged": True}
    finally:
        _remove_pod(world, "azrbac", "kube-system", "grants-widened")


def _live_api_pod(w: World, cluster: str) -> str:
    with w.fleet.lock:
        pods = [o.obj for o in w.cluster(cluster).items("pods", "ml")]
    return next(str(p["metadata"]["name"]) for p in pods if not p["metadata"].get("deletionTimestamp"))


def test_on_an_azure_rbac_cluster_evictions_are_granted_by_the_cluster_role_alone(world: World) -> None:
    from shared.kernel.ports import EVICTED, EVICTION_BLOCKED
    from sim.arm.rbac import GUARD_DENIED

    # as deployed: the ClusterRole's pods/eviction create lets the drain evict through the Eviction API
    assert world.deployed.evict("ml", _live_api_pod(world, "azdeployed")).outcome == EVICTED
    # without the ClusterRole's eviction rule, the Azure role does not grant it: refused with AKS's reason
    with world.fleet.lock:
        rbac.revoke(world.cluster("azdeployed"), kind="ClusterRole", name="gpu-fleet-steward", group="",
                    resource="pods/eviction", verb="create")
    try:
        with pytest.raises(Forbidden) as refused:
            world.deployed.evict("ml", _live_api_pod(world, "azdeployed"))
    finally:
        from sim.identity import app_principal_id

        with world.fleet.lock:
            c = world.cluster("azdeployed")
            c.remove(rbac.RBAC_KEYS["ClusterRole"], "", "gpu-fleet-steward")
            rbac.deploy_app_manifests(c, app_principal_id(world.fleet))
    assert 'cannot create resource "pods/eviction" in API group "" in the namespace "ml"' in str(refused.value)
    assert GUARD_DENIED in str(refused.value)
    # the Azure roles alone (no ClusterRole) refuse every eviction the same way
    with pytest.raises(Forbidden) as alone:
        world.azure.evict("ml", _live_api_pod(world, "azrbac"))
    assert GUARD_DENIED in str(alone.value)
    # the rule back: the eviction reaches the Eviction API again (evicted, or held by the PDB while the first
    # evicted pod's replacement starts), never refused by authorization
    assert world.deployed.evict("ml", _live_api_pod(world, "azdeployed")).outcome in (EVICTED, EVICTION_BLOCKED)

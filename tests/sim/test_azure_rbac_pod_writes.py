"""On a cluster with Azure RBAC for Kubernetes the app holds no pod write, and evictions come from the ClusterRole.

AKS's authorization webhook (kubeguard/guard, authz/providers/azure/rbac/checkaccessreqhelper.go
getResourceAndAction) checks a data action built from the group, the resource without its sub-resource
(pods/exec alone keeps it) and the verb folded to read/write/delete: an eviction (``create pods/eviction``)
is checked as ``managedClusters/pods/write``, exactly as a pod create is. The project's Azure role
(infra/app/kubernetes-role.bicep) therefore holds no pod write (issue 19), and the app's evictions are
authorised by the Kubernetes ClusterRole (infra/kubernetes/clusterrole.yaml), which AKS evaluates next to
Azure RBAC: either one allowing is enough (learn.microsoft.com/azure/aks/concepts-identity: "AKS authorizes
the request using one (or both) of two models").

In-process KubeApi, as tests/sim/test_kube_rbac.py drives it: the app's token carries its object id and
no group; the administrator's carries ``system:masters``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.arm import rbac as armrbac
from sim.core.http import Headers, Request, Response
from sim.identity import APP_PRINCIPAL_ID
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube import rbac
from sim.kube.api import KubeApi
from sim.model import Fleet, SimClock

SUB = "00000000-0000-0000-0000-0000000000b9"
NS = "gpu-fleet-steward"
PODS_WRITE = "Microsoft.ContainerService/managedClusters/pods/write"


class Cluster:
    """One simulated cluster with Azure RBAC: the Azure roles alone, or ``as_deployed`` (docs/deploy.md step 3:
    the manifests of infra/kubernetes applied as well)."""

    def __init__(self, *, as_deployed: bool) -> None:
        self.fleet = Fleet(seed=9, clock=SimClock(manual=True))
        self.cluster = self.fleet.add_cluster(subscription=SUB, resource_group="rg", name="c1")
        rbac.use_azure_rbac(self.cluster, as_deployed=as_deployed)
        self.api = KubeApi(self.fleet)
        self.admin = self.fleet.tokens.issue(AKS_AUDIENCES[0])[0]
        self.app = self.fleet.tokens.issue(AKS_AUDIENCES[0], principal=APP_PRINCIPAL_ID, client_id="c11d", groups=())[0]

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> tuple[int, dict[str, Any]]:
        headers = Headers({"Host": "127.0.0.1", "Authorization": f"Bearer {token or self.app}"})
        raw = json.dumps(body).encode() if body is not None else b""
        resp: Response = self.api.handle(Request(method, f"/k8s/{SUB}/rg/c1{path}", headers, raw))
        return resp.status, (json.loads(resp.body) if resp.body else {})


def _pod(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}


def _eviction(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}


@pytest.mark.parametrize(("group", "resource", "subresource", "verb", "action"), [
    pytest.param("", "pods", "eviction", "create", "pods/write", id="an-eviction-is-a-pod-write"),
    pytest.param("", "pods", "", "create", "pods/write", id="so-is-a-pod-create"),
    pytest.param("", "pods", "", "patch", "pods/write", id="and-a-pod-patch"),
    pytest.param("", "pods", "exec", "create", "pods/exec/action", id="exec-alone-keeps-its-subresource"),
    pytest.param("", "nodes", "", "patch", "nodes/write", id="a-cordon-is-a-node-write"),
])
def test_the_data_action_drops_the_subresource_as_akss_webhook_does(group: str, resource: str, subresource: str,
                                                                    verb: str, action: str) -> None:
    assert armrbac.kubernetes_data_action(group, resource, subresource, verb) == armrbac.AKS_DATA_PREFIX + action


def test_the_apps_azure_roles_hold_no_pod_write() -> None:
    cluster_role, namespace_role, _ = armrbac.kubernetes_roles()
    assert PODS_WRITE not in cluster_role.data_actions + namespace_role.data_actions


@pytest.mark.parametrize("as_deployed", [False, True], ids=["azure-roles-alone", "as-deployed"])
@pytest.mark.parametrize("namespace", ["kube-system", "default", NS])
def test_the_apps_token_is_refused_a_pod_create_in_every_namespace(as_deployed: bool, namespace: str) -> None:
    c = Cluster(as_deployed=as_deployed)
    status, body = c.call("POST", f"/api/v1/namespaces/{namespace}/pods", _pod("p", namespace))
    assert status == 403, body
    assert body["message"] == (f'pods is forbidden: User "{APP_PRINCIPAL_ID}" cannot create resource "pods" in API '
                               f'group "" in the namespace "{namespace}": {armrbac.GUARD_DENIED}')
    assert c.cluster.get("pods", namespace, "p") is None


def test_the_azure_roles_alone_refuse_an_eviction_with_akss_reason() -> None:
    c = Cluster(as_deployed=False)
    c.call("POST", "/api/v1/namespaces/default/pods", _pod("victim", "default"), token=c.admin)
    status, body = c.call("POST", "/api/v1/namespaces/default/pods/victim/eviction", _eviction("victim", "default"))
    assert status == 403, body
    assert body["message"] == (f'pods "victim" is forbidden: User "{APP_PRINCIPAL_ID}" cannot create resource '
                               f'"pods/eviction" in API group "" in the namespace "default": {armrbac.GUARD_DENIED}')
    assert c.cluster.get("pods", "default", "victim") is not None


def test_as_deployed_the_cluster_role_authorises_the_eviction_and_nothing_more() -> None:
    c = Cluster(as_deployed=True)
    c.call("POST", "/api/v1/namespaces/default/pods", _pod("victim", "default"), token=c.admin)
    status, body = c.call("POST", "/api/v1/namespaces/default/pods/victim/eviction", _eviction("victim", "default"))
    assert status == 201, body
    for method, path in (("DELETE", "/api/v1/namespaces/default/pods/victim"),
                         ("PATCH", "/api/v1/namespaces/default/pods/victim")):
        status, body = c.call(method, path, {"metadata": {"labels": {"x": "y"}}} if method == "PATCH" else None)
        assert status == 403, (method, body)


def test_with_pods_write_in_the_azure_role_the_apps_token_would_create_a_privileged_pod(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The grant issue 19 removed, put back: the refusals above come from its absence, nothing else."""
    cluster_role, namespace_role, namespace = armrbac.kubernetes_roles()
    widened = armrbac.Role(cluster_role.name, (), data_actions=(*cluster_role.data_actions, PODS_WRITE))
    monkeypatch.setattr(armrbac, "_KUBE_ROLES", (widened, namespace_role, namespace))
    c = Cluster(as_deployed=False)
    status, body = c.call("POST", "/api/v1/namespaces/kube-system/pods", _pod("p", "kube-system"))
    assert status == 201, body
    status, body = c.call("POST", "/api/v1/namespaces/kube-system/pods/p/eviction", _eviction("p", "kube-system"))
    assert status == 201, body

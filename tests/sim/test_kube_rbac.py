"""The simulated API servers authorize with RBAC over the project's own manifests, as kube-apiserver does.

- Every cluster is created "deployed": infra/kubernetes/*.yaml applied (namespace with Pod Security
  Admission labels, ClusterRole, Role and their bindings to the app's object id).
- The app's identity gets exactly those grants; a refusal is kube-apiserver's 403 Status, word for
  word (responsewriters/errors.go forbiddenMessage, apierrors.NewForbidden).
- Request attributes come from the path, method and query as requestinfo.go derives them
  (subresources, list/watch/deletecollection, the namespace of a namespace).
- SelfSubjectAccessReview and impersonation work, so `kubectl auth can-i --as <app> ...` answers.
- A token for another audience fails authentication (401), before any authorization.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from sim.core.http import Headers, Request, Response
from sim.identity import APP_PRINCIPAL_ID
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube import rbac
from sim.kube.api import KubeApi
from sim.model import Fleet, SimClock

SUB = "00000000-0000-0000-0000-0000000000b8"
NS = "gpu-fleet-steward"


class Api:
    def __init__(self) -> None:
        self.fleet = Fleet(seed=8, clock=SimClock(manual=True))
        self.cluster = self.fleet.add_cluster(subscription=SUB, resource_group="rg", name="c1")
        self.api = KubeApi(self.fleet)
        self.admin = self.fleet.tokens.issue(AKS_AUDIENCES[0])[0]
        self.app = self.fleet.tokens.issue(AKS_AUDIENCES[0], principal=APP_PRINCIPAL_ID, client_id="c11d", groups=())[0]

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        h = Headers({"Host": "127.0.0.1", "Authorization": f"Bearer {token or self.app}", **(headers or {})})
        raw = json.dumps(body).encode() if body is not None else b""
        resp: Response = self.api.handle(Request(method, f"/k8s/{SUB}/rg/c1{path}", h, raw))
        return resp.status, (json.loads(resp.body) if resp.body else {})


@pytest.fixture
def api() -> Api:
    return Api()


def forbidden(resp: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    status, body = resp
    assert status == 403, body
    assert (body["kind"], body["status"], body["reason"], body["code"]) == ("Status", "Failure", "Forbidden", 403)
    return body


# --------------------------------------------------------------------------- deployed manifests


def test_a_new_cluster_carries_the_apps_namespace_and_rbac_from_infra(api: Api) -> None:
    ns = api.cluster.get("namespaces", "", NS)
    assert ns is not None
    assert ns.obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    [binding] = [o.obj for o in api.cluster.items(rbac.RBAC_KEYS["ClusterRoleBinding"])]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": APP_PRINCIPAL_ID}]
    [role_binding] = [o.obj for o in api.cluster.items(rbac.RBAC_KEYS["RoleBinding"], NS)]
    assert role_binding["roleRef"]["kind"] == "Role"


def test_deploying_the_manifests_draws_nothing_from_the_scenarios_random_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    deployed = Fleet(seed=4, clock=SimClock(manual=True))
    deployed.add_cluster(subscription=SUB, resource_group="rg", name="c1")
    monkeypatch.setattr(rbac, "deploy_app_manifests", lambda cluster, principal: None)
    bare = Fleet(seed=4, clock=SimClock(manual=True))
    bare.add_cluster(subscription=SUB, resource_group="rg", name="c1")
    assert bare.cluster(SUB, "rg", "c1").get("namespaces", "", NS) is None  # type: ignore[union-attr]
    assert deployed.new_uid() == bare.new_uid()  # scenarios replay exactly as before


# --------------------------------------------------------------------------- the app's grants


@pytest.mark.parametrize(("method", "path"), [
    pytest.param("GET", "/api/v1/nodes", id="list-nodes"),
    pytest.param("GET", "/api/v1/nodes/missing", id="get-node"),
    pytest.param("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dx", id="list-pods-all-namespaces"),
    pytest.param("GET", "/apis/policy/v1/poddisruptionbudgets", id="list-pdbs"),
    pytest.param("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/x", id="get-lease-own-namespace"),
    pytest.param("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/x", id="get-job-own-namespace"),
    pytest.param("GET", "/api", id="discovery"),
])
def test_what_the_manifests_grant_the_app_is_served(api: Api, method: str, path: str) -> None:
    status, body = api.call(method, path)
    assert status in (200, 404), body


@pytest.mark.parametrize(("method", "path", "message", "details"), [
    pytest.param("GET", "/api/v1/namespaces/default/pods/p1",
                 'pods "p1" is forbidden: User "{u}" cannot get resource "pods" in API group "" in the namespace '
                 '"default"', {"name": "p1", "group": "", "kind": "pods"}, id="get-pod"),
    pytest.param("DELETE", "/api/v1/namespaces/default/pods/p1",
                 'pods "p1" is forbidden: User "{u}" cannot delete resource "pods" in API group "" in the namespace '
                 '"default"', {"name": "p1", "group": "", "kind": "pods"}, id="delete-pod"),
    pytest.param("GET", "/api/v1/namespaces/kube-system/secrets",
                 'secrets is forbidden: User "{u}" cannot list resource "secrets" in API group "" in the namespace '
                 '"kube-system"', {"group": "", "kind": "secrets"}, id="list-secrets"),
    pytest.param("DELETE", "/api/v1/nodes",
                 'nodes is forbidden: User "{u}" cannot deletecollection resource "nodes" in API group "" at the '
                 "cluster scope", {"group": "", "kind": "nodes"}, id="deletecollection-nodes"),
    pytest.param("GET", "/api/v1/nodes?watch=true",
                 'nodes is forbidden: User "{u}" cannot watch resource "nodes" in API group "" at the cluster scope',
                 {"group": "", "kind": "nodes"}, id="watch-nodes"),
    pytest.param("PATCH", "/api/v1/nodes/n1/status",
                 'nodes "n1" is forbidden: User "{u}" cannot patch resource "nodes/status" in API group "" at the '
                 "cluster scope", {"name": "n1", "group": "", "kind": "nodes"}, id="patch-node-status"),
    pytest.param("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/x",
                 'leases.coordination.k8s.io "x" is forbidden: User "{u}" cannot get resource "leases" in API group '
                 '"coordination.k8s.io" in the namespace "kube-node-lease"',
                 {"name": "x", "group": "coordination.k8s.io", "kind": "leases"}, id="lease-elsewhere"),
    pytest.param("POST", "/apis/batch/v1/namespaces/default/jobs",
                 'jobs.batch is forbidden: User "{u}" cannot create resource "jobs" in API group "batch" in the '
                 'namespace "default"', {"group": "batch", "kind": "jobs"}, id="job-elsewhere"),
    pytest.param("PUT", f"/apis/batch/v1/namespaces/{NS}/jobs/x",
                 'jobs.batch "x" is forbidden: User "{u}" cannot update resource "jobs" in API group "batch" in the '
                 f'namespace "{NS}"', {"name": "x", "group": "batch", "kind": "jobs"}, id="job-update"),
    pytest.param("DELETE", "/api/v1/namespaces/gpu-fleet-steward",
                 'namespaces "gpu-fleet-steward" is forbidden: User "{u}" cannot delete resource "namespaces" in API '
                 'group "" in the namespace "gpu-fleet-steward"',
                 {"name": "gpu-fleet-steward", "group": "", "kind": "namespaces"}, id="delete-own-namespace"),
    pytest.param("GET", "/metrics", 'forbidden: User "{u}" cannot get path "/metrics"', None, id="non-resource"),
])
def test_anything_else_is_refused_with_the_api_servers_403(api: Api, method: str, path: str, message: str,
                                                           details: dict[str, Any] | None) -> None:
    body = forbidden(api.call(method, path, {} if method in ("PATCH", "POST", "PUT") else None))
    assert body["message"] == message.format(u=APP_PRINCIPAL_ID)
    assert body.get("details") == details


def test_an_eviction_is_authorized_as_the_pods_eviction_subresource(api: Api) -> None:
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p1", "namespace": "default"}}
    status, body = api.call("POST", "/api/v1/namespaces/default/pods/p1/eviction", evict)
    assert status == 404, body  # authorized; the pod simply does not exist
    rbac.revoke(api.cluster, kind="ClusterRole", name="gpu-fleet-steward", group="", resource="pods/eviction",
                verb="create")
    body = forbidden(api.call("POST", "/api/v1/namespaces/default/pods/p1/eviction", evict))
    assert body["message"] == (f'pods "p1" is forbidden: User "{APP_PRINCIPAL_ID}" cannot create resource '
                               '"pods/eviction" in API group "" in the namespace "default"')
    assert body["details"] == {"name": "p1", "group": "", "kind": "pods"}


def test_a_binding_to_a_missing_role_names_it_in_the_reason(api: Api) -> None:
    api.cluster.remove(rbac.RBAC_KEYS["ClusterRole"], "", "gpu-fleet-steward")
    body = forbidden(api.call("GET", "/api/v1/nodes"))
    assert body["message"] == (f'nodes is forbidden: User "{APP_PRINCIPAL_ID}" cannot list resource "nodes" in API '
                               'group "" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io '
                               '"gpu-fleet-steward" not found')


def test_the_harness_is_a_cluster_admin_and_may_edit_the_apps_role(api: Api) -> None:
    status, role = api.call("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpu-fleet-steward", token=api.admin)
    assert status == 200
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["nodes"]]
    status, _ = api.call("PUT", "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpu-fleet-steward", role,
                         token=api.admin)
    assert status == 200
    forbidden(api.call("GET", "/api/v1/nodes"))
    forbidden(api.call("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles"))  # the app may not read RBAC


def test_a_token_for_another_audience_fails_authentication_not_authorization(api: Api) -> None:
    arm = api.fleet.tokens.issue("https://management.azure.com/", principal=APP_PRINCIPAL_ID, groups=())[0]
    status, body = api.call("GET", "/api/v1/nodes", token=arm)
    assert (status, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")


# --------------------------------------------------------------------------- reviews and impersonation


def review(api: Api, attrs: dict[str, str], *, token: str | None = None,
           headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    return api.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body, token=token,
                    headers=headers)


def test_a_self_subject_access_review_answers_for_the_caller(api: Api) -> None:
    status, body = review(api, {"verb": "patch", "resource": "nodes"})
    assert status == 201 and body["status"]["allowed"] is True
    assert body["status"]["reason"] == (f'RBAC: allowed by ClusterRoleBinding "gpu-fleet-steward" of ClusterRole '
                                        f'"gpu-fleet-steward" to User "{APP_PRINCIPAL_ID}"')
    status, body = review(api, {"verb": "delete", "resource": "pods", "namespace": "default"})
    assert status == 201 and body["status"] == {"allowed": False}
    status, body = review(api, {"verb": "create", "group": "coordination.k8s.io", "resource": "leases", "namespace": NS})
    assert body["status"]["reason"] == (f'RBAC: allowed by RoleBinding "gpu-fleet-steward/{NS}" of Role '
                                        f'"gpu-fleet-steward" to User "{APP_PRINCIPAL_ID}"')


def test_only_an_admin_may_impersonate(api: Api) -> None:
    status, body = review(api, {"verb": "list", "resource": "nodes"}, token=api.admin,
                          headers={"Impersonate-User": APP_PRINCIPAL_ID})
    assert status == 201 and body["status"]["allowed"] is True
    status, body = review(api, {"verb": "list", "resource": "secrets"}, token=api.admin,
                          headers={"Impersonate-User": APP_PRINCIPAL_ID})
    assert body["status"]["allowed"] is False
    body = forbidden(api.call("GET", "/api/v1/nodes", headers={"Impersonate-User": "someone-else"}))
    assert body["message"] == (f'users "someone-else" is forbidden: User "{APP_PRINCIPAL_ID}" cannot impersonate '
                               'resource "users" in API group "" at the cluster scope')


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    pytest.param("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "", "pods", "", "", "ns"), id="list"),
    pytest.param("GET", "/api/v1/namespaces/ns/pods", {"watch": "1"}, ("watch", "", "pods", "", "", "ns"), id="watch"),
    pytest.param("GET", "/api/v1/watch/namespaces/ns/pods", {}, ("watch", "", "pods", "", "", "ns"), id="watch-path"),
    pytest.param("GET", "/api/v1/nodes", {"fieldSelector": "metadata.name=n1"}, ("list", "", "nodes", "", "n1", ""),
                 id="list-by-name"),
    pytest.param("DELETE", "/apis/batch/v1/namespaces/ns/jobs", {}, ("deletecollection", "batch", "jobs", "", "", "ns"),
                 id="deletecollection"),
    pytest.param("POST", "/api/v1/namespaces/ns/pods/p/eviction", {}, ("create", "", "pods", "eviction", "p", "ns"),
                 id="eviction"),
    pytest.param("PUT", "/api/v1/nodes/n1/status", {}, ("update", "", "nodes", "status", "n1", ""), id="status"),
    pytest.param("GET", "/api/v1/namespaces/ns", {}, ("get", "", "namespaces", "", "ns", "ns"), id="a-namespace"),
    pytest.param("PUT", "/api/v1/namespaces/ns/finalize", {}, ("update", "", "namespaces", "finalize", "ns", "ns"),
                 id="namespace-finalize"),
])
def test_request_attributes_are_derived_as_the_request_info_resolver_does(
        method: str, path: str, query: dict[str, str], expected: tuple[str, ...]) -> None:
    a = rbac.request_attributes(rbac.User("u"), method, path.strip("/").split("/"), query)
    assert a.resource_request
    assert (a.verb, a.api_group, a.resource, a.subresource, a.name, a.namespace) == expected


# --------------------------------------------------------------------------- kubectl


@pytest.fixture(scope="module")
def served() -> Iterator[Any]:
    from sim.testing import start_sim

    scenario = {"seed": 3, "clock": {"speed": 1},
                "subscriptions": [{"id": SUB, "clusters": [{
                    "name": "authz", "resource_group": "rg-authz",
                    "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}]}]}
    with start_sim(scenario=scenario, seed=3) as handle:
        yield handle


def kubectl(sim: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=sim.kubeconfig("authz"), HOME=str(sim.state_dir))
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize(("args", "answer"), [
    pytest.param(("patch", "nodes"), "yes", id="patch-nodes"),
    pytest.param(("list", "pods", "-A"), "yes", id="list-pods"),
    pytest.param(("create", "pods", "--subresource=eviction", "-n", "default"), "yes", id="evict"),
    pytest.param(("create", "leases.coordination.k8s.io", "-n", NS), "yes", id="lease-own-namespace"),
    pytest.param(("create", "leases.coordination.k8s.io", "-n", "kube-node-lease"), "no", id="lease-elsewhere"),
    pytest.param(("create", "jobs.batch", "-n", "default"), "no", id="job-elsewhere"),
    pytest.param(("delete", "pods", "-n", "default"), "no", id="delete-pods"),
    pytest.param(("get", "secrets", "-A"), "no", id="secrets"),
])
def test_kubectl_auth_can_i_as_the_app_answers_what_the_manifests_grant(served: Any, args: tuple[str, ...],
                                                                       answer: str) -> None:
    out = kubectl(served, "auth", "can-i", *args, "--as", APP_PRINCIPAL_ID)
    assert out.stdout.strip() == answer, out.stderr
    assert out.returncode == (0 if answer == "yes" else 1)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_kubectl_as_the_app_shows_the_forbidden_message(served: Any) -> None:
    out = kubectl(served, "get", "configmaps", "-n", "kube-system", "--as", APP_PRINCIPAL_ID)
    assert out.returncode != 0
    assert (f'configmaps is forbidden: User "{APP_PRINCIPAL_ID}" cannot list resource "configmaps" in API group "" in '
            'the namespace "kube-system"') in out.stderr
    assert kubectl(served, "get", "nodes", "--as", APP_PRINCIPAL_ID).returncode == 0


@pytest.mark.parametrize(("rule", "attrs", "allowed"), [
    pytest.param({"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}, ("delete", "", "pods", ""), True,
                 id="any-verb"),
    pytest.param({"verbs": ["create"], "apiGroups": [""], "resources": ["pods"]}, ("create", "", "pods", "eviction"),
                 False, id="resource-does-not-cover-subresource"),
    pytest.param({"verbs": ["patch"], "apiGroups": [""], "resources": ["*/status"]}, ("patch", "", "nodes", "status"),
                 True, id="star-slash-subresource"),
    pytest.param({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]}, ("get", "batch", "jobs", ""), True,
                 id="wildcards"),
    pytest.param({"verbs": ["get"], "apiGroups": ["apps"], "resources": ["jobs"]}, ("get", "batch", "jobs", ""), False,
                 id="other-group"),
    pytest.param({"verbs": ["get"], "apiGroups": [""], "resources": ["nodes"], "resourceNames": ["n1"]},
                 ("get", "", "nodes", ""), True, id="named-resource"),
    pytest.param({"verbs": ["list"], "apiGroups": [""], "resources": ["nodes"], "resourceNames": ["n1"]},
                 ("list", "", "nodes", ""), False, id="names-never-cover-an-unnamed-list"),
])
def test_rules_match_as_rbacs_evaluation_helpers_do(rule: dict[str, Any], attrs: tuple[str, str, str, str],
                                                   allowed: bool) -> None:
    verb, group, resource, sub = attrs
    name = "n1" if verb == "get" and "resourceNames" in rule else ""
    a = rbac.Attributes(user=rbac.User("u"), verb=verb, resource_request=True, api_group=group, resource=resource,
                        subresource=sub, name=name)
    assert rbac.rule_allows(rule, a) is allowed


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_kubectl_auth_can_i_list_shows_the_apps_grants_per_namespace(served: Any) -> None:
    def grants(namespace: str) -> dict[str, str]:
        out = kubectl(served, "auth", "can-i", "--list", "--as", APP_PRINCIPAL_ID, "-n", namespace)
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines()[1:] if line and not line.startswith(" ")]
        return {row[0]: " ".join(row[3:]) for row in rows}

    own, default = grants(NS), grants("default")
    assert own["jobs.batch"] == "[create delete get]"
    assert own["leases.coordination.k8s.io"] == "[create get update]"
    assert own["pods"] == "[list]" and own["pods/eviction"] == "[create]" and own["nodes"] == "[get list patch]"
    assert "jobs.batch" not in default and "leases.coordination.k8s.io" not in default
    # Events about Nodes live in `default` (pkg/apis/core/validation/events.go legacyValidateEvent): created there only
    assert default["events"] == "[create]" and "events" not in own
    assert default["pods"] == "[list]"


# --------------------------------------------------------------------------- Azure RBAC for Kubernetes


@pytest.fixture
def azure_rbac(api: Api) -> Api:
    rbac.use_azure_rbac(api.cluster)
    assert not api.cluster.items(rbac.RBAC_KEYS["ClusterRoleBinding"])  # no Kubernetes RBAC grant left
    return api


@pytest.mark.parametrize(("method", "path"), [
    pytest.param("GET", "/api/v1/nodes", id="nodes-read"),
    pytest.param("GET", "/api/v1/pods", id="pods-read"),
    pytest.param("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/x", id="lease-own-namespace"),
    pytest.param("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/x", id="job-own-namespace"),
])
def test_with_azure_rbac_the_data_roles_from_infra_grant_the_app(azure_rbac: Api, method: str, path: str) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p1", "namespace": "default"}} \
        if method == "POST" else None
    status, answer = azure_rbac.call(method, path, body)
    assert status in (200, 404), answer


@pytest.mark.parametrize(("method", "path", "message"), [
    pytest.param("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/x",
                 'leases.coordination.k8s.io "x" is forbidden: User "{u}" cannot get resource "leases" in API group '
                 '"coordination.k8s.io" in the namespace "kube-node-lease"', id="lease-outside-the-namespace-scope"),
    pytest.param("GET", "/api/v1/namespaces/ml/configmaps/x",
                 'configmaps "x" is forbidden: User "{u}" cannot get resource "configmaps" in API group "" in the '
                 'namespace "ml"', id="not-a-held-action"),
    pytest.param("GET", "/apis/karpenter.sh/v1/nodepools", 'nodepools.karpenter.sh is forbidden: User "{u}" cannot '
                 'list resource "nodepools" in API group "karpenter.sh" at the cluster scope', id="custom-resources"),
    pytest.param("POST", "/api/v1/namespaces/default/pods/p1/eviction", 'pods "p1" is forbidden: User "{u}" cannot '
                 'create resource "pods/eviction" in API group "" in the namespace "default"',
                 id="eviction-needs-the-cluster-role"),
    pytest.param("POST", "/api/v1/namespaces/default/pods", 'pods is forbidden: User "{u}" cannot create resource '
                 '"pods" in API group "" in the namespace "default"', id="no-pod-create"),
])
def test_with_azure_rbac_anything_else_is_refused_with_akss_reason(azure_rbac: Api, method: str, path: str,
                                                                    message: str) -> None:
    from sim.arm.rbac import GUARD_DENIED

    body = forbidden(azure_rbac.call(method, path))
    assert body["message"] == message.format(u=APP_PRINCIPAL_ID) + ": " + GUARD_DENIED


def test_with_azure_rbac_revoking_a_data_action_refuses_its_requests(azure_rbac: Api) -> None:
    azure_rbac.fleet.revoked_arm_actions = {"Microsoft.ContainerService/managedClusters/nodes/read"}
    forbidden(azure_rbac.call("GET", "/api/v1/nodes"))
    assert azure_rbac.call("GET", "/api/v1/pods")[0] == 200


def test_a_nap_cluster_with_azure_rbac_keeps_the_cluster_role_for_the_karpenter_kinds() -> None:
    fleet = Fleet(seed=8, clock=SimClock(manual=True))
    cluster = fleet.add_cluster(subscription=SUB, resource_group="rg", name="c1", node_provisioning_mode="Auto")
    rbac.use_azure_rbac(cluster, with_cluster_role=True)
    user = rbac.User(APP_PRINCIPAL_ID)
    nodepools = rbac.Attributes(user=user, verb="get", resource_request=True, api_group="karpenter.sh",
                                resource="nodepools", name="gpu")
    assert rbac.authorize(cluster, nodepools).allowed
    lease = rbac.Attributes(user=user, verb="update", resource_request=True, api_group="coordination.k8s.io",
                            resource="leases", name="x", namespace=NS)
    assert rbac.authorize(cluster, lease).allowed  # by the namespace-scoped Azure role, not by a Role

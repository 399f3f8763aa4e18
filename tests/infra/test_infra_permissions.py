"""The deployment grants exactly the permissions the code declares, on the scopes where it uses them.

The code declares each ARM action and Kubernetes verb on the adapter method that needs it
(shared.adapters.permissions.requires_arm / requires_kube / requires_kube_kinds), cluster-wide, in the app's
own namespace or in a fixed namespace (the node Events in ``default``); the custom Azure role, the ClusterRole,
the namespaced Roles and the two Azure RBAC for Kubernetes roles are compared with those declarations,
collected at test time.
"""

from __future__ import annotations

import fnmatch
import importlib
from types import ModuleType
from typing import Any

import pytest
from infra_facts import INFRA, FactError, bicep, load_yaml_documents, resource, resource_body, variable

from shared.adapters.permissions import (
    APP_NAMESPACE,
    CLUSTER,
    collect_arm_actions,
    collect_kube_rules,
    in_namespace,
    kube_scopes,
    namespace_of,
)

CLUSTER_ROLE = INFRA / "kubernetes" / "clusterrole.yaml"
CLUSTER_ROLE_BINDING = INFRA / "kubernetes" / "clusterrolebinding.yaml"
NAMESPACE = INFRA / "kubernetes" / "namespace.yaml"
ROLE = INFRA / "kubernetes" / "role.yaml"
ROLE_BINDING = INFRA / "kubernetes" / "rolebinding.yaml"
AKS_DATA_ACTION_PREFIX = "Microsoft.ContainerService/managedClusters/"

# API groups served by Kubernetes itself; anything else is a custom resource (Karpenter's kinds),
# which Azure RBAC for Kubernetes cannot grant by name (only with managedClusters/*/read).
BUILT_IN_GROUPS = {"", "apps", "batch", "policy", "autoscaling"}


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise FactError(f"{name} cannot be imported ({exc}); the permissions it declares cannot be checked") from None


def code_arm_actions() -> set[str]:
    return collect_arm_actions(_import("shared.adapters.aks"), _import("shared.adapters.compute"))


def code_kube_rules(scope: str | None = None) -> set[tuple[str, str, str]]:
    return collect_kube_rules(_import("shared.adapters.kube.client"), scope=scope)


def code_fixed_namespaces() -> set[str]:
    """The fixed namespaces (not the app's own) some Kubernetes call of the code is granted in."""
    return {ns for scope in kube_scopes(_import("shared.adapters.kube.client")) if (ns := namespace_of(scope))}


# Built-in requests that Azure RBAC for Kubernetes could grant only with a data action wider than the
# request, so the Azure role leaves them to the ClusterRole (applied on Azure RBAC clusters too). The
# eviction is checked as pods/write (kubeguard/guard checkaccessreqhelper.go drops the sub-resource), and
# pods/write would also let the app create, update and patch any pod in any namespace.
LEFT_TO_THE_CLUSTER_ROLE = {("", "pods/eviction", "create")}


def is_built_in(group: str) -> bool:
    return group in BUILT_IN_GROUPS or group.endswith(".k8s.io")


def granted_by_azure_rbac(group: str, resource: str, verb: str) -> bool:
    """Whether the Azure RBAC for Kubernetes roles hold the data action of this request (else the ClusterRole
    grants it alone): built-in kinds only, and none whose data action would be wider than the request."""
    return is_built_in(group) and (group, resource, verb) not in LEFT_TO_THE_CLUSTER_ROLE


def azure_data_action(group: str, resource: str, verb: str) -> str:
    """The Azure RBAC for Kubernetes data action checked for a Kubernetes request.

    As the AKS authorization webhook (kubeguard/guard, checkaccessreqhelper.go) builds it: the API
    group (none for core), the resource without its sub-resource (except pods/exec), and the verb
    folded to read / write / delete.
    """
    base, _, sub = resource.partition("/")
    if base == "pods" and sub == "exec":
        tail = "pods/exec/action"
    else:
        folded = {"get": "read", "list": "read", "watch": "read", "create": "write", "update": "write",
                  "patch": "write", "delete": "delete", "deletecollection": "delete"}[verb]
        tail = f"{base}/{folded}"
    return AKS_DATA_ACTION_PREFIX + (f"{group}/" if group else "") + tail


def cluster_role() -> dict[str, Any]:
    if not CLUSTER_ROLE.exists():
        raise FactError("infra/kubernetes/clusterrole.yaml does not exist")
    roles = [d for d in load_yaml_documents(CLUSTER_ROLE) if d.get("kind") == "ClusterRole"]
    assert len(roles) == 1, "clusterrole.yaml must hold exactly one ClusterRole"
    return roles[0]


def the_one(path: Any, kind: str) -> dict[str, Any]:
    if not path.exists():
        raise FactError(f"infra/kubernetes/{path.name} does not exist")
    docs = [d for d in load_yaml_documents(path) if d.get("kind") == kind]
    assert len(docs) == 1, f"{path.name} must hold exactly one {kind}"
    return docs[0]


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, res, verb))
    return out


def in_namespace_docs(path: Any, kind: str, namespace: str) -> list[dict[str, Any]]:
    if not path.exists():
        raise FactError(f"infra/kubernetes/{path.name} does not exist")
    return [d for d in load_yaml_documents(path)
            if d.get("kind") == kind and (d.get("metadata") or {}).get("namespace") == namespace]


def the_one_in(path: Any, kind: str, namespace: str) -> dict[str, Any]:
    docs = in_namespace_docs(path, kind, namespace)
    assert len(docs) == 1, f"{path.name} must hold exactly one {kind} in namespace {namespace!r}"
    return docs[0]


def app_role() -> dict[str, Any]:
    from shared.settings import DEFAULT_STEWARD_NAMESPACE

    return the_one_in(ROLE, "Role", DEFAULT_STEWARD_NAMESPACE)


def namespaced_role_rules() -> set[tuple[str, str, str]]:
    return rules_of(app_role())


def cluster_role_rules() -> set[tuple[str, str, str]]:
    out = set()
    for rule in cluster_role()["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, res, verb))
    return out


# --- Azure: the custom role ------------------------------------------------------------------


def test_the_custom_role_holds_exactly_the_arm_actions_the_code_declares() -> None:
    declared = code_arm_actions()
    assert declared, "the ARM adapters declare no ARM action (expected @requires_arm on the adapters)"
    granted = set(variable(bicep("app/steward-role.bicep"), "actions"))
    assert granted == declared, (f"granted but never called: {sorted(granted - declared)}; "
                                 f"called but not granted: {sorted(declared - granted)}")


def test_the_custom_role_grants_no_wildcard_no_data_action_and_no_exclusion() -> None:
    doc = bicep("app/steward-role.bicep")
    role = resource_body(resource(doc, "role"))
    [permissions] = role["properties"]["permissions"]
    assert permissions["actions"] == "actions"
    assert permissions["notActions"] == [] and permissions["dataActions"] == [] and permissions["notDataActions"] == []
    assert not [a for a in variable(doc, "actions") if "*" in a]
    assert role["properties"]["type"] == "CustomRole"
    assert role["properties"]["assignableScopes"] == "assignableScopes"


def test_the_roles_are_assignable_in_every_fleet_subscription() -> None:
    doc = bicep("main.bicep")
    scopes = variable(doc, "assignableScopes")
    assert scopes["loop_type"]["detail"]["array_name"] == "fleetSubscriptions"
    for name in ("stewardRole", "kubernetesRole"):
        assert doc["modules"][name]["config"]["params"]["assignableScopes"] == "assignableScopes"


def _loop_module(name: str) -> dict[str, Any]:
    module = bicep("main.bicep")["modules"][name]
    assert "loop_type" in module["config"], f"module {name} is not a loop over a parameter list"
    return module


def _scope_resource_group_argument(module: dict[str, Any]) -> Any:
    return module["config"]["config"]["scope"]["function"]["parameters"]["resource_group_name"]


def test_the_role_is_granted_on_each_listed_cluster() -> None:
    module = _loop_module("clusterAccess")
    assert module["detail"]["path"] == "./app/cluster-access.bicep"
    assert module["config"]["loop_type"]["detail"]["array_name"] == "accessClusters"
    access = bicep("app/cluster-access.bicep")
    grant = resource_body(resource(access, "stewardOnCluster"))
    assert grant["scope"] == "cluster"
    assert resource(access, "cluster")["existing"] is True


def test_the_role_is_granted_on_each_clusters_node_resource_group_for_the_vm_actions() -> None:
    compute_actions = {a for a in code_arm_actions() if a.startswith("Microsoft.Compute/")}
    assert compute_actions, "the code declares no compute action; the node resource group grant would be unneeded"
    module = _loop_module("nodeResourceGroupAccess")
    assert module["config"]["loop_type"]["detail"]["array_name"] == "accessClusters"
    assert _scope_resource_group_argument(module) == {
        "operator": {"type": "property_accessor", "operands": {"operand_1": "cluster", "operand_2": "nodeResourceGroup"}}}


def test_the_role_can_be_granted_on_whole_resource_groups() -> None:
    module = _loop_module("resourceGroupAccess")
    assert module["config"]["loop_type"]["detail"]["array_name"] == "accessResourceGroupIds"
    grant = resource_body(resource(bicep("app/resource-group-access.bicep"), "stewardOnGroup"))
    assert "scope" not in grant  # the module's own scope: the resource group


def test_every_grant_is_to_the_apps_identity() -> None:
    for name in ("clusterAccess", "nodeResourceGroupAccess", "resourceGroupAccess"):
        params = bicep("main.bicep")["modules"][name]["config"]["config"]["params"]
        assert params["principalId"]["operator"]["operands"]["operand_1"] == "identity", name


# --- Kubernetes: the ClusterRole and the Azure RBAC for Kubernetes role -----------------------


def test_the_cluster_role_grants_exactly_the_kubernetes_calls_the_code_declares() -> None:
    declared = code_kube_rules(CLUSTER)
    assert declared, "shared.adapters.kube.client declares no Kubernetes call (expected @requires_kube on the adapter)"
    granted = cluster_role_rules()
    assert granted == declared, (f"granted but never called: {sorted(granted - declared)}; "
                                 f"called but not granted: {sorted(declared - granted)}")


def test_the_cluster_role_never_grants_wildcards_secrets_or_pod_deletion() -> None:
    rules = cluster_role_rules()
    assert not [r for r in rules if "*" in r]
    assert not [r for r in rules if r[1] == "secrets"]
    assert ("", "pods", "delete") not in rules


def test_the_binding_gives_the_cluster_role_to_the_apps_identity() -> None:
    [binding] = [d for d in load_yaml_documents(CLUSTER_ROLE_BINDING) if d.get("kind") == "ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": cluster_role()["metadata"]["name"]}
    [subject] = binding["subjects"]
    assert subject["kind"] in ("User", "Group")
    assert subject["name"] == "${STEWARD_PRINCIPAL_ID}"
    assert "STEWARD_PRINCIPAL_ID" in bicep("main.bicep")["outputs"], "main.bicep must output the identity's object id"


@pytest.mark.parametrize(("scope", "name"), [(CLUSTER, "dataActions"), (APP_NAMESPACE, "namespaceDataActions")],
                         ids=["cluster-wide", "own-namespace"])
def test_the_azure_rbac_kubernetes_roles_map_to_the_same_calls(scope: str, name: str) -> None:
    rules = code_kube_rules(scope)
    expected = {azure_data_action(g, r, v) for g, r, v in rules if granted_by_azure_rbac(g, r, v)}
    granted = set(variable(bicep("app/kubernetes-role.bicep"), name))
    assert granted == expected, (f"granted but never called: {sorted(granted - expected)}; "
                                 f"called but not granted: {sorted(expected - granted)}")


def test_custom_resources_and_evictions_are_left_to_the_cluster_role() -> None:
    left = {(g, r, v) for g, r, v in cluster_role_rules() if not granted_by_azure_rbac(g, r, v)}
    assert left >= LEFT_TO_THE_CLUSTER_ROLE, "what the Azure role leaves to the ClusterRole, the ClusterRole grants"
    granted = variable(bicep("app/kubernetes-role.bicep"), "dataActions")
    assert not [a for a in granted if "*" in a], "a wildcard data action would also cover secrets"
    for group, _, _ in left:
        if not is_built_in(group):
            assert not [a for a in granted if a.startswith(f"{AKS_DATA_ACTION_PREFIX}{group}/")]
    script = (INFRA.parent / "scripts" / "apply-kube-rbac.sh").read_text(encoding="utf-8")
    assert "clusterrole.yaml" in script and "clusterrolebinding.yaml" in script
    deploy = (INFRA.parent / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "every cluster, Azure RBAC ones included" in deploy, "docs/deploy.md must say the ClusterRole goes on every cluster"


@pytest.mark.parametrize("scope", ["dataActions", "namespaceDataActions"], ids=["cluster-wide", "own-namespace"])
def test_no_azure_rbac_data_action_lets_the_app_write_pods(scope: str) -> None:
    """pods/write (the data action AKS checks for a pod create, update, patch and for an eviction) would let
    the app start a privileged pod anywhere; nothing the Azure roles hold may cover it."""
    granted = variable(bicep("app/kubernetes-role.bicep"), scope)
    for write in (azure_data_action("", "pods", "create"), azure_data_action("", "pods/eviction", "create"),
                  azure_data_action("", "pods", "patch")):
        assert not [a for a in granted if fnmatch.fnmatchcase(write.lower(), a.lower())], write


def test_the_kubernetes_role_holds_data_actions_only_and_is_assigned_with_the_cluster_grant() -> None:
    role = resource_body(resource(bicep("app/kubernetes-role.bicep"), "role"))
    [permissions] = role["properties"]["permissions"]
    assert permissions["actions"] == [] and permissions["dataActions"] == "dataActions"
    access = bicep("app/cluster-access.bicep")
    assignment = resource(access, "kubernetesOnCluster")
    assert resource_body(assignment)["scope"] == "cluster"
    assert assignment["config"].get("condition"), "the Kubernetes role must be skippable (clusters without Azure RBAC)"
    on_namespace = resource(access, "kubernetesOnNamespace")
    assert resource_body(on_namespace)["scope"] == "namespace"
    assert on_namespace["config"].get("condition")
    namespace = resource(access, "namespace")
    assert namespace["existing"] is True
    namespace_role = resource_body(resource(bicep("app/kubernetes-role.bicep"), "namespaceRole"))
    [permissions] = namespace_role["properties"]["permissions"]
    assert permissions["actions"] == [] and permissions["dataActions"] == "namespaceDataActions"


@pytest.mark.parametrize(
    ("rule", "action"),
    [
        (("", "nodes", "get"), "nodes/read"),
        (("", "nodes", "patch"), "nodes/write"),
        (("", "pods/eviction", "create"), "pods/write"),
        (("", "pods/exec", "create"), "pods/exec/action"),
        (("coordination.k8s.io", "leases", "update"), "coordination.k8s.io/leases/write"),
        (("policy", "poddisruptionbudgets", "list"), "policy/poddisruptionbudgets/read"),
        (("batch", "jobs", "delete"), "batch/jobs/delete"),
    ],
    ids=["get is read", "patch is write", "an eviction is a pod write", "exec is its own action",
         "leases keep their group", "PDB list is read", "delete stays delete"],
)
def test_kubernetes_requests_map_to_azure_data_actions_as_aks_checks_them(
        rule: tuple[str, str, str], action: str) -> None:
    assert azure_data_action(*rule) == AKS_DATA_ACTION_PREFIX + action


def test_the_manifests_are_where_the_docs_and_script_say() -> None:
    assert CLUSTER_ROLE.is_file() and CLUSTER_ROLE_BINDING.is_file()
    for doc in (INFRA.parent / "docs" / "deploy.md", INFRA.parent / "scripts" / "apply-kube-rbac.sh"):
        assert "infra/kubernetes" in doc.read_text(encoding="utf-8"), f"{doc.name} does not point at the manifests"


# --- Kubernetes: the app's namespace and its Role -----------------------------------------------


def test_the_namespaced_role_grants_exactly_the_calls_the_code_makes_in_its_namespace() -> None:
    declared = code_kube_rules(APP_NAMESPACE)
    assert declared, "shared.adapters.kube.client declares no call in the app's namespace (leases, events, Jobs)"
    granted = namespaced_role_rules()
    assert granted == declared, (f"granted but never called: {sorted(granted - declared)}; "
                                 f"called but not granted: {sorted(declared - granted)}")


def test_leases_events_and_jobs_are_granted_only_in_the_apps_namespace() -> None:
    from shared.settings import DEFAULT_STEWARD_NAMESPACE

    namespace = the_one(NAMESPACE, "Namespace")
    assert namespace["metadata"]["name"] == DEFAULT_STEWARD_NAMESPACE
    assert app_role()["metadata"]["name"] == DEFAULT_STEWARD_NAMESPACE
    cluster_wide = {(g, r) for g, r, _ in cluster_role_rules()}
    assert not cluster_wide & {("batch", "jobs"), ("coordination.k8s.io", "leases"), ("", "events")}
    assert not {(g, r) for g, r, _ in namespaced_role_rules()} & {("", "events")}, "node Events live in `default`"
    assert variable(bicep("main.bicep"), "stewardSettings")["STEWARD_NAMESPACE"] == DEFAULT_STEWARD_NAMESPACE
    assert bicep("app/cluster-access.bicep")["parameters"]["stewardNamespace"]["default"] == DEFAULT_STEWARD_NAMESPACE


def test_the_apps_namespace_enforces_the_restricted_pod_security_standard() -> None:
    labels = the_one(NAMESPACE, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_cluster_wide_the_app_may_touch_pods_only_to_list_and_evict_them() -> None:
    pods = {(r, v) for g, r, v in cluster_role_rules() if g == "" and r.startswith("pods")}
    assert pods == {("pods", "list"), ("pods/eviction", "create")}
    nodes = {v for g, r, v in cluster_role_rules() if (g, r) == ("", "nodes")}
    assert nodes == {"get", "list", "patch"}


def _assert_bound_to_the_apps_identity(role: dict[str, Any]) -> None:
    namespace = role["metadata"]["namespace"]
    binding = the_one_in(ROLE_BINDING, "RoleBinding", namespace)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    [subject] = binding["subjects"]
    assert (subject["kind"], subject["name"]) == ("User", "${STEWARD_PRINCIPAL_ID}")


def test_the_role_binding_gives_the_role_to_the_apps_identity() -> None:
    _assert_bound_to_the_apps_identity(app_role())


# --- Kubernetes: Roles in fixed namespaces (the node Events in `default`) ----------------------------


def test_each_fixed_namespace_role_grants_exactly_the_calls_the_code_makes_there_to_the_apps_identity() -> None:
    namespaces = code_fixed_namespaces()
    assert namespaces, "the code declares no call in a fixed namespace (expected the node Events in `default`)"
    for namespace in namespaces:
        role = the_one_in(ROLE, "Role", namespace)
        declared, granted = code_kube_rules(in_namespace(namespace)), rules_of(role)
        assert granted == declared, (f"{namespace}: granted but never called: {sorted(granted - declared)}; "
                                     f"called but not granted: {sorted(declared - granted)}")
        _assert_bound_to_the_apps_identity(role)


def test_the_manifests_hold_roles_only_where_the_code_calls() -> None:
    from shared.settings import DEFAULT_STEWARD_NAMESPACE

    wanted = {DEFAULT_STEWARD_NAMESPACE} | code_fixed_namespaces()
    for path, kind in ((ROLE, "Role"), (ROLE_BINDING, "RoleBinding")):
        docs = [d for d in load_yaml_documents(path) if d.get("kind") == kind]
        where = sorted(str(d["metadata"].get("namespace")) for d in docs)
        assert where == sorted(wanted), f"{path.name}: {kind}s in {where}, the code calls in {sorted(wanted)}"


def test_node_events_are_created_in_default_only_and_nothing_else_is_granted_there() -> None:
    """An Event without eventTime about a Node must live in "" or `default` (kubernetes/kubernetes
    pkg/apis/core/validation/events.go legacyValidateEvent): the app creates them there, and may do nothing
    else there."""
    from shared.adapters.kube.client import NODE_EVENTS_NAMESPACE

    assert NODE_EVENTS_NAMESPACE == "default"
    scope = in_namespace(NODE_EVENTS_NAMESPACE)
    assert code_kube_rules(scope) == {("", "events", "create")}
    assert ("", "events", "create") not in code_kube_rules(CLUSTER) | code_kube_rules(APP_NAMESPACE)
    assert rules_of(the_one_in(ROLE, "Role", NODE_EVENTS_NAMESPACE)) == {("", "events", "create")}
    # Azure RBAC data actions are not namespaced in a role definition: neither Azure role holds events/write
    # (it would grant events in every namespace, or in the app's where none is made); the Kubernetes Role,
    # applied on every cluster (scripts/apply-kube-rbac.sh), grants it
    doc = bicep("app/kubernetes-role.bicep")
    held = set(variable(doc, "dataActions")) | set(variable(doc, "namespaceDataActions"))
    assert azure_data_action("", "events", "create") not in held
    script = (INFRA.parent / "scripts" / "apply-kube-rbac.sh").read_text(encoding="utf-8")
    assert "role.yaml" in script and "rolebinding.yaml" in script


def test_generic_object_methods_declare_per_kind_from_the_table_they_consult() -> None:
    kube, kinds = _import("shared.adapters.kube.client"), _import("shared.adapters.kube.objects")
    for method, table, verbs in ((kube.KubeClient.create_object, kinds.CREATE_KINDS, {"create"}),
                                 (kube.KubeClient.apply_object, kinds.APPLY_KINDS, {"get", "create", "update"}),
                                 (kube.KubeClient.get_object, kinds.READ_KINDS, {"get"}),
                                 (kube.KubeClient.delete_object, kinds.DELETE_KINDS, {"delete"})):
        declared = {(g, r, v) for g, r, vs, _ in method.__kube_rules__ for v in vs}
        assert declared == {(g, plural, v) for (g, _k), (plural, _n) in table.items() for v in verbs}, method.__name__
        assert method.__kube_kinds__ == frozenset(table), method.__name__

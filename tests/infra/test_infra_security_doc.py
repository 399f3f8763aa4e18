"""docs/security.md lists exactly the grants the code declares and the deployment makes.

The grant tables of docs/security.md (each after a ``<!-- grants:NAME -->`` marker) are parsed and
compared, row by row, with the declarations on the adapter methods (shared.adapters.permissions collectors,
the same ones tests/infra/test_infra_permissions.py checks the deployment against), with
infra/kubernetes/*.yaml and with the roles defined in infra/**.bicep. A grant or a call added on
one side only, or a call named for the wrong grant, fails here: the document cannot drift.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from infra_facts import INFRA, REPO, bicep, variable
from test_infra_permissions import (
    _import,
    azure_data_action,
    cluster_role_rules,
    code_arm_actions,
    code_kube_rules,
    granted_by_azure_rbac,
    namespaced_role_rules,
    rules_of,
    the_one_in,
)

from shared.adapters.permissions import APP_NAMESPACE, CLUSTER, LINKED_POOL_ACTIONS, in_namespace, linked_actions

DOC = REPO / "docs" / "security.md"
_CODE = re.compile(r"`([^`]*)`")
_ROLE_VAR = re.compile(r"^var (\w+) = '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})'", re.MULTILINE)

Row = dict[str, str]


def table(name: str) -> list[Row]:
    """The rows of the markdown table right after ``<!-- grants:name -->``, keyed by header."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    marker = f"<!-- grants:{name} -->"
    assert lines.count(marker) == 1, f"docs/security.md must hold the marker {marker} exactly once"
    rows = []
    for line in lines[lines.index(marker) + 1:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert len(rows) >= 3 and set(rows[1]) <= {"---"}, f"no table after {marker}"
    header = rows[0]
    return [dict(zip(header, row, strict=True)) for row in rows[2:]]


def code(cell: str) -> list[str]:
    """The backticked items of a cell; `""` is the core API group."""
    return ["" if item == '""' else item for item in _CODE.findall(cell)]


def one(cell: str) -> str:
    items = code(cell)
    assert len(items) == 1, f"expected one `item` in {cell!r}"
    return items[0]


def _methods(*modules: ModuleType) -> Iterator[tuple[str, object]]:
    """(module.Class.method, function) for every method of every class defined in ``modules``."""
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                for name, member in inspect.getmembers(cls, callable):
                    yield f"{module.__name__}.{cls.__name__}.{name}", member


def kube_calls(scope: str) -> dict[tuple[str, str, str], set[str]]:
    """(group, resource, verb) granted in ``scope`` -> the methods declaring it."""
    out: dict[tuple[str, str, str], set[str]] = {}
    for name, fn in _methods(_import("shared.adapters.kube.client")):
        for group, resource, verbs, where in getattr(fn, "__kube_rules__", ()):
            if where == scope:
                for verb in verbs:
                    out.setdefault((group, resource, verb), set()).add(name)
    return out


def arm_calls() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, fn in _methods(_import("shared.adapters.aks"), _import("shared.adapters.compute")):
        for action in getattr(fn, "__arm_actions__", ()):
            out.setdefault(action, set()).add(name)
    return out


def _same(documented: object, expected: object, what: str) -> None:
    assert documented == expected, f"docs/security.md {what}: documented {documented!r}, expected {expected!r}"


# --- Kubernetes -----------------------------------------------------------------------------


def node_events_role_rules() -> set[tuple[str, str, str]]:
    return rules_of(the_one_in(INFRA / "kubernetes" / "role.yaml", "Role", "default"))


@pytest.mark.parametrize(("name", "scope", "manifest"),
                         [("kube-cluster", CLUSTER, cluster_role_rules),
                          ("kube-namespace", APP_NAMESPACE, namespaced_role_rules),
                          ("kube-node-events", in_namespace("default"), node_events_role_rules)],
                         ids=["cluster-role", "namespaced-role", "node-events-role"])
def test_the_kubernetes_tables_are_the_declared_calls_and_the_manifests(
        name: str, scope: str, manifest: Callable[[], set[tuple[str, str, str]]]) -> None:
    rows = table(name)
    documented = {(one(r["API group"]), one(r["resource"]), one(r["verb"])): set(code(r["call that needs it"]))
                  for r in rows}
    assert len(documented) == len(rows), f"a rule is listed twice in grants:{name}"
    declared = kube_calls(scope)
    _same(set(documented), set(declared), f"grants:{name} rules vs the code's declarations")
    _same(set(documented), manifest(), f"grants:{name} rules vs infra/kubernetes")
    _same(set(documented), code_kube_rules(scope), f"grants:{name} rules vs shared.adapters.permissions.collect_kube_rules")
    for rule, calls in documented.items():
        _same(calls, declared[rule], f"grants:{name} calls for {rule}")


@pytest.mark.parametrize(("name", "scope", "variable_name"),
                         [("aks-data-cluster", CLUSTER, "dataActions"),
                          ("aks-data-namespace", APP_NAMESPACE, "namespaceDataActions")],
                         ids=["cluster-wide", "own-namespace"])
def test_the_azure_rbac_for_kubernetes_tables_are_the_roles_data_actions_and_their_calls(
        name: str, scope: str, variable_name: str) -> None:
    expected: dict[str, tuple[set[str], set[str]]] = {}
    for (group, resource, verb), calls in kube_calls(scope).items():
        if granted_by_azure_rbac(group, resource, verb):
            requests, names = expected.setdefault(azure_data_action(group, resource, verb), (set(), set()))
            requests.add(f"{group + '/' if group else ''}{resource} {verb}")
            names |= calls
    rows = table(name)
    documented = {one(r["data action"]): (set(code(r["Kubernetes requests it covers"])), set(code(r["call that needs it"])))
                  for r in rows}
    assert len(documented) == len(rows), f"a data action is listed twice in grants:{name}"
    _same(set(documented), set(variable(bicep("app/kubernetes-role.bicep"), variable_name)),
          f"grants:{name} vs infra/app/kubernetes-role.bicep {variable_name}")
    _same(documented, expected, f"grants:{name} (requests, calls) per data action")


# --- Azure Resource Manager -----------------------------------------------------------------


def test_the_arm_table_is_the_custom_roles_actions_with_the_methods_declaring_them() -> None:
    rows = table("arm")
    documented = {one(r["action"]): set(code(r["call that needs it"])) for r in rows}
    assert len(documented) == len(rows), "an action is listed twice in grants:arm"
    _same(set(documented), set(variable(bicep("app/steward-role.bicep"), "actions")),
          "grants:arm vs infra/app/steward-role.bicep actions")
    _same(set(documented), code_arm_actions(), "grants:arm vs shared.adapters.permissions.collect_arm_actions")
    _same(documented, arm_calls(), "grants:arm calls per action")
    for r in rows:  # VM actions are granted on the node resource group, everything else on the cluster
        where = "node resource group" if one(r["action"]).startswith("Microsoft.Compute/") else "each cluster"
        assert where in r["assigned on"], f"{one(r['action'])} is assigned on {where!r}, not {r['assigned on']!r}"


def test_the_linked_table_is_the_linked_roles_actions_and_the_properties_that_need_them() -> None:
    rows = table("arm-linked")
    documented = {one(r["action"]): set(code(r["agent-pool property naming the linked resource"])) for r in rows}
    expected: dict[str, set[str]] = {}
    for prop, action in LINKED_POOL_ACTIONS.items():
        expected.setdefault(action, set()).add(prop)
    _same(documented, expected, "grants:arm-linked vs shared.adapters.permissions.LINKED_POOL_ACTIONS")
    _same(set(documented), set(variable(bicep("app/steward-role.bicep"), "linkedActions")),
          "grants:arm-linked vs infra/app/steward-role.bicep linkedActions")
    _same(set(documented), linked_actions(), "grants:arm-linked vs shared.adapters.permissions.linked_actions")
    put = "Microsoft.ContainerService/managedClusters/agentPools/write"
    for r in rows:  # the linked check is made by ARM on the pool write: the call is the one that PUTs pools
        _same(set(code(r["call that needs it"])), arm_calls()[put], f"the call needing {one(r['action'])}")


# --- Built-in data roles (storage, Event Grid, monitoring) ------------------------------------


def _role_variable(role: str) -> str:
    """'Storage Blob Data Owner' -> 'storageBlobDataOwner', the bicep variable naming its id."""
    words = role.split()
    return words[0][:1].lower() + words[0][1:] + "".join(words[1:])


def test_the_data_roles_table_names_every_built_in_role_the_deployment_assigns_with_its_id() -> None:
    defined: set[tuple[str, str, str]] = set()
    for path in sorted(INFRA.rglob("*.bicep")):
        text = path.read_text(encoding="utf-8")
        for var, guid in _ROLE_VAR.findall(text):
            assert text.count(var) > 1, f"{path.name} defines the role {var} but never assigns it"
            defined.add((path.relative_to(REPO).as_posix(), var, guid))
    assert defined, "no built-in role id found in infra/**.bicep (expected `var <role> = '<guid>'`)"
    rows = table("data-roles")
    documented = {(one(r["defined in"]), _role_variable(r["role"]), one(r["role id"])) for r in rows}
    _same(documented, defined, "grants:data-roles (file, role, id) vs the role ids infra/**.bicep assigns")
    assert all(r["principal"] and r["scope"] and r["what needs it"] for r in rows), "every row says who, where and why"


def test_every_call_named_in_the_grant_tables_exists() -> None:
    adapters = (_import("shared.adapters.aks"), _import("shared.adapters.compute"), _import("shared.adapters.kube.client"))
    names = {name for name, _ in _methods(*adapters)}
    for name in ("kube-cluster", "kube-namespace", "kube-node-events", "aks-data-cluster", "aks-data-namespace", "arm",
                 "arm-linked"):
        for r in table(name):
            for call in code(r["call that needs it"]):
                assert call in names, f"grants:{name} names {call}, which is not an adapter method"


def test_the_readme_links_the_security_document() -> None:
    assert "docs/security.md" in (REPO / "README.md").read_text(encoding="utf-8")
    assert Path(DOC).is_file()

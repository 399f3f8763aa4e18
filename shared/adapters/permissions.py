"""Permissions declared where they are used.

Each adapter method that calls ARM or the Kubernetes API says which Azure action or Kubernetes verb
it needs, right on the method. The infrastructure tests collect these declarations to check that
the custom Azure role and the Kubernetes ClusterRole and Roles grant exactly what the code calls: the list is
derived from the code, never typed twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def requires_arm(*actions: str) -> Callable[[F], F]:
    """Mark a method as calling ARM operations that need these Azure RBAC actions."""

    def mark(fn: F) -> F:
        fn.__arm_actions__ = tuple(actions)  # type: ignore[attr-defined]
        return fn

    return mark


#: Where a Kubernetes rule is granted: cluster-wide (the ClusterRole), only in the app's own namespace
#: (the Role in STEWARD_NAMESPACE, infra/kubernetes/role.yaml), or only in one fixed namespace named by
#: the code (:func:`in_namespace`: a Role of its own there, also in role.yaml).
CLUSTER = "cluster"
APP_NAMESPACE = "namespace"
_FIXED_NAMESPACE = "namespace:"


def in_namespace(namespace: str) -> str:
    """The scope of a rule granted only in ``namespace``, a fixed namespace that is not the app's own
    (for instance ``default``, where Events about Nodes must live: shared.adapters.kube.client)."""
    if not namespace:
        raise ValueError("a fixed namespace scope needs a namespace")
    return _FIXED_NAMESPACE + namespace


def namespace_of(scope: str) -> str | None:
    """The fixed namespace of an :func:`in_namespace` scope; None for :data:`CLUSTER` and :data:`APP_NAMESPACE`."""
    return scope.removeprefix(_FIXED_NAMESPACE) if scope.startswith(_FIXED_NAMESPACE) else None


def requires_kube(group: str, resource: str, *verbs: str, namespaced: bool = False,
                  namespace: str = "") -> Callable[[F], F]:
    """Mark a method as calling the Kubernetes API: ``group`` ("" for core), ``resource``, verbs.

    ``namespaced=True``: the method calls it only in the app's own namespace, so the grant is the
    namespace's Role, not the ClusterRole. ``namespace="x"``: only in the fixed namespace ``x``
    (scope :func:`in_namespace`), granted by a Role there. Stack several decorators when a method
    makes several kinds of calls.
    """
    if namespaced and namespace:
        raise ValueError("requires_kube: namespaced=True (the app's namespace) or namespace=..., not both")
    where = in_namespace(namespace) if namespace else APP_NAMESPACE if namespaced else CLUSTER

    def mark(fn: F) -> F:
        rules = list(getattr(fn, "__kube_rules__", ()))
        rules.append((group, resource, tuple(verbs), where))
        fn.__kube_rules__ = tuple(rules)  # type: ignore[attr-defined]
        return fn

    return mark


def requires_kube_kinds(kinds: Mapping[tuple[str, str], tuple[str, bool]], *verbs: str) -> Callable[[F], F]:
    """Mark a method that handles objects of several kinds: ``kinds`` maps (API group, kind) to
    (plural, namespaced) and is the *only* set of kinds the method touches (it consults the same
    table, :func:`kind_allowed`, and refuses any other kind before calling the server). Each kind is
    declared with ``verbs`` on its own resource: namespaced kinds in the app's namespace, the others
    cluster-wide. So the collected rules are the calls, per kind, never "anything this method could
    be given"."""

    def mark(fn: F) -> F:
        rules = list(getattr(fn, "__kube_rules__", ()))
        for (group, _kind), (plural, namespaced) in kinds.items():
            rules.append((group, plural, tuple(verbs), APP_NAMESPACE if namespaced else CLUSTER))
        fn.__kube_rules__ = tuple(rules)  # type: ignore[attr-defined]
        fn.__kube_kinds__ = frozenset(kinds)  # type: ignore[attr-defined]
        return fn

    return mark


def kind_allowed(fn: Callable[..., Any], group: str, kind: str) -> bool:
    """Whether ``fn`` (marked with :func:`requires_kube_kinds`) declared the kind (group, kind)."""
    return (group, kind) in getattr(fn, "__kube_kinds__", frozenset())


def _functions(modules: Iterable[ModuleType]) -> Iterable[Callable[..., Any]]:
    for module in modules:
        for _, obj in inspect.getmembers(module):
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                for _, member in inspect.getmembers(obj):
                    if callable(member):
                        yield member
            elif inspect.isfunction(obj) and obj.__module__ == module.__name__:
                yield obj


def collect_arm_actions(*modules: ModuleType) -> set[str]:
    """Every Azure action declared in ``modules``."""
    return {a for fn in _functions(modules) for a in getattr(fn, "__arm_actions__", ())}


def collect_kube_rules(*modules: ModuleType, scope: str | None = None) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) declared in ``modules``; with ``scope`` (:data:`CLUSTER`,
    :data:`APP_NAMESPACE` or an :func:`in_namespace` scope) only those granted there."""
    return {(group, resource, verb) for where, group, resource, verb in collect_scoped_kube_rules(*modules)
            if scope is None or where == scope}


def collect_scoped_kube_rules(*modules: ModuleType) -> set[tuple[str, str, str, str]]:
    """Every (scope, group, resource, verb) declared in ``modules``: each rule with where it is granted."""
    return {
        (where, group, resource, verb)
        for fn in _functions(modules)
        for group, resource, verbs, where in getattr(fn, "__kube_rules__", ())
        for verb in verbs
    }


def kube_scopes(*modules: ModuleType) -> set[str]:
    """Every scope some rule of ``modules`` is granted in."""
    return {where for where, *_ in collect_scoped_kube_rules(*modules)}


# --------------------------------------------------------------------------- linked resources
# An agent-pool write that names another resource makes ARM check an action on *that* resource too
# (a "linked access check"): without it the PUT is refused with 403 LinkedAuthorizationFailed, "...
# however, it does not have permission to perform action(s) '<action>' on the linked scope(s) '<id>'".
# The actions are those AKS lists for the identity creating and operating a cluster
# (https://learn.microsoft.com/azure/aks/aks-service-permissions) for the pool properties the
# migration clones (shared/fleet/pool_clone.py). They are granted by a separate role, assigned only on the
# resource groups holding such resources (infra/app/steward-role.bicep ``linkedActions``, parameter
# ``linkedResourceGroupIds`` of infra/main.bicep): pools without custom networking need none of them.

LINKED_POOL_ACTIONS: dict[str, str] = {
    "vnetSubnetID": "Microsoft.Network/virtualNetworks/subnets/join/action",
    "podSubnetID": "Microsoft.Network/virtualNetworks/subnets/join/action",
    "nodePublicIPPrefixID": "Microsoft.Network/publicIPPrefixes/join/action",
    "proximityPlacementGroupID": "Microsoft.Compute/proximityPlacementGroups/write",
}
"""Agent-pool property naming a linked resource -> the action ARM checks on that resource."""


def linked_actions() -> set[str]:
    """Every action an agent-pool write may need on linked resources."""
    return set(LINKED_POOL_ACTIONS.values())


def linked_actions_for(properties: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """``(property, linked resource id, action)`` for each linked resource an agent-pool body names."""
    out: list[tuple[str, str, str]] = []
    for prop, action in LINKED_POOL_ACTIONS.items():
        value = properties.get(prop)
        if isinstance(value, str) and value.strip():
            out.append((prop, value, action))
    return out

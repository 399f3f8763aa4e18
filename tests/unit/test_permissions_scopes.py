"""Where a declared Kubernetes rule is granted: cluster-wide, the app's namespace, or a fixed namespace."""

from __future__ import annotations

from typing import Any

import pytest

from shared.adapters.permissions import APP_NAMESPACE, CLUSTER, in_namespace, namespace_of, requires_kube


def test_a_rule_declared_in_a_fixed_namespace_has_that_namespaces_scope() -> None:
    @requires_kube("", "events", "create", namespace="default")
    @requires_kube("coordination.k8s.io", "leases", "get", namespaced=True)
    @requires_kube("", "nodes", "get")
    def call() -> Any: ...

    scopes = [where for *_, where in call.__kube_rules__]  # type: ignore[attr-defined]
    assert scopes == [CLUSTER, APP_NAMESPACE, in_namespace("default")]
    assert [namespace_of(s) for s in scopes] == [None, None, "default"]


def test_the_apps_namespace_and_a_fixed_one_cannot_both_be_declared() -> None:
    with pytest.raises(ValueError):
        requires_kube("", "events", "create", namespaced=True, namespace="default")
    with pytest.raises(ValueError):
        in_namespace("")


def test_the_node_events_are_declared_in_default() -> None:
    from shared.adapters.kube import client
    from shared.adapters.permissions import collect_kube_rules, collect_scoped_kube_rules

    assert client.NODE_EVENTS_NAMESPACE == "default"
    assert collect_kube_rules(client, scope=in_namespace("default")) == {("", "events", "create")}
    assert {r for r in collect_scoped_kube_rules(client) if r[2] == "events"} == {
        (in_namespace("default"), "", "events", "create")}

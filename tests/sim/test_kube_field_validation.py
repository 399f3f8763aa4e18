"""Server-side field validation and the OpenAPI v3 discovery kubectl reads (sim/kube/openapi.py), as
kube-apiserver v1.37.2 answers them (checked in tests/realkube, stories field_validation and
kubectl_as_a_user). Issue 20's first finding: ``kubectl create`` of a Node with only a name, which any
real API server accepts, failed here ("failed to download openapi", then a KeyError on the node's
addresses once a DaemonSet wanted a pod on it)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.kube.openapi import duplicate_fields, model_name, unknown_fields
from sim.testing import SimHandle, start_sim
from tests.realkube.servers import Server


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario="drain") as handle:  # its DaemonSet wants a pod on every new node
        yield handle


@pytest.fixture(scope="module")
def server(sim: SimHandle) -> Server:
    import ssl

    ctx = ssl.create_default_context(cafile=sim.ca_bundle)
    name = sim.endpoints["clusters"][0]["name"]
    return Server("simulator", sim.cluster(name)["kube_server"], ctx, ctx,
                  {"Authorization": f"Bearer {sim.endpoints['kube_token']}"}, "")


def kubectl(sim: SimHandle, *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    name = sim.endpoints["clusters"][0]["name"]
    return subprocess.run(["kubectl", "--kubeconfig", sim.kubeconfig(name), *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_kubectl_creates_a_node_with_only_a_name_with_its_default_validation(sim: SimHandle) -> None:
    out = kubectl(sim, "create", "-f", "-", stdin="apiVersion: v1\nkind: Node\nmetadata:\n  name: bare\n")
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "node/bare created", "")


def test_kubectl_refuses_a_field_the_kind_does_not_have_with_the_servers_message(sim: SimHandle) -> None:
    out = kubectl(sim, "create", "-f", "-",
                  stdin="apiVersion: v1\nkind: Node\nmetadata:\n  name: typo\nspec:\n  unschedulabel: true\n")
    assert out.returncode == 1
    assert out.stderr.strip() == ('Error from server (BadRequest): error when creating "STDIN": Node in version "v1" '
                                  'cannot be handled as a Node: strict decoding error: unknown field "spec.unschedulabel"')


def test_unknown_fields_are_named_by_their_path_as_the_strict_decoder_names_them() -> None:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x", "bogus": 1},
                           "spec": {"foo": 1, "taints": [{"key": "a", "effect": "NoSchedule", "zz": 2}]}}
    assert unknown_fields("", "v1", "Node", obj) == ['unknown field "metadata.bogus"', 'unknown field "spec.foo"',
                                                     'unknown field "spec.taints[0].zz"']
    assert duplicate_fields('{"spec":{"unschedulable":true,"unschedulable":false}}') == [
        'duplicate field "spec.unschedulable"']
    assert (model_name("", "v1", "Event"), model_name("events.k8s.io", "v1", "Event")) == ("CoreV1Event", "EventsV1Event")
    assert unknown_fields("karpenter.sh", "v1", "NodePool", {"spec": {"anything": 1}}) == []  # no model: not checked


def test_strict_warn_ignore_and_an_unknown_directive(server: Server) -> None:
    def node(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"foo": 1}}

    code, body = server.call("POST", "/api/v1/nodes?fieldValidation=Strict", node("fv-strict"))
    assert (code, body["reason"]) == (400, "BadRequest")
    code, _ = server.call("POST", "/api/v1/nodes", node("fv-warn"))
    assert code == 201 and server.warnings == ['299 - "unknown field \\"spec.foo\\""']
    code, _ = server.call("POST", "/api/v1/nodes?fieldValidation=Ignore", node("fv-ignore"))
    assert code == 201 and server.warnings == []
    code, body = server.call("POST", "/api/v1/nodes?fieldValidation=Bogus", node("fv-bogus"))
    assert (code, body["details"]["kind"], body["details"]["causes"][0]["field"]) == (422, "CreateOptions",
                                                                                      "fieldValidation")
    code, body = server.call("PATCH", "/api/v1/nodes/fv-warn?fieldValidation=Strict", {"spec": {"bar": 1}},
                             content_type="application/merge-patch+json")
    assert (code, body["reason"], body["details"]["causes"][0]["field"]) == (422, "Invalid", "patch")


def test_the_openapi_v3_documents_say_every_kind_takes_field_validation(server: Server, tmp_path: Path) -> None:
    code, index = server.call("GET", "/openapi/v3")
    assert code == 200 and "api/v1" in index["paths"] and "apis/policy/v1" in index["paths"]
    code, doc = server.call("GET", "/openapi/v3/api/v1")
    patch = doc["paths"]["/api/v1/nodes/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Node"}
    assert any(p["name"] == "fieldValidation" and p["in"] == "query" for p in patch["parameters"])
    assert server.call("GET", "/openapi/v3/apis/nothing/v1")[0] == 404

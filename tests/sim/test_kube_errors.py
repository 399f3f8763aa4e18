"""Malformed and refused requests get the API server's status codes and Status bodies, never a hang."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from sim.testing import SimHandle, start_sim

SCENARIO: dict[str, Any] = {
    "seed": 2,
    "clock": {"speed": 10},
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000e1", "clusters": [{
        "name": "errs", "resource_group": "rg-errs",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}],
        "workloads": [{"kind": "Pod", "name": "p1", "namespace": "default"}]}]}],
}


class Raw:
    def __init__(self, sim: SimHandle) -> None:
        url = urlsplit(sim.cluster("errs")["kube_server"])
        self.host, self.port, self.prefix = url.hostname or "", url.port or 443, url.path
        self.ctx = ssl.create_default_context(cafile=sim.ca_bundle)
        self.token = sim.endpoints["kube_token"]

    def call(self, method: str, path: str, body: bytes | str | None = None, *, token: str | None = "default",
             content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=10)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'default' else token}"
        conn.request(method, self.prefix + path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, (json.loads(data) if data else {})


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=2) as handle:
        yield handle


@pytest.fixture(scope="module")
def raw(sim: SimHandle) -> Raw:
    return Raw(sim)


def assert_status(resp: tuple[int, dict[str, Any]], code: int, reason: str) -> dict[str, Any]:
    status, body = resp
    assert status == code, body
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert body["code"] == code and body["reason"] == reason
    return body


def test_no_token_is_401(raw: Raw) -> None:
    assert_status(raw.call("GET", "/api/v1/nodes", token=None), 401, "Unauthorized")


def test_a_forged_token_is_401(raw: Raw) -> None:
    assert_status(raw.call("GET", "/api/v1/nodes", token="abc.def"), 401, "Unauthorized")


def test_a_token_for_another_audience_is_401(raw: Raw, sim: SimHandle) -> None:
    # kube-apiserver's authenticators reject a token whose audience is not theirs: authentication
    # fails (401 Unauthorized), authorization is never reached (issue 11)
    arm_token = sim.token("https://management.azure.com/")
    assert_status(raw.call("GET", "/api/v1/nodes", token=arm_token), 401, "Unauthorized")


@pytest.mark.parametrize(("method", "path", "body", "code", "reason"), [
    ("POST", "/api/v1/namespaces/default/pods", "{not json", 400, "BadRequest"),
    ("POST", "/api/v1/namespaces/default/pods", "[1, 2]", 400, "BadRequest"),
    ("POST", "/api/v1/namespaces/default/pods",
     json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "other"},
                 "spec": {"containers": [{"name": "c", "image": "i"}]}}), 400, "BadRequest"),
    ("GET", "/api/v1/namespaces/default/pods/missing", None, 404, "NotFound"),
    ("GET", "/api/v1/widgets", None, 404, "NotFound"),
    ("GET", "/apis/unknown.example.com/v1", None, 404, "NotFound"),
    ("GET", "/api/v1/nodes/aks-nope-00000000-vmss000000", None, 404, "NotFound"),
    ("POST", "/api/v1/namespaces/nowhere/pods",
     json.dumps({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}), 404, "NotFound"),
    ("PUT", "/api/v1/namespaces/default/pods", "{}", 405, "MethodNotAllowed"),
    ("POST", "/api/v1/namespaces/default/pods/p1", "{}", 405, "MethodNotAllowed"),
    ("POST", "/version", None, 405, "MethodNotAllowed"),
    ("POST", "/api/v1/namespaces/default/pods",
     json.dumps({"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
     409, "AlreadyExists"),
    ("POST", "/api/v1/namespaces/default/pods", json.dumps({"metadata": {"name": "empty"}, "spec": {}}),
     422, "Invalid"),
    ("POST", "/api/v1/namespaces/default/pods",
     json.dumps({"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
     422, "Invalid"),
    ("POST", "/apis/apps/v1/namespaces/default/deployments",
     json.dumps({"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
         "metadata": {"labels": {"a": "c"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
     422, "Invalid"),
    ("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
     json.dumps({"metadata": {"name": "pdb"}, "spec": {"minAvailable": 1, "maxUnavailable": 1}}), 422, "Invalid"),
], ids=["bad-json", "json-not-object", "namespace-mismatch", "missing-pod", "unknown-resource", "unknown-group",
        "missing-node", "missing-namespace", "put-on-collection", "post-on-object", "post-on-version",
        "pod-exists", "pod-without-containers", "pod-bad-name", "selector-mismatch", "pdb-both-fields"])
def test_malformed_or_refused_requests_get_the_real_code(raw: Raw, method: str, path: str, body: str | None,
                                                         code: int, reason: str) -> None:
    assert_status(raw.call(method, path, body), code, reason)


def test_an_invalid_object_names_the_bad_field(raw: Raw) -> None:
    body = assert_status(raw.call("POST", "/api/v1/namespaces/default/pods",
                                  json.dumps({"metadata": {"name": "nocontainers"}, "spec": {"containers": []}})),
                         422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "spec.containers"


def test_an_unsupported_patch_type_is_415(raw: Raw) -> None:
    assert_status(raw.call("PATCH", "/api/v1/namespaces/default/pods/p1", "{}", content_type="text/plain"),
                  415, "UnsupportedMediaType")


def test_a_bad_label_selector_is_400(raw: Raw) -> None:
    assert_status(raw.call("GET", "/api/v1/nodes?labelSelector=a%20in%20(b"), 400, "BadRequest")


def test_a_body_cut_short_does_not_hang_the_server(raw: Raw, sim: SimHandle) -> None:
    import socket

    url = urlsplit(sim.cluster("errs")["kube_server"])
    sock = socket.create_connection((url.hostname, url.port), timeout=5)
    tls = raw.ctx.wrap_socket(sock, server_hostname=url.hostname)
    tls.sendall(b"POST " + raw.prefix.encode() + b"/api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 1000\r\nAuthorization: Bearer " + raw.token.encode() + b"\r\n\r\n{\"kind\"")
    tls.close()
    assert raw.call("GET", "/version")[0] == 200


def test_an_unknown_cluster_is_404(raw: Raw) -> None:
    conn = http.client.HTTPSConnection(raw.host, raw.port, context=raw.ctx, timeout=10)
    conn.request("GET", "/k8s/sub/rg/nope/api/v1/nodes", headers={"Authorization": f"Bearer {raw.token}"})
    resp = conn.getresponse()
    assert resp.status == 404 and json.loads(resp.read())["kind"] == "Status"

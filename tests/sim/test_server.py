"""The simulator process: command line, endpoints.json, TLS, keep-alive, control API and faults."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.testing import REPO, SimError, SimHandle, start_sim
from tests.waiting import wait_until

SCENARIO: dict[str, Any] = {
    "seed": 8,
    "clock": {"speed": 10},
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000s1",
                       "quotas": [{"location": "eastus", "family": "standardNCASv3_T4Family", "limit": 24}],
                       "clusters": [
                           {"name": "one", "resource_group": "rg-one", "tags": {"gpu-fleet-steward": "enabled"},
                            "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                                      {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 2,
                                       "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}]},
                           {"name": "two", "resource_group": "rg-two",
                            "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5",
                                       "count": 1}]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=8) as handle:
        yield handle


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=60, check=False)


def test_help_documents_every_command_and_option() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    for command in ("serve", "oracles", "state", "generate"):
        assert command in top.stdout
    serve = run_cli("serve", "--help").stdout
    for option in ("--state-dir", "--scenario", "--seed", "--speed", "--port", "--identity-port"):
        assert option in serve
    assert "--state-dir" in run_cli("oracles", "--help").stdout
    assert "--clusters" in run_cli("generate", "--help").stdout


def test_endpoints_json_has_the_documented_keys_and_kubeconfigs(sim: SimHandle) -> None:
    e = sim.endpoints
    for key in ("arm_endpoint", "arm_audience", "ca_bundle", "identity_endpoint", "identity_header",
                "eventgrid_topic_endpoint", "eventgrid_deliveries", "clock", "control", "clusters"):
        assert key in e, key
    assert e["arm_endpoint"].startswith("https://127.0.0.1:")
    assert e["identity_endpoint"].startswith("http://127.0.0.1:") and e["identity_endpoint"].endswith("/msi/token")
    assert set(e["clock"]) >= {"epoch_real", "epoch_sim", "speed"} and e["clock"]["speed"] == 10
    assert [c["name"] for c in e["clusters"]] == ["one", "two"]
    one = e["clusters"][0]
    assert one["id"] == ("/subscriptions/00000000-0000-0000-0000-0000000000s1/resourceGroups/rg-one/providers/"
                         "Microsoft.ContainerService/managedClusters/one")
    assert one["kube_server"] == f"{e['arm_endpoint']}/k8s/00000000-0000-0000-0000-0000000000s1/rg-one/one"
    kc = yaml.safe_load(Path(one["kubeconfig"]).read_text())
    assert kc["clusters"][0]["cluster"] == {"server": one["kube_server"], "certificate-authority": e["ca_bundle"]}
    assert kc["users"][0]["user"]["token"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_tls_verifies_against_the_generated_ca_for_both_names(sim: SimHandle, host: str) -> None:
    port = urlsplit(sim.endpoints["arm_endpoint"]).port
    ctx = ssl.create_default_context(cafile=sim.ca_bundle)
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
    conn.request("GET", "/_sim/clock")
    assert conn.getresponse().status == 200


def test_tls_is_refused_by_a_client_that_does_not_trust_the_ca(sim: SimHandle) -> None:
    port = urlsplit(sim.endpoints["arm_endpoint"]).port
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(), timeout=10)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", "/_sim/clock")


def test_connections_are_kept_alive_across_requests(sim: SimHandle) -> None:
    port = urlsplit(sim.endpoints["arm_endpoint"]).port
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=sim.ca_bundle))
    for _ in range(3):
        conn.request("GET", "/_sim/clock")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200 and not resp.will_close
    sock = conn.sock
    conn.request("GET", "/_sim/state")
    conn.getresponse().read()
    assert conn.sock is sock


def test_the_identity_listener_is_plain_http(sim: SimHandle) -> None:
    url = urlsplit(sim.endpoints["identity_endpoint"])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", f"{url.path}?resource=https://management.azure.com/&api-version=2019-08-01",
                 headers={"X-IDENTITY-HEADER": sim.endpoints["identity_header"]})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 200 and body["access_token"]


def test_an_unknown_prefix_is_a_404_and_an_unknown_control_endpoint_too(sim: SimHandle) -> None:
    port = urlsplit(sim.endpoints["arm_endpoint"]).port
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=sim.ca_bundle))
    conn.request("GET", "/nothing-here")
    assert conn.getresponse().status == 404
    with pytest.raises(SimError, match="404"):
        sim.control("GET", "/nothing")


def test_the_oracles_command_prints_the_oracle_keys(sim: SimHandle) -> None:
    out = run_cli("oracles", "--state-dir", str(sim.state_dir))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for key in ("pdb_violations", "pods_killed_without_eviction", "workload_pods_lost", "gpu_capacity", "requests",
                "max_unavailable_per_pool"):
        assert key in report
    assert report["gpu_capacity"]["one"][-1]["allocatable"] == 2


def test_control_state_summarises_pools_nodes_and_pods(sim: SimHandle) -> None:
    state = sim.state()
    one = next(c for c in state["clusters"] if c["name"] == "one")
    assert {p["name"]: len(p["nodes"]) for p in one["pools"]} == {"gpu": 2, "system": 1}
    assert all(n["ready"] for n in one["nodes"])


def test_control_adds_a_workload_at_run_time(sim: SimHandle) -> None:
    created = sim.control("POST", "/workloads", {"cluster": "two", "workload": {
        "kind": "Deployment", "name": "late", "replicas": 1, "pdb": {"minAvailable": 1}}})
    assert "deployments.apps/default/late" in created["created"]
    core = client.CoreV1Api(sim.kube_client("two"))
    wait_until(lambda: [p for p in core.list_namespaced_pod("default", label_selector="app=late").items
                        if p.status.phase == "Running"], timeout=10, what="the late workload's pod to run")


def test_control_sets_quota_and_refuses_advance_on_a_running_clock(sim: SimHandle) -> None:
    answer = sim.control("POST", "/quota", {"subscription": "00000000-0000-0000-0000-0000000000s1",
                                            "location": "eastus", "family": "standardNCASv3_T4Family", "limit": 8})
    assert answer["quota"]["limit"] == 8 and answer["quota"]["in_use"] == 8
    with pytest.raises(SimError, match="409"):
        sim.control("POST", "/advance", {"seconds": 10})


def test_control_flips_a_condition_by_pool_and_index(sim: SimHandle) -> None:
    answer = sim.control("POST", "/conditions", {"cluster": "one", "pool": "gpu", "node_index": 1,
                                                 "type": "UnhealthyNvidiaDCGMServices", "status": "True",
                                                 "fixed_by": "replace"})
    node = client.CoreV1Api(sim.kube_client("one")).read_node(answer["node"])
    assert {c.type: c.status for c in node.status.conditions}["UnhealthyNvidiaDCGMServices"] == "True"


def test_a_kube_fault_rule_answers_503_for_its_cluster_only(sim: SimHandle) -> None:
    sim.control("POST", "/faults", {"target": "kube", "cluster": "one", "path": "/api/v1/nodes$", "status": 503,
                                    "count": 1})
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(sim.kube_client("one")).list_node()
    assert e.value.status == 503
    assert client.CoreV1Api(sim.kube_client("two")).list_node().items
    assert client.CoreV1Api(sim.kube_client("one")).list_node().items  # count exhausted
    fired = sim.oracles()["faults_fired"]
    assert any(f["target"] == "kube" and f.get("cluster") == "one" for f in fired)


def test_a_drop_fault_closes_the_connection_without_an_answer(sim: SimHandle) -> None:
    sim.control("POST", "/faults", {"target": "kube", "cluster": "two", "path": "/version", "drop": True, "count": 1})
    url = urlsplit(sim.cluster("two")["kube_server"])
    conn = http.client.HTTPSConnection(url.hostname, url.port, context=ssl.create_default_context(cafile=sim.ca_bundle),
                                       timeout=10)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError, ssl.SSLError, socket.timeout)):
        conn.request("GET", url.path + "/version", headers={"Authorization": f"Bearer {sim.endpoints['kube_token']}"})
        conn.getresponse()


def test_a_delay_fault_answers_late(sim: SimHandle) -> None:
    sim.control("POST", "/faults", {"target": "kube", "cluster": "two", "path": "/version", "delay_s": 0.5,
                                    "count": 1})
    started = time.monotonic()
    client.VersionApi(sim.kube_client("two")).get_code()
    assert time.monotonic() - started >= 0.5


def test_a_bad_fault_rule_is_a_400(sim: SimHandle) -> None:
    with pytest.raises(SimError, match="400"):
        sim.control("POST", "/faults", {"target": "kube"})


def test_requests_are_counted_per_service(sim: SimHandle) -> None:
    client.CoreV1Api(sim.kube_client("one")).list_node()
    report = sim.oracles()
    assert report["requests_by_service"]["kube"]["reads"] >= 1
    assert report["requests"]["GET /k8s/{}/api/v1/nodes"] >= 1


def test_a_bad_scenario_stops_the_simulator_with_its_error(tmp_path: Path) -> None:
    with pytest.raises(SimError, match="resource_group is required"), start_sim(
            scenario={"subscriptions": [{"id": "s", "clusters": [{"name": "x"}]}]}, state_dir=tmp_path):
        pass


def test_the_kubernetes_client_works_from_arm_credentials_and_a_managed_identity_token(
        sim: SimHandle, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import base64

    from azure.identity import ManagedIdentityCredential

    for var in ("MSI_ENDPOINT", "MSI_SECRET", "IDENTITY_SERVER_THUMBPRINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("IDENTITY_ENDPOINT", sim.endpoints["identity_endpoint"])
    monkeypatch.setenv("IDENTITY_HEADER", sim.endpoints["identity_header"])
    credential = ManagedIdentityCredential()
    arm = credential.get_token("https://management.azure.com/.default").token
    cluster = sim.cluster("one")
    url = urlsplit(sim.endpoints["arm_endpoint"])
    conn = http.client.HTTPSConnection(url.hostname, url.port, context=ssl.create_default_context(cafile=sim.ca_bundle))
    conn.request("POST", f"{cluster['id']}/listClusterUserCredential?api-version=2026-08-01&format=exec",
                 headers={"Authorization": f"Bearer {arm}", "Content-Length": "0"})
    resp = conn.getresponse()
    assert resp.status == 200
    kubeconfig = yaml.safe_load(base64.b64decode(json.loads(resp.read())["kubeconfigs"][0]["value"]))
    entry = kubeconfig["clusters"][0]["cluster"]
    assert entry["server"] == cluster["kube_server"]
    ca = tmp_path / "ca.pem"
    ca.write_bytes(base64.b64decode(entry["certificate-authority-data"]))
    config = client.Configuration(host=entry["server"])
    config.ssl_ca_cert = str(ca)
    config.api_key = {"authorization": credential.get_token("6dae42f8-4368-4678-94ff-3960e28e3630/.default").token}
    config.api_key_prefix = {"authorization": "Bearer"}
    nodes = client.CoreV1Api(client.ApiClient(config)).list_node().items
    assert {n.metadata.labels["agentpool"] for n in nodes} == {"system", "gpu"}

"""The real ``kubectl`` agrees with the simulated API server where a real server is strict:
``--dry-run=server`` changes nothing (create, label, patch, cordon, delete), and a malformed label
selector fails with the server's 400 message as kubectl prints it (cli-runtime resource/selector.go
wraps it in "Unable to find ... that match label selector ...").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.testing import SimHandle, start_sim

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")

SCENARIO: dict[str, Any] = {
    "seed": 11,
    "clock": {"manual": True},
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000fb", "clusters": [{
        "name": "kstrict", "resource_group": "rg-kstrict",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "work", "mode": "User", "vmSize": "Standard_D4s_v5", "count": 2}],
        "workloads": [{"kind": "Pod", "name": "keep", "namespace": "default"}]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=11) as handle:
        handle.control("POST", "/advance", {"seconds": 30})
        yield handle


def kubectl(sim: SimHandle, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=sim.kubeconfig("kstrict"), HOME=str(sim.state_dir))
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def get_json(sim: SimHandle, *args: str) -> dict[str, Any]:
    out = kubectl(sim, "get", *args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def a_work_node(sim: SimHandle) -> str:
    return str(get_json(sim, "nodes", "-l", "agentpool=work")["items"][0]["metadata"]["name"])


def test_kubectl_create_with_server_dry_run_creates_nothing(sim: SimHandle, tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text("""
apiVersion: v1
kind: Pod
metadata: {name: dry-pod, namespace: default}
spec:
  containers: [{name: main, image: busybox}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: dry-cm, namespace: default}
data: {a: b}
""")
    # --validate=false: kubectl's own schema check needs the OpenAPI document, which the simulator does not serve
    out = kubectl(sim, "create", "-f", str(manifest), "--dry-run=server", "--validate=false")
    assert out.returncode == 0, out.stderr
    assert "pod/dry-pod created (server dry run)" in out.stdout
    assert "configmap/dry-cm created (server dry run)" in out.stdout
    sim.control("POST", "/advance", {"seconds": 30})
    for kind, name in (("pod", "dry-pod"), ("configmap", "dry-cm")):
        missing = kubectl(sim, "get", kind, name)
        assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_kubectl_label_patch_and_cordon_with_server_dry_run_change_nothing(sim: SimHandle) -> None:
    name = a_work_node(sim)
    before = get_json(sim, "node", name)
    label = kubectl(sim, "label", "node", name, "dry=yes", "--dry-run=server")
    assert label.returncode == 0, label.stderr
    assert f"node/{name} labeled (server dry run)" in label.stdout
    patch = kubectl(sim, "patch", "node", name, "--dry-run=server", "-p", '{"metadata":{"annotations":{"dry":"yes"}}}')
    assert patch.returncode == 0, patch.stderr
    assert f"node/{name} patched" in patch.stdout  # kubectl patch prints no dry-run suffix (cmd/patch/patch.go)
    cordon = kubectl(sim, "cordon", name, "--dry-run=server")
    assert cordon.returncode == 0, cordon.stderr
    assert f"node/{name} cordoned (server dry run)" in cordon.stdout
    after = get_json(sim, "node", name)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "dry" not in after["metadata"].get("labels", {}) and "dry" not in after["metadata"].get("annotations", {})
    assert not after["spec"].get("unschedulable")


def test_kubectl_delete_with_server_dry_run_deletes_nothing(sim: SimHandle) -> None:
    out = kubectl(sim, "delete", "pod", "keep", "--dry-run=server")
    assert out.returncode == 0, out.stderr
    assert 'pod "keep" deleted (server dry run)' in out.stdout
    sim.control("POST", "/advance", {"seconds": 60})  # past the 30 s grace a real delete would start
    pod = get_json(sim, "pod", "keep")
    assert "deletionTimestamp" not in pod["metadata"] and pod["status"]["phase"] == "Running"


@pytest.mark.parametrize(("selector", "server_message"), [
    ("a=b=c", "found '=', expected: ',' or 'end of string'"),
    ("app:web", "unable to parse requirement: <nil>: Invalid value: \"app:web\": name part must consist of "
     "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',"
     "  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
], ids=["a=b=c", "colon-in-key"])
def test_kubectl_get_with_a_malformed_selector_fails_with_the_servers_400(sim: SimHandle, selector: str,
                                                                        server_message: str) -> None:
    out = kubectl(sim, "get", "pods", "-l", selector)
    assert out.returncode != 0
    assert out.stderr.strip() == (f'Error from server (BadRequest): Unable to find "/v1, Resource=pods" that match '
                                  f'label selector "{selector}", field selector "": {server_message}')

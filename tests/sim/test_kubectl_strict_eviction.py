"""kubectl agrees with a real API server on finalizers, unready pods under a tight PDB, terminating
namespaces and server-side dry-run evictions (the simulator runs as a subprocess, kubectl unchanged).

Cluster `strict`: namespace `hold` has a bare pod `held` with the finalizer `example.com/hold`; namespace
`shop` has `sick` (2 replicas that run but never turn Ready, PDB minAvailable 1) and `web` (2 Ready
replicas, PDB maxUnavailable 1); namespace `doomed` has `keep`, whose pods carry a finalizer so that
the namespace stays Terminating once deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sim.testing import SimHandle, start_sim
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")

SCENARIO: dict[str, Any] = {
    "seed": 13,
    "clock": {"speed": 10},
    "timings": {"node_ready_s": 2, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000e1", "clusters": [{
        "name": "strict", "resource_group": "rg-strict",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "work", "vmSize": "Standard_D4s_v5", "count": 2}],
        "workloads": [
            {"kind": "Pod", "name": "held", "namespace": "hold", "pod_finalizers": ["example.com/hold"],
             "terminationGracePeriodSeconds": 1, "nodeSelector": {"agentpool": "work"}},
            {"kind": "Deployment", "name": "sick", "namespace": "shop", "replicas": 2, "ready": False,
             "nodeSelector": {"agentpool": "work"}, "pdb": {"minAvailable": 1}},
            {"kind": "Deployment", "name": "web", "namespace": "shop", "replicas": 2,
             "nodeSelector": {"agentpool": "work"}, "pdb": {"maxUnavailable": 1}},
            {"kind": "Deployment", "name": "keep", "namespace": "doomed", "replicas": 1,
             "pod_finalizers": ["example.com/hold"], "nodeSelector": {"agentpool": "work"}},
        ]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=13) as handle:
        yield handle


def kubectl(sim: SimHandle, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=sim.kubeconfig("strict"), HOME=str(sim.state_dir))
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def get_json(sim: SimHandle, *args: str) -> Any:
    out = kubectl(sim, "get", *args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_for(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    return wait_until(check, timeout=timeout, interval=0.1, what="the simulated cluster to get there")


def evict_raw(sim: SimHandle, tmp_path: Path, ns: str, pod: str, *, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}}
    if dry_run:
        body["deleteOptions"] = {"dryRun": ["All"]}
    path = tmp_path / f"evict-{pod}.json"
    path.write_text(json.dumps(body))
    # --raw paths are absolute on the host: the simulated API server's path prefix comes first
    prefix = urlsplit(sim.cluster("strict")["kube_server"]).path.rstrip("/")
    return kubectl(sim, "create", "--raw", f"{prefix}/api/v1/namespaces/{ns}/pods/{pod}/eviction", "-f", str(path))


def pod_names(sim: SimHandle, ns: str, app: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in get_json(sim, "pods", "-n", ns, "-l", f"app={app}")["items"])


def test_a_pod_with_a_finalizer_stays_terminating_until_kubectl_patch_removes_it(sim: SimHandle) -> None:
    out = kubectl(sim, "delete", "pod", "held", "-n", "hold", "--wait=false")
    assert out.returncode == 0, out.stderr
    assert 'pod "held" deleted' in out.stdout
    held = wait_for(lambda: (p := get_json(sim, "pod", "held", "-n", "hold"))["metadata"].get(
        "deletionGracePeriodSeconds") == 0 and p)
    assert held["metadata"]["finalizers"] == ["example.com/hold"] and held["metadata"]["deletionTimestamp"]
    shown = kubectl(sim, "get", "pod", "held", "-n", "hold")
    assert shown.returncode == 0 and "Terminating" in shown.stdout
    out = kubectl(sim, "patch", "pod", "held", "-n", "hold", "--type=json",
                  "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
    assert out.returncode == 0, out.stderr
    gone = kubectl(sim, "get", "pod", "held", "-n", "hold")
    assert gone.returncode != 0 and 'pods "held" not found' in gone.stderr


def test_evicting_an_unready_pod_under_a_tight_pdb_is_a_429(sim: SimHandle, tmp_path: Path) -> None:
    pdb = wait_for(lambda: (b := get_json(sim, "pdb", "sick", "-n", "shop"))["status"].get("observedGeneration") and b)
    assert (pdb["status"]["currentHealthy"], pdb["status"]["desiredHealthy"]) == (0, 1)
    pod = pod_names(sim, "shop", "sick")[0]
    out = evict_raw(sim, tmp_path, "shop", pod)
    assert out.returncode != 0
    assert "Error from server (TooManyRequests)" in out.stderr
    assert "Cannot evict pod as it would violate the pod's disruption budget." in out.stderr
    assert get_json(sim, "pod", pod, "-n", "shop")["metadata"].get("deletionTimestamp") is None


def test_kubectl_drain_cannot_evict_an_unready_pod_under_a_tight_pdb(sim: SimHandle) -> None:
    pod = get_json(sim, "pod", pod_names(sim, "shop", "sick")[0], "-n", "shop")
    node = pod["spec"]["nodeName"]
    try:
        out = kubectl(sim, "drain", node, "--pod-selector=app=sick", "--ignore-daemonsets", "--timeout=4s")
        assert out.returncode != 0
        assert "Cannot evict pod as it would violate the pod's disruption budget." in out.stderr
        assert "global timeout reached" in out.stderr
    finally:
        kubectl(sim, "uncordon", node)


def test_a_server_dry_run_eviction_changes_nothing(sim: SimHandle, tmp_path: Path) -> None:
    pod = pod_names(sim, "shop", "web")[0]
    before = get_json(sim, "pdb", "web", "-n", "shop")["status"]
    out = evict_raw(sim, tmp_path, "shop", pod, dry_run=True)
    assert out.returncode == 0, out.stderr
    assert get_json(sim, "pod", pod, "-n", "shop")["metadata"].get("deletionTimestamp") is None
    after = get_json(sim, "pdb", "web", "-n", "shop")["status"]
    assert after["disruptionsAllowed"] == before["disruptionsAllowed"] == 1
    assert "disruptedPods" not in after


def test_evicting_in_a_terminating_namespace_is_a_403(sim: SimHandle, tmp_path: Path) -> None:
    pod = pod_names(sim, "doomed", "keep")[0]
    out = kubectl(sim, "delete", "namespace", "doomed", "--wait=false")
    assert out.returncode == 0, out.stderr
    ns = get_json(sim, "namespace", "doomed")
    assert ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
    out = evict_raw(sim, tmp_path, "doomed", pod)
    assert out.returncode != 0
    assert (f'Error from server (Forbidden): pods "{pod}" is forbidden: unable to create new content in namespace '
            "doomed because it is being terminated") in out.stderr
    manifest = tmp_path / "late.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}))
    out = kubectl(sim, "create", "--validate=false", "-n", "doomed", "-f", str(manifest))
    assert out.returncode != 0
    assert ('Error from server (Forbidden): error when creating "' in out.stderr
            and 'configmaps "late" is forbidden: unable to create new content in namespace doomed because it is being '
                "terminated" in out.stderr), out.stderr
    table = kubectl(sim, "get", "namespace", "doomed")  # the server-side table kubectl prints
    assert table.returncode == 0 and table.stdout.split("\n")[0].split() == ["NAME", "STATUS", "AGE"]
    assert table.stdout.split("\n")[1].split()[:2] == ["doomed", "Terminating"], table.stdout
    again = kubectl(sim, "delete", "namespace", "doomed", "--wait=false")
    # kube-apiserver v1.37 answers a second delete of a terminating namespace with the namespace, 200
    # (tests/realkube, story terminating_namespace), so kubectl reports it deleted again
    assert again.returncode == 0 and 'namespace "doomed" deleted' in again.stdout, again.stderr
    immortal = kubectl(sim, "delete", "namespace", "default", "--wait=false")
    assert immortal.returncode != 0 and ('Error from server (Forbidden): namespaces "default" is forbidden: this '
                                         'namespace may not be deleted') in immortal.stderr, immortal.stderr
    out = kubectl(sim, "patch", "pod", pod, "-n", "doomed", "--type=json",
                  "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
    assert out.returncode == 0, out.stderr
    wait_for(lambda: kubectl(sim, "get", "namespace", "doomed").returncode != 0, timeout=30)


def test_kubectl_drain_with_server_dry_run_cordons_and_evicts_nothing(sim: SimHandle) -> None:
    pod = get_json(sim, "pod", pod_names(sim, "shop", "web")[0], "-n", "shop")
    node = pod["spec"]["nodeName"]
    before = get_json(sim, "pdb", "web", "-n", "shop")["status"]["disruptionsAllowed"]
    out = kubectl(sim, "drain", node, "--dry-run=server", "--pod-selector=app=web", "--ignore-daemonsets")
    assert out.returncode == 0, out.stderr
    assert f"evicting pod shop/{pod['metadata']['name']} (server dry run)" in out.stdout
    assert f"node/{node} drained (server dry run)" in out.stdout
    assert not get_json(sim, "node", node)["spec"].get("unschedulable")
    assert get_json(sim, "pod", pod["metadata"]["name"], "-n", "shop")["metadata"].get("deletionTimestamp") is None
    assert get_json(sim, "pdb", "web", "-n", "shop")["status"]["disruptionsAllowed"] == before

"""kubectl against a simulated cluster: get, apply, cordon and a drain that a PDB holds up.

The drill (sim/scenarios/drain.yaml): node `work` #0 runs two `api` replicas covered by a PDB with
maxUnavailable 1. kubectl drain evicts one, gets 429 for the other, retries every 5 s until the
ReplicaSet's replacement is Ready on another node, then succeeds; the oracles show no violation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.scenario import SCENARIO_DIR
from sim.testing import SimHandle, start_sim

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO_DIR / "drain.yaml", seed=7) as handle:
        yield handle


def kubectl(sim: SimHandle, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=sim.kubeconfig("drill"), HOME=str(sim.state_dir))
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_kubectl_get_nodes_lists_every_node_ready(sim: SimHandle) -> None:
    out = kubectl(sim, "get", "nodes")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATUS"]
    assert len(lines) == 5
    assert all(line.split()[1] == "Ready" for line in lines[1:])


def test_kubectl_get_nodes_as_json_carries_the_aks_labels(sim: SimHandle) -> None:
    out = kubectl(sim, "get", "nodes", "-l", "agentpool=work", "-o", "json")
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)["items"]
    assert len(items) == 3
    assert all(i["metadata"]["labels"]["kubernetes.azure.com/agentpool"] == "work" for i in items)


def test_kubectl_apply_creates_then_leaves_unchanged(sim: SimHandle, tmp_path: Path) -> None:
    manifest = tmp_path / "app.yaml"
    manifest.write_text("""
apiVersion: v1
kind: Namespace
metadata: {name: tools}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: toolbox, namespace: tools}
spec:
  replicas: 2
  selector: {matchLabels: {app: toolbox}}
  template:
    metadata: {labels: {app: toolbox}}
    spec:
      nodeSelector: {kubernetes.azure.com/agentpool: system}
      containers: [{name: main, image: busybox, resources: {requests: {cpu: 50m}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: toolbox, namespace: tools}
spec: {minAvailable: 1, selector: {matchLabels: {app: toolbox}}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once, namespace: tools}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: busybox}]
""")
    first = kubectl(sim, "apply", "--validate=false", "-f", str(manifest))
    assert first.returncode == 0, first.stderr
    assert "deployment.apps/toolbox created" in first.stdout
    assert "poddisruptionbudget.policy/toolbox created" in first.stdout
    again = kubectl(sim, "apply", "--validate=false", "-f", str(manifest))
    assert again.returncode == 0, again.stderr
    assert "deployment.apps/toolbox unchanged" in again.stdout
    pods = kubectl(sim, "get", "pods", "-n", "tools", "-l", "app=toolbox", "-o", "json")
    assert len(json.loads(pods.stdout)["items"]) == 2


def test_kubectl_cordon_and_uncordon(sim: SimHandle) -> None:
    node = json.loads(kubectl(sim, "get", "nodes", "-l", "agentpool=system", "-o", "json").stdout)["items"][0]
    name = node["metadata"]["name"]
    assert kubectl(sim, "cordon", name).returncode == 0
    shown = kubectl(sim, "get", "node", name).stdout
    assert "SchedulingDisabled" in shown
    assert kubectl(sim, "uncordon", name).returncode == 0
    assert "SchedulingDisabled" not in kubectl(sim, "get", "node", name).stdout


def test_kubectl_drain_waits_for_the_pdb_then_succeeds_without_violation(sim: SimHandle) -> None:
    pods = json.loads(kubectl(sim, "get", "pods", "-n", "shop", "-l", "app=api", "-o", "json").stdout)["items"]
    per_node: dict[str, int] = {}
    for p in pods:
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
    node = max(sorted(per_node), key=lambda n: per_node[n])
    assert per_node[node] == 2, per_node
    out = kubectl(sim, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=90s")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Cannot evict pod as it would violate the pod's disruption budget" in out.stderr
    assert f"node/{node} drained" in out.stdout
    pdb = kubectl(sim, "get", "pdb", "-n", "shop", "api").stdout.splitlines()
    assert pdb[0].split()[:3] == ["NAME", "MIN", "AVAILABLE"] and pdb[1].split()[:4] == ["api", "N/A", "1", "1"]
    after = json.loads(kubectl(sim, "get", "pods", "-n", "shop", "-l", "app=api", "-o", "json").stdout)["items"]
    assert len(after) == 4
    assert all(p["spec"]["nodeName"] != node for p in after)
    oracles = sim.oracles()
    assert oracles["pdb_violations"] == []
    assert oracles["pods_killed_without_eviction"] == []
    evicted = [t for t in oracles["terminations"] if t["cause"] == "eviction" and t["node"] == node]
    assert len([t for t in evicted if t["pod"].startswith("api-")]) == 2
    assert oracles["max_unavailable_per_pool"]["drill/work"] >= 1

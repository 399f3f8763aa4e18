"""The real-control-plane lane (``make test-realkube``): a simulator and a real Kubernetes control
plane (realkube: kube-apiserver, etcd, the controller manager, the scheduler and kwok, built from Go
modules), started once for the session.

The real API server authenticates the app's bearer token through the simulator's token webhook
(``/_sim/tokenreview``) and authorizes it with the project's own RBAC (``infra/kubernetes``, applied
with kubectl as scripts/apply-kube-rbac.sh does), so least privilege is judged by the real authorizer.

This lane is never skipped: without the binaries it fails, saying how to build them.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from realkube import build
from realkube.cluster import KWOK_NODE_ANNOTATION, RealCluster, karpenter_crds, running
from sim.identity import APP_PRINCIPAL_ID
from sim.testing import SimHandle, start_sim
from tests.realkube.servers import Server, is_ready
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
AKS_AUDIENCE = "6dae42f8-4368-4678-94ff-3960e28e3630"
MANIFESTS = REPO / "infra" / "kubernetes"

SCENARIO: dict[str, Any] = {
    "seed": 20,
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000d1", "clusters": [{
        "name": "diff", "resource_group": "rg-diff",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "spare", "mode": "User", "vmSize": "Standard_D4s_v5", "count": 1}]}]}],
}


def apply_karpenter_crds(kubeconfig: Path) -> None:
    """Karpenter's own CRDs (NodePool, NodeClaim), so its kinds exist as on a NAP cluster."""
    args = ["kubectl", "--kubeconfig", str(kubeconfig), "create"]
    for crd in karpenter_crds():
        args += ["-f", str(crd)]
    subprocess.run(args, check=True, capture_output=True)


def apply_rbac(kubeconfig: Path, principal: str) -> None:
    """What scripts/apply-kube-rbac.sh does to each cluster, minus az and kubelogin: the namespace, the
    roles, then both bindings with the app's object id."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl is needed by the real-control-plane lane")
    subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "apply", "-f", str(MANIFESTS / "namespace.yaml"),
                    "-f", str(MANIFESTS / "clusterrole.yaml"), "-f", str(MANIFESTS / "role.yaml")],
                   check=True, capture_output=True)
    bindings = (MANIFESTS / "clusterrolebinding.yaml").read_text() + "\n---\n" + (MANIFESTS / "rolebinding.yaml").read_text()
    subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
                   input=bindings.replace("${STEWARD_PRINCIPAL_ID}", principal).encode(), check=True,
                   capture_output=True)


def kwok_node(server: Server, name: str, kubelet: str = "fake", labels: dict[str, str] | None = None) -> str:
    """A Node kwok acts as the kubelet of (realkube.cluster.KWOK_NODE_ANNOTATION), once it is Ready."""
    code, body = server.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "annotations": {KWOK_NODE_ANNOTATION: kubelet}, "labels": labels or {"type": "kwok"}}})
    assert code == 201, body
    wait_until(lambda: is_ready(server.call("GET", f"/api/v1/nodes/{name}")[1]), timeout=60,
               what=f"kwok making node {name} Ready")
    return name


@dataclass
class World:
    sim: SimHandle
    real: RealCluster
    sim_server: Server
    real_server: Server
    app_token: str

    @property
    def servers(self) -> tuple[Server, Server]:
        return self.sim_server, self.real_server


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    if not build.built():
        pytest.fail(f"the real control plane is not built in {build.bin_dir()}: run `make realkube-build` "
                    "(it builds kube-apiserver, etcd, the controller manager, the scheduler and kwok from Go modules)")
    with start_sim(scenario=SCENARIO) as sim:
        token = sim.control("POST", "/token", {"audience": AKS_AUDIENCE, "principal": APP_PRINCIPAL_ID})["access_token"]
        run_dir = Path(tempfile.mkdtemp(prefix="realkube-lane-"))
        with running(run_dir, token_webhook=sim.endpoints["control"] + "/tokenreview",
                     webhook_ca=sim.ca_bundle) as real:
            apply_rbac(real.admin_kubeconfig, APP_PRINCIPAL_ID)
            apply_karpenter_crds(real.admin_kubeconfig)
            sim_ctx = ssl.create_default_context(cafile=sim.ca_bundle)
            sim_server = Server("simulator", sim.cluster("diff")["kube_server"], sim_ctx, sim_ctx,
                                {"Authorization": f"Bearer {sim.endpoints['kube_token']}"}, token)
            real_server = Server("kube-apiserver", real.server, real.ssl_context(),
                                 ssl.create_default_context(cafile=str(real.pki.ca)), {}, token)
            pools = {n["metadata"]["labels"].get("kubernetes.azure.com/agentpool"): n["metadata"]["name"]
                     for n in sim_server.call("GET", "/api/v1/nodes")[1]["items"]}
            sim_server.pod_node, sim_server.spare_node = pools["system"], pools["spare"]
            sim_server.stop_kubelet = lambda node: sim.control("POST", "/kubelet", {"cluster": "diff", "node": node,
                                                                                   "ready": False})
            real_server.pod_node = kwok_node(real_server, "kwok-pods")
            # the spare node's kubelet is a kwok process of its own, so that it can stop
            real.start_kubelet("spare")
            real_server.spare_node = kwok_node(real_server, "kwok-spare", kubelet="spare")
            real_server.stop_kubelet = lambda node: real.stop_kubelet("spare")
            sim_server.kubeconfig = sim.kubeconfig("diff")
            real_server.kubeconfig = str(real.admin_kubeconfig)
            yield World(sim, real, sim_server, real_server, token)
        if os.environ.get("REALKUBE_KEEP_LOGS") is None:
            shutil.rmtree(run_dir, ignore_errors=True)

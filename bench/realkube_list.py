"""Benchmark: the sweep's listing of 1,000 and 5,000 GPU nodes from a real kube-apiserver (issue 20, item 5).

``sweep_cost`` and ``sim_share`` list nodes from the simulator; this one lists them from the real
control plane (realkube: kube-apiserver v1.37 over etcd, built from Go modules by ``make
realkube-build``), so neither the client CPU ratio nor the server's time per page depends on how the
simulator serves a list. Without the binaries every figure is "not measured", saying how to build them.

Setup: a small simulator (its ``/_sim/tokenreview`` is the API server's token webhook, so the app's
managed-identity token is accepted, and the project's RBAC from infra/kubernetes authorizes it), then
the real cluster. The nodes are the simulator's own GPU node (labels, 13 conditions, capacity with
``nvidia.com/gpu``, nodeInfo, images), fetched once and created N times on the real server by the
administrator with names, addresses, ids, zones and pools varied; the server stores the status as
posted. They carry no kwok annotation (no kubelet acts for them), and the controller manager is
stopped before they are created: with no kubelet leases its node lifecycle controller would rewrite
every node (Ready Unknown, taints) while they are being listed, which no healthy fleet sees.

For each size, after a warm-up of each path, the GPU nodes (the sweep's label selector) are listed
in pages (500 at full scale) three ways:

- **models**: ``kubernetes.client.CoreV1Api.list_node`` decoding ``V1Node`` models (administrator's
  client certificate), the baseline;
- **ours**: the app's ``KubeClient.list_nodes`` (msgspec) with the app's bearer token;
- **raw**: the kubernetes client fetching each page's bytes only (``_preload_content=False``); the
  wall time of each page is the server's time per page (an upper bound: it includes TLS and transfer).

Client CPU is ``time.process_time`` of this process (median of several passes); the API server's and
etcd's own CPU seconds over each pass come from /proc.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bench.figures import Figure, measured, not_measured
from bench.scale import Scale
from bench.sim_share import process_cpu_s

AKS_AUDIENCE = "6dae42f8-4368-4678-94ff-3960e28e3630"
GPU_SELECTOR = "kubernetes.azure.com/accelerator=nvidia"
CREATE_THREADS = 8
POOLS = 10  # the created nodes are spread over this many pools (labels, names)
REPO = Path(__file__).resolve().parent.parent
RBAC = REPO / "infra" / "kubernetes"

# A small simulator: the identity plane (tokens and their review) and one GPU node to copy.
SCENARIO: dict[str, Any] = {
    "seed": 20,
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000d1", "clusters": [{
        "name": "bench", "resource_group": "rg-bench", "location": "eastus",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "gpu0", "mode": "User", "vmSize": "Standard_NC24ads_A100_v4", "count": 1,
                   "availabilityZones": ["1", "2", "3"], "nodeTaints": ["sku=gpu:NoSchedule"],
                   "nodeLabels": {"team": "team0"}, "npd": True, "device_plugin": True,
                   "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}}]}]}],
}

_SERVER_GENERATED = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink")


class _ListHead(msgspec.Struct):
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class _StaticToken:
    """The app's credential: the token the simulated managed-identity endpoint issued for the AKS server."""

    def __init__(self, token: str) -> None:
        self.token = token

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken(self.token, int(time.time()) + 3600)


def _figure_names(n: int, page: int) -> tuple[str, str]:
    return (f"client CPU per node, our msgspec client (real kube-apiserver, {n:,} nodes)",
            f"kube-apiserver wall time per page of {page} ({n:,} nodes)")


def _not_measured(scale: Scale, why: str) -> list[Figure]:
    figures = []
    for n in scale.realkube_nodes:
        cpu, page = _figure_names(n, scale.sweep_page_size)
        figures += [not_measured(cpu, "us/node", why, baseline_name="kubernetes models"),
                    not_measured(page, "ms", why)]
    return figures


# -- the nodes --------------------------------------------------------------------------------------

def _template_node(sim: Any) -> dict[str, Any]:
    """The simulator's GPU node, once it is Ready, without what a server generates."""
    from kubernetes import client as k8s

    api = k8s.CoreV1Api(sim.kube_client("bench"))
    try:
        deadline = time.monotonic() + 60
        while True:
            items = api.list_node(label_selector=GPU_SELECTOR, _preload_content=False).data
            nodes = json.loads(items)["items"]
            ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                             for c in n["status"].get("conditions") or [])]
            if ready:
                node = ready[0]
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the simulator's GPU node was not Ready in 60 s: {nodes}")
            time.sleep(0.3)
    finally:
        api.api_client.close()
    for key in _SERVER_GENERATED:
        node["metadata"].pop(key, None)
    node.pop("kind", None)
    node.pop("apiVersion", None)
    return dict(node)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out.rjust(6, "0")


def make_node(template: dict[str, Any], i: int) -> dict[str, Any]:
    """Node ``i`` of the fleet: the template with its identity varied as AKS varies it between nodes."""
    node = copy.deepcopy(template)
    pool = f"gpu{i % POOLS}"
    name = f"aks-{pool}-{31415926 + i % POOLS}-vmss{_base36(i // POOLS)}"
    meta, spec, status = node["metadata"], node["spec"], node["status"]
    meta["name"] = name
    labels = meta["labels"]
    for key in ("agentpool", "kubernetes.azure.com/agentpool"):
        labels[key] = pool
    labels["topology.kubernetes.io/zone"] = f"eastus-{i % 3 + 1}"
    labels["team"] = f"team{i % 20}"
    if "kubernetes.io/hostname" in labels:
        labels["kubernetes.io/hostname"] = name
    annotations = meta.setdefault("annotations", {})
    if "csi.volume.kubernetes.io/nodeid" in annotations:
        annotations["csi.volume.kubernetes.io/nodeid"] = '{"disk.csi.azure.com":"' + name + '"}'
    if spec.get("providerID"):
        spec["providerID"] = spec["providerID"].rsplit("/virtualMachineScaleSets/", 1)[0] + \
            f"/virtualMachineScaleSets/aks-{pool}-vmss/virtualMachines/{i // POOLS}"
    spec["podCIDR"] = f"10.{128 + i // 256 % 64}.{i % 256}.0/24"
    spec.pop("podCIDRs", None)
    status["addresses"] = [{"type": "InternalIP", "address": f"10.224.{i // 256 % 256}.{i % 256}"},
                           {"type": "Hostname", "address": name}]
    info = status.get("nodeInfo") or {}
    uid = f"{i:08x}-0000-4000-8000-{i:012x}"
    for key in ("machineID", "systemUUID", "bootID"):
        if key in info:
            info[key] = uid.replace("-", "") if key == "machineID" else uid
    return {"apiVersion": "v1", "kind": "Node", **node}


def create_nodes(real: Any, template: dict[str, Any], indices: range) -> None:
    """POST the nodes as the administrator, ``CREATE_THREADS`` keep-alive connections at a time."""
    url = urlsplit(real.server)
    ctx = real.ssl_context()
    local = threading.local()
    bodies = [json.dumps(make_node(template, i)).encode() for i in indices]

    def post(body: bytes) -> None:
        for attempt in range(3):
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=ctx, timeout=60)
            try:
                conn.request("POST", "/api/v1/nodes", body=body,
                             headers={"Content-Type": "application/json", "Accept": "application/json"})
                resp = conn.getresponse()
                answer = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                local.conn = None
                if attempt == 2:
                    raise
                continue
            if resp.status == 201:
                return
            if resp.status == 429 or resp.status >= 500:
                time.sleep(0.2)
                continue
            raise RuntimeError(f"creating a node: {resp.status} {answer[:300]!r}")
        raise RuntimeError("creating a node: the server kept refusing")

    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        list(pool.map(post, bodies))


# -- the clients ------------------------------------------------------------------------------------

def _apply_rbac(real: Any, principal: str) -> None:
    """The project's ClusterRole and its binding to the app (scripts/apply-kube-rbac.sh, minus kubectl)."""
    import yaml

    role = yaml.safe_load((RBAC / "clusterrole.yaml").read_text())
    binding = yaml.safe_load((RBAC / "clusterrolebinding.yaml").read_text().replace("${STEWARD_PRINCIPAL_ID}", principal))
    for path, body in (("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
                       ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)):
        status, answer = real.request("POST", path, body)
        if status >= 300:
            raise RuntimeError(f"POST {path}: {status} {answer}")


def _app_client(real: Any, token: str) -> Any:
    import yaml

    from shared.adapters.kube.client import KubeClient
    from shared.kernel.clock import SystemClock

    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                  "clusters": [{"name": "c", "cluster": {
                      "server": real.server,
                      "certificate-authority-data": base64.b64encode(Path(real.pki.ca).read_bytes()).decode()}}],
                  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                  "users": [{"name": "u", "user": {}}]}
    return KubeClient(yaml.safe_dump(kubeconfig).encode(), _StaticToken(token), server_app_id=AKS_AUDIENCE,
                      clock=SystemClock(), cluster_id="realkube")


def _models_client(real: Any) -> Any:
    from kubernetes import client as k8s
    from kubernetes import config

    cfg = k8s.Configuration()
    config.load_kube_config(config_file=str(real.admin_kubeconfig), client_configuration=cfg)
    return k8s.CoreV1Api(k8s.ApiClient(cfg))


class _Paths:
    def __init__(self, core: Any, ours: Any, page_size: int) -> None:
        self.core, self.ours, self.page_size = core, ours, page_size
        self.page_walls: list[float] = []
        self.page_bytes: list[int] = []

    def models(self) -> int:
        token, count = None, 0
        while True:
            page = self.core.list_node(label_selector=GPU_SELECTOR, limit=self.page_size, _continue=token)
            count += sum(1 for node in page.items if node.metadata.name)
            token = page.metadata._continue
            if not token:
                return count

    def ours_path(self) -> int:
        return sum(1 for _ in self.ours.list_nodes(label_selector=GPU_SELECTOR, page_size=self.page_size))

    def raw(self) -> int:
        token, pages = None, 0
        while True:
            started = time.perf_counter()
            data = self.core.list_node(label_selector=GPU_SELECTOR, limit=self.page_size, _continue=token,
                                       _preload_content=False).data
            self.page_walls.append(time.perf_counter() - started)
            self.page_bytes.append(len(data))
            pages += 1
            token = msgspec.json.decode(data, type=_ListHead).metadata.get("continue")
            if not token:
                return pages


def _passes(fn: Callable[[], int], runs: int, pids: dict[str, int]) -> dict[str, float]:
    """Median client CPU of ``runs`` passes after one warm-up, and the servers' CPU over those passes."""
    fn()
    cpu: list[float] = []
    server0 = {name: process_cpu_s(pid) for name, pid in pids.items()}
    wall0 = time.perf_counter()
    count = 0
    for _ in range(runs):
        started = time.process_time()
        count = fn()
        cpu.append(time.process_time() - started)
    out = {"count": count, "client_cpu": statistics.median(cpu), "wall": (time.perf_counter() - wall0) / runs}
    for name, pid in pids.items():
        out[name] = (process_cpu_s(pid) - server0[name]) / runs
    return out


def measure(scale: Scale) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (size, results) for each of ``scale.realkube_nodes``, on one cluster that grows between them."""
    from realkube.cluster import running
    from sim.identity import APP_PRINCIPAL_ID
    from sim.testing import start_sim

    with start_sim(scenario=SCENARIO) as sim:
        template = _template_node(sim)
        token = sim.control("POST", "/token", {"audience": AKS_AUDIENCE, "principal": APP_PRINCIPAL_ID})["access_token"]
        run_dir = Path(tempfile.mkdtemp(prefix="realkube-bench-"))
        try:
            with running(run_dir, token_webhook=sim.endpoints["control"] + "/tokenreview",
                         webhook_ca=sim.ca_bundle) as real:
                manager = real.processes.pop("kube-controller-manager")  # see the module docstring
                manager.terminate()
                manager.wait(timeout=15)
                _apply_rbac(real, APP_PRINCIPAL_ID)
                pids = {"apiserver": real.processes["kube-apiserver"].pid, "etcd": real.processes["etcd"].pid}
                paths = _Paths(_models_client(real), _app_client(real, token), scale.sweep_page_size)
                try:
                    created = 0
                    for n in sorted(scale.realkube_nodes):
                        started = time.monotonic()
                        create_nodes(real, template, range(created, n))
                        create_s, created = time.monotonic() - started, n
                        real.check_alive()
                        runs = 2 if n >= 5_000 else 3
                        models = _passes(paths.models, runs, pids)
                        ours = _passes(paths.ours_path, 5, pids)
                        paths.page_walls.clear()
                        paths.page_bytes.clear()
                        raw = _passes(paths.raw, 3, pids)
                        walls = paths.page_walls[len(paths.page_walls) // 4:]  # the warm-up pass's pages are dropped
                        if not models["count"] == ours["count"] == n:
                            raise RuntimeError(f"expected {n} nodes; models saw {models['count']}, ours {ours['count']}")
                        node_bytes = sum(paths.page_bytes) / len(paths.page_bytes) * raw["count"] / n
                        yield n, {"models": models, "ours": ours, "raw": raw, "page_walls": walls, "node_bytes": node_bytes,
                                  "create_s": create_s, "created": n}
                finally:
                    paths.ours.close()
                    paths.core.api_client.close()
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


def run(scale: Scale) -> list[Figure]:
    from realkube import build

    if not build.built():
        return _not_measured(scale, f"the real control plane is not built here ({build.bin_dir()}): run "
                                    "`make realkube-build` (kube-apiserver, etcd and the rest, from Go modules)")
    figures: list[Figure] = []
    done: set[int] = set()
    try:
        for n, r in measure(scale):
            done.add(n)
            models, ours, raw = r["models"], r["ours"], r["raw"]
            cpu_name, page_name = _figure_names(n, scale.sweep_page_size)
            walls = r["page_walls"]
            figures.append(measured(
                cpu_name, ours["client_cpu"] / n * 1e6, "us/node", baseline=models["client_cpu"] / n * 1e6,
                baseline_name="kubernetes models",
                note=f"{n:,} GPU nodes from kube-apiserver v1.37 in pages of {scale.sweep_page_size} "
                     f"(about {r['node_bytes'] / 1024:.1f} KiB of JSON per node); per listing: "
                     f"ours {ours['client_cpu']:.3f} CPU-s ({ours['wall']:.2f} s wall), models "
                     f"{models['client_cpu']:.3f} CPU-s ({models['wall']:.2f} s wall); kube-apiserver's own CPU "
                     f"{ours['apiserver']:.2f} s (ours) / {models['apiserver']:.2f} s (models), etcd "
                     f"{ours['etcd']:.2f} / {models['etcd']:.2f} s"))
            figures.append(measured(
                page_name, statistics.median(walls) * 1e3, "ms",
                note=f"median of {len(walls)} pages fetched as raw bytes (server + TLS + transfer, an upper bound); "
                     f"max {max(walls) * 1e3:.1f} ms; kube-apiserver {raw['apiserver']:.2f} CPU-s and etcd "
                     f"{raw['etcd']:.2f} CPU-s per listing of {n:,} nodes; nodes created in {r['create_s']:.1f} s"))
    except Exception as error:  # the sizes not reached say why
        why = f"{type(error).__name__}: {error}"[:300]
        figures += [f for f in _not_measured(scale, why)
                    if not any(f.name == name for n in done for name in _figure_names(n, scale.sweep_page_size))]
    return figures

"""Benchmark 2: the simulator's share of listing 5,000 realistic nodes (issue 2's speed claim).

Issue 2 says listing 5,000 realistic nodes must be dominated by the client, not by the simulator.
One simulator serves one cluster of 5,000 GPU nodes (labels, 14 conditions, images); this process
lists them page by page (500) three ways, after a warm-up:

- **raw**: the kubernetes client fetching the bytes only (``_preload_content=False``): server work,
  TLS and transfer, almost no client decoding;
- **models**: the kubernetes client decoding into ``V1Node`` models, as an SDK user does;
- **ours**: the app's ``KubeClient.list_nodes`` (msgspec).

The simulator's share is reported two ways: wall time of *raw* over wall time of the full listing,
and the simulator process's own CPU seconds (from /proc, utime + stime) over the sum of its CPU and
this client's CPU during the listing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench.figures import Figure, measured, not_measured
from bench.scale import Scale
from bench.simauth import SimTokenCredential

AKS_SERVER_APP = "6dae42f8-4368-4678-94ff-3960e28e3630"


class _Head(msgspec.Struct):
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(fn: Callable[[], int], pid: int) -> dict[str, float]:
    server0, client0, wall0 = process_cpu_s(pid), time.process_time(), time.perf_counter()
    count = fn()
    wall = time.perf_counter() - wall0
    return {"count": count, "wall": wall, "client_cpu": time.process_time() - client0,
            "server_cpu": process_cpu_s(pid) - server0}


def measure(nodes: int, *, page_size: int = 500) -> dict[str, dict[str, float]]:
    from kubernetes import client as k8s

    from shared.adapters.kube.client import KubeClient
    from sim.generate import large_fleet
    from sim.testing import start_sim

    scenario = large_fleet(clusters=1, nodes_per_cluster=nodes, pools_per_cluster=max(1, nodes // 500), seed=5)
    with start_sim(scenario=scenario, seed=5) as sim:
        cluster = sim.endpoints["clusters"][0]
        core = k8s.CoreV1Api(sim.kube_client(cluster["name"]))
        ours = KubeClient(sim.app_kubeconfig(cluster["name"]), SimTokenCredential(sim),
                          server_app_id=AKS_SERVER_APP, ca_bundle=sim.ca_bundle, cluster_id=cluster["id"])

        def raw() -> int:
            token, size = None, 0
            while True:
                data = core.list_node(limit=page_size, _continue=token, _preload_content=False).data
                size += 1
                token = msgspec.json.decode(data, type=_Head).metadata.get("continue")
                if not token:
                    return size

        def models() -> int:
            token, count = None, 0
            while True:
                page = core.list_node(limit=page_size, _continue=token)
                count += len(page.items)
                token = page.metadata._continue
                if not token:
                    return count

        def msgspec_path() -> int:
            return sum(1 for _ in ours.list_nodes(page_size=page_size))

        try:
            pid = sim.process.pid
            raw(), models(), msgspec_path()  # warm-up: connections, tokens, the simulator's caches
            return {"raw": _timed(raw, pid), "models": _timed(models, pid), "ours": _timed(msgspec_path, pid)}
        finally:
            ours.close()
            core.api_client.close()


def run(scale: Scale) -> list[Figure]:
    n = scale.share_nodes
    label = f"listing {n:,} nodes"
    try:
        r = measure(n)
    except Exception as error:
        why = f"{type(error).__name__}: {error}"[:300]
        return [not_measured(f"simulator share of wall time, {label} (kubernetes models)", "%", why),
                not_measured(f"simulator share of CPU, {label} (kubernetes models)", "%", why),
                not_measured(f"simulator share of CPU, {label} (our msgspec client)", "%", why)]
    count = int(r["models"]["count"])
    note = f"{count:,} nodes in pages of 500"

    def cpu_share(key: str) -> float:
        server, client = r[key]["server_cpu"], r[key]["client_cpu"]
        return 100.0 * server / (server + client) if server + client else 0.0

    return [
        measured(f"simulator share of wall time, {label} (kubernetes models)", 100.0 * r["raw"]["wall"] / r["models"]["wall"],
                 "%", target="< 50% (client-dominated)", check=lambda f: (f.value or 0) < 50,
                 note=f"{note}; raw fetch {r['raw']['wall']:.2f} s wall vs full models listing "
                      f"{r['models']['wall']:.2f} s (raw includes TLS and transfer, so this is an upper bound)"),
        measured(f"simulator share of CPU, {label} (kubernetes models)", cpu_share("models"), "%",
                 target="< 50% (client-dominated)", check=lambda f: (f.value or 0) < 50,
                 note=f"simulator {r['models']['server_cpu']:.2f} CPU-s vs client {r['models']['client_cpu']:.2f} CPU-s"),
        measured(f"simulator share of CPU, {label} (our msgspec client)", cpu_share("ours"), "%",
                 note=f"simulator {r['ours']['server_cpu']:.2f} CPU-s vs client {r['ours']['client_cpu']:.2f} CPU-s; "
                      f"wall {r['ours']['wall']:.2f} s"),
    ]

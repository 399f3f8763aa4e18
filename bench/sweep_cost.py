"""Benchmark 1: the health sweep's client CPU per node and peak memory, against the kubernetes client's models.

Issue 4 claims the sweep lists 20,000 GPU nodes over 50 clusters with at least 20x less client CPU
than listing the same nodes through the kubernetes client's model classes, and with memory bounded
by the page size rather than the fleet. For each fleet size (sim/generate.py's ``large_fleet``) one
simulator serves the fleet and this process is the client:

- **ours**: ``shared.remediation.sweep``'s per-cluster path as the timer runs it: ``KubeClient.list_nodes`` (raw
  JSON pages decoded by msgspec into NodeViews) with the GPU label selector, each page evaluated by
  ``shared.remediation.health.evaluate`` and folded into the sweep report;
- **baseline**: ``CoreV1Api.list_node`` with the same selector and page size, deserialised into the
  client's ``V1Node`` models (as an SDK user writes it), without any health evaluation on top.

CPU is ``time.process_time`` of this process (the simulator runs in its own process) over a pass
after a warm-up pass; memory is the ``tracemalloc`` peak of a separate pass (tracing slows code
down, so it never overlaps the CPU pass). Both paths page identically, so the memory figures compare
what one page costs in each representation.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgspec

from bench.figures import Figure, measured, not_measured, ratio_at_most
from bench.scale import Scale
from bench.simauth import SimTokenCredential

GPU_SELECTOR = "kubernetes.azure.com/accelerator=nvidia"
AKS_SERVER_APP = "6dae42f8-4368-4678-94ff-3960e28e3630"
MIB = 1024 * 1024
SAMPLE_CLUSTERS = 5
DECODE_SAMPLE_NODES = 2_000  # the in-memory decode comparison runs over at least this many nodes
# _STEADY: the simulated fleet was created moments before it is swept, so with the default startup grace
# every node would be skipped as "starting" and the evaluation would never look at a condition. The
# sweep is measured as it runs on a fleet in its steady state: no startup grace.


def _fleet(scale: Scale, nodes: int) -> dict[str, Any]:
    from sim.generate import large_fleet

    per_cluster = max(1, nodes // scale.sweep_clusters)
    return large_fleet(clusters=scale.sweep_clusters, nodes_per_cluster=per_cluster,
                       pools_per_cluster=max(1, min(10, per_cluster // 2)), seed=11, subscriptions=2)


class _Clients:
    """Per-cluster clients of both kinds for one running simulator."""

    def __init__(self, sim: Any, *, page_size: int) -> None:
        from kubernetes import client as k8s

        from shared.adapters.kube.client import KubeClient

        self.page_size = page_size
        credential = SimTokenCredential(sim)
        self.ours: dict[str, Any] = {}
        self.theirs: dict[str, Any] = {}
        for cluster in sim.endpoints["clusters"]:
            kubeconfig = sim.app_kubeconfig(cluster["name"])
            self.ours[cluster["id"]] = KubeClient(kubeconfig, credential, server_app_id=AKS_SERVER_APP,
                                                  ca_bundle=sim.ca_bundle, cluster_id=cluster["id"])
            self.theirs[cluster["id"]] = k8s.CoreV1Api(sim.kube_client(cluster["name"]))

    def sweep_ours(self) -> int:
        """The sweep's per-cluster path over every cluster; returns the GPU nodes seen."""
        from shared.remediation import sweep
        from shared.remediation.policy import RemediationPolicy

        policy = RemediationPolicy(page_size=self.page_size, startup_grace_s=0)  # see _STEADY
        report = sweep.SweepReport()
        observations: dict[str, float] = {}
        clock = SimpleNamespace(now=time.time)
        for cluster_id, kube in self.ours.items():
            ctx = SimpleNamespace(access=SimpleNamespace(kube=lambda _id, k=kube: k), clock=clock)
            cluster = SimpleNamespace(id=cluster_id, node_provisioning_mode="Manual")  # a ClusterInfo's fields it reads
            sweep._sweep_cluster(ctx, cluster, policy=policy, report=report,  # type: ignore[arg-type]
                                 observations=observations)
        return report.nodes

    def list_models(self, *, clusters: int | None = None) -> int:
        """The same listing through the kubernetes client's models; returns the GPU nodes seen."""
        seen = 0
        for api in list(self.theirs.values())[:clusters]:
            token = None
            while True:
                page = api.list_node(label_selector=GPU_SELECTOR, limit=self.page_size, _continue=token)
                for node in page.items:
                    seen += 1 if node.metadata.name else 0
                token = page.metadata._continue
                if not token:
                    break
        return seen

    def connect_models(self) -> None:
        """Open the baseline's connections (one tiny request per cluster) so no handshake is timed."""
        for api in self.theirs.values():
            api.list_node(label_selector=GPU_SELECTOR, limit=1)

    def raw_pages(self, *, clusters: int | None = None) -> list[bytes]:
        """Pages of GPU nodes as the server sent them (for the transport-free decode comparison)."""
        pages: list[bytes] = []
        for api in list(self.theirs.values())[:clusters]:
            token = None
            while True:
                data = api.list_node(label_selector=GPU_SELECTOR, limit=self.page_size, _continue=token,
                                     _preload_content=False).data
                pages.append(bytes(data))
                token = msgspec.json.decode(data, type=_ListHead).metadata.get("continue")
                if not token:
                    break
        return pages

    def close(self) -> None:
        for kube in self.ours.values():
            kube.close()
        for api in self.theirs.values():
            api.api_client.close()


class _ListHead(msgspec.Struct):
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


def decode_ours(pages: list[bytes]) -> int:
    """Our decoding and evaluation of pages already in memory (no transport)."""
    from shared.adapters.kube.decoding import decode_node_list
    from shared.remediation import health
    from shared.remediation.policy import RemediationPolicy

    policy, now, seen = RemediationPolicy(startup_grace_s=0), time.time(), 0  # see _STEADY
    for data in pages:
        nodes, _ = decode_node_list(data)
        seen += len(nodes)
        health.evaluate(nodes, now=now, policy=policy)
    return seen


def decode_models(pages: list[bytes]) -> int:
    """The kubernetes client's deserialisation of the same pages into V1NodeList models."""
    from kubernetes import client as k8s

    api, seen = k8s.ApiClient(), 0
    for data in pages:
        seen += len(api.deserialize(data.decode("utf-8"), "V1NodeList", "application/json").items)
    return seen


def _cpu(fn: Callable[[], int], *, runs: int) -> tuple[float, int]:
    """Median CPU seconds of ``runs`` passes of ``fn`` (after the caller's warm-up) and the node count."""
    samples, count = [], 0
    for _ in range(runs):
        gc.collect()
        started = time.process_time()
        count = fn()
        samples.append(time.process_time() - started)
    return statistics.median(samples), count


def _peak(fn: Callable[[], int]) -> int:
    """``tracemalloc`` peak bytes of one pass of ``fn``."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def measure_fleet(scale: Scale, nodes: int) -> dict[str, float]:
    from sim.testing import start_sim

    with start_sim(scenario=_fleet(scale, nodes), seed=11) as sim:
        clients = _Clients(sim, page_size=scale.sweep_page_size)
        try:
            clients.sweep_ours()  # warm-up: connections, tokens, the simulator's byte caches
            clients.connect_models()
            ours_cpu, ours_count = _cpu(clients.sweep_ours, runs=5)
            theirs_cpu, theirs_count = _cpu(clients.list_models, runs=3 if nodes <= 5_000 else 2)
            if ours_count != theirs_count or ours_count == 0:
                raise RuntimeError(f"the two paths saw different fleets: ours {ours_count}, models {theirs_count}")
            ours_peak = _peak(clients.sweep_ours)
            # Both paths hold one page at a time and every cluster has the same size, so the baseline's
            # (slow, traced) peak is taken over a few clusters only; so is the in-memory decode.
            theirs_peak = _peak(lambda: clients.list_models(clusters=SAMPLE_CLUSTERS))
            per_cluster = max(1, nodes // scale.sweep_clusters)
            pages = clients.raw_pages(clusters=max(SAMPLE_CLUSTERS, -(-DECODE_SAMPLE_NODES // per_cluster)))
            clients.page_size = scale.sweep_fixed_page
            ours_peak_fixed = _peak(clients.sweep_ours)
        finally:
            clients.close()
    decode_ours(pages)  # warm-up, as for the transport pass
    ours_decode, sampled = _cpu(lambda: decode_ours(pages), runs=5)
    theirs_decode, _ = _cpu(lambda: decode_models(pages), runs=1)
    per_page = min(scale.sweep_page_size, max(1, nodes // scale.sweep_clusters))
    return {"nodes": ours_count, "ours_cpu": ours_cpu, "theirs_cpu": theirs_cpu, "ours_peak": ours_peak,
            "theirs_peak": theirs_peak, "per_page": per_page,
            "ours_decode": ours_decode / sampled, "theirs_decode": theirs_decode / sampled, "ours_peak_fixed": ours_peak_fixed,
            "decode_sample": sampled}


def run(scale: Scale) -> list[Figure]:
    figures: list[Figure] = []
    results: dict[int, dict[str, float]] = {}
    for size in scale.sweep_fleets:
        label = f"{size:,} GPU nodes / {scale.sweep_clusters} clusters"
        try:
            r = measure_fleet(scale, size)
        except Exception as error:  # the figure says why; the other sizes still run
            why = f"{type(error).__name__}: {error}"[:300]
            figures += [not_measured(f"sweep CPU per node, {label}", "us/node", why),
                        not_measured(f"sweep decode+evaluate CPU per node (no transport), {label}", "us/node", why),
                        not_measured(f"sweep peak memory, {label}", "MiB", why)]
            continue
        results[size] = r
        note = (f"{int(r['nodes']):,} nodes listed, pages of up to {int(r['per_page'])} nodes; the baseline's "
                f"memory is traced over {SAMPLE_CLUSTERS} clusters (one page at a time, clusters alike)")
        if size == max(scale.sweep_fleets):
            # Issue 4 sets its target on this fleet (20,000 GPU nodes over 50 clusters at full size).
            cpu = measured(f"sweep CPU per node, {label}", r["ours_cpu"] / r["nodes"] * 1e6, "us/node",
                           baseline=r["theirs_cpu"] / r["nodes"] * 1e6, baseline_name="kubernetes models",
                           target="ratio <= 0.05 (20x less)", check=ratio_at_most(0.05), note=note)
        else:
            # Smaller fleets have smaller clusters: a page per cluster of a few dozen nodes, where the
            # request itself (TLS record, headers, ~0.3 ms) weighs on both paths; reported, not targeted.
            cpu = measured(f"sweep CPU per node, {label}", r["ours_cpu"] / r["nodes"] * 1e6, "us/node",
                           baseline=r["theirs_cpu"] / r["nodes"] * 1e6, baseline_name="kubernetes models",
                           note=note + f"; {int(r['per_page'])} nodes per request, so the per-request cost shows")
        figures.append(cpu)
        figures.append(measured(f"sweep decode+evaluate CPU per node (no transport), {label}",
                                r["ours_decode"] * 1e6, "us/node",
                                baseline=r["theirs_decode"] * 1e6, baseline_name="kubernetes models",
                                note=f"the same page bytes ({int(r['decode_sample']):,} nodes) decoded in memory: the cost "
                                     "of the representation alone, without HTTP and TLS (which both paths pay alike)"))
        figures.append(measured(f"sweep peak memory, {label}", r["ours_peak"] / MIB, "MiB",
                                baseline=r["theirs_peak"] / MIB, baseline_name="kubernetes models", note=note))
    if len(results) >= 2:
        small, large = min(results), max(results)
        growth = large / small
        figures.append(measured(
            f"sweep CPU per node growth, {small:,} -> {large:,} nodes", results[large]["ours_cpu"] / results[large]["nodes"]
            * 1e6, "us/node", baseline=results[small]["ours_cpu"] / results[small]["nodes"] * 1e6,
            baseline_name=f"at {small:,} nodes", target="ratio ~1 (total cost linear in the fleet)",
            note=f"fleet grows {growth:.0f}x; a ratio near 1 means total CPU grows linearly with the fleet"))
        fixed = scale.sweep_fixed_page
        # The growth of the memory peak is judged from the smallest fleet whose clusters span at least two
        # pages of ``fixed`` nodes: with one page per cluster, no page is ever replaced by the next one.
        multi = [n for n in results if results[n]["nodes"] / scale.sweep_clusters >= 2 * fixed and n != large]
        base = min(multi) if multi else small
        figures.append(measured(
            f"sweep peak memory growth at pages of {fixed}, {base:,} -> {large:,} nodes",
            results[large]["ours_peak_fixed"] / MIB, "MiB", baseline=results[base]["ours_peak_fixed"] / MIB,
            baseline_name=f"at {base:,} nodes", target="ratio ~1 (bounded by the page, not the fleet)",
            check=lambda f: f.ratio is not None and f.ratio < 1.5,
            note=f"the fleet grows {large / base:.0f}x while every page holds {fixed} nodes; at {small:,} nodes (one page "
                 f"per cluster) the peak was {results[small]['ours_peak_fixed'] / MIB:.2f} MiB; with the default page "
                 f"size ({scale.sweep_page_size}) pages grow with the clusters, from {int(results[small]['per_page'])} to "
                 f"{int(results[large]['per_page'])} nodes (see the per-size figures)"))
    return figures

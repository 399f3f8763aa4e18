"""Large fleets for benchmarks: N clusters x M GPU nodes, as a scenario dict.

The shape follows what the steward sees in a big estate: a system pool per cluster, GPU pools of a
few sizes (managed and unmanaged T4/A100), zones, optionally a workload per pool and a fraction of
nodes that start unhealthy. Deterministic in ``seed``.
"""

from __future__ import annotations

import random
from typing import Any

_GPU_SIZES = ("Standard_NC4as_T4_v3", "Standard_NC8as_T4_v3", "Standard_NC24ads_A100_v4", "Standard_NC16as_T4_v3")


def large_fleet(*, clusters: int = 100, nodes_per_cluster: int = 1000, pools_per_cluster: int = 10, seed: int = 0,
                pods_per_node: int = 0, unhealthy_fraction: float = 0.0, subscriptions: int = 4,
                speed: float = 1.0) -> dict[str, Any]:
    """A scenario with ``clusters`` clusters of ``nodes_per_cluster`` GPU nodes each."""
    rng = random.Random(seed)
    pools_per_cluster = max(1, min(pools_per_cluster, nodes_per_cluster or 1))
    subs: list[dict[str, Any]] = []
    for s in range(max(1, subscriptions)):
        subs.append({"id": f"00000000-0000-0000-0000-{s + 1:012d}", "quotas": [], "clusters": []})
    conditions = []
    for i in range(clusters):
        sub = subs[i % len(subs)]
        name = f"fleet{i:03d}"
        pools: list[dict[str, Any]] = [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 3,
                                        "availabilityZones": ["1", "2", "3"]}]
        workloads: list[dict[str, Any]] = []
        per_pool, extra = divmod(nodes_per_cluster, pools_per_cluster)
        for p in range(pools_per_cluster):
            count = per_pool + (1 if p < extra else 0)
            size = _GPU_SIZES[rng.randrange(len(_GPU_SIZES))]
            managed = rng.random() < 0.5
            pool: dict[str, Any] = {"name": f"gpu{p}", "mode": "User", "vmSize": size, "count": count,
                                    "availabilityZones": ["1", "2", "3"],
                                    "nodeTaints": ["sku=gpu:NoSchedule"],
                                    "nodeLabels": {"team": f"team{rng.randrange(20)}"},
                                    "npd": True, "device_plugin": True}
            if managed:
                pool["gpuProfile"] = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
            pools.append(pool)
            if pods_per_node and count:
                workloads.append({"kind": "Deployment", "name": f"train-gpu{p}", "namespace": "ml",
                                  "replicas": count * pods_per_node, "resources": {"cpu": "100m", "memory": "256Mi"},
                                  "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu",
                                                   "effect": "NoSchedule"}],
                                  "nodeSelector": {"kubernetes.azure.com/agentpool": f"gpu{p}"},
                                  "pdb": {"maxUnavailable": "10%"}, "terminationGracePeriodSeconds": 5})
            for n in range(count):
                if unhealthy_fraction and rng.random() < unhealthy_fraction:
                    conditions.append({"at": 0, "cluster": name, "pool": f"gpu{p}", "node_index": n,
                                       "type": "UnhealthyNvidiaDevicePlugin", "status": "True", "fixed_by": "restart"})
        sub["clusters"].append({"name": name, "resource_group": f"rg-{name}", "location": "eastus",
                                "tags": {"gpu-fleet-steward": "enabled"}, "pools": pools, "workloads": workloads})
    for sub in subs:
        sub["quotas"] = [{"location": "eastus", "family": fam, "limit": 10_000_000} for fam in (
            "standardNCASv3_T4Family", "StandardNCADSA100v4Family", "standardDSv5Family")]
    return {"seed": seed, "clock": {"speed": speed}, "subscriptions": subs, "conditions": conditions}


def measure_list(*, nodes: int = 5000, page_size: int = 500, seed: int = 1) -> dict[str, Any]:
    """How much of listing ``nodes`` realistic nodes with the kubernetes client is the simulator's.

    Starts a simulator with one cluster of ``nodes`` GPU nodes, then lists them twice with the
    kubernetes Python client: once reading the raw bytes only (server + TLS + transfer) and once
    decoding into the client's models as an SDK user would. Returns both times and the share.
    """
    import re
    import time

    from kubernetes import client

    from sim.testing import start_sim

    sc = large_fleet(clusters=1, nodes_per_cluster=nodes, pools_per_cluster=max(1, nodes // 500), seed=seed)
    with start_sim(scenario=sc, seed=seed) as sim:
        core = client.CoreV1Api(sim.kube_client(sim.endpoints["clusters"][0]["name"]))

        def pages(decode: bool) -> tuple[int, int]:
            token, count, size = None, 0, 0
            while True:
                kwargs: dict[str, Any] = {"limit": page_size} if page_size else {}
                if token:
                    kwargs["_continue"] = token
                if decode:
                    page = core.list_node(**kwargs)
                    count += len(page.items)
                    token = page.metadata._continue
                else:
                    data = core.list_node(_preload_content=False, **kwargs).data
                    size += len(data)
                    m = re.search(rb'"continue":"([^"]*)"', data[:400])
                    token = m.group(1).decode() if m else None
                if not token:
                    return count, size

        pages(False)  # warm up connections and caches
        started = time.perf_counter()
        _, size = pages(False)
        raw = time.perf_counter() - started
        started = time.perf_counter()
        count, _ = pages(True)
        full = time.perf_counter() - started
    return {"nodes": count, "bytes": size, "page_size": page_size, "raw_fetch_s": round(raw, 3),
            "client_list_s": round(full, 3), "simulator_share": round(raw / full, 4)}

"""Listing many realistic nodes is dominated by the client's decoding, not by the simulator."""

from __future__ import annotations

import time

from sim.generate import large_fleet, measure_list
from sim.http import Headers, Request
from sim.kube_api import KubeApi
from sim.scenario import build_fleet
from sim.tokens import AKS_AUDIENCES


def test_the_simulator_is_a_small_share_of_a_kubernetes_client_node_list() -> None:
    result = measure_list(nodes=1000, page_size=250)
    assert result["nodes"] == 1003  # 1,000 GPU nodes + the system pool
    assert result["simulator_share"] < 0.3, result  # measured 3-7% (5,000 nodes: ~3%)


def test_a_cached_list_of_2000_nodes_is_served_by_joining_bytes() -> None:
    fleet = build_fleet(large_fleet(clusters=1, nodes_per_cluster=2000, pools_per_cluster=4, seed=2), seed=2)
    cluster = next(iter(fleet.clusters.values()))
    api = KubeApi(fleet)
    token = fleet.tokens.issue(AKS_AUDIENCES[0])[0]
    req = Request("GET", f"/k8s/{cluster.subscription}/{cluster.resource_group}/{cluster.name}/api/v1/nodes",
                  Headers({"Authorization": f"Bearer {token}"}))
    api.handle(req)  # fills the per-node byte caches
    started = time.perf_counter()
    resp = api.handle(req)
    elapsed = time.perf_counter() - started
    assert resp.status == 200 and resp.body.count(b'"kind":"Node"') == 2003
    assert elapsed < 0.5

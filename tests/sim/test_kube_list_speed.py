"""Listing many realistic nodes is dominated by the client's decoding, not by the simulator.

How small the simulator's share is, is measured by `make bench` (sim_share) and
`python -m sim measure-list`; these tests pin the mechanism, never a timing.
"""

from __future__ import annotations

from unittest import mock

from sim.core.http import Headers, Request
from sim.generate import large_fleet, measure_list
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube import objects
from sim.kube.api import KubeApi
from sim.scenario import build_fleet


def test_the_list_measurement_reports_both_sides_of_a_kubernetes_client_node_list() -> None:
    result = measure_list(nodes=200, page_size=50)
    assert result["nodes"] == 203  # 200 GPU nodes + the system pool
    assert 0.0 < result["simulator_share"] < 1.0, result


def test_a_repeated_list_is_served_from_cached_bytes_without_serialising_any_node_again() -> None:
    fleet = build_fleet(large_fleet(clusters=1, nodes_per_cluster=500, pools_per_cluster=4, seed=2), seed=2)
    cluster = next(iter(fleet.clusters.values()))
    api = KubeApi(fleet)
    token = fleet.tokens.issue(AKS_AUDIENCES[0])[0]
    req = Request("GET", f"/k8s/{cluster.subscription}/{cluster.resource_group}/{cluster.name}/api/v1/nodes",
                  Headers({"Authorization": f"Bearer {token}"}))
    first = api.handle(req)  # fills the per-node byte caches
    with mock.patch.object(objects, "ENCODER") as encoder:
        second = api.handle(req)
    assert second.status == 200 and second.body.count(b'"kind":"Node"') == first.body.count(b'"kind":"Node"') == 503
    encoder.encode.assert_not_called()

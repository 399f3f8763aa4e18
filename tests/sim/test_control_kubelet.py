"""The control API can stop a node's kubelet, so that HTTP-driven tests and the soak can leave pods
Terminating on a node nothing confirms them on (issue 10, sim 4).

Pods being deleted on a node whose kubelet is gone stay Terminating past their grace period
(kubernetes/kubernetes pkg/kubelet/status/status_manager.go: only the kubelet confirms a pod stopped);
they go once the kubelet is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sim.testing import SimError, SimHandle, start_sim

SCENARIO: dict[str, Any] = {
    "seed": 5, "clock": {"manual": True},
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000f5", "clusters": [{
        "name": "k1", "resource_group": "rg-k1",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "work", "vmSize": "Standard_D4s_v5", "count": 1}],
        "workloads": [{"kind": "Pod", "name": "solo", "namespace": "lab", "terminationGracePeriodSeconds": 5,
                       "nodeSelector": {"agentpool": "work"}}]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=5) as handle:
        yield handle


def _pod(sim: SimHandle) -> dict[str, Any] | None:
    pods = [p for p in sim.control("GET", "/state")["clusters"][0].get("pods", []) if p.get("name") == "solo"]
    return pods[0] if pods else None


def test_a_stopped_kubelet_leaves_a_deleted_pod_terminating_until_it_is_back(sim: SimHandle) -> None:
    import json
    import ssl
    import urllib.request

    cluster = sim.endpoints["clusters"][0]
    node = next(n for n in sim.control("GET", "/state")["clusters"][0]["nodes"] if "work" in n["name"])["name"]
    answer = sim.control("POST", "/kubelet", {"cluster": "k1", "node": node, "ready": False})
    assert answer == {"cluster": "k1", "node": node, "ready": False}

    token = sim.control("POST", "/token", {"audience": "6dae42f8-4368-4678-94ff-3960e28e3630"})["access_token"]
    ctx = ssl.create_default_context(cafile=sim.endpoints["ca_bundle"])
    request = urllib.request.Request(f"{cluster['kube_server']}/api/v1/namespaces/lab/pods/solo", method="DELETE",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=ctx) as response:
        assert json.loads(response.read())["metadata"]["deletionTimestamp"]
    sim.control("POST", "/advance", {"seconds": 60})  # far past the 5 s grace period
    assert _pod(sim) is not None, "a pod nothing confirmed stopped must stay Terminating"

    sim.control("POST", "/kubelet", {"cluster": "k1", "node": node, "ready": True})
    sim.control("POST", "/advance", {"seconds": 2})
    assert _pod(sim) is None


def test_the_kubelet_endpoint_checks_what_it_is_given(sim: SimHandle) -> None:
    with pytest.raises(SimError):
        sim.control("POST", "/kubelet", {"cluster": "k1", "node": "nope", "ready": False})
    with pytest.raises(SimError):
        sim.control("POST", "/kubelet", {"cluster": "k1", "node": "x", "ready": "no"})


def test_the_rbac_endpoint_takes_an_arm_action_away_and_gives_it_back(sim: SimHandle) -> None:
    action = "Microsoft.ContainerService/managedClusters/agentPools/write"
    assert sim.control("POST", "/rbac", {"revoke": [action]}) == {"revoked": [action]}
    assert sim.control("POST", "/rbac", {"restore": [action]}) == {"revoked": []}
    with pytest.raises(SimError):
        sim.control("POST", "/rbac", {"revoke": action})

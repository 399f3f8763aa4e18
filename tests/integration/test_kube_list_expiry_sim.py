"""The app's paginated lists against the simulator when the continue token expires mid-list.

The simulator compacts its etcd as kube-apiserver does (every 5 minutes of sim time, a token lives
one to two intervals) and answers the expired token with the real 410 Expired. The app's
``KubeClient`` must start the list again, hand every node over once, and the health sweep built on it
must count each node once. The clock is manual: the expiry happens exactly between two pages.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from shared.kernel.clock import ManualClock
from sim.testing import SimHandle, start_sim

AKS_APP = "6dae42f8-4368-4678-94ff-3960e28e3630"
SCENARIO: dict[str, Any] = {
    "seed": 9,
    "clock": {"manual": True},
    "timings": {"node_ready_s": 1, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000f9", "clusters": [{
        "name": "paged", "resource_group": "rg-paged",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "work", "mode": "User", "vmSize": "Standard_D4s_v5", "count": 6}],
        "workloads": [{"kind": "Pod", "name": f"p{i}", "namespace": "default"} for i in range(5)]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=9) as handle:
        handle.control("POST", "/advance", {"seconds": 30})
        yield handle


class _SimCredential:
    def __init__(self, sim: SimHandle) -> None:
        self.sim = sim

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken(self.sim.token(AKS_APP), int(time.time()) + 3600)


def _kube(sim: SimHandle, *, expire_before_request: int) -> tuple[Any, list[Mapping[str, Any]]]:
    """A real KubeClient whose ``expire_before_request``-th node page request (1-based) is preceded by
    the sim clock moving on by two compaction intervals: its continue token is then expired."""
    from shared.adapters.kube.client import KubeClient

    with open(sim.ca_bundle, "rb") as f:  # as ARM's listClusterUserCredential hands it out: CA inline
        ca = base64.b64encode(f.read()).decode()
    kubeconfig = (f"apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                  f"clusters: [{{name: c, cluster: {{server: \"{sim.cluster('paged')['kube_server']}\", "
                  f"certificate-authority-data: {ca}}}}}]\n"
                  f"contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\nusers: [{{name: u, user: {{}}}}]\n").encode()
    kube = KubeClient(kubeconfig, _SimCredential(sim), server_app_id=AKS_APP, ca_bundle=sim.ca_bundle,
                      clock=ManualClock(0.0), cluster_id="paged")
    real = kube._get_json
    calls: list[Mapping[str, Any]] = []

    def get_json(path: str, query: Mapping[str, Any]) -> bytes:
        calls.append(dict(query))
        if len(calls) == expire_before_request:
            assert query.get("continue"), "the expiry is meant to hit a continued page"
            sim.control("POST", "/advance", {"seconds": 601})
        return real(path, query)

    kube._get_json = get_json
    return kube, calls


def all_node_names(sim: SimHandle) -> list[str]:
    kube, _ = _kube(sim, expire_before_request=0)
    return sorted(n.name for n in kube.list_nodes(page_size=500))


def test_a_node_list_whose_token_expires_mid_list_starts_again_and_hands_over_each_node_once(sim: SimHandle) -> None:
    everyone = all_node_names(sim)
    assert len(everyone) == 7
    kube, calls = _kube(sim, expire_before_request=3)
    names = [n.name for n in kube.list_nodes(page_size=2)]
    assert sorted(names) == everyone and len(names) == len(set(names))
    assert calls[2]["continue"] and not calls[3]["continue"], "after the 410 the list started without a token"
    assert sum(1 for c in calls if not c["continue"]) == 2


def test_a_pod_list_whose_token_expires_mid_list_is_listed_again_from_scratch(sim: SimHandle) -> None:
    from shared.adapters.kube.client import KubeClient

    kube, _ = _kube(sim, expire_before_request=0)
    assert isinstance(kube, KubeClient)
    fresh = sorted(p.name for p in kube.list_pods(namespace="default"))
    core = kube._core
    plain = core.list_namespaced_pod
    seen: list[Any] = []

    def list_namespaced_pod(namespace: str, **kw: Any) -> Any:
        seen.append(kw.get("_continue"))
        if len(seen) == 2:
            sim.control("POST", "/advance", {"seconds": 601})
        return plain(namespace, **kw)

    core.list_namespaced_pod = list_namespaced_pod
    pods = kube.list_pods(namespace="default", page_size=2)
    assert sorted(p.name for p in pods) == fresh and len(pods) == len(fresh) == 5
    assert seen[1] and seen[2] is None, "the expired token was not retried: a fresh list followed"


def test_the_sweep_counts_each_node_once_when_the_list_restarts(sim: SimHandle) -> None:
    from shared.remediation import sweep
    from shared.remediation.policy import RemediationPolicy

    everyone = all_node_names(sim)
    kube, calls = _kube(sim, expire_before_request=3)
    clock = ManualClock(time.time())
    ctx = SimpleNamespace(access=SimpleNamespace(kube=lambda _cluster: kube), clock=clock)
    policy = dataclasses.replace(RemediationPolicy(), node_selector="", page_size=2)
    report = sweep.SweepReport()
    cluster = SimpleNamespace(id="paged", node_provisioning_mode="Manual")
    sweep._sweep_cluster(ctx, cluster, policy=policy, report=report, observations={})  # type: ignore[arg-type]
    assert report.nodes == len(everyone)
    assert sum(1 for c in calls if not c["continue"]) == 2, "the list did restart"

"""The stack check names each thing that keeps a GPU pool from working, per install profile."""

from __future__ import annotations

from typing import Any

import pytest

from shared.fleet.stack import evaluate_stack
from shared.kernel.ports import Condition, NodeView, PoolInfo
from tests.unit.fakes_pool import HEALTHY_NPD, make_node

NOW = 1_764_684_000.0
DCGM = {"kubernetes.azure.com/dcgm-exporter": "enabled"}
GPU = {"cpu": "4", "nvidia.com/gpu": "1"}


def pool(install: str = "managed", *, mig: str | None = None, state: str = "Succeeded") -> PoolInfo:
    nvidia: dict[str, Any] = {"managementMode": "Managed" if install == "managed" else "Unmanaged"}
    if mig:
        nvidia["migStrategy"] = mig
    return PoolInfo(cluster_id="/subscriptions/s/resourceGroups/r/providers/Microsoft.ContainerService/managedClusters/c",
                    name="gpunp", properties={"provisioningState": state, "vmSize": "Standard_NC4as_T4_v3",
                                              "gpuProfile": {"driver": "None" if install == "none" else "Install",
                                                             "nvidia": nvidia}})


def healthy(name: str = "n1", **kw: Any) -> NodeView:
    return make_node(name, labels=kw.pop("labels", DCGM), allocatable=kw.pop("allocatable", GPU),
                     conditions=kw.pop("conditions", HEALTHY_NPD), **kw)


def bare(name: str = "n1", **kw: Any) -> NodeView:
    return make_node(name, **kw)


def test_a_managed_pool_with_every_component_working_is_ok() -> None:
    report = evaluate_stack(pool=pool(), nodes=[healthy("n1"), healthy("n2")], expected_count=2, now=NOW)
    assert report.ok and report.problems == ()
    assert (report.ready_nodes, report.gpu_allocatable, dict(report.resources)) == (2, 2, {"nvidia.com/gpu": 2})


@pytest.mark.parametrize(("pool_", "nodes", "expected", "words"), [
    pytest.param(pool(), [healthy()], 2, "1 of 2 nodes are Ready", id="the node count is not reached yet"),
    pytest.param(pool(), [], 1, "0 of 1 nodes are Ready", id="no nodes at all"),
    pytest.param(pool(), [healthy(ready=False)], 1, "node n1 is not Ready", id="a node is NotReady"),
    pytest.param(pool(), [healthy(allocatable={"cpu": "4"})], 1, "no allocatable nvidia.com/gpu",
                 id="no GPU advertised on a managed pool"),
    pytest.param(pool(), [healthy(allocatable={"nvidia.com/gpu": "0"})], 1, "no allocatable nvidia.com/gpu",
                 id="zero GPUs advertised"),
    pytest.param(pool(mig="Mixed"), [healthy()], 1, "no allocatable nvidia.com/mig-*",
                 id="MIG mixed without MIG resources"),
    pytest.param(pool(), [healthy(labels={})], 1, "dcgm-exporter=enabled", id="the DCGM exporter label is missing"),
    pytest.param(pool(), [healthy(conditions=HEALTHY_NPD[:1])], 1, "no UnhealthyNvidiaDCGMServices condition",
                 id="an NPD condition is not reported yet"),
    pytest.param(pool(), [healthy(conditions=(Condition("UnhealthyNvidiaDevicePlugin", "True", reason="PluginDown"),
                                              HEALTHY_NPD[1]))], 1, "UnhealthyNvidiaDevicePlugin=True: PluginDown",
                 id="the device plugin is reported unhealthy"),
    pytest.param(pool(), [healthy(conditions=(HEALTHY_NPD[0], Condition("UnhealthyNvidiaDCGMServices", "Unknown")))],
                 1, "UnhealthyNvidiaDCGMServices=Unknown", id="DCGM health is unknown"),
    pytest.param(pool(state="Updating"), [healthy()], 1, "is Updating, not Succeeded", id="the pool is still updating"),
    pytest.param(pool("driverOnly"), [bare(conditions=(Condition("UnhealthyNvidiaDevicePlugin", "True"),))], 1,
                 "UnhealthyNvidiaDevicePlugin=True", id="a GPU condition that is True fails any profile"),
])
def test_each_problem_is_named(pool_: PoolInfo, nodes: list[NodeView], expected: int, words: str) -> None:
    report = evaluate_stack(pool=pool_, nodes=nodes, expected_count=expected, now=NOW)
    assert not report.ok
    assert any(words in p for p in report.problems), report.problems


@pytest.mark.parametrize("install", ["driverOnly", "none"])
def test_an_unmanaged_pool_needs_only_ready_nodes(install: str) -> None:
    report = evaluate_stack(pool=pool(install), nodes=[bare("n1"), bare("n2")], expected_count=2, now=NOW)
    assert report.ok and report.gpu_allocatable == 0


def test_an_unmanaged_pool_still_reports_what_a_team_installed_device_plugin_advertises() -> None:
    report = evaluate_stack(pool=pool("driverOnly"), nodes=[bare(allocatable=GPU)], expected_count=1, now=NOW)
    assert report.ok and dict(report.resources) == {"nvidia.com/gpu": 1}


def test_mig_mixed_counts_mig_instances_as_the_gpu_resource() -> None:
    node = healthy(allocatable={"nvidia.com/mig-1g.10gb": "7", "cpu": "24"})
    report = evaluate_stack(pool=pool(mig="Mixed"), nodes=[node], expected_count=1, now=NOW)
    assert report.ok and report.gpu_allocatable == 7 and dict(report.resources) == {"nvidia.com/mig-1g.10gb": 7}


def test_mig_single_advertises_plain_gpus() -> None:
    node = healthy(allocatable={"nvidia.com/gpu": "7"})
    assert evaluate_stack(pool=pool(mig="Single"), nodes=[node], expected_count=1, now=NOW).gpu_allocatable == 7


def test_a_not_ready_node_says_for_how_long() -> None:
    report = evaluate_stack(pool=pool(), nodes=[healthy(ready=False)], expected_count=0, now=NOW)
    assert any("not Ready for 1000s" in p for p in report.problems)


def test_gpus_of_not_ready_nodes_are_not_counted() -> None:
    report = evaluate_stack(pool=pool(), nodes=[healthy("a"), healthy("b", ready=False)], expected_count=1, now=NOW)
    assert report.gpu_allocatable == 1 and report.ready_nodes == 1

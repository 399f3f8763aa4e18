"""The sweep on node auto-provisioning clusters: Karpenter's GPU nodes carry neither
``kubernetes.azure.com/accelerator`` nor ``kubernetes.azure.com/agentpool``
(Azure/karpenter-provider-azure designs/0006-requirements-and-labels.md, #837), so they are found by
``karpenter.azure.com/sku-gpu-manufacturer=nvidia`` and pooled by ``karpenter.sh/nodepool``."""

from __future__ import annotations

import msgspec
import pytest

from shared.kernel.ports import NodeView
from shared.remediation import health, sweep
from shared.remediation import records as remediation
from shared.remediation.policy import DEVICE_PLUGIN, RemediationPolicy
from tests.unit.fakes_remediation import SUB, T0, Fleet, make_node

NAP_PROVIDER = f"azure:///subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachines/"


def karpenter_node(name: str, *, broken: bool = False, accelerator: bool = False) -> NodeView:
    conds = {DEVICE_PLUGIN: ("True" if broken else "False", T0 - 3600)}
    node = make_node(name, conditions=conds)
    labels = {"karpenter.sh/nodepool": "gpu-np", "karpenter.azure.com/sku-gpu-manufacturer": "nvidia",
              "karpenter.azure.com/sku-gpu-count": "1", "kubernetes.azure.com/role": "agent"}
    if accelerator:
        labels["kubernetes.azure.com/accelerator"] = "nvidia"
    return msgspec.structs.replace(node, labels=labels, provider_id=NAP_PROVIDER + name)


def fleet_of(mode: str) -> Fleet:
    fleet = Fleet(policy=RemediationPolicy())
    fleet.pool(2)
    fleet.kube.add(karpenter_node("aks-gpu-np-aaaaa", broken=True), karpenter_node("aks-gpu-np-bbbbb", accelerator=True))
    fleet.update_cluster(node_provisioning_mode=mode)
    return fleet


def test_a_nap_gpu_node_is_found_by_karpenters_label_and_reported_with_its_nodepool() -> None:
    fleet = fleet_of("Auto")
    report = sweep.sweep(fleet.ctx())
    assert report.nodes == 4, "two agent-pool nodes and two Karpenter nodes, each once"
    (fault,) = report.faults
    assert (fault.node, fault.pool) == ("aks-gpu-np-aaaaa", "gpu-np")
    (event,) = [e for e in fleet.events.published if e["type"] == remediation.UNHEALTHY_EVENT]
    assert event["data"]["pool"] == "gpu-np" and event["subject"].endswith("/agentPools/gpu-np/nodes/aks-gpu-np-aaaaa")


def test_on_a_cluster_without_node_auto_provisioning_only_the_accelerator_label_is_listed() -> None:
    fleet = fleet_of("Manual")
    report = sweep.sweep(fleet.ctx())
    assert report.nodes == 3 and report.faults == []


@pytest.mark.parametrize(("node", "nap", "pool", "selector"), [
    (make_node("aks-gpu-0"), False, "gpu", "kubernetes.azure.com/agentpool=gpu"),
    (karpenter_node("aks-gpu-np-x"), True, "gpu-np", "karpenter.sh/nodepool=gpu-np"),
], ids=["vmss-agent-pool-node", "karpenter-node"])
def test_a_nodes_pool_is_its_agent_pool_or_its_nodepool(node: NodeView, nap: bool, pool: str, selector: str) -> None:
    assert health.is_karpenter_node(node) is nap
    assert (health.pool_of(node), health.pool_selector(node)) == (pool, selector)


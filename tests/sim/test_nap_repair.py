"""Node auto-provisioning (Karpenter) GPU nodes: the labels Karpenter on AKS really sets, NodeClaim deletion,
and the app repairing such a node the Karpenter way.

Sources: Azure/karpenter-provider-azure pkg/apis/v1beta1/labels.go and designs/0006-requirements-and-labels.md
(``kubernetes.azure.com/accelerator`` and ``kubernetes.azure.com/agentpool`` are not written on Karpenter
nodes; #837), pkg/providers/imagefamily/labels/labels.go; kubernetes-sigs/karpenter
pkg/controllers/node/termination (deleting a NodeClaim terminates its node and VM).
"""

from __future__ import annotations

from typing import Any

from sim.model import Cluster, Fleet
from sim.scenario import build_fleet

SUB = "00000000-0000-0000-0000-0000000000c7"
COND = "UnhealthyNvidiaDevicePlugin"


def nap_scenario(*, manual: bool = True) -> dict[str, Any]:
    return {
        "seed": 7, "clock": {"manual": manual},
        "timings": {"node_ready_s": 10, "pod_start_s": 2, "nap_provision_s": 20, "nap_terminate_s": 10},
        "subscriptions": [{"id": SUB, "clusters": [{
            "name": "auto", "resource_group": "rg-auto", "node_provisioning_mode": "Auto",
            "tags": {"gpu-fleet-steward": "enabled"},
            "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}],
            "karpenter": {
                "nodeclasses": [{"name": "managed", "tags": {"EnableManagedGPUExperience": "true"}}],
                "nodepools": [{"name": "gpu", "node_class": "managed",
                               "requirements": [{"key": "karpenter.azure.com/sku-gpu-manufacturer", "operator": "In",
                                                 "values": ["nvidia"]}],
                               "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]}]},
            "workloads": [{"kind": "Deployment", "name": "infer", "namespace": "default", "replicas": 1,
                           "resources": {"cpu": "1", "nvidia.com/gpu": "1"},
                           "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu",
                                            "effect": "NoSchedule"}]}]}]}],
    }


def fleet_with_a_nap_node() -> tuple[Fleet, Cluster, str]:
    fleet = build_fleet(nap_scenario())
    fleet.advance(40)
    cluster = fleet.cluster_by_name("auto")
    assert cluster is not None
    (name,) = [n for n, node in cluster.nodes.items() if node.nap]
    return fleet, cluster, name


def test_a_nap_gpu_node_carries_karpenters_labels_and_not_the_agent_pool_ones() -> None:
    _fleet, c, name = fleet_with_a_nap_node()
    node = c.nodes[name]
    labels = node.labels
    assert labels["karpenter.sh/nodepool"] == "gpu"
    assert labels["karpenter.azure.com/sku-gpu-manufacturer"] == "nvidia"
    assert int(labels["karpenter.azure.com/sku-gpu-count"]) >= 1 and labels["karpenter.azure.com/sku-gpu-name"]
    assert labels["kubernetes.azure.com/role"] == "agent" and labels["kubernetes.azure.com/cluster"]
    for absent in ("kubernetes.azure.com/accelerator", "kubernetes.azure.com/agentpool", "agentpool"):
        assert absent not in labels, absent
    assert "/providers/Microsoft.Compute/virtualMachines/" + name in node.obj["spec"]["providerID"]
    (claim,) = c.items("nodeclaims.karpenter.sh")
    assert name == f"aks-{claim.name}" and claim.obj["status"]["nodeName"] == name
    assert claim.obj["status"]["providerID"] == node.obj["spec"]["providerID"]
    assert "karpenter.sh/termination" in claim.meta["finalizers"]
    assert node.meta["ownerReferences"][0]["kind"] == "NodeClaim"


def test_deleting_a_nodeclaim_terminates_its_node_and_a_pending_pod_gets_a_new_one() -> None:
    fleet, c, name = fleet_with_a_nap_node()
    (claim,) = c.items("nodeclaims.karpenter.sh")
    with fleet.lock:
        c.remove("nodeclaims.karpenter.sh", "", claim.name)
        c.remove("nodeclaims.karpenter.sh", "", claim.name)  # idempotent while terminating
    assert claim.meta["deletionTimestamp"]
    assert any(t["key"] == "karpenter.sh/disrupted" for t in c.nodes[name].obj["spec"]["taints"])
    fleet.advance(11)
    assert name not in c.nodes
    assert c.get("nodeclaims.karpenter.sh", "", claim.name) is None
    fleet.advance(25)
    replacements = [n for n, node in c.nodes.items() if node.nap]
    assert len(replacements) == 1 and replacements[0] != name
    assert c.get("nodeclaims.karpenter.sh", "", replacements[0].removeprefix("aks-")) is not None


def test_the_app_finds_and_repairs_a_nap_gpu_node_by_deleting_its_nodeclaim() -> None:
    from shared.remediation import records as remediation
    from shared.remediation.records import State
    from tests.sim.steward_on_sim import run_remediations, steward_on, sweep_and_admit

    settings = {"REMEDIATION_DEFAULT_THRESHOLD_S": "0", "REMEDIATION_STARTUP_GRACE_S": "0"}
    with steward_on(nap_scenario(), **settings) as (sim, ctx):
        sim.control("POST", "/advance", {"seconds": 40})
        kube = ctx.access.kube(sim.cluster("auto")["id"])
        (broken,) = [n.name for n in kube.list_nodes(label_selector="karpenter.sh/nodepool=gpu")]
        sim.control("POST", "/conditions", {"cluster": "auto", "node": broken, "type": COND, "status": "True",
                                            "fixed_by": "replace"})
        sim.control("POST", "/advance", {"seconds": 1})
        assert any(r.startswith("admitted") for r in sweep_and_admit(ctx)), "the sweep did not find the NAP node"
        (record,) = run_remediations(ctx)
        assert record.state == State.DONE, record.data.get("last_note")
        assert record.data["pool"] == "gpu" and record.data["nap"] is True
        assert record.data["escalation"]["code"] == "KarpenterNode"
        assert kube.get_node(broken) is None
        (new,) = [n.name for n in kube.list_nodes(label_selector="karpenter.sh/nodepool=gpu")]
        assert new != broken and record.data.get("target") == new
        replaced = [e for e in ctx.events.published if e["type"] == remediation.EVENT_PREFIX + "Replaced"]
        assert replaced and replaced[0]["data"]["escalation"]["code"] == "KarpenterNode"
        repairs = [r for r in sim.oracles()["repairs"] if r["node"] == broken]
        assert repairs == [], "no VM-level restart or reimage was attempted on a Karpenter node"


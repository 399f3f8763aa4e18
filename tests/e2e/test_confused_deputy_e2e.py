"""End-to-end: a fake Node with a foreign providerID is refused, and nothing outside its cluster is touched.

The threat (issue 11, "Trust ARM, not the node"): the admin of one cluster creates a Node whose
``spec.providerID`` names a VM of *another* cluster's node resource group, labelled as a broken GPU
node of a real User GPU pool. A steward that believed the node would cordon and "drain" the empty
fake node and then restart the other cluster's VM, past that cluster's PodDisruptionBudget.

The stack here is the real one (Azurite, the simulator, a local Functions host): the fake node is
created through the Kubernetes API as the admin would (the simulator stores it as posted, like a
real API server), the sweep finds it, the Event Grid trigger judges it. The verdict is read from the
simulator's request counters and oracles (no VM action, no eviction, no ARM write anywhere), from
the victim cluster's own API (its node and pods untouched, no event of ours) and from the CloudEvents
and the Warning event on the fake node.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.test_remediation_e2e import BASE_SETTINGS, Fleet, stack_for  # noqa: F401 - stack_for is a fixture

FORGED = "aks-gpu-31337000-vmss00000z"


@pytest.fixture(scope="class")
def deputy(stack_for: Callable[..., Fleet]) -> Fleet:  # noqa: F811 - the imported fixture
    return stack_for(scenario="confused_deputy", settings={}, hosts=1)


def sweeps(fleet: Fleet) -> int:
    log = (fleet.stack.state_dir / "host-1.log").read_text(errors="replace")
    return len(re.findall(r"Executed 'Functions\.health_sweep' \(Succeeded", log))


def forged_node(victim_vm_provider_id: str, *, broken_since: str) -> dict[str, Any]:
    """What the admin of e2e-own posts: a Ready GPU node of pool gpu, its device plugin broken long ago."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": FORGED, "labels": {"kubernetes.azure.com/agentpool": "gpu", "agentpool": "gpu",
                                                    "kubernetes.azure.com/accelerator": "nvidia",
                                                    "kubernetes.azure.com/mode": "user"}},
            "spec": {"providerID": victim_vm_provider_id},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": broken_since},
                {"type": "UnhealthyNvidiaDevicePlugin", "status": "True", "reason": "DevicePluginUnhealthy",
                 "lastTransitionTime": broken_since},
                {"type": "UnhealthyNvidiaDCGMServices", "status": "False", "reason": "DCGMHealthy",
                 "lastTransitionTime": broken_since}],
                "allocatable": {"nvidia.com/gpu": "1", "cpu": "4"}, "capacity": {"nvidia.com/gpu": "1", "cpu": "4"}}}


class TestConfusedDeputy:
    """scenarios/confused_deputy.yaml: e2e-own's admin forges a node pointing at e2e-victim's GPU VM."""

    def test_a_fake_node_with_a_foreign_provider_id_is_refused_and_nothing_outside_its_cluster_is_touched(
            self, deputy: Fleet) -> None:
        deputy.wait(lambda: sweeps(deputy) >= 1, timeout=60, what="the first sweep")
        [victim_node] = deputy.pool_nodes("e2e-victim", "gpu")
        victim_pods = {p.metadata.uid for p in deputy.core("e2e-victim").list_namespaced_pod("ml").items
                       if p.status.phase == "Running"}
        assert len(victim_pods) == 1
        provider_id = victim_node.spec.provider_id
        assert "/resourceGroups/MC_rg-e2e-victim_e2e-victim_eastus/" in provider_id
        broken_since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deputy.now() - 600))
        deputy.core("e2e-own").create_node(forged_node(provider_id, broken_since=broken_since))

        def refused() -> list[dict[str, Any]]:
            return [e for e in deputy.events("Steward.Remediation.Refused") if e["data"].get("node") == FORGED]
        [event] = deputy.wait(refused, timeout=60, what="the Refused event for the forged node")
        assert event["data"]["reason_code"] == "NotAMachine", event
        assert event["data"]["cluster"] == deputy.clusters["e2e-own"]
        # Several sweeps later (each re-reports the fault), still nothing happened anywhere.
        seen = sweeps(deputy)
        deputy.wait(lambda: sweeps(deputy) >= seen + 3, timeout=60, what="three more sweeps")

        assert deputy.records() == []  # no remediation was ever admitted
        assert len(refused()) == 1  # refused once per fault, not once per sweep
        warnings = [e for e in deputy.core("e2e-own").list_event_for_all_namespaces().items
                    if e.involved_object.name == FORGED and e.type == "Warning"]
        assert [e.reason for e in warnings] == ["StewardRefusedNotAMachine"]
        assert not deputy.node("e2e-own", FORGED).spec.unschedulable  # not even the fake node was cordoned

        oracles = deputy.oracles()
        assert oracles["repairs"] == []  # no VM was restarted or reimaged, in any cluster
        arm = oracles["requests_by_service"]["arm"]
        assert arm.get("writes", 0) == 0, {k: v for k, v in arm.items() if k.split(" ")[0] in ("PUT", "POST", "DELETE")}
        vm_actions = [route for route in arm if route.startswith("POST ") and "/virtualMachines/" in route]
        assert vm_actions == []
        kube = oracles["requests_by_service"]["kube"]
        assert [route for route in kube if route.endswith("/eviction")] == []
        assert [t for t in oracles["terminations"] if t["cluster"] == "e2e-victim"] == []
        assert oracles["pdb_violations"] == []

        victim_after = deputy.node("e2e-victim", victim_node.metadata.name)
        assert victim_after is not None and victim_after.metadata.uid == victim_node.metadata.uid
        assert not victim_after.spec.unschedulable
        assert not any(k.startswith("gpu-fleet-steward/") for k in (victim_after.metadata.labels or {}))
        assert not any(k.startswith("gpu-fleet-steward/") for k in (victim_after.metadata.annotations or {}))
        assert {p.metadata.uid for p in deputy.core("e2e-victim").list_namespaced_pod("ml").items
                if p.status.phase == "Running"} == victim_pods
        assert [e.reason for e in deputy.core("e2e-victim").list_event_for_all_namespaces().items
                if (e.reason or "").startswith("Steward")] == []

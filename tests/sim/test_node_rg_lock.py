"""Node resource group lockdown and deallocated VMs, as the simulator answers them, and the app's ladder.

https://learn.microsoft.com/azure/aks/node-resource-group-lockdown: restriction level ``ReadOnly`` (preset
on AKS Automatic) puts a deny assignment on the node resource group; only ``*/read`` is left, so a VMSS
VM restart or reimage answers 403 (code ``DenyAssignmentAuthorizationFailed``, the shape of another
system deny assignment in Azure/migAz#266; AKS's exact wording is not documented). A stopped or
deallocated VM (an evicted spot VM) answers a restart with 409 ``OperationNotAllowed``. The AKS API
itself (deleteMachines, agent pool PUTs) is not behind the deny assignment.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sim.scenario import ScenarioError, build_fleet
from sim.testing import SimHandle

SUB = "00000000-0000-0000-0000-0000000000d4"
T4 = "Standard_NC8as_T4_v3"
COND = "UnhealthyNvidiaDevicePlugin"


def lock_scenario(*, lockdown: str = "Unrestricted") -> dict[str, Any]:
    return {
        "seed": 9, "clock": {"manual": True},
        "timings": {"node_ready_s": 10, "restart_s": 30, "reimage_s": 60, "pool_scale_s": 20, "delete_machines_s": 20},
        "subscriptions": [{"id": SUB, "clusters": [{
            "name": "auto", "resource_group": "rg-auto", "tags": {"gpu-fleet-steward": "enabled"},
            "node_resource_group_lockdown": lockdown,
            "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                      {"name": "gpu", "vmSize": T4, "count": 3,
                       "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}]}]}],
    }


@pytest.fixture(scope="module")
def wired() -> Iterator[tuple[SimHandle, Any]]:
    from tests.sim.steward_on_sim import steward_on

    with steward_on(lock_scenario()) as (sim, ctx):
        sim.control("POST", "/advance", {"seconds": 15})
        yield sim, ctx


def gpu_vm(ctx: Any, sim: SimHandle, index: int = 0) -> str:
    machines = ctx.access.aks().list_machines(sim.cluster("auto")["id"], "gpu")
    return str(sorted(m.resource_id for m in machines)[index])


def test_a_locked_node_resource_group_denies_restart_and_reimage_with_403_mapped_by_code(
        wired: tuple[SimHandle, Any]) -> None:
    from shared.adapters.compute import VmActionDenied

    sim, ctx = wired
    vm = gpu_vm(ctx, sim)
    answer = sim.control("POST", "/lock", {"cluster": "auto", "locked": True})
    assert answer["locked"] is True and answer["node_resource_group"].startswith("MC_")
    try:
        for action in (ctx.access.compute().begin_restart, ctx.access.compute().begin_reimage):
            with pytest.raises(VmActionDenied) as denied:
                action(vm)
            assert denied.value.code == "DenyAssignmentAuthorizationFailed"
            assert "deny assignment" in str(denied.value)
    finally:
        sim.control("POST", "/lock", {"cluster": "auto", "locked": False})
    ctx.access.compute().begin_restart(vm)  # unlocked: accepted again


def test_a_deallocated_vm_refuses_a_restart_with_409_operation_not_allowed(wired: tuple[SimHandle, Any]) -> None:
    from kubernetes import client

    from shared.adapters.compute import VmActionImpossible

    sim, ctx = wired
    vm = gpu_vm(ctx, sim, 1)
    name = ctx.access.aks().list_machines(sim.cluster("auto")["id"], "gpu")
    node = next(m.name for m in name if m.resource_id == vm)
    core = client.CoreV1Api(sim.kube_client("auto"))
    taints = list(core.read_node(node).spec.taints or [])
    # what the cloud node lifecycle controller does to a node whose VM is stopped or deallocated
    core.patch_node(node, {"spec": {"taints": [t.to_dict() for t in taints] + [
        {"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": "NoSchedule"}]}})
    with pytest.raises(VmActionImpossible) as impossible:
        ctx.access.compute().begin_restart(vm)
    assert impossible.value.code == "OperationNotAllowed"


def test_the_lock_endpoint_and_the_scenario_field_are_validated(wired: tuple[SimHandle, Any]) -> None:
    from sim.testing import SimError

    sim, _ctx = wired
    with pytest.raises(SimError, match="400"):
        sim.control("POST", "/lock", {"cluster": "auto", "locked": "yes"})
    with pytest.raises(SimError, match="404"):
        sim.control("POST", "/lock", {"cluster": "nowhere", "locked": True})
    assert build_fleet(lock_scenario(lockdown="ReadOnly")).cluster_by_name("auto").node_rg_locked is True
    with pytest.raises(ScenarioError, match="node_resource_group_lockdown"):
        build_fleet(lock_scenario(lockdown="Sealed"))


def test_the_app_escalates_a_denied_restart_to_replace_through_the_aks_api() -> None:
    from shared.remediation import records as remediation
    from shared.remediation.records import State
    from tests.sim.steward_on_sim import run_remediations, steward_on, sweep_and_admit

    settings = {"REMEDIATION_DEFAULT_THRESHOLD_S": "0", "REMEDIATION_STARTUP_GRACE_S": "0"}
    with steward_on(lock_scenario(lockdown="ReadOnly"), **settings) as (sim, ctx):
        sim.control("POST", "/advance", {"seconds": 15})
        kube = ctx.access.kube(sim.cluster("auto")["id"])
        broken = sorted(n.name for n in kube.list_nodes(label_selector="kubernetes.azure.com/agentpool=gpu"))[0]
        sim.control("POST", "/conditions", {"cluster": "auto", "node": broken, "type": COND, "status": "True",
                                            "fixed_by": "restart"})
        sim.control("POST", "/advance", {"seconds": 1})
        assert any(r.startswith("admitted") for r in sweep_and_admit(ctx))
        (record,) = run_remediations(ctx)
        assert record.state == State.DONE, record.data.get("last_note")
        assert record.data["escalation"]["code"] == "DenyAssignmentAuthorizationFailed"
        assert record.data["escalation"]["from"] == "restart"
        assert kube.get_node(broken) is None, "replaced through deleteMachines"
        assert sim.oracles()["repairs"] == [], "no restart or reimage ever reached a VM"
        replaced = [e for e in ctx.events.published if e["type"] == remediation.EVENT_PREFIX + "Replaced"]
        assert replaced[0]["data"]["escalation"]["code"] == "DenyAssignmentAuthorizationFailed"

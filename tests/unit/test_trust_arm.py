"""Trust ARM, not the node: a forged Node cannot turn the steward against another cluster (issue 11).

A cluster admin writes Node objects; their labels and ``spec.providerID`` are claims. These tests
forge nodes the way such an admin could and check that admission (from an Event Grid delivery and
from the sweep alike) refuses them from what ARM says, that the VM action re-checks ARM right
before the call, that nodes the platform is taking away are left alone, and that the reconciler's
``give_up`` hook ends a remediation the way a spent ladder does.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.fleet import node_truth
from shared.fleet.node_fate import AUTOSCALER_DELETE_TAINT, PREEMPT_TAINT
from shared.kernel.errors import Invalid
from shared.kernel.ports import ClusterInfo, MachineInfo, NodeView, PoolInfo, Taint
from shared.remediation import records as remediation
from shared.remediation import steps as remediation_steps
from shared.remediation import sweep
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, RemediationPolicy
from shared.remediation.records import State
from tests.unit.fakes_remediation import (
    CLUSTER,
    SUB,
    T0,
    Fleet,
    make_node,
    run_until_settled,
    unhealthy_event,
    vm_id,
)

OTHER_SUB = "00000000-0000-0000-0000-0000000000ff"
# A VM of another cluster's node resource group (same subscription, and another subscription).
FOREIGN_VM = (f"/subscriptions/{SUB}/resourceGroups/MC_rg_victim_eastus/providers/Microsoft.Compute/"
              f"virtualMachineScaleSets/aks-gpu-12345678-vmss/virtualMachines/3")
FOREIGN_SUB_VM = (f"/subscriptions/{OTHER_SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/"
                  f"virtualMachineScaleSets/aks-gpu-12345678-vmss/virtualMachines/3")
NAP_LABELS = {"karpenter.sh/nodepool": "gpu-np", "karpenter.azure.com/sku-gpu-manufacturer": "nvidia"}


def broken(name: str, **kwargs: Any) -> NodeView:
    return make_node(name, conditions={DEVICE_PLUGIN: ("True", T0 - 3600), DCGM: ("False", T0 - 86400)}, **kwargs)


def forge(fleet: Fleet, name: str, *, provider_id: str, pool: str = "gpu", labels: dict[str, str] | None = None,
          machine: bool = False) -> NodeView:
    """A Node object a cluster admin created (``machine``: it took the name of a real machine of the pool)."""
    node = msgspec.structs.replace(broken(name, pool=pool), provider_id=provider_id)
    if labels is not None:
        node = msgspec.structs.replace(node, labels=labels)
    fleet.kube.add(node)
    if not machine:
        fleet.aks.not_machines.add(name)
    return node


def refused_events(fleet: Fleet) -> list[dict[str, Any]]:
    return [e["data"] for e in fleet.events.published if e["type"] == remediation.EVENT_PREFIX + "Refused"]


def nothing_done_to_the_fleet(fleet: Fleet) -> None:
    assert fleet.compute.writes == []
    assert fleet.aks.writes == []
    assert [w for w in fleet.kube.writes if w[0] in ("patch_node", "evict", "lease")] == []
    assert fleet.ledger.list(remediation.KIND) == []


# --------------------------------------------------------------------------- the pure checks


def cluster(*, nap: bool = False) -> ClusterInfo:
    return ClusterInfo(id=CLUSTER, name="c1", subscription=SUB, resource_group="rg", location="eastus", tags={},
                       node_resource_group="mc_rg", node_provisioning_mode="Auto" if nap else "Manual")


def pool(mode: str = "User", size: str = "Standard_NC4as_T4_v3") -> PoolInfo:
    return PoolInfo(cluster_id=CLUSTER, name="gpu", properties={"mode": mode, "vmSize": size})


@pytest.mark.parametrize(("arm_pool", "code"), [
    (pool(), ""),
    (None, node_truth.NO_SUCH_POOL),
    (pool(mode="System"), node_truth.NOT_USER_POOL),
    (pool(mode=""), node_truth.NOT_USER_POOL),
    (pool(size="Standard_D4s_v5"), node_truth.NOT_GPU_POOL),
    (pool(size="Standard_NV36ads_A10_v5"), ""),
    (pool(size="Standard_ND96isr_MI300X_v5"), node_truth.NOT_GPU_POOL),  # AMD: not ours
], ids=["user-gpu-pool", "no-such-pool", "system-pool", "mode-missing", "cpu-pool", "nvidia-vgpu-pool", "amd-pool"])
def test_only_a_user_pool_with_an_nvidia_size_in_arm_is_remediated(arm_pool: PoolInfo | None, code: str) -> None:
    verdict = node_truth.check_pool(cluster(), "gpu", arm_pool)
    assert (verdict.ok, verdict.code) == (not code, code)


OWN_VM = vm_id("aks-gpu-0")


@pytest.mark.parametrize(("machines", "provider_id", "code"), [
    ([MachineInfo("aks-gpu-0", OWN_VM)], "azure://" + OWN_VM, ""),
    ([MachineInfo("aks-gpu-0", OWN_VM)], "azure://" + OWN_VM.upper().replace("SUBSCRIPTIONS", "subscriptions"), ""),
    ([MachineInfo("aks-gpu-0", OWN_VM)], "azure://" + FOREIGN_VM, node_truth.PROVIDER_ID_MISMATCH),
    ([MachineInfo("aks-gpu-0", OWN_VM)], "", node_truth.PROVIDER_ID_MISMATCH),
    ([MachineInfo("aks-gpu-0", OWN_VM)], OWN_VM, node_truth.PROVIDER_ID_MISMATCH),  # no azure:// scheme
    ([MachineInfo("aks-gpu-9", OWN_VM)], "azure://" + OWN_VM, node_truth.NOT_A_MACHINE),
    ([], "azure://" + FOREIGN_VM, node_truth.NOT_A_MACHINE),
    ([MachineInfo("aks-gpu-0", FOREIGN_VM)], "azure://" + FOREIGN_VM, node_truth.FOREIGN_VM),
    ([MachineInfo("aks-gpu-0", FOREIGN_SUB_VM)], "azure://" + FOREIGN_SUB_VM, node_truth.FOREIGN_VM),
    ([MachineInfo("aks-gpu-0", "")], "", node_truth.FOREIGN_VM),
], ids=["arm-and-node-agree", "ids-compare-case-insensitively", "foreign-provider-id", "no-provider-id",
        "provider-id-without-scheme", "not-a-machine-of-the-pool", "forged-node-foreign-vm",
        "arm-vm-in-another-node-rg", "arm-vm-in-another-subscription", "machine-without-resource-id"])
def test_the_vm_is_arms_machine_in_the_clusters_own_node_resource_group(machines: list[MachineInfo], provider_id: str,
                                                                        code: str) -> None:
    verdict = node_truth.check_machine(cluster(), pool_name="gpu", node_name="aks-gpu-0", provider_id=provider_id,
                                       machines=machines)
    assert (verdict.ok, verdict.code) == (not code, code)
    assert verdict.vm_id == (OWN_VM if not code else "")


NAP_VM = f"/subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachines/aks-gpu-np-abcde"


@pytest.mark.parametrize(("nap", "provider_id", "code"), [
    (True, "azure://" + NAP_VM, ""),
    (False, "azure://" + NAP_VM, node_truth.NOT_NAP_CLUSTER),
    (True, "azure://" + FOREIGN_VM, node_truth.PROVIDER_ID_MISMATCH),
    (True, "azure://" + NAP_VM.replace(SUB, OTHER_SUB), node_truth.PROVIDER_ID_MISMATCH),
], ids=["nap-cluster-own-vm", "karpenter-label-on-a-cluster-without-nap", "vm-of-another-node-rg",
        "vm-of-another-subscription"])
def test_a_karpenter_node_needs_a_nap_cluster_in_arm_and_a_vm_of_its_node_resource_group(nap: bool, provider_id: str,
                                                                                         code: str) -> None:
    verdict = node_truth.check_nap(cluster(nap=nap), node_name="aks-gpu-np-abcde", provider_id=provider_id)
    assert (verdict.ok, verdict.code) == (not code, code)


# --------------------------------------------------------------------------- admission


def fleet_with_pool() -> Fleet:
    fleet = Fleet()
    fleet.pool(3)
    return fleet


def forged_fleet(case: str) -> tuple[Fleet, str]:
    fleet = fleet_with_pool()
    if case == "fake-node-foreign-provider-id":
        forge(fleet, "aks-gpu-evil", provider_id="azure://" + FOREIGN_VM)
        return fleet, "aks-gpu-evil"
    if case == "machine-name-foreign-provider-id":  # the real node deleted and re-created by the admin
        forge(fleet, "aks-gpu-1", provider_id="azure://" + FOREIGN_VM, machine=True)
        return fleet, "aks-gpu-1"
    if case == "system-pool":
        fleet.pool_props("gpu")["mode"] = "System"
    elif case == "cpu-pool-labelled-gpu":
        fleet.pool_props("gpu")["vmSize"] = "Standard_D4s_v5"
    elif case == "pool-arm-does-not-know":
        fleet.kube.add(broken("aks-ghost-0", pool="ghost"))
        return fleet, "aks-ghost-0"
    elif case == "arm-vm-in-another-node-rg":
        fleet.aks.machine_ids["aks-gpu-1"] = FOREIGN_VM
        fleet.kube.add(msgspec.structs.replace(broken("aks-gpu-1"), provider_id="azure://" + FOREIGN_VM))
        return fleet, "aks-gpu-1"
    elif case == "karpenter-label-on-a-cluster-without-nap":
        forge(fleet, "aks-gpu-np-1", provider_id="azure://" + NAP_VM.replace("abcde", "1"), labels=NAP_LABELS)
        return fleet, "aks-gpu-np-1"
    elif case == "karpenter-node-with-a-foreign-vm":
        fleet.update_cluster(node_provisioning_mode="Auto")
        forge(fleet, "aks-gpu-np-1", provider_id="azure://" + FOREIGN_VM.replace("virtualMachineScaleSets/"
                                                                                  "aks-gpu-12345678-vmss/", ""),
              labels=NAP_LABELS)
        return fleet, "aks-gpu-np-1"
    fleet.break_node("aks-gpu-1", at=T0 - 3600)
    return fleet, "aks-gpu-1"


CASES = [
    ("fake-node-foreign-provider-id", node_truth.NOT_A_MACHINE),
    ("machine-name-foreign-provider-id", node_truth.PROVIDER_ID_MISMATCH),
    ("system-pool", node_truth.NOT_USER_POOL),
    ("cpu-pool-labelled-gpu", node_truth.NOT_GPU_POOL),
    ("pool-arm-does-not-know", node_truth.NO_SUCH_POOL),
    ("arm-vm-in-another-node-rg", node_truth.FOREIGN_VM),
    ("karpenter-label-on-a-cluster-without-nap", node_truth.NOT_NAP_CLUSTER),
    ("karpenter-node-with-a-foreign-vm", node_truth.PROVIDER_ID_MISMATCH),
]


@pytest.mark.parametrize(("case", "code"), CASES, ids=[c for c, _ in CASES])
def test_an_event_for_a_node_arm_contradicts_is_refused_and_nothing_is_touched(case: str, code: str) -> None:
    fleet, name = forged_fleet(case)
    outcome = fleet.handle(unhealthy_event(name, fleet=fleet))
    assert outcome.startswith(f"refused ({code})"), outcome
    nothing_done_to_the_fleet(fleet)
    [refusal] = refused_events(fleet)
    assert refusal["reason_code"] == code and refusal["node"] == name
    warnings = [e for e in fleet.kube.events if e["type"] == "Warning"]
    assert [(e["node"], e["reason"]) for e in warnings] == [(name, f"StewardRefused{code}")]
    assert fleet.handle(unhealthy_event(name, fleet=fleet)).startswith(f"refused ({code}, already reported)")
    assert len(refused_events(fleet)) == 1 and len(fleet.kube.events) == 1
    run_until_settled(fleet)
    nothing_done_to_the_fleet(fleet)


def test_faults_the_sweep_reports_for_a_forged_node_are_refused_the_same_way() -> None:
    fleet = fleet_with_pool()
    forge(fleet, "aks-gpu-evil", provider_id="azure://" + FOREIGN_VM)
    report = sweep.sweep(fleet.ctx())
    assert report.published == 1
    [delivery] = fleet.events.delivered(remediation.UNHEALTHY_EVENT)
    assert fleet.handle(delivery).startswith(f"refused ({node_truth.NOT_A_MACHINE})")
    nothing_done_to_the_fleet(fleet)


def test_a_genuine_node_is_admitted_with_the_vm_arm_gave_and_restarted_there() -> None:
    fleet = fleet_with_pool()
    fleet.break_node("aks-gpu-1", at=T0 - 3600)
    fleet.compute.outcomes["restart"] = "heals"
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    [record] = fleet.ledger.list(remediation.KIND)
    assert record.data["arm_vm_id"] == vm_id("aks-gpu-1")
    assert run_until_settled(fleet) == [State.DONE]
    assert fleet.compute.writes == [("restart", vm_id("aks-gpu-1"))]
    # made for the node's own cluster, so the write gate holds the VM to that cluster's node resource group
    assert fleet.compute.clusters == [record.data["cluster"]]


def test_the_vm_is_read_from_arm_again_right_before_the_restart_and_refused_when_it_moved() -> None:
    fleet = fleet_with_pool()
    fleet.break_node("aks-gpu-1", at=T0 - 3600)
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    fleet.aks.machine_ids["aks-gpu-1"] = FOREIGN_VM  # ARM's answer changed (or the record was tampered with)
    assert run_until_settled(fleet) == [State.REFUSED]
    assert fleet.compute.writes == []
    [record] = fleet.ledger.list(remediation.KIND)
    assert record.data["refusal"]["code"] == node_truth.FOREIGN_VM
    [refusal] = refused_events(fleet)
    assert refusal["reason_code"] == node_truth.FOREIGN_VM
    assert ("aks-gpu-1", "StewardRefused", "Warning") in [(e["node"], e["reason"], e["type"]) for e in fleet.kube.events]
    assert fleet.kube.nodes["aks-gpu-1"].unschedulable  # our cordon stays: the node's identity is in doubt
    assert fleet.ledger.get(remediation.BUDGET_KIND, remediation.BUDGET_ID).data["slots"] == {}


# --------------------------------------------------------------------------- nodes the platform takes away


@pytest.mark.parametrize(("taint", "busy_taints", "words"), [
    (PREEMPT_TAINT, None, "Preempt"),
    (AUTOSCALER_DELETE_TAINT, (), "cluster autoscaler"),  # even when the operator emptied REMEDIATION_BUSY_TAINTS
], ids=["spot-preempt-notice", "autoscaler-removal-with-no-busy-taints-configured"])
def test_a_node_the_platform_is_taking_away_is_refused_with_the_reason_recorded(taint: str,
                                                                                busy_taints: tuple[str, ...] | None,
                                                                                words: str) -> None:
    fleet = Fleet(policy=RemediationPolicy() if busy_taints is None else RemediationPolicy(busy_taints=busy_taints))
    fleet.pool(3)
    fleet.kube.add(msgspec.structs.replace(broken("aks-gpu-1"), taints=(Taint(key=taint, effect="NoSchedule"),)))
    outcome = fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    assert outcome.startswith(f"refused ({remediation.GOING_AWAY})") and words in outcome, outcome
    nothing_done_to_the_fleet(fleet)
    [marker] = [r for r in fleet.ledger.list(remediation.DEDUPE_KIND) if r.id.startswith("refused-")]
    assert marker.data["reason_code"] == remediation.GOING_AWAY and words in marker.data["reason"]
    assert [e["reason"] for e in fleet.kube.events] == [f"StewardRefused{remediation.GOING_AWAY}"]


def test_a_node_taken_away_after_its_admission_is_not_cordoned() -> None:
    fleet = fleet_with_pool()
    fleet.break_node("aks-gpu-1", at=T0 - 3600)
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    fleet.kube.nodes["aks-gpu-1"] = msgspec.structs.replace(
        fleet.kube.nodes["aks-gpu-1"], taints=(Taint(key="node.cloudprovider.kubernetes.io/shutdown", effect="NoSchedule"),))
    assert run_until_settled(fleet) == [State.REFUSED]
    assert not fleet.kube.nodes["aks-gpu-1"].unschedulable
    assert [w for w in fleet.kube.writes if w[0] == "evict" or (w[0] == "patch_node" and "spec" in w[2])] == []
    assert fleet.compute.writes == []
    assert "stopped or deallocated" in fleet.ledger.list(remediation.KIND)[0].data["refusal"]["reason"]


# --------------------------------------------------------------------------- the reconciler's give_up hook


def test_a_remediation_failing_permanently_is_given_up_through_the_hook_and_frees_its_slot() -> None:
    fleet = fleet_with_pool()
    fleet.break_node("aks-gpu-1", at=T0 - 3600)
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    from shared.kernel import reconciler

    reconciler.reconcile_once(fleet.ctx(), modules={"remediation": remediation_steps})  # type: ignore[dict-item]
    [record] = fleet.ledger.list(remediation.KIND)
    assert record.state in (State.CORDONED, State.DRAINING, State.REPAIRING)
    assert fleet.kube.nodes["aks-gpu-1"].unschedulable

    def refuse(cluster_id: str) -> ClusterInfo:
        raise Invalid("the request is invalid", code="InvalidParameter")

    fleet.aks.get_cluster = refuse  # type: ignore[method-assign]
    fleet.clock.advance(120)  # past the process cache of the cluster's tags
    assert run_until_settled(fleet) == [State.GAVE_UP]
    [record] = fleet.ledger.list(remediation.KIND)
    assert "failed 5 times in a row with a permanent error" in record.data["last_note"]
    assert "stays cordoned (the app cordoned it)" in record.data["last_note"]
    assert fleet.kube.nodes["aks-gpu-1"].unschedulable
    assert fleet.ledger.get(remediation.BUDGET_KIND, remediation.BUDGET_ID).data["slots"] == {}
    assert fleet.kube.leases == {}
    assert remediation.EVENT_PREFIX + "GaveUp" in fleet.events.types()


def test_give_up_leaves_a_node_someone_else_cordoned_as_it_was() -> None:
    fleet = fleet_with_pool()
    fleet.break_node("aks-gpu-1", at=T0 - 3600)
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    [record] = fleet.ledger.list(remediation.KIND)
    record = msgspec.structs.replace(record, state=State.CORDONED, data={**record.data, "cordoned_by_us": False})
    ended = remediation_steps.give_up(record, fleet.ctx(), reason="step 'cordoned' failed 5 times")
    assert ended.state == State.GAVE_UP and "left as it was" in ended.data["last_note"]
    assert [w for w in fleet.kube.writes if w[0] == "patch_node" and "spec" in w[2]] == []
    assert remediation_steps.give_up(ended, fleet.ctx(), reason="again") is ended


def test_give_up_still_ends_the_record_when_the_cluster_refuses_every_call() -> None:
    fleet = fleet_with_pool()
    fleet.break_node("aks-gpu-1", at=T0 - 3600)
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    [record] = fleet.ledger.list(remediation.KIND)

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise Invalid("no")

    for method in ("get_node", "release_lease", "create_event", "patch_node"):
        setattr(fleet.kube, method, forbidden)
    ended = remediation_steps.give_up(record, fleet.ctx(), reason="permanent")
    assert ended.state == State.GAVE_UP
    assert fleet.ledger.get(remediation.BUDGET_KIND, remediation.BUDGET_ID).data["slots"] == {}


def test_a_refused_fault_reported_every_sweep_costs_arm_reads_at_most_once_a_minute() -> None:
    fleet = fleet_with_pool()
    forge(fleet, "aks-gpu-evil", provider_id="azure://" + FOREIGN_VM)
    reads: list[str] = []
    list_machines = fleet.aks.list_machines

    def counting(cluster_id: str, pool: str) -> list[MachineInfo]:
        reads.append(pool)
        return list_machines(cluster_id, pool)

    fleet.aks.list_machines = counting  # type: ignore[method-assign]
    ctx = fleet.ctx()
    for _ in range(3):
        assert fleet.handle(unhealthy_event("aks-gpu-evil", fleet=fleet), ctx).startswith("refused (NotAMachine")
        fleet.clock.advance(15)
    assert reads == ["gpu"]
    fleet.clock.advance(60)
    fleet.handle(unhealthy_event("aks-gpu-evil", fleet=fleet), ctx)
    assert reads == ["gpu", "gpu"]

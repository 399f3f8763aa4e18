"""The replace rung re-reads ARM right before deleteMachines (issue 11, "Confused deputy" 2).

AKS's deleteMachines takes no If-Match, so the only guard is to look again right before the call:
the machine must still be the node of the record (its uid), a machine of the User GPU pool admitted,
with the VM admitted (``arm_vm_id``, resolved from ARM by shared.fleet.node_truth), in the cluster's own
node resource group. If ARM says otherwise, no machine is deleted and the remediation ends refused.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from shared.kernel.ports import Record
from shared.remediation import records as remediation
from shared.remediation import steps as remediation_steps
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import State
from tests.unit.fakes_remediation import SUB, Fleet, make_pod, unhealthy_event, vm_id


def _at_delete(*, surge: bool = True) -> tuple[Fleet, Record]:
    """One broken node of five under a replace-only ladder, stepped until the replace rung is about to delete it."""
    fleet = Fleet(policy=RemediationPolicy(ladder=("replace",), surge=surge))
    fleet.pool(5, unhealthy=[1])
    fleet.kube.add_pods(make_pod("web-1", "aks-gpu-1"))
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    for _ in range(200):
        rec = fleet.ledger.list(remediation.KIND)[0]
        if rec.state == State.REPAIRING and rec.data.get("rung_phase") == "delete":
            return fleet, rec
        assert rec.state in remediation.ACTIVE_STATES, (rec.state, rec.history[-3:])
        fleet.clock.advance(max(0.0, rec.next_at - fleet.clock.now()))
        _step(fleet, rec)
    raise AssertionError("the replace rung never reached its delete phase")


def _step(fleet: Fleet, rec: Record) -> None:
    """One step of the record, saved as the reconciler saves it (no chaining, so each phase can be seen)."""
    stepped = remediation_steps.advance(rec, fleet.ctx())
    fleet.ledger.save(msgspec.structs.replace(stepped, etag=rec.etag))


def _deletes(fleet: Fleet) -> list[tuple[object, ...]]:
    return [w for w in fleet.aks.writes if w[0] == "delete_machines"]


OTHER_VM = (f"/subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/vmss"
            f"/virtualMachines/aks-gpu-99")
FOREIGN_VM = (f"/subscriptions/{SUB}/resourceGroups/mc_other/providers/Microsoft.Compute/virtualMachineScaleSets/vmss"
              f"/virtualMachines/aks-gpu-1")


def _other_vm(fleet: Fleet) -> None:
    fleet.aks.machine_ids["aks-gpu-1"] = OTHER_VM


def _record_names_another_vm(fleet: Fleet) -> None:
    rec = fleet.ledger.list(remediation.KIND)[0]  # a row rewritten by someone who can write the table
    fleet.ledger.save(msgspec.structs.replace(rec, data={**rec.data, "arm_vm_id": OTHER_VM}))


def _foreign_vm(fleet: Fleet) -> None:
    fleet.aks.machine_ids["aks-gpu-1"] = FOREIGN_VM


def _system_pool(fleet: Fleet) -> None:
    fleet.pool_props("gpu")["mode"] = "System"


def _cpu_pool(fleet: Fleet) -> None:
    fleet.pool_props("gpu")["vmSize"] = "Standard_D4s_v5"


def _not_a_machine(fleet: Fleet) -> None:
    fleet.aks.not_machines.add("aks-gpu-1")


CASES: list[tuple[str, Callable[[Fleet], None], str]] = [
    ("machine-now-another-vm", _other_vm, "says its VM is"),
    ("record-names-another-vm", _record_names_another_vm, "not the VM"),
    ("machine-vm-in-another-resource-group", _foreign_vm, "node resource group"),
    ("pool-now-a-system-pool", _system_pool, "not a User pool"),
    ("pool-no-longer-gpu", _cpu_pool, "not an NVIDIA GPU size"),
    ("node-no-longer-a-machine-of-the-pool", _not_a_machine, "is not a machine of pool gpu"),
]


@pytest.mark.parametrize("surge", [True, False], ids=["surge", "delete-first"])
@pytest.mark.parametrize(("tamper", "why"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_deletemachines_is_not_sent_when_arm_no_longer_shows_the_admitted_machine(
        tamper: Callable[[Fleet], None], why: str, surge: bool) -> None:
    fleet, rec = _at_delete(surge=surge)
    assert rec.data["arm_vm_id"] == vm_id("aks-gpu-1")
    tamper(fleet)
    _step(fleet, fleet.ledger.list(remediation.KIND)[0])
    after = fleet.ledger.list(remediation.KIND)[0]
    assert _deletes(fleet) == [], "a machine was deleted that ARM no longer shows as the one admitted"
    assert after.state == State.REFUSED and why in after.data["refusal"]["reason"], after.data.get("refusal")
    assert "aks-gpu-1" in fleet.kube.nodes


@pytest.mark.parametrize("surge", [True, False], ids=["surge", "delete-first"])
def test_deletemachines_is_sent_when_arm_still_shows_the_admitted_machine(surge: bool) -> None:
    # The control for the table above.
    fleet, _ = _at_delete(surge=surge)
    _step(fleet, fleet.ledger.list(remediation.KIND)[0])
    assert _deletes(fleet) == [("delete_machines", "gpu", ("aks-gpu-1",))]

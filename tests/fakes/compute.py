"""ComputePort in memory: VMSS VM restart and reimage, and Resource Health's current availability.

What a restart or a reimage does to the node is the scenario's business (does it heal, reboot still
broken, reboot too fast for the node controller to notice?): the fake tells its :class:`VmHost` which
rung ran on which VM with which outcome, and the host (a test fleet) changes its nodes accordingly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from shared.kernel.errors import Invalid, NotFound
from shared.kernel.ports import AvailabilityView
from tests.fakes.faults import Faults

HEALS, HEALS_IN_A_BLINK, FAILS, REFUSED = "heals", "heals-in-a-blink", "fails", "refused"
NEVER_RUNS = "never-runs"  # ARM accepts the call, then its operation fails: the VM never reboots


class VmHost(Protocol):
    """The world the VMs live in (a test fleet): which VMs exist, and what a reboot did to one."""

    def vm_exists(self, vm_resource_id: str) -> bool: ...
    def vm_rebooted(self, vm_resource_id: str, *, rung: str, outcome: str) -> None: ...


@dataclass
class FakeCompute:
    """VMSS VM actions over ``fleet``; ``outcomes[rung]`` is ``heals``, ``heals-in-a-blink`` (Ready never
    changes), ``fails`` (reboots, still broken; the default), ``refused`` (ARM answers 409
    OperationNotAllowed, raised as Invalid as shared.adapters.compute maps it) or ``never-runs`` (ARM accepts
    it and its long-running operation fails: the VM never reboots).

    Oracles: ``writes`` (rung, VM) of every accepted action, ``clusters`` (the ``cluster_id`` each action
    was made for), ``reads`` (each VM whose availability was read). ``states[vm id, lower case]`` is what
    Resource Health answers (``Available`` when absent); a VM the host does not know is NotFound."""

    fleet: VmHost
    outcomes: dict[str, str] = field(default_factory=dict)
    writes: list[tuple[str, str]] = field(default_factory=list)
    clusters: list[str | None] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    faults: Faults = field(default_factory=Faults)

    def get_availability(self, vm_resource_id: str) -> AvailabilityView:
        self.reads.append(vm_resource_id)
        self.faults.check("get_availability")
        if not self.fleet.vm_exists(vm_resource_id):
            raise NotFound(vm_resource_id)
        return AvailabilityView(state=self.states.get(vm_resource_id.lower(), "Available"))

    def begin_restart(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        self.clusters.append(cluster_id)
        self._apply("restart", vm_resource_id)

    def begin_reimage(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        self.clusters.append(cluster_id)
        self._apply("reimage", vm_resource_id)

    def _apply(self, rung: str, vm: str) -> None:
        self.faults.check(f"begin_{rung}")
        outcome = self.outcomes.get(rung, FAILS)
        if outcome == REFUSED:
            raise Invalid(f"{rung} not allowed on {vm}", code="OperationNotAllowed")
        self.writes.append((rung, vm))
        if outcome == NEVER_RUNS:
            return
        if self.fleet.vm_exists(vm):
            self.fleet.vm_rebooted(vm, rung=rung, outcome=outcome)

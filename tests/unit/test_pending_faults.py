"""A pushed fault refused for a reason that passes is kept and judged again each sweep (issue 24, item 1;
shared.remediation.pending_faults). The fleet is tests/unit/fakes_remediation.py's with Resource Health's
current availability (tests/unit/test_health_events.py ``HealthCompute``); events are the simulator's.

Soak seed 931005, in small: a degraded host refused by the pool's budget while its neighbour is repaired
must be drained once the neighbour's slot frees, and not be forgotten.
"""

from __future__ import annotations

from typing import Any

from shared.remediation import health_events, pending_faults, sweep
from shared.remediation.admission import Handling
from shared.remediation.records import KIND
from sim.eventgrid import health_resources as hr
from tests.unit.fakes_remediation import T0, run_until_settled, unhealthy_event, vm_id
from tests.unit.test_health_events import arm_says, fleet_with

DROPPED = "Steward.Remediation.PendingDropped"


def kept(fleet: Any) -> list[Any]:
    return fleet.ledger.list(pending_faults.KIND)


def neighbour_repairing_and_a_degraded_host_refused() -> tuple[Any, list[str]]:
    fleet, names = fleet_with(3)  # a pool of 3: its budget allows one node unavailable
    fleet.compute.outcomes["restart"] = "heals"
    fleet.break_node(names[0], at=T0 - 600)
    assert fleet.handle(unhealthy_event(names[0], fleet=fleet)).startswith("admitted")
    arm_says(fleet, names[2], "Degraded")
    handled = health_events.handle(hr.availability_changed(vm_id(names[2]), state="Degraded", previous="Available",
                                                           at=T0), fleet.ctx())
    assert handled.outcome is Handling.REFUSED and handled.code == "budget-pool", handled.detail
    return fleet, names


def test_a_degraded_host_refused_by_the_pool_budget_is_kept_and_admitted_once_the_slot_frees() -> None:
    fleet, names = neighbour_repairing_and_a_degraded_host_refused()
    [row] = kept(fleet)
    assert row.data["node"] == names[2] and row.data["code"] == "budget-pool"
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["waiting"] == 1, "still refused while the neighbour holds the slot"
    assert run_until_settled(fleet) == ["done"]
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["admitted"] == 1 and kept(fleet) == []
    nodes = {r.data["node"]: r.state for r in fleet.ledger.list(KIND)}
    assert set(nodes) == {names[0], names[2]}, "the degraded host is remediated too"


def test_a_kept_fault_whose_source_clears_is_dropped_with_an_event() -> None:
    fleet, names = neighbour_repairing_and_a_degraded_host_refused()
    arm_says(fleet, names[2], "Available")  # Resource Health: the host is fine again
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["dropped"] == {"cleared": 1} and kept(fleet) == []
    [dropped] = [e for e in fleet.events.published if e["type"] == DROPPED]
    assert dropped["data"]["reason_code"] == "cleared" and names[2] in str(dropped["data"])
    assert {r.data["node"] for r in fleet.ledger.list(KIND)} == {names[0]}


def test_a_permanent_refusal_is_reported_once_and_never_kept() -> None:
    fleet, names = fleet_with(3)
    fleet.kube.patch_node(names[1], {"metadata": {"labels": {"gpu-fleet-steward/opt-out": "true"}}})
    arm_says(fleet, names[1], "Degraded")
    event = hr.availability_changed(vm_id(names[1]), state="Degraded", previous="Available", at=T0)
    handled = health_events.handle(event, fleet.ctx())
    assert handled.outcome is Handling.REFUSED and not pending_faults.passes(handled.code), handled.detail
    assert kept(fleet) == []
    sweep.sweep(fleet.ctx())
    assert fleet.ledger.list(KIND) == [] and kept(fleet) == []


def test_a_kept_fault_past_its_age_is_handed_to_an_operator() -> None:
    fleet, _ = neighbour_repairing_and_a_degraded_host_refused()
    fleet.clock.advance(fleet.ctx().settings.remediation.pending_fault_max_age_s + 1)
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["dropped"].get("expired") == 1 and kept(fleet) == []


def test_a_forged_pending_row_only_makes_the_steward_check_the_event_again() -> None:
    from shared.kernel.ports import Record

    fleet, names = fleet_with(3)  # every VM Available: nothing confirms the forged claim
    event = hr.availability_changed(vm_id(names[1]), state="Unavailable", previous="Available", at=T0)
    fleet.ledger.create(Record(kind=pending_faults.KIND, id="forged", state="waiting", data={
        "event": event, "cluster": "c", "node": names[1], "code": "budget-pool", "reason": "r",
        "first_at": T0, "last_at": T0}))
    fleet.ledger.create(Record(kind=pending_faults.KIND, id="garbage", state="waiting", data={"event": 3}))
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["dropped"] == {"cleared": 1, "unreadable": 1}
    assert fleet.ledger.list(KIND) == [] and kept(fleet) == []


def a_degraded_host_while_another_fault_is_repaired_on_it() -> tuple[Any, list[str], Any]:
    """names[1]'s device-plugin fault admitted (a restart heals it), then Resource Health says its host is degraded."""
    fleet, names = fleet_with(3)
    fleet.compute.outcomes["restart"] = "heals"
    fleet.break_node(names[1], at=T0 - 600)
    assert fleet.handle(unhealthy_event(names[1], fleet=fleet)).startswith("admitted")
    arm_says(fleet, names[1], "Degraded")
    handled = health_events.handle(hr.availability_changed(vm_id(names[1]), state="Degraded", previous="Available",
                                                           at=T0), fleet.ctx())
    return fleet, names, handled


def test_a_host_fault_on_a_node_another_fault_is_being_repaired_on_is_kept_and_judged_after_that_repair() -> None:
    """A restart for a device-plugin fault need not cure a degraded host: the pushed event must not be lost
    to the node being busy (it used to be answered "duplicate" and forgotten)."""
    fleet, names, handled = a_degraded_host_while_another_fault_is_repaired_on_it()
    assert handled.outcome is Handling.DUPLICATE and pending_faults.passes(handled.code), handled.detail
    [row] = kept(fleet)
    assert row.data["node"] == names[1]
    assert run_until_settled(fleet) == ["done"]
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["waiting"] == 1, "the node's cooldown holds it a while: still kept"
    fleet.clock.advance(fleet.ctx().settings.remediation.cooldown_s + 1)
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["admitted"] == 1 and kept(fleet) == [], report.pending_faults
    assert [r.data["signal"] for r in sorted(fleet.ledger.list(KIND), key=lambda r: r.created_at)][-1] == \
        "resource-health", "the host fault has its own remediation once the node is free"


def test_a_host_fault_whose_node_was_cured_by_the_other_repair_is_dropped_as_cleared() -> None:
    fleet, names, _ = a_degraded_host_while_another_fault_is_repaired_on_it()
    assert run_until_settled(fleet) == ["done"]
    arm_says(fleet, names[1], "Available")
    report = sweep.sweep(fleet.ctx())
    assert report.pending_faults["dropped"] == {"cleared": 1} and kept(fleet) == []

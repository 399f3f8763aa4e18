"""shared.remediation.health_events: ARM's class of the current state confirms a row, an unknown annotation is
raised, and :func:`still_present` re-reads a fault before a disruptive step.

The class is what Resource Health's ``availabilityStatuses/current`` reports beside the state
(AvailabilityStatusProperties in azure-rest-api-specs .../Microsoft.ResourceHealth/ResourceHealth/models.tsp:
``context``, ``category``, ``healthEventCause``, ``healthEventCategory``, ``reasonType``); the row's class is its
annotation's Context / Category on the annotations page. Same fleet as tests/unit/test_health_events.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from shared.kernel.errors import Forbidden, Throttled, Transient
from shared.kernel.ports import AvailabilityView
from shared.remediation import health_events, signal_policy
from shared.remediation.admission import Handling
from shared.remediation.health_events import UNKNOWN_ANNOTATION_EVENT, arm_class, still_present
from shared.remediation.records import DEDUPE_KIND, KIND
from sim.eventgrid import health_resources as hr
from tests.unit.fakes_remediation import T0, vm_id
from tests.unit.test_health_events import HealthCompute, arm_says, event_for, fleet_with

ACTING = [r for r in signal_policy.HEALTH_TABLE if r.action != signal_policy.RECORD_ONLY]
DAY = 86_400.0


# --------------------------------------------------------------------------- the class ARM reports
@pytest.mark.parametrize(("view", "expected"), [
    pytest.param(AvailabilityView("Degraded", context="Platform Initiated", category="Unplanned"),
                 ("platforminitiated", "unplanned"), id="context and category (the GetByResource example)"),
    pytest.param(AvailabilityView("Degraded", context="Platform initiated", category="Unplanned"),
                 ("platforminitiated", "unplanned"), id="spelled as the page's later rows"),
    pytest.param(AvailabilityView("Unavailable", health_event_cause="PlatformInitiated", health_event_category="Unplanned"),
                 ("platforminitiated", "unplanned"), id="healthEventCause and healthEventCategory"),
    pytest.param(AvailabilityView("Unavailable", reason_type="Unplanned"), ("platforminitiated", "unplanned"),
                 id="only reasonType Unplanned"),
    pytest.param(AvailabilityView("Unavailable", reason_type="UserInitiated"), ("customerinitiated", "notapplicable"),
                 id="only reasonType UserInitiated"),
    pytest.param(AvailabilityView("Unavailable", context="Customer Initiated", reason_type="Unplanned"),
                 ("customerinitiated", "unplanned"), id="the context wins over reasonType"),
    pytest.param(AvailabilityView("Degraded"), ("", ""), id="nothing said"),
])
def test_the_class_is_read_from_arms_own_fields(view: AvailabilityView, expected: tuple[str, str]) -> None:
    assert arm_class(view) == expected


NOT_THE_CLASS: dict[str, dict[str, str]] = {
    "a customer restart": {"state": "Unavailable", "context": "Customer Initiated", "category": "Not Applicable",
                           "reason_type": "UserInitiated"},
    "planned maintenance": {"state": "Unavailable", "context": "Platform Initiated", "category": "Planned",
                            "reason_type": "Planned"},
    "a guest crash": {"state": "Unavailable", "context": "VM Initiated", "category": "Not Applicable"},
    "no class at all": {"state": "Degraded", "context": "", "category": ""},
}


@pytest.mark.parametrize("case", sorted(NOT_THE_CLASS))
@pytest.mark.parametrize("row", ACTING, ids=lambda r: r.id)
def test_an_acting_row_arm_classes_otherwise_is_only_recorded(row: signal_policy.HealthRow, case: str) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], **NOT_THE_CLASS[case])
    handled = health_events.handle(event_for(row, vm_id(names[0])), fleet.ctx())
    assert handled.outcome is Handling.RECORDED, handled.detail
    assert fleet.ledger.list(KIND) == [] and fleet.cluster_writes() == []
    data = fleet.events.published[-1]["data"]
    assert "not confirmed" in data["note"] and data["action"] == signal_policy.RECORD_ONLY, data


def test_a_degraded_host_annotation_during_a_customer_restart_is_recorded_not_acted_on() -> None:
    """The simulator's customer restart (Unavailable, Customer Initiated) and a degraded-host annotation about
    the same VM (late, misrouted or forged): the state alone would confirm it, the class does not."""
    fleet, names = fleet_with()
    vm = vm_id(names[0])
    context, category, _ = hr.PAGE["VirtualMachineRestarted"]
    arm_says(fleet, names[0], "Unavailable", context=context, category=category, reason_type="UserInitiated")
    degraded = hr.resource_annotated(vm, annotation="VirtualMachinePossiblyDegradedDueToHardwareFailure", at=T0)
    handled = health_events.handle(degraded, fleet.ctx())
    assert handled.outcome is Handling.RECORDED and "Customer Initiated" in handled.detail
    assert fleet.ledger.list(KIND) == [] and fleet.cluster_writes() == []


def test_the_same_annotation_is_acted_on_when_arm_classes_it_as_the_page_does() -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], "Degraded", context="Platform initiated", category="Unplanned")
    event = hr.resource_annotated(vm_id(names[0]), annotation="VirtualMachinePossiblyDegradedDueToHardwareFailure",
                                  at=T0)
    assert health_events.handle(event, fleet.ctx()).outcome is Handling.ADMITTED


# --------------------------------------------------------------------------- an annotation no row names
def _unknown(node: str, name: str = "VirtualMachineSomethingAzureAddsLater", *, at: float = T0) -> dict[str, Any]:
    return hr.resource_annotated(vm_id(node), annotation=name, at=at, reason="r", summary="s",
                                 context="Platform Initiated", category="Unplanned")


def raised(fleet: Any) -> list[dict[str, Any]]:
    return [e for e in fleet.events.published if e["type"] == UNKNOWN_ANNOTATION_EVENT]


def test_an_unknown_annotation_is_recorded_and_raised_once_a_day_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], "Degraded")
    with caplog.at_level(logging.WARNING, logger="steward.remediation.health_events"):
        first = health_events.handle(_unknown(names[0]), fleet.ctx())
        again = health_events.handle(_unknown(names[1], at=T0 + 60), fleet.ctx())  # another node, later: same name
    assert (first.outcome, again.outcome) == (Handling.RECORDED, Handling.RECORDED)
    assert fleet.ledger.list(KIND) == [] and fleet.cluster_writes() == []
    events = raised(fleet)
    assert len(events) == 1, events
    data = events[0]["data"]
    assert (data["annotation"], data["node"], data["policy_row"]) == (
        "VirtualMachineSomethingAzureAddsLater", names[0], signal_policy.UNKNOWN_ANNOTATION_ROW)
    assert events[0]["subject"].endswith(f"/nodes/{names[0]}")
    assert sum("VirtualMachineSomethingAzureAddsLater" in r.getMessage() for r in caplog.records) == 2
    recorded = [e for e in fleet.events.published if e["type"].endswith("SignalRecorded")]
    assert len(recorded) == 2  # recorded as before, once per fault
    fleet.clock.advance(DAY)
    health_events.handle(_unknown(names[0], at=T0 + DAY), fleet.ctx())
    assert len(raised(fleet)) == 2  # a new day: raised again until the table has a row


def test_each_unknown_name_is_raised_and_a_known_one_never() -> None:
    fleet, names = fleet_with()
    health_events.handle(_unknown(names[0], "VirtualMachineNewThingOne"), fleet.ctx())
    health_events.handle(_unknown(names[0], "VirtualMachineNewThingTwo"), fleet.ctx())
    health_events.handle(hr.resource_annotated(vm_id(names[0]), annotation="VirtualMachineRestarted", at=T0),
                         fleet.ctx())
    health_events.handle(hr.availability_changed(vm_id(names[0]), state="Unknown", previous="Available", at=T0),
                         fleet.ctx())
    assert sorted(e["data"]["annotation"] for e in raised(fleet)) == ["VirtualMachineNewThingOne",
                                                                      "VirtualMachineNewThingTwo"]


def test_names_that_are_no_annotation_share_one_raise_a_day() -> None:
    fleet, names = fleet_with()
    for name in ("x" * 300, "Bad Name!", "<script>", "VirtualMachine\nInjected"):
        assert health_events.handle(_unknown(names[0], name), fleet.ctx()).outcome is Handling.RECORDED
    assert [e["data"]["annotation"] for e in raised(fleet)] == ["(malformed)"]
    assert len([r for r in fleet.ledger.list(DEDUPE_KIND) if r.id.startswith("unknown-annotation-")]) == 1


def test_a_flood_of_invented_names_costs_at_most_256_ledger_rows_a_day() -> None:
    fleet, names = fleet_with()
    ctx = fleet.ctx()
    for i in range(1000):
        health_events.handle(_unknown(names[0], f"VirtualMachineInvented{i}"), ctx)
    markers = [r for r in fleet.ledger.list(DEDUPE_KIND) if r.id.startswith("unknown-annotation-")]
    assert 200 < len(markers) <= 256
    assert len(raised(fleet)) == len(markers)
    assert fleet.ledger.list(KIND) == [] and fleet.cluster_writes() == []


def test_a_raise_that_could_not_be_published_is_raised_on_the_next_delivery() -> None:
    fleet, names = fleet_with()
    fleet.events.failures.append(Transient("event grid down"))
    assert health_events.handle(_unknown(names[0]), fleet.ctx()).outcome is Handling.RECORDED
    assert raised(fleet) == []
    health_events.handle(_unknown(names[0]), fleet.ctx())  # Event Grid delivers again
    assert len(raised(fleet)) == 1


def test_an_unknown_annotation_about_a_vm_outside_the_fleet_is_not_raised() -> None:
    fleet, _names = fleet_with()
    handled = health_events.handle(_unknown("aks-gpu-99"), fleet.ctx())
    assert handled.outcome is Handling.IGNORED and fleet.events.published == []


# --------------------------------------------------------------------------- still_present
DEGRADED_KEY = "ResourceHealth/VirtualMachinePossiblyDegradedDueToHardwareFailure"


@pytest.mark.parametrize(("key", "state"), [
    (DEGRADED_KEY, "Degraded"),
    (DEGRADED_KEY, "Unavailable"),
    ("ResourceHealth/Degraded", "Degraded"),
    ("ResourceHealth/VirtualMachineHostCrashed", "Unavailable"),
    ("ResourceHealth/VirtualMachineScheduledForMigrationWithGracePeriod", "Degraded"),
])
def test_a_fault_arm_still_confirms_is_present(key: str, state: str) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], state)
    present, why = still_present(fleet.ctx(), vm_id=vm_id(names[0]), key=key)
    assert present is True, why
    assert state in why


@pytest.mark.parametrize(("case", "view", "key"), [
    ("available again", {"state": "Available", "context": "", "category": ""}, DEGRADED_KEY),
    ("no signal", {"state": "Unknown", "context": "", "category": ""}, DEGRADED_KEY),
    ("a customer restart now", NOT_THE_CLASS["a customer restart"], DEGRADED_KEY),
    ("planned maintenance now", NOT_THE_CLASS["planned maintenance"], "ResourceHealth/VirtualMachineHostCrashed"),
    ("a row that only records", {"state": "Unavailable"}, "ResourceHealth/VirtualMachineRestarted"),
    ("a key no row names", {"state": "Degraded"}, "ResourceHealth/VirtualMachineSomethingNew"),
])
def test_a_fault_arm_no_longer_confirms_is_gone(case: str, view: dict[str, str], key: str) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], **view)
    present, why = still_present(fleet.ctx(), vm_id=vm_id(names[0]), key=key)
    assert present is False, (case, why)
    assert why


def test_a_vm_resource_health_no_longer_knows_is_gone() -> None:
    fleet, _names = fleet_with()
    present, why = still_present(fleet.ctx(), vm_id=vm_id("aks-gpu-99"), key=DEGRADED_KEY)
    assert present is False and "no VM" in why


@pytest.mark.parametrize("error", [Throttled("429"), Transient("503"), Forbidden("AuthorizationFailed")],
                         ids=lambda e: type(e).__name__)
def test_availability_that_cannot_be_read_now_is_neither_present_nor_gone(error: Exception) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], "Degraded")
    assert isinstance(fleet.compute, HealthCompute)
    fleet.compute.error = error
    present, why = still_present(fleet.ctx(), vm_id=vm_id(names[0]), key=DEGRADED_KEY)
    assert present is None and type(error).__name__ in why


def test_still_present_reads_arm_afresh_every_time() -> None:
    fleet, names = fleet_with()
    vm = vm_id(names[0])
    arm_says(fleet, names[0], "Degraded")
    assert still_present(fleet.ctx(), vm_id=vm, key=DEGRADED_KEY)[0] is True
    arm_says(fleet, names[0], "Available", context="", category="")
    assert still_present(fleet.ctx(), vm_id=vm, key=DEGRADED_KEY)[0] is False
    assert fleet.compute.reads == [vm, vm]  # type: ignore[attr-defined]


def test_a_key_of_another_signal_is_a_callers_mistake() -> None:
    fleet, names = fleet_with()
    with pytest.raises(ValueError, match="not a Resource Health signal key"):
        still_present(fleet.ctx(), vm_id=vm_id(names[0]), key="UnhealthyNvidiaDevicePlugin")


def test_the_key_still_present_takes_is_the_one_an_admitted_remediation_carries() -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[2], "Degraded")
    event = hr.resource_annotated(vm_id(names[2]), annotation="VirtualMachineScheduledForServiceHealing", at=T0)
    assert health_events.handle(event, fleet.ctx()).outcome is Handling.ADMITTED
    (record,) = fleet.ledger.list(KIND)
    present, _why = still_present(fleet.ctx(), vm_id=str(record.data["arm_vm_id"]), key=str(record.data["condition"]))
    assert present is True

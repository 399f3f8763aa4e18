"""Simulated HealthResources events: exactly the documented shape, and scenarios the policy reads as intended."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from shared.remediation import signal_policy as sp
from sim.eventgrid import health_resources as hr

SUB = "00000000-0000-0000-0000-000000000001"
NODE_VM = hr.vmss_vm_id(SUB, "MC_rg_aks_eastus", "aks-gpu-12345678-vmss", 3)
AT = 1_721_848_837.9245071


def _ids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"id-{next(counter)}"


def test_availability_changed_is_the_documented_cloudevent() -> None:
    event = hr.availability_changed(NODE_VM, state="Degraded", previous="Available", at=AT, ids=_ids())
    assert event == {
        "id": "id-2",
        "source": f"/subscriptions/{SUB}",
        "subject": NODE_VM,
        "data": {
            "resourceInfo": {
                "id": f"{NODE_VM}/providers/Microsoft.ResourceHealth/availabilityStatuses/id-1",
                "name": "id-1",
                "type": "Microsoft.ResourceHealth/availabilityStatuses",
                "properties": {
                    "targetResourceId": NODE_VM,
                    "targetResourceType": "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
                    "occurredTime": "2024-07-24T19:20:37.9245070Z",
                    "previousAvailabilityState": "Available",
                    "availabilityState": "Degraded",
                },
            },
            "operationalInfo": {"resourceEventTime": "2024-07-24T19:20:37.9245070Z"},
            "apiVersion": "2023-12-01",
        },
        "type": "Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged",
        "specversion": "1.0",
        "time": "2024-07-24T19:20:37.9245070Z",
    }


def test_resource_annotated_carries_name_reason_summary_context_category() -> None:
    event = hr.resource_annotated(NODE_VM, annotation="VirtualMachineDeallocationInitiated", at=AT, ids=_ids())
    props = event["data"]["resourceInfo"]["properties"]
    assert event["type"] == "Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated"
    assert event["data"]["resourceInfo"]["type"] == "Microsoft.ResourceHealth/resourceAnnotations"
    assert event["data"]["apiVersion"] == "2022-08-01"
    # The docs' own example, word for word.
    assert {k: props[k] for k in ("annotationName", "reason", "summary", "context", "category")} == {
        "annotationName": "VirtualMachineDeallocationInitiated",
        "reason": "Stopping and deallocating",
        "summary": "This virtual machine is stopped and deallocated as requested by an authorized user or process.",
        "context": "Customer Initiated",
        "category": "Not Applicable",
    }
    assert list(props)[:3] == ["targetResourceId", "targetResourceType", "occurredTime"]


def test_a_standalone_vm_and_the_event_grid_schema() -> None:
    vm = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm1"
    event = hr.availability_changed(vm, state="Available", previous="Unavailable", at=AT, ids=_ids())
    assert event["data"]["resourceInfo"]["properties"]["targetResourceType"] == "Microsoft.Compute/virtualMachines"
    eg = hr.as_event_grid_schema(event)
    assert set(eg) == {"id", "topic", "subject", "data", "eventType", "dataVersion", "metadataVersion", "eventTime"}
    assert (eg["topic"], eg["eventType"], eg["dataVersion"], eg["metadataVersion"]) == (
        f"/subscriptions/{SUB}", hr.AVAILABILITY_CHANGED, "1", "1")
    assert eg["data"] is event["data"] and eg["eventTime"] == event["time"]


@pytest.mark.parametrize("target", [
    f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/vmss",
    f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c",
    "not-an-id",
])
def test_only_vm_targets(target: str) -> None:
    with pytest.raises(ValueError, match="not a VM"):
        hr.availability_changed(target, state="Degraded", previous="Available", at=AT)


def test_states_and_annotations_are_checked() -> None:
    with pytest.raises(ValueError, match="availability state"):
        hr.availability_changed(NODE_VM, state="Broken", previous="Available", at=AT)
    with pytest.raises(ValueError, match="give reason"):
        hr.resource_annotated(NODE_VM, annotation="SomethingNew", at=AT)
    forged = hr.resource_annotated(NODE_VM, annotation="SomethingNew", at=AT, reason="r", summary="s",
                                   context="Platform Initiated", category="Unplanned")
    assert forged["data"]["resourceInfo"]["properties"]["annotationName"] == "SomethingNew"


def test_ids_are_unique_by_default() -> None:
    a, b = hr.degraded_host(NODE_VM, at=AT)
    ids = {a["id"], b["id"], a["data"]["resourceInfo"]["name"], b["data"]["resourceInfo"]["name"]}
    assert len(ids) == 4


def _decisions(events: list[dict[str, object]]) -> list[tuple[str, str]]:
    out = []
    for event in events:
        props = event["data"]["resourceInfo"]["properties"]  # type: ignore[index]
        d = sp.health_event_action(str(event["type"]), props.get("availabilityState"), props.get("annotationName"))
        out.append((d.action, d.row))
    return out


@pytest.mark.parametrize(("scenario", "expected"), [
    ("degraded-host", [(sp.CORDON_DRAIN, "health:availability:Degraded"),
                       (sp.CORDON_DRAIN, "health:annotation:VirtualMachinePossiblyDegradedDueToHardwareFailure")]),
    ("reboot-for-repair", [(sp.RECORD_ONLY, "health:availability:Unavailable"),
                           (sp.RECORD_ONLY, "health:annotation:VirtualMachineHostRebootedForRepair"),
                           (sp.RECORD_ONLY, "health:availability:Available")]),
    ("planned-maintenance", [(sp.RECORD_ONLY, "health:annotation:VirtualMachineRebootInitiatedForPlannedMaintenance"),
                             (sp.RECORD_ONLY, "health:availability:Unavailable"),
                             (sp.RECORD_ONLY, "health:availability:Available")]),
    ("host-failure", [(sp.RECORD_ONLY, "health:availability:Unavailable"),
                      (sp.REPLACE, "health:annotation:VirtualMachineHostCrashed")]),
    ("customer-restart", [(sp.RECORD_ONLY, "health:annotation:VirtualMachineRestarted"),
                          (sp.RECORD_ONLY, "health:availability:Unavailable"),
                          (sp.RECORD_ONLY, "health:availability:Available")]),
])
def test_scenarios_read_through_the_policy(scenario: str, expected: list[tuple[str, str]]) -> None:
    events = hr.SCENARIOS[scenario](NODE_VM, at=AT, ids=_ids())
    assert _decisions(events) == expected
    assert all(e["subject"] == NODE_VM and e["source"] == f"/subscriptions/{SUB}" for e in events)
    times = [e["time"] for e in events]
    assert times == sorted(times)


def test_every_scenario_annotation_is_a_documented_one() -> None:
    documented = {r.key for r in sp.HEALTH_TABLE if r.event_type == sp.RESOURCE_ANNOTATED}
    assert set(hr.ANNOTATIONS) <= documented
    contexts = {"Platform Initiated", "Customer Initiated", "VM Initiated", "Unknown"}
    categories = {"Planned", "Unplanned", "Not Applicable", "Unknown"}
    assert all(c in contexts and k in categories for _, _, c, k in hr.ANNOTATIONS.values())

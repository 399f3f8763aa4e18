"""Azure Resource Health events, shaped as the HealthResources system topic delivers them.

Source: "Azure Resource Notifications - Health Resources events in Azure Event Grid"
(https://learn.microsoft.com/azure/event-grid/event-schema-health-resources; MicrosoftDocs/azure-docs
articles/event-grid/event-schema-health-resources.md) and, for the annotation names with their
context and category, "Resource Health virtual machine Health Annotations"
(MicrosoftDocs/azure-monitor-docs articles/service-health/resource-health-vm-annotation.md, ms.date 03/18/2026:
every annotation of its table is in :data:`PAGE`).

Schema choice: the page documents both the CloudEvents 1.0 and the Event Grid event schema for this
topic. The app's Event Grid trigger takes ``func.CloudEvent`` (functions/remediation.py), so its
subscription will deliver CloudEvents 1.0 (``deliverySchema: CloudEventSchemaV1_0``); the builders
return that form, and :func:`as_event_grid_schema` gives the other one for tests of a subscription
left on the default schema.

Field by field (CloudEvents form): ``id`` (unique), ``source`` = ``/subscriptions/{id}``, ``subject`` =
the target resource id (the documented examples use the VM's id), ``type``, ``time``,
``specversion`` = ``"1.0"``, ``data`` = ``{resourceInfo: {id, name, type, properties}, operationalInfo:
{resourceEventTime}, apiVersion}``. ``resourceInfo.id`` is the target id plus
``/providers/Microsoft.ResourceHealth/{availabilityStatuses|resourceAnnotations}/{event-id}`` and
``name`` is that event id. The ``apiVersion`` values are the ones in the docs' examples.

``reason`` and ``summary`` are free text on Azure's side. Apart from the one documented example
(``VirtualMachineDeallocationInitiated``), the simulator quotes the annotation page's description as
the summary and writes a short reason of its own. The app must decide from ``annotationName``,
``context`` and ``category``, never from those texts.

Wired by sim/arm/resource_health.py: per-VM state, the ARM availability route, and delivery through the
Event Grid feed (``POST /_sim/resource-health``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

AVAILABILITY_CHANGED = "Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged"
RESOURCE_ANNOTATED = "Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated"
AVAILABILITY_STATES = ("Available", "Unavailable", "Degraded", "Unknown")
AVAILABILITY_API_VERSION = "2023-12-01"
ANNOTATION_API_VERSION = "2022-08-01"

PLATFORM, CUSTOMER, VM = "Platform Initiated", "Customer Initiated", "VM Initiated"
PLANNED, UNPLANNED, NOT_APPLICABLE = "Planned", "Unplanned", "Not Applicable"

#: The page's table of annotations (ms.date 03/18/2026; MicrosoftDocs/azure-monitor-docs
#: articles/service-health/resource-health-vm-annotation.md): name -> (Context, Category, ImpactType), spelled as the
#: page's Overview lists the values (the table itself writes "Platform initiated" and "Not Applicaple" on later rows).
PAGE: dict[str, tuple[str, str, str]] = {
    "PossiblyDegradedDueToHardwareFailureWithRedeployDeadline": (PLATFORM, UNPLANNED, "Degraded"),
    "VirtualMachineRestarted": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineCrashed": (VM, NOT_APPLICABLE, "Downtime Reboot"),
    "VirtualMachineStorageOffline": (PLATFORM, UNPLANNED, "Downtime Reboot"),
    "VirtualMachineFailedToSecureBoot": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "LiveMigrationSucceeded": (PLATFORM, UNPLANNED, "Downtime Freeze"),
    "LiveMigrationFailure": (PLATFORM, UNPLANNED, "Downtime Freeze"),
    "VirtualMachineAllocated": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineDeallocationInitiated": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineHostCrashed": (PLATFORM, UNPLANNED, "Downtime Reboot"),
    "VirtualMachineMigrationInitiatedForPlannedMaintenance": (PLATFORM, PLANNED, "Downtime Reboot"),
    "VirtualMachineRebootInitiatedForPlannedMaintenance": (PLATFORM, PLANNED, "Downtime Reboot"),
    "VirtualMachineHostRebootedForRepair": (PLATFORM, UNPLANNED, "Downtime Reboot"),
    "VirtualMachineMigrationInitiatedForRepair": (PLATFORM, UNPLANNED, "Downtime Reboot"),
    "VirtualMachinePlannedFreezeStarted": (PLATFORM, PLANNED, "Informational"),
    "VirtualMachinePlannedFreezeSucceeded": (PLATFORM, PLANNED, "Downtime Freeze"),
    "VirtualMachinePlannedFreezeFailed": (PLATFORM, PLANNED, "Downtime Freeze"),
    "VirtualMachineRedeployInitiatedByControlPlaneDueToPlannedMaintenance": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineMigrationScheduledForDegradedHardware": (PLATFORM, UNPLANNED, "Degraded"),
    "VirtualMachinePossiblyDegradedDueToHardwareFailure": (PLATFORM, UNPLANNED, "Degraded"),
    "VirtualMachineScheduledForServiceHealing": (PLATFORM, UNPLANNED, "Degraded"),
    "VirtualMachinePreempted": (PLATFORM, UNPLANNED, "Informational"),
    "VirtualMachineRebootInitiatedByControlPlane": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineRedeployInitiatedByControlPlane": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineSizeChanged": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineConfigurationUpdated": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineStartInitiatedByControlPlane": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineStopInitiatedByControlPlane": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineStoppedInternally": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineProvisioningTimedOut": (PLATFORM, UNPLANNED, "Informational"),
    "AccelnetUnhealthy": (PLATFORM, UNPLANNED, "Degraded"),
    "VirtualMachineMigratedDueToHardwareFailure": (PLATFORM, UNPLANNED, "Informational"),
    **{f"VirtualMachinePossiblyDegradedDueToHardwareFailure{v}": (PLATFORM, UNPLANNED, "Degraded")
       for v in ("LiveMigrationEligible", "LiveMigrationNotEligible", "WithRedeployDeadline",
                 "WithRedeployDeadlineLiveMigrationEligible", "WithRedeployDeadlineLiveMigrationNotEligible")},
    **{f"{base}{v}": (PLATFORM, UNPLANNED, "Degraded")
       for base in ("VirtualMachineScheduledForServiceHealing", "VirtualMachineMigrationScheduledForDegradedHardware")
       for v in ("LiveMigrationEligible", "LiveMigrationNotEligible")},
    "VirtualMachineStopInitiatedByControlPlaneTrackingId": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineFailedSecureKeyRelease": (CUSTOMER, NOT_APPLICABLE, "Informational"),
    "VirtualMachineScheduledForMigrationWithGracePeriod": (PLATFORM, UNPLANNED, "Downtime Reboot"),
    "NetworkUnhealthy": (PLATFORM, UNPLANNED, "Downtime Reboot"),
}

#: The scenario annotations' texts: (reason written by the simulator, summary quoted from the docs).
_TEXTS: dict[str, tuple[str, str]] = {
    "VirtualMachinePossiblyDegradedDueToHardwareFailure": (
        "Degraded host hardware",
        "The Virtual Machine is experiencing an imminent risk to its availability as it is running on a host server "
        "with a degraded hardware component that will fail soon."),
    "VirtualMachineHostRebootedForRepair": (
        "Host rebooted for repair",
        "The Virtual Machine is undergoing a reboot due to the underlying host server experiencing unexpected "
        "failures. While the Virtual Machine is rebooting, the local data remains unaffected."),
    "VirtualMachineRebootInitiatedForPlannedMaintenance": (
        "Planned maintenance reboot",
        "The Virtual Machine is undergoing a reboot as part of routine maintenance workflows orchestrated by the "
        "platform. No other action is required at this time."),
    "VirtualMachineHostCrashed": (
        "Host crashed",
        "The Virtual Machine has unexpectedly crashed due to the underlying host server experiencing a software "
        "failure or due to a failed hardware component."),
    "VirtualMachineDeallocationInitiated": (
        "Stopping and deallocating",
        "This virtual machine is stopped and deallocated as requested by an authorized user or process."),
    "VirtualMachineRestarted": (
        "Restarted by a user",
        "The Virtual Machine is undergoing a reboot as requested by a restart action triggered by an authorized "
        "user or process from within the Virtual Machine."),
}

#: Every page annotation: (reason, summary, context, category). Outside the scenarios' six, the reason and
#: summary are the simulator's own words (free text the app never reads).
ANNOTATIONS: dict[str, tuple[str, str, str, str]] = {
    name: (*_TEXTS.get(name, (name, f"Resource Health annotation {name} ({impact}).")), context, category)
    for name, (context, category, impact) in PAGE.items()
}

_VMSS_VM = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
                      r"virtualMachineScaleSets/[^/]+/virtualMachines/[^/]+$", re.IGNORECASE)
_VM = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
                 r"virtualMachines/[^/]+$", re.IGNORECASE)


def vmss_vm_id(subscription: str, resource_group: str, vmss: str, instance: str | int) -> str:
    """The ARM id of a scale-set VM (an AKS node's ``properties.resourceId`` in the machines API)."""
    return (f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Compute/"
            f"virtualMachineScaleSets/{vmss}/virtualMachines/{instance}")


def _target(target_id: str) -> tuple[str, str]:
    """(subscription id, targetResourceType) of a VM or scale-set VM id; ValueError for anything else."""
    m = _VMSS_VM.match(target_id)
    if m:
        return m.group("sub"), "Microsoft.Compute/virtualMachineScaleSets/virtualMachines"
    m = _VM.match(target_id)
    if m:
        return m.group("sub"), "Microsoft.Compute/virtualMachines"
    raise ValueError(f"{target_id!r} is not a VM or scale-set VM resource id")


def event_time(at: float) -> str:
    """The docs' time format, seven fractional digits: ``2023-07-24T19:20:37.9245071Z``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"


def _event(kind: str, target_id: str, properties: dict[str, Any], *, at: float, ids: Callable[[], str],
           api_version: str) -> dict[str, Any]:
    subscription, target_type = _target(target_id)
    health_id = ids()
    collection = "availabilityStatuses" if kind == AVAILABILITY_CHANGED else "resourceAnnotations"
    when = event_time(at)
    return {
        "id": ids(),
        "source": f"/subscriptions/{subscription}",
        "subject": target_id,
        "data": {
            "resourceInfo": {
                "id": f"{target_id}/providers/Microsoft.ResourceHealth/{collection}/{health_id}",
                "name": health_id,
                "type": f"Microsoft.ResourceHealth/{collection}",
                "properties": {"targetResourceId": target_id, "targetResourceType": target_type,
                               "occurredTime": when, **properties},
            },
            "operationalInfo": {"resourceEventTime": when},
            "apiVersion": api_version,
        },
        "type": kind,
        "specversion": "1.0",
        "time": when,
    }


def _uuid() -> str:
    return str(uuid.uuid4())


def availability_changed(target_id: str, *, state: str, previous: str, at: float,
                         ids: Callable[[], str] = _uuid) -> dict[str, Any]:
    """An AvailabilityStatusChanged CloudEvent (``state`` / ``previous``: Available, Unavailable, Degraded, Unknown)."""
    for value in (state, previous):
        if value not in AVAILABILITY_STATES:
            raise ValueError(f"{value!r} is not an availability state ({', '.join(AVAILABILITY_STATES)})")
    return _event(AVAILABILITY_CHANGED, target_id, {"previousAvailabilityState": previous, "availabilityState": state},
                  at=at, ids=ids, api_version=AVAILABILITY_API_VERSION)


def resource_annotated(target_id: str, *, annotation: str, at: float, ids: Callable[[], str] = _uuid,
                       reason: str | None = None, summary: str | None = None, context: str | None = None,
                       category: str | None = None) -> dict[str, Any]:
    """A ResourceAnnotated CloudEvent. The page's annotations fill their texts from :data:`ANNOTATIONS` (their
    ``context`` and ``category`` the page's); any other name (a forged or future one) needs every text given."""
    known = ANNOTATIONS.get(annotation)
    if known is None and None in (reason, summary, context, category):
        raise ValueError(f"{annotation!r} is not a scenario annotation: give reason, summary, context and category")
    d_reason, d_summary, d_context, d_category = known or ("", "", "", "")
    props = {"annotationName": annotation, "reason": reason or d_reason, "summary": summary or d_summary,
             "context": context or d_context, "category": category or d_category}
    return _event(RESOURCE_ANNOTATED, target_id, props, at=at, ids=ids, api_version=ANNOTATION_API_VERSION)


def as_event_grid_schema(event: dict[str, Any]) -> dict[str, Any]:
    """The same event in the Event Grid event schema (``topic``, ``eventType``, ``eventTime``,
    ``dataVersion``/``metadataVersion`` "1", as in the docs' examples)."""
    return {"id": event["id"], "topic": event["source"], "subject": event["subject"], "data": event["data"],
            "eventType": event["type"], "dataVersion": "1", "metadataVersion": "1", "eventTime": event["time"]}


# --------------------------------------------------------------------------- scenarios
def degraded_host(target_id: str, *, at: float, ids: Callable[[], str] = _uuid) -> list[dict[str, Any]]:
    """Azure predicts a host hardware failure: Degraded, with the reason."""
    return [availability_changed(target_id, state="Degraded", previous="Available", at=at, ids=ids),
            resource_annotated(target_id, annotation="VirtualMachinePossiblyDegradedDueToHardwareFailure",
                               at=at, ids=ids)]


def reboot_for_repair(target_id: str, *, at: float, down_s: float = 300.0,
                      ids: Callable[[], str] = _uuid) -> list[dict[str, Any]]:
    """The platform reboots the VM to repair its host, and it comes back."""
    return [availability_changed(target_id, state="Unavailable", previous="Available", at=at, ids=ids),
            resource_annotated(target_id, annotation="VirtualMachineHostRebootedForRepair", at=at, ids=ids),
            availability_changed(target_id, state="Available", previous="Unavailable", at=at + down_s, ids=ids)]


def planned_maintenance(target_id: str, *, at: float, down_s: float = 120.0,
                        ids: Callable[[], str] = _uuid) -> list[dict[str, Any]]:
    """A planned-maintenance reboot: announced, down briefly, back."""
    return [resource_annotated(target_id, annotation="VirtualMachineRebootInitiatedForPlannedMaintenance", at=at,
                               ids=ids),
            availability_changed(target_id, state="Unavailable", previous="Available", at=at, ids=ids),
            availability_changed(target_id, state="Available", previous="Unavailable", at=at + down_s, ids=ids)]


def host_failure(target_id: str, *, at: float, ids: Callable[[], str] = _uuid) -> list[dict[str, Any]]:
    """The host crashed under the VM: Unavailable, with the reason."""
    return [availability_changed(target_id, state="Unavailable", previous="Available", at=at, ids=ids),
            resource_annotated(target_id, annotation="VirtualMachineHostCrashed", at=at, ids=ids)]


def customer_restart(target_id: str, *, at: float, down_s: float = 120.0,
                     ids: Callable[[], str] = _uuid) -> list[dict[str, Any]]:
    """An authorized user restarts the VM (Customer Initiated): the reason first, down briefly, back."""
    return [resource_annotated(target_id, annotation="VirtualMachineRestarted", at=at, ids=ids),
            availability_changed(target_id, state="Unavailable", previous="Available", at=at, ids=ids),
            availability_changed(target_id, state="Available", previous="Unavailable", at=at + down_s, ids=ids)]


SCENARIOS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "degraded-host": degraded_host,
    "reboot-for-repair": reboot_for_repair,
    "planned-maintenance": planned_maintenance,
    "host-failure": host_failure,
    "customer-restart": customer_restart,
}

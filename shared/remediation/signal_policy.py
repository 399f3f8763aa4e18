"""What a Resource Health event, an XID or a DCGM error counter asks remediation to do: tables as data.

Pure: no I/O, no clock, no settings read here (the caller hands over the override string). Every row
carries its id (shown in the report next to the signal, "signal + policy row that matched"), its
action and the public source it was taken from; ``docs/signals-sources.md`` summarises the sources.

Actions:

- Resource Health (``HEALTH_ACTIONS``): ``record_only`` (ledger entry, nothing touched),
  ``cordon_drain`` (cordon and drain ahead of the predicted failure, then the normal repair ladder),
  ``replace`` (skip straight to the ladder's replace rung).
- XID and counters (``XID_ACTIONS``): ``ignore`` (an application fault: not even recorded),
  ``record_only``, ``restart`` (the catalogue's RESET_GPU / reboot: enter the normal ladder at its
  restart rung; a node cannot reset one GPU from outside, a reboot resets them all),
  ``restart_then_replace`` (restart once; if the fault is seen again, skip reimage and replace) and
  ``replace``.

Safe default: a signal that no row names (an annotation Azure adds later, an XID the catalogue
grows, an event type we never subscribed to) is **recorded only** (an unknown annotation is also raised as
``Steward.Signal.UnknownAnnotation`` by shared.remediation.health_events). Acting on what the table does not
know could drain a fleet on an informational annotation or a customer-initiated restart (our own
restarts and reimages raise ``VirtualMachineRestarted`` / ``...ByControlPlane`` annotations too). An
operator who wants action on such an XID says so with an override.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shared.kernel.env import SettingError

RECORD_ONLY = "record_only"
CORDON_DRAIN = "cordon_drain"
REPLACE = "replace"
IGNORE = "ignore"
RESTART = "restart"
RESTART_THEN_REPLACE = "restart_then_replace"

HEALTH_ACTIONS: tuple[str, ...] = (RECORD_ONLY, CORDON_DRAIN, REPLACE)
XID_ACTIONS: tuple[str, ...] = (IGNORE, RECORD_ONLY, RESTART, RESTART_THEN_REPLACE, REPLACE)

XID_OVERRIDES_SETTING = "SIGNALS_XID_OVERRIDES"

# --------------------------------------------------------------------------- sources
SRC_HEALTH_EVENTS = ("https://learn.microsoft.com/azure/event-grid/event-schema-health-resources "
                     "(MicrosoftDocs/azure-docs articles/event-grid/event-schema-health-resources.md)")
SRC_ANNOTATIONS = ("https://learn.microsoft.com/azure/service-health/resource-health-vm-annotation "
                   "(MicrosoftDocs/azure-monitor-docs articles/service-health/resource-health-vm-annotation.md, "
                   "ms.date 03/18/2026)")
SRC_XID = ("https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Resolution Bucket (Immediate "
           "Action); machine-readable in NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/gpu-health-monitor/"
           "xiderrorsmapping.csv")
SRC_MEM_FLAGS = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html"
SRC_DCGM_FIELDS = "NVIDIA/dcgm-exporter etc/default-counters.csv; DCGM field ids (dcgm_fields.h)"
SRC_DEFAULT = "this module's safe default: never act on a signal the table does not name"
SRC_OVERRIDE = f"setting {XID_OVERRIDES_SETTING}"

AVAILABILITY_CHANGED = "Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged"
RESOURCE_ANNOTATED = "Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated"
HEALTH_EVENT_TYPES: tuple[str, ...] = (AVAILABILITY_CHANGED, RESOURCE_ANNOTATED)


@dataclass(frozen=True)
class Decision:
    """What to do about one signal, and why: ``row`` is the policy row id that matched, ``source`` its
    citation, ``note`` the row's one-line reason (for the report)."""

    action: str
    row: str
    source: str
    note: str = ""


# The page's attribute values (its "Overview": Context, Category, ImpactType), spelled as its Overview lists them.
PLATFORM_INITIATED, CUSTOMER_INITIATED, VM_INITIATED = "Platform Initiated", "Customer Initiated", "VM Initiated"
PLANNED, UNPLANNED, NOT_APPLICABLE = "Planned", "Unplanned", "Not Applicable"
IMPACT_DEGRADED, DOWNTIME_REBOOT, DOWNTIME_FREEZE, INFORMATIONAL = ("Degraded", "Downtime Reboot", "Downtime Freeze",
                                                                    "Informational")
HOST_FAILURE_ANNOTATION = "VirtualMachineHostCrashed"
UNKNOWN_ANNOTATION_ROW = "health:default:annotation"


def rule_action(annotation: str, impact_type: str) -> str:
    """The one rule every annotation row follows unless it names an exception: ImpactType ``Degraded`` (Azure
    predicts the host will fail) -> cordon_drain; the host failure itself (``VirtualMachineHostCrashed``,
    Downtime Reboot: "redeploy ... to a different host server") -> replace; everything else -> record_only
    (the platform repairs, maintains or reports on its own, or a user did it)."""
    if impact_type.strip().lower() == IMPACT_DEGRADED.lower():
        return CORDON_DRAIN
    if annotation == HOST_FAILURE_ANNOTATION:
        return REPLACE
    return RECORD_ONLY


def class_key(text: str) -> str:
    """A Context or Category compared as ARM and the page spell it in several ways ("Platform Initiated",
    "Platform initiated", "PlatformInitiated"): its letters, lower case."""
    return "".join(c for c in text.lower() if c.isalpha())


@dataclass(frozen=True)
class HealthRow:
    """One Resource Health row: ``key`` is an availability state (AvailabilityStatusChanged) or an
    annotation name (ResourceAnnotated); ``impact`` is the page's ``Context / Category / ImpactType``.
    ``exception`` says why the row's action departs from :func:`rule_action` (empty: it follows the rule)."""

    event_type: str
    key: str
    action: str
    impact: str
    note: str
    exception: str = ""

    @property
    def id(self) -> str:
        kind = "availability" if self.event_type == AVAILABILITY_CHANGED else "annotation"
        return f"health:{kind}:{self.key}"

    @property
    def source(self) -> str:
        return SRC_HEALTH_EVENTS if self.event_type == AVAILABILITY_CHANGED else SRC_ANNOTATIONS

    @property
    def attributes(self) -> tuple[str, str, str]:
        """``(Context, Category, ImpactType)`` of an annotation row; empty strings for a state row."""
        if self.event_type != RESOURCE_ANNOTATED:
            return "", "", ""
        context, category, impact_type = (part.strip() for part in self.impact.split("/"))
        return context, category, impact_type

    @property
    def confirming_class(self) -> tuple[str, str]:
        """The ``(context, category)`` ARM's current availability must report for this row to act
        (shared.remediation.health_events): an annotation's own Context and Category; for a state row, the
        class every acting annotation has (Platform Initiated / Unplanned): a Degraded VM the platform did
        not find degraded by itself is no reason to drain it."""
        if self.event_type == RESOURCE_ANNOTATED:
            context, category, _ = self.attributes
            return context, category
        return PLATFORM_INITIATED, UNPLANNED


def _avail(state: str, action: str, note: str) -> HealthRow:
    return HealthRow(AVAILABILITY_CHANGED, state, action, "availabilityState", note)


def _ann(name: str, action: str, impact: str, note: str, *, exception: str = "") -> HealthRow:
    return HealthRow(RESOURCE_ANNOTATED, name, action, impact, note, exception)


_PLAT_UNPL = f"{PLATFORM_INITIATED} / {UNPLANNED}"
_PLAT_PLAN = f"{PLATFORM_INITIATED} / {PLANNED}"
_DEGRADED = f"{_PLAT_UNPL} / {IMPACT_DEGRADED}"
_CUST = f"{CUSTOMER_INITIATED} / {NOT_APPLICABLE} / {INFORMATIONAL}"
_OURS = "an authorized user or process (our own restarts and reimages raise it too)"
_NO_LM, _LM, _DEADLINE = "no live migration", "live migration attempted (best effort)", "redeploy before the deadline"
#: The Degraded rows about a failing host: (annotation, what the page says besides "host may fail; redeploy").
_PREDICTED_FAILURES: tuple[tuple[str, str], ...] = (
    ("VirtualMachinePossiblyDegradedDueToHardwareFailure", _DEADLINE),
    ("PossiblyDegradedDueToHardwareFailureWithRedeployDeadline", _DEADLINE),
    ("VirtualMachinePossiblyDegradedDueToHardwareFailureLiveMigrationEligible", _LM),
    ("VirtualMachinePossiblyDegradedDueToHardwareFailureLiveMigrationNotEligible", f"{_NO_LM}: redeploy as soon as possible"),
    ("VirtualMachinePossiblyDegradedDueToHardwareFailureWithRedeployDeadline", _DEADLINE),
    ("VirtualMachinePossiblyDegradedDueToHardwareFailureWithRedeployDeadlineLiveMigrationEligible", f"{_LM}; {_DEADLINE}"),
    ("VirtualMachinePossiblyDegradedDueToHardwareFailureWithRedeployDeadlineLiveMigrationNotEligible", f"{_NO_LM}; {_DEADLINE}"),
    ("VirtualMachineMigrationScheduledForDegradedHardware", f"live migration may fail; {_DEADLINE}"),
    ("VirtualMachineMigrationScheduledForDegradedHardwareLiveMigrationEligible", f"{_LM}; {_DEADLINE}"),
    ("VirtualMachineMigrationScheduledForDegradedHardwareLiveMigrationNotEligible", f"{_NO_LM}; {_DEADLINE}"),
    ("VirtualMachineScheduledForServiceHealing", f"host with fatal errors, live migration may fail; {_DEADLINE}"),
    ("VirtualMachineScheduledForServiceHealingLiveMigrationEligible", f"{_LM}; {_DEADLINE}"),
    ("VirtualMachineScheduledForServiceHealingLiveMigrationNotEligible", f"{_NO_LM}; {_DEADLINE}"),
)

#: Every availability state and every annotation of the Resource Health VM annotations page (ms.date
#: 03/18/2026; tests/fixtures/resource_health_annotations.tsv holds its table and a test holds this one to it).
HEALTH_TABLE: tuple[HealthRow, ...] = (
    _avail("Available", RECORD_ONLY, "recovered; the node's own checks verify the repair"),
    _avail("Degraded", CORDON_DRAIN, "the platform sees reduced availability: move work off before it fails"),
    _avail("Unavailable", RECORD_ONLY, "the reason arrives as an annotation (user stops and planned reboots are "
                                       "Unavailable too); the annotation row decides"),
    _avail("Unknown", RECORD_ONLY, "no health signal from the platform: nothing to infer"),
    # ImpactType Degraded: Azure predicts a hardware failure on the host ("we strongly recommend redeploying").
    # Live migration is best effort (and the page's eligibility variants change nothing for us): drain ahead.
    *(_ann(name, CORDON_DRAIN, _DEGRADED, f"host hardware may fail ({says}): drain ahead, then repair")
      for name, says in _PREDICTED_FAILURES),
    _ann("AccelnetUnhealthy", CORDON_DRAIN, _DEGRADED,
         "accelerated networking not working (docs: redeploy): drain, then repair"),
    # The one exception to the rule: Downtime Reboot, but announced ahead with a grace period.
    _ann("VirtualMachineScheduledForMigrationWithGracePeriod", CORDON_DRAIN, f"{_PLAT_UNPL} / {DOWNTIME_REBOOT}",
         "hardware failure or severe degradation; the platform will move the VM after a grace period: drain ahead",
         exception="the page gives it the Degraded rows' advice (\"we strongly recommend redeploying ... before the "
                   "deadline\") and the move WILL happen: drain ahead at a time we choose, like a Degraded row; not "
                   "replace, since the platform itself moves the VM to a healthy host"),
    # Host failure: the VM crashed with its host; a new VM lands on another host.
    _ann(HOST_FAILURE_ANNOTATION, REPLACE, f"{_PLAT_UNPL} / {DOWNTIME_REBOOT}",
         "host software or hardware failure (docs: redeploy to a different host): replace"),
    # Self-healing and platform repairs already under way or done: record, let the node's checks judge afterwards.
    _ann("VirtualMachineHostRebootedForRepair", RECORD_ONLY, f"{_PLAT_UNPL} / {DOWNTIME_REBOOT}",
         "the platform is already repairing (self-healing reboot)"),
    _ann("VirtualMachineMigrationInitiatedForRepair", RECORD_ONLY, f"{_PLAT_UNPL} / {DOWNTIME_REBOOT}",
         "service healing moves the VM to a healthy host"),
    _ann("VirtualMachineMigratedDueToHardwareFailure", RECORD_ONLY, f"{_PLAT_UNPL} / {INFORMATIONAL}",
         "already redeployed to a healthy host (docs: no further action)"),
    _ann("VirtualMachineStorageOffline", RECORD_ONLY, f"{_PLAT_UNPL} / {DOWNTIME_REBOOT}",
         "the platform is re-establishing disk access"),
    _ann("NetworkUnhealthy", RECORD_ONLY, f"{_PLAT_UNPL} / {DOWNTIME_REBOOT}",
         "network failure under the host; Azure has started recovery (docs: no action required)"),
    _ann("LiveMigrationSucceeded", RECORD_ONLY, f"{_PLAT_UNPL} / {DOWNTIME_FREEZE}", "brief pause; no action required"),
    _ann("LiveMigrationFailure", RECORD_ONLY, f"{_PLAT_UNPL} / {DOWNTIME_FREEZE}", "brief pause; no action required"),
    _ann("VirtualMachineCrashed", RECORD_ONLY, f"{VM_INITIATED} / {NOT_APPLICABLE} / {DOWNTIME_REBOOT}",
         "guest OS crash; the VM reboots by itself"),
    _ann("VirtualMachineProvisioningTimedOut", RECORD_ONLY, f"{_PLAT_UNPL} / {INFORMATIONAL}",
         "a node that never joined is AKS's business (start-up grace)"),
    _ann("VirtualMachinePreempted", RECORD_ONLY, f"{_PLAT_UNPL} / {INFORMATIONAL}", "Spot eviction, not a fault"),
    # Planned maintenance.
    _ann("VirtualMachineMigrationInitiatedForPlannedMaintenance", RECORD_ONLY, f"{_PLAT_PLAN} / {DOWNTIME_REBOOT}",
         "planned maintenance"),
    _ann("VirtualMachineRebootInitiatedForPlannedMaintenance", RECORD_ONLY, f"{_PLAT_PLAN} / {DOWNTIME_REBOOT}",
         "planned maintenance"),
    _ann("VirtualMachinePlannedFreezeStarted", RECORD_ONLY, f"{_PLAT_PLAN} / {INFORMATIONAL}", "planned freeze"),
    _ann("VirtualMachinePlannedFreezeSucceeded", RECORD_ONLY, f"{_PLAT_PLAN} / {DOWNTIME_FREEZE}", "planned freeze"),
    _ann("VirtualMachinePlannedFreezeFailed", RECORD_ONLY, f"{_PLAT_PLAN} / {DOWNTIME_FREEZE}",
         "the platform coordinates recovery itself"),
    # Customer initiated: operators, AKS and this app itself.
    _ann("VirtualMachineRestarted", RECORD_ONLY, _CUST, f"restart by {_OURS}"),
    _ann("VirtualMachineRebootInitiatedByControlPlane", RECORD_ONLY, _CUST, f"reboot by {_OURS}"),
    _ann("VirtualMachineRedeployInitiatedByControlPlane", RECORD_ONLY, _CUST, f"redeploy by {_OURS}"),
    _ann("VirtualMachineRedeployInitiatedByControlPlaneDueToPlannedMaintenance", RECORD_ONLY, _CUST,
         "redeploy for planned maintenance, user-triggered"),
    _ann("VirtualMachineAllocated", RECORD_ONLY, _CUST, "VM being set up"),
    _ann("VirtualMachineDeallocationInitiated", RECORD_ONLY, _CUST, "stop/deallocate by an authorized user"),
    _ann("VirtualMachineStartInitiatedByControlPlane", RECORD_ONLY, _CUST, "start by an authorized user"),
    _ann("VirtualMachineStopInitiatedByControlPlane", RECORD_ONLY, _CUST, "stop by an authorized user"),
    _ann("VirtualMachineStopInitiatedByControlPlaneTrackingId", RECORD_ONLY, _CUST,
         "stop by an authorized user, with a tracking id"),
    _ann("VirtualMachineStoppedInternally", RECORD_ONLY, _CUST, "stopped from inside the VM"),
    _ann("VirtualMachineSizeChanged", RECORD_ONLY, _CUST, "resize by an authorized user"),
    _ann("VirtualMachineConfigurationUpdated", RECORD_ONLY, _CUST, "configuration update by an authorized user"),
    _ann("VirtualMachineFailedToSecureBoot", RECORD_ONLY, _CUST, "confidential VMs only; unsigned boot components"),
    _ann("VirtualMachineFailedSecureKeyRelease", RECORD_ONLY, _CUST,
         "confidential VMs only; key release policy or permissions to fix"),
)

_HEALTH_INDEX: Mapping[tuple[str, str], HealthRow] = {(r.event_type, r.key): r for r in HEALTH_TABLE}
_HEALTH_BY_KEY: Mapping[str, HealthRow] = {r.key: r for r in HEALTH_TABLE}


def health_row(key: str) -> HealthRow | None:
    """The row of a state or an annotation name (the two never share a name), or None."""
    return _HEALTH_BY_KEY.get(key)


def health_event_action(event_type: str, state: str | None, annotation: str | None) -> Decision:
    """The row for one HealthResources event: ``state`` (availabilityState) decides an
    AvailabilityStatusChanged event, ``annotation`` (annotationName) a ResourceAnnotated one.

    Names are matched exactly (the docs spell them one way); anything the table does not name is
    recorded only (see the module docstring for why) and, for an annotation, raised as unknown by
    shared.remediation.health_events.
    """
    key = state if event_type == AVAILABILITY_CHANGED else annotation if event_type == RESOURCE_ANNOTATED else None
    row = _HEALTH_INDEX.get((event_type, key or ""))
    if row is not None:
        return Decision(row.action, row.id, row.source, row.note)
    if event_type not in HEALTH_EVENT_TYPES:
        return Decision(RECORD_ONLY, "health:default:event-type", SRC_DEFAULT, f"unknown event type {event_type!r}")
    what = "availability state" if event_type == AVAILABILITY_CHANGED else "annotation"
    return Decision(RECORD_ONLY, f"health:default:{what.split()[0]}", SRC_DEFAULT, f"unknown {what} {key!r}")


# --------------------------------------------------------------------------- XIDs
@dataclass(frozen=True)
class XidRow:
    """One XID row: ``mnemonic`` and ``bucket`` (the catalogue's immediate action) as NVIDIA writes them."""

    xid: int
    mnemonic: str
    bucket: str
    action: str
    note: str

    @property
    def id(self) -> str:
        return f"xid:{self.xid}"


XID_TABLE: tuple[XidRow, ...] = (
    # Application faults: the catalogue says RESTART_APP (or IGNORE); the node is fine.
    XidRow(13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "RESTART_APP", IGNORE,
           "graphics engine exception: an application fault"),
    XidRow(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", IGNORE,
           "GPU memory page fault: an application fault"),
    XidRow(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", IGNORE, "GPU stopped processing one application"),
    XidRow(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", IGNORE,
           "channels cleaned up after an application ended"),
    # Memory errors.
    XidRow(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", RESTART_THEN_REPLACE,
           "double-bit ECC error: a reset remaps the row; a repeat means failing memory"),
    XidRow(63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", RECORD_ONLY,
           "row remap / page retirement recorded; the pending-remap counter drives the reset"),
    XidRow(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", RESTART,
           "row remap / page retirement failed to record"),
    XidRow(92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", RECORD_ONLY, "high single-bit ECC rate (corrected)"),
    XidRow(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", RECORD_ONLY,
           "contained ECC error: only the affected application must restart"),
    XidRow(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", RESTART,
           "uncontained ECC error: every application on the GPU is affected"),
    XidRow(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", RESTART, "ECC error escaped containment"),
    # The GPU or its firmware stopped answering.
    XidRow(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", RESTART, "GPU stopped processing"),
    XidRow(62, "PMU_HALT_ERROR", "RESET_GPU", RESTART, "internal micro-controller halt"),
    XidRow(74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", RESTART_THEN_REPLACE,
           "NVLink error: a reset retrains the link; a repeat is hardware"),
    XidRow(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", RESTART_THEN_REPLACE,
           "GPU fell off the bus: reboot the node; a repeat is hardware"),
    XidRow(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", RESTART, "context switch timeout"),
    XidRow(119, "GSP_RPC_TIMEOUT", "RESET_GPU", RESTART, "GPU System Processor RPC timeout"),
    XidRow(120, "GSP_ERROR", "RESET_GPU", RESTART, "GPU System Processor error"),
    XidRow(154, "GPU_RECOVERY_ACTION_CHANGED", "follow the guidance of the other XID", RECORD_ONLY,
           "announces the recovery action of another XID, which has its own row"),
)

_XID_INDEX: Mapping[int, XidRow] = {r.xid: r for r in XID_TABLE}


def xid_of(value: float) -> int | None:
    """The XID in a ``DCGM_FI_DEV_XID_ERRORS`` sample ("Value of the last XID error encountered"), or None
    when the sample says none (0) or is not a whole positive number (NaN, a fraction: never guessed)."""
    if not math.isfinite(value) or value <= 0 or value != int(value):
        return None
    return int(value)


def xid_action(xid: int, overrides: Mapping[int, str] | None = None) -> Decision:
    """The row for ``xid`` (> 0); an override from SIGNALS_XID_OVERRIDES wins over the table."""
    if xid <= 0:
        raise ValueError(f"an XID is a positive number, got {xid}")
    if overrides and xid in overrides:
        row = _XID_INDEX.get(xid)
        was = f" (table: {row.action})" if row else ""
        return Decision(overrides[xid], f"xid:{xid}:override", SRC_OVERRIDE, f"operator override{was}")
    row = _XID_INDEX.get(xid)
    if row is None:
        return Decision(RECORD_ONLY, "xid:default", SRC_DEFAULT, f"XID {xid} is not in the table")
    return Decision(row.action, row.id, SRC_XID, f"{row.mnemonic}: catalogue {row.bucket}; {row.note}")


def parse_xid_overrides(text: str | None) -> dict[int, str]:
    """``"79=replace,13=ignore"`` -> ``{79: "replace", 13: "ignore"}``; empty or None -> ``{}``.

    Raises SettingError naming SIGNALS_XID_OVERRIDES for a malformed pair, a non-positive or
    non-numeric XID, an action outside ``XID_ACTIONS`` or the same XID twice (which one was meant?).
    """
    out: dict[int, str] = {}
    if not text or not text.strip():
        return out
    name = XID_OVERRIDES_SETTING
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise SettingError(f"setting {name} has an empty entry in {text!r}: use xid=action pairs like 79=replace")
        key, sep, action = item.partition("=")
        key, action = key.strip(), action.strip().lower()
        if not sep or not key or not action:
            raise SettingError(f"setting {name}: {item!r} must be xid=action, like 79=replace")
        try:
            xid = int(key)
        except ValueError:
            raise SettingError(f"setting {name}: {key!r} in {item!r} is not an XID number") from None
        if xid <= 0:
            raise SettingError(f"setting {name}: XID {xid} in {item!r} must be a positive number")
        if action not in XID_ACTIONS:
            raise SettingError(f"setting {name}: {action!r} in {item!r} is not one of {', '.join(XID_ACTIONS)}")
        if xid in out:
            raise SettingError(f"setting {name}: XID {xid} is given twice")
        out[xid] = action
    return out


# --------------------------------------------------------------------------- DCGM error counters
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
DBE_VOLATILE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DBE_AGGREGATE = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"


@dataclass(frozen=True)
class CounterRow:
    """One counter row. ``needs_baseline``: a lifetime counter whose level alone says nothing about
    now, so only an increase over a remembered value counts (first sight is recorded only)."""

    metric: str
    action: str
    needs_baseline: bool
    source: str
    note: str

    @property
    def id(self) -> str:
        return f"counter:{self.metric}"


COUNTER_TABLE: tuple[CounterRow, ...] = (
    CounterRow(DBE_VOLATILE, RESTART_THEN_REPLACE, False, f"{SRC_DCGM_FIELDS}; {SRC_XID} (XID 48)",
               "double-bit ECC errors since the driver loaded (volatile): treated as XID 48"),
    CounterRow(DBE_AGGREGATE, RESTART_THEN_REPLACE, True, f"{SRC_DCGM_FIELDS}; {SRC_XID} (XID 48)",
               "lifetime double-bit ECC count grew: treated as XID 48"),
    CounterRow(REMAP_FAILURE, REPLACE, False, f"{SRC_DCGM_FIELDS}; {SRC_MEM_FLAGS}",
               "row remapping failed: no spare rows left, the RMA case"),
    CounterRow(REMAP_PENDING, RESTART, False, f"{SRC_DCGM_FIELDS}; {SRC_MEM_FLAGS}",
               "a row remap waits for the next GPU reset"),
)

_COUNTER_INDEX: Mapping[str, CounterRow] = {r.metric: r for r in COUNTER_TABLE}


def counter_action(metric: str, value: float, baseline: float | None = None) -> Decision | None:
    """The row for one error-counter sample, or None when it shows no fault.

    Volatile counters and flags count from 0 (they reset with the driver), so any value above
    ``baseline or 0`` is a fault. A lifetime counter needs the value remembered last time: without
    one it is recorded only, never acted on. A value that is not a finite number (a stale marker,
    NaN) is recorded only: missing data never turns into an action or into "healthy".
    """
    row = _COUNTER_INDEX.get(metric)
    if row is None:
        return Decision(RECORD_ONLY, "counter:default", SRC_DEFAULT, f"{metric} is not in the table")
    if not math.isfinite(value):
        return Decision(RECORD_ONLY, f"{row.id}:not-a-number", row.source, f"{metric} = {value}")
    if row.needs_baseline and baseline is None:
        if value <= 0:
            return None
        return Decision(RECORD_ONLY, f"{row.id}:first-sight", row.source,
                        f"{metric} = {value:g} with nothing to compare against (a lifetime count)")
    if value <= (baseline or 0.0):
        return None
    return Decision(row.action, row.id, row.source, row.note)

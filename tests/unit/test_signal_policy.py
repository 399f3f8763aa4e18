"""The signal policy tables, pinned row by row: changing a row's action must fail a test here.

Expected rows are written out literally (not derived from the tables), so a changed, added or
removed row shows up as a difference against this file.
"""

from __future__ import annotations

import math

import pytest

from shared.kernel.env import SettingError
from shared.remediation import signal_policy as sp
from shared.remediation.signal_policy import (
    AVAILABILITY_CHANGED as AVAIL,
)
from shared.remediation.signal_policy import (
    CORDON_DRAIN,
    IGNORE,
    RECORD_ONLY,
    REPLACE,
    RESTART,
    RESTART_THEN_REPLACE,
    counter_action,
    health_event_action,
    parse_xid_overrides,
    xid_action,
)
from shared.remediation.signal_policy import (
    RESOURCE_ANNOTATED as ANN,
)

EXPECTED_AVAILABILITY = {
    "Available": RECORD_ONLY,
    "Degraded": CORDON_DRAIN,
    "Unavailable": RECORD_ONLY,
    "Unknown": RECORD_ONLY,
}

# Every annotation of the Resource Health VM annotations page (30), with the action we chose.
EXPECTED_ANNOTATIONS = {
    "VirtualMachinePossiblyDegradedDueToHardwareFailure": CORDON_DRAIN,
    "VirtualMachineMigrationScheduledForDegradedHardware": CORDON_DRAIN,
    "VirtualMachineScheduledForServiceHealing": CORDON_DRAIN,
    "AccelnetUnhealthy": CORDON_DRAIN,
    "VirtualMachineHostCrashed": REPLACE,
    "VirtualMachineHostRebootedForRepair": RECORD_ONLY,
    "VirtualMachineMigrationInitiatedForRepair": RECORD_ONLY,
    "VirtualMachineStorageOffline": RECORD_ONLY,
    "LiveMigrationSucceeded": RECORD_ONLY,
    "LiveMigrationFailure": RECORD_ONLY,
    "VirtualMachineCrashed": RECORD_ONLY,
    "VirtualMachineProvisioningTimedOut": RECORD_ONLY,
    "VirtualMachinePreempted": RECORD_ONLY,
    "VirtualMachineMigrationInitiatedForPlannedMaintenance": RECORD_ONLY,
    "VirtualMachineRebootInitiatedForPlannedMaintenance": RECORD_ONLY,
    "VirtualMachinePlannedFreezeStarted": RECORD_ONLY,
    "VirtualMachinePlannedFreezeSucceeded": RECORD_ONLY,
    "VirtualMachinePlannedFreezeFailed": RECORD_ONLY,
    "VirtualMachineRestarted": RECORD_ONLY,
    "VirtualMachineRebootInitiatedByControlPlane": RECORD_ONLY,
    "VirtualMachineRedeployInitiatedByControlPlane": RECORD_ONLY,
    "VirtualMachineRedeployInitiatedByControlPlaneDueToPlannedMaintenance": RECORD_ONLY,
    "VirtualMachineAllocated": RECORD_ONLY,
    "VirtualMachineDeallocationInitiated": RECORD_ONLY,
    "VirtualMachineStartInitiatedByControlPlane": RECORD_ONLY,
    "VirtualMachineStopInitiatedByControlPlane": RECORD_ONLY,
    "VirtualMachineStoppedInternally": RECORD_ONLY,
    "VirtualMachineSizeChanged": RECORD_ONLY,
    "VirtualMachineConfigurationUpdated": RECORD_ONLY,
    "VirtualMachineFailedToSecureBoot": RECORD_ONLY,
    # The page of 03/18/2026 (tests/fixtures/resource_health_annotations.tsv; tests/unit/test_resource_health_annotations.py)
    "PossiblyDegradedDueToHardwareFailureWithRedeployDeadline": CORDON_DRAIN,
    "VirtualMachinePossiblyDegradedDueToHardwareFailureLiveMigrationEligible": CORDON_DRAIN,
    "VirtualMachinePossiblyDegradedDueToHardwareFailureLiveMigrationNotEligible": CORDON_DRAIN,
    "VirtualMachinePossiblyDegradedDueToHardwareFailureWithRedeployDeadline": CORDON_DRAIN,
    "VirtualMachinePossiblyDegradedDueToHardwareFailureWithRedeployDeadlineLiveMigrationEligible": CORDON_DRAIN,
    "VirtualMachinePossiblyDegradedDueToHardwareFailureWithRedeployDeadlineLiveMigrationNotEligible": CORDON_DRAIN,
    "VirtualMachineScheduledForServiceHealingLiveMigrationEligible": CORDON_DRAIN,
    "VirtualMachineScheduledForServiceHealingLiveMigrationNotEligible": CORDON_DRAIN,
    "VirtualMachineMigrationScheduledForDegradedHardwareLiveMigrationEligible": CORDON_DRAIN,
    "VirtualMachineMigrationScheduledForDegradedHardwareLiveMigrationNotEligible": CORDON_DRAIN,
    "VirtualMachineScheduledForMigrationWithGracePeriod": CORDON_DRAIN,  # the one exception to the rule
    "VirtualMachineMigratedDueToHardwareFailure": RECORD_ONLY,
    "NetworkUnhealthy": RECORD_ONLY,
    "VirtualMachineStopInitiatedByControlPlaneTrackingId": RECORD_ONLY,
    "VirtualMachineFailedSecureKeyRelease": RECORD_ONLY,
}

# XID -> (catalogue immediate-action bucket, our action).
EXPECTED_XIDS = {
    13: ("RESTART_APP", IGNORE),
    31: ("RESTART_APP", IGNORE),
    43: ("IGNORE", IGNORE),
    45: ("WORKFLOW_XID_45", IGNORE),
    46: ("RESET_GPU", RESTART),
    48: ("WORKFLOW_XID_48", RESTART_THEN_REPLACE),
    62: ("RESET_GPU", RESTART),
    63: ("IGNORE", RECORD_ONLY),
    64: ("RESET_GPU", RESTART),
    74: ("WORKFLOW_NVLINK_ERR", RESTART_THEN_REPLACE),
    79: ("RESTART_BM", RESTART_THEN_REPLACE),
    92: ("IGNORE", RECORD_ONLY),
    94: ("RESTART_APP", RECORD_ONLY),
    95: ("RESET_GPU", RESTART),
    109: ("RESET_GPU", RESTART),
    119: ("RESET_GPU", RESTART),
    120: ("RESET_GPU", RESTART),
    140: ("RESET_GPU", RESTART),
    154: ("follow the guidance of the other XID", RECORD_ONLY),
}

EXPECTED_COUNTERS = {
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (RESTART_THEN_REPLACE, False),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (RESTART_THEN_REPLACE, True),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (REPLACE, False),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": (RESTART, False),
}


# --------------------------------------------------------------------------- Resource Health
def test_health_table_has_exactly_the_expected_rows() -> None:
    have = {(r.event_type, r.key): r.action for r in sp.HEALTH_TABLE}
    want = {(AVAIL, k): v for k, v in EXPECTED_AVAILABILITY.items()}
    want.update({(ANN, k): v for k, v in EXPECTED_ANNOTATIONS.items()})
    assert have == want
    assert len(sp.HEALTH_TABLE) == len(want)  # no duplicate rows hiding behind the dict
    assert all(r.action in sp.HEALTH_ACTIONS for r in sp.HEALTH_TABLE)


@pytest.mark.parametrize(("state", "action"), sorted(EXPECTED_AVAILABILITY.items()))
def test_availability_rows(state: str, action: str) -> None:
    d = health_event_action(AVAIL, state, None)
    assert (d.action, d.row) == (action, f"health:availability:{state}")
    assert "event-schema-health-resources" in d.source


@pytest.mark.parametrize(("name", "action"), sorted(EXPECTED_ANNOTATIONS.items()))
def test_annotation_rows(name: str, action: str) -> None:
    d = health_event_action(ANN, None, name)
    assert (d.action, d.row) == (action, f"health:annotation:{name}")
    assert "resource-health-vm-annotation" in d.source
    assert d.note


def test_the_event_type_decides_which_field_is_read() -> None:
    # An annotation name in an availability event (or a state in an annotation event) matches nothing.
    assert health_event_action(AVAIL, None, "VirtualMachineHostCrashed").row == "health:default:availability"
    assert health_event_action(ANN, "Degraded", None).row == "health:default:annotation"


@pytest.mark.parametrize(("event_type", "state", "annotation", "row"), [
    (ANN, None, "VirtualMachineSomethingNew", "health:default:annotation"),
    (ANN, None, "virtualmachinehostcrashed", "health:default:annotation"),  # names are exact
    (ANN, None, None, "health:default:annotation"),
    (AVAIL, "Rebooting", None, "health:default:availability"),
    ("Microsoft.ResourceNotifications.Resources.CreatedOrUpdated", "Degraded", None, "health:default:event-type"),
])
def test_unknown_health_signals_are_recorded_only(event_type: str, state: str | None, annotation: str | None,
                                                  row: str) -> None:
    d = health_event_action(event_type, state, annotation)
    assert (d.action, d.row) == (RECORD_ONLY, row)
    assert "never act" in d.source


# --------------------------------------------------------------------------- XIDs
def test_xid_table_has_exactly_the_expected_rows() -> None:
    assert {r.xid: (r.bucket, r.action) for r in sp.XID_TABLE} == EXPECTED_XIDS
    assert len(sp.XID_TABLE) == len(EXPECTED_XIDS)
    assert all(r.action in sp.XID_ACTIONS for r in sp.XID_TABLE)


@pytest.mark.parametrize(("xid", "bucket", "action"), [(x, b, a) for x, (b, a) in sorted(EXPECTED_XIDS.items())])
def test_xid_rows(xid: int, bucket: str, action: str) -> None:
    d = xid_action(xid)
    assert (d.action, d.row) == (action, f"xid:{xid}")
    assert "docs.nvidia.com/deploy/xid-errors" in d.source
    assert bucket in d.note


@pytest.mark.parametrize("xid", [1, 8, 44, 999, 162])
def test_unknown_xids_are_recorded_only(xid: int) -> None:
    d = xid_action(xid)
    assert (d.action, d.row) == (RECORD_ONLY, "xid:default")


def test_overrides_win_and_say_so() -> None:
    overrides = {79: REPLACE, 13: RECORD_ONLY, 8: RESTART}
    d = xid_action(79, overrides)
    assert (d.action, d.row, d.source) == (REPLACE, "xid:79:override", "setting SIGNALS_XID_OVERRIDES")
    assert "table: restart_then_replace" in d.note
    assert xid_action(13, overrides).action == RECORD_ONLY
    assert xid_action(8, overrides).action == RESTART  # an XID outside the table, opted in by the operator
    assert xid_action(48, overrides).row == "xid:48"  # the others keep their table row


@pytest.mark.parametrize("xid", [0, -1])
def test_xid_must_be_positive(xid: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        xid_action(xid)


@pytest.mark.parametrize(("value", "xid"), [(79.0, 79), (13.0, 13), (0.0, None), (-3.0, None), (48.5, None),
                                            (math.nan, None), (math.inf, None)])
def test_xid_of_a_dcgm_sample(value: float, xid: int | None) -> None:
    assert sp.xid_of(value) == xid


# --------------------------------------------------------------------------- overrides
@pytest.mark.parametrize(("text", "parsed"), [
    (None, {}),
    ("", {}),
    ("   ", {}),
    ("79=replace", {79: REPLACE}),
    ("79=replace,13=ignore", {79: REPLACE, 13: IGNORE}),
    (" 79 = Replace , 48=restart ", {79: REPLACE, 48: RESTART}),
    ("94=restart_then_replace,92=record_only", {94: RESTART_THEN_REPLACE, 92: RECORD_ONLY}),
])
def test_override_parsing(text: str | None, parsed: dict[int, str]) -> None:
    assert parse_xid_overrides(text) == parsed


@pytest.mark.parametrize(("text", "message"), [
    ("79", "must be xid=action"),
    ("79=", "must be xid=action"),
    ("=replace", "must be xid=action"),
    ("79=replace,,13=ignore", "empty entry"),
    ("79=replace,", "empty entry"),
    ("seventy=replace", "not an XID number"),
    ("0=replace", "must be a positive number"),
    ("-4=replace", "must be a positive number"),
    ("79=reboot", "'reboot' in '79=reboot' is not one of ignore, record_only, restart, restart_then_replace, replace"),
    ("79=cordon_drain", "is not one of"),
    ("79=replace,79=ignore", "XID 79 is given twice"),
])
def test_bad_overrides_name_the_setting(text: str, message: str) -> None:
    with pytest.raises(SettingError) as err:
        parse_xid_overrides(text)
    assert "setting SIGNALS_XID_OVERRIDES" in str(err.value)
    assert message in str(err.value)


# --------------------------------------------------------------------------- counters
def test_counter_table_has_exactly_the_expected_rows() -> None:
    assert {r.metric: (r.action, r.needs_baseline) for r in sp.COUNTER_TABLE} == EXPECTED_COUNTERS


@pytest.mark.parametrize(("metric", "action"), [(m, a) for m, (a, base) in sorted(EXPECTED_COUNTERS.items()) if not base])
def test_counters_from_zero(metric: str, action: str) -> None:
    assert counter_action(metric, 0.0) is None
    d = counter_action(metric, 1.0)
    assert d is not None and (d.action, d.row) == (action, f"counter:{metric}")
    assert counter_action(metric, 3.0, baseline=3.0) is None  # no growth since last time


def test_lifetime_dbe_counts_only_when_it_grows() -> None:
    metric = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
    first = counter_action(metric, 5.0)
    assert first is not None and (first.action, first.row) == (RECORD_ONLY, f"counter:{metric}:first-sight")
    assert counter_action(metric, 0.0) is None
    assert counter_action(metric, 5.0, baseline=5.0) is None
    grew = counter_action(metric, 6.0, baseline=5.0)
    assert grew is not None and (grew.action, grew.row) == (RESTART_THEN_REPLACE, f"counter:{metric}")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_numbers_never_act_and_never_read_healthy(value: float) -> None:
    d = counter_action("DCGM_FI_DEV_ROW_REMAP_FAILURE", value)
    assert d is not None and d.action == RECORD_ONLY and d.row.endswith(":not-a-number")


def test_unknown_counters_are_recorded_only() -> None:
    d = counter_action("DCGM_FI_DEV_SOMETHING_ELSE", 7.0)
    assert d is not None and (d.action, d.row) == (RECORD_ONLY, "counter:default")


# --------------------------------------------------------------------------- the queries
def test_the_sweep_sends_one_query_with_one_name_matcher_for_the_exporters_counters() -> None:
    from shared.remediation import dcgm_provenance as prov
    from shared.remediation.dcgm_config import PrometheusTarget

    target = PrometheusTarget(cluster_id="/c", endpoint="https://w")
    assert prov.sweep_query(target, target.counters) == (
        '{__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_ROW_REMAP_FAILURE", job="dcgm-exporter"}')
    assert set(prov.POLICY_METRICS) == {sp.XID_METRIC, *EXPECTED_COUNTERS}
    assert prov.window_query(target, sp.XID_METRIC, 'a"b') == (
        'min_over_time({__name__="DCGM_FI_DEV_XID_ERRORS", job="dcgm-exporter", instance="a\\"b", cluster=""}[90s])')

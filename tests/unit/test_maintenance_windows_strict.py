"""AKS maintenance configurations read as AKS defines them, and closed wherever they are not certain.

Sources: Azure/azure-rest-api-specs specification/containerservice/resource-manager/
Microsoft.ContainerService/aks/stable/2025-10-01/managedClusters.json (MaintenanceConfigurationProperties,
MaintenanceWindow: durationHours default 24, 4..24; startTime 00:00..23:59; utcOffset +/-HH:mm;
Schedule: exactly one type) and https://learn.microsoft.com/azure/aks/planned-maintenance (from
api-version 2023-05-01 the ``default`` configuration uses ``maintenanceWindow``; ``timeInWeek`` is
deprecated and migrated). A configuration that cannot be read closes the window and says so; it is
never "no window, always open".
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shared.migration.maintenance import window_open
from shared.migration.policy import MigrationPolicy

# 2026-12-05 is a Saturday, 2026-12-06 a Sunday, 2026-12-02 a Wednesday.


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def config(name: str, **props: Any) -> dict[str, Any]:
    return {"name": name, "properties": props}


def window(schedule: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"schedule": schedule, **fields}


SAT = {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}
SUN_EVERY_2 = {"weekly": {"intervalWeeks": 2, "dayOfWeek": "Sunday"}}
NODE_OS = "aksManagedNodeOSUpgradeSchedule"

# (configs, now, open?, next opening or None, a fragment of the reason)
CASES: dict[str, tuple[list[dict[str, Any]], str, bool, str | None, str]] = {
    "a default with maintenanceWindow is the cluster's window, not 'always open'": (
        [config("default", maintenanceWindow=window(SAT, durationHours=4, startTime="01:00", utcOffset="+00:00"))],
        "2026-12-02T12:00", False, "2026-12-05T01:00", "maintenance configuration 'default'"),
    "a default with maintenanceWindow is open inside it": (
        [config("default", maintenanceWindow=window(SAT, durationHours=4, startTime="01:00"))],
        "2026-12-05T04:30", True, None, "inside maintenance configuration 'default'"),
    "a default's utcOffset moves its window": (
        [config("default", maintenanceWindow=window(SAT, durationHours=4, startTime="01:00", utcOffset="+05:30"))],
        "2026-12-05T01:30", False, "2026-12-11T19:30", "outside"),
    "a default's notAllowedDates skip a week": (
        [config("default", maintenanceWindow=window(SAT, durationHours=4, startTime="01:00",
                                                    notAllowedDates=[{"start": "2026-12-05", "end": "2026-12-05"}]))],
        "2026-12-05T02:00", False, "2026-12-12T01:00", "outside"),
    "durationHours absent is the spec's 24, not 4": (
        [config(NODE_OS, maintenanceWindow=window(SAT, startTime="01:00"))],
        "2026-12-05T06:00", True, None, "until 2026-12-06T01:00Z"),
    "durationHours below the spec's minimum of 4 cannot be read": (
        [config(NODE_OS, maintenanceWindow=window(SAT, durationHours=2, startTime="01:00"))],
        "2026-12-05T01:30", False, None, "could not be read"),
    "durationHours above 24 cannot be read": (
        [config(NODE_OS, maintenanceWindow=window(SAT, durationHours=48, startTime="01:00"))],
        "2026-12-06T12:00", False, None, "could not be read"),
    "a missing startTime cannot be read (it is required, there is no default)": (
        [config(NODE_OS, maintenanceWindow=window({"weekly": {"intervalWeeks": 1, "dayOfWeek": "Sunday"}},
                                                  durationHours=4))],
        "2026-12-06T00:30", False, None, "startTime"),
    "startTime 24:00 is not a time of day": (
        [config(NODE_OS, maintenanceWindow=window(SAT, durationHours=4, startTime="24:00"))],
        "2026-12-06T00:30", False, None, "startTime"),
    "a utcOffset beyond +14:00 cannot be read": (
        [config(NODE_OS, maintenanceWindow=window(SAT, durationHours=4, startTime="01:00", utcOffset="+15:00"))],
        "2026-12-04T10:30", False, None, "utcOffset"),
    "two schedule types at once cannot be read": (
        [config(NODE_OS, maintenanceWindow=window({"daily": {"intervalDays": 1}, **SAT}, durationHours=4,
                                                  startTime="01:00"))],
        "2026-12-02T01:30", False, None, "exactly one"),
    "an unknown schedule type cannot be read": (
        [config(NODE_OS, maintenanceWindow=window({"hourly": {"intervalHours": 1}}, durationHours=4,
                                                  startTime="01:00"))],
        "2026-12-02T01:30", False, None, "unknown type 'hourly'"),
    "a weekIndex AKS does not have cannot be read": (
        [config(NODE_OS, maintenanceWindow=window(
            {"relativeMonthly": {"intervalMonths": 1, "weekIndex": "Fifth", "dayOfWeek": "Friday"}},
            durationHours=4, startTime="01:00"))],
        "2026-12-02T01:30", False, None, "weekIndex"),
    "an aksManaged configuration without maintenanceWindow is closed, not skipped": (
        [config(NODE_OS)], "2026-12-02T12:00", False, None, "no maintenanceWindow"),
    "every two weeks without a startDate: which weeks is unknown": (
        [config(NODE_OS, maintenanceWindow=window(SUN_EVERY_2, durationHours=4, startTime="00:00"))],
        "2026-12-06T01:00", False, None, "no startDate"),
    "every two weeks from a Wednesday: the countings disagree, so closed": (
        [config(NODE_OS, maintenanceWindow=window(SUN_EVERY_2, durationHours=4, startTime="00:00",
                                                  startDate="2026-12-02"))],
        "2026-12-06T01:00", False, None, "the possible countings never agree"),
    "notAllowedDates ending before they start cannot be read": (
        [config(NODE_OS, maintenanceWindow=window(SAT, durationHours=4, startTime="01:00",
                                                  notAllowedDates=[{"start": "2026-12-06", "end": "2026-12-01"}]))],
        "2026-12-05T02:00", False, None, "ends before it starts"),
    "a legacy notAllowedTime without an end cannot be read": (
        [config("default", timeInWeek=[{"day": "Saturday", "hourSlots": [2]}],
                notAllowedTime=[{"start": "2026-12-05T00:00:00Z"}])],
        "2026-12-05T02:30", False, None, "notAllowedTime"),
    "a legacy day that is not a day cannot be read": (
        [config("default", timeInWeek=[{"day": "Funday", "hourSlots": [2]}, {"day": "Saturday", "hourSlots": [2]}])],
        "2026-12-05T02:30", False, None, "Funday"),
    "a legacy hour slot of 24 cannot be read": (
        [config("default", timeInWeek=[{"day": "Friday", "hourSlots": [24]}])],
        "2026-12-05T00:30", False, None, "hourSlots"),
    "a migrated default shown in both shapes is open only where both are": (
        [config("default", timeInWeek=[{"day": "Saturday", "hourSlots": [1, 2, 3, 4, 5, 6, 7, 8]}],
                maintenanceWindow=window(SAT, durationHours=4, startTime="01:00", utcOffset="+00:00"))],
        "2026-12-05T06:00", False, "2026-12-12T01:00", "outside"),
}


@pytest.mark.parametrize(("configs", "now", "is_open", "next_open", "reason"), CASES.values(), ids=CASES.keys())
def test_aks_maintenance_configurations_are_read_strictly(configs: list[dict[str, Any]], now: str, is_open: bool,
                                                          next_open: str | None, reason: str) -> None:
    result = window_open(configs, now=at(now), policy=MigrationPolicy())
    assert result[0] is is_open, result[2]
    assert result[1] == (at(next_open) if next_open else None), result[2]
    assert reason in result[2]


def test_an_unreadable_cluster_configuration_is_not_replaced_by_the_configured_window() -> None:
    """MIGRATION_WINDOW applies when the cluster has no configuration, not when it has one we cannot read."""
    policy = MigrationPolicy(window="Sat 01:00-06:00 UTC")
    is_open, next_open, reason = window_open([config(NODE_OS)], now=at("2026-12-05T02:00"), policy=policy)
    assert not is_open and next_open is None
    assert "could not be read" in reason and NODE_OS in reason


def test_a_monthly_window_counted_from_a_start_date_after_its_day_never_opens_and_says_why() -> None:
    """startDate the 20th, every 2 months on the 15th: from startDate's month (Dec, Feb...) or from the
    first occurrence after it (Jan, Mar...)? The readings never agree, so it stays closed."""
    configs = [config(NODE_OS, maintenanceWindow=window({"absoluteMonthly": {"intervalMonths": 2, "dayOfMonth": 15}},
                                                         durationHours=4, startTime="01:00", startDate="2026-11-20"))]
    is_open, next_open, reason = window_open(configs, now=at("2027-01-15T02:00"), policy=MigrationPolicy())
    assert not is_open and next_open is None and "never agree" in reason
    agreeing = [config(NODE_OS, maintenanceWindow=window({"absoluteMonthly": {"intervalMonths": 2, "dayOfMonth": 15}},
                                                          durationHours=4, startTime="01:00", startDate="2026-11-10"))]
    assert window_open(agreeing, now=at("2027-01-15T02:00"), policy=MigrationPolicy())[0]
    assert not window_open(agreeing, now=at("2026-12-15T02:00"), policy=MigrationPolicy())[0]


def test_a_startdate_on_the_weekday_makes_every_counting_agree() -> None:
    configs = [config(NODE_OS, maintenanceWindow=window(SUN_EVERY_2, durationHours=4, startTime="00:00",
                                                         startDate="2026-11-29"))]
    assert not window_open(configs, now=at("2026-12-06T01:00"), policy=MigrationPolicy())[0]
    assert window_open(configs, now=at("2026-12-13T01:00"), policy=MigrationPolicy())[0]

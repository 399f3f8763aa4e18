"""Migrations step only inside the cluster's maintenance window, or the configured one when it has none."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.kernel.env import SettingError
from shared.migration.maintenance import window_open
from shared.migration.policy import MigrationPolicy
from shared.migration.window import parse_window


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# 2026-12-05 is a Saturday; 2026-12-02 a Wednesday.
SAT_0100_0600 = MigrationPolicy(window="Sat 01:00-06:00 UTC")


def default_config(**props: Any) -> dict[str, Any]:
    return {"name": "default", "properties": props}


def managed(name: str = "aksManagedNodeOSUpgradeSchedule", **window: Any) -> dict[str, Any]:
    return {"name": name, "properties": {"maintenanceWindow": window}}


CONFIGURED = {
    "inside the configured window": ("2026-12-05T03:00", True, None),
    "before it on the same day": ("2026-12-05T00:30", False, "2026-12-05T01:00"),
    "after it: next week": ("2026-12-05T06:00", False, "2026-12-12T01:00"),
    "midweek: waits for saturday": ("2026-12-02T12:00", False, "2026-12-05T01:00"),
}


@pytest.mark.parametrize(("now", "is_open", "next_open"), CONFIGURED.values(), ids=CONFIGURED.keys())
def test_the_configured_window_applies_when_the_cluster_has_none(now: str, is_open: bool, next_open: str | None) -> None:
    result = window_open([], now=at(now), policy=SAT_0100_0600)
    assert result[0] is is_open
    assert result[1] == (at(next_open) if next_open else None)


def test_no_window_anywhere_is_always_open_and_says_so() -> None:
    is_open, next_open, reason = window_open([], now=at("2026-12-02T12:00"), policy=MigrationPolicy())
    assert is_open and next_open is None and "no maintenance window" in reason


def test_a_window_crossing_midnight_in_an_offset_is_open_after_midnight() -> None:
    policy = MigrationPolicy(window="Fri 22:00-04:00 +02:00")  # Fri 20:00 UTC to Sat 02:00 UTC
    assert window_open([], now=at("2026-12-05T01:30"), policy=policy)[0]
    assert not window_open([], now=at("2026-12-05T02:30"), policy=policy)[0]


CLUSTER = {
    "default timeInWeek slot open": (
        [default_config(timeInWeek=[{"day": "Saturday", "hourSlots": [2, 3]}])], "2026-12-05T03:59", True, None),
    "default timeInWeek slot closed": (
        [default_config(timeInWeek=[{"day": "Saturday", "hourSlots": [2, 3]}])], "2026-12-05T04:00", False, "2026-12-12T02:00"),
    "default notAllowedTime blocks a slot": (
        [default_config(timeInWeek=[{"day": "Saturday", "hourSlots": [2]}],
                        notAllowedTime=[{"start": "2026-12-05T00:00:00Z", "end": "2026-12-06T00:00:00Z"}])],
        "2026-12-05T02:30", False, "2026-12-12T02:00"),
    "weekly node OS schedule": (
        [managed(schedule={"weekly": {"intervalWeeks": 1, "dayOfWeek": "Sunday"}}, durationHours=4, startTime="00:00",
                 utcOffset="+00:00")], "2026-12-06T03:00", True, None),
    "weekly every two weeks from a start date": (
        [managed(schedule={"weekly": {"intervalWeeks": 2, "dayOfWeek": "Sunday"}}, durationHours=4, startTime="00:00",
                 startDate="2026-11-29")], "2026-12-06T03:00", False, "2026-12-13T00:00"),
    "daily with an offset": (
        [managed(schedule={"daily": {"intervalDays": 1}}, durationHours=6, startTime="23:00", utcOffset="+05:30")],
        "2026-12-02T18:00", True, None),
    # Whether AKS skips a month without a 31st or uses its last day is undocumented: skipping is the
    # reading that never opens a window the other keeps closed (tests/unit/test_maintenance_windows_strict.py).
    "absoluteMonthly on the 31st skips a month without one": (
        [managed(schedule={"absoluteMonthly": {"intervalMonths": 1, "dayOfMonth": 31}}, durationHours=4, startTime="01:00")],
        "2026-11-30T02:00", False, "2026-12-31T01:00"),
    "relativeMonthly last friday": (
        [managed(schedule={"relativeMonthly": {"intervalMonths": 1, "weekIndex": "Last", "dayOfWeek": "Friday"}},
                 durationHours=8, startTime="20:00")], "2026-12-02T12:00", False, "2026-12-25T20:00"),
    "notAllowedDates skip a window": (
        [managed(schedule={"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}, durationHours=4, startTime="01:00",
                 notAllowedDates=[{"start": "2026-12-05", "end": "2026-12-05"}])], "2026-12-05T02:00", False, "2026-12-12T01:00"),
    "node OS schedule preferred over default": (
        [default_config(timeInWeek=[{"day": "Wednesday", "hourSlots": [12]}]),
         managed(schedule={"weekly": {"dayOfWeek": "Sunday"}}, durationHours=4, startTime="00:00")],
        "2026-12-02T12:30", False, "2026-12-06T00:00"),
    "auto-upgrade schedule used when it is the only one": (
        [managed("aksManagedAutoUpgradeSchedule", schedule={"weekly": {"dayOfWeek": "Wednesday"}}, durationHours=4,
                 startTime="10:00")], "2026-12-02T12:30", True, None),
}


@pytest.mark.parametrize(("configs", "now", "is_open", "next_open"), CLUSTER.values(), ids=CLUSTER.keys())
def test_the_clusters_maintenance_configuration_decides(configs: list, now: str, is_open: bool, next_open: str | None) -> None:
    result = window_open(configs, now=at(now), policy=MigrationPolicy())
    assert result[0] is is_open, result[2]
    assert result[1] == (at(next_open) if next_open else None)


def test_the_cluster_window_wins_over_the_configured_one_by_default_and_the_configured_one_when_told() -> None:
    configs = [default_config(timeInWeek=[{"day": "Wednesday", "hourSlots": [12]}])]
    now = at("2026-12-02T12:30")
    assert window_open(configs, now=now, policy=SAT_0100_0600)[0]
    configured_first = MigrationPolicy(window="Sat 01:00-06:00 UTC", window_precedence="configured")
    assert not window_open(configs, now=now, policy=configured_first)[0]


@pytest.mark.parametrize("text", ["Sat 1-6", "Someday 01:00-06:00", "Sat 25:00-06:00 UTC", "Sat 01:00-06:00 CET", ""],
                         ids=["no minutes", "unknown day", "hour out of range", "named zone", "empty"])
def test_a_malformed_window_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_window(text)


def test_the_window_setting_is_validated_at_start_and_names_the_setting() -> None:
    with pytest.raises(SettingError, match="MIGRATION_WINDOW"):
        MigrationPolicy.from_env({"MIGRATION_WINDOW": "weekends"})


def test_several_windows_and_day_ranges_parse() -> None:
    spec = parse_window("Mon-Fri 22:00-23:00 UTC; Sat,Sun 01:00-06:00")
    assert [sorted(s.days) for s in spec.slots] == [[0, 1, 2, 3, 4], [5, 6]]


def test_the_policy_reads_its_settings() -> None:
    policy = MigrationPolicy.from_env({"MIGRATION_ENABLED": "true", "MIGRATION_MAX_CONCURRENT": "3",
                                       "MIGRATION_STRATEGY": "rolling", "MIGRATION_GPU_VCPU_HEADROOM":
                                       "eastus:standardNCASv3_T4Family=64,*:*=0"})
    assert (policy.enabled, policy.max_concurrent, policy.strategy) == (True, 3, "rolling")
    assert policy.headroom("EastUS", "standardncasv3_t4family") == 64
    assert policy.headroom("westeurope", "other") == 0
    with pytest.raises(SettingError, match="MIGRATION_GPU_VCPU_HEADROOM"):
        MigrationPolicy.from_env({"MIGRATION_GPU_VCPU_HEADROOM": "eastus=4"})


def test_a_cluster_configuration_that_cannot_be_read_counts_as_closed() -> None:
    configs = [managed(schedule={"weekly": {"dayOfWeek": "Sunday"}}, startTime="25:99", durationHours=4)]
    is_open, next_open, reason = window_open(configs, now=at("2026-12-06T01:00"), policy=MigrationPolicy())
    assert not is_open and next_open is None and "could not be read" in reason


@settings(max_examples=40, deadline=None)
@given(minutes=st.integers(min_value=0, max_value=60 * 24 * 21))
def test_the_next_opening_is_open_and_nothing_opens_earlier(minutes: int) -> None:
    policy = MigrationPolicy(window="Tue,Sat 01:00-06:00 UTC; daily 23:30-00:15 +01:00")
    now = at("2026-12-01T00:00") + minutes * 60
    is_open, next_open, _ = window_open([], now=now, policy=policy)
    if is_open:
        assert next_open is None
        return
    assert next_open is not None and next_open > now
    assert window_open([], now=next_open, policy=policy)[0]
    for probe in range(int(now), int(next_open), 30 * 60):
        assert not window_open([], now=float(probe), policy=policy)[0]

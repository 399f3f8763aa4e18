"""Maintenance windows decided from the bodies real AKS returned (issue 23): the Azure CLI's recorded traffic
(tests/replay/recordings), not bodies we wrote from our reading of the definitions.

The legacy ``default`` comes back as written, ``timeInWeek`` (and ``notAllowedTime``) only, with no
``maintenanceWindow`` and no ``type`` (test_aks_maintenanceconfiguration.json, api-version 2026-07-01); the
managed schedules come back with ``maintenanceWindow`` only (test_aks_maintenancewindow.json).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.migration.maintenance import window_open
from shared.migration.policy import MigrationPolicy

RECORDINGS = Path(__file__).resolve().parents[1] / "replay" / "recordings"
NO_WINDOW = MigrationPolicy()


def recorded(file: str, exchange: str) -> dict[str, Any]:
    found = json.loads((RECORDINGS / file).read_text())
    body = next(e["response"]["body"] for e in found["exchanges"] if e["name"] == exchange)
    assert isinstance(body, dict)
    return body


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


LEGACY = recorded("test_aks_maintenanceconfiguration.json", "get_maintenance_default_legacy")


def test_the_recorded_legacy_default_has_only_its_legacy_fields() -> None:
    assert set(LEGACY) == {"id", "name", "properties"}
    assert set(LEGACY["properties"]) == {"timeInWeek", "notAllowedTime"}


# 2026-12-01 is a Tuesday. The recorded default opens Tuesday 01:00-03:00 UTC (slots 1 and 2) and
# Wednesday 01:00-02:00 and 06:00-07:00 (slots 1 and 6); its notAllowedTime is in 2021.
@pytest.mark.parametrize(("now", "is_open", "next_open"), [
    pytest.param("2026-12-01T01:00", True, None, id="the first Tuesday slot"),
    pytest.param("2026-12-01T02:59", True, None, id="the second Tuesday slot, contiguous with the first"),
    pytest.param("2026-12-01T03:00", False, "2026-12-02T01:00", id="after Tuesday: Wednesday's first slot"),
    pytest.param("2026-12-02T02:00", False, "2026-12-02T06:00", id="between Wednesday's two slots"),
    pytest.param("2026-12-02T06:30", True, None, id="Wednesday's second slot"),
    pytest.param("2026-12-03T00:00", False, "2026-12-08T01:00", id="Thursday: next Tuesday"),
])
def test_the_recorded_legacy_default_decides_the_window(now: str, is_open: bool, next_open: str | None) -> None:
    opened, nxt, reason = window_open([LEGACY], now=at(now), policy=NO_WINDOW)
    assert (opened, nxt) == (is_open, at(next_open) if next_open else None), reason
    assert "'default'" in reason


def test_the_legacy_default_s_not_allowed_time_closes_its_slots() -> None:
    blocked = json.loads(json.dumps(LEGACY))
    blocked["properties"]["notAllowedTime"] = [{"start": "2026-11-30T00:00:00Z", "end": "2026-12-02T04:00:00Z"}]
    opened, nxt, _ = window_open([blocked], now=at("2026-12-01T01:30"), policy=NO_WINDOW)
    assert (opened, nxt) == (False, at("2026-12-02T06:00"))


def test_a_recorded_managed_schedule_that_starts_in_2123_never_opens_now() -> None:
    body = recorded("test_aks_maintenancewindow.json", "put_maintenance_node_os_relative_monthly")
    assert body["properties"]["maintenanceWindow"]["startDate"] == "2123-01-01"
    opened, nxt, reason = window_open([body, LEGACY], now=at("2026-12-01T01:30"), policy=NO_WINDOW)
    assert (opened, nxt) == (False, None), "the node OS schedule decides, and it is inactive before its startDate"
    assert "aksManagedNodeOSUpgradeSchedule" in reason


def test_a_recorded_every_third_month_schedule_stays_closed_and_says_why() -> None:
    # absoluteMonthly every 3 months on day 1 from startDate 2023-07-25: counted from July (the start's month)
    # it falls in October, January...; from the first occurrence on or after the start (August 1) in
    # November, February... AKS does not document which; the app opens only where every counting agrees.
    body = recorded("test_aks_maintenancewindow.json", "get_maintenance_auto_upgrade")
    opened, nxt, reason = window_open([body], now=at("2026-12-05T00:00"), policy=NO_WINDOW)
    assert (opened, nxt) == (False, None)
    assert "countings never agree" in reason

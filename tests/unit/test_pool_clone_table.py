"""The clone table has one row per AgentPool property of every api-version the app speaks, and nothing else.

Derived, not listed: the properties come from the definitions derived from the SDKs' models
(shared.kernel.definitions), so a newer SDK that adds a property fails the first test here until a row
says what the migration does with it; until then every migration of a pool carrying it stops, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.fleet import pool_clone
from shared.fleet.pool_clone import CLONE_TABLE, OMIT, CloneRefused, clone_for_managed, clone_problems
from shared.kernel import definitions
from shared.kernel.ports import PoolInfo

ROOT = Path(__file__).resolve().parents[2]
CID = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1"


def test_every_property_of_every_api_version_has_a_row() -> None:
    missing = sorted(definitions.pool_property_names() - set(CLONE_TABLE))
    assert missing == [], f"no clone rule for {missing}: add a row to shared.fleet.pool_clone.CLONE_TABLE"


def test_no_row_names_a_property_no_api_version_has() -> None:
    assert sorted(set(CLONE_TABLE) - definitions.pool_property_names()) == []


def test_read_only_properties_are_never_copied() -> None:
    for version in definitions.API_VERSIONS:
        for name, prop in definitions.definitions(version).pool_properties().items():
            if prop.read_only:
                assert CLONE_TABLE[name].action == OMIT, name


def test_docs_show_the_table_as_the_code_has_it() -> None:
    text = (ROOT / "docs" / "migration.md").read_text()
    assert pool_clone.clone_table_markdown() in text, "docs/migration.md: paste shared.fleet.pool_clone.clone_table_markdown()"


def pool(**props: Any) -> PoolInfo:
    base = {"vmSize": "Standard_NC4as_T4_v3", "count": 2, "osType": "Linux", "mode": "User"}
    return PoolInfo(cluster_id=CID, name="gpu", properties={**base, **props})


def test_a_property_without_a_row_stops_the_clone_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    table = dict(CLONE_TABLE)
    del table["kubeletConfig"]
    monkeypatch.setattr(pool_clone, "CLONE_TABLE", table)
    old = pool(kubeletConfig={"cpuManagerPolicy": "static"})
    assert "kubeletConfig" in clone_problems(old.properties)
    with pytest.raises(CloneRefused) as refused:
        clone_for_managed(old, new_name="gpum1")
    assert refused.value.fields == ["kubeletConfig"]


def test_a_property_of_tomorrow_stops_the_clone_naming_it() -> None:
    old = pool(kubeletConfig={"cpuManagerPolicy": "static", "aPropertyOfTomorrow": 1}, somethingNew={"a": 1})
    problem = clone_problems(old.properties)
    assert "somethingNew" in problem and "no rule" in problem


def test_a_nested_property_no_api_version_has_stops_the_clone_naming_it() -> None:
    old = pool(kubeletConfig={"cpuManagerPolicy": "static", "aPropertyOfTomorrow": 1})
    assert "kubeletConfig.aPropertyOfTomorrow" in clone_problems(old.properties)


def test_copied_values_leave_out_their_read_only_parts() -> None:
    old = pool(localDNSProfile={"mode": "Preferred", "state": "Enabled"})
    body = clone_for_managed(old, new_name="gpum1")
    assert body["localDNSProfile"] == {"mode": "Preferred"}
    assert pool_clone.clone_differences(old, body)["localDNSProfile"] == "read-only parts left out"

"""HEALTH_TABLE held to the Resource Health annotations page, as data (tests/fixtures/resource_health_annotations.tsv).

The fixture is the page's "Table of annotations" (MicrosoftDocs/azure-monitor-docs
articles/service-health/resource-health-vm-annotation.md, ms.date 03/18/2026), attribute values as the page
spells them. Every page row must have a policy row with the same Context / Category / ImpactType, every
annotation row of the policy must be on the page, and the action must follow from the impact by the one
rule (``signal_policy.rule_action``) unless the row names its exception. A new row on the page with no policy
row fails here; so does the simulator's copy of the page (sim/eventgrid/health_resources.py ``PAGE``) drifting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.remediation import signal_policy as sp
from sim.eventgrid import health_resources as hr

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "resource_health_annotations.tsv"
#: The page's Overview lists every value each attribute can take.
CONTEXTS = ("Platform Initiated", "Customer Initiated", "VM Initiated", "Unknown")
CATEGORIES = ("Planned", "Unplanned", "Not Applicable", "Unknown")
IMPACT_TYPES = ("Downtime Reboot", "Downtime Freeze", "Degraded", "Informational")
#: The page's own misspelling (two rows of its table), read as the Overview's value.
TYPOS = {"not applicaple": "Not Applicable"}
#: The rows whose action is not the rule's, each justified in its ``exception``.
EXCEPTIONS = {"VirtualMachineScheduledForMigrationWithGracePeriod": sp.CORDON_DRAIN}


def canonical(value: str, allowed: tuple[str, ...]) -> str:
    """``value`` as the Overview spells it (the table is not consistent about case); KeyError if it is none."""
    lowered = TYPOS.get(value.strip().lower(), value.strip()).lower()
    return {a.lower(): a for a in allowed}[lowered]


def page_rows() -> list[tuple[str, str, str, str]]:
    lines = [line for line in FIXTURE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    header, *rows = (tuple(line.split("\t")) for line in lines)
    assert header == ("annotation", "context", "category", "impact_type")
    assert all(len(r) == 4 for r in rows), [r for r in rows if len(r) != 4]
    return [(r[0], canonical(r[1], CONTEXTS), canonical(r[2], CATEGORIES), canonical(r[3], IMPACT_TYPES)) for r in rows]


PAGE = page_rows()
POLICY = {r.key: r for r in sp.HEALTH_TABLE if r.event_type == sp.RESOURCE_ANNOTATED}


def test_the_fixture_names_its_page_and_holds_its_whole_table() -> None:
    head = FIXTURE.read_text()
    for needle in ("learn.microsoft.com/azure/service-health/resource-health-vm-annotation",
                   "MicrosoftDocs/azure-monitor-docs articles/service-health/resource-health-vm-annotation.md",
                   "ms.date: 03/18/2026"):
        assert needle in head
    names = [name for name, *_ in PAGE]
    assert len(names) == len(set(names)) == 45


@pytest.mark.parametrize(("name", "context", "category", "impact_type"), PAGE, ids=[r[0] for r in PAGE])
def test_every_page_row_has_a_policy_row_with_its_impact(name: str, context: str, category: str,
                                                        impact_type: str) -> None:
    row = POLICY.get(name)
    assert row is not None, f"{name} is on the page but in no HEALTH_TABLE row"
    assert row.attributes == (context, category, impact_type)
    assert row.impact == f"{context} / {category} / {impact_type}"
    assert row.note


def test_every_annotation_row_of_the_policy_is_on_the_page() -> None:
    assert sorted(set(POLICY) - {name for name, *_ in PAGE}) == []
    assert len(POLICY) == len([r for r in sp.HEALTH_TABLE if r.event_type == sp.RESOURCE_ANNOTATED])


@pytest.mark.parametrize("row", list(POLICY.values()), ids=lambda r: r.key)
def test_the_action_follows_from_the_impact_by_the_rule_or_names_its_exception(row: sp.HealthRow) -> None:
    _, _, impact_type = row.attributes
    if row.key in EXCEPTIONS:
        assert row.action == EXCEPTIONS[row.key] != sp.rule_action(row.key, impact_type)
        assert len(row.exception) > 40, "an exception is justified in the row"
    else:
        assert row.action == sp.rule_action(row.key, impact_type)
        assert row.exception == ""


@pytest.mark.parametrize(("impact_type", "name", "action"), [
    ("Degraded", "AnyDegradedAnnotation", sp.CORDON_DRAIN),
    ("Downtime Reboot", sp.HOST_FAILURE_ANNOTATION, sp.REPLACE),
    ("Downtime Reboot", "VirtualMachineHostRebootedForRepair", sp.RECORD_ONLY),
    ("Downtime Freeze", "LiveMigrationFailure", sp.RECORD_ONLY),
    ("Informational", "VirtualMachineRestarted", sp.RECORD_ONLY),
])
def test_the_rule(impact_type: str, name: str, action: str) -> None:
    assert sp.rule_action(name, impact_type) == action


def test_every_acting_row_is_confirmed_by_a_platform_initiated_unplanned_state() -> None:
    acting = [r for r in sp.HEALTH_TABLE if r.action != sp.RECORD_ONLY]
    assert {r.confirming_class for r in acting} == {(sp.PLATFORM_INITIATED, sp.UNPLANNED)}


def test_states_and_annotations_never_share_a_key() -> None:
    keys = [r.key for r in sp.HEALTH_TABLE]
    assert len(keys) == len(set(keys))
    assert all(sp.health_row(r.key) is r for r in sp.HEALTH_TABLE)


def test_the_simulator_knows_every_page_annotation_with_the_pages_class() -> None:
    assert {name: (c, k, i) for name, c, k, i in PAGE} == hr.PAGE
    assert {name: (c, k) for name, (_, _, c, k) in hr.ANNOTATIONS.items()} == {n: (c, k) for n, c, k, _ in PAGE}


def test_the_docs_table_is_the_policy_table() -> None:
    """docs/signals-resource-health.md shows every row with its impact and action, and no row the table lacks."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "signals-resource-health.md").read_text()
    shown = {line.split("|")[1].strip().strip("`"): [c.strip() for c in line.split("|")[2:5]]
             for line in doc.splitlines() if line.startswith("| `")}
    expected = {r.key: ["AvailabilityStatusChanged" if r.event_type == sp.AVAILABILITY_CHANGED else "ResourceAnnotated",
                        "n/a" if r.event_type == sp.AVAILABILITY_CHANGED else r.impact,
                        r.action + (" (exception)" if r.exception else "")] for r in sp.HEALTH_TABLE}
    assert shown == expected

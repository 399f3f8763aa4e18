"""The workbook, the alert rules and the outcome events' subscription name only what the app really emits
(issue 22, item 4).

The metrics and their dimensions are derived from the code, not typed twice: every call that records a metric
(``metric(ctx, NAME, value, **dimensions)``, ``count_safely(telemetry, NAME, **dimensions)``,
``telemetry.record``/``count``) under shared/, with the instruments of shared/kernel/telemetry.py. The event
types are the ones the jobs publish (their own constants). The shape checked here (each query item's
``query``, ``queryType`` and ``resourceType``) is what the workbook needs to run in a Log Analytics workspace,
stricter than the published schema, which requires only ``type`` and ``content`` of a query item; the
workbook is validated against that schema itself in tests/infra/test_infra_workbook_schema.py.
"""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from infra_facts import INFRA, SHARED, bicep, resource, resource_body

from shared.kernel import telemetry
from shared.migration.transitions import EVENT_PREFIX as MIGRATION_PREFIX
from shared.migration.transitions import OUTCOMES as MIGRATION_OUTCOMES
from shared.pools.outcomes import OUTCOME_EVENTS as POOL_EVENTS
from shared.remediation import breaker
from shared.remediation.records import EVENT_PREFIX as REMEDIATION_PREFIX
from shared.remediation.records import Event

MONITORING = INFRA / "monitoring"
RECORDERS = {"metric": 1, "count_safely": 1, "record": 0, "count": 0}  # function -> index of the name argument


def emitted_metrics() -> dict[str, set[str]]:
    """Metric name -> the dimension names the code records it with."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(SHARED.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            index = RECORDERS.get(fn)
            if index is None or len(node.args) <= index:
                continue
            arg = node.args[index]
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                continue
            name = telemetry.ALIASES.get(arg.value, arg.value)
            found[name] |= {k.arg for k in node.keywords if k.arg}
    instruments = set(telemetry.HISTOGRAMS) | set(telemetry.GAUGES) | set(telemetry.COUNTERS)
    return {name: dims for name, dims in found.items() if name in instruments}


def published_events() -> set[str]:
    return ({f"{REMEDIATION_PREFIX}{e.value}" for e in Event} | set(POOL_EVENTS)
            | {f"{MIGRATION_PREFIX}{what}" for what in MIGRATION_OUTCOMES} | {breaker.OPENED_EVENT, breaker.RESET_EVENT})


def names_in(query: str) -> tuple[set[str], set[str]]:
    """(metric names, dimension names) a KQL query reads from customMetrics."""
    metrics = set(re.findall(r'name == "([a-z_]+)"', query))
    for group in re.findall(r"name in \(([^)]*)\)", query):
        metrics |= set(re.findall(r'"([a-z_]+)"', group))
    dims = set(re.findall(r"customDimensions\.([A-Za-z_]+)", query))
    return metrics, dims


def workbook() -> dict[str, Any]:
    return json.loads((MONITORING / "workbook.json").read_text())


def alerts() -> list[dict[str, Any]]:
    return json.loads((MONITORING / "alerts.json").read_text())


def queries() -> list[tuple[str, str]]:
    items = [(i["content"]["title"], i["content"]["query"]) for i in workbook()["items"] if i["type"] == 3]
    return items + [(a["name"], a["query"]) for a in alerts()]


def test_the_code_emits_every_instrument_the_monitoring_reads() -> None:
    emitted = emitted_metrics()
    assert {"remediations_total", "remediation_refusals_total", "migrations_total", "pool_requests_total",
            "breaker_open", "remediations_in_flight", "time_to_repair_s"} <= set(emitted), sorted(emitted)
    assert {"outcome", "signal", "condition", "rung"} <= emitted["remediations_total"]
    assert "reason_code" in emitted["remediation_refusals_total"]


@pytest.mark.parametrize(("title", "query"), queries(), ids=[t for t, _ in queries()])
def test_each_query_reads_metrics_and_dimensions_the_code_emits(title: str, query: str) -> None:
    emitted = emitted_metrics()
    metrics, dims = names_in(query)
    assert metrics, f"{title}: reads no metric"
    assert metrics <= set(emitted), f"{title}: {sorted(metrics - set(emitted))} are not emitted"
    recorded = set().union(*(emitted[m] for m in metrics))
    assert dims <= recorded, f"{title}: dimensions {sorted(dims - recorded)} are not recorded on {sorted(metrics)}"


def test_the_workbook_has_the_shape_its_schema_requires_and_every_view_the_issue_asks_for() -> None:
    doc = workbook()
    assert doc["version"] == "Notebook/1.0" and isinstance(doc["items"], list) and doc["items"]
    for item in doc["items"]:
        assert item["type"] in (1, 3) and isinstance(item.get("name"), str)
        content = item["content"]
        if item["type"] == 1:
            assert isinstance(content["json"], str)
        else:
            assert content["version"] == "KqlItem/1.0" and isinstance(content["query"], str)
            assert isinstance(content["queryType"], int) and content["resourceType"] == "microsoft.insights/components"
    titles = " | ".join(t for t, _ in queries()).lower()
    for view in ("by outcome and signal", "refusals by reason", "breaker", "migrations by phase",
                 "pool requests by outcome"):
        assert view in titles


def test_the_alerts_cover_what_needs_a_person() -> None:
    by_name = {a["name"]: a for a in alerts()}
    assert set(by_name) == {"breaker-opened", "remediation-gave-up", "migration-blocked", "pool-request-failed"}
    for alert in by_name.values():
        assert 0 <= alert["severity"] <= 4 and alert["displayName"] and alert["description"]
        assert "summarize events =" in alert["query"]  # the rule's metricMeasureColumn
    assert '"gave_up"' in by_name["remediation-gave-up"]["query"]
    assert '"blocked", "rolled_back"' in by_name["migration-blocked"]["query"]


def test_the_outcome_events_are_events_the_steward_publishes() -> None:
    wanted = json.loads((MONITORING / "outcome-events.json").read_text())
    assert sorted(set(wanted) - published_events()) == []
    assert {breaker.OPENED_EVENT, f"{REMEDIATION_PREFIX}{Event.GAVE_UP.value}", f"{MIGRATION_PREFIX}Blocked",
            f"{MIGRATION_PREFIX}RolledBack", "Steward.PoolRequest.Failed"} <= set(wanted)


def test_the_bicep_deploys_them_with_the_operators_parameters() -> None:
    doc = bicep("app/operator-monitoring.bicep")
    body = resource_body(resource(doc, "workbook"))
    assert body["kind"] == "shared" and body["properties"]["category"] == "workbook"
    text = (INFRA / "app" / "operator-monitoring.bicep").read_text()
    assert "loadTextContent('../monitoring/workbook.json')" in text
    assert "loadJsonContent('../monitoring/alerts.json')" in text
    assert "loadJsonContent('../monitoring/outcome-events.json')" in text
    main = (INFRA / "main.bicep").read_text()
    assert "module operatorMonitoring './app/operator-monitoring.bicep'" in main
    for param in ("alertActionGroupId", "outcomeEventsEndpoint"):
        assert f"param {param} string = ''" in main and f"{param}: {param}" in main


def test_the_docs_name_every_metric_the_workbook_reads() -> None:
    guide = (Path(INFRA).parent / "docs" / "deploy.md").read_text()
    read = set().union(*(names_in(q)[0] for _, q in queries()))
    assert all(f"`{name}`" in guide for name in read), sorted(n for n in read if f"`{n}`" not in guide)

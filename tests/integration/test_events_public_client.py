"""shared.adapters.events publishes through the public azure.eventgrid client, and keeps its transport settings.

The public ``EventGridPublisherClient`` drops constructor keyword arguments for a basic topic, so the
CA bundle, the timeouts and ``retry_total=0`` travel with each send. These tests run the real client
against the simulated topic: the CloudEvent arrives (so the CA bundle was used: the simulator's
certificate is signed by its own CA), a 503 is *not* retried inside the SDK (shared.kernel.retry decides),
and the per-request options leave no warnings in the log.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.errors import Transient
from shared.settings import Settings

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app

EVENTS_MODULE = Path(__file__).resolve().parents[2] / "shared" / "adapters" / "events.py"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario="sim/scenarios/default.yaml") as handle:
        yield handle


@pytest.fixture(scope="module")
def settings(sim: SimHandle) -> Settings:
    return app_settings(sim)


def published(sim: SimHandle) -> list[dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=sim.ca_bundle)
    url = sim.endpoints["eventgrid_topic_endpoint"].rsplit("/api/events", 1)[0] + "/_published"
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        return [entry["event"] for entry in json.loads(resp.read())["events"]]


def publisher(settings: Settings, *, attempts: int = 3) -> Any:
    from shared.adapters.events import EventPublisher
    from shared.adapters.identity import get_credential

    return EventPublisher(get_credential(settings), settings, clock=ManualClock(), retry_attempts=attempts)


def test_the_publisher_imports_only_the_public_eventgrid_api() -> None:
    tree = ast.parse(EVENTS_MODULE.read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    eventgrid = {name for name in imported if name.startswith("azure.eventgrid")}
    assert eventgrid == {"azure.eventgrid"}, eventgrid
    assert not any("._" in name for name in imported if name.startswith("azure.")), imported


@pytest.fixture(params=["plain-records", "telemetry-records"])
def record_factory(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both ways a record can reach the SDK's logger: plain, and through shared.kernel.telemetry's factory (which
    folds the arguments into the message when it scrubs it, as it does in the running app)."""
    from shared.kernel import telemetry

    original = logging.getLogRecordFactory()
    installed = telemetry._installed
    if request.param == "telemetry-records":
        telemetry._installed = False
        telemetry.install_log_record_factory()
    try:
        yield str(request.param)
    finally:
        logging.setLogRecordFactory(original)
        telemetry._installed = installed


def test_a_cloudevent_reaches_the_topic_through_the_public_client_without_warnings(
        sim: SimHandle, settings: Settings, record_factory: str, caplog: pytest.LogCaptureFixture) -> None:
    from azure.eventgrid import EventGridPublisherClient

    events = publisher(settings)
    with caplog.at_level(logging.WARNING):
        events.publish(type_="Steward.PoolRequest.Accepted", subject="/pool-requests/r1", data={"n": 1},
                       id_=f"public-client-{record_factory}")
    assert isinstance(events._get_client(), EventGridPublisherClient)
    [event] = [e for e in published(sim) if e["id"] == f"public-client-{record_factory}"]
    assert event["type"] == "Steward.PoolRequest.Accepted" and event["source"] == "/gpu-fleet-steward"
    assert event["data"] == {"n": 1} and event["specversion"] == "1.0"
    assert not [r for r in caplog.records if "is not a known attribute" in r.getMessage()]


def test_the_sdk_does_not_retry_behind_shared_retry(sim: SimHandle, settings: Settings) -> None:
    before = sum(n for route, n in sim.oracles()["requests"].items() if "eventgrid/api/events" in route)
    sim.control("POST", "/faults", {"target": "eventgrid", "status": 503, "count": 1})
    with pytest.raises(Transient):
        publisher(settings, attempts=1).publish(type_="Steward.Breaker.Opened", subject="/fleet", data={},
                                                id_="public-client-503")
    after = sum(n for route, n in sim.oracles()["requests"].items() if "eventgrid/api/events" in route)
    assert after - before == 1, "azure-core retried the 503 itself: retry_total=0 did not reach the request"
    assert "public-client-503" not in [e["id"] for e in published(sim)]


def test_without_the_ca_bundle_the_simulated_topic_is_not_trusted(sim: SimHandle, settings: Settings) -> None:
    import dataclasses

    untrusting = dataclasses.replace(settings, ca_bundle="")
    with pytest.raises(Transient):
        publisher(untrusting, attempts=1).publish(type_="Steward.Breaker.Opened", subject="/fleet", data={})

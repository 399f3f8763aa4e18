"""Event Grid triggers: deliveries are settled ok, retried with back-off, or dead-lettered."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import pytest

from devhost.eventgrid import SubscriptionError, load_subscriptions
from devhost.host import Host
from tests.waiting import wait_until


def _event(id_: str, *, type_: str = "Test.Thing.Happened", age_s: float = 0.0, **data: Any) -> dict[str, Any]:
    when = datetime.fromtimestamp(time.time() - age_s, tz=UTC).isoformat().replace("+00:00", "Z")
    return {"specversion": "1.0", "id": id_, "source": "/gpu-fleet-steward", "type": type_,
            "subject": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1",
            "time": when, "datacontenttype": "application/json", "data": data}


def _calls(app: ModuleType) -> list[dict[str, Any]]:
    return [c for c in list(app.CALLS) if c["function"] == "events"]


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    wait_until(predicate, timeout=timeout, what="the deliveries to be settled")


def test_a_delivered_cloud_event_reaches_the_function_and_is_settled_ok(
        make_host: Callable[..., Host], fake_app: ModuleType, feed: Any) -> None:
    host = make_host(endpoints={"eventgrid_deliveries": feed.url})
    feed.publish(_event("e-1", node="aks-gpu-1"))
    _wait_for(lambda: host.stats()["functions"]["events"]["settled"].get("ok") == 1)
    [call] = _calls(fake_app)
    assert call["event_class"] == "CloudEvent"
    assert (call["id"], call["type"], call["source"]) == ("e-1", "Test.Thing.Happened", "/gpu-fleet-steward")
    assert call["data"] == {"node": "aks-gpu-1"} and call["time"].tzinfo is not None
    assert feed.subscriber("events").delivered_ok == 1


def test_a_failing_event_is_retried_then_dead_lettered_after_max_delivery_attempts(
        make_host: Callable[..., Host], fake_app: ModuleType, feed: Any) -> None:
    host = make_host(endpoints={"eventgrid_deliveries": feed.url})
    feed.publish(_event("e-bad", fail=True))
    _wait_for(lambda: host.stats()["functions"]["events"]["settled"].get("dead") == 1)
    assert [c["id"] for c in _calls(fake_app)] == ["e-bad"] * 3  # maxDeliveryAttempts is 3
    assert host.stats()["functions"]["events"]["settled"] == {"retry": 2, "dead": 1}
    [dead] = feed.subscriber("events").dead
    assert dead["event"]["id"] == "e-bad" and dead["attempts"] == 3
    assert "maxDeliveryAttempts" in dead["reason"] and "asked to fail" in dead["reason"]


def test_events_of_types_the_subscription_does_not_include_never_reach_the_function(
        make_host: Callable[..., Host], fake_app: ModuleType, feed: Any) -> None:
    host = make_host(endpoints={"eventgrid_deliveries": feed.url})
    feed.publish(_event("e-other", type_="Other.Thing"), _event("e-longer", type_="Test.Thing.HappenedAgain"),
                 _event("e-mine"))
    # both delivered events were looked at: e-mine ran, e-longer was settled without an invocation
    _wait_for(lambda: host.stats()["functions"]["events"]["settled"].get("ok") == 2)
    assert host.wait_idle(10)
    assert host.stats()["functions"]["events"]["succeeded"] == 1
    assert [c["id"] for c in _calls(fake_app)] == ["e-mine"]


def test_an_event_older_than_its_time_to_live_is_dead_lettered_without_an_invocation(
        make_host: Callable[..., Host], fake_app: ModuleType, feed: Any) -> None:
    host = make_host(endpoints={"eventgrid_deliveries": feed.url})
    feed.publish(_event("e-stale", age_s=61 * 60))  # the subscription's TTL is 60 minutes
    _wait_for(lambda: host.stats()["functions"]["events"]["settled"].get("dead") == 1)
    assert _calls(fake_app) == []
    assert "time to live" in feed.subscriber("events").dead[0]["reason"]


def test_an_event_grid_function_runs_on_demand_with_a_cloud_event(make_host: Callable[..., Host],
                                                                  fake_app: ModuleType) -> None:
    host = make_host()
    host.trigger("events", _event("e-now", x=1)).result(timeout=5)
    assert _calls(fake_app)[0]["data"] == {"x": 1}


def test_the_projects_subscriptions_file_names_the_remediation_function() -> None:
    subscriptions = load_subscriptions()
    remediation = subscriptions["remediation_events"]
    assert remediation.included_event_types == ("Steward.GpuNode.Unhealthy",)
    assert 1 <= remediation.max_delivery_attempts <= 30 and 1 <= remediation.event_ttl_minutes <= 1440


@pytest.mark.parametrize(("body", "problem"), [
    pytest.param('{"f": {"maxDeliveryAttempts": 31}}', "maxDeliveryAttempts", id="too-many-attempts"),
    pytest.param('{"f": {"eventTtlMinutes": 0}}', "eventTtlMinutes", id="zero-ttl"),
    pytest.param('{"f": {"eventDeliverySchema": "EventGridSchema"}}', "CloudEventSchemaV1_0", id="wrong-schema"),
    pytest.param('{"f": []}', "must be an object", id="not-an-object"),
    pytest.param("{", "cannot read", id="not-json"),
])
def test_a_malformed_subscriptions_file_is_refused(tmp_path: Any, body: str, problem: str) -> None:
    path = tmp_path / "subs.json"
    path.write_text(body)
    with pytest.raises(SubscriptionError, match=problem):
        load_subscriptions(path)

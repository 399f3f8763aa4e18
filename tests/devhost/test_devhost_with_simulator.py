"""The local host against the running simulator: its clock, its Event Grid topic and deliveries feed."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from devhost.host import Host, endpoint_settings
from shared.kernel.clock import ScaledClock
from tests.waiting import wait_until

testing = pytest.importorskip("sim.testing")

SPEED = 100.0  # Event Grid's 10 s and 30 s retry back-off take 0.1 s and 0.3 s of real time


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with testing.start_sim(seed=3, speed=SPEED) as handle:
        yield handle


def _publish(sim: Any, *events: dict[str, Any]) -> None:
    endpoints = sim.endpoints
    request = urllib.request.Request(endpoints["eventgrid_topic_endpoint"] + "?api-version=2018-01-01",
                                     data=json.dumps(list(events)).encode(), method="POST",
                                     headers={"Content-Type": "application/cloudevents-batch+json",
                                              "aeg-sas-key": endpoints["eventgrid_key"]})
    context = ssl.create_default_context(cafile=endpoints["ca_bundle"])
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        assert response.status == 200


def _event(id_: str, **data: Any) -> dict[str, Any]:
    return {"specversion": "1.0", "id": id_, "source": "/tests", "type": "Test.Thing.Happened",
            "subject": "/things/1", "data": data}


def _wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    wait_until(predicate, timeout=timeout, what="the deliveries to be settled")


def test_the_host_runs_on_the_simulators_clock_and_points_the_app_at_it(make_host: Callable[..., Host],
                                                                        sim: Any) -> None:
    host = make_host(endpoints=sim.endpoints)
    assert isinstance(host.clock, ScaledClock) and host.clock.speed == SPEED
    sim_now = float(sim.state()["clock"]["now"])
    assert abs(host.clock.now() - sim_now) < 2 * SPEED  # the same time line (within two real seconds)
    platform, defaults = endpoint_settings(sim.endpoints)
    assert host.settings["IDENTITY_ENDPOINT"] == sim.endpoints["identity_endpoint"] == platform["IDENTITY_ENDPOINT"]
    assert host.settings["ARM_ENDPOINT"] == sim.endpoints["arm_endpoint"]
    assert host.settings["STEWARD_CA_BUNDLE"] == sim.endpoints["ca_bundle"]
    assert set(defaults["FLEET_SUBSCRIPTIONS"].split(",")) == set(sim.endpoints["subscriptions"])


def test_events_published_to_the_simulators_topic_are_delivered_and_settled(
        make_host: Callable[..., Host], fake_app: ModuleType, sim: Any) -> None:
    host = make_host(endpoints=sim.endpoints)
    _publish(sim, _event("sim-ok", n=1), _event("sim-bad", fail=True))
    _wait_for(lambda: host.stats()["functions"]["events"]["settled"].get("dead") == 1)
    _wait_for(lambda: host.stats()["functions"]["events"]["settled"].get("ok") == 1)
    calls = [c["id"] for c in fake_app.CALLS if c["function"] == "events"]
    assert calls.count("sim-ok") == 1 and calls.count("sim-bad") == 3  # maxDeliveryAttempts is 3
    assert host.stats()["functions"]["events"]["settled"] == {"ok": 1, "retry": 2, "dead": 1}

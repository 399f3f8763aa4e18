"""The Event Grid topic accepts what the publisher sends, and the pull feed keeps Event Grid's promises:
every event at least once per subscriber, redelivery on lock expiry or retry, back-off, dead letters."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.core.http import Headers, Request, Response
from sim.eventgrid.api import MAX_BATCH_BYTES, EventGridApi
from sim.model import Fleet, SimClock

BATCH = "application/cloudevents-batch+json; charset=utf-8"


def event(n: int, type_: str = "Steward.Remediation.Admitted") -> dict[str, Any]:
    return {"specversion": "1.0", "id": f"e{n}", "source": "/gpu-fleet-steward", "type": type_,
            "subject": "/clusters/c1", "time": "2026-12-02T14:00:00Z", "data": {"n": n}}


class Topic:
    def __init__(self) -> None:
        self.fleet = Fleet(seed=5, clock=SimClock(manual=True))
        self.fleet.timings["eventgrid_max_attempts"] = 3
        self.api = EventGridApi(self.fleet)
        self.token = self.fleet.tokens.issue("https://eventgrid.azure.net/.default")[0]

    def publish(self, events: Any, *, headers: dict[str, str] | None = None, raw: bytes | None = None) -> Response:
        h = Headers({"Content-Type": BATCH, "Authorization": f"Bearer {self.token}"})
        for k, v in (headers or {}).items():
            if v is None:
                h.pop(k.lower(), None)
            else:
                h[k] = v
        payload = raw if raw is not None else json.dumps(events).encode()
        return self.api.handle(Request("POST", "/eventgrid/api/events?api-version=2018-01-01", h, payload))

    def fetch(self, subscriber: str = "remediation", *, max_n: int = 10, lock_s: float = 30,
              types: str = "") -> list[dict[str, Any]]:
        query = f"subscriber={subscriber}&max={max_n}&lock_s={lock_s}" + (f"&types={types}" if types else "")
        resp = self.api.handle(Request("GET", f"/eventgrid/_deliveries?{query}", Headers()))
        assert resp.status == 200, resp.body
        return json.loads(resp.body)["deliveries"]

    def settle(self, subscriber: str, *results: tuple[str, str]) -> dict[str, Any]:
        payload = {"subscriber": subscriber, "results": [{"lock_token": t, "outcome": o} for t, o in results]}
        resp = self.api.handle(Request("POST", "/eventgrid/_deliveries/settle", Headers(), json.dumps(payload).encode()))
        assert resp.status == 200, resp.body
        return json.loads(resp.body)

    def get(self, path: str) -> dict[str, Any]:
        return json.loads(self.api.handle(Request("GET", path, Headers())).body)


@pytest.fixture
def topic() -> Topic:
    return Topic()


def ids(deliveries: list[dict[str, Any]]) -> list[str]:
    return [d["event"]["id"] for d in deliveries]


# --------------------------------------------------------------------------- publishing


def test_a_batch_with_a_token_is_accepted_and_kept(topic: Topic) -> None:
    resp = topic.publish([event(1), event(2)])
    assert (resp.status, resp.body) == (200, b"")
    assert [e["event"]["id"] for e in topic.get("/eventgrid/_published")["events"]] == ["e1", "e2"]


def test_the_topic_key_is_accepted_instead_of_a_token(topic: Topic) -> None:
    resp = topic.publish([event(1)], headers={"Authorization": None, "aeg-sas-key": topic.fleet.eventgrid_key})
    assert resp.status == 200


@pytest.mark.parametrize("headers", [
    pytest.param({"Authorization": None}, id="no-credentials"),
    pytest.param({"Authorization": None, "aeg-sas-key": "wrong"}, id="wrong-key"),
    pytest.param({"Authorization": "Bearer forged.token"}, id="forged-token"),
    pytest.param({"Authorization": None, "aeg-sas-token": "r=x&e=y&s=z"}, id="sas-token"),
])
def test_publishing_without_valid_credentials_is_401(topic: Topic, headers: dict[str, str]) -> None:
    assert topic.publish([event(1)], headers=headers).status == 401


def test_a_token_for_another_audience_is_refused(topic: Topic) -> None:
    arm = topic.fleet.tokens.issue("https://management.azure.com/")[0]
    assert topic.publish([event(1)], headers={"Authorization": f"Bearer {arm}"}).status == 401


@pytest.mark.parametrize("events", [
    pytest.param([{k: v for k, v in event(1).items() if k != "id"}], id="missing-id"),
    pytest.param([{k: v for k, v in event(1).items() if k != "source"}], id="missing-source"),
    pytest.param([{k: v for k, v in event(1).items() if k != "type"}], id="missing-type"),
    pytest.param([{k: v for k, v in event(1).items() if k != "specversion"}], id="missing-specversion"),
    pytest.param([{**event(1), "specversion": "0.3"}], id="old-specversion"),
    pytest.param([{**event(1), "data_base64": "AA=="}], id="data-and-data-base64"),
    pytest.param([], id="empty-batch"),
    pytest.param({"not": "a list"}, id="not-an-array"),
])
def test_malformed_events_are_400_and_nothing_is_kept(topic: Topic, events: Any) -> None:
    assert topic.publish(events).status == 400
    assert topic.get("/eventgrid/_published")["events"] == []


def test_malformed_json_and_the_wrong_schema_are_400(topic: Topic) -> None:
    assert topic.publish(None, raw=b"[{").status == 400
    assert topic.publish([event(1)], headers={"Content-Type": "application/json"}).status == 400


def test_the_api_version_is_required(topic: Topic) -> None:
    h = Headers({"Content-Type": BATCH, "Authorization": f"Bearer {topic.token}"})
    resp = topic.api.handle(Request("POST", "/eventgrid/api/events", h, json.dumps([event(1)]).encode()))
    assert resp.status == 400


def test_a_batch_over_one_megabyte_is_413(topic: Topic) -> None:
    big = [{**event(n), "data": "x" * 100_000} for n in range(11)]
    assert len(json.dumps(big)) > MAX_BATCH_BYTES
    assert topic.publish(big).status == 413


def test_an_eventgrid_fault_answers_instead_of_the_topic(topic: Topic) -> None:
    topic.fleet.faults.add({"target": "eventgrid", "status": 503, "retry_after": 1, "count": 1})
    assert topic.publish([event(1)]).status == 503
    assert topic.publish([event(1)]).status == 200


# --------------------------------------------------------------------------- deliveries


def test_each_subscriber_gets_every_event_once(topic: Topic) -> None:
    topic.publish([event(1), event(2)])
    first = topic.fetch("remediation")
    other = topic.fetch("audit")
    assert ids(first) == ["e1", "e2"] and ids(other) == ["e1", "e2"]
    topic.settle("remediation", *[(d["lock_token"], "ok") for d in first])
    assert topic.fetch("remediation") == []


def test_max_limits_a_batch_and_the_rest_comes_next(topic: Topic) -> None:
    topic.publish([event(n) for n in range(5)])
    assert ids(topic.fetch(max_n=2)) == ["e0", "e1"]
    assert ids(topic.fetch(max_n=10)) == ["e2", "e3", "e4"]


def test_types_filter_by_prefix(topic: Topic) -> None:
    topic.publish([event(1, "Steward.GpuNode.Unhealthy"), event(2, "Steward.PoolRequest.Accepted")])
    assert ids(topic.fetch(types="Steward.GpuNode.")) == ["e1"]


def test_an_expired_lock_redelivers_with_the_next_attempt_after_backoff(topic: Topic) -> None:
    topic.publish([event(1)])
    assert [d["attempt"] for d in topic.fetch(lock_s=5)] == [1]
    topic.fleet.advance(6)
    assert topic.fetch() == []  # back-off (10 s) after the failed attempt
    topic.fleet.advance(10)
    assert [d["attempt"] for d in topic.fetch()] == [2]


def test_retry_redelivers_and_exhausted_attempts_go_to_the_dead_letters(topic: Topic) -> None:
    topic.publish([event(1)])
    for attempt in (1, 2, 3):
        topic.fleet.advance(3600)
        got = topic.fetch()
        assert [d["attempt"] for d in got] == [attempt]
        topic.settle("remediation", (got[0]["lock_token"], "retry"))
    topic.fleet.advance(3600)
    assert topic.fetch() == []
    dead = topic.get("/eventgrid/_deadletter?subscriber=remediation")["deadletter"]
    assert [(d["event"]["id"], d["attempts"]) for d in dead] == [("e1", 3)]


def test_dead_sends_an_event_straight_to_the_dead_letters(topic: Topic) -> None:
    topic.publish([event(1)])
    got = topic.fetch()
    topic.settle("remediation", (got[0]["lock_token"], "dead"))
    dead = topic.get("/eventgrid/_deadletter?subscriber=remediation")["deadletter"]
    assert [d["event"]["id"] for d in dead] == ["e1"]


def test_settling_an_unknown_lock_is_reported_not_fatal(topic: Topic) -> None:
    assert topic.settle("remediation", ("nope", "ok")) == {"settled": 0, "unknown_lock_tokens": ["nope"]}


@pytest.mark.parametrize(("path", "method", "payload", "status"), [
    pytest.param("/eventgrid/_deliveries?max=1", "GET", b"", 400, id="no-subscriber"),
    pytest.param("/eventgrid/_deliveries?subscriber=a&max=x", "GET", b"", 400, id="bad-max"),
    pytest.param("/eventgrid/_deliveries/settle", "POST", b"{", 400, id="bad-json"),
    pytest.param("/eventgrid/_deliveries/settle", "POST", b'{"subscriber":"a","results":[{"outcome":"maybe"}]}', 400,
                 id="bad-outcome"),
    pytest.param("/eventgrid/_deliveries", "DELETE", b"", 405, id="wrong-method"),
    pytest.param("/eventgrid/api/events", "GET", b"", 405, id="get-topic"),
    pytest.param("/eventgrid/nope", "GET", b"", 404, id="unknown-path"),
])
def test_bad_feed_requests_get_errors(topic: Topic, path: str, method: str, payload: bytes, status: int) -> None:
    assert topic.api.handle(Request(method, path, Headers(), payload)).status == status


def test_a_duplicate_fault_delivers_an_event_twice(topic: Topic) -> None:
    topic.fleet.faults.add({"target": "eventgrid-delivery", "duplicate": True, "count": 1})
    topic.publish([event(1), event(2)])
    assert ids(topic.fetch()) == ["e1", "e1", "e2"]


def test_a_delay_fault_holds_the_first_delivery(topic: Topic) -> None:
    topic.fleet.faults.add({"target": "eventgrid-delivery", "delay_s": 30, "path": "Unhealthy"})
    topic.publish([event(1, "Steward.GpuNode.Unhealthy"), event(2)])
    assert ids(topic.fetch()) == ["e2"]
    topic.fleet.advance(31)
    assert ids(topic.fetch()) == ["e1"]


def test_the_backlog_counts_a_delayed_delivery_until_it_is_settled(topic: Topic) -> None:
    """A harness must not call a run quiet while a delivery is still on its way (soak short seed 12: a Resource
    Health event held 300 s by a delay fault arrived after the run had ended)."""
    topic.fleet.faults.add({"target": "eventgrid-delivery", "delay_s": 300, "path": "Unhealthy"})
    topic.publish([event(1, "Steward.GpuNode.Unhealthy")])
    backlog = topic.get("/eventgrid/_backlog?subscriber=remediation")
    assert (backlog["queued"], backlog["locked"]) == (1, 0)
    assert backlog["next_at"] == pytest.approx(topic.fleet.clock.now() + 300)
    assert topic.fetch() == []
    topic.fleet.advance(301)
    [delivery] = topic.fetch()
    assert topic.get("/eventgrid/_backlog?subscriber=remediation")["locked"] == 1
    topic.settle("remediation", (delivery["lock_token"], "ok"))
    assert topic.get("/eventgrid/_backlog?subscriber=remediation") == {"queued": 0, "locked": 0, "next_at": None}


def test_the_backlog_filters_as_the_subscriber_does(topic: Topic) -> None:
    topic.publish([event(1, "Steward.GpuNode.Unhealthy"), event(2)])
    assert topic.get("/eventgrid/_backlog?subscriber=remediation&types=Steward.GpuNode.")["queued"] == 1
    assert ids(topic.fetch(types="Steward.GpuNode.")) == ["e1"]


def test_a_reorder_fault_shuffles_a_batch_reproducibly() -> None:
    def order() -> list[str]:
        t = Topic()
        t.fleet.faults.add({"target": "eventgrid-delivery", "reorder": True})
        t.publish([event(n) for n in range(8)])
        return ids(t.fetch())

    assert order() == order()
    assert order() != [f"e{n}" for n in range(8)]
    assert sorted(order()) == sorted(f"e{n}" for n in range(8))

"""Event Grid triggers, fed from the simulator's deliveries feed with the subscription's policy.

In Azure, Event Grid pushes each event to the function's webhook and the Functions host invokes
the function once per event; an error answer makes Event Grid retry with back-off (10 s, 30 s,
1 min, 5 min, 10 min, 30 min, 1 h, then hourly) until ``maxDeliveryAttempts`` or
``eventTtlMinutes`` runs out, and then dead-letter (or drop) the event. The local host has no
public endpoint, so it pulls from the simulator's feed (docs/architecture.md) and settles each
delivery: ``ok`` on success, ``retry`` on an exception (the feed applies Event Grid's back-off),
``dead`` once the subscription's attempts or time to live are used up. Events whose type the
subscription does not include are never given to the function (``includedEventTypes`` are exact
types, as in Event Grid; the feed's ``types`` filter is by prefix, so we check again).

A delivery's lock is Event Grid's 30-second response timeout, measured on the host's own time; a
function that runs longer is redelivered, as a webhook that does not answer in time would be.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devhost import invoke
from devhost.indexing import FunctionSpec

if TYPE_CHECKING:
    from devhost.host import Host

log = logging.getLogger("devhost.eventgrid")

DEFAULT_SUBSCRIPTIONS = Path(__file__).with_name("eventgrid_subscriptions.json")
RESPONSE_TIMEOUT_S = 30.0
MAX_IDLE_WAIT_S = 0.5


class SubscriptionError(ValueError):
    """The subscriptions file is malformed or lacks an Event Grid function."""


@dataclass(frozen=True)
class Subscription:
    function: str
    included_event_types: tuple[str, ...] = ()
    max_delivery_attempts: int = 30
    event_ttl_minutes: float = 1440.0
    subject_begins_with: str = ""
    subject_ends_with: str = ""
    subscriber: str = ""

    @property
    def name(self) -> str:
        return self.subscriber or self.function

    def accepts(self, event: Mapping[str, Any]) -> bool:
        if self.included_event_types and str(event.get("type", "")) not in self.included_event_types:
            return False
        subject = str(event.get("subject") or "")
        return subject.startswith(self.subject_begins_with) and subject.endswith(self.subject_ends_with)


def load_subscriptions(path: str | Path | None = None) -> dict[str, Subscription]:
    """function name -> Subscription, from devhost/eventgrid_subscriptions.json (or ``path``)."""
    source = Path(path) if path else DEFAULT_SUBSCRIPTIONS
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise SubscriptionError(f"cannot read Event Grid subscriptions from {source}: {error}") from None
    subscriptions = {}
    for function, raw in document.items():
        if function.startswith("$"):
            continue
        if not isinstance(raw, dict):
            raise SubscriptionError(f"{source}: subscription {function!r} must be an object")
        attempts = int(raw.get("maxDeliveryAttempts", 30))
        ttl = float(raw.get("eventTtlMinutes", 1440))
        if not 1 <= attempts <= 30:
            raise SubscriptionError(f"{source}: {function}.maxDeliveryAttempts must be 1..30 (Event Grid's range)")
        if not 1 <= ttl <= 1440:
            raise SubscriptionError(f"{source}: {function}.eventTtlMinutes must be 1..1440 (Event Grid's range)")
        schema = raw.get("eventDeliverySchema", "CloudEventSchemaV1_0")
        if schema != "CloudEventSchemaV1_0":
            raise SubscriptionError(f"{source}: {function}.eventDeliverySchema must be CloudEventSchemaV1_0")
        subscriptions[function] = Subscription(
            function=function, included_event_types=tuple(raw.get("includedEventTypes") or ()),
            max_delivery_attempts=attempts, event_ttl_minutes=ttl,
            subject_begins_with=str(raw.get("subjectBeginsWith") or ""),
            subject_ends_with=str(raw.get("subjectEndsWith") or ""), subscriber=str(raw.get("subscriber") or ""),
        )
    return subscriptions


class DeliveriesFeed:
    """HTTP client of the simulator's deliveries feed (trusting its CA bundle)."""

    def __init__(self, url: str, *, ca_bundle: str | None = None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._context = ssl.create_default_context(cafile=ca_bundle) if url.startswith("https") else None

    def _request(self, url: str, body: Any | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context) as response:
            return json.loads(response.read() or b"null")

    def fetch(self, *, subscriber: str, max_n: int, lock_s: float, types: tuple[str, ...]) -> list[dict[str, Any]]:
        query = {"subscriber": subscriber, "max": str(max_n), "lock_s": f"{lock_s:g}"}
        if types:
            query["types"] = ",".join(types)
        answer = self._request(f"{self.url}?{urllib.parse.urlencode(query)}")
        return list((answer or {}).get("deliveries") or [])

    def settle(self, *, subscriber: str, lock_token: str, outcome: str, reason: str = "") -> None:
        result = {"lock_token": lock_token, "outcome": outcome}
        if reason:
            result["reason"] = reason[:1000]
        self._request(f"{self.url}/settle", {"subscriber": subscriber, "results": [result]})


def _event_time(event: Mapping[str, Any]) -> float | None:
    text = event.get("time")
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class EventGridListener:
    """One Event Grid-triggered function: pulls deliveries and settles each after its invocation."""

    def __init__(self, host: Host, spec: FunctionSpec, subscription: Subscription, feed: DeliveriesFeed, *,
                 max_batch: int = 8) -> None:
        self.host = host
        self.spec = spec
        self.subscription = subscription
        self.feed = feed
        self.max_batch = max_batch
        self._in_flight = 0
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_empty_poll = 0.0
        self._last_warning = -1e9

    @property
    def lock_s(self) -> float:
        speed = float(getattr(self.host.clock, "speed", 1.0) or 1.0)
        return RESPONSE_TIMEOUT_S * speed

    @property
    def in_flight(self) -> int:
        with self._changed:
            return self._in_flight

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"devhost-eventgrid-{self.spec.name}", daemon=True)
        self._thread.start()

    def stop_polling(self) -> None:
        self._wake.set()
        with self._changed:
            self._changed.notify_all()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        idle = 0.02
        while not self.host.stopping:
            with self._changed:
                while self._in_flight >= self.max_batch and not self.host.stopping:
                    self._changed.wait(0.5)
                room = self.max_batch - self._in_flight
            if self.host.stopping:
                return
            poll_started = time.monotonic()
            try:
                deliveries = self.feed.fetch(subscriber=self.subscription.name, max_n=room, lock_s=self.lock_s,
                                             types=self.subscription.included_event_types)
            except (OSError, urllib.error.URLError, ValueError) as error:
                now = time.monotonic()
                if now - self._last_warning > 30.0:  # a simulator that went away is worth one line, not hundreds
                    self._last_warning = now
                    log.warning("%s: Event Grid deliveries feed failed: %s", self.spec.name, error)
                deliveries = []
            if deliveries:
                idle = 0.02
                for delivery in deliveries:
                    self._dispatch(delivery)
                continue
            self.last_empty_poll = poll_started
            self._wake.wait(idle)
            self._wake.clear()
            idle = min(MAX_IDLE_WAIT_S, idle * 2)

    def _dispatch(self, delivery: dict[str, Any]) -> None:
        with self._changed:
            self._in_flight += 1
        self.host.activity()

        def done() -> None:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()
            self.host.activity()

        try:
            self.host.submit(self.spec.name, lambda: self._process(delivery), on_done=done, swallow=True)
        except RuntimeError:  # shutting down: let the lock run out, the feed redelivers
            done()

    def _settle(self, token: str, outcome: str, reason: str = "") -> None:
        try:
            self.feed.settle(subscriber=self.subscription.name, lock_token=token, outcome=outcome, reason=reason)
        except (OSError, urllib.error.URLError, ValueError) as error:
            log.warning("%s: settling a delivery (%s) failed: %s; it will be redelivered", self.spec.name, outcome, error)
        self.host.record_settlement(self.spec.name, outcome)

    def _process(self, delivery: dict[str, Any]) -> None:
        event = delivery.get("event") or {}
        token = str(delivery.get("lock_token", ""))
        attempt = int(delivery.get("attempt") or 1)
        if not self.subscription.accepts(event):
            self._settle(token, "ok")  # filtered out: this subscription never delivers it
            return
        published = _event_time(event)
        if published is not None and self.host.clock.now() - published > self.subscription.event_ttl_minutes * 60:
            self._settle(token, "dead", f"event time to live ({self.subscription.event_ttl_minutes:g} min) expired")
            return
        try:
            trigger = invoke.event_grid_event(event)
            self.host.run_invocation(self.spec, trigger)
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"
            if attempt >= self.subscription.max_delivery_attempts:
                log.error("%s: event %s failed on delivery attempt %d of %d; dead-lettering it. Last error: %s",
                          self.spec.name, event.get("id"), attempt, self.subscription.max_delivery_attempts, reason)
                self._settle(token, "dead", f"maxDeliveryAttempts ({attempt}) reached; last error: {reason}")
            else:
                self._settle(token, "retry", reason)
            return
        self._settle(token, "ok")

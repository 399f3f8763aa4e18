"""An Event Grid topic (CloudEvents 1.0) and a pull feed that stands in for push delivery.

The app publishes with ``EventGridPublisherClient``; this handler accepts exactly what that client
sends (``POST /eventgrid/api/events?api-version=2018-01-01``, content type
``application/cloudevents-batch+json``, a bearer token for ``https://eventgrid.azure.net`` or an
``aeg-sas-key`` header) and answers as the service does: 200 with an empty body, 400 for a
malformed event, 401 without valid credentials, 413 over 1 MB.

Event Grid pushes to subscribers with at-least-once delivery: retries with back-off, redelivery
when a handler does not answer in time, duplicates, arbitrary order, dead-lettering. The local
Functions host has no public endpoint, so it pulls instead, and the same semantics are reproduced
here (per subscriber: every event once, a lock per delivery, redelivery on lock expiry or
``retry``, dead-letter after ``timings["eventgrid_max_attempts"]`` attempts or ``dead``):

- ``GET  /eventgrid/_deliveries?subscriber=NAME&max=N&lock_s=S[&types=prefix1,prefix2]``
- ``POST /eventgrid/_deliveries/settle`` ``{"subscriber", "results": [{"lock_token", "outcome"}]}``
- ``GET  /eventgrid/_deadletter?subscriber=NAME``, ``GET /eventgrid/_published``
- ``GET  /eventgrid/_backlog?subscriber=NAME[&types=...]``: queued and locked deliveries, and the next due

Every time on the feed (``lock_s``, back-off, ``delay_s`` of delivery faults) is in sim seconds, on
the fleet's clock. Delivery faults (rules with target ``eventgrid-delivery``): ``duplicate``,
``delay_s``, ``reorder``.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from sim.core.http import Request, Response
from sim.identity.tokens import EVENTGRID_AUDIENCES

MAX_BATCH_BYTES = 1024 * 1024
# Event Grid's retry schedule (seconds after a failed attempt), then every hour.
RETRY_SCHEDULE_S = (10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0)
DEFAULT_MAX_ATTEMPTS = 30
DEFAULT_LOCK_S = 30.0


def _eg_error(status: int, code: str, message: str) -> Response:
    return Response.json(status, {"error": {"code": code, "message": message}})


def eventgrid_key(fleet: Any) -> str:
    """The topic's access key (``fleet.eventgrid_key``; generated when the model has none)."""
    key = getattr(fleet, "eventgrid_key", None)
    if not key:
        key = secrets.token_urlsafe(32)
        fleet.eventgrid_key = key
    return str(key)


@dataclass
class _Pending:
    seq: int
    attempt: int
    not_before: float = 0.0


@dataclass
class _Locked:
    seq: int
    attempt: int
    until: float


@dataclass
class _Subscriber:
    name: str
    next_seq: int = 0
    ready: list[_Pending] = field(default_factory=list)
    locked: dict[str, _Locked] = field(default_factory=dict)
    dead: list[dict[str, Any]] = field(default_factory=list)
    delivered_ok: int = 0


class EventGridApi:
    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.key = eventgrid_key(fleet)
        state = getattr(fleet, "eventgrid_state", None)
        if not isinstance(state, _TopicState):
            state = _TopicState()
            fleet.eventgrid_state = state
        self.state = state

    @property
    def published(self) -> list[dict[str, Any]]:
        return [e for seq, (_, e) in enumerate(self.state.events) if seq not in self.state.system]

    def _now(self) -> float:
        return float(self.fleet.clock.now())

    def _timing(self, name: str, default: float) -> float:
        return float((getattr(self.fleet, "timings", None) or {}).get(name, default))

    def handle(self, request: Request) -> Response:
        try:
            return self._route(request)
        except Exception as exc:  # never let a bad request take the simulator down
            return _eg_error(500, "InternalServerError", f"{type(exc).__name__}: {exc}")

    def _route(self, request: Request) -> Response:
        path = request.path.rstrip("/")
        if path.endswith("/eventgrid/api/events"):
            if request.method != "POST":
                return _eg_error(405, "MethodNotAllowed", f"The method {request.method} is not allowed.")
            faults = getattr(self.fleet, "faults", None)
            hit = faults.match(target="eventgrid", method=request.method, path=request.path) if faults else None
            if hit:
                return hit
            response = self._publish(request)
            if hit is not None:
                response.delay_s += hit.delay_s
            return response
        routes = {
            ("GET", "/eventgrid/_deliveries"): self._deliveries,
            ("POST", "/eventgrid/_deliveries/settle"): self._settle,
            ("GET", "/eventgrid/_deadletter"): self._deadletter,
            ("GET", "/eventgrid/_published"): self._published,
            ("GET", "/eventgrid/_backlog"): self._backlog,
        }
        handler = routes.get((request.method, path))
        if handler is not None:
            return handler(request)
        if any(p == path for _, p in routes):
            return _eg_error(405, "MethodNotAllowed", f"The method {request.method} is not allowed.")
        return _eg_error(404, "NotFound", f"No Event Grid resource at {request.path}.")

    # ---- publishing ----

    def _authorised(self, request: Request) -> Response | None:
        key = request.headers.get("aeg-sas-key")
        if key is not None:
            if secrets.compare_digest(str(key), self.key):
                return None
            return _eg_error(401, "Unauthorized", "The request authorization key is not authorized.")
        if request.headers.get("aeg-sas-token") is not None:
            return _eg_error(401, "Unauthorized", "SAS tokens are not accepted by this topic; use a key or Entra ID.")
        with self.fleet.lock:
            verdict = self.fleet.tokens.verify(request.bearer, EVENTGRID_AUDIENCES)
        if verdict.status == 200:
            return None
        if verdict.wrong_audience:
            return _eg_error(401, "Unauthorized", f"The token audience is not valid for Event Grid: {verdict.reason}.")
        return _eg_error(401, "Unauthorized",
                         "The request is not authorized: provide an aeg-sas-key or a bearer token "
                         f"({verdict.reason}).")

    def _publish(self, request: Request) -> Response:
        denied = self._authorised(request)
        if denied is not None:
            return denied
        if not request.arg("api-version"):
            return _eg_error(400, "BadRequest", "The api-version query parameter (?api-version=) is required.")
        if len(request.body) > MAX_BATCH_BYTES:
            return _eg_error(413, "RequestEntityTooLarge",
                             f"The size of the batch ({len(request.body)} bytes) exceeds the limit of 1048576 bytes.")
        content_type = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
        if content_type not in ("application/cloudevents-batch+json", "application/cloudevents+json"):
            return _eg_error(400, "BadRequest",
                             f"This topic accepts the CloudEvents 1.0 schema; content type {content_type!r} is not it.")
        try:
            payload = request.json()
        except ValueError as exc:
            return _eg_error(400, "BadRequest", f"The request body is not valid JSON: {exc}.")
        events = [payload] if content_type == "application/cloudevents+json" else payload
        if not isinstance(events, list) or not events:
            return _eg_error(400, "BadRequest", "The request body must be a non-empty JSON array of CloudEvents.")
        for index, event in enumerate(events):
            problem = _cloud_event_problem(event)
            if problem:
                return _eg_error(400, "BadRequest", f"Event at index {index} is not a valid CloudEvent 1.0: {problem}.")
        with self.fleet.lock:
            now = self._now()
            for event in events:
                self.state.events.append((now, dict(event)))
        return Response(status=200)

    # ---- the pull feed ----

    def _subscriber(self, name: str) -> _Subscriber:
        sub = self.state.subscribers.get(name)
        if sub is None:
            sub = self.state.subscribers[name] = _Subscriber(name=name)
        return sub

    def _dead_letter(self, sub: _Subscriber, seq: int, attempt: int, reason: str) -> None:
        sub.dead.append({"event": self.state.events[seq][1], "attempts": attempt, "reason": reason,
                         "dead_lettered_at": self._now()})

    def _deliveries(self, request: Request) -> Response:
        name = request.arg("subscriber")
        if not name:
            return _eg_error(400, "BadRequest", "The 'subscriber' query parameter is required.")
        try:
            max_n = int(request.arg("max") or 10)
            lock_s = float(request.arg("lock_s") or DEFAULT_LOCK_S)
        except ValueError:
            return _eg_error(400, "BadRequest", "'max' must be an integer and 'lock_s' a number.")
        if max_n < 1 or lock_s <= 0:
            return _eg_error(400, "BadRequest", "'max' must be >= 1 and 'lock_s' > 0.")
        types = [t for t in (request.arg("types") or "").split(",") if t]
        max_attempts = int(self._timing("eventgrid_max_attempts", DEFAULT_MAX_ATTEMPTS))
        faults = getattr(self.fleet, "faults", None)
        with self.fleet.lock:
            now = self._now()
            sub = self._subscriber(name)
            self._enqueue(sub, types, now, max_attempts)
            due = [p for p in sub.ready if p.not_before <= now][:max_n]
            for p in due:
                sub.ready.remove(p)
            if len(due) > 1 and faults is not None:
                first_type = str(self.state.events[due[0].seq][1].get("type", ""))
                rule = faults.delivery_effects(subscriber=name, event_type=first_type, batch=True)
                if rule is not None:
                    self.fleet.rng.shuffle(due)
            out = []
            for p in due:
                token = secrets.token_hex(12)
                sub.locked[token] = _Locked(seq=p.seq, attempt=p.attempt, until=now + lock_s)
                out.append({"lock_token": token, "attempt": p.attempt, "event": self.state.events[p.seq][1]})
        return Response.json(200, {"deliveries": out})

    def _enqueue(self, sub: _Subscriber, types: list[str], now: float, max_attempts: int) -> None:
        """Expired locks back to the queue (failed attempts), and new events into it, once each."""
        faults = getattr(self.fleet, "faults", None)
        # Locks that ran out are failed attempts: back to the queue (or the dead letters).
        for token, held in list(sub.locked.items()):
            if held.until <= now:
                del sub.locked[token]
                self._after_failure(sub, held.seq, held.attempt, now, max_attempts, "lock expired")
        # New events enter the subscriber's queue once (filtered events are skipped for good).
        while sub.next_seq < len(self.state.events):
            seq = sub.next_seq
            sub.next_seq += 1
            event = self.state.events[seq][1]
            etype = str(event.get("type", ""))
            if types and not any(etype.startswith(p) for p in types):
                continue
            rule = faults.delivery_effects(subscriber=sub.name, event_type=etype) if faults else None
            not_before = now + (rule.delay_s if rule is not None else 0.0)
            sub.ready.append(_Pending(seq=seq, attempt=1, not_before=not_before))
            if rule is not None and rule.duplicate:
                sub.ready.append(_Pending(seq=seq, attempt=1, not_before=not_before))

    def _backlog(self, request: Request) -> Response:
        """What a subscriber has still to receive: queued (some delayed or backing off) and locked deliveries,
        and when the next one is due. A harness's view (like ``_published``), not Event Grid's API: a soak
        driver must not call a run quiet while a delayed delivery is still on its way."""
        name = request.arg("subscriber")
        if not name:
            return _eg_error(400, "BadRequest", "The 'subscriber' query parameter is required.")
        types = [t for t in (request.arg("types") or "").split(",") if t]
        max_attempts = int(self._timing("eventgrid_max_attempts", DEFAULT_MAX_ATTEMPTS))
        with self.fleet.lock:
            now = self._now()
            sub = self._subscriber(name)
            self._enqueue(sub, types, now, max_attempts)
            times = [p.not_before for p in sub.ready] + [held.until for held in sub.locked.values()]
            return Response.json(200, {"queued": len(sub.ready), "locked": len(sub.locked),
                                       "next_at": min(times) if times else None})

    def _after_failure(self, sub: _Subscriber, seq: int, attempt: int, now: float, max_attempts: int,
                       reason: str) -> None:
        if attempt >= max_attempts:
            self._dead_letter(sub, seq, attempt, f"{reason}; delivery attempts exhausted ({attempt})")
            return
        backoff = RETRY_SCHEDULE_S[min(attempt - 1, len(RETRY_SCHEDULE_S) - 1)]
        backoff *= self._timing("eventgrid_backoff_scale", 1.0)
        sub.ready.append(_Pending(seq=seq, attempt=attempt + 1, not_before=now + backoff))

    def _settle(self, request: Request) -> Response:
        try:
            body = request.json()
        except ValueError as exc:
            return _eg_error(400, "BadRequest", f"The request body is not valid JSON: {exc}.")
        if not isinstance(body, dict) or not body.get("subscriber") or not isinstance(body.get("results"), list):
            return _eg_error(400, "BadRequest", "Expected {\"subscriber\": ..., \"results\": [...]}.")
        max_attempts = int(self._timing("eventgrid_max_attempts", DEFAULT_MAX_ATTEMPTS))
        settled, unknown = 0, []
        with self.fleet.lock:
            now = self._now()
            sub = self._subscriber(str(body["subscriber"]))
            for result in body["results"]:
                if not isinstance(result, dict) or result.get("outcome") not in ("ok", "retry", "dead"):
                    return _eg_error(400, "BadRequest", "Each result needs a lock_token and an outcome ok|retry|dead.")
                held = sub.locked.pop(str(result.get("lock_token")), None)
                if held is None:
                    unknown.append(result.get("lock_token"))
                    continue
                settled += 1
                if result["outcome"] == "ok":
                    sub.delivered_ok += 1
                elif result["outcome"] == "dead":
                    self._dead_letter(sub, held.seq, held.attempt, str(result.get("reason") or "dead-lettered by handler"))
                else:
                    self._after_failure(sub, held.seq, held.attempt, now, max_attempts, "handler asked for a retry")
        return Response.json(200, {"settled": settled, "unknown_lock_tokens": unknown})

    def _deadletter(self, request: Request) -> Response:
        name = request.arg("subscriber")
        if not name:
            return _eg_error(400, "BadRequest", "The 'subscriber' query parameter is required.")
        with self.fleet.lock:
            dead = list(self._subscriber(name).dead)
        return Response.json(200, {"deadletter": dead})

    def _published(self, request: Request) -> Response:
        with self.fleet.lock:
            events = [{"received_at": at, "event": e} for seq, (at, e) in enumerate(self.state.events)
                      if seq not in self.state.system]
        return Response.json(200, {"events": events})


@dataclass
class _TopicState:
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    subscribers: dict[str, _Subscriber] = field(default_factory=dict)
    # Sequence numbers of events a system topic raised (Azure's, e.g. HealthResources): delivered through the
    # same feed to the subscribers whose types include them, never counted as published by the app.
    system: set[int] = field(default_factory=set)


def deliver_system_event(fleet: Any, event: dict[str, Any]) -> None:
    """Enqueue an event an Azure system topic raised (sim/arm/resource_health.py) for delivery through the feed.

    One feed stands for every topic: a subscriber's ``types`` filter (its subscription's
    ``includedEventTypes``) decides who receives it, as each system topic's own subscriptions would."""
    problem = _cloud_event_problem(event)
    if problem:
        raise ValueError(f"not a CloudEvent 1.0: {problem}")
    api = EventGridApi(fleet)
    with fleet.lock:
        api.state.system.add(len(api.state.events))
        api.state.events.append((float(fleet.clock.now()), dict(event)))


def _cloud_event_problem(event: Any) -> str | None:
    if not isinstance(event, dict):
        return "it is not a JSON object"
    for attr in ("id", "source", "type", "specversion"):
        value = event.get(attr)
        if not isinstance(value, str) or not value:
            return f"the required attribute '{attr}' is missing or empty"
    if event["specversion"] != "1.0":
        return f"specversion must be '1.0', not {event['specversion']!r}"
    if "data" in event and "data_base64" in event:
        return "'data' and 'data_base64' are mutually exclusive"
    try:
        json.dumps(event)
    except (TypeError, ValueError):
        return "it cannot be serialised"
    return None

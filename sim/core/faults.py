"""Fault rules: the bad days of a cloud (throttling, 5xx, slow or dropped answers, failing LROs).

The app's retry and back-off code is only as good as the faults it has met, so every simulated
service asks the same :class:`FaultEngine` before answering. Rules come from the scenario
(``faults:``) or at run time (``POST /_sim/faults`` -> :meth:`FaultEngine.add`). Probabilities draw
from the fleet's seeded ``random.Random``, so a scenario and seed replay the same faults for the
same sequence of requests. Every fault that fires is recorded in :attr:`FaultEngine.fired` for the
oracles and tests.

Rule fields (all optional except ``target``)::

    target:      arm | kube | eventgrid | identity | lro | eventgrid-delivery
    method:      HTTP method to match (any when absent)
    path:        regular expression searched in the request path (for eventgrid-delivery: in the
                 event type)
    cluster:     cluster name to match (kube, arm and lro requests carry it)
    subscriber:  eventgrid-delivery only: the subscriber name
    count:       fire at most this many times
    probability: 0..1 (default 1), drawn from the fleet rng
    after_s / until_s: active window, sim seconds after the rule was added (scenario start for
                 scenario rules)
    effects      status (429, 500, 503, 400 ...), code, message, retry_after (seconds, with 429/503),
                 delay_s (answer late; alone it slows a normal answer), drop (close the connection);
                 retry_after is sent rounded up to whole seconds, as ARM does
    lro:         code/message: the operation ends Failed with this error (e.g. AllocationFailed)
    eventgrid-delivery: duplicate (deliver twice), delay_s (hold the first delivery), reorder

Injection recipes: a synchronous QuotaExceeded is ``{target: arm, method: PUT, path: agentPools,
status: 400, code: QuotaExceeded}``; an allocation failure is ``{target: lro, code:
AllocationFailed}``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.core.http import Response

TARGETS = ("arm", "kube", "eventgrid", "identity", "lro", "eventgrid-delivery")

_DEFAULT_CODES = {
    429: ("TooManyRequests", "The request is being throttled."),
    500: ("InternalServerError", "An internal server error occurred."),
    502: ("BadGateway", "The gateway did not receive a valid response."),
    503: ("ServiceUnavailable", "The service is temporarily unavailable."),
    504: ("GatewayTimeout", "The gateway timed out."),
}
_KUBE_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
                 400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict"}


class FaultRuleError(ValueError):
    """A fault rule that cannot be used (the control API answers 400 with this message)."""


@dataclass
class FaultRule:
    target: str
    method: str | None = None
    path: str | None = None
    cluster: str | None = None
    subscriber: str | None = None
    count: int | None = None
    probability: float = 1.0
    after_s: float = 0.0
    until_s: float | None = None
    status: int | None = None
    code: str | None = None
    message: str | None = None
    retry_after: float | None = None
    delay_s: float = 0.0
    drop: bool = False
    duplicate: bool = False
    reorder: bool = False
    id: str = ""
    added_at: float = 0.0
    fired: int = 0
    _regex: re.Pattern[str] | None = field(default=None, repr=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, rule_id: str, added_at: float) -> FaultRule:
        if not isinstance(raw, Mapping):
            raise FaultRuleError("a fault rule must be an object")
        known = {f for f in cls.__dataclass_fields__ if not f.startswith("_") and f not in ("fired", "added_at")}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise FaultRuleError(f"unknown fault rule fields: {', '.join(unknown)}")
        target = raw.get("target")
        if target not in TARGETS:
            raise FaultRuleError(f"fault rule target must be one of {', '.join(TARGETS)}, not {target!r}")
        try:
            rule = cls(
                target=str(target),
                method=str(raw["method"]).upper() if raw.get("method") else None,
                path=str(raw["path"]) if raw.get("path") else None,
                cluster=str(raw["cluster"]) if raw.get("cluster") else None,
                subscriber=str(raw["subscriber"]) if raw.get("subscriber") else None,
                count=int(raw["count"]) if raw.get("count") is not None else None,
                probability=float(raw.get("probability", 1.0)),
                after_s=float(raw.get("after_s", 0.0)),
                until_s=float(raw["until_s"]) if raw.get("until_s") is not None else None,
                status=int(raw["status"]) if raw.get("status") is not None else None,
                code=str(raw["code"]) if raw.get("code") else None,
                message=str(raw["message"]) if raw.get("message") else None,
                retry_after=float(raw["retry_after"]) if raw.get("retry_after") is not None else None,
                delay_s=float(raw.get("delay_s", 0.0)),
                drop=bool(raw.get("drop", False)),
                duplicate=bool(raw.get("duplicate", False)),
                reorder=bool(raw.get("reorder", False)),
                id=str(raw.get("id") or rule_id),
                added_at=added_at,
            )
        except (TypeError, ValueError) as exc:
            raise FaultRuleError(f"bad fault rule value: {exc}") from exc
        if not 0.0 <= rule.probability <= 1.0:
            raise FaultRuleError("probability must be between 0 and 1")
        if rule.status is not None and not 100 <= rule.status <= 599:
            raise FaultRuleError("status must be an HTTP status code")
        if rule.target == "lro" and not rule.code:
            rule.code = "InternalOperationError"
        http_effect = rule.status is not None or rule.drop or rule.delay_s > 0
        if rule.target in ("arm", "kube", "eventgrid", "identity") and not http_effect:
            raise FaultRuleError("an HTTP fault rule needs status, delay_s or drop")
        if rule.target == "eventgrid-delivery" and not (rule.duplicate or rule.reorder or rule.delay_s > 0):
            raise FaultRuleError("an eventgrid-delivery rule needs duplicate, reorder or delay_s")
        if rule.path:
            try:
                rule._regex = re.compile(rule.path)
            except re.error as exc:
                raise FaultRuleError(f"bad path regex {rule.path!r}: {exc}") from exc
        return rule

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_") and v not in (None, False)}


class FaultHit(Response):
    """The answer a fault gives instead of the real one (a :class:`Response`), plus the rule.

    Handlers return it as is; for ``lro`` rules, :attr:`code`/:attr:`message` are the error the
    operation ends with.
    """

    rule: FaultRule
    code: str
    message: str

    @property
    def replaces_answer(self) -> bool:
        """False for a delay-only rule: answer normally, ``delay_s`` late."""
        return self.status != 0 or self.drop

    def __bool__(self) -> bool:
        # ``if hit: return hit`` must never send a status-0 answer: a delay-only hit is falsy and
        # handlers that want the delay use :func:`apply_delay`.
        return self.replaces_answer


def _now_from(clock: Any) -> Callable[[], float]:
    if hasattr(clock, "now"):
        return clock.now  # type: ignore[no-any-return]
    if callable(clock):
        return clock  # type: ignore[no-any-return]
    raise TypeError("clock must have now() or be callable")


class FaultEngine:
    def __init__(self, rules: Iterable[Mapping[str, Any]] | None = None, *, clock: Any, rng: random.Random) -> None:
        self._now = _now_from(clock)
        self._rng = rng
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.rules: list[FaultRule] = []
        self.fired: list[dict[str, Any]] = []
        for raw in rules or ():
            self.add(raw)

    def add(self, raw: Mapping[str, Any]) -> FaultRule:
        """Add a rule (raises :class:`FaultRuleError` for a bad one); returns it."""
        with self._lock:
            rule = FaultRule.from_dict(raw, rule_id=f"fault-{next(self._ids)}", added_at=self._now())
            self.rules.append(rule)
            return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _candidates(self, target: str, *, method: str | None, subject: str | None, cluster: str | None,
                    subscriber: str | None, want: Callable[[FaultRule], bool] | None = None) -> FaultRule | None:
        now = self._now()
        for rule in self.rules:
            if rule.target != target or (want is not None and not want(rule)):
                continue
            if rule.count is not None and rule.fired >= rule.count:
                continue
            age = now - rule.added_at
            if age < rule.after_s or (rule.until_s is not None and age >= rule.until_s):
                continue
            if rule.method and method and rule.method != method.upper():
                continue
            if rule.cluster and (cluster or "").lower() != rule.cluster.lower():
                continue
            if rule.subscriber and subscriber != rule.subscriber:
                continue
            if rule._regex is not None and not rule._regex.search(subject or ""):
                continue
            if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                continue
            return rule
        return None

    def _record(self, rule: FaultRule, **what: Any) -> None:
        rule.fired += 1
        entry = {"rule": rule.id, "target": rule.target, "at": self._now()}
        entry.update({k: v for k, v in what.items() if v is not None})
        self.fired.append(entry)

    def match(self, *, target: str, method: str | None = None, path: str | None = None,
              cluster: str | None = None) -> FaultHit | None:
        """The fault answer for this request, or None to answer normally.

        For ``kube`` the body is a Kubernetes ``Status``; otherwise ARM's error shape. A rule with
        only ``delay_s`` returns a hit with ``status == 0``: the handler answers normally, late
        (see :func:`apply_delay`).
        """
        with self._lock:
            rule = self._candidates(target, method=method, subject=path, cluster=cluster, subscriber=None)
            if rule is None:
                return None
            self._record(rule, method=method, path=path, cluster=cluster, status=rule.status,
                         code=rule.code, drop=rule.drop or None, delay_s=rule.delay_s or None)
            return self._hit(rule, target)

    @staticmethod
    def _hit(rule: FaultRule, target: str) -> FaultHit:
        status = rule.status or 0
        code, message = _DEFAULT_CODES.get(status, ("InjectedFault", "A fault was injected."))
        code = rule.code or code
        message = rule.message or message
        headers: dict[str, str] = {}
        if rule.retry_after is not None:
            # ARM and the API server send whole seconds (the SDKs parse an int)
            headers["Retry-After"] = str(math.ceil(rule.retry_after))
        if target == "kube":
            payload: dict[str, Any] = {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": _KUBE_REASONS.get(status, code), "code": status,
            }
            if rule.retry_after is not None:
                payload["details"] = {"retryAfterSeconds": max(1, round(rule.retry_after))}
        else:
            payload = {"error": {"code": code, "message": message}}
        hit = FaultHit(status=status, body=json.dumps(payload).encode(),
                       headers={"Content-Type": "application/json", **headers}, delay_s=rule.delay_s, drop=rule.drop)
        hit.rule = rule
        hit.code = code
        hit.message = message
        return hit

    def delivery_effects(self, *, subscriber: str, event_type: str, batch: bool = False) -> FaultRule | None:
        """The eventgrid-delivery rule for an event's first delivery (duplicate/delay), or with
        ``batch=True`` for a batch whose first event has ``event_type`` (reorder); recorded."""

        def want(rule: FaultRule) -> bool:
            return rule.reorder if batch else (rule.duplicate or rule.delay_s > 0)

        with self._lock:
            rule = self._candidates("eventgrid-delivery", method=None, subject=event_type, cluster=None,
                                    subscriber=subscriber, want=want)
            if rule is not None:
                self._record(rule, subscriber=subscriber, event_type=event_type, duplicate=rule.duplicate or None,
                             reorder=rule.reorder or None, delay_s=rule.delay_s or None)
            return rule

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.describe() for r in self.rules]


def apply_delay(hit: FaultHit | None, response: Response) -> Response:
    """A delay-only hit slows the normal ``response``; any other hit replaces it."""
    if hit is None:
        return response
    if not hit.replaces_answer:
        response.delay_s += hit.delay_s
        return response
    return hit

"""Fault rules fire where, when and as often as they say, reproducibly, and are recorded."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sim.core.faults import FaultEngine, FaultRuleError, apply_delay
from sim.core.http import Response


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def now(self) -> float:
        return self.t


def engine(*rules: dict[str, Any], seed: int = 1) -> tuple[FaultEngine, Clock]:
    clock = Clock()
    return FaultEngine(list(rules), clock=clock, rng=random.Random(seed)), clock


@pytest.mark.parametrize("rule", [
    pytest.param({"target": "dns", "status": 500}, id="unknown-target"),
    pytest.param({"target": "arm", "status": 500, "colour": "red"}, id="unknown-field"),
    pytest.param({"target": "arm", "status": 500, "path": "("}, id="bad-regex"),
    pytest.param({"target": "arm"}, id="http-rule-without-effect"),
    pytest.param({"target": "arm", "status": 500, "probability": 1.5}, id="probability-above-one"),
    pytest.param({"target": "arm", "status": 42}, id="not-a-status"),
    pytest.param({"target": "eventgrid-delivery"}, id="delivery-rule-without-effect"),
    pytest.param("not a mapping", id="not-an-object"),
])
def test_a_bad_rule_is_refused_with_a_reason(rule: Any) -> None:
    faults, _ = engine()
    with pytest.raises(FaultRuleError):
        faults.add(rule)


def test_a_rule_matches_only_its_target_method_path_and_cluster() -> None:
    faults, _ = engine({"target": "arm", "method": "PUT", "path": r"/agentPools/gpu\d$", "cluster": "c1", "status": 500})
    assert faults.match(target="kube", method="PUT", path="/agentPools/gpu1", cluster="c1") is None
    assert faults.match(target="arm", method="GET", path="/agentPools/gpu1", cluster="c1") is None
    assert faults.match(target="arm", method="PUT", path="/agentPools/sys", cluster="c1") is None
    assert faults.match(target="arm", method="PUT", path="/agentPools/gpu1", cluster="c2") is None
    hit = faults.match(target="arm", method="PUT", path="/agentPools/gpu1", cluster="C1")
    assert hit is not None and hit.status == 500


def test_a_counted_rule_stops_firing_and_every_firing_is_recorded() -> None:
    faults, _ = engine({"target": "arm", "status": 429, "retry_after": 2, "count": 2})
    hits = [faults.match(target="arm", method="GET", path="/x") for _ in range(4)]
    assert [bool(h) for h in hits] == [True, True, False, False]
    assert [f["status"] for f in faults.fired] == [429, 429]
    assert hits[0] is not None and hits[0].headers["Retry-After"] == "2"


def test_a_rule_is_active_only_inside_its_time_window() -> None:
    faults, clock = engine({"target": "arm", "status": 503, "after_s": 10, "until_s": 20})
    seen = []
    for t in (5, 10, 15, 20, 25):
        clock.t = 1_000.0 + t
        seen.append(bool(faults.match(target="arm", method="GET", path="/x")))
    assert seen == [False, True, True, False, False]


def test_a_rule_added_at_run_time_counts_its_window_from_when_it_was_added() -> None:
    faults, clock = engine()
    clock.t += 500
    faults.add({"target": "arm", "status": 503, "until_s": 5})
    assert faults.match(target="arm", method="GET", path="/x")
    clock.t += 6
    assert not faults.match(target="arm", method="GET", path="/x")


def test_probabilistic_rules_fire_the_same_way_for_the_same_seed() -> None:
    def pattern(seed: int) -> list[bool]:
        faults, _ = engine({"target": "arm", "status": 500, "probability": 0.5}, seed=seed)
        return [bool(faults.match(target="arm", method="GET", path="/x")) for _ in range(40)]

    assert pattern(3) == pattern(3)
    assert pattern(3) != pattern(4)
    assert 5 < sum(pattern(3)) < 35


def test_a_kube_fault_answers_with_a_kubernetes_status_object() -> None:
    faults, _ = engine({"target": "kube", "status": 429, "retry_after": 1})
    hit = faults.match(target="kube", method="POST", path="/api/v1/namespaces/a/pods/b/eviction", cluster="c1")
    assert hit is not None
    payload = json.loads(hit.body)
    assert (payload["kind"], payload["code"], payload["reason"]) == ("Status", 429, "TooManyRequests")
    assert payload["details"]["retryAfterSeconds"] == 1


def test_an_arm_fault_answers_with_the_arm_error_shape_and_its_own_code() -> None:
    faults, _ = engine({"target": "arm", "status": 400, "code": "QuotaExceeded", "message": "no cores left"})
    hit = faults.match(target="arm", method="PUT", path="/x")
    assert hit is not None
    assert json.loads(hit.body) == {"error": {"code": "QuotaExceeded", "message": "no cores left"}}


def test_a_delay_only_fault_is_falsy_and_slows_the_normal_answer() -> None:
    faults, _ = engine({"target": "arm", "delay_s": 1.5})
    hit = faults.match(target="arm", method="GET", path="/x")
    assert hit is not None and not hit
    slowed = apply_delay(hit, Response.json(200, {"ok": True}))
    assert (slowed.status, slowed.delay_s) == (200, 1.5)


def test_a_dropping_fault_replaces_the_answer() -> None:
    faults, _ = engine({"target": "eventgrid", "drop": True})
    hit = faults.match(target="eventgrid", method="POST", path="/eventgrid/api/events")
    assert hit and hit.drop
    assert apply_delay(hit, Response(status=200)) is hit


def test_an_lro_rule_carries_the_error_the_operation_ends_with() -> None:
    faults, _ = engine({"target": "lro", "code": "AllocationFailed", "count": 1}, {"target": "lro", "path": "restart"})
    first = faults.match(target="lro", method="PUT", path="/agentPools/gpu")
    second = faults.match(target="lro", method="POST", path="/virtualMachines/0/restart")
    assert first is not None and first.code == "AllocationFailed"
    assert second is not None and second.code == "InternalOperationError"


def test_delivery_rules_apply_to_first_deliveries_or_to_batches_as_they_say() -> None:
    faults, _ = engine({"target": "eventgrid-delivery", "duplicate": True, "path": "^Steward\\."},
                       {"target": "eventgrid-delivery", "reorder": True, "subscriber": "remediation"})
    assert faults.delivery_effects(subscriber="x", event_type="Other.Thing") is None
    dup = faults.delivery_effects(subscriber="x", event_type="Steward.GpuNode.Unhealthy")
    assert dup is not None and dup.duplicate
    assert faults.delivery_effects(subscriber="x", event_type="Steward.A", batch=True) is None
    reorder = faults.delivery_effects(subscriber="remediation", event_type="Steward.A", batch=True)
    assert reorder is not None and reorder.reorder

"""Pool requests on a bad day: poison messages, a crashed host, throttling and 5xx from ARM.

Same stack shape as test_pool_requests_e2e.py (Azurite, simulator, ``python -m devhost run``
processes), but the tests here run one at a time, because each measures the simulator's request
counts over its own window and some kill the host. Faults are injected through the simulator's
fault API and scoped to one pool or one cluster, so the rest of the fleet behaves normally. The
other timers (health sweep, migration planner) are parked: they are not under test here and would
blur the request counts.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

from shared.kernel.ports import Record
from shared.kernel.retry import DEFAULT_ATTEMPTS
from tests.e2e.conftest import GET_POOL, PUT_POOL, Fleet, assert_no_disruption
from tests.waiting import wait_until

T4 = "Standard_NC4as_T4_v3"
NEVER = "0 0 0 1 1 *"  # once a year, at midnight on the first of January
# Polls longer than the reconciler's hold (5 s) release the record between looks, so the crash test
# can kill the host "between steps" while the pool is being created.
E2E_SETTINGS = {"SWEEP_SCHEDULE": NEVER, "MIGRATION_SCHEDULE": NEVER, "POOL_REQUEST_POLL_INTERVAL_S": "6"}
POLL_INTERVAL_S = float(E2E_SETTINGS["POOL_REQUEST_POLL_INTERVAL_S"])
HOST_JSON = Path(__file__).resolve().parents[2] / "host.json"
MAX_DEQUEUE_COUNT = int(json.loads(HOST_JSON.read_text())["extensions"]["queues"]["maxDequeueCount"])


def _window_counts(fleet: Fleet, before: dict[str, int]) -> dict[str, int]:
    after = fleet.requests()
    return {route: after[route] - before.get(route, 0) for route in after if after[route] != before.get(route, 0)}


def _assert_no_retry_storm(counts: dict[str, int], *, elapsed_s: float, faults_fired: int) -> None:
    """Each ARM and Kubernetes route was called at most about once per poll interval, plus once per
    injected fault (the host's own polling of the Event Grid feed is not the app's and not counted)."""
    allowance = faults_fired + elapsed_s / POLL_INTERVAL_S + 5
    app_routes = {route: n for route, n in counts.items() if route.split(" ", 1)[1].startswith(("/subscriptions", "/k8s"))}
    assert app_routes, "no ARM or Kubernetes request was counted"
    storms = {route: n for route, n in app_routes.items() if n > allowance}
    assert storms == {}, f"more than {allowance:.0f} requests in {elapsed_s:.0f}s: {storms}"


def test_a_message_that_fails_transiently_every_time_lands_in_the_poison_queue_after_max_dequeue_count(
        fleet: Fleet) -> None:
    rules = fleet.faults([{"target": "arm", "cluster": "e2e-flaky", "status": 503}])  # ARM down for this cluster
    message = json.dumps(fleet.request(request_id="e2e-poison", pool="gpupoison", cluster="e2e-flaky",
                                       vmSize=T4, count=1))
    fleet.submit(message)

    wait_until(fleet.poison, timeout=90, interval=0.5, what="the message to land in the poison queue",
               detail=fleet.host_log_tail)
    assert fleet.poison() == [message], fleet.host_log_tail()
    assert fleet.drained() == 0
    assert fleet.failed_invocations(fleet.pool_request_function) == MAX_DEQUEUE_COUNT
    assert "Moving message to queue 'gpu-pool-requests-poison'. Last error: " in fleet.host_logs()
    assert fleet.record("e2e-poison") is None  # never accepted: it is in the poison queue, not half-done
    assert fleet.events("e2e-poison") == []

    tries = [f for f in fleet.fired(rules) if f.get("method") == "GET"]
    assert MAX_DEQUEUE_COUNT <= len(tries) <= MAX_DEQUEUE_COUNT * DEFAULT_ATTEMPTS, len(tries)
    fleet.stack.control("DELETE", "/faults")


def test_a_host_killed_after_the_pool_was_requested_is_resumed_by_a_new_host_without_a_second_put(
        fleet: Fleet) -> None:
    fleet.quiesce()
    before = fleet.requests()
    fleet.submit(fleet.request(request_id="e2e-crash", pool="gpucrash", vmSize=T4, count=1, validateWorkload=True))

    # Between steps (lease released), as the pool is being created: the host dies without warning.
    def between_steps() -> Record | None:
        found = fleet.record("e2e-crash")
        return found if found is not None and found.state == "creating" and found.lease_until == 0.0 else None

    record = wait_until(between_steps, timeout=30, interval=0.02, what="e2e-crash to rest between steps while creating",
                        detail=lambda: fleet.describe(fleet.record("e2e-crash")))
    assert record is not None and record.state == "creating", fleet.describe(record)
    [host] = fleet.stack.hosts
    fleet.stack.stop_host(host, crash=True)
    assert host.returncode == -9
    assert fleet.record("e2e-crash").state == "creating"  # type: ignore[union-attr]

    fleet.stack.start_host("host-2")
    record = fleet.outcome("e2e-crash", timeout=60)
    assert record.state == "succeeded", fleet.describe(record)
    assert record.owner == "host-2"
    assert record.data["outcome"]["sample_job"] == "succeeded"
    states = [h["state"] for h in record.history]
    assert states == ["accepted", "creating", "validating", "testing", "succeeded"], states
    assert _window_counts(fleet, before).get(PUT_POOL) == 1  # followed, never PUT again


def test_arm_throttling_with_retry_after_is_retried_after_the_hinted_wait_without_a_retry_storm(
        fleet: Fleet) -> None:
    fleet.quiesce()
    before, started = fleet.requests(), time.monotonic()
    rules = fleet.faults([
        {"target": "arm", "method": "GET", "path": "/agentPools/gputhrot", "status": 429, "retry_after": 1, "count": 3},
        {"target": "arm", "method": "PUT", "path": "/agentPools/gputhrot", "status": 429, "retry_after": 2, "count": 1},
    ])
    fleet.submit(fleet.request(request_id="e2e-throttled", pool="gputhrot", vmSize=T4, count=1))

    record = fleet.outcome("e2e-throttled", timeout=60)
    assert record.state == "succeeded", fleet.describe(record)
    fired = fleet.fired(rules)
    assert [f["status"] for f in fired].count(429) == 4  # every injected throttle was met...
    gets = [f["at"] for f in fired if f["method"] == "GET"]
    assert all(b - a >= 0.95 for a, b in itertools.pairwise(gets)), gets  # ...and its Retry-After waited out
    counts = _window_counts(fleet, before)
    assert counts[PUT_POOL] == 2  # the throttled PUT and the accepted one
    _assert_no_retry_storm(counts, elapsed_s=time.monotonic() - started, faults_fired=len(fired))


def test_arm_and_kubernetes_5xx_answers_are_retried_and_the_request_succeeds_without_a_retry_storm(
        fleet: Fleet) -> None:
    fleet.quiesce()
    before, started = fleet.requests(), time.monotonic()
    rules = fleet.faults([
        {"target": "arm", "method": "PUT", "path": "/agentPools/gpufive", "status": 503, "count": 2},
        {"target": "arm", "method": "GET", "path": "/agentPools/gpufive", "status": 500, "count": 2},
        {"target": "kube", "cluster": "e2e-pools", "method": "GET", "path": "/api/v1/nodes", "status": 503,
         "count": 2},
    ])
    fleet.submit(fleet.request(request_id="e2e-five", pool="gpufive", vmSize=T4, count=1))

    record = fleet.outcome("e2e-five", timeout=60)
    assert record.state == "succeeded", fleet.describe(record)
    fired = fleet.fired(rules)
    assert sorted(f["status"] for f in fired) == [500, 500, 503, 503, 503, 503]
    counts = _window_counts(fleet, before)
    assert counts[PUT_POOL] == 3  # two refused with 503, then accepted
    assert counts[GET_POOL] >= 3
    _assert_no_retry_storm(counts, elapsed_s=time.monotonic() - started, faults_fired=len(fired))


def test_no_pod_was_disrupted_by_any_of_this(fleet: Fleet) -> None:
    oracles: dict[str, Any] = fleet.oracles()
    assert_no_disruption(oracles)

"""Breaker tables: it opens on a storm of GPU nodes turning unhealthy, and only a reset closes it."""

from __future__ import annotations

import pytest

from shared.remediation import breaker
from shared.remediation.policy import RemediationPolicy
from tests.unit.fakes_remediation import Fleet

NOW = 1_764_684_000.0
POLICY = RemediationPolicy()


def obs(n: int, *, at: float = NOW - 60, prefix: str = "n") -> dict[str, float]:
    return {f"{prefix}{i}": at for i in range(n)}


CASES = [
    ("10 of 20 nodes at once opens it", obs(10), 20, breaker.OPEN),
    ("6 of 20 nodes (exactly 30 percent) keeps it closed", obs(6), 20, breaker.CLOSED),
    ("7 of 20 nodes (35 percent) opens it", obs(7), 20, breaker.OPEN),
    ("2 of 3 nodes is below the minimum count and keeps it closed", obs(2), 3, breaker.CLOSED),
    ("nodes that turned unhealthy before the window do not count", obs(10, at=NOW - 3600), 20, breaker.CLOSED),
    ("one node in a big fleet keeps it closed", obs(1), 1000, breaker.CLOSED),
]


@pytest.mark.parametrize(("observations", "fleet", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(observations: dict[str, float], fleet: int, expected: str) -> None:
    state = breaker.decide(breaker.BreakerState(), observations, fleet_nodes=fleet, policy=POLICY, now=NOW)
    assert state.state == expected


def test_an_absolute_node_count_opens_it_in_a_large_fleet() -> None:
    policy = RemediationPolicy(breaker_max_nodes=5)
    assert breaker.decide(breaker.BreakerState(), obs(5), fleet_nodes=10000, policy=policy, now=NOW).is_open


def test_the_window_accumulates_across_sweeps_and_counts_each_node_once() -> None:
    state = breaker.decide(breaker.BreakerState(), obs(3), fleet_nodes=20, policy=POLICY, now=NOW)
    state = breaker.decide(state, obs(3), fleet_nodes=20, policy=POLICY, now=NOW + 60)
    assert not state.is_open and len(state.window) == 3
    state = breaker.decide(state, obs(4, prefix="m"), fleet_nodes=20, policy=POLICY, now=NOW + 120)
    assert state.is_open


def test_it_stays_open_when_the_storm_passes() -> None:
    state = breaker.decide(breaker.BreakerState(), obs(10), fleet_nodes=20, policy=POLICY, now=NOW)
    assert breaker.decide(state, {}, fleet_nodes=20, policy=POLICY, now=NOW + 86400).is_open


def test_a_disabled_breaker_never_opens() -> None:
    policy = RemediationPolicy(breaker_enabled=False)
    assert not breaker.decide(breaker.BreakerState(), obs(20), fleet_nodes=20, policy=policy, now=NOW).is_open


def test_nodes_unhealthy_since_before_a_reset_do_not_reopen_it() -> None:
    reset = breaker.BreakerState(reset_at=NOW)
    assert not breaker.decide(reset, obs(10, at=NOW - 30), fleet_nodes=20, policy=POLICY, now=NOW + 10).is_open


def test_update_persists_opens_once_and_reset_closes_and_marks_the_backlog_stale() -> None:
    fleet = Fleet()
    ctx = fleet.ctx()
    assert breaker.update(ctx, observations=obs(10), fleet_nodes=20, policy=POLICY).is_open
    breaker.update(ctx, observations=obs(12), fleet_nodes=20, policy=POLICY)
    assert fleet.events.types().count(breaker.OPENED_EVENT) == 1
    assert breaker.current(ctx).is_open
    fleet.clock.advance(600)
    state = breaker.reset(ctx, by="alice")
    assert not state.is_open and breaker.current(ctx).reset_by == "alice"
    assert fleet.events.types()[-1] == breaker.RESET_EVENT
    assert breaker.is_stale(fleet.clock.now() - 1, breaker.current(ctx))
    assert not breaker.is_stale(fleet.clock.now() + 1, breaker.current(ctx))

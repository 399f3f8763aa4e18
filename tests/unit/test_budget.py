"""Budget tables, after Cluster API's TestIsAllowedRemediation: the stricter limit always wins."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.remediation import budget
from shared.remediation.policy import RemediationPolicy

NOW = 1_764_684_000.0

MAX_UNAVAILABLE = [
    ("20 percent of 20 nodes is 4 but the count of 1 is stricter", 20, 1, 20, 1),
    ("20 percent of 20 nodes is 4 when the count allows 10", 20, 10, 20, 4),
    ("20 percent of 7 nodes rounds down to 1", 7, 10, 20, 1),
    ("20 percent of 3 nodes rounds down to 0 but at least 1 is allowed", 3, 10, 20, 1),
    ("50 percent of 9 nodes rounds down to 4", 9, 10, 50, 4),
    ("a count of 0 stops everything", 20, 0, 20, 0),
    ("a percentage of 0 stops everything", 20, 5, 0, 0),
    ("100 percent leaves only the count", 20, 3, 100, 3),
    ("never more than the pool itself", 2, 10, 100, 2),
    ("an empty pool allows nothing", 0, 1, 20, 0),
]


@pytest.mark.parametrize(("size", "count", "percent", "expected"), [c[1:] for c in MAX_UNAVAILABLE],
                         ids=[c[0] for c in MAX_UNAVAILABLE])
def test_max_unavailable(size: int, count: int, percent: int, expected: int) -> None:
    assert budget.max_unavailable(size, count=count, percent=percent) == expected


POOL = [
    ("one candidate in a healthy pool is allowed", set(), "n1", True),
    ("a second node while one is under remediation is refused", {"n0"}, "n1", False),
    ("a node already cordoned or NotReady counts as unavailable", {"n5"}, "n1", False),
    ("the candidate itself already unavailable does not count twice", {"n1"}, "n1", True),
]


@pytest.mark.parametrize(("unavailable", "candidate", "allowed"), [c[1:] for c in POOL], ids=[c[0] for c in POOL])
def test_pool_admission_counts_every_unavailable_node(unavailable: set[str], candidate: str, allowed: bool) -> None:
    result = budget.pool_admission(pool="gpu", pool_size=20, unavailable=unavailable, candidate=candidate,
                                   policy=RemediationPolicy())
    assert result.allowed is allowed
    assert result.code == ("" if allowed else budget.POOL_BUDGET)


@pytest.mark.parametrize(("in_flight", "allowed"), [(0, True), (4, True), (5, False), (9, False)],
                         ids=["none in flight", "one slot left", "at the cap", "over the cap"])
def test_fleet_admission_caps_remediations_in_flight(in_flight: int, allowed: bool) -> None:
    assert budget.fleet_admission(in_flight=in_flight, policy=RemediationPolicy(max_in_flight=5)).allowed is allowed


NODE = [
    ("a node never remediated is allowed", [], None, True, ""),
    ("a node remediated 10 minutes ago is cooling down", [NOW - 1800], NOW - 600, False, budget.COOLDOWN),
    ("a node remediated 2 hours ago is allowed again", [NOW - 8000], NOW - 7200, True, ""),
    ("three attempts in a day hit the cap", [NOW - 80000, NOW - 40000, NOW - 9000], NOW - 8000, False, budget.ATTEMPTS),
    ("attempts older than the window do not count", [NOW - 90000, NOW - 88000, NOW - 9000], NOW - 8000, True, ""),
]


@pytest.mark.parametrize(("attempts", "finished", "allowed", "code"), [c[1:] for c in NODE], ids=[c[0] for c in NODE])
def test_node_admission_applies_cooldown_and_attempt_cap(attempts, finished, allowed, code) -> None:
    result = budget.node_admission(attempts=attempts, last_finished_at=finished, now=NOW, policy=RemediationPolicy())
    assert (result.allowed, result.code) == (allowed, code)


def test_the_first_refusal_in_the_chain_wins() -> None:
    ok = budget.Admission.ok()
    pool_no = budget.Admission.refuse(budget.POOL_BUDGET, "pool full")
    assert budget.admit(paused="paused", breaker_open=True, node=ok, pool=pool_no, fleet=ok).code == budget.PAUSED
    assert budget.admit(paused=None, breaker_open=True, node=ok, pool=pool_no, fleet=ok).code == budget.BREAKER
    assert budget.admit(paused=None, breaker_open=False, node=ok, pool=pool_no, fleet=ok).code == budget.POOL_BUDGET
    assert budget.admit(paused=None, breaker_open=False, node=ok, pool=ok, fleet=ok).allowed


@given(size=st.integers(0, 1000), count=st.integers(0, 50), percent=st.integers(0, 100))
def test_max_unavailable_never_exceeds_either_limit_nor_the_pool(size: int, count: int, percent: int) -> None:
    limit = budget.max_unavailable(size, count=count, percent=percent)
    assert 0 <= limit <= min(count, size)
    if size and count and percent:
        assert limit >= 1
        assert limit <= max(1, size * percent // 100)

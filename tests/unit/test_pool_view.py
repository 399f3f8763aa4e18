"""A surge node stands in for the broken node it replaces: it neither raises the pool's budget nor hides that
the broken node is still out (shared.remediation.pool_view; soak seed 931382).

Seed 931382: soak1/gpu1 had three nodes and BUDGET_POOL_MAX_UNAVAILABLE=2 at 50 %, one node. Remediation of
vmss000000 escalated to replace and surged the pool to four; with four nodes listed the budget read two, and
vmss000001 was admitted while vmss000000 was still cordoned: two of the team's three nodes out at once.
"""

from __future__ import annotations

from shared.kernel import reconciler
from shared.remediation import steps as remediation
from shared.remediation.admission import Handling, handle_event
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import KIND
from tests.unit.fakes_remediation import Fleet, unhealthy_event


def _surging() -> tuple[Fleet, list[str]]:
    """A pool of three whose node 0 is being replaced by a surge: the pool has four nodes, node 0 cordoned."""
    fleet = Fleet(policy=RemediationPolicy(ladder=("replace",), pool_max_unavailable=2, pool_max_unavailable_percent=50))
    names = fleet.pool(3, unhealthy=[0])
    assert handle_event(unhealthy_event(names[0], fleet=fleet), fleet.ctx()).outcome is Handling.ADMITTED
    ctx = fleet.ctx()
    for _ in range(200):
        reconciler.reconcile_once(ctx, modules={"remediation": remediation})  # type: ignore[dict-item]
        if len(fleet.kube.nodes) == 4 and fleet.kube.nodes[names[0]].unschedulable:
            break
        [record] = fleet.ledger.list(KIND)
        fleet.clock.advance(max(1.0, record.next_at - fleet.clock.now()))
    assert len(fleet.kube.nodes) == 4 and fleet.kube.nodes[names[0]].unschedulable, "the surge node joined"
    return fleet, names


def test_a_neighbour_is_refused_while_a_surge_replaces_the_broken_node_of_a_small_pool() -> None:
    fleet, names = _surging()
    fleet.break_node(names[1], at=fleet.clock.now() - 600)
    handled = handle_event(unhealthy_event(names[1], fleet=fleet), fleet.ctx())
    assert handled.outcome is Handling.REFUSED and handled.code == "budget-pool", handled.detail
    assert "of 3 nodes" in handled.detail, "the surge node is not counted as the team's capacity"


def test_once_the_broken_node_is_gone_the_pool_is_counted_as_it_is() -> None:
    from tests.unit.fakes_remediation import run_until_settled

    fleet, names = _surging()
    assert run_until_settled(fleet) == ["done"]
    fleet.clock.advance(7200)
    fleet.break_node(names[1], at=fleet.clock.now() - 600)
    assert handle_event(unhealthy_event(names[1], fleet=fleet), fleet.ctx()).outcome is Handling.ADMITTED

"""Rows written straight into the ledger at a node's next attempt ids (``<node key>-<n>``) are not admission's
attempts: they never hide the remediation in progress on the node, never use up its attempts, never make a
genuine fault look handled. A genuine row whose admission died before noting it is still counted, by its
creation slot while it runs and by its own first step's note (soak seed 965691: a forged row adopted as the
node's last attempt let a second remediation be admitted while the first was draining)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.ports import Record
from shared.remediation import admission
from shared.remediation import steps as remediation_steps
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, RemediationPolicy
from shared.remediation.records import (
    KIND,
    NODE_KIND,
    NodeData,
    RemediationData,
    Rung,
    State,
    decode,
    fault_id,
    node_key,
    to_data,
)
from tests.unit.fakes_remediation import CLUSTER, T0, Fleet, unhealthy_event, vm_id

NODE = "aks-gpu-1"
NK = node_key(CLUSTER, NODE)


def _fleet(**policy: Any) -> Fleet:
    fleet = Fleet(policy=RemediationPolicy(ladder=("restart",), cooldown_s=0, **policy))
    fleet.pool(4, unhealthy=[1])
    return fleet


def _forge(fleet: Fleet, n: int, *, state: str = State.BLOCKED, fault: str = "f" * 40) -> Record:
    """A self-consistent row at attempt ``n`` of the node, as someone with table write would write it."""
    node = fleet.kube.nodes[NODE]
    data = RemediationData(cluster=CLUSTER, node=NODE, node_uid=node.uid, pool="gpu",
                           pool_selector="kubernetes.azure.com/agentpool=gpu", provider_id=node.provider_id,
                           arm_vm_id=vm_id(NODE), condition=DEVICE_PLUGIN, since="2025-12-02T13:00:00Z",
                           since_ts=T0 - 3600, fault=fault, attempt=n, ladder=[Rung.RESTART], admitted_at=T0 - 60)
    return fleet.ledger.create(Record(kind=KIND, id=f"{NK}-{n}", state=state, data=to_data(data),
                                      created_at=T0 - 60, updated_at=T0 - 60, next_at=T0 + 3600))


def _node_row(fleet: Fleet) -> NodeData:
    rec = fleet.ledger.get(NODE_KIND, NK)
    assert rec is not None
    return decode(rec.data, NodeData)


def _forget_the_note(fleet: Fleet) -> None:
    rec = fleet.ledger.get(NODE_KIND, NK)
    assert rec is not None
    fleet.ledger.delete(rec)


def _active(fleet: Fleet) -> list[str]:
    return sorted(r.id for r in fleet.ledger.list(KIND) if r.state in (State.ADMITTED, State.CORDONED,
                                                                         State.DRAINING, State.REPAIRING,
                                                                         State.VERIFYING))


def test_a_forged_row_at_the_next_id_does_not_hide_the_remediation_in_progress() -> None:
    fleet = _fleet()
    assert fleet.handle(unhealthy_event(NODE, fleet=fleet)) == f"admitted: {NK}-1"
    _forge(fleet, 2)  # ended (blocked), another fault: adopting it made it the node's "last attempt"
    fleet.break_node(NODE, condition=DCGM, at=T0 - 1800)
    handled = admission.handle_event(unhealthy_event(NODE, fleet=fleet, condition=DCGM), fleet.ctx())
    assert handled.outcome == admission.Handling.DUPLICATE and handled.code == admission.NODE_BUSY, handled.detail
    assert f"{NK}-1 is in progress" in handled.detail
    assert fleet.ledger.get(KIND, f"{NK}-3") is None


def test_forged_rows_at_the_next_ids_use_up_none_of_the_nodes_attempts() -> None:
    fleet = _fleet(max_attempts=2)
    _forge(fleet, 1)
    _forge(fleet, 2, fault="e" * 40)
    assert fleet.handle(unhealthy_event(NODE, fleet=fleet)) == f"admitted: {NK}-3"
    assert [a.id for a in _node_row(fleet).attempts] == [f"{NK}-3"]
    rec = fleet.ledger.get(KIND, f"{NK}-3")
    assert rec is not None and not rec.data.get("cap_reached") and rec.data["ladder"] == [Rung.RESTART]


def test_a_forged_row_naming_the_coming_fault_does_not_make_it_handled() -> None:
    fleet = _fleet()
    cond = fleet.kube.nodes[NODE].condition(DEVICE_PLUGIN)
    assert cond is not None and cond.last_transition is not None
    since = cond.last_transition
    _forge(fleet, 1, fault=fault_id(CLUSTER, NODE, DEVICE_PLUGIN, since))
    assert fleet.handle(unhealthy_event(NODE, fleet=fleet)) == f"admitted: {NK}-2"
    assert _active(fleet) == [f"{NK}-2"]


def test_a_forged_active_row_at_the_next_id_does_not_keep_the_node_from_its_repair() -> None:
    fleet = _fleet()
    _forge(fleet, 1, state=State.DRAINING)  # its own steps block it; it never took admission's slot
    assert fleet.handle(unhealthy_event(NODE, fleet=fleet)) == f"admitted: {NK}-2"


def test_an_admission_whose_host_died_before_noting_it_still_holds_the_node_and_its_step_notes_it() -> None:
    fleet = _fleet()
    assert fleet.handle(unhealthy_event(NODE, fleet=fleet)) == f"admitted: {NK}-1"
    _forget_the_note(fleet)  # the note was the write the host died before
    fleet.break_node(NODE, condition=DCGM, at=T0 - 1800)
    handled = admission.handle_event(unhealthy_event(NODE, fleet=fleet, condition=DCGM), fleet.ctx())
    assert handled.code == admission.NODE_BUSY, handled.detail  # its creation slot proves it admission's
    _forget_the_note(fleet)
    rec = fleet.ledger.get(KIND, f"{NK}-1")
    assert rec is not None
    remediation_steps.advance(rec, fleet.ctx())
    assert [a.id for a in _node_row(fleet).attempts] == [f"{NK}-1"]  # noted by its first step, before any slot goes


def test_a_row_that_never_had_admissions_slot_is_not_noted_by_its_step() -> None:
    fleet = _fleet()
    forged = _forge(fleet, 1, state=State.ADMITTED)
    remediation_steps.advance(forged, fleet.ctx())
    assert fleet.ledger.get(NODE_KIND, NK) is None or _node_row(fleet).attempts == []


def test_a_forged_done_restart_does_not_send_a_dcgm_fault_straight_to_replace() -> None:
    from tests.unit.test_dcgm import DcgmFleet

    fleet = DcgmFleet()
    node = fleet.nodes[0]
    kube_node = fleet.kube.nodes[node]
    data = RemediationData(cluster=CLUSTER, node=node, node_uid=kube_node.uid, pool=kube_node.pool,
                           provider_id=kube_node.provider_id, arm_vm_id=vm_id(node), condition="Xid79",
                           since_ts=fleet.clock.now() - 600, fault="f" * 40, attempt=1, signal="dcgm",
                           ladder=[Rung.RESTART, Rung.REPLACE], rung_index=0)
    now = fleet.clock.now()
    fleet.ledger.create(Record(kind=KIND, id=f"{node_key(CLUSTER, node)}-1", state=State.DONE, data=to_data(data),
                               created_at=now - 300, updated_at=now - 200))  # "a restart that repaired it"
    fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    fleet.sweep_twice()
    handled = admission.handle_event(fleet.unhealthy()[0], fleet.ctx())
    assert handled.outcome == admission.Handling.ADMITTED, handled.detail
    [admitted] = [r for r in fleet.ledger.list(KIND) if r.state == State.ADMITTED]
    assert admitted.data["ladder"] == [Rung.RESTART, Rung.REPLACE]  # the first restart, not a repeat's replace


def test_an_admission_that_died_after_taking_its_slot_and_before_its_row_is_admitted_again_at_once() -> None:
    fleet = _fleet()
    event = unhealthy_event(NODE, fleet=fleet)
    real_create = fleet.ledger.create

    def dies_at_the_row(record: Record) -> Record:
        if record.kind == KIND:
            raise RuntimeError("the host died")
        return real_create(record)

    fleet.ledger.create = dies_at_the_row  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        fleet.handle(event)
    fleet.ledger.create = real_create  # type: ignore[method-assign]
    assert fleet.ledger.get(KIND, f"{NK}-1") is None  # its slot is held, its row never written
    assert fleet.handle(event) == f"admitted: {NK}-1"  # Event Grid's redelivery, seconds later

"""A remediation row written straight into the ledger (by anyone with table write) disrupts nothing: in
every state it claims, the step proves its preconditions from the world (this record's own cordon marker
on the Node, the node drained, its identity known and unchanged, a live budget slot, the fault present
now: shared.remediation.preconditions, shared.remediation.fault_source) and a row the world does not bear
out ends ``blocked`` with the reason, a Blocked event, and nothing touched."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.kernel.ports import Record
from shared.remediation import preconditions
from shared.remediation import steps as remediation_steps
from shared.remediation.policy import DEVICE_PLUGIN, RemediationPolicy
from shared.remediation.records import (
    KIND,
    TURN_PREFIX,
    RemediationData,
    ReplaceData,
    ReplaceMode,
    Rung,
    RungPhase,
    State,
    node_key,
    to_data,
)
from tests.unit.fakes_remediation import CLUSTER, T0, Fleet, make_pod, run_until_settled, unhealthy_event, vm_id

NODE = "aks-gpu-1"
REPAIRING = State.REPAIRING


def _fleet(*, broken: bool = False, policy: RemediationPolicy | None = None) -> Fleet:
    fleet = Fleet(policy=policy or RemediationPolicy(ladder=("restart", "reimage", "replace"), cooldown_s=0))
    fleet.pool(3, unhealthy=[1] if broken else [])
    fleet.kube.add_pods(make_pod("web-1", NODE), make_pod("dcgm", NODE, owner="DaemonSet"))
    return fleet


def _forged(fleet: Fleet, state: str, *, rung_index: int = 0, phase: str = RungPhase.START, rid: str = "",
            **overrides: Any) -> Record:
    node = fleet.kube.nodes[NODE]
    fields: dict[str, Any] = dict(
        cluster=CLUSTER, node=NODE, node_uid=node.uid, pool="gpu", pool_selector="kubernetes.azure.com/agentpool=gpu",
        provider_id=node.provider_id, arm_vm_id=vm_id(NODE), condition=DEVICE_PLUGIN, since="2025-12-02T13:00:00Z",
        since_ts=T0 - 3600, fault="f" * 40, attempt=1, ladder=[Rung.RESTART, Rung.REIMAGE, Rung.REPLACE],
        rung_index=rung_index, rung_phase=RungPhase(phase), cordoned_by_us=True, drain={}, admitted_at=T0 - 60)
    data = RemediationData(**{**fields, **overrides})
    rec = Record(kind=KIND, id=rid or f"{node_key(CLUSTER, NODE)}-7", state=state, data=to_data(data),
                 created_at=T0 - 60, updated_at=T0 - 60, next_at=T0 - 1)
    return fleet.ledger.create(rec)


def _untouched(fleet: Fleet, pods_before: set[str]) -> None:
    node = fleet.kube.nodes[NODE]
    assert fleet.compute.writes == [], fleet.compute.writes  # no restart, no reimage
    assert not node.unschedulable  # never cordoned
    assert {p.name for p in fleet.kube.list_pods(node_name=NODE)} == pods_before  # nothing evicted
    assert NODE in fleet.kube.nodes and fleet.count() == 3  # no machine deleted, no pool resized


FORGED_STATES = {
    "admitted": dict(state=State.ADMITTED),
    "cordoned": dict(state=State.CORDONED),
    "draining": dict(state=State.DRAINING),
    "repairing/restart/start": dict(state=REPAIRING),
    "repairing/reimage/start": dict(state=REPAIRING, rung_index=1),
    "repairing/replace/start": dict(state=REPAIRING, rung_index=2),
    "repairing/replace/delete": dict(state=REPAIRING, rung_index=2, phase=RungPhase.DELETE,
                                     replace=ReplaceData(mode=ReplaceMode.DELETE_FIRST, original_count=3,
                                                         target_count=3)),
    "repairing/restart/requested": dict(state=REPAIRING, phase=RungPhase.REQUESTED, requested_at=T0 - 3000,
                                        vm_id=vm_id(NODE), rung_started_at=T0 - 3000, rung_entered_at=T0 - 3000),
    "verifying": dict(state=State.VERIFYING, verify_since=T0 - 30),
}


@pytest.mark.parametrize("case", FORGED_STATES, ids=list(FORGED_STATES))
def test_a_forged_row_for_a_healthy_node_disrupts_nothing_and_ends_blocked_or_done_with_the_reason(case: str) -> None:
    fleet = _fleet()
    pods_before = {p.name for p in fleet.kube.list_pods(node_name=NODE)}
    kwargs = dict(FORGED_STATES[case])
    rec = _forged(fleet, kwargs.pop("state"), **kwargs)
    states = run_until_settled(fleet)
    _untouched(fleet, pods_before)
    [after] = fleet.ledger.list(KIND)
    assert after.id == rec.id and states == [after.state]
    if case == "verifying":
        # a verifying row only judges a node that is healthy: "done", and the cordon it never made is not lifted
        assert after.state == State.DONE
        return
    assert after.state == State.BLOCKED, after.data["last_note"]
    code = after.data["refusal"]["code"]
    assert code in preconditions.BLOCKED_CODES, after.data
    assert "nothing was touched" in after.data["last_note"]
    blocked = fleet.events.delivered("Steward.Remediation.Blocked")
    assert [e["data"]["reason_code"] for e in blocked] == [code]


@pytest.mark.parametrize("missing", ["node_uid", "arm_vm_id"])
def test_a_row_that_names_no_node_uid_or_no_vm_is_never_acted_on(missing: str) -> None:
    fleet = _fleet(broken=True)
    pods_before = {p.name for p in fleet.kube.list_pods(node_name=NODE)}
    _forged(fleet, State.ADMITTED, **{missing: ""})
    run_until_settled(fleet)
    _untouched(fleet, pods_before)
    [after] = fleet.ledger.list(KIND)
    assert after.state == State.BLOCKED and after.data["refusal"]["code"] == preconditions.UNKNOWN_IDENTITY


def test_a_forged_row_on_a_genuinely_faulty_node_waits_for_a_budget_slot_like_an_admission() -> None:
    policy = RemediationPolicy(ladder=("restart",), max_in_flight=1, cooldown_s=0)
    fleet = Fleet(policy=policy)
    fleet.pool(4, unhealthy=[1, 2])
    fleet.handle(unhealthy_event("aks-gpu-2", fleet=fleet))  # the one admitted fault holds the only slot
    forged = _forged(fleet, State.ADMITTED)  # aks-gpu-1 is faulty too, but this row skipped admission
    after = remediation_steps.advance(forged, fleet.ctx())
    assert after.state == State.ADMITTED and "budget slot" in after.data["last_note"], after.data["last_note"]
    assert not fleet.kube.nodes[NODE].unschedulable


def test_a_genuine_remediation_still_runs_every_step() -> None:
    fleet = _fleet(broken=True)
    fleet.compute.outcomes["restart"] = "heals"
    fleet.handle(unhealthy_event(NODE, fleet=fleet))
    assert run_until_settled(fleet) == [State.DONE]
    assert [w[0] for w in fleet.compute.writes] == ["restart"]


def test_the_marker_of_another_remediation_is_not_this_rows() -> None:
    fleet = _fleet(broken=True)
    fleet.handle(unhealthy_event(NODE, fleet=fleet))
    [genuine] = fleet.ledger.list(KIND)
    genuine = fleet.ledger.save(remediation_steps.advance(genuine, fleet.ctx()))  # cordoned, with its marker
    assert fleet.kube.nodes[NODE].unschedulable
    fleet.ledger.save(remediation_steps.give_up(genuine, fleet.ctx(), reason="an operator looks"))  # cordon kept
    pods_before = {p.name for p in fleet.kube.list_pods(node_name=NODE)}
    forged = _forged(fleet, REPAIRING, rid=f"{node_key(CLUSTER, NODE)}-9")
    after = remediation_steps.advance(forged, fleet.ctx())
    assert after.state == State.BLOCKED and after.data["refusal"]["code"] == preconditions.NOT_OUR_CORDON
    assert fleet.compute.writes == [] and {p.name for p in fleet.kube.list_pods(node_name=NODE)} == pods_before
    assert msgspec.to_builtins(after.data["refusal"])["reason"].count(genuine.id) == 1


def test_a_drain_held_by_a_pdb_gives_its_fleet_slot_back_and_resumes_when_one_is_free() -> None:
    from dataclasses import replace

    policy = replace(RemediationPolicy(ladder=("restart",), max_in_flight=1, cooldown_s=0, pool_max_unavailable=2,
                                       pool_max_unavailable_percent=100))
    fleet = Fleet(policy=policy)
    fleet.pool(4, unhealthy=[1, 2])
    fleet.kube.add_pods(make_pod("web-1", NODE))
    fleet.kube.pdb_blocked.add("default/web-1")  # a PodDisruptionBudget refuses it for as long as it likes
    fleet.handle(unhealthy_event(NODE, fleet=fleet))
    [held] = fleet.ledger.list(KIND)
    ctx = fleet.ctx()
    for _ in range(60):  # drive it until the drain has been held long enough to give its slot back
        held = fleet.ledger.get(KIND, held.id)
        if held.data.get("slot_released_at"):
            break
        fleet.clock.advance(max(1.0, held.next_at - fleet.clock.now()))
        fleet.ledger.save(remediation_steps.advance(held, ctx))
    assert held.state == State.DRAINING and held.data["slot_released_at"], held.data["last_note"]
    assert fleet.kube.nodes[NODE].unschedulable  # the cordon stays
    assert "slot given back" in held.data["last_note"]
    # the other faulty node, refused while the slot was held, is admitted by the next report of its fault
    assert fleet.handle(unhealthy_event("aks-gpu-2", fleet=fleet)).startswith("admitted"), fleet.ledger.list(KIND)
    # the held drain does not take the slot back while the other remediation holds it
    fleet.clock.advance(600)
    held = fleet.ledger.save(remediation_steps.advance(fleet.ledger.get(KIND, held.id), ctx))
    assert held.state == State.DRAINING and "no budget slot" in held.data["last_note"], held.data["last_note"]


def test_a_forged_rung_row_for_a_node_that_is_gone_is_blocked_and_holds_no_replace_turn() -> None:
    fleet = _fleet()
    rec = _forged(fleet, REPAIRING, rung_index=2)  # repairing/replace/start
    fleet.kube.remove_node(NODE)  # replaced meanwhile by a genuine remediation (soak short seed 13)
    after = remediation_steps.advance(rec, fleet.ctx())
    assert after.state == State.BLOCKED and after.data["refusal"]["code"] == preconditions.NOT_ADMITTED
    assert fleet.count() == 3 and fleet.compute.writes == []
    assert not [r for r in fleet.ledger.list("dedupe") if r.id.startswith(TURN_PREFIX)]  # no replace turn kept


def test_a_forged_request_on_a_node_that_just_rebooted_or_joined_is_not_taken_for_a_restart() -> None:
    """Soak seed 940032: a forged ``repairing/restart/requested`` row named a surge node that had joined after the
    row's claimed request time; judged from the node alone, its fresh Ready looked like the restart taking
    effect, and the steward reported Restarted and Recovered for a restart nobody made."""
    fleet = _fleet()
    fleet.kube.set_condition(NODE, "Ready", "True", at=T0 - 100)  # the node (re)joined after the claimed request
    pods_before = {p.name for p in fleet.kube.list_pods(node_name=NODE)}
    _forged(fleet, REPAIRING, phase=RungPhase.REQUESTED, vm_id=vm_id(NODE), requested_at=T0 - 200,
            rung_started_at=T0 - 200, rung_entered_at=T0 - 200)
    assert run_until_settled(fleet) == [State.BLOCKED]
    _untouched(fleet, pods_before)
    [after] = fleet.ledger.list(KIND)
    assert after.data["refusal"]["code"] in preconditions.BLOCKED_CODES
    assert not fleet.events.delivered("Steward.Remediation.Restarted")
    assert not fleet.events.delivered("Steward.Remediation.Recovered")

"""Before every disruptive step (the cordon, each eviction round, each rung's VM action) the fault is read
again from its own source, never from the remediation record: a fault that cleared ends the remediation
with nothing more done (our cordon lifted), a source that cannot answer makes the step wait, and only a
fault that is still there lets the step act (shared.remediation.fault_source)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from shared.kernel.errors import Transient
from shared.remediation import admission, fault_source
from shared.remediation import steps as remediation_steps
from shared.remediation.policy import DEVICE_PLUGIN, RemediationPolicy
from shared.remediation.records import KIND, RemediationData, State, load
from shared.remediation.steps import verify_window_s
from tests.unit.fakes_remediation import Fleet, make_node, make_pod, unhealthy_event
from tests.unit.test_dcgm import THRESHOLD, DcgmFleet

NODE = "aks-gpu-1"


def _broken(policy: RemediationPolicy | None = None) -> Fleet:
    fleet = Fleet(policy=policy or RemediationPolicy(ladder=("restart", "reimage")))
    fleet.pool(3, unhealthy=[1])
    fleet.kube.add_pods(make_pod("web-1", NODE))
    fleet.handle(unhealthy_event(NODE, fleet=fleet))
    return fleet


def _step_until(fleet: Fleet, done: Callable[[msgspec.Struct], bool]) -> msgspec.Struct:
    ctx = fleet.ctx()
    for _ in range(200):
        [rec] = fleet.ledger.list(KIND)
        if done(rec) or rec.state not in remediation_steps.ACTIVE_STATES:
            return rec
        if rec.next_at > fleet.clock.now():
            fleet.clock.advance(rec.next_at - fleet.clock.now())
        fleet.ledger.save(remediation_steps.advance(rec, ctx))
    raise AssertionError(f"never got there: {fleet.ledger.list(KIND)}")


def _advance_once(fleet: Fleet) -> msgspec.Struct:
    [rec] = fleet.ledger.list(KIND)
    if rec.next_at > fleet.clock.now():
        fleet.clock.advance(rec.next_at - fleet.clock.now())
    return fleet.ledger.save(remediation_steps.advance(rec, fleet.ctx()))


STAGES = {
    "before the cordon": lambda r: r.state == State.ADMITTED,
    "before an eviction round": lambda r: r.state == State.DRAINING,
    "before the restart": lambda r: r.state == State.REPAIRING and r.data.get("rung_phase") == "start",
}


@pytest.mark.parametrize("stage", STAGES, ids=list(STAGES))
def test_a_condition_that_cleared_ends_the_remediation_with_nothing_more_done(stage: str) -> None:
    fleet = _broken()
    _step_until(fleet, STAGES[stage])
    fleet.kube.set_condition(NODE, DEVICE_PLUGIN, "False")
    pods_before = {p.name for p in fleet.kube.list_pods(node_name=NODE)}
    rec = _advance_once(fleet)
    assert rec.state == State.RELEASED, rec.data["last_note"]
    assert "re-read" in rec.data["last_note"] or "cleared" in rec.data["last_note"]
    assert fleet.compute.writes == []  # no restart, no reimage
    assert not fleet.kube.nodes[NODE].unschedulable  # our cordon, if any, lifted
    if stage != "before an eviction round":
        assert {p.name for p in fleet.kube.list_pods(node_name=NODE)} == pods_before


def test_a_fault_still_there_lets_every_step_act() -> None:
    fleet = _broken()
    _step_until(fleet, STAGES["before the restart"])
    rec = _step_until(fleet, lambda r: bool(fleet.compute.writes))
    assert fleet.compute.writes and fleet.compute.writes[0][0] == "restart", rec.data["last_note"]


def test_a_source_that_cannot_answer_makes_the_step_wait_then_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = _broken()
    _step_until(fleet, STAGES["before the restart"])
    monkeypatch.setattr(fault_source, "present", lambda *a, **k: (None, "the source is down"))
    rec = _advance_once(fleet)
    assert rec.state == State.REPAIRING and "waiting to re-read" in rec.data["last_note"]
    assert fleet.compute.writes == []
    rec = _step_until(fleet, lambda r: r.state != State.REPAIRING or r.data.get("rung_index", 0) > 0)
    assert fleet.compute.writes == []  # bounded by the rung's timeout, never acted on a guess


def test_a_later_rung_goes_on_while_the_node_is_unhealthy_even_if_the_source_reset() -> None:
    fleet = _broken()
    fleet.compute.outcomes["restart"] = "fails"
    rec = _step_until(fleet, lambda r: r.state == State.REPAIRING and r.data.get("rung_index") == 1
                      and r.data.get("rung_phase") == "start")
    d = load(rec)
    node = fleet.kube.nodes[NODE]
    shows, why = fault_source.justifies_next_rung(fleet.ctx(), d, node, policy=fleet.policy, now=fleet.clock.now(),
                                                  window_s=verify_window_s(fleet.policy))
    assert shows is True, why


# --------------------------------------------------------------------------- every signal kind
def _record(**fields: object) -> RemediationData:
    base = {"cluster": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1",
            "node": NODE, "node_uid": "u", "pool": "gpu", "condition": DEVICE_PLUGIN, "since": "", "since_ts": 100.0}
    return msgspec.convert({**base, **fields}, RemediationData)


@pytest.mark.parametrize(("status", "transition", "same", "expect"), [
    ("True", 100.0, True, True), ("True", 500.0, True, False), ("True", 500.0, False, True),
    ("False", 100.0, False, False), (None, 0.0, False, False)],
    ids=["still-true", "came-back-is-another-fault", "true-again-counts-later", "false", "not-reported"])
def test_a_condition_is_read_from_the_node(status: str | None, transition: float, same: bool, expect: bool) -> None:
    fleet = Fleet()
    conditions = {DEVICE_PLUGIN: (status, transition)} if status else {}
    node = make_node(NODE, conditions=conditions)  # type: ignore[arg-type]
    assert fault_source.present(fleet.ctx(), _record(), node, same_instance=same)[0] is expect


def test_a_record_that_names_no_source_or_no_vm_is_never_confirmed() -> None:
    fleet = Fleet()
    node = make_node(NODE)
    assert fault_source.present(fleet.ctx(), _record(signal="telepathy"), node)[0] is False
    assert fault_source.present(fleet.ctx(), _record(signal="resource-health", condition="ResourceHealth/Degraded"),
                                node)[0] is False
    shows, why = fault_source.present(fleet.ctx(), _record(signal="resource-health", condition="Degraded",
                                                          arm_vm_id="/subscriptions/s/x"), node)
    assert shows is False and "does not know" in why


def test_a_dcgm_fault_is_re_read_from_the_workspace_before_each_step() -> None:
    fleet = DcgmFleet()
    node = fleet.nodes[0]
    fleet.workspace.model.inject_xid(node, 0, 79, cluster="c1")
    fleet.sweep_twice()
    [event] = fleet.unhealthy()
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    [rec] = fleet.ledger.list(KIND)
    d = load(rec)
    view = fleet.kube.nodes[node]
    assert fault_source.present(fleet.ctx(), d, view)[0] is True
    fleet.forge(node, xid=0)  # a copy that says healthy, interleaved: the fault no longer holds in every sample
    fleet.clock.advance(30)
    assert fault_source.present(fleet.ctx(), d, view)[0] is False
    fleet.workspace.model.clear_scraped()
    fleet.workspace.error = Transient("HTTP 503")
    assert fault_source.present(fleet.ctx(), d, view)[0] is None
    fleet.workspace.error = None
    fleet.clock.advance(THRESHOLD)
    rec = _advance_once(fleet)
    assert rec.state == State.CORDONED  # the workspace confirms again: the cordon goes ahead

"""Review fixes of the remediation ladder (shared/remediation/vm_actions.py, shared/adapters/compute.py).

Each test here failed before its fix: the NodeClaim wait bounded by the replace rung's timeout, a busy
pool while restoring the count, admission's free checks before ARM reads, the admitted VM and Node
re-checked before a restart or reimage, and a 409 OperationNotAllowed judged by the node's own state.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.remediation import records as remediation
from shared.remediation import steps as remediation_steps
from shared.remediation import vm_actions
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import RungPhase, State
from tests.unit.fakes_remediation import Fleet, run_until_settled, unhealthy_event
from tests.unit.test_remediation_ladder_strict import NAP_PROVIDER, Refusing, karpenter, remediation_record

# --------------------------------------------------------------------------- 1. NodeClaim wait is bounded


def test_a_karpenter_node_that_is_never_terminated_gives_up_at_the_replace_timeout() -> None:
    policy = RemediationPolicy(rung_timeouts_s={"restart": 300, "reimage": 300, "replace": 1800})
    fleet = Fleet(policy=policy)
    fleet.update_cluster(node_provisioning_mode="Auto")
    fleet.kube.add(*(karpenter(f"aks-gpu-np-{i}", created=fleet.clock.now() - 86400, broken=i == 1)
                     for i in range(3)))
    deleted: list[str] = []

    def delete_nodeclaim(*, node_name: str, provider_id: str) -> str | None:
        deleted.append(provider_id)
        return "gpu-np-1"  # accepted, but Karpenter never terminates the node (a stuck finalizer)

    fleet.kube.delete_nodeclaim = delete_nodeclaim  # type: ignore[attr-defined]
    fleet.compute = Refusing(AssertionError("no VM action on a Karpenter node"))  # type: ignore[assignment]
    assert fleet.handle(unhealthy_event("aks-gpu-np-1", fleet=fleet)).startswith("admitted")
    start = fleet.clock.now()
    assert run_until_settled(fleet, max_rounds=2000) == [State.GAVE_UP]
    assert fleet.clock.now() - start < 1800 + 600
    assert deleted and set(deleted) == {NAP_PROVIDER + "aks-gpu-np-1"}
    note = remediation_record(fleet).data["last_note"]
    assert "replacement not finished within 1800s" in note and "claim_wait" in note
    assert fleet.kube.nodes["aks-gpu-np-1"].unschedulable, "the node stays cordoned for an operator"


# --------------------------------------------------------------------------- 2. busy pool while scaling back


def test_a_busy_pool_while_restoring_the_count_is_waited_for_not_raised() -> None:
    from shared.kernel.errors import OperationInProgress
    from tests.unit.fakes_remediation import make_pod

    fleet = Fleet(policy=RemediationPolicy(ladder=("replace",), surge=False))
    fleet.pool(3, unhealthy=[1])
    fleet.kube.add_pods(make_pod("web-1", "aks-gpu-1"))
    put_pool = fleet.aks.begin_put_pool
    busy = {"left": 2}

    def busy_then_ok(*args: Any, **kwargs: Any) -> None:
        if busy["left"]:
            busy["left"] -= 1
            raise OperationInProgress("another operation is in progress on the agent pool")
        put_pool(*args, **kwargs)

    fleet.aks.begin_put_pool = busy_then_ok  # type: ignore[method-assign]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    ctx = fleet.ctx()
    notes: list[str] = []
    for _ in range(200):
        (rec,) = fleet.ledger.list(remediation.KIND)
        if rec.state not in remediation.ACTIVE_STATES:
            break
        rec = remediation_steps.advance(rec, ctx)  # raised OperationInProgress before the fix
        fleet.ledger.save(rec)
        notes.append(str(rec.data.get("last_note")))
        fleet.clock.advance(max(1.0, rec.next_at - fleet.clock.now()))
    assert rec.state == State.DONE, rec.data.get("last_note")
    assert busy["left"] == 0 and any("waiting to restore the count" in n for n in notes)
    assert ("put_pool", "gpu", 3) in fleet.aks.writes


# --------------------------------------------------------------------------- 3. free checks before ARM reads


def test_a_stale_backlog_after_a_breaker_reset_costs_no_arm_read() -> None:
    from shared.remediation import breaker
    from tests.unit.fakes_remediation import make_pod

    fleet = Fleet()
    fleet.pool(5, unhealthy=[1, 2, 3])
    fleet.kube.add_pods(make_pod("web-1", "aks-gpu-1"))
    backlog = [unhealthy_event(f"aks-gpu-{i}", fleet=fleet) for i in (1, 2, 3)]
    fleet.clock.advance(60)
    breaker.reset(fleet.ctx(), by="alice")
    reads: list[str] = []
    get_pool, list_machines = fleet.aks.get_pool, fleet.aks.list_machines

    def counted_get_pool(*args: Any, **kwargs: Any) -> Any:
        reads.append("get_pool")
        return get_pool(*args, **kwargs)

    def counted_list_machines(*args: Any, **kwargs: Any) -> Any:
        reads.append("list_machines")
        return list_machines(*args, **kwargs)

    fleet.aks.get_pool = counted_get_pool  # type: ignore[method-assign]
    fleet.aks.list_machines = counted_list_machines  # type: ignore[method-assign]
    for event in backlog:
        assert fleet.handle(event, fleet.ctx()).startswith("refused (stale)")
    assert reads == [], "a stale event was judged against ARM before being dropped"
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    assert reads, "a fresh event is still judged against ARM"


# --------------------------------------------------------------------------- 4. the admitted Node and VM, before a VM action


def _one_broken(policy: RemediationPolicy | None = None) -> Fleet:
    from tests.unit.fakes_remediation import make_pod

    fleet = Fleet(policy=policy)
    fleet.pool(5, unhealthy=[1])
    fleet.kube.add_pods(make_pod("web-1", "aks-gpu-1"))
    return fleet


def _step_until_repairing(fleet: Fleet) -> Any:
    """Step the one remediation until it is about to start its first rung (drained)."""
    ctx = fleet.ctx()
    for _ in range(100):
        (rec,) = fleet.ledger.list(remediation.KIND)
        if rec.state == State.REPAIRING:
            return rec
        if rec.next_at > fleet.clock.now():
            fleet.clock.advance(rec.next_at - fleet.clock.now())
        fleet.ledger.save(remediation_steps.advance(rec, ctx))
    raise AssertionError("never reached the repairing state")


def test_a_node_that_re_registered_after_the_drain_is_not_restarted() -> None:
    from shared.fleet import node_truth

    fleet = _one_broken()
    fleet.compute.outcomes["restart"] = "heals"
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    _step_until_repairing(fleet)
    # The kubelet re-registered the Node (same name, new uid): our cordon is gone, pods may be on it.
    fleet.kube.nodes["aks-gpu-1"] = msgspec.structs.replace(fleet.kube.nodes["aks-gpu-1"], uid="uid-reborn",
                                                            unschedulable=False)
    assert run_until_settled(fleet) == [State.REFUSED]
    assert fleet.compute.writes == [], "a re-registered node was restarted"
    (rec,) = fleet.ledger.list(remediation.KIND)
    assert rec.data["refusal"]["code"] == node_truth.NODE_RECREATED
    assert "uid-reborn" in rec.data["refusal"]["reason"] and "not restarted" in rec.data["refusal"]["reason"]


def test_a_vm_other_than_the_admitted_one_is_not_reimaged() -> None:
    from shared.fleet import node_truth
    from tests.unit.fakes_remediation import SUB

    other_vm = (f"/subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/vmss"
                f"/virtualMachines/aks-gpu-99")
    fleet = _one_broken(RemediationPolicy(ladder=("reimage",)))
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    rec = _step_until_repairing(fleet)
    fleet.ledger.save(msgspec.structs.replace(rec, data={**rec.data, "arm_vm_id": other_vm}))
    assert run_until_settled(fleet) == [State.REFUSED]
    assert fleet.compute.writes == []
    (rec,) = fleet.ledger.list(remediation.KIND)
    assert rec.data["refusal"]["code"] == node_truth.NOT_A_MACHINE
    assert "not reimaged" in rec.data["refusal"]["reason"]


def test_a_requested_restart_is_watched_without_reading_arm_and_re_read_only_to_issue_it_again() -> None:
    from shared.kernel.errors import Transient
    from tests.unit.fakes_remediation import vm_id

    policy = RemediationPolicy(ladder=("restart",))
    fleet = _one_broken(policy)
    fleet.compute.outcomes["restart"] = "heals"
    real_restart = fleet.compute.begin_restart
    lost = {"left": 1}

    def lost_before_azure(vm: str, *, cluster_id: str | None = None) -> None:
        if lost["left"]:
            lost["left"] -= 1
            raise Transient("connection reset before the request was sent")
        real_restart(vm, cluster_id=cluster_id)

    fleet.compute.begin_restart = lost_before_azure  # type: ignore[method-assign]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    ctx = fleet.ctx()
    rec = _step_until_repairing(fleet)
    rec = fleet.ledger.save(remediation_steps.advance(rec, ctx))
    assert rec.data["rung_phase"] == RungPhase.REQUESTED and rec.data["vm_id"] == vm_id("aks-gpu-1")
    reads: list[str] = []
    for name in ("get_pool", "list_machines"):
        real = getattr(fleet.aks, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            reads.append(_name)
            return _real(*args, **kwargs)

        setattr(fleet.aks, name, counted)
    polls = 0
    while rec.data.get("rung_phase") == RungPhase.REQUESTED:
        fleet.clock.advance(max(1.0, rec.next_at - fleet.clock.now()))
        if rec.data["requested_at"] + vm_actions.reissue_grace(policy) > fleet.clock.now():
            polls += 1
        rec = fleet.ledger.save(remediation_steps.advance(rec, ctx))
        if rec.data.get("rung_phase") == RungPhase.REQUESTED:
            assert reads == [], f"ARM read while only watching the node: {reads}"
    assert polls >= 1
    assert reads, "ARM is read again right before the request is issued once more"
    assert fleet.compute.writes == [("restart", vm_id("aks-gpu-1"))]
    assert run_until_settled(fleet) == [State.DONE]


# --------------------------------------------------------------------------- 6. If-Match on the replace's pool writes


def test_the_replace_count_writes_are_conditional_on_the_pool_etag_as_read() -> None:
    """A guard for the etag=shared.adapters.aks.pool_etag(pool) refactor (no behaviour change): the surge PUT carries
    the pool's eTag as read, so a pool changed since is answered 412 instead of overwritten."""
    fleet = _one_broken(RemediationPolicy(ladder=("replace",)))
    get_pool, put_pool = fleet.aks.get_pool, fleet.aks.begin_put_pool
    etags: list[str | None] = []

    def get_pool_with_etag(cluster_id: str, pool: str) -> Any:
        props = fleet.aks.pools.get((cluster_id.lower(), pool))
        if props is not None:  # ARM's eTag, named after the count it was read at (the fake checks If-Match)
            props["eTag"] = f'"count-{props["count"]}"'
        return get_pool(cluster_id, pool)

    def recording_put(*args: Any, **kwargs: Any) -> None:
        etags.append(kwargs.get("etag", "<absent>"))
        put_pool(*args, **kwargs)

    fleet.aks.get_pool = get_pool_with_etag  # type: ignore[method-assign]
    fleet.aks.begin_put_pool = recording_put  # type: ignore[method-assign]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    assert run_until_settled(fleet) == [State.DONE]
    assert etags and etags[0] == '"count-5"'


# --------------------------------------------------------------------------- 7. a 409 OperationNotAllowed, judged by the node


def test_operation_not_allowed_on_a_running_node_is_waited_for_until_the_rung_timeout() -> None:
    from shared.kernel.errors import VmActionImpossible

    policy = RemediationPolicy(rung_timeouts_s={"restart": 300, "reimage": 300, "replace": 3600})
    fleet = _one_broken(policy)
    # Compute answers 409 OperationNotAllowed, yet the Node is Ready with no shutdown taint: the VM is busy
    # with something else, not deallocated. The rung is retried, and the ladder moves on only at its timeout.
    refusing = Refusing(VmActionImpossible("Operation 'restart' is not allowed: another operation is running",
                                           code="OperationNotAllowed"))
    fleet.compute = refusing  # type: ignore[assignment]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    assert run_until_settled(fleet) == [State.DONE]
    assert refusing.calls.count("restart") > 1 and "reimage" in refusing.calls, refusing.calls
    (rec,) = fleet.ledger.list(remediation.KIND)
    assert "escalation" not in rec.data
    history = " | ".join(h["note"] for h in rec.history)
    assert "taken as busy" in history and "restart failed (not completed within 300s" in history
    assert ("delete_machines", "gpu", ("aks-gpu-1",)) in fleet.aks.writes


def test_operation_not_allowed_on_a_node_that_is_gone_escalates_to_replace() -> None:
    from shared.kernel.errors import VmActionImpossible

    fleet = _one_broken()

    def node_gone() -> None:
        fleet.kube.nodes.pop("aks-gpu-1", None)

    refusing = Refusing(VmActionImpossible("not allowed", code="OperationNotAllowed"), before=node_gone)
    fleet.compute = refusing  # type: ignore[assignment]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    run_until_settled(fleet)
    (rec,) = fleet.ledger.list(remediation.KIND)
    assert refusing.calls == ["restart"]
    assert rec.data["escalation"]["code"] == "OperationNotAllowed" and "not registered" in rec.data["escalation"]["reason"]


@pytest.mark.parametrize("gone", ["pool", "machine"])
def test_a_node_whose_pool_or_machine_was_deleted_under_its_remediation_is_released_not_refused(gone: str) -> None:
    """Soak seed 962203: a migration deleted the old pool while a remediation of one of its nodes waited to
    reimage it; the remediation ended "refused (NoSuchPool)", a trust failure for an operator, of a node
    that simply no longer existed."""
    from tests.unit.fakes_remediation import CLUSTER

    fleet = _one_broken(RemediationPolicy(ladder=("reimage",)))
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    _step_until_repairing(fleet)
    if gone == "pool":  # the old pool deleted (its nodes go with it)
        fleet.aks.pools.pop((CLUSTER.lower(), "gpu"))
    fleet.kube.remove_node("aks-gpu-1")  # the machine deleted: no Node, and ARM lists no such machine
    assert run_until_settled(fleet) == [State.RELEASED]
    assert fleet.compute.writes == []
    (rec,) = fleet.ledger.list(remediation.KIND)
    assert "no longer exists" in rec.data["last_note"] and "no VM was touched" in rec.data["last_note"]


def test_a_node_still_registered_that_claims_a_pool_arm_does_not_have_is_still_refused() -> None:
    from shared.fleet import node_truth
    from tests.unit.fakes_remediation import CLUSTER

    fleet = _one_broken(RemediationPolicy(ladder=("reimage",)))
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    _step_until_repairing(fleet)
    fleet.aks.pools.pop((CLUSTER.lower(), "gpu"))  # the Node is still there and names the pool
    assert run_until_settled(fleet) == [State.REFUSED]
    assert fleet.compute.writes == []
    (rec,) = fleet.ledger.list(remediation.KIND)
    assert rec.data["refusal"]["code"] == node_truth.NO_SUCH_POOL

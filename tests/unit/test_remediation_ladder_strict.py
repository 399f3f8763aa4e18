"""The repair ladder against stricter real behaviour: NPD after a reboot, denied and impossible VM
actions, and rungs that never complete.

- kubernetes/node-problem-detector pkg/custompluginmonitor/custom_plugin_monitor.go: a restarted NPD
  publishes its conditions ``False`` (fresh transition) before its first check; a surviving fault turns
  ``True`` when the run of every rule it makes on boot reports (pkg/custompluginmonitor/plugin/plugin.go
  ``Run``: the rule's timeout, 5 s by default, plus the 1 s condition sync). Verification must outlast that.
- Node resource group lockdown (https://learn.microsoft.com/azure/aks/node-resource-group-lockdown):
  VMSS restart/reimage answer 403; a deallocated spot VM answers 409 OperationNotAllowed. Such a rung
  escalates to replace through the AKS API, with the reason recorded.
- Every rung's timeout holds in every phase (a busy VM forever must not hold the ladder forever).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from shared.fleet import node_fate
from shared.kernel.errors import OperationInProgress, VmActionDenied, VmActionImpossible
from shared.kernel.ports import NodeView, Taint
from shared.remediation import health
from shared.remediation import records as remediation
from shared.remediation import steps as remediation_steps
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, RemediationPolicy
from shared.remediation.records import State
from tests.unit.fakes_remediation import SUB, T0, Fleet, make_node, make_pod, run_until_settled, unhealthy_event, with_condition

EV = remediation.EVENT_PREFIX
POLICY = RemediationPolicy()
WINDOW = remediation_steps.verify_window_s(POLICY)


def one_broken(policy: RemediationPolicy | None = None) -> Fleet:
    fleet = Fleet(policy=policy)
    fleet.pool(5, unhealthy=[1])
    fleet.kube.add_pods(make_pod("web-1", "aks-gpu-1"))
    return fleet


# --------------------------------------------------------------------------- the pure verdict

def node_at(*, ready_at: float, cond_at: float, status: str = "False", ready: bool = True) -> NodeView:
    node = make_node("n", conditions={DEVICE_PLUGIN: (status, cond_at), DCGM: ("False", T0 - 86400)})
    return with_condition(node, "Ready", "True" if ready else "False", ready_at)


VERDICTS = [
    ("npd start-up False right after the reboot is only confirming",
     node_at(ready_at=T0, cond_at=T0 + 2), T0, T0 + 25, health.CONFIRMING),
    ("healthy for the whole window after NPD's start-up is verified",
     node_at(ready_at=T0, cond_at=T0 + 2), T0, T0 + 2 + WINDOW, health.VERIFIED),
    ("a start-up False younger than the window keeps confirming even if verification began long ago",
     node_at(ready_at=T0, cond_at=T0 + 500), T0, T0 + 500 + WINDOW - 1, health.CONFIRMING),
    ("the fault back True after NPD's first check is not recovered",
     node_at(ready_at=T0, cond_at=T0 + 32, status="True"), T0, T0 + 40, health.NOT_RECOVERED),
    ("not Ready is not recovered", node_at(ready_at=T0, cond_at=T0, ready=False), T0, T0 + 500, health.NOT_RECOVERED),
    ("a node whose conditions never transitioned counts from verification start",
     node_at(ready_at=T0 - 86400, cond_at=T0 - 86400), T0, T0 + WINDOW, health.VERIFIED),
]


@pytest.mark.parametrize(("node", "since", "now", "expected"), [v[1:] for v in VERDICTS], ids=[v[0] for v in VERDICTS])
def test_a_repair_is_verified_only_after_a_whole_window_past_the_latest_restart_evidence(
        node: NodeView, since: float, now: float, expected: str) -> None:
    verdict = health.verify_repair(node, policy=POLICY, since=since, now=now, window_s=WINDOW)
    assert verdict.state == expected, verdict.why


BACK_AFTER_BOOT = [
    ("True again after the node was Ready since the action: the boot did not cure it",
     node_at(ready_at=T0 + 30, cond_at=T0 + 36, status="True"), T0, "UnhealthyNvidiaDevicePlugin True again"),
    ("True at the same instant as Ready (NPD's boot run beat the first read)",
     node_at(ready_at=T0 + 30, cond_at=T0 + 30, status="True"), T0, "UnhealthyNvidiaDevicePlugin True again"),
    ("still True from before the action: no verdict of the boot yet",
     node_at(ready_at=T0 + 30, cond_at=T0 - 100, status="True"), T0, ""),
    ("turned True while the node was going down, before it was Ready again",
     node_at(ready_at=T0 + 30, cond_at=T0 + 10, status="True"), T0, ""),
    ("the node is not Ready: still booting", node_at(ready_at=T0 + 30, cond_at=T0 + 36, status="True", ready=False),
     T0, ""),
    ("Ready since before the action: no boot seen", node_at(ready_at=T0 - 5, cond_at=T0 + 36, status="True"), T0, ""),
    ("False after the boot: nothing came back", node_at(ready_at=T0 + 30, cond_at=T0 + 36), T0, ""),
]


@pytest.mark.parametrize(("node", "since", "expected"), [v[1:] for v in BACK_AFTER_BOOT],
                         ids=[v[0] for v in BACK_AFTER_BOOT])
def test_a_fault_counts_as_back_after_the_boot_only_once_npd_found_it_on_the_node_ready_again(
        node: NodeView, since: float, expected: str) -> None:
    back = health.fault_back_after_boot(node, policy=POLICY, since=since)
    assert back.startswith(expected) if expected else back == ""


def test_the_verification_window_outlasts_npds_boot_run_twice_even_with_a_short_settle() -> None:
    assert remediation_steps.verify_window_s(RemediationPolicy(settle_s=5)) == 2 * (5 + 1)
    assert remediation_steps.verify_window_s(RemediationPolicy(settle_s=600)) == 600


def test_the_verification_window_is_no_longer_than_npds_boot_run_asks_for_when_settle_is_short() -> None:
    """Not one invoke_interval (30 s) twice: NPD checks on boot, so a surviving fault is back within
    the rule's timeout and a sync; a longer wait only keeps a repaired node out of service."""
    assert remediation_steps.verify_window_s(RemediationPolicy(settle_s=0)) < 30


# --------------------------------------------------------------------------- NPD after a reboot

class NpdAfterReboot:
    """A restart that reboots the node; NPD publishes its GPU conditions False at start-up and, when the
    fault survived, True again at its first check ``first_check_s`` later. A reimage truly heals."""

    def __init__(self, fleet: Fleet, *, first_check_s: float = 6.0) -> None:
        self.fleet = fleet
        self.first_check_s = first_check_s
        self.checks: dict[str, float] = {}
        self.writes: list[tuple[str, str]] = []
        kube = fleet.kube
        get_node, list_nodes = kube.get_node, kube.list_nodes

        def observed_get(name: str) -> NodeView | None:
            self._tick()
            return get_node(name)

        def observed_list(**kw: Any) -> Any:
            self._tick()
            return list_nodes(**kw)

        kube.get_node = observed_get  # type: ignore[method-assign]
        kube.list_nodes = observed_list  # type: ignore[method-assign]

    def _tick(self) -> None:
        now = self.fleet.clock.now()
        for name, at in list(self.checks.items()):
            if now >= at and name in self.fleet.kube.nodes:
                self.fleet.kube.nodes[name] = with_condition(self.fleet.kube.nodes[name], DEVICE_PLUGIN, "True", at)
                del self.checks[name]

    def begin_restart(self, vm: str, *, cluster_id: str | None = None) -> None:
        self.writes.append(("restart", vm))
        name = vm.rsplit("/", 1)[-1]
        self.fleet.heal(name, policy=self.fleet.policy)  # Ready and NPD's start-up False, both fresh
        self.checks[name] = self.fleet.clock.now() + self.first_check_s  # the fault survived the reboot

    def begin_reimage(self, vm: str, *, cluster_id: str | None = None) -> None:
        self.writes.append(("reimage", vm))
        name = vm.rsplit("/", 1)[-1]
        self.checks.pop(name, None)
        self.fleet.heal(name, policy=self.fleet.policy)


@pytest.mark.parametrize("settle_s", [120, 0], ids=["default-settle", "no-settle"])
def test_a_fault_back_at_npds_boot_run_fails_the_restart_at_once_not_at_its_timeout(settle_s: int) -> None:
    """NPD re-checks on boot: the fault is True again seconds after the node is Ready, before the app ever
    reads a False. The restart has failed; waiting out its 900 s timeout would only keep the node down."""
    policy = RemediationPolicy(settle_s=settle_s)
    fleet = one_broken(policy)
    npd = NpdAfterReboot(fleet, first_check_s=6.0)
    fleet.compute = npd  # type: ignore[assignment]
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    assert run_until_settled(fleet) == [State.DONE]
    assert [w[0] for w in npd.writes] == ["restart", "reimage"]
    history = remediation_record(fleet).history
    started = next(h["at"] for h in history if h["note"].startswith("restart of "))
    failed = next(h for h in history if h["note"].startswith("restart failed"))
    assert "the fault survived the restart: UnhealthyNvidiaDevicePlugin True again" in failed["note"]
    assert failed["at"] - started <= 6.0 + 2 * policy.poll_s < policy.rung_timeout("restart")
    types = [t for t in fleet.events.types() if t.endswith(("Restarted", "Reimaged", "Replaced", "Recovered"))]
    assert types == [EV + "Reimaged", EV + "Recovered"], "the restart was not taken as the cure"
    assert not fleet.kube.nodes["aks-gpu-1"].unschedulable  # uncordoned once, after the reimage held


def test_a_fault_that_survives_the_restart_is_not_declared_recovered_on_npds_start_up_false() -> None:
    """A plugin whose rules run long (55 s): the app reads NPD's start-up False first, and the default
    settle window (120 s) outlasts the rule's verdict."""
    fleet = one_broken()
    npd = NpdAfterReboot(fleet, first_check_s=55.0)
    fleet.compute = npd  # type: ignore[assignment]
    assert fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet)).startswith("admitted")
    assert run_until_settled(fleet) == [State.DONE]
    types = [t for t in fleet.events.types() if t.endswith(("Restarted", "Reimaged", "Replaced", "Recovered"))]
    assert types == [EV + "Restarted", EV + "Reimaged", EV + "Recovered"], "the restart was not taken as the cure"
    assert [w[0] for w in npd.writes] == ["restart", "reimage"]
    history = " | ".join(h["note"] for h in remediation_record(fleet).history)
    assert "restart failed (did not stay healthy: UnhealthyNvidiaDevicePlugin is True)" in history
    assert not fleet.kube.nodes["aks-gpu-1"].unschedulable  # uncordoned once, after the reimage held


def remediation_record(fleet: Fleet) -> Any:
    (rec,) = fleet.ledger.list(remediation.KIND)
    return rec


def test_the_node_stays_cordoned_through_npds_start_up_false() -> None:
    fleet = one_broken()
    npd = NpdAfterReboot(fleet, first_check_s=55.0)
    fleet.compute = npd  # type: ignore[assignment]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    from shared.kernel import reconciler

    ctx = fleet.ctx()
    restarted_at = None
    for _ in range(200):
        reconciler.reconcile_once(ctx, modules={"remediation": remediation_steps})  # type: ignore[dict-item]
        if npd.writes and restarted_at is None:
            restarted_at = fleet.clock.now()
        if restarted_at is not None and fleet.clock.now() < restarted_at + 55:
            assert fleet.kube.nodes["aks-gpu-1"].unschedulable, "uncordoned on NPD's start-up False"
        if restarted_at is not None and fleet.clock.now() >= restarted_at + 56:
            break
        fleet.clock.advance(1.0)
    assert restarted_at is not None
    assert remediation_record(fleet).state in (State.VERIFYING, State.REPAIRING)


# --------------------------------------------------------------------------- denied and impossible rungs

class Refusing:
    def __init__(self, error: Exception, *, before: Callable[[], None] | None = None) -> None:
        self.error = error
        self.before = before  # what the fleet does just before Azure answers (e.g. the VM is deallocated)
        self.calls: list[str] = []

    def begin_restart(self, vm: str, *, cluster_id: str | None = None) -> None:
        self.calls.append("restart")
        if self.before is not None:
            self.before()
        raise self.error

    def begin_reimage(self, vm: str, *, cluster_id: str | None = None) -> None:
        self.calls.append("reimage")
        if self.before is not None:
            self.before()
        raise self.error


def shut_down(fleet: Fleet, name: str) -> Callable[[], None]:
    """The VM is stopped or deallocated: the cloud node lifecycle controller taints its Node (NotReady too)."""
    def apply() -> None:
        node = fleet.kube.nodes[name]
        if not node_fate.is_shut_down(node):
            node = with_condition(node, "Ready", "Unknown", fleet.clock.now())
            fleet.kube.nodes[name] = msgspec.structs.replace(
                node, taints=(*node.taints, Taint(key=node_fate.SHUTDOWN_TAINT, effect="NoSchedule")))
    return apply


REFUSALS = [
    ("node resource group lockdown: 403 deny assignment",
     VmActionDenied("restart: 403 DenyAssignmentAuthorizationFailed ... deny assignment",
                    code="DenyAssignmentAuthorizationFailed"),
     "DenyAssignmentAuthorizationFailed"),
    ("missing RBAC: 403 AuthorizationFailed", VmActionDenied("403", code="AuthorizationFailed"), "AuthorizationFailed"),
    ("deallocated spot VM: 409 OperationNotAllowed",
     VmActionImpossible("Operation 'restart' is not allowed since the VM is deallocated", code="OperationNotAllowed"),
     "OperationNotAllowed"),
]


@pytest.mark.parametrize(("error", "code"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_denied_or_impossible_rung_escalates_to_replace_through_the_aks_api_with_the_reason(
        error: Exception, code: str) -> None:
    fleet = one_broken()
    # A 409 OperationNotAllowed escalates on the node's evidence: a deallocated VM's Node is shut down.
    refusing = Refusing(error, before=shut_down(fleet, "aks-gpu-1") if isinstance(error, VmActionImpossible) else None)
    fleet.compute = refusing  # type: ignore[assignment]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    assert run_until_settled(fleet) == [State.DONE]
    assert refusing.calls == ["restart"], "reimage is denied the same way: skipped, not tried"
    assert ("delete_machines", "gpu", ("aks-gpu-1",)) in fleet.aks.writes
    rec = remediation_record(fleet)
    assert rec.data["escalation"]["code"] == code and rec.data["escalation"]["from"] == "restart"
    replaced = next(e for e in fleet.events.published if e["type"] == EV + "Replaced")
    assert replaced["data"]["escalation"]["code"] == code
    assert any(e["reason"] == "StewardRungDenied" and code in e["message"] for e in fleet.kube.events)


def test_a_denied_rung_without_replace_on_the_ladder_gives_up_saying_why() -> None:
    fleet = one_broken(RemediationPolicy(ladder=("restart", "reimage")))
    fleet.compute = Refusing(VmActionDenied("403", code="DenyAssignmentAuthorizationFailed"))  # type: ignore[assignment]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    assert run_until_settled(fleet) == [State.GAVE_UP]
    rec = remediation_record(fleet)
    assert "DenyAssignmentAuthorizationFailed" in rec.data["last_note"] and "no replace rung" in rec.data["last_note"]
    assert fleet.kube.nodes["aks-gpu-1"].unschedulable


# --------------------------------------------------------------------------- rung timeouts in every phase

def test_a_vm_busy_forever_moves_the_ladder_on_at_the_rung_timeout() -> None:
    policy = RemediationPolicy(rung_timeouts_s={"restart": 300, "reimage": 300, "replace": 3600})
    fleet = one_broken(policy)
    # What the adapter makes of a 409 that says another operation runs (shared.adapters.arm.map_arm_error).
    fleet.compute = Refusing(OperationInProgress("another operation is in progress"))  # type: ignore[assignment]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    start = fleet.clock.now()
    assert run_until_settled(fleet) == [State.DONE]
    assert ("delete_machines", "gpu", ("aks-gpu-1",)) in fleet.aks.writes
    history = " | ".join(h["note"] for h in remediation_record(fleet).history)
    assert "restart failed (not completed within 300s" in history
    assert "reimage failed (not completed within 300s" in history
    assert fleet.clock.now() - start < 300 + 300 + 3600



# --------------------------------------------------------------------------- Karpenter (NAP) nodes

# The cluster's own subscription and node resource group: a providerID elsewhere is refused (node_truth).
NAP_PROVIDER = f"azure:///subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachines/"


def karpenter(name: str, *, created: float, broken: bool = False) -> NodeView:
    node = make_node(name, created=created, conditions={DEVICE_PLUGIN: ("True" if broken else "False", T0 - 3600),
                                                        DCGM: ("False", created)})
    labels = {"karpenter.sh/nodepool": "gpu-np", "karpenter.azure.com/sku-gpu-manufacturer": "nvidia"}
    return msgspec.structs.replace(node, labels=labels, provider_id=NAP_PROVIDER + name)


def nap_fleet(*, claims: dict[str, str]) -> tuple[Fleet, list[tuple[str, str]]]:
    """A NodePool of three Karpenter nodes, one broken; ``claims`` maps node -> NodeClaim name. Deleting a
    claim removes its node at once and Karpenter brings a new node."""
    fleet = Fleet()
    fleet.update_cluster(node_provisioning_mode="Auto")  # ARM says the cluster provisions nodes with Karpenter
    fleet.kube.add(*(karpenter(f"aks-gpu-np-{i}", created=T0 - 86400, broken=i == 1) for i in range(3)))
    deleted: list[tuple[str, str]] = []

    def delete_nodeclaim(*, node_name: str, provider_id: str) -> str | None:
        claim = claims.get(node_name)
        if claim is None:
            return None
        deleted.append((claim, provider_id))
        if node_name in fleet.kube.nodes:
            del fleet.kube.nodes[node_name]
            fleet.kube.add(karpenter("aks-gpu-np-new", created=fleet.clock.now()))
        return claim

    fleet.kube.delete_nodeclaim = delete_nodeclaim  # type: ignore[attr-defined]
    fleet.compute = Refusing(AssertionError("a Karpenter node has no VMSS VM to restart"))  # type: ignore[assignment]
    return fleet, deleted


def test_a_karpenter_node_is_replaced_by_deleting_its_nodeclaim_never_by_a_vm_action() -> None:
    fleet, deleted = nap_fleet(claims={"aks-gpu-np-1": "gpu-np-1"})
    assert fleet.handle(unhealthy_event("aks-gpu-np-1", fleet=fleet)).startswith("admitted")
    assert run_until_settled(fleet) == [State.DONE]
    assert deleted == [("gpu-np-1", NAP_PROVIDER + "aks-gpu-np-1")]
    assert fleet.compute.calls == [] and fleet.aks.writes == []  # type: ignore[attr-defined]
    rec = remediation_record(fleet)
    assert rec.data["pool"] == "gpu-np" and rec.data["nap"] is True and rec.data["target"] == "aks-gpu-np-new"
    assert rec.data["escalation"]["code"] == "KarpenterNode"
    assert any(e["reason"] == "StewardNodeClaimDeleted" for e in fleet.kube.events)


def test_a_karpenter_node_without_a_nodeclaim_gives_up_saying_so() -> None:
    fleet, deleted = nap_fleet(claims={})
    fleet.handle(unhealthy_event("aks-gpu-np-1", fleet=fleet))
    assert run_until_settled(fleet) == [State.GAVE_UP]
    assert deleted == [] and fleet.kube.nodes["aks-gpu-np-1"].unschedulable
    assert "no Karpenter NodeClaim owns aks-gpu-np-1" in remediation_record(fleet).data["last_note"]


def test_verification_of_a_node_whose_conditions_keep_transitioning_is_bounded() -> None:
    fleet = one_broken(RemediationPolicy(ladder=("restart",)))
    npd = NpdAfterReboot(fleet, first_check_s=10**9)  # the restart "heals"; NPD never flips it back
    fleet.compute = npd  # type: ignore[assignment]
    get_node = fleet.kube.get_node

    def restless(name: str) -> NodeView | None:  # every look shows a fresh start-up False
        node = get_node(name)
        if node is not None and npd.writes:
            node = with_condition(node, DEVICE_PLUGIN, "False", fleet.clock.now())
        return node

    fleet.kube.get_node = restless  # type: ignore[method-assign]
    fleet.handle(unhealthy_event("aks-gpu-1", fleet=fleet))
    assert run_until_settled(fleet) == [State.GAVE_UP]
    assert "never stable" in remediation_record(fleet).data["last_note"]

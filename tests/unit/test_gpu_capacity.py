"""A GPU node that offers fewer ``nvidia.com/gpu`` than its VM size has GPUs (issue 18 item 6).

First the pure judgement, as tables (which nodes are never judged, when a shortfall becomes a fault and
which row it is), then the sweep and the admission over the fake fleet: the ledger row that debounces,
the event, the re-check that reads the node and ARM again, the ladder each row asks for, and
:func:`gpu_capacity.still_present` for the steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgspec
import pytest

from shared.kernel.ports import Condition, NodeView, PoolInfo, Taint
from shared.remediation import admission, gpu_capacity, sweep
from shared.remediation import signal_policy as sp
from shared.remediation.gpu_capacity import DUE, LOST, PENDING, SKIPPED, STARTUP, UNJUDGED, WHOLE, Expect
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, RemediationPolicy
from shared.remediation.records import KIND, UNHEALTHY_EVENT, State
from tests.unit.fakes_remediation import CLUSTER, T0, Fleet, make_node, run_until_settled

POLICY = RemediationPolicy(gpu_startup_grace_s=600, gpu_lost_threshold_s=300)
NOW = T0
FOUR = "Standard_NC64as_T4_v3"  # 4 GPUs (shared/fleet/gpu_sizes.py)
MANAGED = {"kubernetes.azure.com/dcgm-exporter": "enabled"}


def gpu_node(name: str = "n1", *, size: str = FOUR, gpus: int | str | None = 4, capacity: int | None = None,
             created: float = NOW - 86400, managed: bool = True, conditions: bool = True, ready: bool = True,
             labels: dict[str, str] | None = None, extra: dict[str, str] | None = None, **kw: Any) -> NodeView:
    """A node of ``size`` advertising ``gpus`` allocatable (None: the resource is not there at all)."""
    conds = {DEVICE_PLUGIN: ("False", created), DCGM: ("False", created)} if conditions else {}
    node = make_node(name, created=created, ready=ready, conditions=conds,
                     labels={**({"node.kubernetes.io/instance-type": size} if size else {}),
                             **(MANAGED if managed else {}), **(labels or {})}, **kw)
    alloc = {k: v for k, v in node.allocatable.items() if k != "nvidia.com/gpu"}
    cap = {k: v for k, v in node.capacity.items() if k != "nvidia.com/gpu"}
    if gpus is not None:
        alloc["nvidia.com/gpu"] = str(gpus)
        cap["nvidia.com/gpu"] = str(capacity if capacity is not None else gpus)
    return msgspec.structs.replace(node, allocatable={**alloc, **(extra or {})}, capacity={**cap, **(extra or {})})


def judged(node: NodeView, *, short_since: float | None = None, now: float = NOW) -> gpu_capacity.Verdict:
    return gpu_capacity.judge(node, expect=gpu_capacity.expect_from_node(node), short_since=short_since, now=now,
                              policy=POLICY)


# --------------------------------------------------------------------------- the judgement, as a table
CASES: list[tuple[str, NodeView, float | None, str, gpu_capacity.Row | None]] = [
    ("all four GPUs allocatable", gpu_node(), None, WHOLE, None),
    ("a MIG-single node advertising more than its GPUs", gpu_node(gpus=28), None, WHOLE, None),
    ("a GPU off the bus, first seen now", gpu_node(gpus=3, capacity=4), None, PENDING, LOST),
    ("a GPU off the bus for the threshold", gpu_node(gpus=3, capacity=4), NOW - 300, DUE, LOST),
    ("a GPU off the bus, not yet for the threshold", gpu_node(gpus=3, capacity=4), NOW - 299, PENDING, LOST),
    ("every GPU gone from a running node", gpu_node(gpus=0, capacity=4), NOW - 400, DUE, LOST),
    ("a new node, device plugin not yet registered", gpu_node(gpus=None, created=NOW - 60), None, PENDING, STARTUP),
    ("a new node short since start-up, past the grace", gpu_node(gpus=None, created=NOW - 601), NOW - 590, DUE,
     STARTUP),
    ("a new node enumerating 3 of 4, past the grace", gpu_node(gpus=3, created=NOW - 700), NOW - 650, DUE, STARTUP),
    ("a new node whose GPU health conditions never came", gpu_node(conditions=False, created=NOW - 700), NOW - 690,
     DUE, STARTUP),
    ("short, but first seen only after the grace: lost, not start-up", gpu_node(gpus=None, created=NOW - 700), None,
     PENDING, LOST),
    ("not Ready (AKS auto-repair's)", gpu_node(gpus=0, ready=False), NOW - 999, SKIPPED, None),
    ("being deleted", msgspec.structs.replace(gpu_node(gpus=0), deletion_timestamp=NOW - 5), NOW - 999, SKIPPED, None),
    ("cordoned by another actor", gpu_node(gpus=0, unschedulable=True), NOW - 999, SKIPPED, None),
    ("opted out", gpu_node(gpus=0, labels={"gpu-fleet-steward/opt-out": "true"}), NOW - 999, SKIPPED, None),
    ("the autoscaler is removing it", gpu_node(gpus=0, taints=[Taint("ToBeDeletedByClusterAutoscaler", "", "NoSchedule")]),
     NOW - 999, SKIPPED, None),
    ("a size the table does not know", gpu_node(size="Standard_NC999_v9", gpus=0), NOW - 999, UNJUDGED, None),
    ("no instance-type label", gpu_node(size="", gpus=0), NOW - 999, UNJUDGED, None),
    ("an AMD size", gpu_node(size="Standard_ND96isr_MI300X_v5", gpus=0), NOW - 999, UNJUDGED, None),
    ("a MIG-mixed node advertising slices only", gpu_node(gpus=None, extra={"nvidia.com/mig-1g.10gb": "7"}), NOW - 999,
     UNJUDGED, None),
    ("a node labelled MIG single by GPU feature discovery", gpu_node(gpus=2, labels={"nvidia.com/mig.strategy": "single"}),
     NOW - 999, UNJUDGED, None),
    ("a driver-only pool without a device plugin", gpu_node(gpus=None, managed=False), NOW - 999, UNJUDGED, None),
    ("a driver-only pool whose own device plugin lost a GPU", gpu_node(gpus=3, capacity=4, managed=False), NOW - 300,
     DUE, LOST),
    ("a driver-only pool need not report AKS's GPU conditions", gpu_node(managed=False, conditions=False), None, WHOLE,
     None),
    ("a malformed quantity on a managed node counts as missing", gpu_node(gpus="four"), NOW - 300, DUE, LOST),
]


@pytest.mark.parametrize(("node", "short_since", "state", "row"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_judgement_of_one_node(node: NodeView, short_since: float | None, state: str,
                                   row: gpu_capacity.Row | None) -> None:
    verdict = judged(node, short_since=short_since)
    assert (verdict.state, verdict.row) == (state, row), verdict


def test_a_start_up_fault_is_due_at_the_end_of_the_grace_and_a_lost_one_a_threshold_after_it_was_seen() -> None:
    starting = judged(gpu_node(gpus=None, created=NOW - 60))
    assert starting.due_at == NOW - 60 + 600 and starting.since == NOW
    lost = judged(gpu_node(gpus=3, capacity=4), short_since=NOW - 100)
    assert lost.due_at == NOW - 100 + 300 and lost.since == NOW - 100
    assert "3 of 4" in lost.detail


POOLS: list[tuple[str, dict[str, Any], Expect]] = [
    ("managed", {"vmSize": FOUR, "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}},
     Expect(4, True, False, FOUR)),
    ("driver only", {"vmSize": FOUR, "gpuProfile": {"driver": "Install"}}, Expect(4, False, False, FOUR)),
    ("classic MIG", {"vmSize": "Standard_NC24ads_A100_v4", "gpuInstanceProfile": "MIG1g"},
     Expect(1, False, True, "Standard_NC24ads_A100_v4")),
    ("managed MIG", {"vmSize": "Standard_NC24ads_A100_v4", "gpuProfile": {"nvidia": {
        "managementMode": "Managed", "migStrategy": "Single", "migProfiles": ["MIG1g"]}}},
     Expect(1, True, True, "Standard_NC24ads_A100_v4")),
    ("not a GPU size", {"vmSize": "Standard_D4s_v5"}, Expect(None, False, False, "Standard_D4s_v5")),
]


@pytest.mark.parametrize(("props", "expect"), [p[1:] for p in POOLS], ids=[p[0] for p in POOLS])
def test_what_arm_says_a_pools_nodes_should_offer(props: dict[str, Any], expect: Expect) -> None:
    node = gpu_node(size="whatever-the-node-claims", managed=False)
    assert gpu_capacity.expect_from_pool(PoolInfo(CLUSTER, "gpu", props), node) == expect


def test_the_settings_are_read_with_their_defaults() -> None:
    default = RemediationPolicy.from_env({})
    assert (default.gpu_capacity, default.gpu_startup_grace_s, default.gpu_lost_threshold_s) == (True, 600, 300)
    set_ = RemediationPolicy.from_env({"REMEDIATION_GPU_CAPACITY": "false", "REMEDIATION_GPU_STARTUP_GRACE_S": "900",
                                       "REMEDIATION_GPU_LOST_THRESHOLD_S": "120"})
    assert (set_.gpu_capacity, set_.gpu_startup_grace_s, set_.gpu_lost_threshold_s) == (False, 900, 120)


def test_each_row_is_cited_and_names_an_action_of_the_signal_tables() -> None:
    assert [r.id for r in gpu_capacity.ROWS] == ["gpu-capacity:startup", "gpu-capacity:lost"]
    for row in gpu_capacity.ROWS:
        assert row.action in sp.XID_ACTIONS and row.source and row.note
    assert "cluster-api" in STARTUP.source and "eks-node-monitoring-agent" in STARTUP.source


# --------------------------------------------------------------------------- sweep and admission
class CapacityFleet(Fleet):
    """The fake fleet with one managed pool of 4-GPU nodes."""

    def __init__(self, *, policy: RemediationPolicy = POLICY, size: int = 3, created: float = NOW - 86400) -> None:
        super().__init__(policy=policy)
        self.names = [f"aks-gpu4-{i}" for i in range(size)]
        for name in self.names:
            self.kube.add(gpu_node(name, labels={"kubernetes.azure.com/agentpool": "gpu4"}, created=created))
        self.aks.add_pool(CLUSTER, "gpu4", {"count": size, "mode": "User", "vmSize": FOUR, "enableAutoScaling": False,
                                            "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}})

    def _grow(self, cluster_id: str, pool: str, props: Any) -> None:
        """A replacement of the 4-GPU size comes up whole (every GPU advertised)."""
        super()._grow(cluster_id, pool, props)
        newest = max((n for n in self.kube.nodes.values() if n.name.startswith(f"aks-{pool}-new")), key=lambda n: n.created)
        self.kube.nodes[newest.name] = msgspec.structs.replace(
            newest, labels={**newest.labels, "node.kubernetes.io/instance-type": FOUR},
            allocatable={**newest.allocatable, "nvidia.com/gpu": "4"}, capacity={**newest.capacity, "nvidia.com/gpu": "4"})

    def advertise(self, name: str, gpus: int | None) -> None:
        node = self.kube.nodes[name]
        alloc = {k: v for k, v in node.allocatable.items() if k != "nvidia.com/gpu"}
        if gpus is not None:
            alloc["nvidia.com/gpu"] = str(gpus)
        self.kube.nodes[name] = msgspec.structs.replace(node, allocatable=alloc)

    def unhealthy(self) -> list[dict[str, Any]]:
        return [e for e in self.events.delivered(UNHEALTHY_EVENT) if e["data"].get("signal") == "gpu-capacity"]

    def rows(self) -> list[str]:
        return [r.data["node"] for r in self.ledger.list(gpu_capacity.ROW_KIND)]


def test_a_gpu_lost_while_running_is_reported_after_the_threshold_and_admitted_for_restart_then_replace() -> None:
    fleet = CapacityFleet()
    node = fleet.names[1]
    fleet.advertise(node, 3)
    first = sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == [] and fleet.rows() == [node] and first.gpu_capacity["pending"] == 1
    assert first.next_check == NOW + 300
    fleet.clock.advance(300)
    report = sweep.sweep(fleet.ctx())
    [event] = fleet.unhealthy()
    data = event["data"]
    assert (data["node"], data["condition"], data["policy_row"], data["action"]) == (
        node, LOST.key, LOST.id, sp.RESTART_THEN_REPLACE)
    assert (data["expected"], data["advertised"]) == (4, 3) and report.gpu_capacity["faults"] == 1
    handled = admission.handle_event(event, fleet.ctx())
    assert handled.outcome == admission.Handling.ADMITTED, handled
    [record] = fleet.ledger.list(KIND)
    assert (record.data["signal"], record.data["policy_row"], record.data["ladder"]) == (
        "gpu-capacity", LOST.id, ["restart", "replace"])


def test_a_node_that_never_advertises_its_gpus_is_replaced_once_the_start_up_grace_has_passed() -> None:
    fleet = CapacityFleet()
    fleet.kube.add(gpu_node("aks-gpu4-new", gpus=None, created=NOW - 30, labels={"kubernetes.azure.com/agentpool": "gpu4"}))
    report = sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == [] and report.next_check == NOW - 30 + 600
    assert report.breaker == "closed" and "aks-gpu4-new" in fleet.rows()
    fleet.clock.advance(570)
    sweep.sweep(fleet.ctx())
    [event] = fleet.unhealthy()
    assert (event["data"]["condition"], event["data"]["policy_row"]) == (STARTUP.key, STARTUP.id)
    assert event["data"]["advertised"] is None
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    [record] = fleet.ledger.list(KIND)
    assert record.data["ladder"] == ["replace"] and record.data["condition"] == STARTUP.key


def test_new_nodes_still_in_their_grace_are_no_breaker_observations_but_lost_gpus_are() -> None:
    fleet = CapacityFleet(size=4)
    for i in range(3):
        fleet.kube.add(gpu_node(f"aks-gpu4-new{i}", gpus=None, created=NOW - 10,
                                labels={"kubernetes.azure.com/agentpool": "gpu4"}))
    fleet.advertise(fleet.names[0], 2)
    found = gpu_capacity.Sweeper(fleet.ctx(), POLICY)
    found.page(CLUSTER, list(fleet.kube.nodes.values()))
    assert list(found.finish().observations) == [gpu_capacity.node_key(CLUSTER, fleet.names[0])]


def test_a_node_whole_again_forgets_its_row_and_the_re_check_ignores_the_old_event() -> None:
    fleet = CapacityFleet()
    node = fleet.names[0]
    fleet.advertise(node, 0)
    sweep.sweep(fleet.ctx())
    fleet.clock.advance(300)
    sweep.sweep(fleet.ctx())
    [event] = fleet.unhealthy()
    fleet.advertise(node, 4)
    handled = admission.handle_event(event, fleet.ctx())
    assert handled.outcome == admission.Handling.IGNORED and "whole" in handled.detail
    sweep.sweep(fleet.ctx())
    assert fleet.rows() == [] and fleet.ledger.list(KIND) == []


def test_the_re_check_trusts_arm_over_the_node_a_mig_pool_is_never_judged() -> None:
    fleet = CapacityFleet()
    node = fleet.names[0]
    fleet.advertise(node, 1)
    sweep.sweep(fleet.ctx())
    fleet.clock.advance(300)
    sweep.sweep(fleet.ctx())
    [event] = fleet.unhealthy()
    fleet.aks.pool_props(CLUSTER, "gpu4")["gpuInstanceProfile"] = "MIG2g"
    handled = admission.handle_event(event, fleet.ctx())
    assert handled.outcome == admission.Handling.IGNORED and "MIG" in handled.detail
    assert fleet.ledger.list(KIND) == []


def test_an_event_no_sweep_backs_is_ignored() -> None:
    fleet = CapacityFleet()
    node = fleet.names[2]
    fleet.advertise(node, 0)
    forged = {"specversion": "1.0", "id": "x", "source": fleet.settings().event_source, "type": UNHEALTHY_EVENT,
              "data": {"cluster": CLUSTER, "node": node, "condition": LOST.key, "since": "2025-01-01T00:00:00Z",
                       "signal": "gpu-capacity"}}
    handled = admission.handle_event(forged, fleet.ctx())
    assert handled.outcome == admission.Handling.IGNORED and "no sweep has seen" in handled.detail
    assert fleet.ledger.list(KIND) == []


def test_rows_of_nodes_that_are_gone_are_removed_and_the_switch_turns_the_signal_off() -> None:
    fleet = CapacityFleet()
    fleet.advertise(fleet.names[0], 0)
    sweep.sweep(fleet.ctx())
    assert fleet.rows() == [fleet.names[0]]
    fleet.kube.remove_node(fleet.names[0])
    sweep.sweep(fleet.ctx())
    assert fleet.rows() == []
    off = CapacityFleet(policy=replace(POLICY, gpu_capacity=False))
    off.advertise(off.names[0], 0)
    sweep.sweep(off.ctx())
    off.clock.advance(3600)
    report = sweep.sweep(off.ctx())
    assert off.rows() == [] and off.unhealthy() == [] and report.gpu_capacity["judged"] == 0


def test_a_gpu_still_missing_after_the_restart_fails_its_verification_and_the_ladder_replaces_the_node() -> None:
    policy = replace(POLICY, cooldown_s=0, settle_s=0)
    fleet = CapacityFleet(policy=policy)
    node = fleet.names[1]
    fleet.advertise(node, 3)  # the restart will not bring it back (the fleet's reboot only resets conditions)
    sweep.sweep(fleet.ctx())
    fleet.clock.advance(300)
    sweep.sweep(fleet.ctx())
    [event] = fleet.unhealthy()
    assert admission.handle_event(event, fleet.ctx()).outcome == admission.Handling.ADMITTED
    states = run_until_settled(fleet)
    assert states == [State.DONE], states
    [record] = fleet.ledger.list(KIND)
    notes = [h["note"] for h in record.history]
    # Ready and "GPUs allocatable" after the restart, but 3 of 4: the node's size says so, not "done"
    assert any("GPUs not all back" in n and "3 of 4" in n for n in notes), notes
    assert record.data["target"] != node and node not in fleet.kube.nodes  # replaced
    assert [w[0] for w in fleet.compute.writes] == ["restart"]


STILL: list[tuple[str, NodeView, dict[str, Any], bool | None]] = [
    ("short", gpu_node("aks-gpu4-0", gpus=3, labels={"kubernetes.azure.com/agentpool": "gpu4"}), {}, True),
    ("whole", gpu_node("aks-gpu4-0", labels={"kubernetes.azure.com/agentpool": "gpu4"}), {}, False),
    ("MIG in ARM", gpu_node("aks-gpu4-0", gpus=1, labels={"kubernetes.azure.com/agentpool": "gpu4"}),
     {"gpuInstanceProfile": "MIG1g"}, None),
    ("pool gone from ARM", gpu_node("aks-gpu4-0", gpus=1, labels={"kubernetes.azure.com/agentpool": "nope"}), {}, None),
]


@pytest.mark.parametrize(("node", "pool_changes", "expected"), [s[1:] for s in STILL], ids=[s[0] for s in STILL])
def test_still_present_answers_from_the_node_and_arm(node: NodeView, pool_changes: dict[str, Any],
                                                     expected: bool | None) -> None:
    fleet = CapacityFleet()
    fleet.aks.pool_props(CLUSTER, "gpu4").update(pool_changes)
    present, why = gpu_capacity.still_present(fleet.ctx(), cluster_id=CLUSTER, node=node)
    assert present is expected and why


def test_a_node_whose_gpu_conditions_are_reported_late_counts_from_its_first_sighting() -> None:
    node = gpu_node(conditions=False, created=NOW - 100)
    assert judged(node).row is STARTUP
    reported = msgspec.structs.replace(node, conditions=(*node.conditions,
                                                         Condition(type=DEVICE_PLUGIN, status="False", transition=NOW)))
    assert judged(reported).state == WHOLE


def test_a_node_registered_again_under_the_same_name_starts_its_own_clock() -> None:
    fleet = CapacityFleet()
    node = fleet.names[0]
    fleet.advertise(node, 2)
    sweep.sweep(fleet.ctx())
    fleet.clock.advance(299)
    fleet.kube.nodes[node] = msgspec.structs.replace(fleet.kube.nodes[node], uid="uid-again")
    sweep.sweep(fleet.ctx())
    fleet.clock.advance(2)  # the first Node object's threshold has passed; the new one's has not
    sweep.sweep(fleet.ctx())
    assert fleet.unhealthy() == []
    [row] = fleet.ledger.list(gpu_capacity.ROW_KIND)
    assert (row.data["uid"], row.data["since"]) == ("uid-again", NOW + 299)


def test_every_node_losing_its_gpus_at_once_opens_the_breaker_before_anything_is_due() -> None:
    fleet = CapacityFleet(size=5)
    for name in fleet.names:
        fleet.advertise(name, 0)  # a device-plugin rollout empties allocatable everywhere
    report = sweep.sweep(fleet.ctx())
    assert report.breaker == "open" and fleet.unhealthy() == []
    fleet.clock.advance(300)
    sweep.sweep(fleet.ctx())
    events = fleet.unhealthy()
    assert len(events) == 5
    refused = [admission.handle_event(e, fleet.ctx()) for e in events]
    assert {h.outcome for h in refused} == {admission.Handling.REFUSED} and fleet.ledger.list(KIND) == []


def test_a_karpenter_node_is_judged_by_its_own_size_label() -> None:
    fleet = CapacityFleet()
    nap = msgspec.structs.replace(
        gpu_node("aks-nap-1", gpus=3, labels={"karpenter.sh/nodepool": "gpus"}),
        provider_id="azure:///subscriptions/s/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachines/aks-nap-1")
    assert gpu_capacity.still_present(fleet.ctx(), cluster_id=CLUSTER, node=nap)[0] is True

"""End-to-end: Azure Resource Health events drive remediation, through the local Functions host.

The simulator (scenarios/health_events.yaml) plays what Azure does to a node's VM: its Resource Health
state changes and the HealthResources system topic delivers the events through the Event Grid feed to
the ``health_events`` function, which maps the VM to its node through ARM, re-reads the availability
and admits (or records, or refuses) through the same admission as a condition fault. Each test acts on
its own pool, so any one of them passes alone; each waits for what it expects (a record's end, the
recorded events, the invocations ending), never for time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.kernel.ports import Record
from shared.remediation import records as remediation
from tests.e2e.test_remediation_e2e import BASE_SETTINGS, Fleet, assert_nothing_unsafe, is_ready, stack_for

__all__ = ["stack_for"]  # the class-scoped stack fixture, shared with the remediation e2e tests

CLUSTER = "e2e-health"
HOST = "host-1"
RECORDED = "Steward.Remediation.SignalRecorded"
DEGRADED_ANNOTATION = "VirtualMachinePossiblyDegradedDueToHardwareFailure"
SETTINGS = {"BUDGET_MAX_IN_FLIGHT": "10", "BREAKER_PERCENT": "90"}
STRANGER = ("/subscriptions/99999999-9999-4999-8999-999999999999/resourceGroups/mc_elsewhere/providers/"
            "Microsoft.Compute/virtualMachineScaleSets/aks-gpu-1-vmss/virtualMachines/0")


@pytest.fixture(scope="class")
def health(stack_for: Callable[..., Fleet]) -> Fleet:
    return stack_for(scenario="health_events", settings={**BASE_SETTINGS, **SETTINGS}, hosts=1)


def inject(fleet: Fleet, node: str, scenario: str, **extra: Any) -> str:
    answer = fleet.stack.control("POST", "/resource-health", {"cluster": CLUSTER, "node": node, "scenario": scenario,
                                                              **extra})
    return str(answer["vm"])


def first_node(fleet: Fleet, pool: str) -> str:
    nodes = fleet.wait(lambda: [n for n in fleet.pool_nodes(CLUSTER, pool) if is_ready(n)] or None, timeout=60,
                       what=f"a Ready node in {pool}")
    return str(nodes[0].metadata.name)


def ended(fleet: Fleet, node: str, *, timeout: float = 120) -> Record:
    def done() -> Record | None:
        records = fleet.records_of(node)
        return records[0] if len(records) == 1 and records[0].state in remediation.TERMINAL_STATES else None
    return fleet.wait(done, timeout=timeout, what=f"the remediation of {node} to end")


def recorded(fleet: Fleet, node: str, count: int) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        found = [e for e in fleet.events(RECORDED) if e.get("data", {}).get("node") == node]
        return found if len(found) >= count else None
    return fleet.wait(enough, timeout=90, what=f"{count} SignalRecorded events for {node}")


def record_events(fleet: Fleet, record: Record) -> set[str]:
    return {e["type"].rsplit(".", 1)[-1] for e in fleet.stack.published_events()
            if e.get("data", {}).get("remediation") == record.id}


class TestHealthEvents:
    """scenarios/health_events.yaml: one host, one pool per story."""

    def test_a_degraded_host_is_drained_ahead_of_its_failure(self, health: Fleet) -> None:
        trainer = health.wait(lambda: next((p for p in health.core(CLUSTER).list_namespaced_pod("ml").items
                                            if p.spec.node_name and p.status.phase == "Running"), None),
                              timeout=60, what="the trainer pod to run")
        node = str(trainer.spec.node_name)
        inject(health, node, "degraded-host")
        record = ended(health, node)
        d = record.data
        assert record.state == "done", health.describe([record])
        # A degraded host raises two events, the Degraded status and the annotation that says why. Event Grid
        # delivers in no particular order, so either may be the one admitted (the other joins it: one
        # remediation); both rows drain ahead of the failure and climb the usual ladder.
        assert d["signal"] == "resource-health"
        assert d["policy_row"] in {"health:availability:Degraded",
                                   "health:annotation:VirtualMachinePossiblyDegradedDueToHardwareFailure"}, d["policy_row"]
        assert d["ladder"] == ["restart", "reimage", "replace"] and d["ladder"][int(d["rung_index"])] == "restart"
        assert {"Admitted", "Cordoned", "Drained", "Recovered"} <= record_events(health, record)
        assert [r["rung"] for r in health.oracles()["repairs"] if r["node"] == node] == ["restart"]
        healed = health.node(CLUSTER, node)
        assert healed is not None and is_ready(healed) and not healed.spec.unschedulable  # our cordon lifted
        assert_nothing_unsafe(health.oracles())


    def test_a_host_crash_escalates_straight_to_replace(self, health: Fleet) -> None:
        node = first_node(health, "crashed")
        inject(health, node, "host-failure")
        record = ended(health, node, timeout=180)
        d = record.data
        assert record.state == "done", health.describe([record])
        assert (d["ladder"], d["policy_row"]) == (["replace"], "health:annotation:VirtualMachineHostCrashed")
        oracles = health.oracles()
        assert [r["rung"] for r in oracles["repairs"] if r["node"] == node] == []  # never restarted on the bad host
        assert node in [n["node"] for n in oracles["nodes_removed"]]
        assert_nothing_unsafe(oracles)


    def test_planned_maintenance_is_only_recorded(self, health: Fleet) -> None:
        node = first_node(health, "planned")
        inject(health, node, "planned-maintenance", down_s=10)
        events = recorded(health, node, 3)  # announced, Unavailable, Available again: three rows, three records
        rows = {e["data"].get("policy_row") for e in events}
        assert "health:annotation:VirtualMachineRebootInitiatedForPlannedMaintenance" in rows
        assert health.records_of(node) == []
        current = health.node(CLUSTER, node)
        assert current is not None and not current.spec.unschedulable


    def test_a_forged_event_for_a_vm_outside_the_fleet_touches_nothing(self, health: Fleet) -> None:
        before = health.ended(HOST, "health_events")
        requests = dict(health.oracles()["requests"])
        health.stack.control("POST", "/resource-health/forged", {"vm": STRANGER, "scenario": "host-failure"})
        health.wait(lambda: health.ended(HOST, "health_events") >= before + 2, timeout=60,
                    what="both forged events to be handled")
        assert [r for r in health.records() if STRANGER.lower() in str(r.data).lower()] == []
        assert [e for e in health.stack.published_events() if STRANGER.lower() in str(e).lower()] == []
        writes = {k: n for k, n in health.oracles()["requests"].items()
                  if not k.startswith("GET ") and n != requests.get(k, 0) and "eventgrid" not in k}
        assert not [k for k in writes if "virtualmachines" in k.lower() or "nodes" in k.lower()], writes


    def test_a_condition_fault_and_a_health_event_on_one_node_are_one_remediation(self, health: Fleet) -> None:
        node = health.flip(CLUSTER, "both", "UnhealthyNvidiaDevicePlugin", fixed_by="restart")
        health.wait(lambda: health.records_of(node) or None, timeout=90, what=f"the condition fault on {node} admitted")
        before = health.ended(HOST, "health_events")
        inject(health, node, "degraded-host")
        health.wait(lambda: health.ended(HOST, "health_events") >= before + 2, timeout=60,
                    what="both health events to be handled")
        record = ended(health, node)
        assert len(health.records_of(node)) == 1
        assert record.data["signal"] == "npd" and record.state == "done", health.describe([record])


    def test_a_degraded_host_annotation_during_a_customer_restart_is_only_recorded(self, health: Fleet) -> None:
        """A customer restart (Unavailable; ARM classes it Customer Initiated) and, meanwhile, a degraded-host
        annotation about the same VM (late, misrouted or forged): Unavailable alone would have confirmed it;
        the class ARM reports does not, so it is recorded "not confirmed" and nothing is touched."""
        nodes = health.wait(lambda: [n for n in health.pool_nodes(CLUSTER, "planned") if is_ready(n)][1:] or None,
                            timeout=60, what="a second Ready node in planned")
        node = str(nodes[-1].metadata.name)  # not first_node(): the planned-maintenance story's node
        vm = inject(health, node, "customer-restart", down_s=1200)
        health.stack.control("POST", "/resource-health/forged", {"vm": vm, "scenario": "annotation",
                                                                  "annotation": DEGRADED_ANNOTATION})
        row = f"health:annotation:{DEGRADED_ANNOTATION}"
        found = health.wait(lambda: [e for e in health.events(RECORDED) if e["data"].get("node") == node
                                     and e["data"].get("policy_row") == row] or None,
                            timeout=90, what=f"the degraded-host annotation on {node} recorded")
        note = str(found[0]["data"]["note"])
        assert "not confirmed" in note and "Customer Initiated" in note, note
        assert health.records_of(node) == []
        current = health.node(CLUSTER, node)
        assert current is not None and not current.spec.unschedulable

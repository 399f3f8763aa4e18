"""shared.remediation.health_events: every Resource Health row, and every way an event must not be trusted.

The fleet is tests/unit/fakes_remediation.py's (one cluster, one GPU pool, a real ledger, the real
admission); only Resource Health's current availability is added (:class:`HealthCompute`). Events are
built by sim/eventgrid/health_resources.py, the simulator's copy of the documented schema.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.kernel.errors import Forbidden, NotFound
from shared.kernel.ports import AvailabilityView
from shared.remediation import health_events, signal_policy
from shared.remediation.admission import Handling
from shared.remediation.records import KIND
from sim.eventgrid import health_resources as hr
from tests.unit.fakes_remediation import SUB, T0, FakeCompute, Fleet, vm_id

RECORDED_EVENT = "Steward.Remediation.SignalRecorded"


PLATFORM, UNPLANNED = signal_policy.PLATFORM_INITIATED, signal_policy.UNPLANNED


@dataclass
class HealthCompute(FakeCompute):
    """FakeCompute plus Resource Health: ``states[vm]`` is what ARM says now (Available by default);
    ``error`` is raised by every read when set."""

    states: dict[str, AvailabilityView] = field(default_factory=dict)
    forbidden: bool = False
    error: Exception | None = None
    reads: list[str] = field(default_factory=list)

    def get_availability(self, vm_resource_id: str) -> AvailabilityView:
        self.reads.append(vm_resource_id)
        if self.forbidden:
            raise Forbidden("AuthorizationFailed: Microsoft.ResourceHealth/availabilityStatuses/read")
        if self.error is not None:
            raise self.error
        node = vm_resource_id.rsplit("/", 1)[-1]
        if node not in self.fleet.kube.nodes:
            raise NotFound(vm_resource_id)
        return self.states.get(vm_resource_id.lower(), AvailabilityView(state="Available"))


def fleet_with(size: int = 3) -> tuple[Fleet, list[str]]:
    fleet = Fleet()
    names = fleet.pool(size)
    fleet.compute = HealthCompute(fleet)
    return fleet, names


def arm_says(fleet: Fleet, node: str, state: str, *, context: str = PLATFORM, category: str = UNPLANNED,
             **more: str) -> None:
    """ARM's current availability of ``node``'s VM: ``state``, classed ``context`` / ``category`` (a degraded
    host's class by default; the spec's other AvailabilityStatusProperties in ``more``)."""
    assert isinstance(fleet.compute, HealthCompute)
    fleet.compute.states[vm_id(node).lower()] = AvailabilityView(state=state, context=context, category=category,
                                                                 **more)


def event_for(row: signal_policy.HealthRow, vm: str, *, at: float = T0) -> dict[str, Any]:
    if row.event_type == signal_policy.AVAILABILITY_CHANGED:
        return hr.availability_changed(vm, state=row.key, previous="Available", at=at)
    return hr.resource_annotated(vm, annotation=row.key, at=at, reason="r", summary="s", context="c", category="g")


def remediations(fleet: Fleet) -> list[Any]:
    return fleet.ledger.list(KIND)


# --------------------------------------------------------------------------- every policy row
@pytest.mark.parametrize("row", signal_policy.HEALTH_TABLE, ids=lambda r: r.id)
def test_every_row_does_what_the_table_says_when_arm_confirms(row: signal_policy.HealthRow) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], "Degraded")
    handled = health_events.handle(event_for(row, vm_id(names[0])), fleet.ctx())
    records = remediations(fleet)
    if row.action == signal_policy.RECORD_ONLY:
        assert handled.outcome is Handling.RECORDED, handled.detail
        assert records == [] and fleet.cluster_writes() == []
        recorded = [e for e in fleet.events.published if e["type"] == RECORDED_EVENT]
        assert len(recorded) == 1 and row.id in str(recorded[0]["data"])
        return
    assert handled.outcome is Handling.ADMITTED, handled.detail
    assert len(records) == 1
    data = records[0].data
    assert (data["signal"], data["policy_row"], data["node"]) == ("resource-health", row.id, names[0])
    assert data["condition"] == f"ResourceHealth/{row.key}"
    expected = ["replace"] if row.action == signal_policy.REPLACE else list(fleet.policy.ladder)
    assert data["ladder"] == expected


@pytest.mark.parametrize("row", [r for r in signal_policy.HEALTH_TABLE if r.action != signal_policy.RECORD_ONLY],
                         ids=lambda r: r.id)
@pytest.mark.parametrize("now", ["Available", "Unknown"])
def test_an_acting_row_arm_does_not_confirm_is_only_recorded(row: signal_policy.HealthRow, now: str) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], now)
    handled = health_events.handle(event_for(row, vm_id(names[0])), fleet.ctx())
    assert handled.outcome is Handling.RECORDED, handled.detail
    assert remediations(fleet) == [] and fleet.cluster_writes() == []
    assert "not confirmed" in str(fleet.events.published[-1]["data"])


@pytest.mark.parametrize("arm", ["Degraded", "Unavailable"])
def test_degraded_is_confirmed_by_degraded_or_unavailable(arm: str) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[1], arm)
    event = hr.availability_changed(vm_id(names[1]), state="Degraded", previous="Available", at=T0)
    assert health_events.handle(event, fleet.ctx()).outcome is Handling.ADMITTED


def test_an_annotation_the_table_does_not_name_is_recorded_by_the_default_row() -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], "Unavailable")
    event = hr.resource_annotated(vm_id(names[0]), annotation="SomethingAzureAddsLater", at=T0, reason="r",
                                  summary="s", context="Platform Initiated", category="Unplanned")
    assert health_events.handle(event, fleet.ctx()).outcome is Handling.RECORDED
    assert "health:default:annotation" in str(fleet.events.published[-1]["data"])


# --------------------------------------------------------------------------- never trust the event alone
def _degraded(vm: str) -> dict[str, Any]:
    return hr.availability_changed(vm, state="Degraded", previous="Available", at=T0)


def _tamper_target(event: dict[str, Any], target: str) -> dict[str, Any]:
    out = copy.deepcopy(event)
    out["subject"] = target
    out["data"]["resourceInfo"]["properties"]["targetResourceId"] = target
    return out


FORGERIES = {
    "vm of another subscription": _degraded(
        "/subscriptions/99999999-9999-9999-9999-999999999999/resourceGroups/mc_rg/providers/Microsoft.Compute/"
        "virtualMachineScaleSets/vmss/virtualMachines/aks-gpu-0"),
    "vm of another resource group": _degraded(vm_id("aks-gpu-0").replace("/mc_rg/", "/someone_elses_rg/")),
    "vm that is no machine": _degraded(vm_id("aks-gpu-99")),
}
_DISK = f"/subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/disks/d1"
FORGERIES["not a vm"] = _tamper_target(_degraded(vm_id("aks-gpu-0")), _DISK)


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_an_event_that_does_not_resolve_to_a_fleet_node_touches_nothing(name: str) -> None:
    fleet, names = fleet_with()
    for n in names:
        arm_says(fleet, n, "Degraded")
    handled = health_events.handle(FORGERIES[name], fleet.ctx())
    assert handled.outcome is Handling.IGNORED, handled.detail
    assert remediations(fleet) == [] and fleet.cluster_writes() == [] and fleet.events.published == []
    assert fleet.compute.reads == []  # type: ignore[attr-defined]


def _tamper(event: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(event)
    cur = out
    for key in path[:-1]:
        cur = cur[key]
    if value is None:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return out


MALFORMED = {
    "wrong type": (("type",), "Microsoft.Resources.ResourceWriteSuccess"),
    "source of another subscription": (("source",), "/subscriptions/99999999-9999-9999-9999-999999999999"),
    "subject is not the target": (("subject",), vm_id("aks-gpu-1")),
    "no resourceInfo": (("data", "resourceInfo"), None),
    "no availabilityState": (("data", "resourceInfo", "properties", "availabilityState"), None),
    "occurredTime not a time": (("data", "resourceInfo", "properties", "occurredTime"), "yesterday"),
    "targetResourceId not a string": (("data", "resourceInfo", "properties", "targetResourceId"), 42),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_or_inconsistent_event_is_ignored(name: str) -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[0], "Degraded")
    path, value = MALFORMED[name]
    handled = health_events.handle(_tamper(_degraded(vm_id(names[0])), path, value), fleet.ctx())
    assert handled.outcome is Handling.IGNORED, handled.detail
    assert remediations(fleet) == [] and fleet.cluster_writes() == []


def test_a_node_whose_provider_id_names_another_vm_is_refused_with_an_event() -> None:
    fleet, names = fleet_with()
    fleet.aks.machine_ids[names[0]] = vm_id("elsewhere")  # ARM's VM for the node is not the one it claims
    arm_says(fleet, "elsewhere", "Degraded")
    handled = health_events.handle(_degraded(vm_id("elsewhere")), fleet.ctx())
    assert handled.outcome is Handling.REFUSED, handled.detail
    assert "ProviderIdMismatch" in handled.detail
    assert remediations(fleet) == []
    assert any(w[0] == "event" and "StewardRefused" in str(w) for w in fleet.kube.writes)


def test_availability_that_cannot_be_read_is_not_replaced_by_the_event() -> None:
    fleet, names = fleet_with()
    fleet.compute.forbidden = True  # type: ignore[attr-defined]
    handled = health_events.handle(_degraded(vm_id(names[0])), fleet.ctx())
    assert handled.outcome is Handling.IGNORED and "unreadable" in handled.detail
    assert remediations(fleet) == [] and fleet.cluster_writes() == []


def test_a_condition_fault_and_a_health_event_on_one_node_are_one_remediation() -> None:
    from tests.unit.fakes_remediation import unhealthy_event

    fleet, names = fleet_with()
    fleet.break_node(names[0], at=T0 - 600)
    assert fleet.handle(unhealthy_event(names[0], fleet=fleet)).startswith("admitted")
    arm_says(fleet, names[0], "Degraded")
    handled = health_events.handle(_degraded(vm_id(names[0])), fleet.ctx())
    assert handled.outcome is Handling.DUPLICATE, handled.detail
    assert len(remediations(fleet)) == 1


def test_the_degraded_host_pair_of_events_is_one_remediation() -> None:
    fleet, names = fleet_with()
    arm_says(fleet, names[2], "Degraded")
    outcomes = [health_events.handle(e, fleet.ctx()).outcome for e in hr.degraded_host(vm_id(names[2]), at=T0)]
    assert outcomes == [Handling.ADMITTED, Handling.DUPLICATE]
    assert len(remediations(fleet)) == 1


def test_a_redelivered_event_is_recorded_once() -> None:
    fleet, names = fleet_with()
    event = hr.resource_annotated(vm_id(names[0]), annotation="VirtualMachineRestarted", at=T0)
    assert health_events.handle(event, fleet.ctx()).outcome is Handling.RECORDED
    health_events.handle(event, fleet.ctx())
    assert [e["type"] for e in fleet.events.published] == [RECORDED_EVENT]


def test_the_cluster_of_a_node_resource_group_is_cached_but_read_again() -> None:
    fleet, names = fleet_with()
    calls: list[str] = []
    original = fleet.aks.list_clusters

    def counting(subscription: str) -> Any:
        calls.append(subscription)
        return original(subscription)

    fleet.aks.list_clusters = counting  # type: ignore[method-assign]
    ctx = fleet.ctx()
    for n in names:
        health_events.handle(hr.resource_annotated(vm_id(n), annotation="VirtualMachineRestarted", at=T0), ctx)
    assert calls == [SUB]
    fleet.update_cluster(tags={})  # the cluster leaves the scope: the cached mapping must not keep it in
    handled = health_events.handle(_degraded(vm_id(names[0])), ctx)
    assert handled.outcome is Handling.IGNORED

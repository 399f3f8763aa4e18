"""Azure Resource Health for the fleet's VMs: the current availability ARM serves, and the events the
HealthResources system topic delivers when it changes.

- **ARM** (a part of :class:`sim.arm.ArmApi`): ``GET {vmss vm id}/providers/Microsoft.ResourceHealth/
  availabilityStatuses/current`` (AvailabilityStatuses_GetByResource: Azure/azure-rest-api-specs
  specification/resourcehealth/resource-manager/Microsoft.ResourceHealth/ResourceHealth/AvailabilityStatus.tsp),
  on api-versions :data:`API_VERSIONS`, authorized like every ARM route (sim/armrbac.py: the action
  ``Microsoft.ResourceHealth/availabilityStatuses/read``, 403 ``AuthorizationFailed`` without it), 404 for a
  VM the scale set does not have. The body is the spec's ``AvailabilityStatus``: ``availabilityState``,
  ``summary``, ``reasonType``, ``occuredTime`` (the spec's spelling), ``reportedTime``.
- **State**: one entry per VM (``fleet.vm_health``, lower-cased VM id -> :class:`VmHealth`), Available since
  the VM exists until an injection changes it. A VM that goes (replace, scale-down) goes with its state.
- **Events**: :func:`inject` plays one of sim/health_resources.py's scenarios on a node's VM: each event
  changes the state when its time comes and is then delivered through the Event Grid feed as the system
  topic would deliver it (CloudEvents 1.0, ``source`` ``/subscriptions/<id>``, ``subject`` the VM id), to the
  subscribers whose subscription includes its type (sim/eventgrid.py). :func:`forge` delivers events about
  any VM without changing anything (what a forger with a publishing key could send).

Not modelled: the node's own behaviour under a degraded or crashed host (its Kubernetes state is left
as it is: the platform's repair, a reboot or a move to another host, is not played), and the history
list (``availabilityStatuses`` without ``/current``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sim import health_resources as hr
from sim.arm_common import ArmError
from sim.eventgrid import deliver_system_event
from sim.http import Request, Response
from sim.objects import iso

API_VERSIONS = ("2022-10-01", "2024-02-01", "2025-05-01")
"""Stable Microsoft.ResourceHealth api-versions (azure-rest-api-specs specification/resourcehealth)."""
ROUTE = "vm_availability"
ROUTE_PATTERN = (r"/providers/microsoft\.compute/virtualmachinescalesets/(?P<vmss>[^/]+)/virtualmachines/(?P<instance>[^/]+)"
                 r"/providers/microsoft\.resourcehealth/availabilitystatuses/current")
ACTION = "Microsoft.ResourceHealth/availabilityStatuses/read"
_REASON_TYPES = {"Degraded": "Unplanned", "Unavailable": "Unplanned", "Unknown": "", "Available": ""}


@dataclass
class VmHealth:
    state: str = "Available"
    since: float = 0.0
    summary: str = "There aren't any known Azure platform problems affecting this virtual machine."
    annotation: str = ""


#: What Resource Health shows for a state before any annotation says why (the portal's wording of each
#: availabilityState: https://learn.microsoft.com/azure/service-health/resource-health-overview#health-status).
_STATE_SUMMARY = {
    "Degraded": "Your virtual machine is degraded: its performance or availability is reduced.",
    "Unavailable": "Your virtual machine is unavailable.",
    "Unknown": "Resource Health hasn't received information about this virtual machine for more than 10 minutes.",
}


def _states(fleet: Any) -> dict[str, VmHealth]:
    states = getattr(fleet, "vm_health", None)
    if not isinstance(states, dict):
        states = {}
        fleet.vm_health = states
    return states


def vm_of(cluster: Any, node_name: str) -> str:
    """The VMSS VM id of a pool node (ARM's spelling, as the machines API returns it)."""
    node = cluster.nodes.get(node_name)
    if node is None or node.nap:
        raise KeyError(f"no scale-set node {node_name!r} in {cluster.name}")
    return str(cluster._vm_id(node.vmss, node.instance_id))


def current(fleet: Any, vm_id: str) -> VmHealth:
    """The VM's health: Available (since it was created) until an injection says otherwise."""
    return _states(fleet).get(vm_id.lower()) or VmHealth()


def _apply(fleet: Any, event: dict[str, Any]) -> None:
    """What the event says happens to the VM's state (an AvailabilityStatusChanged sets it)."""
    props = event["data"]["resourceInfo"]["properties"]
    vm = str(props["targetResourceId"]).lower()
    entry = _states(fleet).setdefault(vm, VmHealth(since=fleet.now()))
    if event["type"] == hr.AVAILABILITY_CHANGED:
        entry.state = str(props["availabilityState"])
        entry.since = fleet.now()
        if entry.state == "Available":
            entry.summary, entry.annotation = VmHealth().summary, ""
        else:  # the "no known problems" text of an Available VM no longer holds; the state's own words do
            entry.summary = str(props.get("summary") or _STATE_SUMMARY.get(entry.state, entry.summary))
    else:
        entry.annotation = str(props["annotationName"])
        entry.summary = str(props.get("summary") or entry.summary)


def _ids(fleet: Any) -> Any:
    return lambda: str(uuid.UUID(int=fleet.rng.getrandbits(128), version=4))


def _play(fleet: Any, events: list[dict[str, Any]], times: list[float], *, change_state: bool) -> None:
    for event, when in zip(events, times, strict=True):
        def happen(e: dict[str, Any] = event) -> None:
            if change_state:
                _apply(fleet, e)
            deliver_system_event(fleet, e)

        if when <= fleet.now():
            happen()
        else:
            fleet.at(when, happen)


def _scenario_events(vm: str, body: dict[str, Any], now: float, ids: Any) -> tuple[list[dict[str, Any]], list[float]]:
    """The events of ``body["scenario"]`` (sim/health_resources.py SCENARIOS), ``state`` or ``annotation``."""
    scenario = str(body.get("scenario") or "")
    if scenario in hr.SCENARIOS:
        timed = scenario in ("reboot-for-repair", "planned-maintenance") and "down_s" in body
        kwargs = {"down_s": float(body["down_s"])} if timed else {}
        events = hr.SCENARIOS[scenario](vm, at=now, ids=ids, **kwargs)
    elif scenario == "state":
        events = [hr.availability_changed(vm, state=str(body["state"]), previous=str(body.get("previous") or "Available"),
                                          at=now, ids=ids)]
    elif scenario == "annotation":
        texts = {k: body[k] for k in ("reason", "summary", "context", "category") if k in body}
        events = [hr.resource_annotated(vm, annotation=str(body["annotation"]), at=now, ids=ids, **texts)]
    else:
        raise ValueError(f"scenario must be one of {', '.join([*hr.SCENARIOS, 'state', 'annotation'])}, "
                         f"not {scenario!r}")
    times = [float(hr_time(e)) for e in events]
    return events, times


def hr_time(event: dict[str, Any]) -> float:
    """The event's ``occurredTime`` in epoch seconds (seven fractional digits: Python reads six of them)."""
    text = str(event["data"]["resourceInfo"]["properties"]["occurredTime"]).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def inject(fleet: Any, cluster: Any, node_name: str, body: dict[str, Any]) -> dict[str, Any]:
    """Play a scenario on a node's VM: the state changes and the events are delivered, each at its time."""
    vm = vm_of(cluster, node_name)
    events, times = _scenario_events(vm, body, fleet.now(), _ids(fleet))
    _play(fleet, events, times, change_state=True)
    return {"vm": vm, "events": [{"id": e["id"], "type": e["type"], "time": e["time"]} for e in events]}


def forge(fleet: Any, vm: str, body: dict[str, Any]) -> dict[str, Any]:
    """Deliver the events of a scenario about any VM id, changing nothing (a forged or misrouted event)."""
    events, times = _scenario_events(vm, body, fleet.now(), _ids(fleet))
    _play(fleet, events, times, change_state=False)
    return {"vm": vm, "events": [{"id": e["id"], "type": e["type"], "time": e["time"]} for e in events]}


def control(fleet: Any, method: str, sub: str, body: Any, cluster_of: Any) -> Response | None:
    """``/_sim/resource-health`` (POST {cluster, node, scenario[, state | annotation, down_s]}; GET ?cluster&node
    is in ``body`` as query args) and ``/_sim/resource-health/forged`` (POST {vm, scenario ...})."""
    if sub == "/resource-health/forged" and method == "POST":
        if not isinstance(body, dict) or "vm" not in body:
            return Response.json(400, {"error": {"code": "BadRequest", "message": "body must be {vm, scenario, ...}"}})
        return Response.json(202, forge(fleet, str(body["vm"]), body))
    if sub != "/resource-health":
        return None
    if not isinstance(body, dict) or "cluster" not in body or "node" not in body:
        return Response.json(400, {"error": {"code": "BadRequest", "message": "body must be {cluster, node, ...}"}})
    cluster = cluster_of(fleet, body)
    if str(body["node"]) not in cluster.nodes:
        return Response.json(404, {"error": {"code": "Error", "message": f"no node {body['node']!r} in {cluster.name}"}})
    if method == "GET" or body.get("scenario") is None:
        vm = vm_of(cluster, str(body["node"]))
        h = current(fleet, vm)
        return Response.json(200, {"vm": vm, "state": h.state, "since": h.since, "annotation": h.annotation})
    result = inject(fleet, cluster, str(body["node"]), body)
    fleet.settle()
    return Response.json(202, result)


class ResourceHealthReads:
    """Part of :class:`sim.arm.ArmApi`: the availability route (authorized and api-version-checked by ArmApi)."""

    fleet: Any

    def _r_vm_availability(self, request: Request, *, sub: str, rg: str, vmss: str, instance: str) -> Response:
        c = self._cluster_by_node_rg(sub, rg)  # type: ignore[attr-defined]
        node = c.node_by_vmss_instance(vmss, instance) if c is not None else None
        if c is None or node is None:
            raise ArmError(404, "ResourceNotFound",
                           f"The Resource 'Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{instance}' "
                           f"under resource group '{rg}' was not found. For more details please go to "
                           "https://aka.ms/ARMResourceNotFoundFix")
        vm = str(c._vm_id(c.nodes[node].vmss, c.nodes[node].instance_id))
        h = current(self.fleet, vm)
        known = vm.lower() in _states(self.fleet)
        occurred = iso(h.since) if known else str(c.nodes[node].obj["metadata"].get("creationTimestamp") or "")
        body = {
            "id": f"{vm}/providers/Microsoft.ResourceHealth/availabilityStatuses/current",
            "name": "current", "type": "Microsoft.ResourceHealth/AvailabilityStatuses", "location": c.location,
            "properties": {"availabilityState": h.state, "summary": h.summary, "reasonType": _REASON_TYPES.get(h.state, ""),
                           "occuredTime": occurred, "reportedTime": iso(self.fleet.now())},
        }
        return Response.json(200, body)

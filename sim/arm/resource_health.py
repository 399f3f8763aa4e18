"""Azure Resource Health for the fleet's VMs: the current availability ARM serves, and the events the
HealthResources system topic delivers when it changes.

- **ARM** (a part of :class:`sim.arm.api.ArmApi`): ``GET {vmss vm id}/providers/Microsoft.ResourceHealth/
  availabilityStatuses/current`` (AvailabilityStatuses_GetByResource: Azure/azure-rest-api-specs
  specification/resourcehealth/resource-manager/Microsoft.ResourceHealth/ResourceHealth/AvailabilityStatus.tsp),
  on api-versions :data:`API_VERSIONS`, authorized like every ARM route (sim/arm/rbac.py: the action
  ``Microsoft.ResourceHealth/availabilityStatuses/read``, 403 ``AuthorizationFailed`` without it), 404 for a
  VM the scale set does not have. The body is the spec's ``AvailabilityStatus`` (``AvailabilityStatusProperties``
  in .../ResourceHealth/models.tsp; example stable/2025-05-01/examples/AvailabilityStatus_GetByResource.json):
  ``availabilityState``, ``title``, ``summary``, ``reasonType``, ``occuredTime`` (the spec's spelling),
  ``reportedTime``, and while the VM is not Available the class of why: ``context`` ("triggered by a customer
  or the platform": Platform Initiated, Customer Initiated, VM Initiated) and ``category`` (Planned /
  Unplanned / Not Applicable), as the GetByResource example reports them; ``reasonType`` follows the class
  (the spec's ReasonTypeValues: Unplanned, Planned, UserInitiated). Back to Available after an Unplanned
  outage, ``recentlyResolved`` (``unavailableOccuredTime``, ``resolvedTime``, ``unavailableSummary``).
- **Class** (modelled, not documented as such): the current status carries the Context and Category of the
  annotation that said why (the page lists each annotation's, and says they appear in Resource Health); a
  Degraded or Unavailable state that no annotation explained is Platform Initiated / Unplanned (or what
  the ``state`` injection names). So a degraded host reports Platform Initiated / Unplanned and a customer
  restart (scenario ``customer-restart``) Customer Initiated / Not Applicable.
- **State**: one entry per VM (``fleet.vm_health``, lower-cased VM id -> :class:`VmHealth`), Available since
  the VM exists until an injection changes it. A VM that goes (replace, scale-down) goes with its state.
- **Events**: :func:`inject` plays one of sim/eventgrid/health_resources.py's scenarios on a node's VM: each event
  changes the state when its time comes and is then delivered through the Event Grid feed as the system
  topic would deliver it (CloudEvents 1.0, ``source`` ``/subscriptions/<id>``, ``subject`` the VM id), to the
  subscribers whose subscription includes its type (sim/eventgrid/api.py). :func:`forge` delivers events about
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

from sim.arm.common import ArmError
from sim.core.http import Request, Response
from sim.eventgrid import health_resources as hr
from sim.eventgrid.api import deliver_system_event
from sim.kube.objects import iso

API_VERSIONS = ("2022-10-01", "2024-02-01", "2025-05-01")
"""Stable Microsoft.ResourceHealth api-versions (azure-rest-api-specs specification/resourcehealth)."""
ROUTE = "vm_availability"
ROUTE_PATTERN = (r"/providers/microsoft\.compute/virtualmachinescalesets/(?P<vmss>[^/]+)/virtualmachines/(?P<instance>[^/]+)"
                 r"/providers/microsoft\.resourcehealth/availabilitystatuses/current")
ACTION = "Microsoft.ResourceHealth/availabilityStatuses/read"
#: reasonType (the spec's ReasonTypeValues) of a class (context, category).
_REASON_TYPES = {(hr.PLATFORM, hr.UNPLANNED): "Unplanned", (hr.PLATFORM, hr.PLANNED): "Planned",
                 (hr.CUSTOMER, hr.NOT_APPLICABLE): "UserInitiated"}
_DEFAULT_CLASS = (hr.PLATFORM, hr.UNPLANNED)


@dataclass
class VmHealth:
    state: str = "Available"
    since: float = 0.0
    summary: str = "There aren't any known Azure platform problems affecting this virtual machine."
    annotation: str = ""
    context: str = ""
    category: str = ""
    resolved: dict[str, str] | None = None  # recentlyResolved, after an Unplanned outage


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


def _apply(fleet: Any, event: dict[str, Any], arm_class: tuple[str, str] | None = None) -> None:
    """What the event says happens to the VM's state (an AvailabilityStatusChanged sets it; an annotation
    says why, and its context and category become the status's class). ``arm_class``: the class a ``state``
    injection names for ARM (the event itself carries none)."""
    props = event["data"]["resourceInfo"]["properties"]
    vm = str(props["targetResourceId"]).lower()
    entry = _states(fleet).setdefault(vm, VmHealth(since=fleet.now()))
    if event["type"] == hr.AVAILABILITY_CHANGED:
        was, was_class, was_since, was_summary = entry.state, (entry.context, entry.category), entry.since, entry.summary
        entry.state = str(props["availabilityState"])
        entry.since = fleet.now()
        if entry.state == "Available":
            entry.summary, entry.annotation, entry.context, entry.category = VmHealth().summary, "", "", ""
            if was == "Unavailable" and _REASON_TYPES.get(was_class) == "Unplanned":
                entry.resolved = {"unavailableOccuredTime": iso(was_since), "resolvedTime": iso(entry.since),
                                  "unavailableSummary": was_summary}
        else:  # the "no known problems" text of an Available VM no longer holds; the state's own words do
            entry.summary = str(props.get("summary") or _STATE_SUMMARY.get(entry.state, entry.summary))
            entry.resolved = None
            if arm_class is not None:
                entry.context, entry.category = arm_class
            elif entry.state == "Unknown":  # no signal from the platform: nothing to class
                entry.context, entry.category = "", ""
            elif not entry.context:  # no annotation said why (yet)
                entry.context, entry.category = _DEFAULT_CLASS
    else:
        entry.annotation = str(props["annotationName"])
        entry.summary = str(props.get("summary") or entry.summary)
        entry.context, entry.category = str(props.get("context") or ""), str(props.get("category") or "")


def _ids(fleet: Any) -> Any:
    return lambda: str(uuid.UUID(int=fleet.rng.getrandbits(128), version=4))


def _play(fleet: Any, events: list[dict[str, Any]], times: list[float], *, change_state: bool,
          arm_class: tuple[str, str] | None = None) -> None:
    for event, when in zip(events, times, strict=True):
        def happen(e: dict[str, Any] = event) -> None:
            if change_state:
                _apply(fleet, e, arm_class)
            deliver_system_event(fleet, e)

        if when <= fleet.now():
            happen()
        else:
            fleet.at(when, happen)


def _arm_class(body: dict[str, Any]) -> tuple[str, str] | None:
    """The class a ``state`` injection names for ARM (``context`` and ``category``), if any."""
    if body.get("scenario") != "state" or "context" not in body:
        return None
    return str(body["context"]), str(body.get("category") or "")


def _scenario_events(vm: str, body: dict[str, Any], now: float, ids: Any) -> tuple[list[dict[str, Any]], list[float]]:
    """The events of ``body["scenario"]`` (sim/eventgrid/health_resources.py SCENARIOS), ``state`` or ``annotation``."""
    scenario = str(body.get("scenario") or "")
    if scenario in hr.SCENARIOS:
        timed = scenario in ("reboot-for-repair", "planned-maintenance", "customer-restart") and "down_s" in body
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
    _play(fleet, events, times, change_state=True, arm_class=_arm_class(body))
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
        return Response.json(200, {"vm": vm, "state": h.state, "since": h.since, "annotation": h.annotation,
                                   "context": h.context, "category": h.category})
    result = inject(fleet, cluster, str(body["node"]), body)
    fleet.settle()
    return Response.json(202, result)


class ResourceHealthReads:
    """Part of :class:`sim.arm.api.ArmApi`: the availability route (authorized and api-version-checked by ArmApi)."""

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
            "properties": {"availabilityState": h.state, "title": h.state, "summary": h.summary,
                           "reasonType": _REASON_TYPES.get((h.context, h.category), "") if h.state != "Available" else "",
                           "occuredTime": occurred, "reportedTime": iso(self.fleet.now())},
        }
        if h.state != "Available" and h.context:
            body["properties"].update({"context": h.context, "category": h.category})
        if h.state == "Available" and h.resolved:
            body["properties"]["recentlyResolved"] = dict(h.resolved)
        return Response.json(200, body)

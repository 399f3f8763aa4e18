"""The simulator's Azure Resource Health: the ARM availability route, the per-VM state injections change,
and HealthResources events delivered through the Event Grid feed as the system topic would deliver them.

In process (sim.arm.api.ArmApi, sim.core.control.ControlApi, sim.eventgrid.api.EventGridApi over one fleet, manual clock).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.arm.api import ArmApi
from sim.core.control import ControlApi
from sim.core.http import Headers, Request, Response
from sim.eventgrid.api import EventGridApi
from sim.eventgrid.health_resources import AVAILABILITY_CHANGED, RESOURCE_ANNOTATED
from sim.identity import APP_PRINCIPAL_ID
from sim.scenario import build_fleet

SUB = "00000000-0000-0000-0000-0000000000e1"
ARM = "https://management.azure.com/"
ACTION = "Microsoft.ResourceHealth/availabilityStatuses/read"
HEALTH_TYPES = f"{AVAILABILITY_CHANGED},{RESOURCE_ANNOTATED}"
SCENARIO: dict[str, Any] = {
    "seed": 3, "clock": {"manual": True}, "timings": {"node_ready_s": 1},
    "subscriptions": [{"id": SUB, "clusters": [{
        "name": "k1", "resource_group": "rg-k1", "tags": {"gpu-fleet-steward": "enabled"},
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                  {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 2}]}]}],
}


class World:
    def __init__(self) -> None:
        self.fleet = build_fleet(SCENARIO)
        self.fleet.advance(5)
        cluster = self.fleet.cluster_by_name("k1")
        assert cluster is not None
        self.cluster = cluster
        self.arm = ArmApi(self.fleet)
        self.control = ControlApi(self.fleet)
        self.feed = EventGridApi(self.fleet)
        self.token = self.fleet.tokens.issue(ARM, principal=APP_PRINCIPAL_ID, client_id="c", groups=())[0]
        self.node = sorted(n for n in self.cluster.nodes if "gpu" in n)[0]

    def vm(self, node: str | None = None) -> str:
        return str(self.cluster.machines(self.cluster.pools["gpu"])[0 if node is None else 1]["resourceId"])

    def availability(self, vm: str, *, api_version: str = "2025-05-01") -> Response:
        path = f"{vm}/providers/Microsoft.ResourceHealth/availabilityStatuses/current?api-version={api_version}"
        return self.arm.handle(Request("GET", path, Headers({"Host": "h", "Authorization": f"Bearer {self.token}"}), b""))

    def sim(self, method: str, path: str, body: Any = None) -> Response:
        payload = json.dumps(body).encode() if body is not None else b""
        return self.control.handle(Request(method, f"/_sim{path}", Headers({"Host": "h"}), payload))

    def deliveries(self, subscriber: str, types: str = HEALTH_TYPES) -> list[dict[str, Any]]:
        resp = self.feed.handle(Request("GET", f"/eventgrid/_deliveries?subscriber={subscriber}&max=20&types={types}",
                                        Headers({}), b""))
        return [d["event"] for d in json.loads(resp.body)["deliveries"]]


@pytest.fixture
def world() -> World:
    return World()


def _state(resp: Response) -> str:
    assert resp.status == 200, resp.body
    return str(json.loads(resp.body)["properties"]["availabilityState"])


def test_a_vm_is_available_until_something_happens(world: World) -> None:
    resp = world.availability(world.vm())
    body = json.loads(resp.body)
    assert _state(resp) == "Available"
    assert body["name"] == "current" and body["id"].endswith("/providers/Microsoft.ResourceHealth/availabilityStatuses/current")
    assert {"summary", "reasonType", "occuredTime", "reportedTime"} <= set(body["properties"])


def test_without_the_read_permission_arm_refuses(world: World) -> None:
    world.fleet.revoked_arm_actions.add(ACTION)
    resp = world.availability(world.vm())
    err = json.loads(resp.body)["error"]
    assert (resp.status, err["code"]) == (403, "AuthorizationFailed") and ACTION in err["message"]


def test_an_unknown_vm_is_not_found_and_a_bad_api_version_is_refused(world: World) -> None:
    assert world.availability(world.vm().rsplit("/", 1)[0] + "/999").status == 404
    # ARM authorizes before the resource provider looks: a VM outside the app's assignments is a 403
    assert world.availability(world.vm().replace(SUB, "00000000-0000-0000-0000-000000000bad")).status == 403
    resp = world.availability(world.vm(), api_version="2026-08-01")
    assert (resp.status, json.loads(resp.body)["error"]["code"]) == (400, "InvalidApiVersionParameter")


def test_a_degraded_host_changes_the_state_and_delivers_both_events_to_health_subscribers(world: World) -> None:
    resp = world.sim("POST", "/resource-health", {"cluster": "k1", "node": world.node, "scenario": "degraded-host"})
    assert resp.status == 202, resp.body
    vm = json.loads(resp.body)["vm"]
    assert _state(world.availability(vm)) == "Degraded"
    events = world.deliveries("health_events")
    assert [e["type"] for e in events] == [AVAILABILITY_CHANGED, RESOURCE_ANNOTATED]
    for e in events:
        assert e["specversion"] == "1.0" and e["source"] == f"/subscriptions/{SUB}" and e["subject"] == vm
    # a subscriber of other types never sees them, and they are not the app's own publications
    assert world.deliveries("remediation_events", types="Steward.GpuNode.Unhealthy") == []
    assert world.feed.published == []


def test_a_reboot_for_repair_comes_back_available_when_its_time_comes(world: World) -> None:
    body = {"cluster": "k1", "node": world.node, "scenario": "reboot-for-repair", "down_s": 60}
    vm = json.loads(world.sim("POST", "/resource-health", body).body)["vm"]
    assert _state(world.availability(vm)) == "Unavailable"
    assert len(world.deliveries("health_events")) == 2
    world.fleet.advance(61)
    assert _state(world.availability(vm)) == "Available"
    [back] = world.deliveries("health_events")
    assert back["data"]["resourceInfo"]["properties"]["availabilityState"] == "Available"


def test_a_state_or_an_annotation_can_be_injected_by_name(world: World) -> None:
    vm = json.loads(world.sim("POST", "/resource-health", {"cluster": "k1", "node": world.node, "scenario": "state",
                                                           "state": "Unknown"}).body)["vm"]
    assert _state(world.availability(vm)) == "Unknown"
    world.sim("POST", "/resource-health", {"cluster": "k1", "node": world.node, "scenario": "annotation",
                                           "annotation": "VirtualMachineHostCrashed"})
    names = [e["data"]["resourceInfo"]["properties"].get("annotationName") for e in world.deliveries("health_events")]
    assert names == [None, "VirtualMachineHostCrashed"]


def test_a_forged_event_is_delivered_but_changes_nothing(world: World) -> None:
    stranger = ("/subscriptions/99999999-9999-9999-9999-999999999999/resourceGroups/mc_x/providers/Microsoft.Compute/"
                "virtualMachineScaleSets/vmss/virtualMachines/0")
    resp = world.sim("POST", "/resource-health/forged", {"vm": stranger, "scenario": "host-failure"})
    assert resp.status == 202, resp.body
    assert [e["subject"] for e in world.deliveries("health_events")] == [stranger, stranger]
    assert _state(world.availability(world.vm())) == "Available"


@pytest.mark.parametrize("body", [{"cluster": "k1", "node": "nope", "scenario": "degraded-host"},
                                  {"cluster": "k1", "node": "X", "scenario": "sunny-day"}])
def test_bad_injections_are_refused(world: World, body: dict[str, Any]) -> None:
    if body["node"] == "X":
        body = {**body, "node": world.node}
    assert world.sim("POST", "/resource-health", body).status in (400, 404)
    assert world.deliveries("health_events") == []


# --------------------------------------------------------------------------- the class ARM reports (issue 18)
def _props(resp: Response) -> dict[str, Any]:
    assert resp.status == 200, resp.body
    return dict(json.loads(resp.body)["properties"])


def test_a_degraded_host_is_classed_platform_initiated_unplanned_as_the_getbyresource_example(world: World) -> None:
    vm = json.loads(world.sim("POST", "/resource-health", {"cluster": "k1", "node": world.node,
                                                           "scenario": "degraded-host"}).body)["vm"]
    props = _props(world.availability(vm))
    assert (props["availabilityState"], props["context"], props["category"], props["reasonType"]) == (
        "Degraded", "Platform Initiated", "Unplanned", "Unplanned")
    assert props["title"] == "Degraded"


def test_a_customer_restart_is_classed_customer_initiated_and_resolves_without_recently_resolved(world: World) -> None:
    body = {"cluster": "k1", "node": world.node, "scenario": "customer-restart", "down_s": 30}
    vm = json.loads(world.sim("POST", "/resource-health", body).body)["vm"]
    props = _props(world.availability(vm))
    assert (props["availabilityState"], props["context"], props["category"], props["reasonType"]) == (
        "Unavailable", "Customer Initiated", "Not Applicable", "UserInitiated")
    names = [e["data"]["resourceInfo"]["properties"].get("annotationName") for e in world.deliveries("health_events")]
    assert names == ["VirtualMachineRestarted", None]
    world.fleet.advance(31)
    props = _props(world.availability(vm))
    assert props["availabilityState"] == "Available" and "context" not in props and "recentlyResolved" not in props


def test_an_unplanned_outage_that_ends_is_recently_resolved(world: World) -> None:
    body = {"cluster": "k1", "node": world.node, "scenario": "reboot-for-repair", "down_s": 60}
    vm = json.loads(world.sim("POST", "/resource-health", body).body)["vm"]
    world.fleet.advance(61)
    props = _props(world.availability(vm))
    assert set(props["recentlyResolved"]) == {"unavailableOccuredTime", "resolvedTime", "unavailableSummary"}


def test_a_state_injection_may_name_the_class_arm_reports(world: World) -> None:
    body = {"cluster": "k1", "node": world.node, "scenario": "state", "state": "Unavailable",
            "context": "Platform Initiated", "category": "Planned"}
    vm = json.loads(world.sim("POST", "/resource-health", body).body)["vm"]
    props = _props(world.availability(vm))
    assert (props["context"], props["category"], props["reasonType"]) == ("Platform Initiated", "Planned", "Planned")
    unknown = {"cluster": "k1", "node": world.node, "scenario": "state", "state": "Unknown"}
    world.sim("POST", "/resource-health", unknown)
    assert "context" not in _props(world.availability(vm))


def test_every_page_annotation_can_be_injected_and_classes_the_state(world: World) -> None:
    from sim.eventgrid.health_resources import PAGE

    world.sim("POST", "/resource-health", {"cluster": "k1", "node": world.node, "scenario": "state",
                                           "state": "Unavailable"})
    for name, (context, category, _impact) in PAGE.items():
        resp = world.sim("POST", "/resource-health", {"cluster": "k1", "node": world.node, "scenario": "annotation",
                                                      "annotation": name})
        assert resp.status == 202, (name, resp.body)
        props = _props(world.availability(json.loads(resp.body)["vm"]))
        assert (props["context"], props["category"]) == (context, category), name

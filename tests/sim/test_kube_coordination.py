"""Leases (optimistic concurrency), events (both APIs), namespaces and discovery."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.testing import SimHandle, start_sim

SCENARIO: dict[str, Any] = {
    "seed": 4,
    "clock": {"speed": 10},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000c1", "clusters": [{
        "name": "coord", "resource_group": "rg-coord",
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=4) as handle:
        yield handle


@pytest.fixture(scope="module")
def api(sim: SimHandle) -> client.ApiClient:
    return sim.kube_client("coord")


def test_a_lease_update_with_a_stale_resource_version_is_a_409_conflict(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="steward-node-x"),
                           spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=30))
    created = leases.create_namespaced_lease("kube-node-lease", lease)
    created.spec.holder_identity = "b"
    updated = leases.replace_namespaced_lease("steward-node-x", "kube-node-lease", created)
    assert updated.spec.holder_identity == "b"
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    created.spec.holder_identity = "c"  # still carries the old resourceVersion
    with pytest.raises(ApiException) as e:
        leases.replace_namespaced_lease("steward-node-x", "kube-node-lease", created)
    assert e.value.status == 409
    assert "the object has been modified" in e.value.body
    assert leases.read_namespaced_lease("steward-node-x", "kube-node-lease").spec.holder_identity == "b"


def test_creating_a_lease_twice_is_a_409_already_exists(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="twice"), spec=client.V1LeaseSpec(holder_identity="a"))
    leases.create_namespaced_lease("default", lease)
    with pytest.raises(ApiException) as e:
        leases.create_namespaced_lease("default", lease)
    assert e.value.status == 409
    leases.delete_namespaced_lease("twice", "default")
    with pytest.raises(ApiException) as gone:
        leases.read_namespaced_lease("twice", "default")
    assert gone.value.status == 404


def test_core_events_are_created_and_listed(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    node = core.list_node().items[0].metadata.name
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="steward-"), reason="Cordoned", message="cordoned by steward",
        type="Normal", involved_object=client.V1ObjectReference(kind="Node", name=node),
        source=client.V1EventSource(component="gpu-fleet-steward"))
    created = core.create_namespaced_event("default", event)
    assert created.metadata.name.startswith("steward-")
    listed = core.list_namespaced_event("default").items
    assert any(e.reason == "Cordoned" and e.involved_object.name == node for e in listed)


def test_events_k8s_io_events_are_created_and_listed(api: client.ApiClient) -> None:
    events = client.EventsV1Api(api)
    body = client.EventsV1Event(
        metadata=client.V1ObjectMeta(name="steward-drain.1"), event_time=dt.datetime.now(dt.UTC),
        reason="Drained", note="drained", type="Normal", action="Drain", reporting_controller="gpu-fleet-steward",
        reporting_instance="steward-0", regarding=client.V1ObjectReference(kind="Node", name="n1"))
    events.create_namespaced_event("default", body)
    assert [e.reason for e in events.list_namespaced_event("default").items] == ["Drained"]


def test_namespaces_are_listed_created_and_read(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    names = {n.metadata.name for n in core.list_namespace().items}
    assert {"default", "kube-system", "kube-node-lease"} <= names
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-a")))
    assert core.read_namespace("team-a").status.phase == "Active"


def test_discovery_lists_the_eviction_subresource_and_the_groups(api: client.ApiClient) -> None:
    core_resources = client.CoreV1Api(api).get_api_resources().resources
    assert any(r.name == "pods/eviction" and r.group == "policy" and r.kind == "Eviction" for r in core_resources)
    assert any(r.name == "nodes/status" for r in core_resources)
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"apps", "batch", "policy", "coordination.k8s.io", "events.k8s.io"} <= groups
    assert "karpenter.sh" not in groups  # not a node auto-provisioning cluster
    assert client.VersionApi(api).get_code().git_version == "v1.32.4"

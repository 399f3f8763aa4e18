"""A Node created through the API, as a cluster admin can: stored as posted, backed by no VM.

kubernetes/kubernetes pkg/registry/core/node/strategy.go ``PrepareForCreate``: "Nodes allow *all*
fields, including status, to be set on create". So a forged Node carries whatever labels, providerID
and conditions its author wrote; ARM's machines API keeps listing only the VMs AKS made.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.testing import SimHandle, start_sim

SUB = "00000000-0000-0000-0000-0000000000r1"
SCENARIO: dict[str, Any] = {
    "seed": 5,
    "clock": {"speed": 20},
    "timings": {"node_ready_s": 1},
    "subscriptions": [{"id": SUB, "clusters": [
        {"name": "own", "resource_group": "rg-own", "location": "eastus", "tags": {"gpu-fleet-steward": "enabled"},
         "pools": [{"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 1}]},
        {"name": "victim", "resource_group": "rg-victim", "location": "eastus",
         "pools": [{"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 1}]},
    ]}],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=5) as handle:
        yield handle


def arm_get(sim: SimHandle, path: str) -> dict[str, Any]:
    base = sim.endpoints["arm_endpoint"]
    req = urllib.request.Request(f"{base}{path}?api-version=2026-08-01",
                                 headers={"Authorization": f"Bearer {sim.token('https://management.azure.com/')}"})
    ctx = ssl.create_default_context(cafile=sim.ca_bundle)
    with urllib.request.urlopen(req, context=ctx) as resp:
        return json.loads(resp.read())


def forged_node(victim_vm: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "aks-gpu-forged-vmss000009",
                         "labels": {"kubernetes.azure.com/agentpool": "gpu", "kubernetes.azure.com/accelerator": "nvidia"}},
            "spec": {"providerID": "azure://" + victim_vm},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2025-12-01T00:00:00Z"},
                {"type": "UnhealthyNvidiaDevicePlugin", "status": "True", "lastTransitionTime": "2025-12-01T00:00:00Z"}],
                "allocatable": {"nvidia.com/gpu": "1"}, "capacity": {"nvidia.com/gpu": "1"}}}


def test_a_node_posted_by_an_admin_is_stored_as_posted_and_arm_does_not_list_it(sim: SimHandle) -> None:
    own, victim = client.CoreV1Api(sim.kube_client("own")), client.CoreV1Api(sim.kube_client("victim"))
    [victim_node] = victim.list_node(label_selector="kubernetes.azure.com/agentpool=gpu").items
    created = own.create_node(forged_node(victim_node.spec.provider_id[len("azure://"):]))
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    read = own.read_node("aks-gpu-forged-vmss000009")
    assert read.spec.provider_id == victim_node.spec.provider_id  # whatever the poster wrote
    assert {c.type: c.status for c in read.status.conditions}["UnhealthyNvidiaDevicePlugin"] == "True"
    assert "aks-gpu-forged-vmss000009" in {n.metadata.name for n in own.list_node(
        label_selector="kubernetes.azure.com/accelerator=nvidia").items}
    own_id = sim.cluster("own")["id"]
    machines = arm_get(sim, f"{own_id}/agentPools/gpu/machines")["value"]
    assert [m["name"] for m in machines] != [] and "aks-gpu-forged-vmss000009" not in [m["name"] for m in machines]
    with pytest.raises(ApiException) as exc:
        own.create_node(forged_node("x"))
    assert exc.value.status == 409  # AlreadyExists, as for any object

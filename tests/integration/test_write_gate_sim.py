"""The write gate (shared.fleet.gate) and ARM's If-Match, with the real adapters against the simulator (issue 11).

Every write through the wired access (shared.wiring.FleetAccess) re-checks at the point of the call
that the cluster is in scope and not paused, and that a VM sits in its cluster's node resource group:
each refusal happens before any request reaches the server, which the simulator's request counts
show. Agent pool PUT and DELETE honour If-Match as AKS does (412 PreconditionFailed, raised as Conflict).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.errors import Conflict
from shared.settings import Settings

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app
from tests.waiting import wait_until

SUB = "8f2d4c1e-5a3b-4c7d-9e0f-0000000000a1"
_POOLS = [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
          {"name": "gpu", "mode": "User", "vmSize": "Standard_NC8as_T4_v3", "count": 2,
           "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}}]


def _gpu(count: int) -> dict[str, Any]:
    return {k: v for k, v in _POOLS[1].items() if k != "name"} | {"count": count}


def _cluster(name: str, tags: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "resource_group": f"rg-{name}", "location": "eastus", "tags": tags, "pools": _POOLS}


SCENARIO = {
    "seed": 7,
    "clock": {"speed": 1.0},
    "timings": {"pool_create_s": 1, "pool_scale_s": 1, "pool_delete_s": 1, "node_ready_s": 1, "lro_retry_after_s": 1},
    "subscriptions": [{
        "id": SUB,
        "quotas": [{"location": "eastus", "family": "standardNCASv3_T4Family", "limit": 200},
                   {"location": "eastus", "family": "standardDSv5Family", "limit": 200}],
        "clusters": [
            _cluster("gate-ok", {"gpu-fleet-steward": "enabled"}),
            _cluster("gate-paused", {"gpu-fleet-steward": "enabled", "gpu-fleet-steward/paused": "true"}),
            _cluster("gate-foreign", {"team": "lab"}),  # not tagged: out of scope
        ],
    }],
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=SCENARIO) as handle:
        yield handle


def _settings(sim: SimHandle, **extra: str) -> Settings:
    return app_settings(sim, **{"FLEET_SUBSCRIPTIONS": SUB, **extra})


@pytest.fixture(scope="module")
def access(sim: SimHandle) -> Any:
    from shared.wiring import FleetAccess

    return FleetAccess(_settings(sim), clock=ManualClock())


def cid(sim: SimHandle, name: str) -> str:
    return str(sim.cluster(name)["id"])


def writes(sim: SimHandle) -> dict[str, int]:
    """Requests the simulator served that change something (ARM and Kubernetes), by route."""
    counts: dict[str, int] = sim.oracles()["requests"]
    return {route: n for route, n in counts.items() if route.split(" ", 1)[0] in ("PUT", "POST", "PATCH", "DELETE")
            and "listClusterUserCredential" not in route}


def test_a_pool_write_to_a_cluster_outside_the_scope_is_refused_before_any_request(sim: SimHandle, access: Any) -> None:
    from shared.fleet.gate import OutOfScope

    foreign = cid(sim, "gate-foreign")
    before = writes(sim)
    with pytest.raises(OutOfScope, match="outside the fleet scope"):
        access.aks().begin_delete_pool(foreign, "gpu")
    with pytest.raises(OutOfScope):
        access.aks().begin_put_pool(foreign, "gpu", {"properties": {"count": 0}})
    with pytest.raises(OutOfScope):
        access.aks().begin_delete_machines(foreign, "gpu", ["aks-gpu-0"])
    assert writes(sim) == before
    assert access.aks().get_pool(foreign, "gpu") is not None  # reads pass; the pool is untouched


def test_writes_to_a_paused_cluster_are_refused_before_any_request_and_reads_still_pass(sim: SimHandle,
                                                                                        access: Any) -> None:
    from shared.fleet.gate import Paused

    paused = cid(sim, "gate-paused")
    before = writes(sim)
    with pytest.raises(Paused, match="gpu-fleet-steward/paused"):
        access.aks().begin_put_pool(paused, "gpu", {"properties": {"count": 3}})
    kube = access.kube(paused)
    node = next(n for n in kube.list_nodes() if n.pool == "gpu")  # reads pass through
    with pytest.raises(Paused):
        kube.patch_node(node.name, {"spec": {"unschedulable": True}})
    with pytest.raises(Paused):
        kube.evict("default", "anything")
    with pytest.raises(Paused):
        kube.create_object({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x", "namespace": "default"}})
    with pytest.raises(Paused):
        kube.acquire_lease(node.name, holder="me", duration_s=60)
    kube.create_event(node=node, reason="StewardTest", message="dropped")  # best effort: dropped, never raised
    machine = access.aks().list_machines(paused, "gpu")[0]
    with pytest.raises(Paused):
        access.compute().begin_restart(machine.resource_id, cluster_id=paused)
    with pytest.raises(Paused):
        access.compute().begin_reimage(machine.resource_id)  # its node resource group names the paused cluster
    assert writes(sim) == before
    assert not kube.get_node(node.name).unschedulable


def test_a_vm_in_another_clusters_node_resource_group_is_refused_before_any_request(sim: SimHandle,
                                                                                   access: Any) -> None:
    from shared.fleet.gate import ForeignVm

    ok, foreign = cid(sim, "gate-ok"), cid(sim, "gate-foreign")
    theirs = access.aks().list_machines(foreign, "gpu")[0].resource_id
    ours = access.aks().list_machines(ok, "gpu")[0].resource_id
    before = writes(sim)
    with pytest.raises(ForeignVm, match="not in the node resource group"):
        access.compute().begin_restart(theirs, cluster_id=ok)  # a node of gate-ok claiming gate-foreign's VM
    with pytest.raises(ForeignVm, match="node resource group of no cluster in the fleet scope"):
        access.compute().begin_reimage(theirs)
    with pytest.raises(ForeignVm):
        access.compute().begin_restart(ours.replace(SUB, "00000000-0000-0000-0000-0000000000ff"), cluster_id=ok)
    assert writes(sim) == before
    access.compute().begin_restart(ours, cluster_id=ok)  # the control: its own VM goes through
    after = writes(sim)
    assert sum(after.values()) == sum(before.values()) + 1 and any(r.endswith("/restart") for r in after)


def test_with_steward_paused_nothing_is_sent_not_even_the_cluster_read(sim: SimHandle) -> None:
    from shared.fleet.gate import Paused
    from shared.wiring import FleetAccess

    access = FleetAccess(_settings(sim, STEWARD_PAUSED="true"), clock=ManualClock())
    ok = cid(sim, "gate-ok")
    before = sim.oracles()["requests"]
    with pytest.raises(Paused, match="STEWARD_PAUSED"):
        access.aks().begin_delete_pool(ok, "gpu")
    with pytest.raises(Paused, match="STEWARD_PAUSED"):
        access.compute().begin_restart(f"/subscriptions/{SUB}/resourceGroups/MC_rg-gate-ok_gate-ok_eastus/providers/"
                                       "Microsoft.Compute/virtualMachineScaleSets/aks-gpu-1-vmss/virtualMachines/0")
    assert sim.oracles()["requests"] == before


# --------------------------------------------------------------------------- If-Match (sim/arm/api.py _check_preconditions)


def test_a_pool_delete_with_a_stale_etag_is_refused_with_412_and_the_pool_stays(sim: SimHandle, access: Any) -> None:
    aks, ok = access.aks(), cid(sim, "gate-ok")
    aks.begin_put_pool(ok, "gpustale", {"properties": _gpu(1)})
    first = aks.get_pool(ok, "gpustale")
    assert first is not None and first.properties.get("eTag")
    stale = str(first.properties["eTag"])
    _wait_succeeded(aks, ok, "gpustale")
    aks.begin_put_pool(ok, "gpustale", {"properties": _gpu(2)})  # someone else writes: new eTag
    _wait_succeeded(aks, ok, "gpustale")
    current = aks.get_pool(ok, "gpustale")
    assert current is not None and current.properties["eTag"] != stale
    with pytest.raises(Conflict, match="412"):
        aks.begin_delete_pool(ok, "gpustale", etag=stale)
    with pytest.raises(Conflict, match="412"):
        aks.begin_put_pool(ok, "gpustale", {"properties": _gpu(3)}, etag=stale)
    assert aks.get_pool(ok, "gpustale").count == 2
    bare = str(current.properties["eTag"]).strip('"')  # AKS documents bare eTags; the SDK quotes them
    aks.begin_delete_pool(ok, "gpustale", etag=bare)
    assert aks.get_pool(ok, "gpustale").provisioning_state == "Deleting"


def test_a_create_only_put_never_replaces_a_pool_that_took_the_name(sim: SimHandle, access: Any) -> None:
    aks, ok = access.aks(), cid(sim, "gate-ok")
    aks.begin_put_pool(ok, "gpuonce", {"properties": _gpu(1)}, create_only=True)  # If-None-Match: * on a new name
    _wait_succeeded(aks, ok, "gpuonce")
    with pytest.raises(Conflict, match="412"):
        aks.begin_put_pool(ok, "gpuonce", {"properties": _gpu(3)}, create_only=True)
    assert aks.get_pool(ok, "gpuonce").count == 1


def test_a_delete_with_an_etag_of_a_pool_that_does_not_exist_is_refused_with_412(sim: SimHandle, access: Any) -> None:
    with pytest.raises(Conflict, match="Resource not found but ETag header is provided"):
        access.aks().begin_delete_pool(cid(sim, "gate-ok"), "nosuchpool", etag='"abc"')
    access.aks().begin_delete_pool(cid(sim, "gate-ok"), "nosuchpool")  # without If-Match: already gone is done


def _wait_succeeded(aks: Any, cluster: str, pool: str, timeout_s: float = 180.0) -> None:
    def succeeded() -> bool:
        found = aks.get_pool(cluster, pool)
        return found is not None and found.provisioning_state == "Succeeded"

    wait_until(succeeded, timeout=timeout_s, interval=0.5, what=f"{pool} to reach Succeeded")

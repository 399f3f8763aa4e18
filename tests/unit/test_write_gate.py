"""The write gate (shared.fleet.gate) with fakes under it, as shared.wiring.FleetAccess installs it (issue 11).

Every write re-checks scope and pause at the point of the call; the cluster read behind those checks
is cached for at most CLUSTER_CACHE_S (30 s), so a step's many writes cost one ARM read while a new
pause tag takes effect within 30 s. The end-to-end refusals against the simulator's real protocols
are in tests/integration/test_write_gate_sim.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from shared.fleet import gate
from shared.kernel.clock import ManualClock
from shared.kernel.errors import Forbidden, NotFound
from shared.kernel.ports import ClusterInfo, EvictionResult, NodeView, Record
from shared.settings import Settings
from shared.wiring import FleetAccess

SUB = "00000000-0000-0000-0000-000000000001"
OTHER_SUB = "00000000-0000-0000-0000-0000000000ff"


def cid(name: str, sub: str = SUB) -> str:
    return f"/subscriptions/{sub}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/{name}"


def vm(name: str, *, sub: str = SUB, index: int = 0) -> str:
    return (f"/subscriptions/{sub}/resourceGroups/MC_rg_{name}_eastus/providers/Microsoft.Compute/"
            f"virtualMachineScaleSets/aks-gpu-1-vmss/virtualMachines/{index}")


class Arm:
    """AksPort + ComputePort fake: clusters by name, records every write and every cluster read."""

    def __init__(self) -> None:
        self.tags: dict[str, dict[str, str]] = {"ok": {"gpu-fleet-steward": "enabled"},
                                                "paused": {"gpu-fleet-steward": "enabled",
                                                           "gpu-fleet-steward/paused": "true"},
                                                "foreign": {"team": "lab"}}
        self.hidden: set[str] = set()
        self.reads = 0
        self.writes: list[tuple[str, ...]] = []

    def get_cluster(self, cluster_id: str) -> ClusterInfo:
        self.reads += 1
        name = cluster_id.rsplit("/", 1)[-1]
        if name in self.hidden:
            raise Forbidden(f"403 AuthorizationFailed on {cluster_id}")
        if name not in self.tags:
            raise NotFound(cluster_id)
        return ClusterInfo(id=cluster_id, name=name, subscription=SUB, resource_group="rg", location="eastus",
                           tags=dict(self.tags[name]), node_resource_group=f"MC_rg_{name}_eastus")

    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        return [self.get_cluster(cid(n)) for n in self.tags] if subscription == SUB else []

    def get_pool(self, cluster_id: str, pool: str) -> Any:
        return None

    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], **kw: Any) -> None:
        self.writes.append(("PUT", cluster_id, pool))

    def begin_delete_pool(self, cluster_id: str, pool: str, **kw: Any) -> None:
        self.writes.append(("DELETE", cluster_id, pool, str(kw.get("etag"))))

    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Sequence[str]) -> None:
        self.writes.append(("deleteMachines", cluster_id, pool))

    def begin_restart(self, vm_resource_id: str) -> None:
        self.writes.append(("restart", vm_resource_id))

    def begin_reimage(self, vm_resource_id: str) -> None:
        self.writes.append(("reimage", vm_resource_id))


class Kube:
    def __init__(self, cluster_id: str, writes: list[tuple[str, ...]]) -> None:
        self.cluster_id, self.writes = cluster_id, writes
        self.namespace = "gpu-fleet-steward"

    def get_node(self, name: str) -> NodeView | None:
        return None

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> Any:
        self.writes.append(("patch", self.cluster_id, name))

    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        self.writes.append(("evict", self.cluster_id, name))
        return EvictionResult(outcome="evicted")

    def create_event(self, **kw: Any) -> None:
        self.writes.append(("event", self.cluster_id, str(kw.get("reason"))))

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        self.writes.append(("delete", self.cluster_id, kind, name))

    def scale_everything_down(self) -> None:  # a write no port declares: never reachable through the gate
        self.writes.append(("scale", self.cluster_id))


def _access(arm: Arm, clock: ManualClock, **settings: Any) -> FleetAccess:
    fields: dict[str, Any] = {"subscriptions": (SUB,), "eventgrid_topic_endpoint": "https://eg.example/api/events"}
    fields.update(settings)
    return FleetAccess(Settings(**fields), clock=clock, aks=arm, compute=arm,  # type: ignore[arg-type]
                       kube_factory=lambda c: Kube(c, arm.writes))  # type: ignore[arg-type,return-value]


@pytest.fixture
def arm() -> Arm:
    return Arm()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_764_684_000.0)


def test_writes_pass_for_an_in_scope_cluster_and_reads_are_never_gated(arm: Arm, clock: ManualClock) -> None:
    access = _access(arm, clock)
    access.aks().begin_delete_pool(cid("ok"), "gpu", etag='"e1"')
    access.compute().begin_restart(vm("ok"), cluster_id=cid("ok"))
    access.kube(cid("ok")).patch_node("n1", {"spec": {"unschedulable": True}})
    assert arm.writes == [("DELETE", cid("ok"), "gpu", '"e1"'), ("restart", vm("ok")), ("patch", cid("ok"), "n1")]
    assert access.aks().get_pool(cid("paused"), "gpu") is None  # a read of a paused cluster passes
    assert access.kube(cid("ok")).namespace == "gpu-fleet-steward"  # attributes pass through


REFUSED = [
    ("out-of-scope-put", lambda a: a.aks().begin_put_pool(cid("foreign"), "gpu", {}), gate.OutOfScope),
    ("out-of-scope-delete-machines", lambda a: a.aks().begin_delete_machines(cid("foreign"), "gpu", ["m"]),
     gate.OutOfScope),
    ("other-subscription", lambda a: a.aks().begin_delete_pool(cid("ok", OTHER_SUB), "gpu"), gate.OutOfScope),
    ("paused-delete", lambda a: a.aks().begin_delete_pool(cid("paused"), "gpu"), gate.Paused),
    ("paused-evict", lambda a: a.kube(cid("paused")).evict("ml", "p"), gate.Paused),
    ("paused-delete-object", lambda a: a.kube(cid("paused")).delete_object("karpenter.sh/v1", "NodePool", "np"),
     gate.Paused),
    ("vm-of-another-cluster", lambda a: a.compute().begin_restart(vm("paused"), cluster_id=cid("ok")), gate.ForeignVm),
    ("vm-of-no-cluster-in-scope", lambda a: a.compute().begin_reimage(vm("foreign")), gate.ForeignVm),
    ("vm-in-another-subscription", lambda a: a.compute().begin_reimage(vm("ok", sub=OTHER_SUB)), gate.ForeignVm),
    ("not-a-vm-id", lambda a: a.compute().begin_restart("azure:///nothing", cluster_id=cid("ok")), gate.ForeignVm),
    ("undeclared-write", lambda a: a.kube(cid("ok")).scale_everything_down(), AttributeError),
]


@pytest.mark.parametrize(("call", "error"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_refused_write_never_reaches_the_adapter(arm: Arm, clock: ManualClock, call: Any, error: type) -> None:
    access = _access(arm, clock)
    with pytest.raises(error):
        call(access)
    assert arm.writes == []


def test_a_cluster_arm_will_not_show_is_refused_not_assumed(arm: Arm, clock: ManualClock) -> None:
    access = _access(arm, clock)
    arm.hidden.add("ok")
    with pytest.raises(gate.OutOfScope, match="will not show it"):
        access.aks().begin_delete_pool(cid("ok"), "gpu")
    assert arm.writes == []


def test_a_refused_kubernetes_event_is_dropped_without_raising(arm: Arm, clock: ManualClock) -> None:
    _access(arm, clock).kube(cid("paused")).create_event(node="n1", reason="StewardTest", message="m")
    assert arm.writes == []


def test_with_steward_paused_nothing_is_written_and_nothing_is_read(arm: Arm, clock: ManualClock) -> None:
    access = _access(arm, clock, paused=True)
    with pytest.raises(gate.Paused, match="STEWARD_PAUSED"):
        access.aks().begin_put_pool(cid("ok"), "gpu", {})
    with pytest.raises(gate.Paused, match="STEWARD_PAUSED"):
        access.compute().begin_restart(vm("ok"))
    assert arm.writes == [] and arm.reads == 0


def test_an_unlisted_cluster_is_refused_from_the_settings_alone(arm: Arm, clock: ManualClock) -> None:
    access = _access(arm, clock, cluster_ids=(cid("ok"),))
    with pytest.raises(gate.OutOfScope, match="FLEET_CLUSTERS"):
        access.aks().begin_delete_pool(cid("paused"), "gpu")
    assert arm.reads == 0 and arm.writes == []


def test_the_cluster_read_is_cached_for_30_seconds_and_a_new_pause_tag_applies_after_that(
        arm: Arm, clock: ManualClock) -> None:
    access = _access(arm, clock)
    kube = access.kube(cid("ok"))
    reads = arm.reads
    for i in range(50):  # a drain step: tens of evictions, one ARM read
        kube.evict("ml", f"p{i}")
    assert arm.reads - reads <= 1
    arm.tags["ok"]["gpu-fleet-steward/paused"] = "true"  # an operator pauses the cluster
    clock.advance(gate.CLUSTER_CACHE_S + 1)
    with pytest.raises(gate.Paused):
        kube.evict("ml", "late")
    assert ("evict", cid("ok"), "late") not in arm.writes


def test_a_cluster_that_left_the_scope_is_refused_even_with_a_client_built_before(arm: Arm, clock: ManualClock) -> None:
    access = _access(arm, clock)
    kube = access.kube(cid("ok"))  # built while in scope (the client cache keeps it)
    arm.tags["ok"] = {"team": "gone"}
    clock.advance(gate.CLUSTER_CACHE_S + 1)
    with pytest.raises(gate.OutOfScope):
        kube.patch_node("n1", {"spec": {"unschedulable": True}})
    assert arm.writes == []


def test_a_paused_refusal_holds_the_record_and_never_gives_it_up(arm: Arm, clock: ManualClock) -> None:
    from shared.kernel.reconciler import ReconcileReport, advance_record
    from tests.fakes.ledger import InMemoryLedger

    access = _access(arm, clock, reconcile_max_permanent_tries=2)
    ledger = InMemoryLedger()
    ctx = type("Ctx", (), {"clock": clock, "ledger": ledger, "instance": "h", "settings": access._settings})()
    given_up: list[str] = []

    def step(record: Record, _: Any) -> Record:
        access.aks().begin_delete_pool(cid("paused"), "gpu")
        return record

    rec = ledger.create(Record(kind="k", id="r", state="working"))
    for _ in range(5):
        rec = advance_record(rec, ctx, report=ReconcileReport(), advance=step, active={"working"},  # type: ignore[arg-type]
                             give_up=lambda r, c, *, reason: given_up.append(reason) or r) or rec
        clock.advance(400)
        rec = ledger.get("k", "r") or rec
    assert given_up == [] and rec.state == "working" and "Paused" in rec.data["_last_error"]
    assert rec.next_at - clock.now() <= gate.PAUSED_RETRY_S
    assert arm.writes == []

"""Fakes of the ports for the remediation tests: a small fleet that behaves, and records every write.

Faked: the Kubernetes API of each cluster (nodes, pods, evictions, events, leases), ARM (clusters,
pools, machines, delete-machines, pool PUTs), VMSS restart/reimage and the Event Grid publisher.
Left real: the ledger (``tests.fakes.ledger.InMemoryLedger``), the settings dataclass, the policies,
the reconciler and every decision. A repair "works" or "fails" per rung as the test says, so a test
reads like the fleet's story: which rung heals, which PDB blocks, which quota is missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import Conflict, Invalid, NotFound, QuotaExceeded
from shared.kernel.ports import (
    ClusterInfo,
    Condition,
    EvictionResult,
    MachineInfo,
    NodeView,
    OwnerRef,
    PodView,
    PoolInfo,
    Taint,
)
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, RemediationPolicy
from shared.settings import Settings
from tests.fakes.ledger import InMemoryLedger

SUB = "00000000-0000-0000-0000-000000000001"
CLUSTER = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1"
T0 = 1_764_684_000.0
SOURCE = "/gpu-fleet-steward"


def vm_id(node: str) -> str:
    return (f"/subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/vmss"
            f"/virtualMachines/{node}")


def make_node(name: str, *, pool: str = "gpu", created: float = T0 - 86400, ready: bool = True,
              conditions: Mapping[str, tuple[str, float]] | None = None, labels: Mapping[str, str] | None = None,
              annotations: Mapping[str, str] | None = None, unschedulable: bool = False,
              taints: Sequence[Taint] = (), gpus: int = 1, uid: str | None = None, boot_id: str = "boot-1") -> NodeView:
    """A GPU node; ``conditions`` maps type -> (status, lastTransitionTime); default both GPU conditions False."""
    conds = {DEVICE_PLUGIN: ("False", created), DCGM: ("False", created)} if conditions is None else dict(conditions)
    all_conds = [Condition(type="Ready", status="True" if ready else "False", transition=created)]
    all_conds += [Condition(type=t, status=s, transition=at) for t, (s, at) in conds.items()]
    return NodeView(
        name=name, uid=uid or f"uid-{name}", resource_version="1",
        labels={"kubernetes.azure.com/agentpool": pool, "kubernetes.azure.com/accelerator": "nvidia", **(labels or {})},
        annotations=dict(annotations or {}), unschedulable=unschedulable, taints=tuple(taints),
        conditions=tuple(all_conds), allocatable={"nvidia.com/gpu": str(gpus), "cpu": "4"},
        capacity={"nvidia.com/gpu": str(gpus), "cpu": "4"}, created=created, provider_id="azure://" + vm_id(name),
        boot_id=boot_id)


def make_pod(name: str, node: str, *, namespace: str = "default", owner: str | None = "ReplicaSet",
             phase: str = "Running", empty_dir: bool = False, grace: int | None = 30, mirror: bool = False,
             uid: str | None = None, deleting: float | None = None) -> PodView:
    owners = (OwnerRef(kind=owner, name=f"{name}-owner", controller=True),) if owner else ()
    return PodView(namespace=namespace, name=name, uid=uid or f"uid-{namespace}-{name}", node_name=node, phase=phase,
                   owners=owners, annotations={"kubernetes.io/config.mirror": "x"} if mirror else {}, labels={},
                   deletion_timestamp=deleting, grace_period_seconds=grace, has_empty_dir=empty_dir)


def with_condition(node: NodeView, type_: str, status: str, at: float) -> NodeView:
    others = tuple(c for c in node.conditions if c.type != type_)
    return msgspec.structs.replace(node, conditions=(*others, Condition(type=type_, status=status, transition=at)))


class FakeKube:
    """One cluster's Kubernetes API. ``writes`` lists every mutating call in order."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[str, PodView] = {}  # uid -> pod
        self.writes: list[tuple[Any, ...]] = []
        self.events: list[dict[str, Any]] = []
        self.leases: dict[str, tuple[str, float]] = {}
        self.pdb_blocked: set[str] = set()  # "ns/name" whose eviction a PDB refuses
        self.evict_terminates = False  # evicted pods linger as terminating until finish_terminating()
        self.list_calls = 0
        self._rv = itertools.count(2)

    # nodes
    def add(self, *nodes: NodeView) -> None:
        for n in nodes:
            self.nodes[n.name] = n

    def list_nodes(self, *, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]:
        self.list_calls += 1
        wanted = dict(part.split("=", 1) for part in label_selector.split(",") if part)
        for name in sorted(self.nodes):
            node = self.nodes[name]
            if all(node.labels.get(k) == v for k, v in wanted.items()):
                yield node

    def get_node(self, name: str) -> NodeView | None:
        return self.nodes.get(name)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        node = self.nodes.get(name)
        if node is None:
            raise NotFound(name)
        meta = patch.get("metadata") or {}
        if meta.get("resourceVersion") and meta["resourceVersion"] != node.resource_version:
            raise Conflict(f"node {name} changed")
        labels = dict(node.labels)
        annotations = dict(node.annotations)
        for target, changes in ((labels, meta.get("labels") or {}), (annotations, meta.get("annotations") or {})):
            for k, v in changes.items():
                if v is None:
                    target.pop(k, None)
                else:
                    target[k] = v
        unschedulable = (patch.get("spec") or {}).get("unschedulable", node.unschedulable)
        self.writes.append(("patch_node", name, patch))
        self.nodes[name] = msgspec.structs.replace(node, labels=labels, annotations=annotations,
                                                   unschedulable=unschedulable, resource_version=str(next(self._rv)))
        return self.nodes[name]

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        self.writes.append(("patch_node_status", name, patch))
        return self.nodes[name]

    # pods
    def add_pods(self, *pods: PodView) -> None:
        for p in pods:
            self.pods[p.uid] = p

    def list_pods(self, *, node_name: str | None = None, namespace: str | None = None,
                  label_selector: str = "") -> list[PodView]:
        return [p for p in self.pods.values() if (node_name is None or p.node_name == node_name)
                and (namespace is None or p.namespace == namespace)]

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        return next((p for p in self.pods.values() if p.namespace == namespace and p.name == name), None)

    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        self.writes.append(("evict", namespace, name))
        pod = self.get_pod(namespace, name)
        if pod is None:
            return EvictionResult(outcome="gone")
        if f"{namespace}/{name}" in self.pdb_blocked:
            return EvictionResult(outcome="blocked", message="Cannot evict pod as it would violate the pod's disruption budget.")
        if self.evict_terminates:
            self.pods[pod.uid] = msgspec.structs.replace(pod, deletion_timestamp=self.clock.now())
        else:
            del self.pods[pod.uid]
        return EvictionResult(outcome="evicted")

    def finish_terminating(self) -> None:
        for uid in [u for u, p in self.pods.items() if p.deletion_timestamp is not None]:
            del self.pods[uid]

    def list_pdbs(self, namespace: str | None = None) -> list[Mapping[str, Any]]:
        return []

    def create_event(self, *, node: NodeView | str, reason: str, message: str, type_: str = "Normal",
                     action: str = "", correlation_id: str = "") -> None:
        self.writes.append(("event", reason))
        self.events.append({"node": node if isinstance(node, str) else node.name, "reason": reason,
                            "message": message, "type": type_})

    def acquire_lease(self, name: str, *, holder: str, duration_s: int, namespace: str = "kube-node-lease") -> bool:
        current = self.leases.get(name)
        now = self.clock.now()
        if current is not None and current[0] != holder and current[1] > now:
            return False
        self.writes.append(("lease", name, holder))
        self.leases[name] = (holder, now + duration_s)
        return True

    def release_lease(self, name: str, *, holder: str, namespace: str = "kube-node-lease") -> None:
        if self.leases.get(name, ("",))[0] == holder:
            self.writes.append(("release_lease", name))
            del self.leases[name]

    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.writes.append(("create_object", obj))
        return obj

    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.writes.append(("apply_object", obj))
        return obj

    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        return None

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        self.writes.append(("delete_object", kind, name))

    # the fleet's own behaviour
    def heal(self, name: str, *, policy: RemediationPolicy) -> None:
        now = self.clock.now()
        node = self.nodes[name]
        for type_ in policy.conditions:
            node = with_condition(node, type_, "False", now)
        self.nodes[name] = with_condition(node, "Ready", "True", now)

    def reboot_without_healing(self, name: str) -> None:
        self.nodes[name] = with_condition(self.nodes[name], "Ready", "True", self.clock.now())

    def heal_in_a_blink(self, name: str, *, policy: RemediationPolicy) -> None:
        """A reboot too fast for the node controller: Ready keeps its old transition time, bootID changes."""
        node = self.nodes[name]
        for type_ in policy.conditions:
            node = with_condition(node, type_, "False", self.clock.now())
        self.nodes[name] = msgspec.structs.replace(node, boot_id=f"{node.boot_id}+")


@dataclass
class FakeCompute:
    """VMSS VM restart/reimage; ``outcomes[rung]`` is ``heals``, ``heals-in-a-blink`` (Ready never changes),
    ``fails`` (reboots, still broken) or ``refused``."""

    fleet: Fleet
    outcomes: dict[str, str] = field(default_factory=dict)
    writes: list[tuple[str, str]] = field(default_factory=list)
    clusters: list[str | None] = field(default_factory=list)  # the cluster_id each call was made for

    def _apply(self, rung: str, vm: str) -> None:
        outcome = self.outcomes.get(rung, "fails")
        if outcome == "refused":
            raise Invalid(f"{rung} not allowed on {vm}", code="OperationNotAllowed")
        self.writes.append((rung, vm))
        node = vm.rsplit("/", 1)[-1]
        if node not in self.fleet.kube.nodes:
            return
        if outcome == "heals":
            self.fleet.kube.heal(node, policy=self.fleet.policy)
        elif outcome == "heals-in-a-blink":
            self.fleet.kube.heal_in_a_blink(node, policy=self.fleet.policy)
        else:
            self.fleet.kube.reboot_without_healing(node)

    def begin_restart(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        self.clusters.append(cluster_id)
        self._apply("restart", vm_resource_id)

    def begin_reimage(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        self.clusters.append(cluster_id)
        self._apply("reimage", vm_resource_id)


@dataclass
class FakeAks:
    """ARM: one cluster; pool PUTs add healthy nodes at once unless ``quota`` is 0 or ``new_nodes_broken``."""

    fleet: Fleet
    tags: dict[str, str] = field(default_factory=lambda: {"gpu-fleet-steward": "enabled"})
    counts: dict[str, int] = field(default_factory=dict)
    quota: int = 1000  # extra nodes a surge may add
    new_nodes_broken: bool = False
    autoscaled: bool = False
    node_provisioning_mode: str = "Manual"  # "Auto" = node auto-provisioning (Karpenter)
    pool_modes: dict[str, str] = field(default_factory=dict)  # pool -> ARM mode (default User)
    pool_sizes: dict[str, str] = field(default_factory=dict)  # pool -> ARM vmSize (default a T4 size)
    # ARM's machines are the pool's nodes, except nodes no VM backs (forged Node objects); a machine's VM
    # is vm_id(name) unless overridden here. Node objects may say otherwise (their providerID is a claim).
    not_machines: set[str] = field(default_factory=set)
    machine_ids: dict[str, str] = field(default_factory=dict)
    writes: list[tuple[Any, ...]] = field(default_factory=list)
    _serial: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def cluster(self) -> ClusterInfo:
        return ClusterInfo(id=CLUSTER, name="c1", subscription=SUB, resource_group="rg", location="eastus",
                           tags=dict(self.tags), node_resource_group="mc_rg",
                           node_provisioning_mode=self.node_provisioning_mode)

    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        return [self.cluster()] if subscription == SUB else []

    def get_cluster(self, cluster_id: str) -> ClusterInfo:
        if cluster_id.lower() != CLUSTER.lower():
            raise NotFound(cluster_id)
        return self.cluster()

    def list_pools(self, cluster_id: str) -> list[PoolInfo]:
        return [p for name in self.counts if (p := self.get_pool(cluster_id, name)) is not None]

    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        if pool not in self.counts:
            return None
        return PoolInfo(cluster_id=cluster_id, name=pool,
                        properties={"count": self.counts[pool], "mode": self.pool_modes.get(pool, "User"),
                                    "vmSize": self.pool_sizes.get(pool, "Standard_NC4as_T4_v3"),
                                    "provisioningState": "Succeeded", "enableAutoScaling": self.autoscaled,
                                    "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202611.01.0"})

    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], *, preview: bool = False,
                       etag: str | None = None, create_only: bool = False) -> None:
        props = body.get("properties", body)
        assert "nodeImageVersion" not in props and "provisioningState" not in props, "read-only fields sent"
        count = int(props["count"])
        current = self.counts[pool]
        if count > current and self.quota < count - current:
            raise QuotaExceeded("Operation could not be completed as it results in exceeding approved quota.",
                                code="QuotaExceeded")
        self.writes.append(("put_pool", pool, count))
        if count > current:
            self.quota -= count - current
        self.counts[pool] = count
        now = self.fleet.clock.now()
        present = len(list(self.fleet.kube.list_nodes(label_selector=f"kubernetes.azure.com/agentpool={pool}")))
        for _ in range(max(0, count - present)):
            name = f"aks-{pool}-new{next(self._serial)}"
            cond = {DEVICE_PLUGIN: ("True" if self.new_nodes_broken else "False", now), DCGM: ("False", now)}
            self.fleet.kube.add(make_node(name, pool=pool, created=now, conditions=cond))

    def begin_delete_pool(self, cluster_id: str, pool: str, *, ignore_pdb: bool = False) -> None:
        raise AssertionError("remediation must never delete a pool")

    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Sequence[str]) -> None:
        self.writes.append(("delete_machines", pool, tuple(machines)))
        for m in machines:
            if self.fleet.kube.nodes.pop(m, None) is not None:
                self.counts[pool] -= 1
                self.quota += 1  # the deleted VM's cores are free again
                for uid in [u for u, p in self.fleet.kube.pods.items() if p.node_name == m]:
                    del self.fleet.kube.pods[uid]

    def list_machines(self, cluster_id: str, pool: str) -> list[MachineInfo]:
        return [MachineInfo(name=n.name, resource_id=self.machine_ids.get(n.name, vm_id(n.name)))
                for n in self.fleet.kube.list_nodes(label_selector=f"kubernetes.azure.com/agentpool={pool}")
                if n.name not in self.not_machines]

    def list_maintenance_configurations(self, cluster_id: str) -> list[Mapping[str, Any]]:
        return []

    def kubeconfig(self, cluster_id: str) -> bytes:
        return b""


class FakeEvents:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        self.published.append({"type": type_, "subject": subject, "data": dict(data), "id": id_})

    def types(self) -> list[str]:
        return [e["type"] for e in self.published]

    def delivered(self, type_: str) -> list[dict[str, Any]]:
        """The published events of ``type_`` as Event Grid delivers them (CloudEvents 1.0 with our source)."""
        return [{"specversion": "1.0", "id": e["id"], "source": SOURCE, "type": e["type"], "subject": e["subject"],
                 "data": e["data"]} for e in self.published if e["type"] == type_]


class FakeAccess:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def aks(self) -> FakeAks:
        return self.fleet.aks

    def compute(self) -> FakeCompute:
        return self.fleet.compute

    def kube(self, cluster_id: str) -> FakeKube:
        if cluster_id.lower() != CLUSTER.lower():
            raise NotFound(cluster_id)
        return self.fleet.kube


class Fleet:
    """One cluster with one GPU pool, shared by every context (host) built from it."""

    def __init__(self, *, policy: RemediationPolicy | None = None, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock(T0)
        self.policy = policy or RemediationPolicy()
        self.kube = FakeKube(self.clock)
        self.aks = FakeAks(self)
        self.compute = FakeCompute(self)
        self.events = FakeEvents()
        self.ledger = InMemoryLedger()

    def pool(self, size: int, *, pool: str = "gpu", unhealthy: Sequence[int] = (), since: float | None = None,
             condition: str = DEVICE_PLUGIN) -> list[str]:
        """``size`` healthy nodes named ``aks-<pool>-<i>``, those in ``unhealthy`` with ``condition`` True."""
        names = []
        at = self.clock.now() - 3600 if since is None else since
        for i in range(size):
            name = f"aks-{pool}-{i}"
            conds = {DEVICE_PLUGIN: ("False", T0 - 86400), DCGM: ("False", T0 - 86400)}
            if i in unhealthy:
                conds[condition] = ("True", at)
            self.kube.add(make_node(name, pool=pool, conditions=conds))
            names.append(name)
        self.aks.counts[pool] = self.aks.counts.get(pool, 0) + size
        return names

    def break_node(self, name: str, *, condition: str = DEVICE_PLUGIN, at: float | None = None) -> None:
        self.kube.nodes[name] = with_condition(self.kube.nodes[name], condition, "True",
                                               self.clock.now() if at is None else at)

    def settings(self, *, paused: bool = False) -> Settings:
        return Settings(subscriptions=(SUB,), eventgrid_topic_endpoint="https://topic.example/api/events",
                        event_source=SOURCE, paused=paused, remediation=self.policy)

    def ctx(self, instance: str = "host-a", *, paused: bool = False) -> Context:
        return Context(settings=self.settings(paused=paused), clock=self.clock, ledger=self.ledger,
                       access=FakeAccess(self), events=self.events, telemetry=None,  # type: ignore[arg-type]
                       instance=instance)

    def handle(self, event: Mapping[str, Any], ctx: Context | None = None) -> str:
        from shared.remediation import admission

        return admission.handle_event(event, ctx or self.ctx()).detail

    def cluster_writes(self) -> list[tuple[Any, ...]]:
        return [*self.kube.writes, *self.aks.writes, *self.compute.writes]


def unhealthy_event(node: NodeView | str, *, fleet: Fleet, condition: str = DEVICE_PLUGIN, since: float | None = None,
                    observed_at: float | None = None, source: str = SOURCE, cluster: str = CLUSTER) -> dict[str, Any]:
    """The CloudEvent the sweep would publish for ``node`` (taking the transition time from the node)."""
    from shared.kernel import timefmt
    from shared.remediation import records as remediation

    n = fleet.kube.nodes[node] if isinstance(node, str) else node
    cond = n.condition(condition)
    at = since if since is not None else (cond.last_transition if cond and cond.last_transition else fleet.clock.now())
    return {"specversion": "1.0", "id": remediation.fault_id(cluster, n.name, condition, at), "source": source,
            "type": remediation.UNHEALTHY_EVENT, "subject": remediation.subject(cluster, n.pool, n.name),
            "time": timefmt.iso(observed_at if observed_at is not None else fleet.clock.now()),
            "data": {"cluster": cluster, "node": n.name, "pool": n.pool, "condition": condition,
                     "since": timefmt.iso(at),
                     "observed_at": timefmt.iso(observed_at if observed_at is not None else fleet.clock.now())}}


def run_until_settled(fleet: Fleet, ctx: Context | None = None, *, max_rounds: int = 400) -> list[str]:
    """Drive the real reconciler over the fleet's ledger, jumping the clock to the next due record."""
    from shared.kernel import reconciler
    from shared.remediation import steps as remediation

    context = ctx or fleet.ctx()
    modules = {"remediation": remediation}
    for _ in range(max_rounds):
        reconciler.reconcile_once(context, modules=modules)  # type: ignore[dict-item]
        active = fleet.ledger.list(remediation.KIND, states=sorted(remediation.ACTIVE_STATES))
        if not active:
            break
        due = min(r.next_at for r in active)
        fleet.clock.advance(max(1.0, due - fleet.clock.now()))
    return [r.state for r in fleet.ledger.list(remediation.KIND)]

"""A tiny in-process fleet for the migration tests: ARM pools + machines, nodes, pods, PDBs, a scheduler.

Faked: AksPort, KubePort and ClusterAccess, all over one :class:`FakeFleet` whose time
is a ManualClock. Long-running operations complete ``op_s`` seconds after they are accepted; new
nodes turn Ready ``ready_s`` after that. Evicted pods leave after their grace period and their
controller recreates them as pending pods, which a small scheduler binds to a Ready, schedulable
node whose taints they tolerate, whose labels match their nodeSelector and that has free GPUs.
Left real: the ledger (InMemoryLedger), tests.fakes.events.RecordingEvents, the migration code,
shared.fleet.stack and shared.drain.core.

Oracles the tests read: ``killed`` (pods removed with their node rather than evicted),
``pdb_violations`` (evictions granted that broke a PDB), ``arm_writes`` (PUT/DELETE/deleteMachines).
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.kernel.clock import ManualClock
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

SUB = "00000000-0000-0000-0000-000000000001"
_ADMISSION = threading.Lock()
GPU_VCPUS = {"Standard_NC4as_T4_v3": 4, "Standard_NC24ads_A100_v4": 24, "Standard_NC40ads_H100_v5": 40,
             "Standard_ND96asr_v4": 96}


def cluster_id(name: str) -> str:
    return f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/{name}"


@dataclass
class FakePod:
    namespace: str
    name: str
    uid: str
    app: str
    node: str = ""
    controller: str = "ReplicaSet"  # "" = bare pod, "DaemonSet"
    gpus: int = 1
    tolerations: tuple[Mapping[str, Any], ...] = ({"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    deleting_at: float | None = None
    grace: int = 30


@dataclass
class FakeNode:
    name: str
    pool: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    gpus: int
    ready_at: float
    unschedulable: bool = False
    annotations: dict[str, str] = field(default_factory=dict)
    gpu_broken: bool = False


class FakeFleet:
    def __init__(self, clock: ManualClock, *, op_s: float = 60.0, ready_s: float = 60.0) -> None:
        self.clock = clock
        self.op_s = op_s
        self.ready_s = ready_s
        self.clusters: dict[str, ClusterInfo] = {}
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}  # (cluster, pool) -> properties
        self.pending_ops: list[tuple[float, Any]] = []
        self.nodes: dict[str, dict[str, FakeNode]] = {}  # cluster -> name -> node
        self.pods: dict[str, list[FakePod]] = {}
        self.pdbs: dict[str, dict[str, int]] = {}  # cluster -> app -> minAvailable
        self.maintenance: dict[str, list[dict[str, Any]]] = {}
        self.quota_vcpus: dict[str, int] = {}  # cluster -> vCPU limit for GPU sizes (absent = unlimited)
        self.broken_pools: set[str] = set()  # pool names whose nodes never get a working GPU stack
        self.killed: list[str] = []
        self.pdb_violations: list[str] = []
        self.arm_writes: list[tuple[str, str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.uids = itertools.count(1)
        self.fail_next: dict[str, Exception] = {}  # method name -> error raised once
        self.etags = itertools.count(1)
        self.if_match: list[tuple[str, str, str]] = []  # (method, pool, etag) of every conditional write

    def new_etag(self, cid: str, pool: str) -> None:
        """A new ``properties.eTag`` for the pool, as AKS gives one on every change (sim/arm.py ``_etag``)."""
        props = self.pools.get((cid, pool))
        if props is not None:
            props["eTag"] = f'"{next(self.etags)}"'

    def check_if_match(self, method: str, cid: str, pool: str, etag: str | None) -> None:
        """If-Match: 412 (raised as Conflict, as shared.adapters.aks does) when the pool's eTag is not ``etag``."""
        if etag is None:
            return
        self.if_match.append((method, pool, etag))
        current = (self.pools.get((cid, pool)) or {}).get("eTag")
        if current != etag:
            raise Conflict(f"412 PreconditionFailed: pool {pool} has eTag {current}, not {etag}")

    # ------------------------------------------------------------------ building the fleet

    def add_cluster(self, name: str) -> str:
        cid = cluster_id(name)
        self.clusters[cid] = ClusterInfo(id=cid, name=name, subscription=SUB, resource_group="rg", location="eastus",
                                         tags={"gpu-fleet-steward": "enabled"}, node_resource_group=f"MC_rg_{name}")
        self.nodes[cid], self.pods[cid], self.pdbs[cid], self.maintenance[cid] = {}, [], {}, []
        return cid

    def add_pool(self, cid: str, name: str, props: Mapping[str, Any]) -> None:
        properties = {"provisioningState": "Succeeded", "currentOrchestratorVersion": "1.33.2",
                      "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202611.01.0", "powerState": {"code": "Running"},
                      **copy.deepcopy(dict(props))}
        self.pools[(cid, name)] = properties
        self.new_etag(cid, name)
        for _ in range(int(properties.get("count") or 0)):
            self._add_node(cid, name, ready_at=self.clock.now())

    def add_workload(self, cid: str, app: str, replicas: int, *, min_available: int | None = None, gpus: int = 1,
                     pool: str | None = None, **pod: Any) -> None:
        for i in range(replicas):
            self.pods[cid].append(FakePod("default", f"{app}-{i}", f"uid-{next(self.uids)}", app, gpus=gpus, **pod))
        if min_available is not None:
            self.pdbs[cid][app] = min_available
        self._schedule(cid, prefer=pool)

    # ------------------------------------------------------------------ the model

    def _add_node(self, cid: str, pool: str, *, ready_at: float) -> FakeNode:
        props = self.pools[(cid, pool)]
        index = sum(1 for n in self.nodes[cid].values() if n.pool == pool)
        while True:
            name = f"aks-{pool}-1234-vmss{index:06d}"
            if name not in self.nodes[cid]:
                break
            index += 1
        managed = ((props.get("gpuProfile") or {}).get("nvidia") or {}).get("managementMode") == "Managed"
        labels = {"kubernetes.azure.com/agentpool": pool, "agentpool": pool, "kubernetes.io/hostname": name,
                  "kubernetes.azure.com/mode": str(props.get("mode", "User")).lower(),
                  "node.kubernetes.io/instance-type": str(props.get("vmSize")), **dict(props.get("nodeLabels") or {})}
        if managed:
            labels["kubernetes.azure.com/dcgm-exporter"] = "enabled"
        taints = []
        for text in props.get("nodeTaints") or []:
            kv, _, effect = text.rpartition(":")
            key, _, value = kv.partition("=")
            taints.append(Taint(key=key, value=value, effect=effect))
        node = FakeNode(name, pool, labels, tuple(taints), gpus=1, ready_at=ready_at,
                        gpu_broken=pool in self.broken_pools)
        self.nodes[cid][name] = node
        return node

    def _remove_node(self, cid: str, name: str) -> None:
        self.nodes[cid].pop(name, None)
        for pod in list(self.pods[cid]):
            if pod.node == name:
                if pod.controller != "DaemonSet":
                    self.killed.append(f"{pod.namespace}/{pod.name}")
                self.pods[cid].remove(pod)

    def settle(self) -> None:
        now = self.clock.now()
        due = [op for op in self.pending_ops if op[0] <= now]
        self.pending_ops = [op for op in self.pending_ops if op[0] > now]
        for _, fn in sorted(due, key=lambda op: op[0]):
            fn()
        for cid, pods in self.pods.items():
            for pod in list(pods):
                if pod.deleting_at is not None and now >= pod.deleting_at + pod.grace:
                    pods.remove(pod)
                    if pod.controller:
                        pods.append(FakePod(pod.namespace, f"{pod.app}-{next(self.uids)}", f"uid-{next(self.uids)}",
                                            pod.app, controller=pod.controller, gpus=pod.gpus,
                                            tolerations=pod.tolerations, node_selector=pod.node_selector, grace=pod.grace))
            self._schedule(cid)

    def _fits(self, cid: str, pod: FakePod, node: FakeNode) -> bool:
        if node.unschedulable or self.clock.now() < node.ready_at:
            return False
        for taint in node.taints:
            if taint.effect == "NoSchedule" and not any(
                    t.get("key") == taint.key and (t.get("operator") == "Exists" or t.get("value") == taint.value)
                    for t in pod.tolerations):
                return False
        if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
            return False
        used = sum(p.gpus for p in self.pods[cid] if p.node == node.name)
        return used + pod.gpus <= node.gpus

    def _schedule(self, cid: str, prefer: str | None = None) -> None:
        for pod in self.pods[cid]:
            if pod.node:
                continue
            nodes = sorted(self.nodes[cid].values(), key=lambda n: (n.pool != prefer, n.name))
            for node in nodes:
                if self._fits(cid, pod, node):
                    pod.node = node.name
                    break

    def running(self, cid: str, app: str) -> int:
        return sum(1 for p in self.pods[cid] if p.app == app and p.node and p.deleting_at is None)

    def pods_on_pool(self, cid: str, pool: str) -> list[FakePod]:
        names = {n.name for n in self.nodes[cid].values() if n.pool == pool}
        return [p for p in self.pods[cid] if p.node in names and p.controller != "DaemonSet"]

    def later(self, delay: float, fn: Any) -> None:
        self.pending_ops.append((self.clock.now() + delay, fn))

    def raise_if(self, method: str) -> None:
        error = self.fail_next.pop(method, None)
        if error is not None:
            raise error


class FakeAks:
    def __init__(self, fleet: FakeFleet) -> None:
        self.f = fleet

    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        return [c for c in self.f.clusters.values() if c.subscription == subscription]

    def get_cluster(self, cid: str) -> ClusterInfo:
        if cid not in self.f.clusters:
            raise NotFound(cid)
        return self.f.clusters[cid]

    def list_pools(self, cid: str) -> list[PoolInfo]:
        self.f.raise_if("list_pools")
        self.f.settle()
        return [PoolInfo(cluster_id=c, name=p, properties=copy.deepcopy(v)) for (c, p), v in sorted(self.f.pools.items())
                if c == cid]

    def get_pool(self, cid: str, pool: str) -> PoolInfo | None:
        self.f.settle()
        props = self.f.pools.get((cid, pool))
        return None if props is None else PoolInfo(cluster_id=cid, name=pool, properties=copy.deepcopy(props))

    def _vcpus_used(self, cid: str, *, without: str = "") -> int:
        return sum(GPU_VCPUS.get(str(p.get("vmSize")), 0) * int(p.get("count") or 0)
                   for (c, name), p in self.f.pools.items() if c == cid and name != without)

    def begin_put_pool(self, cid: str, pool: str, body: Mapping[str, Any], *, preview: bool = False,
                       etag: str | None = None, create_only: bool = False) -> None:
        self.f.raise_if("begin_put_pool")
        self.f.settle()
        self.f.check_if_match("PUT", cid, pool, etag)
        if create_only and self.get_pool(cid, pool) is not None:
            raise Conflict(f"Agent pool '{pool}' already exists (If-None-Match: *).")
        props = copy.deepcopy(dict(body["properties"]))
        limit = self.f.quota_vcpus.get(cid)
        if limit is not None:
            wanted = self._vcpus_used(cid, without=pool) + GPU_VCPUS.get(str(props.get("vmSize")), 0) * int(props["count"])
            if wanted > limit:
                raise QuotaExceeded(f"Operation could not be completed as it results in exceeding approved quota: "
                                    f"{wanted} > {limit}", code="QuotaExceeded")
        self.f.arm_writes.append(("PUT", cid, pool))
        existing = self.f.pools.get((cid, pool))
        if existing is None:
            props["provisioningState"] = "Creating"
            self.f.pools[(cid, pool)] = props
            self.f.new_etag(cid, pool)

            def created() -> None:
                current = self.f.pools.get((cid, pool))
                if current is None:
                    return
                current["provisioningState"] = "Succeeded"
                self.f.new_etag(cid, pool)
                for _ in range(int(current.get("count") or 0)):
                    self.f._add_node(cid, pool, ready_at=self.f.clock.now() + self.f.ready_s)

            self.f.later(self.f.op_s, created)
            return
        for immutable in ("gpuProfile", "vmSize"):
            if immutable in props and props[immutable] != existing.get(immutable):
                raise Invalid(f"{immutable} cannot be changed", code="PropertyChangeNotAllowed")
        target = int(props.get("count") or 0)
        existing.update({k: v for k, v in props.items() if k != "count"})
        if not props.get("enableAutoScaling"):
            for bound in ("minCount", "maxCount"):
                if bound not in props:
                    existing.pop(bound, None)
        existing["provisioningState"] = "Updating"
        self.f.new_etag(cid, pool)

        def updated() -> None:
            current = self.f.pools.get((cid, pool))
            if current is None:
                return
            nodes = [n for n in self.f.nodes[cid].values() if n.pool == pool]
            for _ in range(target - len(nodes)):
                self.f._add_node(cid, pool, ready_at=self.f.clock.now() + self.f.ready_s)
            current["count"] = target
            current["provisioningState"] = "Succeeded"
            self.f.new_etag(cid, pool)

        self.f.later(self.f.op_s, updated)

    def begin_delete_pool(self, cid: str, pool: str, *, ignore_pdb: bool = False, etag: str | None = None) -> None:
        self.f.raise_if("begin_delete_pool")
        if (cid, pool) not in self.f.pools:
            raise NotFound(pool)
        self.f.check_if_match("DELETE", cid, pool, etag)
        self.f.arm_writes.append(("DELETE", cid, pool))
        self.f.pools[(cid, pool)]["provisioningState"] = "Deleting"
        self.f.new_etag(cid, pool)

        def deleted() -> None:
            for node in [n.name for n in self.f.nodes[cid].values() if n.pool == pool]:
                self.f._remove_node(cid, node)
            self.f.pools.pop((cid, pool), None)

        self.f.later(self.f.op_s, deleted)

    def begin_delete_machines(self, cid: str, pool: str, machines: Sequence[str]) -> None:
        self.f.raise_if("begin_delete_machines")
        self.f.arm_writes.append(("deleteMachines", cid, pool))
        names = list(machines)

        def deleted() -> None:
            for name in names:
                self.f._remove_node(cid, name)
            props = self.f.pools.get((cid, pool))
            if props is not None:
                props["count"] = sum(1 for n in self.f.nodes[cid].values() if n.pool == pool)
                self.f.new_etag(cid, pool)

        self.f.later(self.f.op_s / 2, deleted)

    def list_machines(self, cid: str, pool: str) -> list[MachineInfo]:
        self.f.settle()
        return [MachineInfo(name=n.name, resource_id=f"/vmss/{n.name}") for n in self.f.nodes[cid].values() if n.pool == pool]

    def list_maintenance_configurations(self, cid: str) -> list[Mapping[str, Any]]:
        return list(self.f.maintenance.get(cid, []))

    def kubeconfig(self, cid: str) -> bytes:
        return b""


class FakeKube:
    def __init__(self, fleet: FakeFleet, cid: str) -> None:
        self.f, self.cid = fleet, cid

    def _view(self, node: FakeNode) -> NodeView:
        now = self.f.clock.now()
        ready = now >= node.ready_at
        managed = node.labels.get("kubernetes.azure.com/dcgm-exporter") == "enabled"
        conditions = [Condition("Ready", "True" if ready else "False", transition=node.ready_at)]
        allocatable = {"cpu": "4", "memory": "28Gi"}
        if ready and not node.gpu_broken:
            allocatable["nvidia.com/gpu"] = str(node.gpus)
        if managed:
            status = "True" if node.gpu_broken else "False"
            conditions += [Condition("UnhealthyNvidiaDevicePlugin", status), Condition("UnhealthyNvidiaDCGMServices", status)]
        return NodeView(name=node.name, uid=f"uid-{node.name}", resource_version="1", labels=dict(node.labels),
                        annotations=dict(node.annotations), unschedulable=node.unschedulable, taints=node.taints,
                        conditions=tuple(conditions), allocatable=allocatable, capacity=allocatable, created=node.ready_at)

    def list_nodes(self, *, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]:
        self.f.settle()
        key, _, value = label_selector.partition("=")
        for node in list(self.f.nodes[self.cid].values()):
            if not key or node.labels.get(key) == value:
                yield self._view(node)

    def get_node(self, name: str) -> NodeView | None:
        node = self.f.nodes[self.cid].get(name)
        return None if node is None else self._view(node)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        self.f.raise_if("patch_node")
        node = self.f.nodes[self.cid].get(name)
        if node is None:
            raise NotFound(name)
        for k, v in ((patch.get("metadata") or {}).get("annotations") or {}).items():
            if v is None:
                node.annotations.pop(k, None)
            else:
                node.annotations[k] = v
        if "unschedulable" in (patch.get("spec") or {}):
            node.unschedulable = bool(patch["spec"]["unschedulable"])
        self.f.settle()
        return self._view(node)

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        raise NotImplementedError

    def _pod_view(self, pod: FakePod) -> PodView:
        owners = (OwnerRef(kind=pod.controller, name=pod.app, controller=True),) if pod.controller else ()
        return PodView(namespace=pod.namespace, name=pod.name, uid=pod.uid, node_name=pod.node,
                       phase="Running" if pod.node else "Pending", owners=owners, annotations={}, labels={"app": pod.app},
                       deletion_timestamp=pod.deleting_at, grace_period_seconds=pod.grace, has_empty_dir=False,
                       tolerations=pod.tolerations, node_selector=dict(pod.node_selector),
                       requests={"nvidia.com/gpu": str(pod.gpus)})

    def list_pods(self, *, node_name: str | None = None, namespace: str | None = None,
                  label_selector: str = "") -> list[PodView]:
        self.f.settle()
        return [self._pod_view(p) for p in self.f.pods[self.cid] if node_name is None or p.node == node_name]

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        for p in self.f.pods[self.cid]:
            if p.namespace == namespace and p.name == name:
                return self._pod_view(p)
        return None

    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        with _ADMISSION:  # the API server admits evictions against a PDB one at a time; so does this fake
            return self._evict(namespace, name)

    def _evict(self, namespace: str, name: str) -> EvictionResult:
        pod = next((p for p in self.f.pods[self.cid] if p.namespace == namespace and p.name == name), None)
        if pod is None:
            return EvictionResult("gone")
        if pod.deleting_at is not None:
            return EvictionResult("evicted")
        minimum = self.f.pdbs[self.cid].get(pod.app)
        if minimum is not None and self.f.running(self.cid, pod.app) - 1 < minimum:
            return EvictionResult("blocked", "Cannot evict pod as it would violate the pod's disruption budget.")
        pod.deleting_at = self.f.clock.now()
        if minimum is not None and self.f.running(self.cid, pod.app) < minimum:
            self.f.pdb_violations.append(f"{namespace}/{name}")
        return EvictionResult("evicted")

    def list_pdbs(self, namespace: str | None = None) -> list[Mapping[str, Any]]:
        return []

    def create_event(self, *, node: NodeView | str, reason: str, message: str, type_: str = "Normal",
                     action: str = "", correlation_id: str = "") -> None:
        self.f.events.append((node if isinstance(node, str) else node.name, reason, message))

    def acquire_lease(self, name: str, *, holder: str, duration_s: int, namespace: str = "") -> bool:
        return True

    def release_lease(self, name: str, *, holder: str, namespace: str = "") -> None:
        return None

    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        raise NotImplementedError

    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        raise NotImplementedError

    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        return None

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        return None


class FakeAccess:
    def __init__(self, fleet: FakeFleet) -> None:
        self.f = fleet
        self._aks = FakeAks(fleet)

    def aks(self) -> FakeAks:
        return self._aks

    def compute(self) -> Any:
        raise NotImplementedError

    def kube(self, cid: str) -> FakeKube:
        return FakeKube(self.f, cid)

"""A tiny in-process fleet for the migration tests: ARM pools + machines, nodes, pods, PDBs, a scheduler.

Faked, by the port fakes of tests/fakes: AksPort (its long-running operations complete ``op_s`` seconds
after they are accepted), KubePort (one per cluster; new nodes turn Ready ``ready_s`` after their
machine exists; evictions are admitted against each app's PDB) and ClusterAccess. This module adds what
is no port: :class:`FakeFleet`, the scenario's model of the controllers and the scheduler. Evicted pods
leave after their grace period and their controller recreates them as pending pods, which the scheduler
binds to a Ready, schedulable node whose taints they tolerate, whose labels match their nodeSelector and
that has free GPUs. The model runs before each read of ARM or Kubernetes, on a ManualClock.
Left real: the ledger (InMemoryLedger), tests.fakes.events.RecordingEvents, the migration code,
shared.fleet.stack and shared.drain (its runner, state and filters).

Oracles the tests read: ``killed`` (pods removed with their node rather than evicted),
``pdb_violations`` (evictions granted that broke a PDB), ``arm_writes`` (PUT/DELETE/deleteMachines).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

import msgspec

from shared.kernel.clock import ManualClock
from shared.kernel.errors import NotFound
from shared.kernel.ports import ClusterInfo, Condition, NodeView, OwnerRef, PodView, Taint
from tests.fakes.access import FakeAccess
from tests.fakes.aks import FakeAks
from tests.fakes.faults import Faults
from tests.fakes.kube import FakeKube

__all__ = ["GPU_TOLERATION", "SUB", "FakeAccess", "FakeAks", "FakeFleet", "FakeKube", "cluster_id"]

SUB = "00000000-0000-0000-0000-000000000001"
GPU_TOLERATION: tuple[Mapping[str, Any], ...] = ({"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},)
VERBS = {"put_pool": "PUT", "delete_pool": "DELETE", "delete_machines": "deleteMachines"}
NODE_GPUS = 1  # every node of these pools has one GPU


def cluster_id(name: str) -> str:
    return f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/{name}"


def gpus_of(pod: PodView) -> int:
    return int(pod.requests.get("nvidia.com/gpu", "0"))


class FakeFleet:
    """Clusters, their pools and workloads; the fakes (``aks``, one ``FakeKube`` per cluster) hold the state,
    the fleet moves it on (:meth:`settle`). ``fail_next[method]`` makes the next call of that ARM or
    Kubernetes method raise."""

    def __init__(self, clock: ManualClock, *, op_s: float = 60.0, ready_s: float = 60.0) -> None:
        self.clock = clock
        self.ready_s = ready_s
        self.faults = Faults()
        self.aks = FakeAks(clock, op_s=op_s, kube=self.kube_of, grow=self._grow, faults=self.faults)
        self.aks.observers.append(self._model)
        self.compute = None  # a migration never calls Microsoft.Compute
        self.kubes: dict[str, FakeKube] = {}
        self.broken_pools: set[str] = set()  # pool names whose nodes never get a working GPU stack
        self.uids = itertools.count(1)

    # ------------------------------------------------------------------ the world, as the tests read it

    def kube_of(self, cid: str) -> FakeKube:
        try:
            return self.kubes[cid.lower()]
        except KeyError:
            raise NotFound(cid) from None

    def _ids(self) -> list[str]:
        return [c.id for c in self.aks.clusters.values()]

    @property
    def fail_next(self) -> dict[str, Exception]:
        return self.faults.fail_next

    @property
    def clusters(self) -> dict[str, ClusterInfo]:
        return {c.id: c for c in self.aks.clusters.values()}

    @property
    def pools(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(cluster id, pool) -> the stored properties (the same dicts: a change is ARM's answer)."""
        ids = {c.lower(): c for c in self._ids()}
        return {(ids[c], p): props for (c, p), props in self.aks.pools.items()}

    @property
    def nodes(self) -> dict[str, dict[str, NodeView]]:
        return {cid: self.kube_of(cid).nodes for cid in self._ids()}

    @property
    def pods(self) -> dict[str, list[PodView]]:
        return {cid: list(self.kube_of(cid).pods.values()) for cid in self._ids()}

    @property
    def quota_vcpus(self) -> dict[str, int]:
        return self.aks.quota_vcpus

    @property
    def maintenance(self) -> dict[str, list[dict[str, Any]]]:
        return self.aks.maintenance

    @property
    def arm_writes(self) -> list[tuple[str, str, str]]:
        return [(VERBS[w[0]], w.cluster, w[1]) for w in self.aks.writes]

    @property
    def if_match(self) -> list[tuple[str, str, str]]:
        return self.aks.if_match

    @property
    def killed(self) -> list[str]:
        return [k for cid in self._ids() for k in self.kube_of(cid).killed]

    @property
    def pdb_violations(self) -> list[str]:
        return [k for cid in self._ids() for k in self.kube_of(cid).pdb_violations]

    @property
    def events(self) -> list[tuple[str, str, str]]:
        return [(e["node"], e["reason"], e["message"]) for cid in self._ids() for e in self.kube_of(cid).events]

    def running(self, cid: str, app: str) -> int:
        return self.kube_of(cid).healthy(app)

    def pods_on_pool(self, cid: str, pool: str) -> list[PodView]:
        kube = self.kube_of(cid)
        names = {n.name for n in kube.nodes.values() if n.pool == pool}
        return [p for p in kube.pods.values() if p.node_name in names and not _daemon(p)]

    # ------------------------------------------------------------------ building the fleet

    def add_cluster(self, name: str) -> str:
        cid = cluster_id(name)
        self.aks.add_cluster(ClusterInfo(id=cid, name=name, subscription=SUB, resource_group="rg", location="eastus",
                                         tags={"gpu-fleet-steward": "enabled"}, node_resource_group=f"MC_rg_{name}"))
        kube = FakeKube(self.clock, faults=self.faults)
        kube.evict_terminates = True  # the model removes evicted pods after their grace period
        kube.observers.append(self.settle)
        self.kubes[cid.lower()] = kube
        return cid

    def add_pool(self, cid: str, name: str, props: Mapping[str, Any]) -> None:
        stored = self.aks.add_pool(cid, name, props)
        for _ in range(int(stored.get("count") or 0)):
            self._add_node(cid, name, ready_at=self.clock.now())

    def add_workload(self, cid: str, app: str, replicas: int, *, min_available: int | None = None, gpus: int = 1,
                     pool: str | None = None, controller: str = "ReplicaSet",
                     tolerations: tuple[Mapping[str, Any], ...] = GPU_TOLERATION,
                     node_selector: Mapping[str, str] | None = None, grace: int = 30) -> None:
        """``replicas`` pending pods of ``app`` (controller "" = bare pods, "DaemonSet"), then scheduled."""
        kube = self.kube_of(cid)
        owners = (OwnerRef(kind=controller, name=app, controller=True),) if controller else ()
        for i in range(replicas):
            kube.add_pods(PodView(namespace="default", name=f"{app}-{i}", uid=f"uid-{next(self.uids)}", node_name="",
                                  phase="Pending", owners=owners, annotations={}, labels={"app": app},
                                  deletion_timestamp=None, grace_period_seconds=grace, has_empty_dir=False,
                                  tolerations=tolerations, node_selector=dict(node_selector or {}),
                                  requests={"nvidia.com/gpu": str(gpus)}))
        if min_available is not None:
            kube.pdbs[app] = min_available
        self._schedule(cid, prefer=pool)

    def new_etag(self, cid: str, pool: str) -> None:
        self.aks.new_etag(cid, pool)

    # ------------------------------------------------------------------ the model

    def _grow(self, cid: str, pool: str, props: Mapping[str, Any]) -> None:
        self._add_node(cid, pool, ready_at=self.clock.now() + self.ready_s)

    def _add_node(self, cid: str, pool: str, *, ready_at: float) -> NodeView:
        """A node as AKS registers it for a pool: its labels and taints from the pool, GPU health by pool."""
        props = self.aks.pool_props(cid, pool)
        kube = self.kube_of(cid)
        index = sum(1 for n in kube.nodes.values() if n.pool == pool)
        while f"aks-{pool}-1234-vmss{index:06d}" in kube.nodes:
            index += 1
        name = f"aks-{pool}-1234-vmss{index:06d}"
        managed = ((props.get("gpuProfile") or {}).get("nvidia") or {}).get("managementMode") == "Managed"
        labels = {"kubernetes.azure.com/agentpool": pool, "agentpool": pool, "kubernetes.io/hostname": name,
                  "kubernetes.azure.com/mode": str(props.get("mode", "User")).lower(),
                  "node.kubernetes.io/instance-type": str(props.get("vmSize")), **dict(props.get("nodeLabels") or {})}
        taints = []
        for text in props.get("nodeTaints") or []:
            kv, _, effect = text.rpartition(":")
            key, _, value = kv.partition("=")
            taints.append(Taint(key=key, value=value, effect=effect))
        broken = pool in self.broken_pools
        conditions = [Condition("Ready", "True", transition=ready_at)]
        allocatable = {"cpu": "4", "memory": "28Gi"}
        if not broken:
            allocatable["nvidia.com/gpu"] = str(NODE_GPUS)
        if managed:
            labels["kubernetes.azure.com/dcgm-exporter"] = "enabled"
            status = "True" if broken else "False"
            conditions += [Condition("UnhealthyNvidiaDevicePlugin", status), Condition("UnhealthyNvidiaDCGMServices", status)]
        node = NodeView(name=name, uid=f"uid-{name}", resource_version="1", labels=labels, annotations={},
                        unschedulable=False, taints=tuple(taints), conditions=tuple(conditions), allocatable=allocatable,
                        capacity=dict(allocatable), created=ready_at)
        kube.boot(node, ready_at=ready_at)
        return node

    def settle(self) -> None:
        """Run what is due: ARM's operations, then the controllers and the scheduler."""
        self.aks.run_due()
        self._model()

    def _model(self) -> None:
        now = self.clock.now()
        for cid in self._ids():
            kube = self.kube_of(cid)
            for pod in list(kube.pods.values()):
                grace = pod.grace_period_seconds or 0
                if pod.deletion_timestamp is not None and now >= pod.deletion_timestamp + grace:
                    del kube.pods[pod.uid]
                    if pod.owners:  # its controller makes a new one, pending
                        app = pod.labels["app"]
                        kube.add_pods(msgspec.structs.replace(
                            pod, name=f"{app}-{next(self.uids)}", uid=f"uid-{next(self.uids)}", node_name="",
                            phase="Pending", deletion_timestamp=None, labels=copy.copy(dict(pod.labels))))
            self._schedule(cid)

    def _fits(self, kube: FakeKube, pod: PodView, node: NodeView) -> bool:
        if node.unschedulable or self.clock.now() < kube.ready_at.get(node.name, float("-inf")):
            return False
        for taint in node.taints:
            if taint.effect == "NoSchedule" and not any(
                    t.get("key") == taint.key and (t.get("operator") == "Exists" or t.get("value") == taint.value)
                    for t in pod.tolerations):
                return False
        if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
            return False
        used = sum(gpus_of(p) for p in kube.pods.values() if p.node_name == node.name)
        return used + gpus_of(pod) <= NODE_GPUS

    def _schedule(self, cid: str, prefer: str | None = None) -> None:
        kube = self.kube_of(cid)
        for pod in list(kube.pods.values()):
            if pod.node_name:
                continue
            for node in sorted(kube.nodes.values(), key=lambda n: (n.pool != prefer, n.name)):
                if self._fits(kube, pod, node):
                    kube.pods[pod.uid] = msgspec.structs.replace(pod, node_name=node.name, phase="Running")
                    break


def _daemon(pod: PodView) -> bool:
    owner = pod.controller()
    return owner is not None and owner.kind == "DaemonSet"

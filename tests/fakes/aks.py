"""AksPort in memory: managed clusters, agent pools with their long-running operations, machines.

Pools are stored as ARM returns them (the camelCase ``properties``), keyed by (cluster id in lower case,
pool name). A PUT is create-or-replace (Azure/azure-rest-api-specs, specification/containerservice/
resource-manager/Microsoft.ContainerService/aks/stable/2025-10-01, AgentPools_CreateOrUpdate): the body's
properties replace the writable ones, the server keeps its own (provisioningState, nodeImageVersion,
eTag...). ``If-Match`` / ``If-None-Match: *`` answer 412 (raised as Conflict, as shared.adapters.aks
does). The vCPU quota of GPU sizes is checked per cluster.

Long-running operations finish ``op_s`` seconds after they were accepted, on the clock: at once when
0, on the first read after that otherwise, and, when ``op_s`` is None, only when the test says so
(:meth:`set_state`). Nodes come and go with their machines in the cluster's :class:`FakeKube`
(``kube``): a new machine's node is made by the scenario's ``grow``.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.fleet import gpu_sizes
from shared.kernel import definitions
from shared.kernel.clock import ManualClock
from shared.kernel.errors import Conflict, Invalid, NotFound, QuotaExceeded, Unwritable
from shared.kernel.ports import ClusterInfo, MachineInfo, PoolInfo
from tests.fakes.faults import Faults
from tests.fakes.kube import FakeKube

SERVER_FIELDS = ("provisioningState", "nodeImageVersion", "currentOrchestratorVersion", "eTag", "status")
"""AgentPool properties ARM computes (read-only in the spec): a PUT does not send them, and ARM keeps its own."""
IMMUTABLE = ("gpuProfile", "vmSize")


@dataclass
class Put:
    """One PUT as sent (recorded before ARM answers, so a refused one is listed too)."""

    cluster: str
    pool: str
    body: Mapping[str, Any]
    preview: bool  # sent on the preview api-version
    etag: str | None = None
    create_only: bool = False


class ArmWrite(tuple):  # type: ignore[type-arg]
    """An accepted write: the tuple ``(verb, pool, detail)`` (``put_pool`` and the count, ``delete_pool`` and
    None, ``delete_machines`` and the machine names), which tests compare with plain tuples; ``cluster``
    says where."""

    cluster: str

    def __new__(cls, verb: str, pool: str, detail: Any, *, cluster: str) -> ArmWrite:
        self = super().__new__(cls, (verb, pool, detail))
        self.cluster = cluster
        return self


def vcpus(vm_size: str) -> int:
    size = gpu_sizes.lookup(vm_size)
    return 0 if size is None else size.vcpus


class FakeAks:
    """ARM's Microsoft.ContainerService. Oracles: ``puts`` and ``deletes`` (every PUT / pool DELETE sent),
    ``writes`` (every accepted write, in order), ``if_match`` ((method, pool, etag) of each conditional write)."""

    def __init__(self, clock: ManualClock, clusters: Sequence[ClusterInfo] = (), *, op_s: float | None = 0.0,
                 kube: Callable[[str], FakeKube] | None = None,
                 grow: Callable[[str, str, Mapping[str, Any]], None] | None = None, faults: Faults | None = None) -> None:
        self.clock = clock
        self.op_s = op_s
        self.kube = kube
        self.grow = grow
        self.faults = faults or Faults()
        self.clusters: dict[str, ClusterInfo] = {c.id.lower(): c for c in clusters}
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.maintenance: dict[str, list[dict[str, Any]]] = {}  # cluster id (lower case) -> configurations
        self.quota_vcpus: dict[str, int] = {}  # cluster id -> vCPU limit of GPU sizes (absent = unlimited)
        self.not_machines: set[str] = set()  # nodes no VM backs (forged Node objects)
        self.machine_ids: dict[str, str] = {}  # node -> its VM's id, when not the pool's VMSS VM of that name
        self.stable_reads = False  # like ARM on the stable api-version: preview-only properties not shown
        self.puts: list[Put] = []
        self.deletes: list[tuple[str, str]] = []
        self.writes: list[ArmWrite] = []
        self.if_match: list[tuple[str, str, str]] = []
        self.get_cluster_calls = 0
        self.pending: list[tuple[float, Callable[[], None]]] = []
        self.observers: list[Callable[[], None]] = []
        self._etags = itertools.count(1)

    # ------------------------------------------------------------------ building the world

    def add_cluster(self, cluster: ClusterInfo) -> None:
        self.clusters[cluster.id.lower()] = cluster

    def update_cluster(self, cluster_id: str, **changes: Any) -> None:
        """Change what ARM says of a cluster (tags, node provisioning mode...)."""
        key = cluster_id.lower()
        self.clusters[key] = msgspec.structs.replace(self.clusters[key], **changes)

    def add_pool(self, cluster_id: str, pool: str, props: Mapping[str, Any]) -> dict[str, Any]:
        """A pool that exists already (no operation, no node: the scenario adds those); its stored properties."""
        stored = {"provisioningState": "Succeeded", "currentOrchestratorVersion": "1.33.2",
                  "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202611.01.0", "powerState": {"code": "Running"},
                  **copy.deepcopy(dict(props))}
        self.pools[(cluster_id.lower(), pool)] = stored
        self.new_etag(cluster_id, pool)
        return stored

    def pool_props(self, cluster_id: str, pool: str) -> dict[str, Any]:
        """The pool's stored properties, to change what ARM will answer."""
        return self.pools[(cluster_id.lower(), pool)]

    def new_etag(self, cluster_id: str, pool: str) -> None:
        """A new ``properties.eTag``, as AKS gives one on every change of the pool."""
        props = self.pools.get((cluster_id.lower(), pool))
        if props is not None:
            props["eTag"] = f'"{next(self._etags)}"'

    def set_state(self, cluster_id: str, pool: str, state: str, *, error: Mapping[str, Any] | None = None) -> None:
        props = self.pool_props(cluster_id, pool)
        props["provisioningState"] = state
        if error is not None:
            props["status"] = {"provisioningError": dict(error)}

    def vcpus_used(self, cluster_id: str, *, without: str = "") -> int:
        return sum(vcpus(str(p.get("vmSize"))) * int(p.get("count") or 0)
                   for (c, name), p in self.pools.items() if c == cluster_id.lower() and name != without)

    # ------------------------------------------------------------------ time

    def later(self, fn: Callable[[], None], *, fraction: float = 1.0) -> None:
        """Finish an operation: now (``op_s`` 0), after ``op_s`` on the clock, or never by itself (None)."""
        if self.op_s == 0:
            fn()
        elif self.op_s is not None:
            self.pending.append((self.clock.now() + self.op_s * fraction, fn))

    def run_due(self) -> None:
        now = self.clock.now()
        due = sorted((op for op in self.pending if op[0] <= now), key=lambda op: op[0])
        self.pending = [op for op in self.pending if op[0] > now]
        for _, fn in due:
            fn()

    def _observe(self) -> None:
        self.run_due()
        for observer in self.observers:
            observer()

    def _pool_nodes(self, cluster_id: str, pool: str) -> list[str]:
        if self.kube is None:
            return []
        return sorted(n.name for n in self.kube(cluster_id).nodes.values() if n.pool == pool)

    def _grow_to(self, cluster_id: str, pool: str, count: int) -> None:
        if self.grow is None:
            return
        props = self.pools[(cluster_id.lower(), pool)]
        for _ in range(count - len(self._pool_nodes(cluster_id, pool))):
            self.grow(cluster_id, pool, props)

    # ------------------------------------------------------------------ clusters

    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        self.faults.check("list_clusters")
        return [c for c in self.clusters.values() if c.subscription == subscription]

    def get_cluster(self, cluster_id: str) -> ClusterInfo:
        self.get_cluster_calls += 1
        self.faults.check("get_cluster")
        return self._cluster(cluster_id)

    def _cluster(self, cluster_id: str) -> ClusterInfo:
        cluster = self.clusters.get(cluster_id.lower())
        if cluster is None:
            raise NotFound(f"cluster {cluster_id}")
        return cluster

    # ------------------------------------------------------------------ pools

    def _info(self, cluster_id: str, pool: str, props: Mapping[str, Any]) -> PoolInfo:
        shown = copy.deepcopy(dict(props))
        if self.stable_reads:  # what the stable api-version's definition has, at every depth
            shown = definitions.definitions(definitions.STABLE_API_VERSION).keep_known(shown)
        return PoolInfo(cluster_id=cluster_id, name=pool, properties=shown)

    def list_pools(self, cluster_id: str) -> list[PoolInfo]:
        self.faults.check("list_pools")
        self._observe()
        return [self._info(cluster_id, p, v) for (c, p), v in sorted(self.pools.items()) if c == cluster_id.lower()]

    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        self.faults.check("get_pool")
        self._observe()
        props = self.pools.get((cluster_id.lower(), pool))
        return None if props is None else self._info(cluster_id, pool, props)

    def _check_if_match(self, method: str, cluster_id: str, pool: str, etag: str | None) -> None:
        if etag is None:
            return
        self.if_match.append((method, pool, etag))
        current = (self.pools.get((cluster_id.lower(), pool)) or {}).get("eTag")
        if current is None or str(current).strip('"') != str(etag).strip('"'):
            raise Conflict(f"412 PreconditionFailed: pool {pool} has eTag {current}, not {etag}")

    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], *, api_version: str | None = None,
                       etag: str | None = None, create_only: bool = False) -> None:
        # The api-version as shared.adapters.aks.AksClient picks it: the first that carries the whole body.
        version = api_version or definitions.api_version_for(body["properties"])
        if version is None:
            lost = definitions.unrepresentable(body["properties"])
            raise Unwritable(f"no api-version carries {', '.join(lost)}", fields=lost)
        self.puts.append(Put(cluster_id, pool, copy.deepcopy(dict(body)), version == definitions.PREVIEW_API_VERSION,
                             etag, create_only))
        # Every body the app sends is valid for the definition of the api-version it goes on (issue 21).
        problems = definitions.definitions(version).problems(dict(body) if "properties" in body else
                                                              {"properties": dict(body)}, "AgentPool")
        assert not problems, f"PUT {pool} on {version}: {problems}"
        self.faults.check("begin_put_pool")
        self._observe()
        self._cluster(cluster_id)
        props = copy.deepcopy(dict(body["properties"]))
        sent = [f for f in SERVER_FIELDS if f in props and f != "eTag"]
        assert not sent, f"read-only fields sent: {sent}"
        key = (cluster_id.lower(), pool)
        existing = self.pools.get(key)
        self._check_if_match("PUT", cluster_id, pool, etag)
        if create_only and existing is not None:
            raise Conflict(f"Agent pool '{pool}' already exists (If-None-Match: *).")
        for immutable in IMMUTABLE if existing is not None else ():
            if immutable in props and props[immutable] != existing.get(immutable):  # type: ignore[union-attr]
                raise Invalid(f"{immutable} cannot be changed", code="PropertyChangeNotAllowed")
        self._check_quota(cluster_id, pool, props)
        count = int(props.get("count") or 0)
        self.writes.append(ArmWrite("put_pool", pool, count, cluster=cluster_id))
        kept = {f: existing[f] for f in SERVER_FIELDS if existing is not None and f in existing}
        self.pools[key] = {**props, **kept, "provisioningState": "Creating" if existing is None else "Updating"}
        self.new_etag(cluster_id, pool)

        def done() -> None:
            current = self.pools.get(key)
            if current is None:
                return
            self._grow_to(cluster_id, pool, int(current.get("count") or 0))
            current["provisioningState"] = "Succeeded"
            self.new_etag(cluster_id, pool)

        self.later(done)

    def _check_quota(self, cluster_id: str, pool: str, props: Mapping[str, Any]) -> None:
        limit = next((v for k, v in self.quota_vcpus.items() if k.lower() == cluster_id.lower()), None)
        if limit is None:
            return
        wanted = self.vcpus_used(cluster_id, without=pool) + vcpus(str(props.get("vmSize"))) * int(props.get("count") or 0)
        if wanted > limit:
            raise QuotaExceeded("Operation could not be completed as it results in exceeding approved quota: "
                                f"{wanted} > {limit}", code="QuotaExceeded")

    def begin_delete_pool(self, cluster_id: str, pool: str, *, ignore_pdb: bool = False,
                          etag: str | None = None) -> None:
        """DELETE; a pool already gone is done (shared.adapters.aks returns on its 404)."""
        self.deletes.append((cluster_id, pool))
        self.faults.check("begin_delete_pool")
        key = (cluster_id.lower(), pool)
        if key not in self.pools:
            return
        self._check_if_match("DELETE", cluster_id, pool, etag)
        self.writes.append(ArmWrite("delete_pool", pool, None, cluster=cluster_id))
        self.pools[key]["provisioningState"] = "Deleting"
        self.new_etag(cluster_id, pool)

        def done() -> None:
            for name in self._pool_nodes(cluster_id, pool):
                self.kube(cluster_id).remove_node(name)  # type: ignore[misc]
            self.pools.pop(key, None)

        if self.op_s is None:
            done()
        else:
            self.later(done)

    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Sequence[str]) -> None:
        self.faults.check("begin_delete_machines")
        names = tuple(machines)
        self.writes.append(ArmWrite("delete_machines", pool, names, cluster=cluster_id))

        def done() -> None:
            if self.kube is not None:
                for name in names:
                    if name in self.kube(cluster_id).nodes:
                        self.kube(cluster_id).remove_node(name)
            props = self.pools.get((cluster_id.lower(), pool))
            if props is not None:
                props["count"] = len(self._pool_nodes(cluster_id, pool))
                self.new_etag(cluster_id, pool)

        self.later(done, fraction=0.5)

    def list_machines(self, cluster_id: str, pool: str) -> list[MachineInfo]:
        self.faults.check("list_machines")
        self._observe()
        cluster = self._cluster(cluster_id)
        vmss = (f"/subscriptions/{cluster.subscription}/resourceGroups/{cluster.node_resource_group}"
                "/providers/Microsoft.Compute/virtualMachineScaleSets/vmss/virtualMachines/")
        return [MachineInfo(name=n, resource_id=self.machine_ids.get(n, vmss + n))
                for n in self._pool_nodes(cluster_id, pool) if n not in self.not_machines]

    def list_maintenance_configurations(self, cluster_id: str) -> list[Mapping[str, Any]]:
        self.faults.check("list_maintenance_configurations")
        return copy.deepcopy(self.maintenance.get(cluster_id.lower(), []))

    def kubeconfig(self, cluster_id: str) -> bytes:
        self.faults.check("kubeconfig")
        return b""

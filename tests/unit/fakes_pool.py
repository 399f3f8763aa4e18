"""Small in-memory fakes of AksPort, KubePort, EventsPort and ClusterAccess for the pool-request tests.

What is faked: ARM (clusters, agent pools with provisioningState, PUTs recorded), one Kubernetes
API per cluster (nodes, arbitrary objects such as Jobs and Karpenter objects) and the Event Grid
publisher. What is real: the ledger (tests.fakes.ledger.InMemoryLedger), the clock (ManualClock), the
validation, the builders and the state machine. ``materialise`` plays the part of AKS bringing up
a pool's nodes the way the simulator does (labels, allocatable GPUs, NPD conditions by profile).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.fleet import gpu_sizes
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import Conflict, NotFound
from shared.kernel.ports import ClusterInfo, Condition, NodeView, PodView, PoolInfo, Taint
from shared.pools.policy import PoolRequestPolicy
from shared.settings import Settings
from tests.fakes.ledger import InMemoryLedger

SUB = "00000000-0000-0000-0000-000000000001"
OTHER_SUB = "00000000-0000-0000-0000-0000000000ff"
RG = "rg-gpu"


def cluster_id(name: str = "c1", sub: str = SUB) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{RG}/providers/Microsoft.ContainerService/managedClusters/{name}"


CLUSTER = cluster_id("c1")
NAP_CLUSTER = cluster_id("auto1")


def request(**overrides: Any) -> dict[str, Any]:
    """A valid version-1 request as a dict; ``overrides`` replace or (value ``...``) drop fields."""
    body: dict[str, Any] = {
        "schemaVersion": "1", "requestId": "req-0001", "requester": "team-vision@contoso.com",
        "cluster": CLUSTER, "poolName": "gpunp", "vmSize": "Standard_NC4as_T4_v3", "count": 1,
    }
    for key, value in overrides.items():
        if value is ...:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def message(**overrides: Any) -> str:
    return json.dumps(request(**overrides))


# --------------------------------------------------------------------------- events


@dataclass
class Published:
    type_: str
    subject: str
    data: Mapping[str, Any]
    id_: str | None


class RecordingEvents:
    def __init__(self) -> None:
        self.published: list[Published] = []
        self.fail_next: Exception | None = None

    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        self.published.append(Published(type_, subject, dict(data), id_))

    def types(self) -> list[str]:
        return [p.type_ for p in self.published]


# --------------------------------------------------------------------------- ARM


@dataclass
class Put:
    cluster: str
    pool: str
    body: Mapping[str, Any]
    preview: bool


class FakeAks:
    def __init__(self, clusters: Sequence[ClusterInfo]) -> None:
        self.clusters = {c.id.lower(): c for c in clusters}
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.puts: list[Put] = []
        self.put_error: Exception | None = None
        self.get_cluster_calls = 0
        self.stable_reads = False  # like ARM on a stable api-version: preview fields (migStrategy) not shown
        self.deletes: list[tuple[str, str]] = []
        self.delete_error: Exception | None = None

    def get_cluster(self, cluster_id: str) -> ClusterInfo:
        self.get_cluster_calls += 1
        try:
            return self.clusters[cluster_id.lower()]
        except KeyError:
            raise NotFound(f"cluster {cluster_id}") from None

    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        return [c for c in self.clusters.values() if c.subscription == subscription]

    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        props = self.pools.get((cluster_id.lower(), pool))
        if props is None:
            return None
        shown = json.loads(json.dumps(props))
        if self.stable_reads:
            nvidia = (shown.get("gpuProfile") or {}).get("nvidia") or {}
            nvidia.pop("migStrategy", None)
            nvidia.pop("migProfiles", None)
        return PoolInfo(cluster_id=cluster_id, name=pool, properties=shown)

    def list_pools(self, cluster_id: str) -> list[PoolInfo]:
        return [PoolInfo(cluster_id=cluster_id, name=p, properties=dict(v))
                for (c, p), v in self.pools.items() if c == cluster_id.lower()]

    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], *, preview: bool = False,
                       etag: str | None = None, create_only: bool = False) -> None:
        self.puts.append(Put(cluster_id, pool, json.loads(json.dumps(body)), preview))
        if self.put_error is not None:
            raise self.put_error
        self.get_cluster(cluster_id)
        if create_only and (cluster_id.lower(), pool) in self.pools:
            raise Conflict(f"Agent pool '{pool}' already exists (If-None-Match: *).")
        self.pools[(cluster_id.lower(), pool)] = {**body["properties"], "provisioningState": "Creating"}

    def begin_delete_pool(self, cluster_id: str, pool: str, *, ignore_pdb: bool = False,
                          etag: str | None = None) -> None:
        self.deletes.append((cluster_id, pool))
        if self.delete_error is not None:
            raise self.delete_error
        current = (self.pools.get((cluster_id.lower(), pool)) or {}).get("eTag")
        if etag and current and str(current).strip('"') != str(etag).strip('"'):
            raise Conflict(f"412 PreconditionFailed: pool {pool} has eTag {current}, not {etag}")
        self.pools.pop((cluster_id.lower(), pool), None)

    def set_state(self, cluster_id: str, pool: str, state: str, *, error: Mapping[str, Any] | None = None) -> None:
        props = self.pools[(cluster_id.lower(), pool)]
        props["provisioningState"] = state
        if error is not None:
            props["status"] = {"provisioningError": dict(error)}


# --------------------------------------------------------------------------- Kubernetes


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeView] = {}
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str, str, str]] = []
        self.list_selectors: list[str] = []
        self.pods: list[PodView] = []
        self.uids = 0

    def list_pods(self, *, node_name: str | None = None, namespace: str | None = None,
                  label_selector: str = "") -> list[PodView]:
        return [p for p in self.pods if (node_name is None or p.node_name == node_name)
                and (namespace is None or p.namespace == namespace) and _matches(p.labels, label_selector)]

    @staticmethod
    def _key(api_version: str, kind: str, name: str, namespace: str | None) -> tuple[str, str, str, str]:
        return (api_version, kind, namespace or "", name)

    def list_nodes(self, *, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]:
        self.list_selectors.append(label_selector)
        return iter([n for n in self.nodes.values() if _matches(n.labels, label_selector)])

    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        obj = self.objects.get(self._key(api_version, kind, name, namespace))
        return None if obj is None else json.loads(json.dumps(obj))

    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """As the API server: 409 when the name is taken; else stored with a fresh uid, and returned."""
        meta = obj["metadata"]
        key = self._key(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        if key in self.objects:
            raise Conflict(f"{obj['kind']} {meta['name']} exists")
        stored = json.loads(json.dumps(obj))
        self.uids += 1
        stored["metadata"]["uid"] = f"00000000-0000-4000-8000-{self.uids:012d}"
        self.objects[key] = stored
        self.created.append(stored)
        return json.loads(json.dumps(stored))

    def put_foreign_job(self, job: Mapping[str, Any], *, uid: str = "f0f0f0f0-0000-4000-8000-000000000000") -> None:
        """A Job someone else created (another identity with rights in the namespace), stored as is."""
        stored = json.loads(json.dumps(job))
        stored["metadata"]["uid"] = uid
        meta = stored["metadata"]
        self.objects[self._key(stored["apiVersion"], stored["kind"], meta["name"], meta.get("namespace"))] = stored

    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """As a server-side apply: a new object gets a fresh uid, an existing one keeps its own."""
        meta = obj["metadata"]
        key = self._key(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        stored = json.loads(json.dumps(obj))
        previous = (self.objects.get(key) or {}).get("metadata") or {}
        if previous.get("uid"):
            stored["metadata"]["uid"] = previous["uid"]
        else:
            self.uids += 1
            stored["metadata"]["uid"] = f"00000000-0000-4000-8000-{self.uids:012d}"
        self.objects[key] = stored
        self.applied.append(json.loads(json.dumps(obj)))
        return obj

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        key = self._key(api_version, kind, name, namespace)
        if key not in self.objects:
            raise NotFound(f"{kind} {name}")
        if uid and (self.objects[key].get("metadata") or {}).get("uid") != uid:
            raise Conflict(f"{kind} {name}: Precondition failed: UID in precondition: {uid}")
        del self.objects[key]
        self.deleted.append(key)

    def set_job_status(self, name: str, namespace: str, status: Mapping[str, Any]) -> None:
        self.objects[("batch/v1", "Job", namespace, name)]["status"] = dict(status)

    def jobs(self) -> list[dict[str, Any]]:
        return [o for k, o in self.objects.items() if k[1] == "Job"]


def make_node(name: str, *, pool: str = "gpunp", ready: bool = True, labels: Mapping[str, str] | None = None,
              allocatable: Mapping[str, str] | None = None, conditions: Sequence[Condition] = (),
              taints: Sequence[Taint] = ()) -> NodeView:
    all_labels = {"kubernetes.azure.com/agentpool": pool, "agentpool": pool, **(labels or {})}
    conds = (Condition(type="Ready", status="True" if ready else "False", transition=1_764_683_000.0),
             *conditions)
    return NodeView(name=name, uid=f"uid-{name}", resource_version="1", labels=all_labels, annotations={},
                    unschedulable=False, taints=tuple(taints), conditions=conds,
                    allocatable=dict(allocatable or {"cpu": "4"}), capacity=dict(allocatable or {"cpu": "4"}),
                    created=1_764_683_000.0)


HEALTHY_NPD = (Condition(type="UnhealthyNvidiaDevicePlugin", status="False"),
               Condition(type="UnhealthyNvidiaDCGMServices", status="False"))


def materialise(aks: FakeAks, kube: FakeKube, cluster: str, pool: str) -> list[NodeView]:
    """Bring up the pool's nodes as AKS would (and mark it Succeeded), by install profile."""
    props = aks.pools[(cluster.lower(), pool)]
    props["provisioningState"] = "Succeeded"
    size = gpu_sizes.lookup(props["vmSize"])
    assert size is not None
    gpu = props.get("gpuProfile") or {}
    nvidia = gpu.get("nvidia") or {}
    managed = nvidia.get("managementMode") == "Managed"
    strategy = nvidia.get("migStrategy") or "None"
    allocatable: dict[str, str] = {"cpu": str(size.vcpus)}
    labels: dict[str, str] = dict(props.get("nodeLabels") or {})
    conditions: tuple[Condition, ...] = ()
    if managed:
        labels["kubernetes.azure.com/dcgm-exporter"] = "enabled"
        conditions = HEALTHY_NPD
        mig_name = (nvidia.get("migProfiles") or [props.get("gpuInstanceProfile") or ""])[0]
        profile = size.mig_profile(mig_name) if strategy != "None" else None
        if strategy == "Mixed" and profile is not None:
            allocatable[profile.resource] = str(size.gpus * profile.instances_per_gpu)
        elif strategy == "Single" and profile is not None:
            allocatable["nvidia.com/gpu"] = str(size.gpus * profile.instances_per_gpu)
        else:
            allocatable["nvidia.com/gpu"] = str(size.gpus)
    nodes = []
    for i in range(int(props.get("count") or 0)):
        node = make_node(f"aks-{pool}-12345678-vmss{i:06d}", pool=pool, labels=labels, allocatable=allocatable,
                         conditions=conditions)
        kube.nodes[node.name] = node
        nodes.append(node)
    return nodes


# --------------------------------------------------------------------------- access + context


class FakeAccess:
    def __init__(self, aks: FakeAks) -> None:
        self._aks = aks
        self.kubes: dict[str, FakeKube] = {}

    def aks(self) -> FakeAks:
        return self._aks

    def compute(self) -> Any:
        raise AssertionError("pool creation never calls Microsoft.Compute")

    def kube(self, cluster_id: str) -> FakeKube:
        return self.kubes.setdefault(cluster_id.lower(), FakeKube())


def cluster_info(cid: str, *, nap: bool = False, tags: Mapping[str, str] | None = None) -> ClusterInfo:
    name = cid.rsplit("/", 1)[-1]
    sub = cid.split("/")[2]
    return ClusterInfo(id=cid, name=name, subscription=sub, resource_group=RG, location="westeurope",
                       tags=dict(tags if tags is not None else {"gpu-fleet-steward": "enabled"}),
                       node_resource_group=f"MC_{RG}_{name}_westeurope",
                       node_provisioning_mode="Auto" if nap else "Manual")


@dataclass
class World:
    ctx: Context
    aks: FakeAks
    access: FakeAccess
    events: RecordingEvents
    ledger: InMemoryLedger
    clock: ManualClock
    policy: PoolRequestPolicy = field(default_factory=PoolRequestPolicy)

    def kube(self, cluster: str = CLUSTER) -> FakeKube:
        return self.access.kube(cluster)


def make_world(*, policy: PoolRequestPolicy | None = None, paused: bool = False,
               extra_clusters: Sequence[ClusterInfo] = ()) -> World:
    clusters = [cluster_info(CLUSTER), cluster_info(NAP_CLUSTER, nap=True),
                cluster_info(cluster_id("untagged"), tags={}), *extra_clusters]
    aks = FakeAks(clusters)
    access = FakeAccess(aks)
    events = RecordingEvents()
    ledger = InMemoryLedger()
    clock = ManualClock()
    chosen = policy or PoolRequestPolicy()
    settings = Settings(subscriptions=(SUB,), eventgrid_topic_endpoint="https://topic.example/api/events",
                        paused=paused, pool_requests=chosen)
    ctx = Context(settings=settings, clock=clock, ledger=ledger, access=access, events=events,  # type: ignore[arg-type]
                  telemetry=None)  # type: ignore[arg-type]
    return World(ctx=ctx, aks=aks, access=access, events=events, ledger=ledger, clock=clock, policy=chosen)

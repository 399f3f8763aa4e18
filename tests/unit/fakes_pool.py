"""The pool-request tests' world, over the port fakes of tests/fakes.

Faked (tests/fakes): ARM (clusters, agent pools with provisioningState, PUTs recorded), one Kubernetes
API per cluster (nodes, arbitrary objects such as Jobs and Karpenter objects) and the Event Grid
publisher. This module builds requests and the world (:func:`make_world`), and re-exports the fakes
under the names the tests import. What is real: the ledger (tests.fakes.ledger.InMemoryLedger), the clock (ManualClock), the
validation, the builders and the state machine. ``materialise`` plays the part of AKS bringing up
a pool's nodes the way the simulator does (labels, allocatable GPUs, NPD conditions by profile).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.fleet import gpu_sizes
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.ports import ClusterInfo, Condition, NodeView, Taint
from shared.pools.policy import PoolRequestPolicy
from shared.settings import Settings
from tests.fakes.access import FakeAccess, Fakes
from tests.fakes.aks import FakeAks, Put
from tests.fakes.events import RecordingEvents
from tests.fakes.kube import FakeKube
from tests.fakes.ledger import InMemoryLedger

__all__ = ["CLUSTER", "HEALTHY_NPD", "NAP_CLUSTER", "OTHER_SUB", "RG", "SUB", "FakeAccess", "FakeAks", "FakeKube", "Put",
           "RecordingEvents", "World", "cluster_id", "cluster_info", "make_node", "make_world", "materialise", "message",
           "request"]

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


# --------------------------------------------------------------------------- nodes


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
    """Three clusters (tagged, NAP, untagged); every cluster's API reachable. A pool's PUT stays Creating
    until the test brings it up (:func:`materialise`) or fails it (``aks.set_state``)."""
    clusters = [cluster_info(CLUSTER), cluster_info(NAP_CLUSTER, nap=True),
                cluster_info(cluster_id("untagged"), tags={}), *extra_clusters]
    clock = ManualClock()
    fakes = Fakes(aks=FakeAks(clock, clusters, op_s=None), new_kube=lambda _: FakeKube(clock))
    fakes.aks.kube = fakes.kube_of
    aks = fakes.aks
    access = FakeAccess(fakes)
    events = RecordingEvents()
    ledger = InMemoryLedger()
    chosen = policy or PoolRequestPolicy()
    settings = Settings(subscriptions=(SUB,), eventgrid_topic_endpoint="https://topic.example/api/events",
                        paused=paused, pool_requests=chosen)
    ctx = Context(settings=settings, clock=clock, ledger=ledger, access=access, events=events,  # type: ignore[arg-type]
                  telemetry=None)  # type: ignore[arg-type]
    return World(ctx=ctx, aks=aks, access=access, events=events, ledger=ledger, clock=clock, policy=chosen)

"""GPUs that a node's device plugin does not (or no longer) advertise: the simulator's side of the
``gpu-capacity`` signal (shared/remediation/gpu_capacity.py, issue 18 item 6).

Two faults of nature, each as a real node shows it:

- **A GPU falls off the bus** on a running node (NVIDIA XID 79). The device plugin's health check marks
  the device unhealthy (NVIDIA/k8s-device-plugin internal/rm/health.go) and the kubelet's device manager
  keeps it in ``status.capacity`` but drops it from ``status.allocatable``
  (kubernetes/kubernetes pkg/kubelet/cm/devicemanager/manager.go ``GetCapacity``: capacity counts every
  device, allocatable only the healthy ones). A reboot re-enumerates the PCIe bus and usually brings the
  GPU back (``fixed_by: restart``); a GPU that stays lost needs a new host (``fixed_by: replace``, or
  ``never``). A replace always brings a whole node: a new VM, a new Node.
- **A new node never advertises its GPUs** (or fewer than its size has): the device plugin never
  registers ``nvidia.com/gpu`` (``advertise: absent``) or the GPUs failed to enumerate at boot
  (``advertise: <n>``: capacity and allocatable both ``n``). A bad host stays bad through reboots and
  reimages; only a replace helps (Cluster API's ``nodeStartupTimeout`` remediation deletes the machine).

Control (``/_sim/gpus/...``, sim/core/control.py):

- ``POST /_sim/gpus/lose`` ``{cluster, node | pool[, node_index], count: 1, fixed_by: restart}``
- ``POST /_sim/gpus/add-node`` ``{cluster, pool, advertise: "absent" | n}``: a scale-out by one node (the
  pool's count grows, as the cluster autoscaler would make it) whose GPUs never all show.

State lives in ``node.gpu`` (``lost``, ``lost_fixed_by``, ``advertise``): a new Node starts without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.core.http import Response
from sim.kube.objects import REPAIR_RUNGS

if TYPE_CHECKING:
    from sim.kube.objects import Node
    from sim.model import Cluster

GPU = "nvidia.com/gpu"


def shape(gpu: dict[str, Any], res: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of the GPU resources ``res`` a healthy node would advertise, after this node's faults."""
    if GPU not in res:
        return dict(res), dict(res)  # a MIG node: these faults are about whole GPUs
    advertise = gpu.get("advertise")
    if advertise == "absent":
        return {}, {}
    total = int(res[GPU]) if advertise is None else min(int(advertise), int(res[GPU]))
    lost = min(int(gpu.get("lost", 0) or 0), total)
    return {**res, GPU: str(total)}, {**res, GPU: str(total - lost)}


def on_repair(cluster: Any, node: Node, rung: str, duration: float) -> None:
    """A restart or reimage of ``node`` started: once it is back, a lost GPU its rung fixes is found again."""
    fix = str(node.gpu.get("lost_fixed_by") or "")
    if not node.gpu.get("lost") or fix not in REPAIR_RUNGS or REPAIR_RUNGS.index(fix) > REPAIR_RUNGS.index(rung):
        return
    name, boot = node.name, node.boot

    def back() -> None:
        n = cluster.nodes.get(name)
        if n is None or n.boot != boot:
            return
        n.gpu.pop("lost", None)
        n.gpu.pop("lost_fixed_by", None)
        cluster._apply_gpu_resources(n)
        cluster.touch(n)

    cluster.fleet.after(duration, back)


def _node(cluster: Cluster, body: dict[str, Any]) -> Node:
    if body.get("node"):
        node = cluster.nodes.get(str(body["node"]))
    else:
        nodes = cluster.pool_nodes(str(body["pool"]))
        idx = int(body.get("node_index", 0))
        node = nodes[idx] if 0 <= idx < len(nodes) else None
    if node is None:
        raise KeyError(f"no such node in {cluster.name}: {body.get('node') or body.get('pool')}")
    return node


def control(cluster_of: Any, fleet: Any, method: str, sub: str, body: Any) -> Response | None:
    """``/_sim/gpus/...``; None when the route is not one of these."""
    if method != "POST" or not isinstance(body, dict) or "cluster" not in body:
        return None
    cluster = cluster_of(fleet, body)
    if sub == "/gpus/lose":
        node = _node(cluster, body)
        fixed_by = str(body.get("fixed_by", "restart"))
        if fixed_by not in REPAIR_RUNGS:
            raise ValueError(f"fixed_by must be one of {list(REPAIR_RUNGS)}")
        node.gpu["lost"] = int(node.gpu.get("lost", 0) or 0) + max(1, int(body.get("count", 1)))
        node.gpu["lost_fixed_by"] = fixed_by
        cluster._apply_gpu_resources(node)
        cluster.touch(node)
        fleet.settle()
        status = node.obj["status"]
        return Response.json(200, {"node": node.name, "capacity": status["capacity"].get(GPU),
                                   "allocatable": status["allocatable"].get(GPU)})
    if sub == "/gpus/add-node":
        pool = cluster.pools.get(str(body.get("pool", "")))
        if pool is None:
            raise KeyError(f"no pool {body.get('pool')!r} in {cluster.name}")
        advertise = body.get("advertise", "absent")
        if advertise != "absent" and (not isinstance(advertise, int) or advertise < 0):
            raise ValueError("advertise must be \"absent\" or a number of GPUs")
        pool.properties["count"] = int(pool.properties.get("count") or 0) + 1
        node = cluster._add_pool_node(pool)
        node.gpu["advertise"] = advertise
        cluster._apply_gpu_resources(node)
        cluster.touch(node)
        fleet.settle()
        return Response.json(201, {"node": node.name, "pool": pool.name, "advertise": advertise})
    return None

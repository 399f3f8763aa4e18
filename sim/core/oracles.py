"""Safety oracles: what really happened in the simulated fleet, for tests to assert on.

Tests must not trust the app's own account of its work (logs, records); they ask the simulator.
Every pod termination is recorded with its cause; a disruption that took a PodDisruptionBudget below
``desiredHealthy`` is a violation (evictions are refused before that can happen, direct deletes and
node removals are checked); workload pods that vanished with a node are "lost"; GPU capacity and the
number of unavailable nodes per pool are tracked over time; every request is counted by service,
method and route. ``max_unavailable_per_pool`` counts every cordoned or NotReady node, joining
nodes included; ``max_disrupted_per_pool`` counts only nodes taken away from their pool: cordoned,
or NotReady after having been Ready (a node still joining -- the scenario's nodes at start-up, a
surge or replacement node -- never carried workloads), which is what a disruption budget limits.
The model calls the ``record``/``*_changed`` hooks under ``fleet.lock``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sim.kube.objects import is_workload_pod, parse_quantity

if TYPE_CHECKING:
    from sim.kube.objects import Node, Pod
    from sim.model import Cluster, Fleet

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# POST actions that only read (ARM's list* actions hand out credentials or keys and change nothing).
READ_ACTIONS = ("/listclusterusercredential", "/listclusteradmincredential", "/listclustermonitoringusercredential")


def is_write(method: str, route: str) -> bool:
    """Whether a request changes anything: a write method that is not a read-only action."""
    return method.upper() in WRITE_METHODS and not route.lower().endswith(READ_ACTIONS)
_MAX_SAMPLES = 5000
_MAX_TERMINATIONS = 20000

# ARM-style path segments after which the next segment is a name, for route templates
_COLLECTIONS = {
    "subscriptions", "resourcegroups", "managedclusters", "agentpools", "machines", "maintenanceconfigurations",
    "virtualmachinescalesets", "virtualmachines", "operations", "operationresults", "locations", "providers",
    "deployments", "operationstatuses",
}


def route_template(service: str, path: str) -> str:
    """``/subscriptions/s/resourceGroups/r/...`` -> ``/subscriptions/{}/resourceGroups/{}/...``."""
    parts = [p for p in path.split("/") if p]
    out: list[str] = []
    name_next = False
    for part in parts:
        if name_next and service != "kube":
            out.append("{}" if part.lower() != "microsoft.containerservice" and part.lower() != "microsoft.compute"
                       else part)
            name_next = False
            continue
        out.append(part)
        name_next = part.lower() in _COLLECTIONS and part.lower() != "providers"
    return "/" + "/".join(out)


class Oracles:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._lock = threading.Lock()
        self.terminations: list[dict[str, Any]] = []
        self.pdb_violations: list[dict[str, Any]] = []
        self.pods_killed_without_eviction: list[dict[str, Any]] = []
        self.workload_pods_lost: list[dict[str, Any]] = []
        self.nodes_removed: list[dict[str, Any]] = []
        self.repairs: list[dict[str, Any]] = []
        self.flips: list[dict[str, Any]] = []
        self.gpu_capacity: dict[str, list[dict[str, Any]]] = {}
        self._gpu_now: dict[str, list[int]] = {}
        self._node_gpu: dict[tuple[str, str], tuple[int, int]] = {}
        self._unavailable: dict[tuple[str, str], set[str]] = {}
        self._cordoned: dict[tuple[str, str], set[str]] = {}
        self.max_unavailable_per_pool: dict[str, int] = {}
        self.max_cordoned_per_pool: dict[str, int] = {}
        self._was_ready: set[tuple[str, str]] = set()
        self._disrupted: dict[tuple[str, str], set[str]] = {}
        self.max_disrupted_per_pool: dict[str, int] = {}
        self.requests: Counter[str] = Counter()
        self.requests_by_service: dict[str, Counter[str]] = {}

    # ---- requests
    def record_request(self, *, service: str, method: str, route: str, status: int = 0) -> None:
        with self._lock:
            self.requests[f"{method} {route}"] += 1
            per = self.requests_by_service.setdefault(service, Counter())
            per["total"] += 1
            per["writes" if is_write(method, route) else "reads"] += 1
            per[f"{method} {route}"] += 1
            if status >= 400:
                per[f"status_{status}"] += 1

    # ---- pods
    def pod_terminated(self, cluster: Cluster, pod: Pod, *, cause: str, detail: str = "") -> None:
        """Called before the pod stops counting (deletionTimestamp set, or dropped with its node)."""
        t = self.fleet.now()
        record = {"t": t, "cluster": cluster.name, "namespace": pod.namespace, "pod": pod.name, "node": pod.node_name,
                  "cause": cause, "phase": pod.phase, "workload": is_workload_pod(pod.obj)}
        if detail:
            record["detail"] = detail
        if len(self.terminations) < _MAX_TERMINATIONS:
            self.terminations.append(record)
        if cause in ("eviction", "delete", "node_removal"):
            for pdb, status in cluster.disruption_blockers(pod):
                self.pdb_violations.append({
                    "t": t, "cluster": cluster.name, "namespace": pod.namespace, "pdb": pdb.name, "pod": pod.name,
                    "cause": cause, "currentHealthy": status["currentHealthy"] - 1,
                    "desiredHealthy": status["desiredHealthy"]})
        if not record["workload"] or pod.phase in ("Succeeded", "Failed"):
            return
        if cause == "delete":
            self.pods_killed_without_eviction.append(record)
        if cause == "node_removal":
            self.workload_pods_lost.append(record)

    # ---- nodes
    def node_changed(self, cluster: Cluster, node: Node) -> None:
        key = (cluster.name, node.name)
        try:
            alloc = int(parse_quantity(node.obj["status"]["allocatable"].get("nvidia.com/gpu", 0)))
        except ValueError:
            alloc = 0
        sched = alloc if node.ready and not node.unschedulable else 0
        self._set_gpu(cluster.name, key, (alloc, sched))
        pool_key = (cluster.name, node.pool)
        label = f"{cluster.name}/{node.pool}"
        for sets, maxima, flag in ((self._unavailable, self.max_unavailable_per_pool, node.unschedulable or not node.ready),
                                   (self._cordoned, self.max_cordoned_per_pool, node.unschedulable)):
            members = sets.setdefault(pool_key, set())
            if flag:
                members.add(node.name)
            else:
                members.discard(node.name)
            maxima[label] = max(maxima.get(label, 0), len(members))
        if node.ready:
            self._was_ready.add(key)
        disrupted = self._disrupted.setdefault(pool_key, set())
        if node.unschedulable or (not node.ready and key in self._was_ready):
            disrupted.add(node.name)
        else:
            disrupted.discard(node.name)
        self.max_disrupted_per_pool[label] = max(self.max_disrupted_per_pool.get(label, 0), len(disrupted))

    def node_removed(self, cluster: Cluster, node: Node, *, cause: str) -> None:
        self._set_gpu(cluster.name, (cluster.name, node.name), (0, 0))
        self._node_gpu.pop((cluster.name, node.name), None)
        self._unavailable.get((cluster.name, node.pool), set()).discard(node.name)
        self._cordoned.get((cluster.name, node.pool), set()).discard(node.name)
        self._disrupted.get((cluster.name, node.pool), set()).discard(node.name)
        self._was_ready.discard((cluster.name, node.name))
        # With what the Node object showed as it went (whose cordon it was under: a fact no published event or
        # later state can lose; soak seed 961714, a NodeClaim deleted with its Cordoned event lost).
        meta, spec = node.obj.get("metadata") or {}, node.obj.get("spec") or {}
        self.nodes_removed.append({"t": self.fleet.now(), "cluster": cluster.name, "node": node.name,
                                   "pool": node.pool, "cause": cause, "unschedulable": bool(spec.get("unschedulable")),
                                   "annotations": dict(meta.get("annotations") or {})})

    def record_flip(self, cluster: Cluster, node: str, flip: Mapping[str, Any]) -> None:
        """A scenario's condition flip as it fired: the node its ``node_index`` resolved to among the pool's
        nodes at that moment (after a replacement the index names another node than at the start; soak seed
        959008: two flips at once, each put down to the wrong node by a guess from the start's order), and the
        cure it drew: a flip on a condition already True draws the node's cure again (sim/kube/nodes.py
        ``set_condition``), which no new fault shows (soak seed 960143)."""
        self.flips.append({"t": self.fleet.now(), "cluster": cluster.name, "pool": str(flip.get("pool", "")),
                           "node_index": flip.get("node_index"), "type": str(flip.get("type", "")),
                           "status": str(flip.get("status", "True")), "at": flip.get("at"), "node": node,
                           "fixed_by": str(flip.get("fixed_by", "restart"))})

    def record_repair(self, cluster: Cluster, node: str, rung: str, *, unschedulable: bool = False,
                      annotations: Mapping[str, str] | None = None) -> None:
        """A VM restart or reimage of ``node``, with what its Node object showed when the VM went down (its
        ``spec.unschedulable`` and annotations: whose cordon it was under, a fact no published event or
        later state can lose; soak seed 956017: the Cordoned event lost to Event Grid 503s, the marker
        lifted by the repair's uncordon)."""
        self.repairs.append({"t": self.fleet.now(), "cluster": cluster.name, "node": node, "rung": rung,
                             "unschedulable": unschedulable, "annotations": dict(annotations or {})})

    def _set_gpu(self, cluster: str, key: tuple[str, str], value: tuple[int, int]) -> None:
        old = self._node_gpu.get(key, (0, 0))
        if old == value:
            return
        self._node_gpu[key] = value
        totals = self._gpu_now.setdefault(cluster, [0, 0])
        totals[0] += value[0] - old[0]
        totals[1] += value[1] - old[1]
        series = self.gpu_capacity.setdefault(cluster, [])
        sample = {"t": self.fleet.now(), "allocatable": totals[0], "schedulable": totals[1]}
        if series and series[-1]["t"] == sample["t"]:
            series[-1] = sample
        else:
            series.append(sample)
        if len(series) > _MAX_SAMPLES:
            del series[1 : len(series) - _MAX_SAMPLES + 1]

    def start_of_run(self) -> None:
        """Forget what happened while the scenario's own fleet was being set up (nodes joining NotReady):
        maxima restart from the current state, capacity series from one current sample."""
        for sets, maxima in ((self._unavailable, self.max_unavailable_per_pool),
                             (self._cordoned, self.max_cordoned_per_pool)):
            maxima.clear()
            for (cluster, pool), members in sets.items():
                maxima[f"{cluster}/{pool}"] = len(members)
        t = self.fleet.now()
        for cluster, totals in self._gpu_now.items():
            self.gpu_capacity[cluster] = [{"t": t, "allocatable": totals[0], "schedulable": totals[1]}]

    def sample_gpu_capacity(self) -> None:
        """Nothing to do: capacity is sampled on every node change (kept for the pump's call)."""

    # ---- report
    def report(self) -> dict[str, Any]:
        with self.fleet.lock, self._lock:
            causes = Counter(t["cause"] for t in self.terminations)
            return {
                "pdb_violations": list(self.pdb_violations),
                "pods_killed_without_eviction": list(self.pods_killed_without_eviction),
                "workload_pods_lost": list(self.workload_pods_lost),
                "terminations": list(self.terminations),
                "termination_causes": dict(sorted(causes.items())),
                "nodes_removed": list(self.nodes_removed),
                "repairs": list(self.repairs),
                "flips": list(self.flips),
                "gpu_capacity": {k: list(v) for k, v in sorted(self.gpu_capacity.items())},
                "gpu_capacity_now": {k: {"allocatable": v[0], "schedulable": v[1]}
                                     for k, v in sorted(self._gpu_now.items())},
                "max_unavailable_per_pool": dict(sorted(self.max_unavailable_per_pool.items())),
                "max_cordoned_per_pool": dict(sorted(self.max_cordoned_per_pool.items())),
                "max_disrupted_per_pool": dict(sorted(self.max_disrupted_per_pool.items())),
                "requests": dict(sorted(self.requests.items())),
                "requests_by_service": {k: dict(sorted(v.items())) for k, v in sorted(self.requests_by_service.items())},
            }


def kube_route(path: str) -> str:
    """A Kubernetes path under /k8s/<sub>/<rg>/<cluster> as a route template (names replaced by {})."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["k8s"]:
        parts = parts[4:]
    out = []
    i = 0
    if parts[:1] == ["api"]:
        out, i = parts[:2], 2
    elif parts[:1] == ["apis"]:
        out, i = parts[:3], 3
    rest = parts[i:]
    if len(rest) >= 2 and rest[0] == "namespaces":
        out += ["namespaces", "{}"]
        rest = rest[2:]
    if rest:
        out.append(rest[0])
        if len(rest) > 1:
            out.append("{}")
            out += rest[2:]
    return "/k8s/{}/" + "/".join(out) if out else "/k8s/{}/"


"""The simulated fleet's state and the behaviour of its live clusters.

Everything that changes in the simulator changes here, under ``fleet.lock``: the ARM half calls the
``Cluster`` methods to make nodes appear and go, the Kubernetes API handler reads and writes the
objects, and the timed callbacks (``fleet.at``) move the world on a scaled clock (nodes turning
Ready, pods finishing their grace period, jobs completing). A small set of controllers (ReplicaSet,
Deployment, StatefulSet, DaemonSet, Job, PodDisruptionBudget status, node auto-provisioning) and a
scheduler run after every change so that a drain behaves as on a real cluster: evicted pods come
back elsewhere, and a PDB blocks until they do.

Determinism: given the same scenario and seed, names, ids and ordering depend only on ``fleet.rng``
and sorted iteration; timed callbacks run in (time, sequence) order and stamp objects with their own
due time, not with the wall clock at which the pump happened to run them.

This module holds the :class:`Fleet`, its clock and the :class:`Cluster` facade. A cluster's behaviour
lives in one part per concern, each a mixin of :class:`Cluster` over the state its ``__init__`` sets:

- :mod:`sim.kube.store`: objects, resourceVersions, the change log watches read;
- :mod:`sim.kube.namespaces`: NamespaceLifecycle admission and the namespace controller;
- :mod:`sim.kube.machines`: a pool's VMs, the nodes they register, spot eviction;
- :mod:`sim.kube.nodes`: kubelet readiness, repairs, node-problem-detector conditions, node deletion;
- :mod:`sim.kube.pods`: pod creation, start, graceful deletion and finalizers;
- :mod:`sim.kube.workloads`: the Deployment, ReplicaSet, StatefulSet, DaemonSet and Job controllers;
- :mod:`sim.kube.disruption`: PodDisruptionBudgets and the disruption controller;
- :mod:`sim.kube.scheduler`: binding pending pods;
- :mod:`sim.kube.nap`: node auto-provisioning (Karpenter NodeClaims).

Shared pieces: :mod:`sim.kube.objects` (stored objects, time stamps, quantities), :mod:`sim.kube.selectors`
(label selectors) and :mod:`sim.core.sizes` (VM sizes). The names other code imports from here are
re-exported below, so ``from sim.model import ...`` keeps working.
"""

from __future__ import annotations

import collections
import heapq
import inspect
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sim.core.oracles import Oracles
from sim.core.sizes import gpu_sizes, size_info
from sim.identity.tokens import TokenIssuer
from sim.kube.disruption import MAX_DISRUPTED_POD_SIZE, PDB_DELETION_TIMEOUT_S, Disruption
from sim.kube.machines import PREEMPT_TAINT, SHUTDOWN_TAINT, SPOT_LABEL, SPOT_NOTICE_S, Machines
from sim.kube.namespaces import IMMORTAL_NAMESPACES, Namespaces, namespace_terminating_error
from sim.kube.nap import NAP_RESOURCES, Autoprovisioner
from sim.kube.nodes import NPD_BASE_CONDITIONS, NPD_GPU_CONDITIONS, NPD_GPU_REASONS, Nodes
from sim.kube.objects import (
    MANAGED_GPU_TAG,
    REPAIR_RUNGS,
    KObj,
    Node,
    Pod,
    Pool,
    base36,
    controller_of,
    is_mirror,
    is_workload_pod,
    iso,
    never_ready,
    parse_iso,
    parse_quantity,
    pod_requests,
)
from sim.kube.pods import FINALIZER_RELEASE_ANNOTATION, Pods
from sim.kube.scheduler import Scheduler
from sim.kube.selectors import SelectorError, match_requirements, parse_label_selector, selector_requirements
from sim.kube.store import RESOURCES, Store
from sim.kube.workloads import Controllers

__all__ = [
    "DEFAULT_TIMINGS", "FINALIZER_RELEASE_ANNOTATION", "IMMORTAL_NAMESPACES", "LOW_PRIORITY_QUOTA", "MANAGED_GPU_TAG",
    "MAX_DISRUPTED_POD_SIZE", "NAP_RESOURCES", "NPD_BASE_CONDITIONS", "NPD_GPU_CONDITIONS", "NPD_GPU_REASONS",
    "OPTIONAL_TIMINGS", "PDB_DELETION_TIMEOUT_S", "PREEMPT_TAINT", "REPAIR_RUNGS", "RESOURCES", "SHUTDOWN_TAINT", "SPOT_LABEL",
    "SPOT_NOTICE_S", "Cluster", "Fleet", "KObj", "Node", "Pod", "Pool", "SelectorError", "SimClock", "base36",
    "controller_of", "gpu_sizes", "is_mirror", "is_workload_pod", "iso", "match_requirements",
    "namespace_terminating_error", "never_ready", "parse_iso", "parse_label_selector", "parse_quantity",
    "pod_requests", "selector_requirements", "size_info",
]

log = logging.getLogger("sim.model")

DEFAULT_TIMINGS: dict[str, float] = {
    "pool_create_s": 60.0,
    "pool_delete_s": 45.0,
    "pool_scale_s": 30.0,
    "pool_update_s": 30.0,  # an update that changes no count (sim/arm/pools.py)
    "delete_machines_s": 30.0,
    "node_ready_s": 20.0,
    "restart_s": 30.0,
    "reimage_s": 90.0,
    # AKS operations' end as the abort that ended them (recorded: test_aks_abort.json, the abort's own operation
    # ran 03:27:04 -> 03:27:09)
    "abort_s": 5.0,
    "pod_start_s": 2.0,
    "job_run_s": 60.0,
    "nap_provision_s": 30.0,
    "nap_terminate_s": 10.0,  # Karpenter's termination of a deleted NodeClaim (node and VM gone)
    # node-problem-detector's custom plugin monitor after a boot: it runs every rule once on start
    # (kubernetes/node-problem-detector pkg/custompluginmonitor/plugin/plugin.go ``Run``: "On boot, run every
    # rule in one batch", before its interval tickers), each run bounded by the rule's timeout (5 s by default,
    # pkg/custompluginmonitor/types/config.go ``defaultGlobalTimeout``), and the k8s exporter's condition
    # manager writes a changed condition within its 1 s ``updatePeriod`` (pkg/exporters/k8sexporter/condition/
    # manager.go). So a fault that survived the boot is True again at most ~6 s after NPD's start: the
    # default is that worst case, a plugin that runs to its timeout.
    "npd_first_check_s": 6.0,
    # the disruption controller's lag: a PDB created or changed (spec, or status written by a client)
    # is observed this long after (status.observedGeneration < metadata.generation until then)
    "pdb_observe_s": 1.0,
    # the node lifecycle controller's lag: its NoSchedule taint pass (cordon, conditions) after a Node write
    "node_taint_s": 0.5,
}

# Timings a scenario may set that have no default (their absence means something):
# ``lro_retry_after_s`` - a Retry-After on AKS operations, a harness convenience: AKS sends none (sim/arm/lro.py).
OPTIONAL_TIMINGS = frozenset({"lro_retry_after_s", "eventgrid_max_attempts"})

LOW_PRIORITY_QUOTA = "lowPriorityCores"  # the regional Spot vCPU quota (Microsoft.Compute usages name)


# --------------------------------------------------------------------------- clock


class SimClock:
    """Fleet time: ``epoch_sim + (wall - epoch_real) * speed``; or manual (moves only on ``advance``)."""

    def __init__(self, *, speed: float = 1.0, epoch_sim: float | None = None, epoch_real: float | None = None,
                 manual: bool = False) -> None:
        self.speed = float(speed) if speed and speed > 0 else 1.0
        self.epoch_real = time.time() if epoch_real is None else float(epoch_real)
        self.epoch_sim = self.epoch_real if epoch_sim is None else float(epoch_sim)
        self.manual = manual
        self._offset = 0.0

    def now(self) -> float:
        if self.manual:
            return self.epoch_sim + self._offset
        return self.epoch_sim + (time.time() - self.epoch_real) * self.speed + self._offset

    def advance(self, seconds: float) -> None:
        self._offset += max(0.0, float(seconds))

    def published(self) -> dict[str, Any]:
        return {"epoch_real": self.epoch_real, "epoch_sim": self.epoch_sim, "speed": self.speed,
                "manual": self.manual}


# --------------------------------------------------------------------------- fleet


class Fleet:
    """All simulated state. Build it with :func:`sim.scenario.build_fleet` or directly for unit tests."""

    def __init__(self, *, seed: int = 0, clock: SimClock | None = None, timings: dict[str, float] | None = None,
                 faults: list[dict[str, Any]] | None = None, token_key: bytes | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.lock = threading.RLock()
        self.clock = clock or SimClock()
        self.timings: dict[str, float] = dict(DEFAULT_TIMINGS)
        self.timings.update({k: float(v) for k, v in (timings or {}).items()})
        self.tokens = TokenIssuer(now=self.clock.now, key=token_key, lifetime_s=24 * 3600)
        self.oracles = Oracles(self)
        self.clusters: dict[str, Cluster] = {}
        self.quotas: dict[tuple[str, str, str], int] = {}
        self.capacity: dict[tuple[str, str], int] = {}
        # ARM actions taken away from the app's role (tests and the soak remove a grant to see the
        # path fail); sim.arm.api.granted_arm_actions subtracts them from the role the project declares.
        self.revoked_arm_actions: set[str] = set()
        # Resource group ids the linked-resources role is assigned on (infra/main.bicep linkedResourceGroupIds,
        # default []): the join/write actions on a linked subnet, IP prefix or PPG hold only inside them.
        self.arm_linked_resource_groups: set[str] = set()
        self.scenario: dict[str, Any] = {}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._now_override: float | None = None
        self._pump_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.faults: Any = _make_fault_engine(self, faults or [])

    # ---- time
    def now(self) -> float:
        """The current sim time; inside a timed callback, the callback's due time (deterministic stamps)."""
        return self._now_override if self._now_override is not None else self.clock.now()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` (under the lock) once the sim clock reaches ``when``."""
        with self.lock:
            self._seq += 1
            heapq.heappush(self._timers, (float(when), self._seq, fn))

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        self.at(self.now() + max(0.0, seconds), fn)

    def pump(self) -> None:
        """Run every timed callback that is due, then let the controllers settle."""
        with self.lock:
            now = self.clock.now()
            while self._timers and self._timers[0][0] <= now:
                when = self._timers[0][0]
                self._now_override = when
                try:
                    # everything due at the same instant first (nodes of one pool turn Ready together),
                    # then the controllers and the scheduler see the result
                    while self._timers and self._timers[0][0] == when:
                        _when, _seq, fn = heapq.heappop(self._timers)
                        try:
                            fn()
                        except Exception:
                            log.exception("timed callback failed")
                    self.settle()
                except Exception:
                    log.exception("settling after timed callbacks failed")
                finally:
                    self._now_override = None
            self.settle()

    def settle(self) -> None:
        """Run the controllers and the scheduler of every cluster that changed."""
        for key in sorted(self.clusters):
            c = self.clusters[key]
            if c.dirty:
                c.reconcile()

    def advance(self, seconds: float) -> None:
        """Move the clock forward (manual clocks) and run what became due, step by step."""
        with self.lock:
            self.pump()
            target = self.clock.now() + max(0.0, seconds)
            while self._timers and self._timers[0][0] <= target:
                step = self._timers[0][0] - self.clock.now()
                if step > 0:
                    self.clock.advance(step)
                self.pump()
            rest = target - self.clock.now()
            if rest > 0:
                self.clock.advance(rest)
            self.pump()

    def next_timer(self) -> float | None:
        with self.lock:
            return self._timers[0][0] if self._timers else None

    def start(self, interval_s: float = 0.05) -> None:
        """Start the background pump (real time)."""
        if self._pump_thread:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                if not self.clock.manual:
                    self.pump()
                self.oracles.sample_gpu_capacity()

        self._pump_thread = threading.Thread(target=loop, name="sim-pump", daemon=True)
        self._pump_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._pump_thread:
            self._pump_thread.join(timeout=2)
            self._pump_thread = None

    # ---- ids
    def new_uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def rand_suffix(self, n: int = 5) -> str:
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    # ---- clusters
    def add_cluster(self, *, subscription: str, resource_group: str, name: str, location: str = "eastus",
                    tags: dict[str, str] | None = None, node_provisioning_mode: str = "Manual",
                    kubernetes_version: str = "1.32.4") -> Cluster:
        with self.lock:
            cid = (f"/subscriptions/{subscription}/resourceGroups/{resource_group}"
                   f"/providers/Microsoft.ContainerService/managedClusters/{name}")
            c = Cluster(self, id=cid, name=name, subscription=subscription, resource_group=resource_group,
                        location=location, tags=dict(tags or {}), node_provisioning_mode=node_provisioning_mode,
                        kubernetes_version=kubernetes_version)
            self.clusters[cid.lower()] = c
            # the cluster comes "deployed": the app's namespace and RBAC (infra/kubernetes), for its identity
            from sim.identity import app_principal_id
            from sim.kube.rbac import deploy_app_manifests

            deploy_app_manifests(c, app_principal_id(self))
            return c

    def cluster(self, sub: str, rg: str, name: str) -> Cluster | None:
        cid = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.ContainerService/managedClusters/{name}"
        return self.clusters.get(cid.lower())

    def cluster_by_name(self, name: str) -> Cluster | None:
        for key in sorted(self.clusters):
            if self.clusters[key].name == name:
                return self.clusters[key]
        return None

    def vcpus_in_use(self, sub: str, location: str, family: str) -> int:
        """vCPUs counted against a quota: a VM family's, or ``lowPriorityCores`` (every spot VM).

        Spot VMs count against the region's one low-priority quota, not their family's
        (https://learn.microsoft.com/azure/virtual-machines/spot-vms#quota; the usage name is
        ``lowPriorityCores``, "Total Regional Low-priority vCPUs").
        """
        total = 0
        low_priority = family.lower() == LOW_PRIORITY_QUOTA.lower()
        with self.lock:
            for c in self.clusters.values():
                if c.subscription.lower() != sub.lower() or c.location.lower() != location.lower():
                    continue
                for pool in c.pools.values():
                    info = size_info(pool.properties.get("vmSize", ""))
                    spot = str(pool.properties.get("scaleSetPriority") or "").lower() == "spot"
                    if spot != low_priority:
                        continue
                    if low_priority or (getattr(info, "family", "") or "").lower() == family.lower():
                        total += int(pool.properties.get("count") or 0) * int(info.vcpus)
                for node in c.nodes.values():
                    if node.nap:
                        info = size_info(node.labels.get("node.kubernetes.io/instance-type", ""))
                        if (node.labels.get("karpenter.sh/capacity-type") == "spot") != low_priority:
                            continue
                        if low_priority or (getattr(info, "family", "") or "").lower() == family.lower():
                            total += int(info.vcpus)
        return total

    def state(self) -> dict[str, Any]:
        """A summary for /_sim/state and the determinism tests (no wall-clock values)."""
        with self.lock:
            return {"clock": {"now": self.clock.now(), **self.clock.published()},
                    "clusters": [self.clusters[k].summary() for k in sorted(self.clusters)]}


def _make_fault_engine(fleet: Fleet, rules: list[dict[str, Any]]) -> Any:
    """The ARM half's FaultEngine, built with whatever of (fleet, rules, clock, rng) it asks for."""
    try:
        from sim.core.faults import FaultEngine  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        params = inspect.signature(FaultEngine).parameters
    except (TypeError, ValueError):
        params = {}
    offer: dict[str, Any] = {"fleet": fleet, "rules": list(rules), "clock": fleet.clock, "rng": fleet.rng,
                             "now": fleet.now}
    kwargs = {k: v for k, v in offer.items() if k in params}
    try:
        return FaultEngine(**kwargs)
    except TypeError:
        engine = FaultEngine()  # type: ignore[call-arg]
        for rule in rules:
            engine.add(rule)
        return engine


# --------------------------------------------------------------------------- cluster


class Cluster(Store, Namespaces, Machines, Nodes, Pods, Controllers, Disruption, Scheduler, Autoprovisioner):
    """One simulated AKS cluster: its state, set up here, and the behaviour of its parts (the mixins,
    one per concern: see the module docstring). ``reconcile`` runs its controllers after a change."""

    def __init__(self, fleet: Fleet, *, id: str, name: str, subscription: str, resource_group: str, location: str,
                 tags: dict[str, str], node_provisioning_mode: str, kubernetes_version: str) -> None:
        self.fleet = fleet
        self.id = id
        self.name = name
        self.subscription = subscription
        self.resource_group = resource_group
        self.location = location
        self.tags = tags
        self.node_resource_group = f"MC_{resource_group}_{name}_{location}"
        # Node resource group lockdown (restrictionLevel ReadOnly, preset on AKS Automatic): a deny
        # assignment leaves only */read to everyone but AKS itself (learn.microsoft.com/azure/aks/node-resource-group-lockdown).
        self.node_rg_locked = False
        self.node_provisioning_mode = node_provisioning_mode
        self.kubernetes_version = kubernetes_version
        self.maintenance_configurations: dict[str, dict[str, Any]] = {}
        self.pools: dict[str, Pool] = {}
        self.busy_until = 0.0
        # the ARM provisioningState when no cluster operation runs: "Canceled" after an abort (sim/arm/aborts.py)
        self.provisioning_state = "Succeeded"
        # agent pools carry properties.eTag (scenario key pool_etags; AKS rolled eTags out in 2025)
        self.pool_etags = True
        self.nodes: dict[str, Node] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.store: dict[str, dict[tuple[str, str], KObj]] = {r: {} for r in self.resources()}
        self.pods_by_node: dict[str, set[tuple[str, str]]] = {}
        self.pods_by_owner: dict[str, set[tuple[str, str]]] = {}
        self.pending: set[tuple[str, str]] = set()
        self.rv = 1000
        self.dirty = True
        self.nap_inflight: dict[str, str] = {}   # pending pod uid -> node being provisioned for it
        self.job_run_s: dict[tuple[str, str], float] = {}  # (ns, job) -> run time of its pods
        self.list_snapshots: dict[str, tuple[str, list[bytes]]] = {}
        self.watchers = 0
        self.tombstones: collections.deque[tuple[int, str, bytes]] = collections.deque(maxlen=5000)
        self.changes: collections.deque[tuple[int, str, str, bytes]] = collections.deque(maxlen=20000)
        self.changed = threading.Condition(fleet.lock)
        # deletion lifecycle: pods held by metadata.finalizers after their final delete, namespaces
        # being terminated by the namespace controller, and the disruption controller's bookkeeping
        self.finalizing: set[tuple[str, str]] = set()
        self.terminating_namespaces: set[str] = set()
        self.namespace_sync_due: dict[str, float] = {}
        self.pdb_synced_rv: dict[tuple[str, str], str] = {}
        self.pdb_observe_due: dict[tuple[str, str], float] = {}
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.ensure_namespace(ns)

    @property
    def nap(self) -> bool:
        return self.node_provisioning_mode.lower() == "auto"

    def reconcile(self) -> None:
        """Controllers then scheduler until nothing changes (bounded)."""
        for _ in range(5):
            self.dirty = False
            self._deployments()
            self._replicasets()
            self._statefulsets()
            self._daemonsets()
            self._jobs()
            self._schedule()
            if self.nap:
                self._autoprovision()
            self._pdb_statuses()
            self._release_finalized()
            self._namespaces()
            if not self.dirty:
                break
        self.dirty = False

    def summary(self) -> dict[str, Any]:
        pools = []
        for pname in sorted(self.pools):
            p = self.pools[pname]
            pools.append({"name": pname, "vmSize": p.properties.get("vmSize"), "count": p.properties.get("count"),
                          "provisioningState": p.provisioning_state, "managed_gpu": p.managed_gpu,
                          "nodes": [n.name for n in self.pool_nodes(p)]})
        nodes = []
        for name in sorted(self.nodes):
            n = self.nodes[name]
            bad = sorted(c["type"] for c in n.obj["status"]["conditions"]
                         if c["type"] in NPD_GPU_CONDITIONS and c["status"] == "True")
            nodes.append({"name": name, "pool": n.pool, "ready": n.ready, "unschedulable": n.unschedulable,
                          "unhealthy": bad, "pods": len(self.pods_by_node.get(name, ())),
                          "gpu": n.obj["status"]["allocatable"].get("nvidia.com/gpu", "0")})
        pods = [{"namespace": p.namespace, "name": p.name, "node": p.node_name, "phase": p.phase,
                 "terminating": p.terminating} for p in self.items("pods")]
        return {"id": self.id, "name": self.name, "tags": dict(self.tags), "node_provisioning_mode":
                self.node_provisioning_mode, "pools": pools, "nodes": nodes, "pods": pods}

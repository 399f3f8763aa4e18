"""One real 16-node pool migration on the simulator through a local Functions host, observed from outside.

Shared by the migration and request-count benchmarks (memoised per scale). The fleet: one cluster
with an unmanaged T4 pool of 16 single-GPU nodes (taint, labels, zones) running one GPU pod per node
(a Deployment with a 30 s grace period and a PodDisruptionBudget of ``maxUnavailable: 4``, equal
to the migration's batch size) and a system pool. The job runs from its own timer with
``MIGRATION_ENABLED=true`` and the surge strategy; the health sweep is scheduled once a year so that
every ARM and Kubernetes request the simulator counts is the migration job's (its planner included).

The critical path is what the simulator makes unavoidable, from the scenario's own timings: the
replacement pool's creation (``pool_create_s``) and its nodes joining (``node_ready_s``), then
``ceil(16 / batch)`` drains that the budgets allow one after the other, each lasting
``max(grace period, pod_start_s)`` (the pods' termination, and the PDB waiting for replacements to
be Ready), then the old pool's deletion (``pool_delete_s``). All times are simulated seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from bench.remediation_run import counts
from bench.scale import Scale

CLUSTER = "bench-mig"
POOL = "t4old"
BATCH = 4
GRACE_S = 30
TIMINGS = {"pool_create_s": 60, "pool_delete_s": 45, "pool_scale_s": 30, "delete_machines_s": 30, "node_ready_s": 10,
           "lro_retry_after_s": 2, "pod_start_s": 2}

PROFILE: dict[str, str] = {
    "MIGRATION_ENABLED": "true",
    "MIGRATION_SCHEDULE": "*/10 * * * * *",
    "RECONCILE_SCHEDULE": "*/2 * * * * *",
    "SWEEP_SCHEDULE": "0 0 0 1 1 *",  # once a year: the sweep's requests stay out of the counts
    "MIGRATION_STRATEGY": "surge",
    "MIGRATION_BATCH_SIZE": str(BATCH),
    "MIGRATION_POLL_INTERVAL_S": "2",
    "MIGRATION_MAX_CONCURRENT": "2",
    "MIGRATION_VALIDATE_TIMEOUT_S": "600",
    "MIGRATION_CREATE_TIMEOUT_S": "900",
    "MIGRATION_DRAIN_TIMEOUT_S": "900",
    "MIGRATION_GPU_VCPU_HEADROOM": "eastus:*=100000",
}

_cache: dict[str, MigrationRun] = {}


@dataclass
class MigrationRun:
    nodes: int
    speed: float
    critical_path_s: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None
    state: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    gpu_before: int = 0
    gpu_min: int | None = None
    problems: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


def scenario(scale: Scale) -> dict[str, Any]:
    n = scale.migration_nodes
    return {
        "seed": 41,
        "clock": {"speed": scale.speed},
        "timings": dict(TIMINGS),
        "subscriptions": [{
            "id": "00000000-0000-0000-0000-0000000be7c2",
            "quotas": [{"location": "eastus", "family": f, "limit": 100000}
                       for f in ("standardNCASv3_T4Family", "standardDSv5Family")],
            "clusters": [{
                "name": CLUSTER, "resource_group": "rg-bench-mig", "location": "eastus",
                "tags": {"gpu-fleet-steward": "enabled"},
                "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                          {"name": POOL, "mode": "User", "vmSize": "Standard_NC4as_T4_v3", "count": n,
                           "availabilityZones": ["1", "2", "3"], "nodeTaints": ["sku=gpu:NoSchedule"],
                           "nodeLabels": {"gpu": "t4", "team": "serving"}, "device_plugin": True}],
                "workloads": [{
                    "kind": "Deployment", "name": "serve", "namespace": "ml", "replicas": n,
                    "resources": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"},
                    "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
                    "nodeSelector": {"gpu": "t4"}, "pdb": {"maxUnavailable": BATCH},
                    "terminationGracePeriodSeconds": GRACE_S}]}]}],
    }


def critical_path(nodes: int) -> dict[str, float]:
    batches = math.ceil(nodes / BATCH)
    return {"create": float(TIMINGS["pool_create_s"] + TIMINGS["node_ready_s"]),
            "drains": float(batches * max(GRACE_S, TIMINGS["pod_start_s"])),
            "delete": float(TIMINGS["pool_delete_s"]), "batches": float(batches)}


def get(scale: Scale) -> MigrationRun:
    if scale.name not in _cache:
        _cache[scale.name] = _run(scale)
    return _cache[scale.name]


def _run(scale: Scale) -> MigrationRun:
    import devstack

    run = MigrationRun(nodes=scale.migration_nodes, speed=scale.speed)
    run.parts = critical_path(scale.migration_nodes)
    run.critical_path_s = run.parts["create"] + run.parts["drains"] + run.parts["delete"]
    try:
        with devstack.running(scenario=scenario(scale), seed=41, profile=PROFILE, hosts=1,
                              host_json=devstack.FAST_HOST_JSON) as stack:
            _drive(stack, run, scale)
    except Exception as error:
        run.error = f"{type(error).__name__}: {error}"[:400]
    return run


def _records(ledger: Any) -> list[Any]:
    from shared.kernel.errors import NotFound

    try:
        return [r for r in ledger.list("migration") if r.data.get("pool") == POOL]
    except NotFound:  # the table does not exist before the host's first write
        return []


def _drive(stack: Any, run: MigrationRun, scale: Scale) -> None:
    sim = stack.sim
    ledger = stack.ledger()
    deadline = time.monotonic() + scale.timeout_s
    record = None
    while time.monotonic() < deadline:
        found = _records(ledger)
        record = found[-1] if found else None
        if record is not None and record.state in ("done", "rolled_back", "blocked"):
            break
        time.sleep(0.25)
    oracles = sim.oracles()
    run.counts = counts(oracles)  # everything since the simulator started: only the host talks to it
    series = oracles["gpu_capacity"].get(CLUSTER) or []
    if record is None:
        raise RuntimeError(f"no migration record for {POOL} within {scale.timeout_s:.0f} s wall")
    run.state = record.state
    run.history = list(record.history)
    if record.state != "done":
        raise RuntimeError(f"the migration ended {record.state}, not done: {record.history[-3:]}")
    run.started_at = float(run.history[0]["at"]) if run.history else record.created_at
    run.finished_at = next((float(h["at"]) for h in run.history if h.get("state") == "done"), record.updated_at)
    during = [s for s in series if run.started_at <= s["t"] <= run.finished_at]
    before = [s for s in series if s["t"] <= run.started_at]
    run.gpu_before = int(before[-1]["schedulable"]) if before else 0
    run.gpu_min = min((int(s["schedulable"]) for s in during), default=run.gpu_before)
    if oracles["pdb_violations"] or oracles["pods_killed_without_eviction"] or oracles["workload_pods_lost"]:
        run.problems.append(f"oracles: {len(oracles['pdb_violations'])} PDB violations, "
                            f"{len(oracles['pods_killed_without_eviction'])} pods killed without eviction, "
                            f"{len(oracles['workload_pods_lost'])} workload pods lost")

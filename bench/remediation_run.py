"""One real remediation on the simulator through a local Functions host, observed from outside.

Shared by four benchmarks (reaction, drain_time, requests, time_to_repair): starting Azurite, the
simulator and a host costs more than any of them measures, so the run happens once per scale and is
memoised (:func:`get`). time_to_repair also needs one run per rung of the ladder (:func:`get_rung`,
memoised per scale and rung): the same fleet and fault with ``REMEDIATION_LADDER`` set to that one
rung and the condition's ``fixed_by`` to it, so the first rung is the one that cures the node. The
restart rung's run is :func:`get`'s; the reimage and replace runs skip the quiet window (they count
no requests) and the replace run's scenario adds the pool operations' timings (``pool_scale_s``,
``delete_machines_s``); the scenario's quota (far above one more GPU VM) lets the replace surge.

The fleet: one cluster, a one-node A100 pool running 100 workload pods of four Deployments whose
grace periods are 10, 20, 30 and 60 s (no PDB: the drain's length is the grace periods', not a
budget's), and a system pool. Once the host has swept the fleet a few times (the quiet window, which
also measures the background requests of sweeps), the node's ``UnhealthyNvidiaDevicePlugin`` is set
``True`` through the control API. Everything is then read from outside the app: the flip time from
the condition's ``lastTransitionTime``, the cordon time by polling the simulator's ``/_sim/state``
(whose answers carry the simulator's own clock and are not counted as requests), the drain from the
simulator's termination oracle and the ledger record's history, and request counts from the
oracles. All times are simulated seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench.scale import Scale

CLUSTER = "bench-rem"
POOL = "gpu"
CONDITION = "UnhealthyNvidiaDevicePlugin"
SWEEP_INTERVAL_S = 30
THRESHOLD_S = 60
GRACES = (10, 20, 30, 60)
RESTART_S = 20  # the simulator's VM restart, until the node is Ready again (timings.restart_s)
REIMAGE_S = 60  # the simulator's VM reimage, until the node is Ready again (timings.reimage_s)
NODE_READY_S = 5  # a new node joins NotReady and turns Ready this long after (timings.node_ready_s)
POOL_SCALE_S = 30  # the count change's LRO; the new node joins when it ends (timings.pool_scale_s, the sim's default)
DELETE_MACHINES_S = 30  # deleteMachines' LRO; the node goes when it ends (timings.delete_machines_s, the sim's default)
RUNGS = ("restart", "reimage", "replace")

_cache: dict[str, RemediationRun] = {}


@dataclass
class RemediationRun:
    speed: float
    sweep_interval_s: float
    threshold_s: float
    pods: int = 0
    graces: list[int] = field(default_factory=list)
    flip_at: float | None = None
    cordon_at: float | None = None
    poll_resolution_s: float = 0.0
    record_state: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    evictions: list[dict[str, Any]] = field(default_factory=list)  # oracle terminations of the node's pods
    drain_started_at: float | None = None
    drained_at: float | None = None
    done_at: float | None = None
    quiet: dict[str, Any] = field(default_factory=dict)  # {"seconds": s, "counts": {...}}
    window: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    error: str = ""
    rung: str = "restart"  # the ladder's only (or, for the restart run, first) rung and the fault's fixed_by
    timings: dict[str, float] = field(default_factory=dict)  # the scenario's timings (the floor reads them)
    replace: dict[str, Any] = field(default_factory=dict)  # the record's data.replace (mode, replacement, ...)
    target: str = ""  # the node back in service: the node itself, or its replacement
    target_ready_at: float | None = None  # the replacement's Ready transition (replace rung)
    in_service: str = ""  # why the target is not back in service at the end (empty when it is)


def timings(rung: str = "restart") -> dict[str, float]:
    """The scenario's timings for ``rung``'s run (the restart run's are unchanged; replace adds the pool's)."""
    out: dict[str, float] = {"node_ready_s": NODE_READY_S, "pod_start_s": 1, "restart_s": RESTART_S,
                             "reimage_s": REIMAGE_S, "lro_retry_after_s": 2}
    if rung == "replace":
        out |= {"pool_scale_s": POOL_SCALE_S, "delete_machines_s": DELETE_MACHINES_S}
    return out


def profile(rung: str = "restart") -> dict[str, str]:
    """The app's settings for ``rung``'s run: the restart run keeps the whole ladder, the others only their rung."""
    return dict(PROFILE) if rung == "restart" else {**PROFILE, "REMEDIATION_LADDER": rung}


def scenario(scale: Scale, rung: str = "restart") -> dict[str, Any]:
    per = max(1, scale.drain_pods // len(GRACES))
    workloads: list[dict[str, Any]] = [
        {"kind": "Deployment", "name": f"grace{g}", "namespace": "batch", "replicas": per,
         "resources": {"cpu": "10m", "memory": "16Mi"}, "nodeSelector": {"kubernetes.azure.com/agentpool": POOL},
         "terminationGracePeriodSeconds": g} for g in GRACES]
    return {
        "seed": 31,
        "clock": {"speed": scale.speed},
        "timings": timings(rung),
        "subscriptions": [{
            "id": "00000000-0000-0000-0000-0000000be7c1",
            "quotas": [{"location": "eastus", "family": f, "limit": 100000}
                       for f in ("StandardNCADSA100v4Family", "standardDSv5Family")],
            "clusters": [{
                "name": CLUSTER, "resource_group": "rg-bench-rem", "location": "eastus",
                "tags": {"gpu-fleet-steward": "enabled"},
                "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                          {"name": POOL, "mode": "User", "vmSize": "Standard_NC24ads_A100_v4", "count": 1,
                           "maxPods": 250, "npd": True, "device_plugin": True,
                           "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}}],
                "workloads": workloads}]}],
    }


PROFILE: dict[str, str] = {
    "SWEEP_SCHEDULE": f"*/{SWEEP_INTERVAL_S} * * * * *",
    "RECONCILE_SCHEDULE": "*/2 * * * * *",
    "MIGRATION_SCHEDULE": "0 0 0 1 1 *",  # once a year: the planner's ARM reads stay out of the counts
    "REMEDIATION_DEFAULT_THRESHOLD_S": str(THRESHOLD_S),
    "REMEDIATION_STARTUP_GRACE_S": "0",
    "REMEDIATION_POLL_S": "2",
    "REMEDIATION_SETTLE_S": "10",
    "REMEDIATION_EVICTION_RETRY_S": "1",
    "REMEDIATION_LADDER": "restart,reimage,replace",
    "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT": "100",
}


def counts(oracles: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Request counters per service (``total``, ``reads``, ``writes``, per route)."""
    return {svc: {k: int(v) for k, v in per.items()} for svc, per in (oracles.get("requests_by_service") or {}).items()}


def diff(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for svc, per in after.items():
        base = before.get(svc, {})
        delta = {k: v - base.get(k, 0) for k, v in per.items() if v - base.get(k, 0)}
        if delta:
            out[svc] = delta
    return out


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _node(state: dict[str, Any], name: str | None = None) -> dict[str, Any] | None:
    for cluster in state["clusters"]:
        if cluster["name"] != CLUSTER:
            continue
        for node in cluster["nodes"]:
            if (name and node["name"] == name) or (not name and node["pool"] == POOL):
                return dict(node)
    return None


def _wait(predicate: Any, *, timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def get(scale: Scale) -> RemediationRun:
    if scale.name not in _cache:
        _cache[scale.name] = _run(scale)
    return _cache[scale.name]


def get_rung(scale: Scale, rung: str) -> RemediationRun:
    """The run whose ladder is ``rung`` alone and whose fault that rung cures (restart: :func:`get`'s run)."""
    if rung == "restart":
        return get(scale)
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r} (one of {RUNGS})")
    key = f"{scale.name}/{rung}"
    if key not in _cache:
        _cache[key] = _run(scale, rung)
    return _cache[key]


def _run(scale: Scale, rung: str = "restart") -> RemediationRun:
    import devstack

    run = RemediationRun(speed=scale.speed, sweep_interval_s=SWEEP_INTERVAL_S, threshold_s=THRESHOLD_S, rung=rung,
                         timings=timings(rung))
    try:
        with devstack.running(scenario=scenario(scale, rung), seed=31, profile=profile(rung), hosts=1,
                              host_json=devstack.FAST_HOST_JSON) as stack:
            _drive(stack, run, scale)
    except Exception as error:
        run.error = f"{type(error).__name__}: {error}"[:400]
    return run


def _drive(stack: Any, run: RemediationRun, scale: Scale) -> None:
    sim = stack.sim
    node = _node(sim.state())
    if node is None:
        raise RuntimeError("the scenario's GPU node is missing")
    name = node["name"]
    run.pods = int(node["pods"])
    if run.pods < scale.drain_pods:
        run.problems.append(f"only {run.pods} pods landed on the node (wanted {scale.drain_pods})")
    # Quiet window: the host sweeps (and reconciles) with nothing to do; its requests are the background.
    first_sweep = _wait(lambda: counts(sim.oracles()).get("kube", {}).get("total", 0) > 0,
                        timeout=min(scale.timeout_s, 90))
    if not first_sweep:
        raise RuntimeError("the host never swept the fleet (no Kubernetes request reached the simulator)")
    if run.rung == "restart":  # only the restart run's requests are counted (bench.requests)
        quiet_s = 3 * SWEEP_INTERVAL_S
        t0, c0 = sim.state()["clock"]["now"], counts(sim.oracles())
        time.sleep(quiet_s / scale.speed)
        t1, c1 = sim.state()["clock"]["now"], counts(sim.oracles())
        run.quiet = {"seconds": t1 - t0, "counts": diff(c1, c0)}
    # The fault, cured by the run's rung (and every stronger one).
    sim.control("POST", "/conditions", {"cluster": CLUSTER, "node": name, "type": CONDITION, "status": "True",
                                        "fixed_by": run.rung})
    kube = sim.kube_client(CLUSTER)
    from kubernetes import client as k8s

    v1 = k8s.CoreV1Api(kube)
    status = v1.read_node(name).status
    conditions = {c.type: c for c in (status.conditions if status is not None else None) or ()}
    flipped = conditions[CONDITION].last_transition_time
    if flipped is None:
        raise RuntimeError(f"{CONDITION} on {name} has no lastTransitionTime")
    run.flip_at = flipped.timestamp()
    kube.close()
    c_flip = counts(sim.oracles())  # after our one read: the window starts clean of our own requests
    # The cordon, seen by polling the simulator's state (its clock, not counted as requests).
    deadline = time.monotonic() + (THRESHOLD_S + 4 * SWEEP_INTERVAL_S) / scale.speed + 30
    previous_now = None
    gaps: list[float] = []
    while time.monotonic() < deadline:
        state = sim.state()
        now = float(state["clock"]["now"])
        if previous_now is not None:
            gaps.append(now - previous_now)
        previous_now = now
        seen = _node(state, name)
        if seen is not None and seen["unschedulable"]:
            run.cordon_at = now
            break
        time.sleep(0.02)
    run.poll_resolution_s = max(gaps) if gaps else 0.0
    if run.cordon_at is None:
        raise RuntimeError(f"the node was not cordoned within {THRESHOLD_S + 4 * SWEEP_INTERVAL_S} simulated seconds "
                           f"of the fault; host log: {_host_tail(stack)}")
    # The rest of the remediation, read from the ledger.
    ledger = stack.ledger()

    def finished() -> Any:
        records = [r for r in ledger.list("remediation") if r.data.get("node") == name]
        done = [r for r in records if r.state in ("done", "gave_up", "released", "failed", "refused")]
        return done[-1] if done else None

    record = _wait(finished, timeout=scale.timeout_s, interval=0.25)
    c_done, t_done = counts(sim.oracles()), sim.state()["clock"]["now"]
    run.window = {"seconds": t_done - run.flip_at, "counts": diff(c_done, c_flip)}
    oracles = sim.oracles()
    run.evictions = [t for t in oracles["terminations"] if t.get("node") == name and t.get("cause") == "eviction"]
    if oracles["pdb_violations"] or oracles["pods_killed_without_eviction"]:
        run.problems.append(f"oracles: {len(oracles['pdb_violations'])} PDB violations, "
                            f"{len(oracles['pods_killed_without_eviction'])} pods killed without eviction")
    if record is None:
        records = [r for r in ledger.list("remediation") if r.data.get("node") == name]
        last = records[-1] if records else None
        raise RuntimeError(f"the remediation did not finish within {scale.timeout_s:.0f} s wall; last record: "
                           f"{(last.state, last.history[-3:]) if last else None}; host log: {_host_tail(stack)}")
    run.record_state = record.state
    run.history = list(record.history)
    run.drain_started_at = float(record.data.get("drain_started_at") or 0) or None
    run.done_at = record.updated_at
    for line in run.history:
        if line.get("state") == "repairing" and run.drained_at is None:
            run.drained_at = when(line)
    run.replace = dict(record.data.get("replace") or {})
    run.target = str(record.data.get("target") or run.replace.get("replacement") or name)
    try:  # after the run: a failure here leaves the run's other figures as they are
        _back_in_service(sim, run, name)
    except Exception as error:
        run.in_service = f"could not check: {type(error).__name__}: {error}"[:300]


def _back_in_service(sim: Any, run: RemediationRun, name: str) -> None:
    """Whether the node (or its replacement) is back in service once the remediation ended: there, Ready and
    schedulable; the replaced node gone. The replacement's Ready time is read from its Ready condition."""
    state = sim.state()
    target = _node(state, run.target)
    if target is None:
        run.in_service = f"{run.target} is not in the cluster"
    elif not target["ready"] or target["unschedulable"]:
        run.in_service = f"{run.target} is {'not Ready' if not target['ready'] else 'still cordoned'}"
    elif run.target != name and _node(state, name) is not None:
        run.in_service = f"the replaced node {name} is still there"
    if run.target == name or target is None:
        return
    kube = sim.kube_client(CLUSTER)
    try:
        from kubernetes import client as k8s

        status = k8s.CoreV1Api(kube).read_node(run.target).status
        ready = next((c for c in (status.conditions if status is not None else None) or () if c.type == "Ready"), None)
        if ready is not None and ready.status == "True" and ready.last_transition_time is not None:
            run.target_ready_at = ready.last_transition_time.timestamp()
    finally:
        kube.close()


def when(line: dict[str, Any]) -> float | None:
    at = line.get("at")
    if isinstance(at, int | float):
        return float(at)
    return _epoch(str(at)) if at else None


def _host_tail(stack: Any, lines: int = 15) -> str:
    logs = sorted(stack.state_dir.glob("host-*.log"))
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    kept = [x for x in text.splitlines() if "Request " not in x and "Response " not in x and not x.startswith("    ")]
    return " | ".join(kept[-lines:])[-1500:]

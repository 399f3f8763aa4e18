"""What the reconciler's executions cost: a 30-second timer alone, against delayed nudges with a 5-minute timer.

Flex Consumption bills every execution at least 1,000 ms (docs/deploy.md, "What the timers cost"),
so what matters is how many times the reconciler runs, idle and per unit of work, and whether the
work still goes as fast. Both designs run the same thing on the simulator through a real local host
(a separate process, devstack): one unit of work -- a pool request with ``validateWorkload`` (create
the pool, wait for its node, run the sample GPU job, clean up) at the app's default poll interval
(15 s), or a remediation (an unhealthy GPU node cordoned, drained, restarted and verified, at the
default poll and settle times) -- then an idle window with nothing to do. Counted:
``reconcile_timer`` and ``reconcile_nudge`` invocations (the host's own statistics) and the unit's
time from submission (or the node's fault) to its end (fleet seconds, from the ledger record).

The simulated clock runs ``SPEED`` times faster than the wall clock. The host's queue polling is
scaled with it (host.json ``maxPollingInterval`` 10 s becomes 1 s of wall time), but a visibility
timeout is whole wall-clock seconds, so a wake-up here can be up to ``SPEED`` fleet seconds later
than in Azure: the nudge design's latency is measured pessimistically.

Run alone (each unit starts Azurite, the simulator and two hosts per design, about four minutes):
``python -m bench.reconcile_cost [--unit pool-request] [--unit remediation]``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

SPEED = 10.0
NEVER = "0 0 0 1 1 *"
IDLE_S = 600.0  # fleet seconds of the idle window
MONTH_S = 30 * 24 * 3600
GB = 2.0  # instance memory size (2,048 MB)
RATE_PER_GB_S = 0.000026  # East US, on demand, as in docs/deploy.md

DESIGNS: dict[str, dict[str, str]] = {
    "timer-30s": {"RECONCILE_SCHEDULE": "*/30 * * * * *", "RECONCILE_DELAYED_NUDGES": "false"},
    "nudge-timer-5min": {"RECONCILE_SCHEDULE": "0 */5 * * * *", "RECONCILE_DELAYED_NUDGES": "true"},
}
PROFILE: dict[str, str] = {
    "SWEEP_SCHEDULE": NEVER,  # only the reconciler is measured
    "MIGRATION_SCHEDULE": NEVER,
    "POOL_REQUEST_POLL_INTERVAL_S": "15",  # the app's default (devstack's fast profile says 2)
}
HOST_JSON: dict[str, Any] = {"extensions": {"queues": {"maxPollingInterval": "00:00:01", "visibilityTimeout": "00:00:01"}}}
CLUSTER = "bench-cost"
POOL = "gpucost"


def scenario() -> dict[str, Any]:
    """One cluster in scope, with AKS-like waits: a GPU pool takes 4 minutes, its node 1 more."""
    return {
        "seed": 11,
        "clock": {"speed": SPEED},
        "timings": {"pool_create_s": 240, "pool_delete_s": 120, "pool_scale_s": 120, "node_ready_s": 60,
                    "lro_retry_after_s": 10, "pod_start_s": 5, "job_run_s": 60},
        "subscriptions": [{
            "id": "00000000-0000-0000-0000-00000000c057",
            "clusters": [{"name": CLUSTER, "resource_group": "rg-bench-cost", "location": "eastus",
                          "tags": {"gpu-fleet-steward": "enabled"},
                          "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}],
        }],
    }


REMEDIATION_PROFILE: dict[str, str] = {
    "SWEEP_SCHEDULE": "*/30 * * * * *",  # detection needs the sweep (its own executions are not counted)
    "REMEDIATION_DEFAULT_THRESHOLD_S": "60",
    "REMEDIATION_STARTUP_GRACE_S": "0",
    "REMEDIATION_LADDER": "restart,reimage,replace",
    "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT": "100",
}  # poll (20 s), settle (120 s) and eviction retry (5 s): the app's defaults
GPU_POOL = "gpu"
CONDITION = "UnhealthyNvidiaDevicePlugin"


def remediation_scenario() -> dict[str, Any]:
    """One GPU node running a few pods, with AKS-like waits: a VM restart takes 2 minutes, Ready 1 more."""
    base = scenario()
    base["timings"].update({"restart_s": 120, "reimage_s": 300, "node_ready_s": 60, "pod_start_s": 5})
    cluster = base["subscriptions"][0]["clusters"][0]
    cluster["pools"].append({"name": GPU_POOL, "mode": "User", "vmSize": "Standard_NC24ads_A100_v4", "count": 1,
                             "npd": True, "device_plugin": True,
                             "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}})
    cluster["workloads"] = [{"kind": "Deployment", "name": "train", "namespace": "batch", "replicas": 4,
                             "resources": {"cpu": "10m", "memory": "16Mi"},
                             "nodeSelector": {"kubernetes.azure.com/agentpool": GPU_POOL},
                             "terminationGracePeriodSeconds": 10}]
    return base


def _gpu_node(stack: Any) -> str:
    for cluster in stack.sim.state()["clusters"]:
        for node in cluster["nodes"]:
            if cluster["name"] == CLUSTER and node["pool"] == GPU_POOL:
                return str(node["name"])
    raise RuntimeError("the scenario's GPU node is missing")


def _fleet_now(stack: Any) -> float:
    return float(stack.sim.state()["clock"]["now"])


def _stats(stack: Any, name: str) -> dict[str, int]:
    data = json.loads((Path(stack.state_dir) / f"{name}.stats.json").read_text())
    functions = data["functions"]
    return {fn: int(functions.get(fn, {}).get("invocations", 0)) for fn in ("reconcile_timer", "reconcile_nudge")}


def _pool_request(stack: Any, design: str) -> tuple[float, Any]:
    import devstack

    cluster_id = next(c["id"] for c in stack.endpoints["clusters"] if c["name"] == CLUSTER)
    ledger = stack.ledger()
    submitted = _fleet_now(stack)
    stack.submit({"schemaVersion": "1", "requestId": f"cost-{design}", "requester": "bench@contoso.com",
                  "cluster": cluster_id, "poolName": POOL, "vmSize": "Standard_NC4as_T4_v3", "count": 1,
                  "validateWorkload": True})
    record = devstack.wait_until(
        lambda: (r := ledger.get("pool-request", f"cost-{design}")) is not None
        and r.state in ("succeeded", "failed", "rejected") and r,
        timeout=900 / SPEED + 120, what=f"the pool request to end ({design})")
    return submitted, record


def _remediation(stack: Any, design: str) -> tuple[float, Any]:
    import devstack

    ledger = stack.ledger()
    node = _gpu_node(stack)
    flipped = _fleet_now(stack)
    stack.control("POST", "/conditions", {"cluster": CLUSTER, "node": node, "type": CONDITION, "status": "True",
                                          "fixed_by": "restart"})
    record = devstack.wait_until(
        lambda: next((r for r in ledger.list("remediation") if r.data.get("node") == node
                      and r.state in ("done", "gave_up", "released", "failed", "refused")), None),
        timeout=1500 / SPEED + 120, what=f"the remediation to end ({design})")
    return flipped, record


UNITS = {"pool-request": (scenario, {}, _pool_request), "remediation": (remediation_scenario, REMEDIATION_PROFILE, _remediation)}


def run_design(design: str, unit: str = "pool-request") -> dict[str, Any]:
    import devstack

    make_scenario, unit_profile, do = UNITS[unit]
    profile = {**PROFILE, **unit_profile, **DESIGNS[design]}
    with devstack.running(scenario=make_scenario(), seed=11, profile=profile, hosts=0, host_json=HOST_JSON) as stack:
        # Work: one unit, from its start to its end.
        work_from = _fleet_now(stack)
        host = stack.start_host("work")
        time.sleep(3)  # the host indexes the app and starts listening
        submitted, record = do(stack, design)
        done = float(record.updated_at)
        stack.stop_host(host)
        work_fleet_s = _fleet_now(stack) - work_from  # the host's whole life: its counts cover it
        work = _stats(stack, "work")
        # Idle: nothing due, for IDLE_S fleet seconds.
        idle_from = _fleet_now(stack)
        host = stack.start_host("idle")
        time.sleep(IDLE_S / SPEED)
        stack.stop_host(host)
        idle_fleet_s = _fleet_now(stack) - idle_from
        idle = _stats(stack, "idle")
    steps = [(h["state"], round(float(h["at"]) - submitted, 1)) for h in record.history]
    return {"design": design, "unit": unit, "state": record.state, "request_s": round(done - submitted, 1), "steps": steps,
            "work_window_s": round(work_fleet_s, 1), "work": work, "idle_window_s": round(idle_fleet_s, 1),
            "idle": idle}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per month when idle (from the idle window's rate), and executions per pool request."""
    idle_runs = sum(result["idle"].values())
    per_month = idle_runs * MONTH_S / max(result["idle_window_s"], 1.0)
    work_runs = sum(result["work"].values())
    # What the request adds over idling through the same time (the 30 s timer ticks anyway).
    extra = work_runs - idle_runs * result["work_window_s"] / max(result["idle_window_s"], 1.0)
    return {"idle_executions_per_month": round(per_month), "idle_gb_s_per_month": round(per_month * GB),
            "idle_dollars_per_month": round(per_month * GB * RATE_PER_GB_S, 2),
            "executions_during_request": work_runs, "extra_executions_per_request": round(extra, 1)}


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", choices=sorted(UNITS), action="append", help="what to run (default: both)")
    units = parser.parse_args(argv).unit or list(UNITS)
    for unit in units:
        for design in DESIGNS:
            result = run_design(design, unit)
            result["summary"] = summary(result)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

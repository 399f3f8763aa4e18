"""``make demo``: the whole app on a simulated fleet, start to finish, then a report.

The storyline (demo/scenario.yaml, a clock 20x the wall):
1. a team submits a valid managed T4 pool request and an invalid one; the app creates and
   validates the first (sample GPU job included) and rejects the second with every reason;
2. two GPU nodes of a managed pool break: one is fixed by a restart, the other only by a
   replacement; a third node flaps and is left alone;
3. the migration planner moves two unmanaged pools to managed ones (surge and rolling), skips the
   MIG pool and says why, while PodDisruptionBudget-protected workloads keep running;
4. an out-of-scope cluster's broken node is never touched.
It ends by itself when every story has ended (or after a time limit, saying what did not finish),
and prints what happened from the ledger, the published events and the simulator's oracles.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "demo" / "scenario.yaml"

# App settings for the demo: ordinary settings, tuned for a fleet whose clock runs 20x faster.
# Schedules and thresholds are in fleet (simulated) seconds.
PROFILE = {
    "RECONCILE_SCHEDULE": "*/5 * * * * *",
    "SWEEP_SCHEDULE": "*/10 * * * * *",
    "MIGRATION_SCHEDULE": "*/30 * * * * *",
    "MIGRATION_ENABLED": "true",
    "MIGRATION_GPU_VCPU_HEADROOM": "eastus:standardNCASv3_T4Family=64",
    "MIGRATION_POLL_INTERVAL_S": "5",
    "POOL_REQUEST_POLL_INTERVAL_S": "5",
    "REMEDIATION_DEFAULT_THRESHOLD_S": "60",
    "REMEDIATION_STARTUP_GRACE_S": "60",
    "REMEDIATION_SETTLE_S": "30",
    "REMEDIATION_POLL_S": "5",
    "REMEDIATION_RUNG_TIMEOUTS": "restart=120,reimage=240,replace=600",
    "BREAKER_PERCENT": "60",
    # Who may ask for what (shared/pools/teams.py): each team sends to its own queue; the queue, not the
    # message, says who asked. ml-platform gets the defaults (T4/A10 sizes, 8 GPUs per request) on
    # its own cluster; research may use A100s anywhere in scope, 8 GPUs at a time.
    "POOL_REQUEST_TEAMS": json.dumps({
        "ml-platform": {"clusters": ["/subscriptions/8f2d4c1e-5a3b-4c7d-9e0f-000000000001/resourceGroups/"
                                     "rg-ml-platform/providers/Microsoft.ContainerService/managedClusters/ml-platform"]},
        "research": {"clusters": "*", "sizes": ["Standard_NC24ads_A100_v4"], "maxGpusPerRequest": 8},
    }),
}

VALID_REQUEST = {
    "schemaVersion": "1",
    "requestId": "demo-inference-t4",
    "requester": "team-inference@contoso.example",
    "cluster": "/subscriptions/8f2d4c1e-5a3b-4c7d-9e0f-000000000001/resourceGroups/rg-ml-platform"
               "/providers/Microsoft.ContainerService/managedClusters/ml-platform",
    "poolName": "inferencet4",
    "vmSize": "Standard_NC4as_T4_v3",
    "count": 2,
    "osSku": "Ubuntu",
    "installProfile": "managed",
    "labels": {"team": "inference"},
    "validateWorkload": True,
}

INVALID_REQUEST = {
    "schemaVersion": "1",
    "requestId": "demo-broken-request",
    "requester": "intern@contoso.example",
    "cluster": VALID_REQUEST["cluster"],
    "poolName": "GPU_Pool_For_Everyone",
    "vmSize": "Standard_NC4as_T4_v3",
    "count": 2,
    "installProfile": "managed",
    "gpuDriver": "None",
    "mig": {"strategy": "Single", "profile": "MIG1g"},
    "labels": {"kubernetes.azure.com/mode": "user"},
}

#: Sent on research's queue, claiming to come from ml-platform: 1,000 H100s. The queue decides.
GREEDY_REQUEST = {
    "schemaVersion": "1",
    "requestId": "demo-thousand-h100",
    "requester": "ml-platform",
    "cluster": VALID_REQUEST["cluster"],
    "poolName": "bigh100",
    "vmSize": "Standard_ND96isr_H100_v5",
    "count": 125,
}

KINDS = ("pool-request", "remediation", "migration")


def _say(clock: Any, text: str) -> None:
    stamp = time.strftime("%H:%M:%S", time.gmtime(clock.now()))
    print(f"  [{stamp} fleet time] {text}", flush=True)


def _last_note(record: Any) -> str:
    for line in reversed(record.history or []):
        if line.get("note"):
            return str(line["note"]).splitlines()[0]
    return ""


def _label(record: Any) -> str:
    d = record.data or {}
    if record.kind == "pool-request":
        return f"request {record.id}" + (f" (team {d['requester']})" if d.get("requester") else "")
    if record.kind == "remediation":
        return f"node {d.get('node', record.id)} ({d.get('condition', '?')})"
    return f"pool {d.get('cluster_name') or d.get('cluster', '')}/{d.get('pool', record.id)}"


def _snapshot(ctx: Any) -> dict[tuple[str, str], Any]:
    out = {}
    for kind in KINDS:
        for record in ctx.ledger.list(kind):
            out[(kind, record.id)] = record
    return out


def _finished(records: dict[tuple[str, str], Any]) -> tuple[bool, list[str]]:
    from shared.migration import plan as migration_plan
    from shared.pools import steps as pool_steps
    from shared.remediation import records as remediation

    active = {"pool-request": pool_steps.ACTIVE_STATES, "remediation": remediation.ACTIVE_STATES,
              "migration": migration_plan.ACTIVE_STATES}
    waiting = [f"{k} {i} ({r.state})" for (k, i), r in records.items() if r.state in active[k]]
    kinds_seen = {k for k, _ in records}
    missing = [k for k in KINDS if k not in kinds_seen]
    return (not waiting and not missing), waiting + [f"no {k} yet" for k in missing]


def _published(stack: Any) -> list[dict[str, Any]]:
    import ssl
    import urllib.request

    url = str(stack.endpoints["eventgrid_topic_endpoint"]).replace("/api/events", "/_published")
    ctx = ssl.create_default_context(cafile=stack.endpoints["ca_bundle"])
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        body = json.loads(resp.read())
    items = body.get("events", []) if isinstance(body, dict) else body
    return [dict(item.get("event", item)) for item in items]


def report(stack: Any, ctx: Any, records: dict[tuple[str, str], Any], *, finished: bool, waiting: list[str]) -> int:
    print("\n================ what happened ================\n")
    for kind, title in (("pool-request", "Pool requests"), ("remediation", "Remediations"), ("migration", "Migrations")):
        print(f"{title}:")
        rows = sorted((r for (k, _), r in records.items() if k == kind), key=lambda r: r.created_at)
        if not rows:
            print("  (none)")
        for r in rows:
            print(f"  - {_label(r)}: {r.state.upper()} — {_last_note(r)}")
            if kind == "remediation":
                ladder = list(r.data.get("ladder") or [])
                tried = ladder[: int(r.data.get("rung_index") or 0) + 1] if ladder else []
                took = r.updated_at - r.created_at
                print(f"      rungs tried: {' -> '.join(tried) or 'none'}; {took:.0f} fleet seconds from admission to the end")
            if kind == "migration":
                d = r.data
                print(f"      strategy {d.get('strategy', '?')}, replacement {d.get('new_pool') or d.get('replacement', '?')}, "
                      f"{r.updated_at - r.created_at:.0f} fleet seconds")
            if kind == "pool-request" and r.state == "rejected":
                for reason in (r.data.get("problems") or r.data.get("reasons") or [])[:8]:
                    print(f"      · {reason if isinstance(reason, str) else json.dumps(reason)}")
        print()
    try:
        from shared.migration import planner as migration

        plan = migration.observe_plan(ctx)
        skipped = [s for s in getattr(plan, "skipped", [])]
        if skipped:
            print("Pools the migration plan skipped:")
            for s in skipped:
                print(f"  - {getattr(s, 'cluster_name', '') or getattr(s, 'cluster', '')}/{getattr(s, 'pool', '')}: "
                      f"{getattr(s, 'reason', '')}")
            print()
    except Exception as exc:  # the report must not hide the rest because the plan view failed
        print(f"(migration plan unavailable: {exc})\n")
    try:
        events = _published(stack)
        counts = Counter(str(e.get("type")) for e in events)
        print("CloudEvents published:")
        for name, n in sorted(counts.items()):
            print(f"  {n:4d}  {name}")
        print()
    except Exception as exc:
        print(f"(events unavailable: {exc})\n")
    oracles = stack.oracles()
    print("Safety oracles (from the simulator):")
    for key in ("pdb_violations", "pods_killed_without_eviction", "workload_pods_lost"):
        value = oracles.get(key, [])
        print(f"  {key}: {len(value)}" + (f"  {json.dumps(value)[:300]}" if value else ""))
    by_service = oracles.get("requests_by_service") or {}
    for service, routes in sorted(by_service.items()):
        total = sum(routes.values()) if isinstance(routes, dict) else routes
        writes = sum(n for route, n in routes.items() if route.split(" ")[0] in {"PUT", "POST", "PATCH", "DELETE"}) \
            if isinstance(routes, dict) else 0
        print(f"  {service}: {total} requests ({writes} writes)")
    lab = [r for r in records.values() if "research-lab" in json.dumps(r.data)]
    print(f"  records about the out-of-scope cluster research-lab: {len(lab)}")
    print()
    if finished:
        print("Every story ended.")
    else:
        print("NOT FINISHED within the time limit:")
        for w in waiting:
            print(f"  - {w}")
    unsafe = any(oracles.get(k) for k in ("pdb_violations", "pods_killed_without_eviction", "workload_pods_lost"))
    return 0 if finished and not unsafe and not lab else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=420.0, help="wall seconds before giving up (default 420)")
    parser.add_argument("--state-dir", default=str(ROOT / ".state" / "demo"), help="where logs and state go")
    args = parser.parse_args(argv)

    import devstack
    from shared.kernel import clock as clock_mod

    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    print("GPU fleet steward demo: starting Azurite, the fleet simulator and a local Functions host ...", flush=True)
    with devstack.running(scenario=SCENARIO, profile=PROFILE, state_dir=state, hosts=1) as stack:
        c = stack.endpoints["clock"]
        fleet_clock = clock_mod.ScaledClock(epoch_real=c["epoch_real"], epoch_sim=c["epoch_sim"], speed=c["speed"])
        clock_mod.use(fleet_clock)
        ctx = stack.context()
        print(f"  fleet: {len(stack.endpoints['clusters'])} clusters, clock x{c['speed']:g}; logs in {state}\n")
        stack.submit(VALID_REQUEST, team="ml-platform")
        _say(fleet_clock, f"team ml-platform asks for a managed T4 pool on ml-platform ({VALID_REQUEST['requestId']})")
        stack.submit(INVALID_REQUEST, team="ml-platform")
        _say(fleet_clock, f"an intern submits a request that breaks several rules ({INVALID_REQUEST['requestId']})")
        stack.submit(GREEDY_REQUEST, team="research")
        _say(fleet_clock, "someone with research's queue asks for 1,000 H100s on ml-platform, claiming to be "
                          f"ml-platform ({GREEDY_REQUEST['requestId']})")
        seen: dict[tuple[str, str], str] = {}
        deadline = time.monotonic() + args.timeout
        finished, waiting = False, []
        records: dict[tuple[str, str], Any] = {}
        while time.monotonic() < deadline:
            records = _snapshot(ctx)
            for key, r in sorted(records.items(), key=lambda kv: kv[1].updated_at):
                if seen.get(key) != r.state:
                    seen[key] = r.state
                    _say(fleet_clock, f"{_label(r)} -> {r.state}: {_last_note(r)}")
            finished, waiting = _finished(records)
            if finished:
                break
            time.sleep(1.0)
        return report(stack, ctx, records, finished=finished, waiting=waiting)


if __name__ == "__main__":
    sys.exit(main())

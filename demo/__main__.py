"""``make demo``: the whole app on a simulated fleet, start to finish, then a report.

The storyline (demo/scenario.yaml, a clock 20x the wall):
1. a team submits a valid managed T4 pool request and an invalid one; the app creates and
   validates the first (sample GPU job included) and rejects the second with every reason;
2. two GPU nodes of a managed pool break: one is fixed by a restart, the other only by a
   replacement; a third node flaps and is left alone;
3. the two other fault signals (issue 13), played at fixed fleet times (:data:`SIGNALS`):
   - a GPU of an inference node falls off the bus: XID 79 in the cluster's DCGM counters, read from
     its Azure Monitor workspace (SIGNALS_PROMETHEUS, set by :func:`signal_settings`); the node is
     restarted (row ``xid:79``: restart, then replace if it comes back);
   - Azure Resource Health says an embedding node's VM is ``Degraded``, then why (its host's hardware
     will fail soon): the node is cordoned and drained ahead of the failure, then restarted (row
     ``health:availability:Degraded``); the annotation joins that remediation instead of starting another;
   - planned maintenance reboots another node: recorded only (``Steward.Remediation.SignalRecorded``);
   - an XID 79 on the out-of-scope cluster's GPU, in the same workspace: never acted on;
   - forgeries the DCGM signal refuses (demo/dcgm_story.py, issue 18): a tenant pod's XID series naming a
     healthy node of another team (through pod annotations, and through a PodMonitor in the managed
     exporter's exact labels), and a second in-scope cluster whose admin sets ``cluster_alias`` to
     ml-serve so its own XID 79 arrives under ml-serve's name;
4. the migration planner moves two unmanaged pools to managed ones (surge and rolling), skips the
   MIG pool and says why, while PodDisruptionBudget-protected workloads keep running;
5. an out-of-scope cluster's broken node is never touched.
It ends by itself when every story has ended (or after a time limit, saying what did not finish),
and prints what happened from the ledger, the published events and the simulator's oracles: each
remediation with the signal that started it (npd, dcgm, resource-health), the signal's own words and
the policy row that matched, and the signals that were only recorded; and a section for the DCGM signal:
the XID 79 in AKS's label shape and its repair, how each forgery was refused (code and reason, or the
node's own exporter contradicting it), the nodes they named untouched, and the counters AKS's managed
exporter does not export.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from demo.dcgm_story import FORGERIES, DcgmStory, signal_settings
from demo.narrate import Narrator, wrapped

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
RECORDED_EVENT = "Steward.Remediation.SignalRecorded"

#: What the GPUs and Azure do, at fixed fleet seconds after the fleet's start, through the simulator's
#: control API (the node is the ``index``-th of its pool, resolved when the signal is played).
SIGNALS: tuple[dict[str, Any], ...] = (
    {"at": 200, "path": "/dcgm/xid", "cluster": "ml-serve", "pool": "infer", "index": 0, "body": {"gpu": 0, "xid": 79},
     "say": "GPU 0 of {node} falls off the bus: XID 79 in ml-serve's DCGM counters"},
    {"at": 200, "path": "/dcgm/xid", "cluster": "research-lab", "pool": "gpu", "index": 1, "body": {"gpu": 0, "xid": 79},
     "say": "XID 79 on {node} of research-lab (out of scope, same workspace)"},
    {"at": 230, "path": "/resource-health", "cluster": "ml-serve", "pool": "embed", "index": 0,
     "body": {"scenario": "state", "state": "Degraded"},
     "say": "Azure Resource Health: {node}'s VM is Degraded"},
    {"at": 270, "path": "/resource-health", "cluster": "ml-serve", "pool": "embed", "index": 0,
     "body": {"scenario": "annotation", "annotation": "VirtualMachinePossiblyDegradedDueToHardwareFailure"},
     "say": "Azure Resource Health says why: the host under {node} has hardware that will fail soon "
            "(one remediation, not two)"},
    {"at": 290, "path": "/resource-health", "cluster": "ml-serve", "pool": "embed", "index": 2,
     "body": {"scenario": "planned-maintenance", "down_s": 20},
     "say": "Azure reboots {node} for planned maintenance"},
    *FORGERIES,
)
#: The remediations the storyline must show (signal -> what), besides the NPD conditions' own.
SIGNAL_STORIES = {"dcgm": "a node repaired because of an XID read from Prometheus",
                  "resource-health": "a node drained ahead of a Resource Health Degraded event"}


class SignalPlayer:
    """Plays :data:`SIGNALS` when the fleet's clock reaches them; :attr:`played` says what was done, and when."""

    def __init__(self, stack: Any, clock: Any, start: float, *, story: DcgmStory | None = None) -> None:
        self.stack, self.clock, self.start, self.story = stack, clock, start, story
        self.pending = sorted(SIGNALS, key=lambda s: float(s["at"]))
        self.played: list[tuple[float, str]] = []

    def wall_until_next(self) -> float:
        """Wall seconds until the next signal is due (inf when none is left)."""
        if not self.pending:
            return float("inf")
        return max(0.0, (self.start + float(self.pending[0]["at"]) - self.clock.now()) / self.clock.speed)

    def play_due(self) -> None:
        while self.pending and self.clock.now() >= self.start + float(self.pending[0]["at"]):
            signal = self.pending.pop(0)
            state = self.stack.sim.state()
            cluster = next(c for c in state["clusters"] if c["name"] == signal["cluster"])
            pool = next(p for p in cluster["pools"] if p["name"] == signal["pool"])
            node = str(pool["nodes"][int(signal["index"])])
            body = _with_node(signal["body"], node)
            answer = self.stack.control("POST", str(signal["path"]), {"cluster": signal["cluster"], "node": node, **body})
            if self.story is not None:
                self.story.on_played(signal, node, answer, at=self.clock.now())
            text = str(signal["say"]).format(node=node)
            self.played.append((self.clock.now(), text))
            _say(self.clock, text)


def _with_node(value: Any, node: str) -> Any:
    """``value`` with every ``{node}`` in its strings replaced by the node's name."""
    if isinstance(value, str):
        return value.replace("{node}", node)
    if isinstance(value, dict):
        return {k: _with_node(v, node) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_node(v, node) for v in value]
    return value


def _say(clock: Any, text: str) -> None:
    stamp = time.strftime("%H:%M:%S", time.gmtime(clock.now()))
    for line in wrapped(f"{stamp} fleet time", text):
        print(line, flush=True)


def _event_time(event: Mapping[str, Any]) -> str:
    """The event's own time (CloudEvents ``time``, RFC 3339) as HH:MM:SS of fleet time."""
    stamp = str(event.get("time") or "")
    return f"{stamp[11:19]} fleet time" if len(stamp) >= 19 else "fleet time"


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


def _finished(records: dict[tuple[str, str], Any], *, signals_left: int = 0) -> tuple[bool, list[str]]:
    from shared.migration import plan as migration_plan
    from shared.pools import steps as pool_steps
    from shared.remediation import records as remediation

    active = {"pool-request": pool_steps.ACTIVE_STATES, "remediation": remediation.ACTIVE_STATES,
              "migration": migration_plan.ACTIVE_STATES}
    waiting = [f"{k} {i} ({r.state})" for (k, i), r in records.items() if r.state in active[k]]
    kinds_seen = {k for k, _ in records}
    missing = [f"no {k} yet" for k in KINDS if k not in kinds_seen]
    signals = {str(r.data.get("signal") or "npd") for (k, _), r in records.items() if k == "remediation"}
    missing += [f"no {what} yet" for source, what in SIGNAL_STORIES.items() if source not in signals]
    if signals_left:
        missing.append(f"{signals_left} fault signal(s) still to play")
    return (not waiting and not missing), waiting + missing


def _published(stack: Any) -> list[dict[str, Any]]:
    import ssl
    import urllib.request

    url = str(stack.endpoints["eventgrid_topic_endpoint"]).replace("/api/events", "/_published")
    ctx = ssl.create_default_context(cafile=stack.endpoints["ca_bundle"])
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        body = json.loads(resp.read())
    items = body.get("events", []) if isinstance(body, dict) else body
    return [dict(item.get("event", item)) for item in items]


def _signal_lines(record: Any) -> list[str]:
    """Where a remediation's fault was seen, the source's own words and the policy row that matched."""
    d = record.data or {}
    signal = str(d.get("signal") or "npd")
    row = str(d.get("policy_row") or "")
    lines = [f"signal: {signal}; policy row: {row or '(the NPD condition ' + str(d.get('condition', '?')) + ')'}"]
    if d.get("signal_detail"):
        lines.append(f"detail: {str(d['signal_detail'])[:700]}")
    return lines


def _as_sentence(reason: Any) -> str:
    """A rejection's problem as a sentence: ``field: problem (fix: ...)``, not raw JSON."""
    if isinstance(reason, Mapping):
        fix = reason.get("fix")
        return f"{reason.get('field')}: {reason.get('problem')}" + (f" (fix: {fix})" if fix else "")
    return str(reason)


def _recorded(events: list[dict[str, Any]]) -> list[str]:
    """The signals a policy row only recorded (``Steward.Remediation.SignalRecorded``), one line each."""
    out = []
    for e in events:
        if e.get("type") != RECORDED_EVENT:
            continue
        d = e.get("data") or {}
        out.append(f"{d.get('node', '?')} ({d.get('signal', '?')}, row {d.get('policy_row', '?')}): "
                   f"{str(d.get('note') or '').splitlines()[0][:320] if d.get('note') else ''}")
    return out


def report(stack: Any, ctx: Any, records: dict[tuple[str, str], Any], *, finished: bool, waiting: list[str],
           played: list[tuple[float, str]] | None = None, story: DcgmStory | None = None) -> int:
    print("\n================ what happened ================\n")
    if played:
        print("Fault signals played (fleet time):")
        for when, text in played:
            print(f"  - {time.strftime('%H:%M:%S', time.gmtime(when))}  {text}")
        print()
    for kind, title in (("pool-request", "Pool requests"), ("remediation", "Remediations"), ("migration", "Migrations")):
        print(f"{title}:")
        rows = sorted((r for (k, _), r in records.items() if k == kind), key=lambda r: r.created_at)
        if not rows:
            print("  (none)")
        for r in rows:
            print(f"  - {_label(r)}: {r.state.upper()} — {_last_note(r)}")
            if kind == "remediation":
                for line in _signal_lines(r):
                    print(f"      {line}")
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
                    print(f"      · {_as_sentence(reason)}")
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
    events: list[dict[str, Any]] = []
    try:
        events = _published(stack)
        refused = [e for e in events if e.get("type") == "Steward.Remediation.Refused"]
        print("Faulty nodes refused, and why (fleetctl why NODE says what would change):")
        for e in refused or [{}]:
            d = e.get("data") or {}
            print("\n".join(wrapped("-", f"{d.get('node')} [{d.get('reason_code')}]: {d.get('reason')}"))
                  if d else "  (none)")
        print()
        recorded = _recorded(events)
        print("Signals only recorded (policy rows that act on nothing):")
        for line in recorded or ["(none)"]:
            print(f"  - {line}")
        print()
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
    dcgm_ok = True
    if story is not None:
        lines, dcgm_ok = story.report_lines(records=list(records.values()), events=events, oracles=oracles,
                                            host_log=stack.state_dir / "host-1.log",
                                            setting=str(stack.settings.get("SIGNALS_PROMETHEUS") or ""))
        print("\n".join(lines))
        print()
        if not dcgm_ok:
            print("The DCGM story did NOT hold (see above).")
    try:
        from fleetctl import timeline

        page = stack.state_dir / "timeline.html"
        # The records the report above told, not a fresh read: the host goes on working while the report is
        # printed, and a story begun since (a later fault) would be on the page but not in the report.
        told = timeline.stories_of((kind, r) for (kind, _), r in records.items() if kind in ("remediation", "migration"))
        shown = timeline.write(told, page)
        print(f"Timeline of the {shown} remediations and migrations: {page} (fleetctl timeline writes one too)\n")
    except Exception as exc:  # the report must not hide the rest because the page failed
        print(f"(timeline not written: {exc})\n")
    if finished:
        print("Every story ended.")
    else:
        print("NOT FINISHED within the time limit:")
        for w in waiting:
            print(f"  - {w}")
    unsafe = any(oracles.get(k) for k in ("pdb_violations", "pods_killed_without_eviction", "workload_pods_lost"))
    return 0 if finished and not unsafe and not lab and dcgm_ok else 1


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
    with devstack.running(scenario=SCENARIO, profile=PROFILE, state_dir=state, hosts=0) as stack:
        # The workspace's endpoint carries the simulator's port: the DCGM settings join the profile
        # here, and the host starts with all of them (as tests/e2e/test_dcgm_e2e.py does).
        stack.settings.update(signal_settings(stack.endpoints))
        stack.settings_path.write_text(json.dumps({"IsEncrypted": False, "Values": stack.settings}, indent=2))
        host_log = stack.state_dir / "host-1.log"
        log_offset = host_log.stat().st_size if host_log.exists() else 0  # devstack appends to an earlier run's log
        stack.start_host("host-1")
        c = stack.endpoints["clock"]
        fleet_clock = clock_mod.ScaledClock(epoch_real=c["epoch_real"], epoch_sim=c["epoch_sim"], speed=c["speed"])
        clock_mod.use(fleet_clock)
        ctx = stack.context()
        story = DcgmStory(ctx, stack.endpoints)
        story.log_offset = log_offset
        player = SignalPlayer(stack, fleet_clock, start=float(c["epoch_sim"]), story=story)
        print(f"  fleet: {len(stack.endpoints['clusters'])} clusters, clock x{c['speed']:g}; logs in {state}\n")
        stack.submit(VALID_REQUEST, team="ml-platform")
        _say(fleet_clock, f"team ml-platform asks for a managed T4 pool on ml-platform ({VALID_REQUEST['requestId']})")
        stack.submit(INVALID_REQUEST, team="ml-platform")
        _say(fleet_clock, f"an intern submits a request that breaks several rules ({INVALID_REQUEST['requestId']})")
        stack.submit(GREEDY_REQUEST, team="research")
        _say(fleet_clock, "someone with research's queue asks for 1,000 H100s on ml-platform, claiming to be "
                          f"ml-platform ({GREEDY_REQUEST['requestId']})")
        narrator = Narrator()
        deadline = time.monotonic() + args.timeout
        finished, waiting = False, list[str]()
        records: dict[tuple[str, str], Any] = {}
        while time.monotonic() < deadline:
            player.play_due()
            records = _snapshot(ctx)  # only to know when every story has ended; the story is told from the events
            for event, text in narrator.new_lines(_published(stack)):
                for line in wrapped(_event_time(event), text):
                    print(line, flush=True)
            story.watch()
            finished, waiting = _finished(records, signals_left=len(player.pending))
            if finished:  # the DCGM story's own end is read from the published events: asked last
                waiting = story.missing(_published(stack), now=fleet_clock.now())
                finished = not waiting
            if finished:
                break
            time.sleep(min(1.0, player.wall_until_next()))
        return report(stack, ctx, records, finished=finished, waiting=waiting, played=player.played, story=story)


if __name__ == "__main__":
    sys.exit(main())

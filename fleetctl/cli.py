"""The fleetctl command line: argument parsing and one function per command.

Every command has ``--help``; every listing has ``--json`` for scripts. Settings come from the
environment, or from a local.settings.json given with ``--settings`` (the environment wins).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from fleetctl import config, records, render
from fleetctl.config import ConfigError, Storage
from fleetctl.fleet import FleetUnavailable

EPILOG = ("settings: for submit TeamRequestsStorage (or TeamRequestsStorage__queueServiceUri) and "
          "POOL_REQUEST_TEAMS/POOL_REQUEST_TEAM; otherwise AzureWebJobsStorage (or "
          "AzureWebJobsStorage__queueServiceUri/__tableServiceUri), LEDGER_TABLE, and for status/plan "
          "the app's fleet settings "
          "(FLEET_SUBSCRIPTIONS, ARM_ENDPOINT, ...); from the environment or --settings local.settings.json.")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetctl", description="Use the GPU fleet steward: request GPU pools, "
                                     "follow them, and see the fleet.", epilog=EPILOG)
    parser.add_argument("--settings", metavar="FILE", help="local.settings.json to read settings from")
    parser.add_argument("--endpoints", metavar="FILE", help="the simulator's endpoints.json: reach its ARM, clusters "
                                                            "and identity endpoint (settings still win)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("submit", help="submit a GPU pool request (JSON) to the pool-request queue",
                       description="Send a pool request to the queue, base64-encoded as the Functions host reads "
                                   "it. Prints the request id (generated when the request has none).",
                       epilog="example: fleetctl submit request.json; cat request.json | fleetctl submit -")
    p.add_argument("file", metavar="FILE|-", help="the request as JSON; - reads standard input")
    p.add_argument("--request-id", help="set (or replace) the request's requestId")
    p.add_argument("--raw", action="store_true", help="send the file exactly as it is, even if it is not a JSON object")
    p.add_argument("--team", help="your team: sends to its queue (POOL_REQUEST_TEAMS; default POOL_REQUEST_TEAM, "
                                  "or the only team configured)")
    p.add_argument("--queue", help="queue to send to, instead of the team's")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("requests", help="list pool requests and their outcomes from the ledger",
                       description="Pool requests as the app recorded them: state, target, and the outcome "
                                   "(the reasons of a rejection, the error of a failure).")
    p.add_argument("--state", action="append", help="only requests in this state (repeatable): accepted, creating, "
                                                     "validating, testing, succeeded, rejected, failed")
    p.add_argument("--id", help="show one request in full, with its history")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("status", help="fleet status: clusters, GPU pools, nodes, remediations, breaker, migrations",
                       description="The fleet as the steward sees it: clusters in scope and their GPU pools "
                                   "(managed or not, nodes Ready and cordoned) from ARM and Kubernetes, plus the "
                                   "ledger: requests, remediations in flight, the breaker and migrations.")
    p.add_argument("--ledger-only", action="store_true", help="do not call ARM or the clusters")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("remediations", help="list GPU node remediations from the ledger",
                       description="Remediations of unhealthy GPU nodes: node, condition, state and last step.")
    p.add_argument("--state", action="append", help="only remediations in this state (repeatable)")
    p.add_argument("--active", action="store_true", help="only remediations still in flight")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("breaker", help="show the fleet circuit breaker, or reset it",
                       description="The breaker stops all remediation when too many GPU nodes fail at once. It "
                                   "stays open until an operator resets it; events from before the reset are "
                                   "dropped as stale.")
    p.add_argument("--reset", action="store_true", help="ask the steward to close the breaker (needs --by and "
                                                         "--reason); written as a command the app validates and "
                                                         "applies at its next reconcile")
    p.add_argument("--by", help="who resets it (recorded in the ledger and the Reset event)")
    p.add_argument("--reason", help="why (recorded with the command and in the Reset event)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("plan", help="show the migration plan for unmanaged GPU pools (changes nothing)",
                       description="Discover unmanaged GPU pools in scope and show how the steward would migrate "
                                   "them to managed pools: order, replacement, strategy, batch, and what is "
                                   "skipped and why. Read-only.")
    p.add_argument("--json", action="store_true", help="print JSON")
    return parser


# --------------------------------------------------------------------------- commands


def _ledger(settings: dict[str, str]) -> Any:
    return records.open_ledger(Storage.from_settings(settings), config.ledger_table(settings))


def cmd_submit(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    from fleetctl.submit import submit

    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    queue = args.queue or config.pool_request_queue(settings, args.team)
    result = submit(text, storage=Storage.team_requests(settings), queue=queue, request_id=args.request_id,
                    raw=args.raw)
    if args.json:
        print(render.as_json({"request_id": result.request_id, "message_id": result.message_id,
                              "queue": result.queue, "generated_id": result.generated_id}), file=out)
    else:
        if result.generated_id:
            print(f"(the request had no requestId; it was given {result.request_id})", file=sys.stderr)
        print(result.request_id or f"message {result.message_id}", file=out)
    return 0


def cmd_requests(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    ledger = _ledger(settings)
    if args.id:
        record = records.get_record(ledger, records.POOL_REQUEST, args.id)
        if record is None:
            print(f"no pool request {args.id!r} in the ledger", file=sys.stderr)
            return 1
        view = {**records.pool_request_view(record), "history": record.history, "data": record.data}
        if args.json:
            print(render.as_json(view), file=out)
        else:
            for key in ("id", "state", "requester", "cluster_id", "pool", "vm_size", "outcome"):
                print(f"{key:>10}: {view.get(key) or '-'}", file=out)
            print("   history:", file=out)
            for line in record.history:
                print(f"    {render.when(line.get('at'))}  {line.get('state', ''):<12} {line.get('note', '')}", file=out)
        return 0
    views = [records.pool_request_view(r) for r in records.list_records(ledger, records.POOL_REQUEST, states=args.state)]
    if args.json:
        print(render.as_json(views), file=out)
        return 0
    if not views:
        print("no pool requests" + (f" in state {', '.join(args.state)}" if args.state else ""), file=out)
        return 0
    print(render.table(("REQUEST", "STATE", "REQUESTER", "CLUSTER", "POOL", "SIZE", "UPDATED", "OUTCOME"),
                       [(v["id"], v["state"], v["requester"], v["cluster"], v["pool"], v["vm_size"],
                         render.when(v["updated_at"]), render.short(v["outcome"], 70)) for v in views]), file=out)
    return 0


def cmd_remediations(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    views = [records.remediation_view(r)
             for r in records.list_records(_ledger(settings), records.REMEDIATION, states=args.state)]
    if args.active:
        views = [v for v in views if not v["terminal"]]
    if args.json:
        print(render.as_json(views), file=out)
        return 0
    if not views:
        print("no remediations" + (" in flight" if args.active else ""), file=out)
        return 0
    print(render.table(("REMEDIATION", "STATE", "CLUSTER", "POOL", "NODE", "CONDITION", "UPDATED", "LAST STEP"),
                       [(v["id"], v["state"], v["cluster"], v["pool"], v["node"], v["condition"],
                         render.when(v["updated_at"]), render.short(v["note"], 60)) for v in views]), file=out)
    return 0


def _breaker_text(view: dict[str, Any]) -> str:
    text = f"breaker: {view['state']}"
    if view["state"] == "open":
        text += f" since {render.when(view['opened_at'])}: {view['reason']}"
    if view.get("reset_by"):
        text += f" (last reset {render.when(view['reset_at'])} by {view['reset_by']})"
    for cmd in view.get("commands") or []:
        outcome = cmd["outcome"] if isinstance(cmd["outcome"], str) else ""
        text += (f"\ncommand {cmd['id']}: {cmd['command']} by {cmd['by']} ({cmd['reason']}): {cmd['state']}"
                 + (f": {outcome}" if outcome else ""))
    return text


def cmd_breaker(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    """Show the breaker; ``--reset`` asks the app to reset it through a validated command record
    (shared.remediation.commands): fleetctl never writes the breaker record itself."""
    if args.reset:
        if not args.by or not args.reason:
            print("fleetctl breaker --reset needs --by NAME and --reason TEXT (who resets it, and why, are recorded)",
                  file=sys.stderr)
            return 2
        from shared.kernel import clock as clocks
        from shared.kernel.errors import Invalid
        from shared.remediation import commands

        try:
            record = commands.request(_ledger(settings), command=commands.BREAKER_RESET, by=args.by,
                                      reason=args.reason, now=clocks.current().now())
        except Invalid as error:
            print(f"fleetctl breaker --reset: {error.reason}", file=sys.stderr)
            return 2
        _nudge(settings, f"command:{record.id}")
        if args.json:
            print(render.as_json(commands.view(record)), file=out)
        else:
            print(f"breaker reset asked by {args.by} (command {record.id}); the steward applies it at its next "
                  "reconcile: see fleetctl breaker", file=out)
        return 0
    ledger = _ledger(settings)
    view = records.breaker_view(records.get_record(ledger, records.BREAKER, "fleet"))
    view["commands"] = records.command_views(ledger)
    print(render.as_json(view) if args.json else _breaker_text(view), file=out)
    return 0


def _nudge(settings: dict[str, str], hint: str) -> None:
    """Wake the app's reconciler now (a message on NUDGE_QUEUE, base64 as the host reads it); best effort:
    without it the command is applied at the next timer tick."""
    import base64

    name = settings.get("NUDGE_QUEUE", "").strip() or "steward-nudge"
    try:
        client: Any = Storage.from_settings(settings).queue_client(name)
        client.send_message(base64.b64encode(hint.encode()).decode("ascii"))
    except Exception as error:  # the queue is the app's; the command is recorded either way
        print(f"(the steward was not nudged: {type(error).__name__}; it applies the command at its next tick)",
              file=sys.stderr)


def cmd_plan(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    from fleetctl.fleet import build_context, observe_plan
    from shared.migration import plan as migration_plan

    plan = observe_plan(build_context())
    print(render.as_json(migration_plan.to_json(plan)) if args.json else migration_plan.render_table(plan).rstrip(),
          file=out)
    return 0


def status_data(settings: dict[str, str], *, ledger_only: bool) -> dict[str, Any]:
    ledger = _ledger(settings)
    requests = records.list_records(ledger, records.POOL_REQUEST)
    remediations = records.list_records(ledger, records.REMEDIATION)
    migrations = records.list_records(ledger, records.MIGRATION)
    data: dict[str, Any] = {
        "pool_requests": records.counts(requests),
        "remediations": records.counts(remediations),
        "remediations_in_flight": [records.remediation_view(r) for r in remediations
                                   if r.state not in records.TERMINAL[records.REMEDIATION]],
        "breaker": records.breaker_view(records.get_record(ledger, records.BREAKER, "fleet")),
        "migrations": [records.migration_view(r) for r in migrations],
        "clusters": None, "fleet_error": "",
        "signals": _signal_lines(settings),
    }
    if not ledger_only:
        from fleetctl.fleet import build_context, fleet_view

        try:
            data["clusters"] = fleet_view(build_context())
        except FleetUnavailable as error:
            data["fleet_error"] = str(error)
    return data


def _signal_lines(settings: dict[str, str]) -> list[str]:
    """What the fault signals cannot see, from the settings alone: DCGM rows whose counter a cluster's
    exporter does not export (shared.remediation.dcgm_reports), or why the setting cannot be read."""
    from shared.kernel.env import SettingError
    from shared.remediation import dcgm_config, dcgm_reports

    try:
        targets = dcgm_config.parse_targets(settings.get("SIGNALS_PROMETHEUS", ""))
    except SettingError as exc:
        return [f"DCGM signal off: {exc}"]
    return dcgm_reports.inactive_lines(targets.values())


def _status_text(data: dict[str, Any]) -> str:
    lines: list[str] = []
    if data["clusters"] is None:
        lines.append(f"clusters: not read ({data['fleet_error'] or 'ledger only'})")
    else:
        lines.append(f"clusters in scope: {len(data['clusters'])}")
        for cluster in data["clusters"]:
            lines.append(f"  {cluster['name']} ({cluster['location']}"
                         + (", node auto-provisioning" if cluster["node_provisioning_mode"] == "Auto" else "") + ")"
                         + (f"  ERROR {cluster['error']}" if cluster["error"] else ""))
            if cluster["pools"]:
                table = render.table(("POOL", "SIZE", "GPU", "GPU STACK", "NODES", "READY", "CORDONED", "STATE"),
                                     [(p["name"], p["vm_size"], p["gpu"], p["management"], p["nodes"], p["ready"],
                                       p["cordoned"], p["provisioning_state"]) for p in cluster["pools"]])
                lines += ["    " + line for line in table.splitlines()]
            elif not cluster["error"]:
                lines.append("    no GPU pools")
    summary = ", ".join(f"{state} {n}" for state, n in sorted(data["pool_requests"].items())) or "none"
    lines.append(f"pool requests: {summary}")
    flight = data["remediations_in_flight"]
    lines.append(f"remediations in flight: {len(flight)}")
    if flight:
        table = render.table(("NODE", "CLUSTER", "STATE", "CONDITION", "SINCE"),
                             [(v["node"], v["cluster"], v["state"], v["condition"], render.when(v["created_at"]))
                              for v in flight])
        lines += ["  " + line for line in table.splitlines()]
        lines += [f"  {'STUCK' if v.get('stuck') else 'RETRYING'} {v['cluster']}/{v['node']} in {v['state']}"
                  + (f" ({v['error_tries']} permanent failures in a row)" if v.get("error_tries") else "")
                  + f": {v['last_error']}" for v in flight if v.get("last_error")]
    lines.append(_breaker_text(data["breaker"]))
    lines += data.get("signals") or []
    migrations = data["migrations"]
    lines.append(f"migrations: {len(migrations)}")
    if migrations:
        table = render.table(("CLUSTER", "POOL", "TO", "STATE", "PROGRESS", "LAST STEP"),
                             [(m["cluster"], m["pool"], m["replacement"], m["state"],
                               f"{m['nodes_drained']}/{m['nodes_total']} nodes", render.short(m["note"], 50))
                              for m in migrations])
        lines += ["  " + line for line in table.splitlines()]
        lines += _migration_reasons(migrations)
    return "\n".join(lines)


def _migration_reasons(migrations: Sequence[dict[str, Any]]) -> list[str]:
    """In full, what an operator must read: why a migration is blocked, and the error a step keeps hitting."""
    out = []
    for m in migrations:
        where = f"{m['cluster']}/{m['pool']}"
        if m["state"] == "blocked" and m.get("reason"):
            out.append(f"  BLOCKED {where}: {m['reason']}")
        elif not m["terminal"] and m.get("last_error"):
            tries = f" ({m['error_tries']} permanent failures in a row)" if m.get("error_tries") else ""
            out.append(f"  RETRYING {where} in {m['state']}{tries}: {m['last_error']}")
    return out


def cmd_status(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    data = status_data(settings, ledger_only=args.ledger_only)
    print(render.as_json(data) if args.json else _status_text(data), file=out)
    return 0


COMMANDS = {"submit": cmd_submit, "requests": cmd_requests, "status": cmd_status, "remediations": cmd_remediations,
            "breaker": cmd_breaker, "plan": cmd_plan}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        settings = config.load(args.settings)
        if args.endpoints:
            settings = config.with_endpoints(settings, args.endpoints)
            config.use_fleet_clock(args.endpoints)
        config.export(settings)
        return COMMANDS[args.command](args, settings, stream)
    except (ConfigError, FleetUnavailable, OSError, ValueError) as error:
        print(f"fleetctl {args.command}: {error}", file=sys.stderr)
        return 2

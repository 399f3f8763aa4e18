"""The fleetctl command line: argument parsing and one function per command.

Every command has ``--help``; every listing has ``-o table|wide|json|yaml`` (``--json`` is ``-o json``).
Settings come from the environment, or from a local.settings.json given with ``--settings`` (the
environment wins). Every error a user can cause or meet is one line on stderr, and the exit code says
what kind it was (:data:`EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from fleetctl import config, records, render
from fleetctl.config import ConfigError, Storage
from fleetctl.fleet import FleetUnavailable

OK, FAILED, USAGE, NOT_FOUND = 0, 1, 2, 3
EXIT_CODES = {OK: "done (also when there was nothing to do; the output says so)",
              FAILED: "failed: storage, ARM or a cluster could not be reached or refused",
              USAGE: "usage or invalid input: a bad option or setting, a missing file, a request the app would reject",
              NOT_FOUND: "not found: the record asked for does not exist"}


class CliError(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code

EPILOG = ("settings: for submit TeamRequestsStorage (or TeamRequestsStorage__queueServiceUri) and "
          "POOL_REQUEST_TEAMS/POOL_REQUEST_TEAM; otherwise AzureWebJobsStorage (or "
          "AzureWebJobsStorage__queueServiceUri/__tableServiceUri), LEDGER_TABLE, and for status/plan "
          "the app's fleet settings "
          "(FLEET_SUBSCRIPTIONS, ARM_ENDPOINT, ...); from the environment or --settings local.settings.json. "
          "Exit codes: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items()) + ".")


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=render.FORMATS, default="table",
                   help="table (default), wide (nothing cut), json or yaml (every field, RFC 3339 times)")
    p.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")


def _states(kind: str) -> list[str]:
    from shared.pools.records import State as PoolState
    from shared.remediation.records import State as RemediationState

    return sorted(s.value for s in (PoolState if kind == records.POOL_REQUEST else RemediationState))


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
    p.add_argument("--dry-run", action="store_true",
                   help="judge the request with the app's own rules and your team's limits, and send nothing "
                        "(exit 2 if the app would reject it)")
    p.add_argument("--resend", action="store_true",
                   help="send it although the ledger already has this request id (a retry of the same request)")
    _output(p)

    p = sub.add_parser("requests", help="list pool requests and their outcomes from the ledger",
                       description="Pool requests as the app recorded them: state, target, and the outcome "
                                   "(the reasons of a rejection, the error of a failure).")
    p.add_argument("--state", action="append", choices=_states(records.POOL_REQUEST), metavar="STATE",
                   help="only requests in this state (repeatable): " + ", ".join(_states(records.POOL_REQUEST)))
    p.add_argument("--id", help="show one request in full, with its history")
    _output(p)

    p = sub.add_parser("status", help="fleet status: clusters, GPU pools, nodes, remediations, breaker, migrations",
                       description="The fleet as the steward sees it: clusters in scope and their GPU pools "
                                   "(managed or not, nodes Ready and cordoned) from ARM and Kubernetes, plus the "
                                   "ledger: requests, remediations in flight, the breaker and migrations.")
    p.add_argument("--ledger-only", action="store_true", help="do not call ARM or the clusters")
    _output(p)

    p = sub.add_parser("remediations", help="list GPU node remediations from the ledger",
                       description="Remediations of unhealthy GPU nodes: node, condition, state and last step.")
    p.add_argument("--state", action="append", choices=_states(records.REMEDIATION), metavar="STATE",
                   help="only remediations in this state (repeatable): " + ", ".join(_states(records.REMEDIATION)))
    p.add_argument("--active", action="store_true", help="only remediations still in flight")
    _output(p)

    p = sub.add_parser("breaker", help="show the fleet circuit breaker, or reset it",
                       description="The breaker stops all remediation when too many GPU nodes fail at once. It "
                                   "stays open until an operator resets it; events from before the reset are "
                                   "dropped as stale.")
    p.add_argument("--reset", action="store_true", help="ask the steward to close the breaker (needs --by and "
                                                         "--reason); written as a command the app validates and "
                                                         "applies at its next reconcile")
    p.add_argument("--by", help="who resets it (recorded in the ledger and the Reset event)")
    p.add_argument("--reason", help="why (recorded with the command and in the Reset event)")
    _output(p)

    p = sub.add_parser("plan", help="show the migration plan for unmanaged GPU pools (changes nothing)",
                       description="Discover unmanaged GPU pools in scope and show how the steward would migrate "
                                   "them to managed pools: order, replacement, strategy, batch, and what is "
                                   "skipped and why. Read-only.")
    _output(p)

    p = sub.add_parser("why", help="why a node was (not) repaired, or a pool (not) migrated, and what would change",
                       description="What the steward decided about a GPU node (its refusals and the sweep's "
                                   "skips while it was faulty, each with the rule and settings behind it and what "
                                   "would have to change; its remediations; the safety state; the node's evaluation "
                                   "now) or, with --pool, about a pool's migration (its record, or the plan's "
                                   "decision). Read-only.")
    p.add_argument("name", metavar="NODE|POOL", help="a node name, or a pool name with --pool")
    p.add_argument("--pool", action="store_true", help="NAME is an agent pool: explain its migration")
    p.add_argument("--cluster", help="the cluster's name (when the name is not unique, or nothing is recorded yet)")
    p.add_argument("--ledger-only", action="store_true", help="do not call ARM or the cluster")
    _output(p)

    p = sub.add_parser("timeline", help="write every remediation and migration on one time axis as an HTML page",
                       description="One row per remediation (node) and migration (pool), a mark per step the "
                                   "steward recorded (fault, admission, cordon, drain, each rung, verification, "
                                   "outcome), its note as the tooltip. A self-contained page: no script, nothing "
                                   "fetched. Read-only.")
    p.add_argument("--out", default="timeline.html", metavar="FILE", help="where to write the page (timeline.html)")
    p.add_argument("--kind", choices=("all", records.REMEDIATION, records.MIGRATION), default="all",
                   help="only remediations or only migrations")
    _output(p)
    return parser


# --------------------------------------------------------------------------- commands


class _Ledger:
    """The app's ledger as fleetctl reaches it: a failure is one line naming the table, its endpoint and the
    setting it came from (never a traceback, never a 22-second wait: one try, 5 s to connect)."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.storage = Storage.from_settings(settings)
        self.table = config.ledger_table(settings)
        self._inner = records.open_ledger(self.storage, self.table)

    def where(self) -> str:
        client = getattr(self._inner, "_table", None)
        url = str(getattr(client, "url", "") or self.storage.table_uri or "").split("?", 1)[0]
        return f"ledger table {self.table} at {url or 'the table service'} (setting {self.storage.setting})"

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            from shared.kernel.errors import Forbidden, NotFound, StewardError

            try:
                return method(*args, **kwargs)
            except NotFound:
                if name == "list":  # no table yet: nothing recorded (a read-only tool never creates it)
                    return []
                raise
            except Forbidden as error:
                raise CliError(f"not allowed to read the {self.where()}: {error}") from None
            except StewardError as error:
                raise CliError(f"cannot reach the {self.where()}: {error}") from None

        return call


def _ledger(settings: dict[str, str]) -> Any:
    return _Ledger(settings)


def _read_request(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"no such file: {path}", USAGE) from None
    except IsADirectoryError:
        raise CliError(f"{path} is a directory, not a request file", USAGE) from None


def _already_submitted(settings: dict[str, str], team: str | None, request_id: str) -> tuple[Any, str]:
    """(the ledger's record of this team's request id or None, why it was not checked)."""
    from shared.pools.records import record_id

    if not request_id or not (settings.get(config.STORAGE) or settings.get(f"{config.STORAGE}__tableServiceUri")
                              or settings.get(f"{config.STORAGE}__accountName")):
        return None, "no ledger settings here (AzureWebJobsStorage)"
    try:
        ledger = _ledger(settings)
        return records.get_record(ledger, records.POOL_REQUEST, record_id(team, request_id)), ""
    except (CliError, ConfigError) as error:
        return None, str(error)


def _judge(text: str, choice: config.TeamChoice) -> Any:
    """The app's own verdict (shared.pools.intake.judge: the seed's rules, the scope, the team's limits)."""
    from fleetctl.fleet import build_context
    from shared.pools.intake import judge

    return judge(text, ctx=build_context(), team=choice.team)  # type: ignore[arg-type]


def _verdict_text(verdict: Any) -> str:
    from shared.pools.validation import Rejection

    if isinstance(verdict, Rejection):
        lines = [f"the app would reject this request ({len(verdict.problems)} problem"
                 f"{'' if len(verdict.problems) == 1 else 's'}):"]
        lines += [f"  {p.field}: {p.problem}" + (f" (fix: {p.fix})" if p.fix else "") for p in verdict.problems]
        return "\n".join(lines)
    req = verdict.request
    return (f"the app would accept this request: {req.request_id}, {req.node_count if req.autoscale is None else ''}"
            f"{'' if req.autoscale is None else f'{req.autoscale.min}-{req.autoscale.max}'} x {req.vm_size} as pool "
            f"{req.pool_name} in {req.cluster.rsplit('/', 1)[-1]} (nothing was sent)")


def cmd_submit(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    from fleetctl.submit import prepare, submit

    text = _read_request(args.file)
    if args.queue:
        choice = config.TeamChoice(args.team, args.queue)
    else:
        choice = config.pool_request_team(settings, args.team)
    message, request_id, generated = prepare(text, request_id=args.request_id, raw=args.raw)
    existing, unchecked = _already_submitted(settings, choice.name, request_id)
    if existing is not None and not args.resend:
        raise CliError(f"request id {request_id} is already in the ledger ({existing.state} since "
                       f"{render.when(existing.updated_at)}): a new request needs a new requestId; to retry that same "
                       "request unchanged, add --resend", USAGE)
    if args.dry_run:
        from shared.pools.validation import Rejection

        verdict = _judge(message, choice)
        rejected = isinstance(verdict, Rejection)
        view = {"request_id": request_id, "would_accept": not rejected, "queue": choice.queue,
                "problems": [{"field": p.field, "problem": p.problem, "fix": p.fix} for p in verdict.problems]
                if rejected else [], "duplicate_check": unchecked or "checked"}
        print(render.output(view, args.output, lambda wide: _verdict_text(verdict)), file=out)
        return USAGE if rejected else OK
    if unchecked and not args.raw:
        print(f"(request id not checked for duplicates: {unchecked})", file=sys.stderr)
    result = submit(text if args.raw else message, storage=Storage.team_requests(settings), queue=choice.queue,
                    request_id=request_id, raw=args.raw)
    view = {"request_id": result.request_id, "message_id": result.message_id, "queue": result.queue,
            "generated_id": generated or result.generated_id, "resent": existing is not None}
    if args.output in ("json", "yaml"):
        print(render.output(view, args.output, lambda wide: ""), file=out)
    else:
        if view["generated_id"]:
            print(f"(the request had no requestId; it was given {result.request_id})", file=sys.stderr)
        print(result.request_id or f"message {result.message_id}", file=out)
    return OK


def _request_text(record: Any, view: dict[str, Any]) -> str:
    lines = [f"{key:>10}: {view.get(key) or '-'}" for key in ("id", "state", "requester", "cluster_id", "pool",
                                                               "vm_size", "outcome")]
    lines.append("   history:")
    lines += [f"    {render.when(line.get('at'))}  {line.get('state', ''):<12} {line.get('note', '')}"
              for line in record.history]
    return "\n".join(lines)


def cmd_requests(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    ledger = _ledger(settings)
    if args.id:
        record = records.get_record(ledger, records.POOL_REQUEST, args.id)
        if record is None:
            matches = records.pool_request_matches(ledger, args.id)
            if len(matches) > 1:
                raise CliError(f"several teams used request id {args.id!r}: ask for one of "
                               f"{', '.join(r.id for r in matches)}", USAGE)
            raise CliError(f"no pool request {args.id!r} in the {ledger.where()}", NOT_FOUND)
        view = {**records.pool_request_view(record), "history": record.history, "data": record.data}
        print(render.output(view, args.output, lambda wide: _request_text(record, view)), file=out)
        return OK
    views = [records.pool_request_view(r) for r in records.list_records(ledger, records.POOL_REQUEST, states=args.state)]

    def text(wide: bool) -> str:
        if not views:
            return "no pool requests" + (f" in state {', '.join(args.state)}" if args.state else "")
        header = ("REQUEST", "STATE", "REQUESTER", "CLUSTER", "POOL", "SIZE", "UPDATED", "OUTCOME")
        return render.table(header + (("CREATED",) if wide else ()),
                            [(v["id"], v["state"], v["requester"], v["cluster"], v["pool"], v["vm_size"],
                              render.when(v["updated_at"]), render.short(v["outcome"], 70, wide=wide))
                             + ((render.when(v["created_at"]),) if wide else ()) for v in views])

    print(render.output(views, args.output, text), file=out)
    return OK


def cmd_remediations(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    views = [records.remediation_view(r)
             for r in records.list_records(_ledger(settings), records.REMEDIATION, states=args.state)]
    if args.active:
        views = [v for v in views if not v["terminal"]]

    def text(wide: bool) -> str:
        if not views:
            return "no remediations" + (" in flight" if args.active else "")
        header = ("REMEDIATION", "STATE", "CLUSTER", "POOL", "NODE", "CONDITION", "UPDATED", "LAST STEP")
        return render.table(header + (("ATTEMPTS", "LAST ERROR") if wide else ()),
                            [(v["id"], v["state"], v["cluster"], v["pool"], v["node"], v["condition"],
                              render.when(v["updated_at"]), render.short(v["note"], 60, wide=wide))
                             + ((v["attempts"], v["last_error"]) if wide else ()) for v in views])

    print(render.output(views, args.output, text), file=out)
    return OK


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
    (shared.remediation.commands): fleetctl never writes the breaker record itself, and writes nothing
    when the breaker is closed already."""
    ledger = _ledger(settings)
    view = records.breaker_view(records.get_record(ledger, records.BREAKER, "fleet"))
    if args.reset:
        if not args.by or not args.reason:
            raise CliError("fleetctl breaker --reset needs --by NAME and --reason TEXT (who resets it, and why, are "
                           "recorded)", USAGE)
        if view["state"] != "open":
            print(f"the breaker is {view['state']}: nothing to reset, no command written", file=out)
            return OK
        from shared.kernel import clock as clocks
        from shared.kernel.errors import Invalid
        from shared.remediation import commands

        try:
            record = commands.request(ledger, command=commands.BREAKER_RESET, by=args.by,
                                      reason=args.reason, now=clocks.current().now())
        except Invalid as error:
            raise CliError(f"fleetctl breaker --reset: {error.reason}", USAGE) from None
        _nudge(settings, f"command:{record.id}")
        done = (f"breaker reset asked by {args.by} (command {record.id}); the steward applies it at its next "
                "reconcile: see fleetctl breaker")
        print(render.output(commands.view(record), args.output, lambda wide: done), file=out)
        return OK
    view["commands"] = records.command_views(ledger)
    print(render.output(view, args.output, lambda wide: _breaker_text(view)), file=out)
    return OK


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


def _migration_off(ctx: Any) -> str:
    """Why no migration will start, or "" when the job is on."""
    policy = getattr(ctx.settings, "migration", None)
    if policy is None or not getattr(policy, "enabled", False):
        return ("migration is off (MIGRATION_ENABLED is not true): the timer plans and starts nothing; "
                "this is what it would do")
    return ""


def cmd_plan(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    from fleetctl.fleet import build_context, observe_plan
    from shared.migration import plan as migration_plan

    ctx = build_context(ledger=_ledger(settings))
    plan = observe_plan(ctx)
    off = _migration_off(ctx)
    data = {**migration_plan.to_json(plan), "migration_enabled": not off, "note": off}

    def text(wide: bool) -> str:
        table = migration_plan.render_table(plan).rstrip()
        return f"{off}\n{table}" if off else table

    print(render.output(data, args.output, text), file=out)
    return OK


def _cluster_id(ctx: Any, name: str | None) -> str | None:
    from shared.fleet import scope

    if not name:
        return None
    for cluster in scope.discover(ctx.access.aks(), ctx.settings):
        if cluster.name == name:
            return str(cluster.id)
    return None


def cmd_why(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    from fleetctl import why
    from fleetctl.fleet import build_context, observe_plan

    ledger = _ledger(settings)
    if args.pool:
        plan, off, note = None, "", ""
        if not args.ledger_only:
            try:
                ctx = build_context(ledger=ledger)
                plan, off = observe_plan(ctx), _migration_off(ctx)
            except Exception as error:  # the ledger part still answers, whatever stopped the live part
                note = f"the plan was not computed: {' '.join(str(error).split())}"
        story = why.pool_story(ledger, args.name, cluster=args.cluster, plan=plan)
        story["note"] = note
        if not story["migrations"] and not story["plan"] and not story["skipped"] and plan is not None:
            raise CliError(f"no pool {args.name!r} in a migration record or the plan (it is not an unmanaged GPU pool "
                           "of a cluster in scope)", NOT_FOUND)
        text = why.pool_text(story, off=off) + (f"\n{note}" if note else "")
        print(render.output(story, args.output, lambda wide: text), file=out)
        return OK
    refusals = why.refusals(ledger, args.name, cluster=args.cluster)
    remediations = why.remediations(ledger, args.name, cluster=args.cluster)
    skips = why.skips(ledger, args.name, cluster=args.cluster)
    story: dict[str, Any] = {"node": args.name, "cluster": args.cluster, "refusals": refusals, "skips": skips,
                             "remediations": remediations, "safety": why.safety(ledger, settings), "now": None,
                             "now_error": "--ledger-only" if args.ledger_only else ""}
    recorded = next((str(x.get("cluster_id") or x.get("cluster") or "") for x in [*remediations, *refusals, *skips]
                     if x.get("cluster_id") or str(x.get("cluster") or "").startswith("/subscriptions/")), "")
    if not args.ledger_only:
        try:
            ctx = build_context(ledger=ledger)
            cluster_id = recorded or _cluster_id(ctx, args.cluster)
            if cluster_id:
                story["cluster"] = cluster_id.rstrip("/").rsplit("/", 1)[-1]
                story["now"] = why.evaluation(ctx, cluster_id, args.name)
            else:
                story["now_error"] = "no cluster recorded for it: give --cluster NAME"
        except Exception as error:  # the ledger part still answers, whatever stopped the live part
            story["now_error"] = " ".join(str(error).split())[:300]
    gone = story["now"] is not None and story["now"]["bucket"] == "gone"
    if not refusals and not remediations and not skips and (gone or (story["now"] is None and args.cluster is None)):
        raise CliError(f"nothing recorded about node {args.name!r}" + (" and it is not in the cluster" if gone else
                       " (give --cluster NAME to read it from the cluster)"), NOT_FOUND)
    print(render.output(story, args.output, lambda wide: why.node_text(story, wide=wide)), file=out)
    return OK


def cmd_timeline(args: argparse.Namespace, settings: dict[str, str], out: TextIO) -> int:
    from fleetctl import timeline

    kinds = (records.REMEDIATION, records.MIGRATION) if args.kind == "all" else (args.kind,)
    chosen = [s for s in timeline.stories(_ledger(settings)) if s.kind in kinds]
    try:
        Path(args.out).write_text(timeline.render(chosen), encoding="utf-8")
    except OSError as error:
        raise CliError(f"cannot write {args.out}: {error.strerror or error}", USAGE) from None
    view = {"file": str(Path(args.out).resolve()), "stories": timeline.summary(chosen)}
    print(render.output(view, args.output, lambda wide: f"wrote {view['file']}: {len(chosen)} stories"
                        + ("" if chosen else " (nothing recorded yet)")), file=out)
    return OK


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
    data["safety"] = safety_state(settings, data)
    if not ledger_only:
        from fleetctl.fleet import build_context, fleet_view

        try:
            data["clusters"] = fleet_view(build_context(ledger=ledger))
        except FleetUnavailable as error:
            data["fleet_error"] = str(error)
    return data


def safety_state(settings: dict[str, str], data: dict[str, Any]) -> dict[str, Any]:
    """What stops or limits the steward now, fleet-wide and per cluster: pause, dry run, whether migration runs,
    the breaker and its window, and the remediation budgets in use against their limits (the app's own
    settings readers, so a default here is the app's default)."""
    from shared.kernel.env import SettingError, env_bool
    from shared.migration.policy import MigrationPolicy
    from shared.remediation.policy import RemediationPolicy

    try:
        rem, mig = RemediationPolicy.from_env(settings), MigrationPolicy.from_env(settings)
    except SettingError as error:
        return {"error": str(error)}
    in_flight = data["remediations_in_flight"]
    by_cluster: dict[str, int] = {}
    for v in in_flight:
        by_cluster[str(v["cluster"])] = by_cluster.get(str(v["cluster"]), 0) + 1
    breaker = data["breaker"]
    return {
        "paused": env_bool("STEWARD_PAUSED", False, env=settings),
        "remediation_dry_run": rem.dry_run, "migration_enabled": mig.enabled,
        "breaker": {"state": breaker["state"], "enabled": rem.breaker_enabled,
                    "unhealthy_in_window": breaker["unhealthy_in_window"], "window_s": rem.breaker_window_s,
                    "opens_at_percent": rem.breaker_percent, "min_nodes": rem.breaker_min_nodes},
        "budgets": {"fleet_in_flight": len(in_flight), "fleet_max_in_flight": rem.max_in_flight,
                    "cluster_max_in_flight": rem.cluster_max_in_flight, "clusters_in_flight": by_cluster,
                    "pool_max_unavailable": rem.pool_max_unavailable,
                    "pool_max_unavailable_percent": rem.pool_max_unavailable_percent,
                    "node_cooldown_s": rem.cooldown_s, "node_max_attempts": rem.max_attempts},
    }


def _safety_lines(safety: dict[str, Any], clusters: list[dict[str, Any]] | None) -> list[str]:
    if "error" in safety:
        return [f"safety: not read ({safety['error']})"]
    b, budgets = safety["breaker"], safety["budgets"]
    switches = [("STEWARD_PAUSED: every write held" if safety["paused"] else "not paused"),
                ("REMEDIATION_DRY_RUN: remediation acts on nothing" if safety["remediation_dry_run"]
                 else "remediation acts"),
                ("migration on" if safety["migration_enabled"] else "migration off (MIGRATION_ENABLED)")]
    lines = ["safety: " + "; ".join(switches),
             f"  breaker {b['state']}" + ("" if b["enabled"] else " (BREAKER_ENABLED=false)")
             + f": {b['unhealthy_in_window']} unhealthy in the last {b['window_s']} s, opens at {b['opens_at_percent']}% "
             f"of the fleet's GPU nodes (at least {b['min_nodes']})",
             f"  remediations in flight: {budgets['fleet_in_flight']} of {budgets['fleet_max_in_flight']} "
             f"(BUDGET_MAX_IN_FLIGHT); per cluster at most {budgets['cluster_max_in_flight']} "
             f"(BUDGET_CLUSTER_MAX_IN_FLIGHT); per pool {budgets['pool_max_unavailable']} node(s) or "
             f"{budgets['pool_max_unavailable_percent']}% unavailable (BUDGET_POOL_MAX_UNAVAILABLE[_PERCENT])"]
    for name, count in sorted(budgets["clusters_in_flight"].items()):
        lines.append(f"  {name}: {count} of {budgets['cluster_max_in_flight']} in flight")
    for cluster in clusters or []:
        if cluster.get("paused"):
            lines.append(f"  {cluster['name']}: {cluster['paused']}")
    return lines


def _evaluation_text(ev: dict[str, Any]) -> str:
    """The sweep's buckets for one cluster's GPU nodes, skipped nodes counted by reason (the start-up grace...)."""
    parts = [f"{ev['healthy']} healthy", f"{ev['unhealthy']} unhealthy", f"{ev['pending']} pending (fault not yet past "
             f"its threshold)", f"{ev['unknown']} unknown"]
    skipped = ev.get("skipped") or {}
    if skipped:
        parts.append(f"{sum(skipped.values())} skipped (" + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items()))
                     + ")")
    return ", ".join(parts)


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
            if cluster.get("evaluation"):
                lines.append("    GPU nodes now, as the sweep judges them: " + _evaluation_text(cluster["evaluation"]))
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
    lines += _safety_lines(data.get("safety") or {"error": "not computed"}, data["clusters"])
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
    print(render.output(data, args.output, lambda wide: _status_text(data)), file=out)
    return OK


COMMANDS = {"submit": cmd_submit, "requests": cmd_requests, "status": cmd_status, "remediations": cmd_remediations,
            "breaker": cmd_breaker, "plan": cmd_plan, "why": cmd_why, "timeline": cmd_timeline}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run one command; the exit code is one of :data:`EXIT_CODES` (argparse's own usage errors exit 2)."""
    from shared.kernel.errors import StewardError

    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        settings = config.load(args.settings)
        if args.endpoints:
            settings = config.with_endpoints(settings, args.endpoints)
            config.use_fleet_clock(args.endpoints)
            # The simulator's identity endpoint is the platform's, as App Service sets it: it wins over a
            # stale one left in the environment (another simulator's), which would only refuse connections.
            for name in ("IDENTITY_ENDPOINT", "IDENTITY_HEADER"):
                if settings.get(name):
                    os.environ[name] = settings[name]
        config.export(settings)
        return COMMANDS[args.command](args, settings, stream)
    except CliError as error:
        code, message = error.code, str(error)
    except (ConfigError, ValueError) as error:  # settings, or a request file that is not a request
        code, message = USAGE, str(error)
    except FleetUnavailable as error:
        code, message = FAILED, str(error)
    except StewardError as error:  # ARM or a cluster answered with an error the adapters named
        code, message = FAILED, f"{type(error).__name__}: {error}"
    except OSError as error:
        code, message = FAILED, f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
    print(f"fleetctl {args.command}: {' '.join(message.split())}", file=sys.stderr)
    return code

"""``python -m devhost``: run the app locally, or list the functions the host finds in it.

    python -m devhost functions [--settings local.settings.json] [--json]
    python -m devhost run --settings local.settings.json [--endpoints .state/sim/endpoints.json] [--for 60]
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from devhost import settings as host_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devhost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--settings", help="local.settings.json-shaped file (its Values; the environment wins)")
        p.add_argument("--app", default="function_app", help="app module (default: function_app)")
        p.add_argument("--app-dir", default=None, help="directory holding the app script and host.json "
                                                       "(default: current directory, imported normally)")
        p.add_argument("--host-json", default=None, help="host.json to use (default: <app dir>/host.json)")
        p.add_argument("-v", "--verbose", action="store_true", help="debug logging (tracebacks of failures)")

    run = sub.add_parser("run", help="run the app's triggers until stopped (Ctrl-C) or for --for seconds",
                         description="Run queue, timer and Event Grid triggers like `func start`.")
    common(run)
    run.add_argument("--endpoints", help="the simulator's endpoints.json (clock, Event Grid feed, CA, identity)")
    run.add_argument("--for", dest="for_s", type=float, default=None, help="stop after this many seconds")
    run.add_argument("--subscriptions", default=None, help="Event Grid subscriptions file "
                                                           "(default: devhost/eventgrid_subscriptions.json)")
    run.add_argument("--stats", default=None, help="write the final stats as JSON to this file")
    run.add_argument("--name", default=None, help="host instance name (in logs)")
    run.add_argument("--ready-file", default=None, help="create this file once the host has started")
    run.add_argument("--queue-lease", type=float, default=None, metavar="SECONDS",
                     help="how long a received message stays hidden while it runs (default 600, as the host; "
                          "shorter makes messages held by a killed host come back sooner)")

    functions = sub.add_parser("functions", help="list the functions and bindings the host finds in the app",
                               description="Index the app as the worker does and print its functions.")
    common(functions)
    functions.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _settings(args: argparse.Namespace) -> dict[str, str]:
    return host_settings.load(args.settings)


def _host(args: argparse.Namespace, **extra: Any) -> Any:
    from devhost.host import Host

    return Host(args.app, _settings(args), host_json=args.host_json, app_dir=args.app_dir, **extra)


def cmd_functions(args: argparse.Namespace) -> int:
    host = _host(args)
    specs = host.load()
    if args.json:
        print(json.dumps([s.describe() for s in specs], indent=2, default=str))
        return 0
    for spec in specs:
        trigger = spec.trigger
        detail = trigger.properties.get("queueName") or trigger.properties.get("schedule") or ""
        outputs = ", ".join(f"{b.name}->{b.type}:{b.queue_name or ''}" for b in spec.outputs)
        print(f"{spec.name:<22} {trigger.type:<17} {trigger.name:<6} {detail}" + (f"  outputs: {outputs}" if outputs else ""))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {"queue_lease_s": args.queue_lease} if args.queue_lease else {}
    host = _host(args, endpoints=args.endpoints, eventgrid_subscriptions=args.subscriptions, name=args.name, **extra)
    signal.signal(signal.SIGTERM, lambda *_: host.request_stop())
    try:
        host.start()
        if args.ready_file:
            Path(args.ready_file).write_text(host.name, encoding="utf-8")
        if args.for_s is not None:
            stats = host.run_for(args.for_s)
        else:
            host.run_forever()
            stats = host.stats()
    except KeyboardInterrupt:
        host.stop()
        stats = host.stats()
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=2), encoding="utf-8")
    print(json.dumps(stats))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not args.verbose:  # the SDKs log every HTTP request at INFO; the host's own lines are what matter
        for noisy in ("azure", "urllib3", "kubernetes"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    from devhost.host import HostError

    try:
        return {"run": cmd_run, "functions": cmd_functions}[args.command](args)
    except (HostError, host_settings.SettingsError) as error:
        print(f"devhost: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``python -m devstack up`` (``make up``): a local stack to try the steward and fleetctl on, until stopped.

It starts the simulator (a scenario's fleet), Azurite with its data kept under the state directory (the
ledger and the queues survive a restart; the simulated fleet starts again from its scenario), and one
local Functions host running the app; prints the settings file and the endpoints file fleetctl needs; and
keeps running until Ctrl-C (SIGINT) or SIGTERM, then stops everything it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import devstack

DEFAULT_STATE = devstack.ROOT / ".state" / "up"
DEFAULT_SCENARIO = devstack.ROOT / "sim" / "scenarios" / "default.yaml"
READY = "stack up"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the simulator, Azurite (kept under --state) and a local host; wait")
    up.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO, help="the simulated fleet (YAML)")
    up.add_argument("--state", type=Path, default=DEFAULT_STATE, help="where settings, logs and storage are kept")
    up.add_argument("--hosts", type=int, default=1, help="local Functions hosts to run (0: none, just the stack)")
    args = parser.parse_args(argv)
    if not args.scenario.is_file():
        print(f"python -m devstack up: no such scenario file: {args.scenario}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with devstack.running(scenario=args.scenario, state_dir=args.state, hosts=args.hosts, keep_storage=True) as stack:
        settings, endpoints = stack.settings_path, stack.endpoints_path
        try_it = f"python -m fleetctl --settings {settings} --endpoints {endpoints}"
        print(f"{READY}: {len(stack.endpoints['clusters'])} simulated clusters, Azurite data in "
              f"{args.state / 'azurite'}, {args.hosts} local host(s), logs in {args.state}", flush=True)
        print(f"settings:  {settings}\nendpoints: {endpoints}", flush=True)
        print(f"try:       {try_it} status\n           {try_it} plan\n"
              f"           {try_it} submit request.json --dry-run\n(Ctrl-C stops it)", flush=True)
        stop.wait()
        print("stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

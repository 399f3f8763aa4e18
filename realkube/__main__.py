"""``python -m realkube build | up``: build the real control plane, or run one until interrupted.

  build   build the binaries from Go modules into the cache (seconds when they are there)
  up      start etcd, kube-apiserver, the controller manager, the scheduler and kwok on loopback,
          print the admin kubeconfig's path, and stop everything on Ctrl-C
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from realkube import build, cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realkube", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--force", action="store_true")
    up = sub.add_parser("up")
    up.add_argument("--dir", type=Path, default=None, help="run directory (logs, etcd data, kubeconfigs)")
    up.add_argument("--token-webhook", default=None, help="URL of a TokenReview webhook (the simulator's /_sim/tokenreview)")
    up.add_argument("--webhook-ca", default=None, help="CA bundle of the webhook's server")
    args = parser.parse_args(argv)
    if args.command == "build":
        return build.main(["--force"] if args.force else [])
    run_dir = args.dir or Path(tempfile.mkdtemp(prefix="realkube-"))
    try:
        real = cluster.start(run_dir, token_webhook=args.token_webhook, webhook_ca=args.webhook_ca)
    except (cluster.ClusterError, build.BuildError) as err:
        print(f"realkube: could not start: {err}", file=sys.stderr)
        return 1
    print(f"realkube: up at {real.server}\nexport KUBECONFIG={real.admin_kubeconfig}", flush=True)
    stop = {"now": False}
    waiter = threading.Event()

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stop["now"]:
            real.check_alive()
            waiter.wait(1.0)
    finally:
        real.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

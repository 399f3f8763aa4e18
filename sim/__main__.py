"""``python -m sim``: run the fleet simulator, read its oracles, generate large fleets.

Commands:
  serve     start every simulated service; writes DIR/endpoints.json, DIR/ca.pem and one kubeconfig
            per cluster (static bearer token for the AKS audience, so kubectl needs no exec plugin)
  oracles   print the oracles of a running simulator (from DIR/endpoints.json) as JSON
  state     print the summary of pools, nodes and pods of a running simulator as JSON
  generate  write a large-fleet scenario (default 100 clusters x 1,000 nodes) for benchmarks
  measure-list  list N realistic nodes with the kubernetes client; print the simulator's share of the time
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import ssl
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def _kubeconfig(name: str, server: str, ca: Path, token: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
            "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-user"}}],
            "users": [{"name": f"{name}-user", "user": {"token": token}}]}


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def serve(args: argparse.Namespace) -> int:
    from sim.core.certs import make_certs
    from sim.core.server import SimServer
    from sim.identity.tokens import AKS_AUDIENCES, ARM_AUDIENCES
    from sim.scenario import ScenarioError, build_fleet

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    state_dir = Path(args.state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "endpoints.json").unlink(missing_ok=True)
    try:
        fleet = build_fleet(args.scenario, seed=args.seed, speed=args.speed)
    except ScenarioError as e:
        print(f"scenario error: {e}", file=sys.stderr)
        return 2
    import gc

    gc.freeze()  # the fleet lives as long as the process: keep the cyclic GC from rescanning it
    certs = make_certs(state_dir)
    server = SimServer(fleet, certs, port=args.port, identity_port=args.identity_port)
    server.start()
    base = server.base_url
    clusters = []
    names = [c.name for c in fleet.clusters.values()]
    old_lifetime = fleet.tokens.lifetime_s
    fleet.tokens.lifetime_s = 10 * 365 * 24 * 3600
    try:
        token, _exp = fleet.tokens.issue(AKS_AUDIENCES[0], principal="kubeconfig-user")
    finally:
        fleet.tokens.lifetime_s = old_lifetime
    for key in sorted(fleet.clusters):
        c = fleet.clusters[key]
        label = c.name if names.count(c.name) == 1 else f"{c.resource_group}-{c.name}"
        server_url = f"{base}/k8s/{c.subscription}/{c.resource_group}/{c.name}"
        kc_path = state_dir / f"kubeconfig-{label}.yaml"
        kc_path.write_text(yaml.safe_dump(_kubeconfig(label, server_url, certs.ca, token), sort_keys=False))
        clusters.append({"id": c.id, "name": c.name, "subscription": c.subscription, "resource_group": c.resource_group,
                         "location": c.location, "tags": dict(c.tags), "kubeconfig": str(kc_path),
                         "kube_server": server_url})
    identity_header = ""
    eventgrid_key = ""
    from sim.identity.api import app_principal_id, identity_secret

    identity_header = identity_secret(fleet)
    try:
        from sim.eventgrid.api import eventgrid_key as eg_key

        eventgrid_key = eg_key(fleet)
    except ImportError:
        pass
    endpoints = {
        "arm_endpoint": base, "arm_audience": ARM_AUDIENCES[0], "ca_bundle": str(certs.ca),
        "identity_endpoint": f"http://127.0.0.1:{server.http_port}/msi/token", "identity_header": identity_header,
        "eventgrid_topic_endpoint": f"{base}/eventgrid/api/events",
        "eventgrid_deliveries": f"{base}/eventgrid/_deliveries", "eventgrid_key": eventgrid_key,
        "clock": fleet.clock.published(), "control": f"{base}/_sim",
        "control_http": f"http://127.0.0.1:{server.http_port}/_sim",
        "kube_token": token, "seed": fleet.seed, "pid": os.getpid(),
        # the object id of the app's managed identity: what RBAC bindings and role assignments name
        # (kubectl auth can-i --as <it> ...)
        "app_principal_id": app_principal_id(fleet),
        "subscriptions": sorted({c.subscription for c in fleet.clusters.values()}),
        "clusters": clusters,
    }
    _write_json(state_dir / "endpoints.json", endpoints)
    print(json.dumps({"endpoints": str(state_dir / "endpoints.json"), "arm_endpoint": base}), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


def _get(state_dir: str, path: str) -> Any:
    endpoints = json.loads((Path(state_dir) / "endpoints.json").read_text())
    ctx = ssl.create_default_context(cafile=endpoints["ca_bundle"])
    with urllib.request.urlopen(f"{endpoints['control']}{path}", context=ctx, timeout=30) as resp:
        return json.loads(resp.read())


def oracles(args: argparse.Namespace) -> int:
    print(json.dumps(_get(args.state_dir, "/oracles"), indent=2))
    return 0


def state(args: argparse.Namespace) -> int:
    print(json.dumps(_get(args.state_dir, "/state"), indent=2))
    return 0


def generate(args: argparse.Namespace) -> int:
    from sim.generate import large_fleet

    sc = large_fleet(clusters=args.clusters, nodes_per_cluster=args.nodes, pools_per_cluster=args.pools,
                     seed=args.seed, pods_per_node=args.pods_per_node, unhealthy_fraction=args.unhealthy)
    text = json.dumps(sc) if args.out.endswith(".json") else yaml.safe_dump(sc, sort_keys=False)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
    return 0


def measure(args: argparse.Namespace) -> int:
    from sim.generate import measure_list

    print(json.dumps(measure_list(nodes=args.nodes, page_size=args.page_size), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    subs = parser.add_subparsers(dest="command", required=True)
    p = subs.add_parser("serve", help="start the simulator and serve until stopped (SIGINT/SIGTERM)")
    p.add_argument("--state-dir", required=True, help="directory for endpoints.json, ca.pem, kubeconfigs")
    p.add_argument("--scenario", default=None,
                   help="scenario file (YAML/JSON) or a name in sim/scenarios/ (default: sim/scenarios/default.yaml)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's seed, else 0)")
    p.add_argument("--speed", type=float, default=None, help="clock speed, overrides the scenario's clock.speed")
    p.add_argument("--port", type=int, default=0, help="HTTPS port (default: any free port)")
    p.add_argument("--identity-port", type=int, default=0, help="managed-identity HTTP port (default: any free port)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")
    p.set_defaults(fn=serve)
    p = subs.add_parser("oracles", help="print the oracles of a running simulator as JSON")
    p.add_argument("--state-dir", required=True, help="the --state-dir the simulator was started with")
    p.set_defaults(fn=oracles)
    p = subs.add_parser("state", help="print pools, nodes and pods of a running simulator as JSON")
    p.add_argument("--state-dir", required=True, help="the --state-dir the simulator was started with")
    p.set_defaults(fn=state)
    p = subs.add_parser("generate", help="write a large-fleet scenario for benchmarks")
    p.add_argument("--clusters", type=int, default=100, help="number of clusters (default 100)")
    p.add_argument("--nodes", type=int, default=1000, help="GPU nodes per cluster (default 1000)")
    p.add_argument("--pools", type=int, default=10, help="GPU pools per cluster (default 10)")
    p.add_argument("--pods-per-node", type=int, default=0, help="workload pods per GPU node (default 0)")
    p.add_argument("--unhealthy", type=float, default=0.0, help="fraction of nodes flipped unhealthy at start")
    p.add_argument("--seed", type=int, default=0, help="scenario seed")
    p.add_argument("--out", default="-", help="output file (.yaml or .json), '-' for stdout (YAML)")
    p.set_defaults(fn=generate)
    p = subs.add_parser("measure-list", help="measure the simulator's share of listing many nodes")
    p.add_argument("--nodes", type=int, default=5000, help="nodes in the cluster (default 5000)")
    p.add_argument("--page-size", type=int, default=500, help="list page size, 0 for one page (default 500)")
    p.set_defaults(fn=measure)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())

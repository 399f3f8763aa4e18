"""Benchmark 6: ARM and Kubernetes requests per remediation and per migration (the simulator's counts).

Read from the simulator's request oracles over the runs of bench.remediation_run and
bench.migration_run; never from the app's own account. The remediation window (fault to ``done``)
also contains the periodic sweeps; their share is subtracted route by route using the requests per
sweep measured in the quiet window before the fault (sweeps are counted by the fleet-wide cluster
list, which only the sweep issues there). The migration run has no sweeps at all; its counts include
the planner's runs during the migration. Event Grid delivery polling is the local host's, not the
app's, and is left out.
"""

from __future__ import annotations

from bench import migration_run, remediation_run
from bench.figures import Figure, measured, not_measured
from bench.scale import Scale

SWEEP_ROUTE = "GET /subscriptions/{}/providers/Microsoft.ContainerService/managedClusters"
_TOTALS = ("total", "reads", "writes")


def net_of_sweeps(window: dict[str, dict[str, int]], quiet: dict[str, dict[str, int]], service: str) -> tuple[float, int]:
    """``(requests of the remediation itself, sweeps subtracted)`` for one service."""
    quiet_sweeps = quiet.get("arm", {}).get(SWEEP_ROUTE, 0)
    sweeps = window.get("arm", {}).get(SWEEP_ROUTE, 0)
    gross = window.get(service, {}).get("total", 0)
    if not quiet_sweeps:
        return float(gross), 0
    background = sum(v for k, v in quiet.get(service, {}).items() if k not in _TOTALS and not k.startswith("status_"))
    return gross - background / quiet_sweeps * sweeps, sweeps


def _top(per: dict[str, int], n: int = 4) -> str:
    routes = sorted(((v, k) for k, v in per.items() if k not in _TOTALS and not k.startswith("status_")), reverse=True)
    prefix = "/subscriptions/{}/resourceGroups/{}/providers/"
    return ", ".join(f"{v} {k.split(' ', 1)[0]} {k.split(' ', 1)[1].replace(prefix, '')}" for v, k in routes[:n])


def run(scale: Scale) -> list[Figure]:
    figures: list[Figure] = []
    rem = remediation_run.get(scale)
    if rem.error or not rem.window:
        why = rem.error or "the remediation did not finish"
        figures += [not_measured(f"{svc} requests per remediation", "requests", why) for svc in ("ARM", "Kubernetes")]
    else:
        for svc, name in (("arm", "ARM"), ("kube", "Kubernetes")):
            net, sweeps = net_of_sweeps(rem.window["counts"], rem.quiet["counts"], svc)
            per = rem.window["counts"].get(svc, {})
            figures.append(measured(
                f"{name} requests per remediation ({scale.drain_pods}-pod node, restart rung)", net, "requests",
                note=f"{per.get('total', 0)} counted, {sweeps} sweeps' worth subtracted; {per.get('writes', 0)} writes; "
                     f"top: {_top(per)}"))
    mig = migration_run.get(scale)
    if mig.error or not mig.counts:
        why = mig.error or "the migration did not finish"
        figures += [not_measured(f"{svc} requests per migration", "requests", why) for svc in ("ARM", "Kubernetes")]
    else:
        for svc, name in (("arm", "ARM"), ("kube", "Kubernetes")):
            per = mig.counts.get(svc, {})
            figures.append(measured(
                f"{name} requests per migration ({scale.migration_nodes}-node pool)", float(per.get("total", 0)),
                "requests", note=f"{per.get('writes', 0)} writes; planner runs included; top: {_top(per)}"))
    return figures

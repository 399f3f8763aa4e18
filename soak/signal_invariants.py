"""The invariants of issue 13's fault signals (soak/signals.py), checked after every soak run.

Pure functions over the run's :class:`soak.invariants.Evidence`, like the others; the signal actions the
driver performed are in ``evidence.actions`` (with their sim time ``t``, the node they hit and the ids of
the events the simulator delivered). What the existing checks already hold for every source (no PDB
violation, no pod killed without eviction, budgets, one repair per fault) is not repeated here.

17. ``forged-event``: a forged HealthResources event about a VM outside the fleet touches nothing: no
    record of any kind names the VM or one of the forged events, and the app publishes nothing about it.
18. ``prometheus-outage``: while the workspace is down, no DCGM fault is published (nothing is inferred
    from missing data: a node without answers is neither healthy nor faulty). An event's ``observed_at``
    has whole seconds, so a sweep in the second the workspace came back is not charged to the outage.
19. ``one-remediation-per-node``: a node never has two remediations active at once, whatever their
    sources (a condition fault, a health event and a DCGM fault on one node are one remediation).
20. ``signal-false-positive``: no remediation from an application XID (13, 31, 43: the application's
    fault, not the GPU's), and none from Resource Health on a node whose only health events were ones a
    policy row only records (planned maintenance, a reboot for repair). A condition or DCGM fault on that
    node starts its own remediation, whose signal is npd or dcgm, never resource-health.
Whether each genuine fault of a signal (and of every other source) ended somewhere named is
soak/liveness.py's ``fault-liveness`` (issue 24).
"""

from __future__ import annotations

from typing import Any

from shared.kernel.timefmt import parse_time
from shared.remediation.records import ACTIVE_STATES
from soak.invariants import Evidence, Violation, _cluster_name
from soak.signals import APPLICATION_XIDS, RECORD_ONLY_SCENARIOS

UNHEALTHY = "Steward.GpuNode.Unhealthy"
DCGM = "dcgm"
RESOURCE_HEALTH = "resource-health"
#: Host-process runs: a sweep's query and its publication are not one instant on a scaled wall clock.
PROCESS_SLACK_S = 5.0


def _done(evidence: Evidence, *kinds: str) -> list[dict[str, Any]]:
    return sorted((a for a in evidence.actions if a.get("kind") in kinds and a.get("ok")), key=lambda a: float(a["t"]))


def check_forged_events(evidence: Evidence) -> list[Violation]:
    out = []
    for action in _done(evidence, "resource-health-forged"):
        vm = str(action["vm"]).lower()
        marks = [vm, *(str(e).lower() for e in action.get("events") or [])]
        for kind, records in evidence.records.items():
            for rec in records:
                text = f"{rec.id} {rec.data}".lower()
                if any(m in text for m in marks):
                    out.append(Violation("forged-event", f"{kind} record {rec.id} names the forged VM {action['vm']} "
                                                         "or one of its forged events"))
        for event in evidence.published:
            if vm in str(event).lower():
                out.append(Violation("forged-event", f"the app published {event.get('type')} about the forged VM "
                                                     f"{action['vm']}"))
    return out


def outage_windows(evidence: Evidence) -> list[tuple[float, float]]:
    """When the workspace was down: from each ``down`` to the next ``up`` (or the end of the run)."""
    windows, down = [], None
    for action in _done(evidence, "dcgm-outage"):
        if action.get("down") and down is None:
            down = float(action["t"])
        elif not action.get("down") and down is not None:
            windows.append((down, float(action["t"])))
            down = None
    if down is not None:
        windows.append((down, float("inf")))
    return windows


def check_prometheus_outage(evidence: Evidence) -> list[Violation]:
    out = []
    slack = PROCESS_SLACK_S if evidence.scenario.process_mode else 0.0
    for lo, hi in outage_windows(evidence):
        for event in evidence.published:
            data = event.get("data") or {}
            if event.get("type") != UNHEALTHY or data.get("signal") != DCGM:
                continue
            at = parse_time(str(data.get("observed_at") or "") or None)
            # observed_at has whole seconds (truncated): the sweep ran in [at, at + 1), all of it in the window.
            if at is not None and lo + slack <= at and at + 1.0 <= hi:
                out.append(Violation("prometheus-outage", f"DCGM fault {data.get('condition')} on {data.get('node')} "
                                                          f"observed at {at - evidence.start:.0f} s, while the "
                                                          f"workspace was down ({lo - evidence.start:.1f}-"
                                                          f"{hi - evidence.start:.1f} s)"))
    return out


def _end(rec: Any) -> float:
    """When a remediation stopped being active (never, while it still is)."""
    if rec.state in ACTIVE_STATES:
        return float("inf")
    return float(rec.data.get("finished_at") or rec.updated_at)


def check_one_remediation_per_node(evidence: Evidence) -> list[Violation]:
    out = []
    by_node: dict[tuple[str, str], list[Any]] = {}
    for rec in evidence.records.get("remediation", []):
        if rec.data.get("dry_run"):
            continue
        by_node.setdefault((_cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", ""))), []).append(rec)
    for (cluster, node), recs in by_node.items():
        recs.sort(key=lambda r: r.created_at)
        active: Any = None  # the remediation that ends last among those admitted so far
        for rec in recs:
            if active is not None and rec.created_at < _end(active):
                out.append(Violation("one-remediation-per-node", f"{cluster}/{node}: remediation {rec.id} "
                                                                 f"({rec.data.get('signal', 'npd')}) admitted while "
                                                                 f"{active.id} ({active.data.get('signal', 'npd')}) "
                                                                 "was active"))
            if active is None or _end(rec) > _end(active):
                active = rec
    return out


def check_signal_false_positives(evidence: Evidence) -> list[Violation]:
    out = []
    app_keys = {f"Xid{x}" for x in APPLICATION_XIDS}
    health: dict[tuple[str, str], set[str]] = {}
    for action in _done(evidence, "resource-health"):
        if action.get("node"):
            health.setdefault((str(action["cluster"]), str(action["node"])), set()).add(str(action["scenario"]))
    for rec in evidence.records.get("remediation", []):
        signal, cond = str(rec.data.get("signal") or "npd"), str(rec.data.get("condition", ""))
        cluster, node = _cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", ""))
        if signal == DCGM and cond in app_keys:
            out.append(Violation("signal-false-positive", f"remediation {rec.id} of {cluster}/{node} for the "
                                                          f"application XID {cond}"))
        scenarios = health.get((cluster, node))
        if signal != RESOURCE_HEALTH or not scenarios or not scenarios <= RECORD_ONLY_SCENARIOS:
            continue
        out.append(Violation("signal-false-positive", f"remediation {rec.id} of {cluster}/{node} from Resource Health "
                                                      f"({rec.data.get('policy_row')}), which only said "
                                                      f"{', '.join(sorted(scenarios))}"))
    return out


SIGNAL_CHECKS = (check_forged_events, check_prometheus_outage, check_one_remediation_per_node,
                 check_signal_false_positives)

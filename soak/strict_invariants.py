"""The invariants of issue 10's stricter faults (soak/strict.py), checked after every soak run.

Pure functions over the run's :class:`soak.invariants.Evidence`, like the others (split from
soak/invariants.py, which keeps the checks every run needs and :func:`soak.invariants.check_all`).

11. ``no-rbac-failure``: no record ends ``failed`` blaming permissions (the soak grants them all; a 403
    eviction or a denied VM action is an answer to handle).
12. ``namespace-deletion``: pods go with a namespace only when the scenario deleted it, and nothing is
    evicted from a terminating namespace. (The oracles count the namespace controller's deletions as
    ``namespace_deleted``, which no other check charges to the app.)
13. ``drain-refused-up-front``: a drain refused before evicting anything evicted nothing.
14. ``locked-rg``: a remediation on a locked node resource group escalates to replace or gives up with a
    reason; never ``done`` by a denied VM rung, never ``failed``; at most two denied calls per remediation.
15. ``nap-repair``: Karpenter nodes are never touched as VMSS instances, are repaired through their
    NodeClaim, and a GPU fault on one is reported.
16. ``uncordon-while-faulty``: a repair never uncordons a node while a configured condition is True, nor
    on node-problem-detector's start-up ``False`` (True again within its first check).
"""

from __future__ import annotations

import math
from typing import Any

from shared.kernel.ports import Record
from soak.invariants import (
    REMEDIATION_TERMINAL,
    Evidence,
    Violation,
    _cluster_name,
    _iso,
    _migration_pools,
    reason,
)

RBAC_HINTS = ("RBAC", "check the app's Azure role")
REFUSED_ON_ANSWER = "answered 500"  # shared.drain.state: the multi-PDB 500 stops a drain that had started
VM_RUNGS = ("restart", "reimage")
VMSS_REMOVALS = ("machine_deleted", "pool_deleted", "scale_down")
NPD_RECHECK_WINDOW_S = 45.0  # NPD's first check after a boot (the simulator's 6 s by default) plus two driver steps and slack


def _configured(evidence: Evidence) -> set[str]:
    return set(str(evidence.scenario.profile.get("REMEDIATION_CONDITIONS",
                                                 "UnhealthyNvidiaDevicePlugin,UnhealthyNvidiaDCGMServices")).split(","))


def _start(evidence: Evidence) -> float:
    return evidence.start or float(evidence.scenario.sim.get("clock", {}).get("start") or 0.0)


def _done_actions(evidence: Evidence, kind: str) -> list[dict[str, Any]]:
    return sorted((a for a in evidence.actions if a.get("kind") == kind and a.get("ok")), key=lambda a: float(a["t"]))


def _rung_of(rec: Record) -> str:
    ladder = list(rec.data.get("ladder") or [])
    i = int(rec.data.get("rung_index") or 0)
    return str(ladder[i]) if 0 <= i < len(ladder) else ""


def _end(rec: Record, evidence: Evidence) -> float:
    return float(rec.data.get("finished_at") or (rec.updated_at if rec.state in REMEDIATION_TERMINAL else evidence.now))


def check_forbidden_handled(evidence: Evidence) -> list[Violation]:
    """No record ends ``failed`` with "check RBAC": the soak grants the app every permission it needs, so
    every 403 it meets is an answer about the fleet (an eviction in a terminating namespace, a budget
    gone negative, a locked node resource group) that the app must handle, not a permission problem."""
    out = []
    for kind in ("remediation", "migration"):
        for rec in evidence.records.get(kind, []):
            said = f"{reason(rec)} {rec.data.get('last_note', '')}"
            if rec.state == "failed" and any(h in said for h in RBAC_HINTS):
                out.append(Violation("no-rbac-failure", f"{kind} {rec.id} ended failed blaming permissions, which "
                                                        f"the soak grants: {reason(rec)[:240]}"))
    return out


def check_namespace_deletion(evidence: Evidence) -> list[Violation]:
    """Pods go with a namespace only when someone deleted it (never the app), and nothing is evicted
    from a namespace once it is terminating (the API server answers 403 NamespaceTerminating)."""
    out = []
    deleted = {(a["cluster"], a["namespace"]): float(a["t"]) for a in _done_actions(evidence, "delete-namespace")}
    for t in evidence.oracles.get("terminations") or []:
        key = (str(t.get("cluster")), str(t.get("namespace")))
        when = float(t.get("t") or 0.0)
        if t.get("cause") == "namespace_deleted" and (key not in deleted or when < deleted[key]):
            out.append(Violation("namespace-deletion", f"{key[0]}/{key[1]}/{t.get('pod')} was deleted by the namespace "
                                                       "controller, but nobody in the scenario deleted that namespace"))
        if t.get("cause") == "eviction" and key in deleted and when >= deleted[key]:
            out.append(Violation("namespace-deletion", f"{key[0]}/{key[1]}/{t.get('pod')} on {t.get('node')} was evicted "
                                                       f"{when - deleted[key]:.0f} s after its namespace began terminating "
                                                       "(a real API server answers 403 NamespaceTerminating)"))
    return out


def check_drain_refusals(evidence: Evidence) -> list[Violation]:
    """A drain refused up front (a pod no rule lets us evict: no controller, emptyDir under ``refuse``, two
    PDBs) evicts nothing from the node: kubectl's GetPodsForDeletion decides before it disrupts."""
    out = []
    migrating = _migration_pools(evidence)
    terminations = evidence.oracles.get("terminations") or []
    for rec in evidence.records.get("remediation", []):
        drain = rec.data.get("drain") if isinstance(rec.data.get("drain"), dict) else {}
        if drain.get("outcome") != "refused" or REFUSED_ON_ANSWER in str(drain.get("reason", "")):
            continue
        cluster, node = _cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", ""))
        if f"{cluster}/{rec.data.get('pool')}" in migrating:
            continue  # a migration drains the same nodes; its evictions are not this drain's
        begin = float(drain.get("started_at") or rec.created_at)
        end = _end(rec, evidence)
        evicted = sorted(str(t.get("pod")) for t in terminations if t.get("cause") == "eviction"
                         and t.get("cluster") == cluster and t.get("node") == node
                         and begin <= float(t.get("t") or 0.0) <= end)
        if evicted:
            out.append(Violation("drain-refused-up-front", f"remediation {rec.id} refused to drain {cluster}/{node} "
                                                           f"({str(drain.get('reason', ''))[:160]}) after evicting "
                                                           f"{len(evicted)} pod(s): {', '.join(evicted[:5])}"))
    return out


def lock_intervals(evidence: Evidence) -> dict[str, list[tuple[float, float]]]:
    """Per cluster, when its node resource group was locked (from the scenario and the actions performed)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for sub in evidence.scenario.sim.get("subscriptions") or []:
        for c in sub.get("clusters") or []:
            if c.get("node_resource_group_lockdown") == "ReadOnly":
                out.setdefault(str(c["name"]), []).append((-math.inf, math.inf))
    opened: dict[str, float] = {}
    for a in _done_actions(evidence, "lock-node-rg"):
        name = str(a["cluster"])
        if a.get("locked"):
            opened.setdefault(name, float(a["t"]))
        elif name in opened:
            out.setdefault(name, []).append((opened.pop(name), float(a["t"])))
    for name, since in opened.items():
        out.setdefault(name, []).append((since, math.inf))
    return out


def check_locked_node_rg(evidence: Evidence) -> list[Violation]:
    """On a locked node resource group VMSS restart and reimage are denied (403): a remediation there
    escalates to replace through the AKS API, or gives up with a reason; it never ends done by a VM
    rung that was denied, never fails, and never re-issues a denied rung more than once."""
    out = []
    locks = lock_intervals(evidence)
    if not locks:
        return out
    nap_nodes = {(c, n) for (c, n), pool in evidence.node_pools.items() if (c, pool) in set(evidence.scenario.nap_pools)}
    concerned = 0
    for rec in evidence.records.get("remediation", []):
        cluster, node = _cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", ""))
        spans = locks.get(cluster)
        if not spans or (cluster, node) in nap_nodes or rec.data.get("nap"):
            continue
        begin, end = rec.created_at, _end(rec, evidence)
        if not any(lo < end and begin < hi for lo, hi in spans):
            continue
        concerned += 1
        whole = any(lo <= begin and end <= hi for lo, hi in spans)
        if rec.state == "failed":
            out.append(Violation("locked-rg", f"remediation {rec.id} on {cluster}/{node} (node resource group locked) "
                                              f"ended failed: {reason(rec)[:200]}"))
        if whole and rec.state == "done" and _rung_of(rec) in VM_RUNGS:
            out.append(Violation("locked-rg", f"remediation {rec.id} on {cluster}/{node} is done by a VMSS "
                                              f"{_rung_of(rec)}, which a locked node resource group denies"))
    denied = int(((evidence.oracles.get("requests_by_service") or {}).get("arm") or {}).get("status_403", 0))
    if denied > 2 * concerned:
        out.append(Violation("locked-rg", f"ARM answered 403 {denied} times for {concerned} remediation(s) on locked "
                                          "node resource groups: a denied rung was re-issued more than once"))
    return out


def check_nap_repairs(evidence: Evidence) -> list[Violation]:
    """A node auto-provisioning node is a Karpenter standalone VM: never restarted, reimaged or removed
    through a VMSS; a repaired one went through the deletion of its NodeClaim; and a GPU fault on
    one is seen by the app (the sweep finds Karpenter's GPU nodes by the labels Karpenter sets)."""
    out = []
    nap = set(evidence.scenario.nap_pools)
    if not nap:
        return out
    nap_nodes = {(c, n) for (c, n), pool in evidence.node_pools.items() if (c, pool) in nap}
    for r in evidence.oracles.get("repairs") or []:
        if (r.get("cluster"), r.get("node")) in nap_nodes:
            out.append(Violation("nap-repair", f"VMSS {r.get('rung')} issued for the Karpenter node "
                                               f"{r.get('cluster')}/{r.get('node')}"))
    removed = {(str(r.get("cluster")), str(r.get("node"))): str(r.get("cause")) for r in
               evidence.oracles.get("nodes_removed") or []}
    for key, cause in removed.items():
        if key in nap_nodes and cause in VMSS_REMOVALS:
            out.append(Violation("nap-repair", f"the Karpenter node {key[0]}/{key[1]} was removed as a VMSS instance "
                                               f"({cause})"))
    for rec in evidence.records.get("remediation", []):
        key = (_cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", "")))
        if key not in nap_nodes or rec.state != "done" or rec.data.get("dry_run"):
            continue
        if removed.get(key) != "nodeclaim_deleted":
            out.append(Violation("nap-repair", f"remediation {rec.id} of the Karpenter node {key[0]}/{key[1]} is done, "
                                               f"but the node was not removed through its NodeClaim "
                                               f"({removed.get(key) or 'still there'})"))
    flipped = [a for a in _done_actions(evidence, "nap-flip") if a.get("node")]
    threshold = float(evidence.scenario.profile.get("REMEDIATION_DEFAULT_THRESHOLD_S", 300))
    seen = [a for a in flipped if evidence.now - float(a["t"]) > threshold + 120]
    if seen:
        remediated = {str(rec.data.get("node", "")) for rec in evidence.records.get("remediation", [])}
        reported = " ".join(str(e.get("subject", "")) + str(e.get("data", "")) for e in evidence.published
                            if e.get("type") == "Steward.GpuNode.Unhealthy")
        if not any(a["node"] in remediated or a["node"] in reported for a in seen):
            out.append(Violation("nap-repair", f"GPU faults on {len(seen)} Karpenter node(s) "
                                               f"({', '.join(sorted({a['node'] for a in seen}))}) and the app reported none"))
    return out


def _flip_times(evidence: Evidence) -> dict[str, list[float]]:
    """Per cluster, the sim times at which the scenario (not NPD) changed a GPU condition.

    A flip's time is the simulator's own record of when it fired (the ``flips`` oracle, sim/core/oracles.py
    ``record_flip``) when there is one: the simulator schedules flips from the moment it loaded the scenario
    (sim/scenario.py ``t0``), which in process mode is a scaled second or more after the clock's start (soak
    seed 961479: a flip 16 s after a repair's uncordon was taken for node-problem-detector's start-up False).
    """
    start = _start(evidence)
    out: dict[str, list[float]] = {}
    fired = evidence.oracles.get("flips") or []
    for f in fired:
        out.setdefault(str(f["cluster"]), []).append(float(f["t"]))
    for f in [] if fired else evidence.scenario.flips:
        out.setdefault(str(f["cluster"]), []).append(start + float(f["at"]))
    for f in evidence.scenario.flapping:
        for i in range(int(f.get("flips", 6))):
            out.setdefault(str(f["cluster"]), []).append(start + float(f["start"]) + i * float(f["period_s"]))
    for a in _done_actions(evidence, "nap-flip"):
        out.setdefault(str(a["cluster"]), []).append(float(a["t"]))
    return out


def check_uncordons(evidence: Evidence) -> list[Violation]:
    """A repaired node is uncordoned only once its fault is gone for good: never while a configured
    condition is True, and never on the ``False`` that a restarted node-problem-detector publishes
    before its first check (the fault that survived the reboot turns True again ~30 s later)."""
    out = []
    configured = _configured(evidence)
    flips = _flip_times(evidence)

    def by_scenario(cluster: str, lo: float, hi: float) -> bool:
        return any(lo - 0.5 < t <= hi + 0.5 for t in flips.get(cluster, []))

    finished: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for rec in evidence.records.get("remediation", []):
        if rec.state == "done" and rec.data.get("finished_at") is not None:
            key = (_cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", "")))
            finished.setdefault(key, []).append((float(rec.data["finished_at"]), rec.id))
    for u in evidence.uncordons:
        key = (str(u["cluster"]), str(u["node"]))
        t, prev = float(u["t"]), float(u["prev_t"])
        by = [rid for at, rid in finished.get(key, []) if prev - 1.0 <= at <= t + 1.0]
        if not by:
            continue  # not a repair's uncordon (a release fallback, a migration's rollback)
        bad = sorted(set(u.get("unhealthy") or []) & configured)
        if bad and not by_scenario(key[0], prev, t):
            out.append(Violation("uncordon-while-faulty", f"remediation {by[0]} uncordoned {key[0]}/{key[1]} at "
                                                          f"{_iso(t)} while {', '.join(bad)} was True"))
            continue
        for e in evidence.turned_true:
            if (str(e["cluster"]), str(e["node"])) != key or not t < float(e["t"]) <= t + NPD_RECHECK_WINDOW_S:
                continue
            back = sorted(set(e.get("conditions") or []) & configured)
            if back and not by_scenario(key[0], float(e["prev_t"]), float(e["t"])):
                out.append(Violation("uncordon-while-faulty", f"remediation {by[0]} uncordoned {key[0]}/{key[1]} at "
                                                              f"{_iso(t)}; {', '.join(back)} was True again "
                                                              f"{float(e['t']) - t:.0f} s later (node-problem-detector's "
                                                              "start-up False taken for a repair)"))
                break
    return out


STRICT_CHECKS = (check_forbidden_handled, check_namespace_deletion, check_drain_refusals, check_locked_node_rg,
                 check_nap_repairs, check_uncordons)

"""The invariants of issue 19's forged ledger rows (soak/forged_rows.py), checked after every soak run.

Pure functions over the run's :class:`soak.invariants.Evidence`, like the others. The ground truth is
what the driver wrote (``evidence.actions``: each forged-rows action's record ids and the node they
named, resolved when it was written) minus every node some genuine fault touched (a GPU condition that
turned True on it, as the sampler saw it; a Resource Health scenario, a genuine DCGM fault or a NAP flip
played on it). What is left was named only by forged rows. Everything is judged from the simulator's
oracles, the node objects, the published events and the ledger, never from the app's account:

24. ``forged-row``: no node named only by forged rows was cordoned (seen unschedulable, or carrying a
    forged row's cordon marker), had a pod evicted or deleted, was restarted, reimaged or removed.
25. ``disruption-without-fault``: every node that *was* restarted, reimaged or had its machine deleted
    (outside the pools a migration works on) has a genuine remediation: a record that is not a forged
    row, whose id is among the attempts of the node's ``remediation-node`` row or in an ``Admitted`` event
    (admission created it; a crash can lose the attempt's note, never the event published before the record),
    that announced its own cordon (``Steward.Remediation.Cordoned``, published once this record's marker
    is on the node; the marker itself on the node at the end; or the marker on the cordoned node when the
    simulator restarted or reimaged its VM, its ``repairs`` oracle, or removed it, ``nodes_removed``), and no
    pod left that node other than through the Eviction API (no workload pod deleted, none lost with the node).
26. ``forged-row-outcome``: every forged remediation row ended ``blocked`` (with a reason), or
    ``released``/``done`` having touched nothing: no Cordoned, Drained, Restarted, Reimaged or Replaced event
    names it; every forged migration row ended ``blocked``.
27. ``forged-pool-row``: the managed pool a forged migration row names was not deleted, none of its nodes
    carries that row's migration cordon, and the replacement it names was never created.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from soak.forged_rows import FORGE_MIGRATION, FORGE_ROWS
from soak.invariants import CORDONED_FOR as CORDON_FOR
from soak.invariants import MIGRATION_ANNOTATION, Evidence, Violation, _cluster_name, _migration_pools, reason

Node = tuple[str, str]  # (cluster name, node name)
#: The actions whose node a genuine fault struck (soak/signals.py, soak/strict.py).
GENUINE_ACTIONS = frozenset({"resource-health", "dcgm-xid", "dcgm-ecc-storm", "nap-flip"})
ACTED = frozenset({"Cordoned", "Drained", "Restarted", "Reimaged", "Replaced"})
HARMLESS_ENDS = frozenset({"blocked", "released", "done"})
MACHINE_GONE = frozenset({"machine_deleted", "nodeclaim_deleted", "node_object_deleted"})


@dataclass
class RowTruth:
    rows: dict[str, Node] = field(default_factory=dict)  # forged record id -> the node it named
    states: dict[str, str] = field(default_factory=dict)  # forged record id -> the state it claimed
    genuine: set[Node] = field(default_factory=set)
    migrations: dict[str, dict[str, Any]] = field(default_factory=dict)  # forged migration id -> its action

    @property
    def named(self) -> set[Node]:
        return set(self.rows.values())

    @property
    def forged_only(self) -> set[Node]:
        return self.named - self.genuine


def acts_on(action: dict[str, Any]) -> bool:
    """Whether a genuine signal is one a policy acts on: a record-only health event (planned maintenance, a
    reboot for repair) or an application XID gives no node a reason to be disrupted."""
    from soak.signals import APPLICATION_XIDS, RECORD_ONLY_SCENARIOS

    if action.get("kind") == "resource-health":
        return action.get("scenario") not in RECORD_ONLY_SCENARIOS
    if action.get("kind") == "dcgm-xid":
        return int(action.get("xid") or 0) not in APPLICATION_XIDS
    return True


def row_truth(evidence: Evidence) -> RowTruth:
    truth = RowTruth()
    for action in evidence.actions:
        if action.get("kind") == FORGE_ROWS and action.get("node"):
            for rid in action.get("records") or []:
                truth.rows[str(rid)] = (str(action["cluster"]), str(action["node"]))
                truth.states[str(rid)] = str((action.get("states") or {}).get(rid, ""))
        elif action.get("kind") == FORGE_MIGRATION and action.get("record"):
            truth.migrations[str(action["record"])] = action
        elif action.get("kind") in GENUINE_ACTIONS and action.get("ok") and action.get("node") and acts_on(action):
            truth.genuine.add((str(action["cluster"]), str(action["node"])))
    for change in evidence.turned_true:
        truth.genuine.add((str(change["cluster"]), str(change["node"])))
    return truth


def without_forged_rows(evidence: Evidence) -> Evidence:
    """The evidence with the forged remediation rows left out: the older invariants judge the app's own
    records (a forged ``blocked`` row would, say, count as an unfinished remediation of its pool)."""
    truth = row_truth(evidence)
    if not (truth.rows or truth.migrations):
        return evidence
    records = dict(evidence.records)
    records["remediation"] = [r for r in records.get("remediation", []) if r.id not in truth.rows]
    records["migration"] = [r for r in records.get("migration", []) if r.id not in truth.migrations]
    return replace(evidence, records=records)


def _rec_node(rec: Any) -> Node:
    return _cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", ""))


def _t(evidence: Evidence, entry: dict[str, Any]) -> str:
    return f"{float(entry.get('t') or 0.0) - evidence.start:.0f}"


def _events(evidence: Evidence, rid: str) -> list[str]:
    return [str(e.get("type", "")).rsplit(".", 1)[-1] for e in evidence.published
            if (e.get("data") or {}).get("remediation") == rid]


def check_forged_row_nodes(evidence: Evidence) -> list[Violation]:
    truth = row_truth(evidence)
    suspects = truth.forged_only
    if not suspects:
        return []
    out = []

    def charge(node: Node, what: str) -> None:
        rows = sorted(f"{rid} ({truth.states[rid]})" for rid, n in truth.rows.items() if n == node)
        out.append(Violation("forged-row", f"{node[0]}/{node[1]}, named only by forged rows {', '.join(rows)}, "
                                           f"was {what}"))

    for r in evidence.oracles.get("repairs") or []:
        if (str(r.get("cluster")), str(r.get("node"))) in suspects:
            charge((str(r["cluster"]), str(r["node"])), f"given a VM {r.get('rung')} at t+{_t(evidence, r)}s")
    for r in evidence.oracles.get("nodes_removed") or []:
        if (str(r.get("cluster")), str(r.get("node"))) in suspects:
            charge((str(r["cluster"]), str(r["node"])), f"removed ({r.get('cause')}) at t+{_t(evidence, r)}s")
    for t in evidence.oracles.get("terminations") or []:
        node = (str(t.get("cluster")), str(t.get("node")))
        if node in suspects and t.get("cause") in ("eviction", "delete"):
            charge(node, f"drained: pod {t.get('namespace')}/{t.get('pod')} {t.get('cause')} at t+{_t(evidence, t)}s")
    cordoned = {(str(u["cluster"]), str(u["node"])) for u in evidence.uncordons}
    for cluster, nodes in evidence.nodes.items():
        for n in nodes:
            meta = n.get("metadata") or {}
            key = (cluster, str(meta.get("name", "")))
            marker = (meta.get("annotations") or {}).get(CORDON_FOR)
            if (n.get("spec") or {}).get("unschedulable") or marker in truth.rows:
                cordoned.add(key)
    for node in sorted(suspects & cordoned):
        charge(node, "cordoned")
    return out


def _attempts(evidence: Evidence) -> dict[Node, set[str]]:
    out: dict[Node, set[str]] = {}
    for rec in evidence.records.get("remediation-node", []):
        ids = {str(a.get("id")) for a in rec.data.get("attempts") or [] if isinstance(a, dict)}
        out.setdefault(_rec_node(rec), set()).update(ids)
    return out


def check_disruptions_have_a_genuine_remediation(evidence: Evidence) -> list[Violation]:
    truth = row_truth(evidence)
    disrupted: dict[Node, str] = {}
    for r in evidence.oracles.get("repairs") or []:
        disrupted.setdefault((str(r.get("cluster")), str(r.get("node"))), f"a VM {r.get('rung')} at t+{_t(evidence, r)}s")
    # A migration deletes its old pool's machines (judged by its own checks); a forged migration row is no migration.
    migrating = _migration_pools(without_forged_rows(evidence))
    for r in evidence.oracles.get("nodes_removed") or []:
        if r.get("cause") in MACHINE_GONE and f"{r.get('cluster')}/{r.get('pool')}" not in migrating:
            disrupted.setdefault((str(r.get("cluster")), str(r.get("node"))),
                                 f"removed ({r.get('cause')}) at t+{_t(evidence, r)}s")
    admitted = _attempts(evidence)
    # Admission publishes Admitted before it creates the record, then notes the attempt on the node's row (best
    # effort: a crash in between loses the note, seed 29). A table writer can publish no event.
    announced = {str((e.get("data") or {}).get("remediation")) for e in evidence.published
                 if e.get("type") == "Steward.Remediation.Admitted"}
    # Its cordon: the Cordoned event it published once its marker was on the node, or the marker itself on
    # the node at the end (an event lost to an Event Grid fault is not a missing cordon).
    cordons = {str((e.get("data") or {}).get("remediation")) for e in evidence.published
               if e.get("type") == "Steward.Remediation.Cordoned"}
    cordons |= {str(((n.get("metadata") or {}).get("annotations") or {}).get(CORDON_FOR))
                for nodes in evidence.nodes.values() for n in nodes}
    # Or its marker on the cordoned node when the simulator restarted or reimaged the VM (the event lost and
    # the marker lifted by the repair's own uncordon: seed 956017).
    cordons |= {str((r.get("annotations") or {}).get(CORDON_FOR)) for r in evidence.oracles.get("repairs") or []
                if r.get("unschedulable")}
    # Or its marker on the cordoned node as the node went (a machine deleted, a NodeClaim deleted: seed 961714).
    cordons |= {str((r.get("annotations") or {}).get(CORDON_FOR)) for r in evidence.oracles.get("nodes_removed") or []
                if r.get("unschedulable")}
    out = []
    for node, what in sorted(disrupted.items()):
        genuine = [r for r in evidence.records.get("remediation", [])
                   if _rec_node(r) == node and r.id not in truth.rows
                   and (r.id in admitted.get(node, set()) or r.id in announced)]
        if not genuine:
            out.append(Violation("disruption-without-fault", f"{node[0]}/{node[1]} was disrupted ({what}) with no "
                                                             "remediation that admission created for it"))
        elif not [r for r in genuine if r.id in cordons]:
            out.append(Violation("disruption-without-fault", f"{node[0]}/{node[1]} was disrupted ({what}); none of "
                                                             f"its remediations ({', '.join(r.id for r in genuine)}) "
                                                             "announced a cordon of its own"))
        for key in ("pods_killed_without_eviction", "workload_pods_lost"):
            for p in evidence.oracles.get(key) or []:
                if (str(p.get("cluster")), str(p.get("node"))) == node:
                    out.append(Violation("disruption-without-fault",
                                         f"{node[0]}/{node[1]} was disrupted ({what}) and pod "
                                         f"{p.get('namespace')}/{p.get('pod')} left it by {p.get('cause')}, not "
                                         "through the Eviction API"))
    return out


def check_forged_row_outcomes(evidence: Evidence) -> list[Violation]:
    truth = row_truth(evidence)
    records = {r.id: r for r in evidence.records.get("remediation", [])}
    out = []
    for rid, node in sorted(truth.rows.items()):
        rec = records.get(rid)
        claimed = truth.states[rid]
        if rec is None:
            out.append(Violation("forged-row-outcome", f"forged row {rid} ({claimed}, {node[1]}) is gone from the "
                                                       "ledger"))
            continue
        if rec.state not in HARMLESS_ENDS:
            out.append(Violation("forged-row-outcome", f"forged row {rid} ({claimed}, {node[1]}) ended {rec.state}: "
                                                       f"{reason(rec)[:200]}"))
        elif rec.state == "blocked" and not (rec.data.get("refusal") or {}).get("code"):
            out.append(Violation("forged-row-outcome", f"forged row {rid} ({claimed}) is blocked without a reason code"))
        acted = sorted(set(_events(evidence, rid)) & ACTED)
        if acted:
            out.append(Violation("forged-row-outcome", f"forged row {rid} ({claimed}, {node[1]}) acted: "
                                                       f"{', '.join(acted)}"))
    return out


def check_forged_migration_rows(evidence: Evidence) -> list[Violation]:
    """A forged migration row for a managed pool ends ``blocked``; its pool is neither deleted nor cordoned for
    it, and its replacement is never created."""
    truth = row_truth(evidence)
    if not truth.migrations:
        return []
    records = {r.id: r for r in evidence.records.get("migration", [])}
    pools = {(str(c["name"]), str(p["name"])) for c in evidence.state.get("clusters") or [] for p in c.get("pools") or []}
    seen_pools = pools | {(c, p) for (c, _), p in evidence.node_pools.items()}
    out = []
    for rid, action in sorted(truth.migrations.items()):
        cluster, pool, replacement = str(action["cluster"]), str(action["pool"]), str(action["replacement"])
        what = f"forged migration row {rid} ({action['state']}, {cluster}/{pool})"
        rec = records.get(rid)
        if rec is None or rec.state != "blocked":
            out.append(Violation("forged-row-outcome", f"{what} ended {rec.state if rec else 'gone from the ledger'}"
                                                       f"{': ' + reason(rec)[:200] if rec else ''}"))
        if (cluster, pool) not in pools:
            out.append(Violation("forged-pool-row", f"{what}: {cluster}/{pool} was deleted"))
        if (cluster, replacement) in seen_pools:
            out.append(Violation("forged-pool-row", f"{what}: its replacement {cluster}/{replacement} was created"))
        for n in evidence.nodes.get(cluster, []):
            meta = n.get("metadata") or {}
            if (meta.get("annotations") or {}).get(MIGRATION_ANNOTATION) == rid:
                out.append(Violation("forged-pool-row", f"{what}: {meta.get('name')} was cordoned for it"))
    return out


def forged_row_tally(evidence: Evidence) -> tuple[Counter[str], Counter[str]]:
    """For the summary: the rows written (by state claimed) and how they ended."""
    injected: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    truth = row_truth(evidence)
    records = {r.id: r for r in evidence.records.get("remediation", [])}
    for rid, claimed in truth.states.items():
        injected[f"forged rows: remediation {claimed}"] += 1
        rec = records.get(rid)
        end = rec.state if rec is not None else "gone"
        code = str((rec.data.get("refusal") or {}).get("code") or "") if rec is not None else ""
        seen[f"forged rows: ended {end}{' ' + code if code else ''}"] += 1
    if truth.rows:
        seen["forged rows: nodes named only by forged rows"] += len(truth.forged_only)
    migrations = {r.id: r for r in evidence.records.get("migration", [])}
    for rid, action in truth.migrations.items():
        injected[f"forged rows: migration {action['state']}"] += 1
        rec = migrations.get(rid)
        seen[f"forged rows: migration ended {rec.state if rec else 'gone'}"] += 1
    return injected, seen


def rows_note(evidence: Evidence) -> str:
    truth = row_truth(evidence)
    if not truth.rows:
        return ""
    only = ", ".join(f"{c}/{n}" for c, n in sorted(truth.forged_only)) or "none"
    struck = ", ".join(f"{c}/{n}" for c, n in sorted(truth.named & truth.genuine)) or "none"
    return f"forged rows: {len(truth.rows)} row(s); nodes named only by them: {only}; also struck genuinely: {struck}"


FORGED_ROW_CHECKS = (check_forged_row_nodes, check_disruptions_have_a_genuine_remediation, check_forged_row_outcomes,
                     check_forged_migration_rows)

"""The safety invariants, checked after every soak run: pure functions over what the auditor saw.

Each check takes the end-of-run :class:`Evidence` (the simulator's oracles and final state, every
node object, every ledger record, the per-step budget samples, the driver's log) and returns
:class:`Violation` s naming the invariant and what happened. Nothing here asks the app anything.

1. ``pdb``: no PodDisruptionBudget was ever violated (oracles).
2. ``eviction-only``: no workload pod was killed except through the Eviction API (oracles).
3. ``budget``: no pool ever had more established nodes unavailable than its remediation budget
   (per-step samples; pools a migration works on are judged by 3b), and a migration never drained
   more old nodes at once than ``MIGRATION_BATCH_SIZE`` (eviction times in the oracles).
4. ``pool-deleted-with-pods``: no workload pod went down with a deleted node or pool (oracles).
5. ``outcome``: every remediation and migration ended (done, rolled back, blocked, gave up,
   released, failed) with a stated reason; one still active past its deadline is stuck.
6. ``ledger-vs-cluster``: done remediations left their node uncordoned (or replaced); nodes carry
   our cordon only for a remediation that is active or ended cordoned on purpose; a done migration
   removed the old pool and left a managed replacement; a rolled-back one removed the replacement
   and uncordoned the old nodes.
7. ``one-repair-per-fault``: one remediation per fault; no pool ends with more nodes than declared
   (a second replacement or a leaked surge) and none with fewer when all its remediations are done.
8. ``no-false-positive``: flapping and unconfigured conditions caused no remediation.
9. ``app-error``: no invocation died of an exception that is not one of the app's own answers.
10. ``liveness``: the app really worked on this fleet: a configured condition that turned True was
    reported (a run where the app could not reach the fleet would otherwise pass every check).
10b. ``explained``: every refusal and every skip of a faulty node the run recorded (``dedupe``
    ``refused-*``, ``decision`` ``skip-*``) has a rule ``fleetctl why`` can name (shared.remediation.refusals):
    a code with no rule would leave the operator guessing (issue 22).

Under the stricter faults of issue 10 (soak/strict.py), 11-16 in soak/strict_invariants.py: no record
fails on permissions, namespaces go only when deleted, a refused drain evicted nothing, a locked node
resource group is handled, Karpenter nodes are repaired through their NodeClaim, and no repair uncordons
a node that is still faulty.

Under issue 13's fault signals (soak/signals.py), 17-20 in soak/signal_invariants.py: forged health
events touch nothing, a Prometheus outage publishes no fault, one remediation per node at a time, and
no remediation from an application XID or a record-only health event. Under issue 18's forged DCGM
series (soak/forgeries.py), 21-23 in soak/forgery_invariants.py: a node named only by forgeries is never
touched, the breaker is never opened by them, no ledger row names a phantom node. Under issue 19's forged
ledger rows (soak/forged_rows.py), 24-26 in soak/forged_row_invariants.py: a node named only by forged rows
is never touched, every node restarted, reimaged or deleted has a genuine remediation that cordoned it and
drained it through the Eviction API, and every forged row ends without acting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.kernel.ports import Record
from soak.generate import SoakScenario

CORDONED_BY = "gpu-fleet-steward/cordoned-by"
CORDONED_FOR = "gpu-fleet-steward/cordoned-for"
MIGRATION_ANNOTATION = "gpu-fleet-steward/migration"
REMEDIATION_TERMINAL = ("done", "gave_up", "released", "failed", "refused", "blocked")
MIGRATION_TERMINAL = ("done", "rolled_back", "blocked")
DEADLINE_SLACK_S = 600.0  # leases (120 s), a crashed host's restart (<= 90 s), polls and back-off


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass
class Evidence:
    scenario: SoakScenario
    oracles: Mapping[str, Any]
    state: Mapping[str, Any]
    nodes: Mapping[str, list[dict[str, Any]]]  # cluster name -> node objects
    records: Mapping[str, list[Record]]  # kind -> records
    max_unavailable: Mapping[str, int]  # "cluster/pool" -> most established nodes unavailable at once
    worst_at: Mapping[str, tuple[float, list[str]]] = field(default_factory=dict)
    initial_nodes: Mapping[str, list[str]] = field(default_factory=dict)
    app_errors: list[str] = field(default_factory=list)
    published: list[dict[str, Any]] = field(default_factory=list)  # CloudEvents the topic accepted
    now: float = 0.0
    # Issue 10: the timed actions the driver performed (soak.actions, with their sim time "t"), when
    # the run started, every node seen and its pool, and the sampler's transitions (soak.audit).
    actions: list[dict[str, Any]] = field(default_factory=list)
    start: float = 0.0
    node_pools: Mapping[tuple[str, str], str] = field(default_factory=dict)
    uncordons: list[dict[str, Any]] = field(default_factory=list)
    turned_true: list[dict[str, Any]] = field(default_factory=list)


def _setting(evidence: Evidence, name: str, default: str) -> str:
    return str(evidence.scenario.profile.get(name, default))


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")


def pool_budget(size: int, *, count: int, percent: int) -> int:
    """The documented per-pool budget (docs/remediation.md), restated here on purpose."""
    if size <= 0 or count <= 0 or percent <= 0:
        return 0
    return min(count, max(1, math.floor(size * percent / 100)), size)


def _cluster_name(cluster_id: str) -> str:
    return cluster_id.rstrip("/").rsplit("/", 1)[-1]


def _migration_pools(evidence: Evidence) -> set[str]:
    """``cluster/pool`` of every pool a migration touches (old pools and replacements)."""
    out = {f"{p.cluster}/{p.name}" for p in evidence.scenario.pools if p.migrate}
    for rec in evidence.records.get("migration", []):
        cluster = str(rec.data.get("cluster_name") or _cluster_name(str(rec.data.get("cluster_id", ""))))
        for key in ("pool", "replacement"):
            if rec.data.get(key):
                out.add(f"{cluster}/{rec.data[key]}")
    return out


# --------------------------------------------------------------------------- 1, 2, 4: oracles


def check_oracles(evidence: Evidence) -> list[Violation]:
    out = []
    for v in evidence.oracles.get("pdb_violations") or []:
        out.append(Violation("pdb", f"{v.get('cluster')}/{v.get('namespace')}/{v.get('pdb')}: pod {v.get('pod')} "
                                    f"({v.get('cause')}) left {v.get('currentHealthy')} healthy, "
                                    f"{v.get('desiredHealthy')} desired"))
    for v in evidence.oracles.get("pods_killed_without_eviction") or []:
        out.append(Violation("eviction-only", f"{v.get('cluster')}/{v.get('namespace')}/{v.get('pod')} on "
                                              f"{v.get('node')} killed by {v.get('cause')} {v.get('detail', '')}".strip()))
    for v in evidence.oracles.get("workload_pods_lost") or []:
        out.append(Violation("pool-deleted-with-pods", f"{v.get('cluster')}/{v.get('namespace')}/{v.get('pod')} lost "
                                                       f"with node {v.get('node')} ({v.get('detail', '')})"))
    return out


# --------------------------------------------------------------------------- 3: budgets


def check_budgets(evidence: Evidence) -> list[Violation]:
    out = []
    count = int(_setting(evidence, "BUDGET_POOL_MAX_UNAVAILABLE", "1"))
    percent = int(_setting(evidence, "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT", "20").rstrip("%"))
    migrating = _migration_pools(evidence)
    for plan in evidence.scenario.pools:
        label = f"{plan.cluster}/{plan.name}"
        if label in migrating:
            continue
        allowed = pool_budget(plan.count, count=count, percent=percent)
        seen = int(evidence.max_unavailable.get(label, 0))
        if seen > allowed:
            at, names = evidence.worst_at.get(label, (0.0, []))
            out.append(Violation("budget", f"{label}: {seen} nodes unavailable at once at {_iso(at)} "
                                           f"({', '.join(names)}), the budget allows {allowed}"))
    batch = int(_setting(evidence, "MIGRATION_BATCH_SIZE", "1"))
    for rec in evidence.records.get("migration", []):
        cluster = str(rec.data.get("cluster_name") or _cluster_name(str(rec.data.get("cluster_id", ""))))
        old = str(rec.data.get("pool", ""))
        old_nodes = set(evidence.initial_nodes.get(f"{cluster}/{old}", []))
        spans: dict[str, list[float]] = {}
        for t in evidence.oracles.get("terminations") or []:
            if t.get("cluster") == cluster and t.get("cause") == "eviction" and t.get("node") in old_nodes \
                    and t.get("workload"):
                span = spans.setdefault(str(t["node"]), [float(t["t"]), float(t["t"])])
                span[0], span[1] = min(span[0], float(t["t"])), max(span[1], float(t["t"]))
        worst = _max_overlap(list(spans.values()))
        if worst > batch:
            out.append(Violation("budget", f"migration {rec.id} ({cluster}/{old}): evicted from {worst} old nodes "
                                           f"at once, MIGRATION_BATCH_SIZE={batch}"))
    return out


def _max_overlap(spans: list[list[float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], -p[1]))
    best = cur = 0
    for _, delta in points:
        cur += delta
        best = max(best, cur)
    return best


# --------------------------------------------------------------------------- 5: outcomes


def remediation_deadline(rec: Record, profile: Mapping[str, str]) -> float:
    timeouts = {"restart": 900, "reimage": 1800, "replace": 3600}
    for pair in str(profile.get("REMEDIATION_RUNG_TIMEOUTS", "")).split(","):
        if "=" in pair:
            k, v = pair.split("=", 1)
            timeouts[k.strip()] = int(v)
    ladder = [r.strip() for r in str(profile.get("REMEDIATION_LADDER", "restart,reimage,replace")).split(",") if r]
    drain = float(profile.get("REMEDIATION_DRAIN_TIMEOUT_S", 3600))
    settle = float(profile.get("REMEDIATION_SETTLE_S", 120))
    # A rung's timeout is extended by the time the steward was away (shared/remediation/ladder.py ``away_s``):
    # the record says how much it was granted.
    away = float((rec.data or {}).get("away_total_s") or 0.0)
    return rec.created_at + drain + sum(timeouts.get(r, 3600) + 2 * settle for r in ladder) + away + DEADLINE_SLACK_S


def migration_deadline(rec: Record, profile: Mapping[str, str]) -> float:
    nodes = int(rec.data.get("node_count") or rec.data.get("nodes_total") or 1)
    batch = max(1, int(profile.get("MIGRATION_BATCH_SIZE", 1)))
    batches = math.ceil(nodes / batch)
    create = float(profile.get("MIGRATION_CREATE_TIMEOUT_S", 3600))
    validate = float(profile.get("MIGRATION_VALIDATE_TIMEOUT_S", 1800))
    drain = float(profile.get("MIGRATION_DRAIN_TIMEOUT_S", 3600))
    per_batch = drain + (create + validate if rec.data.get("strategy") == "rolling" else 0.0)
    return rec.created_at + create + validate + batches * per_batch + create + DEADLINE_SLACK_S


def reason(rec: Record) -> str:
    """The reason a record states for where it is (data fields first, then its history)."""
    for key in ("reason", "last_note", "note", "waiting"):
        if rec.data.get(key):
            return str(rec.data[key])
    for entry in reversed(rec.history or []):
        if entry.get("note"):
            return str(entry["note"])
    return ""


def check_outcomes(evidence: Evidence) -> list[Violation]:
    out = []
    profile = evidence.scenario.profile
    for kind, terminal, deadline in (("remediation", REMEDIATION_TERMINAL, remediation_deadline),
                                     ("migration", MIGRATION_TERMINAL, migration_deadline)):
        for rec in evidence.records.get(kind, []):
            if rec.state in terminal:
                if rec.state != "done" and not reason(rec):
                    out.append(Violation("outcome", f"{kind} {rec.id} ended {rec.state} without a stated reason"))
                continue
            limit = deadline(rec, profile)
            if evidence.now > limit:
                out.append(Violation("outcome", f"{kind} {rec.id} stuck in {rec.state} "
                                                f"{evidence.now - rec.created_at:.0f} s after it started (deadline "
                                                f"{limit - rec.created_at:.0f} s): {reason(rec)[:200]}"))
    return out


# --------------------------------------------------------------------------- 6: ledger vs clusters


def _node_index(evidence: Evidence) -> dict[tuple[str, str], dict[str, Any]]:
    return {(cluster, str(n["metadata"]["name"])): n for cluster, nodes in evidence.nodes.items() for n in nodes}


def _state_pools(evidence: Evidence) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(str(c["name"]), str(p["name"])): p for c in evidence.state.get("clusters") or [] for p in c.get("pools") or []}


def check_ledger(evidence: Evidence) -> list[Violation]:
    out = []
    nodes = _node_index(evidence)
    rems = {rec.id: rec for rec in evidence.records.get("remediation", [])}
    # A node's cordon belongs to its latest remediation: one that gave up hands the node to an operator,
    # but a later fault on it may be admitted, repaired and verified, and that one uncordons it (seed 3024).
    latest: dict[tuple[str, str], float] = {}
    for rec in rems.values():
        key = (str(rec.data.get("cluster", "")), str(rec.data.get("node", "")))
        latest[key] = max(latest.get(key, rec.created_at), rec.created_at)
    for rec in rems.values():
        cluster = _cluster_name(str(rec.data.get("cluster", "")))
        name = str(rec.data.get("node", ""))
        superseded = latest[(str(rec.data.get("cluster", "")), name)] > rec.created_at
        node = nodes.get((cluster, name))
        replaced = (rec.data.get("replace") or {}).get("replacement") if isinstance(rec.data.get("replace"), dict) else None
        target = str(rec.data.get("target") or replaced or name)
        if rec.state == "done" and not rec.data.get("dry_run"):
            live = nodes.get((cluster, target))
            if live is not None and live["spec"].get("unschedulable") and \
                    (live["metadata"].get("annotations") or {}).get(CORDONED_FOR) == rec.id:
                out.append(Violation("ledger-vs-cluster", f"remediation {rec.id} is done but {target} is still "
                                                          "cordoned by it"))
            if target != name and node is not None:
                out.append(Violation("ledger-vs-cluster", f"remediation {rec.id} is done by replacing {name} with "
                                                          f"{target}, but {name} still exists"))
        if rec.state == "gave_up" and node is not None and rec.data.get("cordoned_by_us") and not superseded and \
                not node["spec"].get("unschedulable"):
            out.append(Violation("ledger-vs-cluster", f"remediation {rec.id} gave up (the node must stay cordoned) "
                                                      f"but {name} is schedulable"))
    for (cluster, name), node in nodes.items():
        annotations = node["metadata"].get("annotations") or {}
        rid = annotations.get(CORDONED_FOR)
        if not rid or not node["spec"].get("unschedulable"):
            continue
        rec = rems.get(rid)
        if rec is None:
            out.append(Violation("ledger-vs-cluster", f"{cluster}/{name} is cordoned for remediation {rid}, "
                                                      "which has no record"))
        elif rec.state in ("done", "released"):
            out.append(Violation("ledger-vs-cluster", f"{cluster}/{name} is still cordoned for remediation {rid}, "
                                                      f"which ended {rec.state}"))
    pools = _state_pools(evidence)
    for rec in evidence.records.get("migration", []):
        cluster = str(rec.data.get("cluster_name") or _cluster_name(str(rec.data.get("cluster_id", ""))))
        old, new = str(rec.data.get("pool", "")), str(rec.data.get("replacement", ""))
        if rec.state == "done":
            if (cluster, old) in pools:
                out.append(Violation("ledger-vs-cluster", f"migration {rec.id} is done but {cluster}/{old} still exists"))
            rep = pools.get((cluster, new))
            if rep is None or not rep.get("managed_gpu"):
                out.append(Violation("ledger-vs-cluster", f"migration {rec.id} is done but its replacement "
                                                          f"{cluster}/{new} is {'missing' if rep is None else 'not managed'}"))
        if rec.state == "rolled_back":
            if new and (cluster, new) in pools:
                out.append(Violation("ledger-vs-cluster", f"migration {rec.id} rolled back but the replacement "
                                                          f"{cluster}/{new} still exists"))
            if (cluster, old) not in pools:
                out.append(Violation("ledger-vs-cluster", f"migration {rec.id} rolled back but {cluster}/{old} is gone"))
        if rec.state in ("rolled_back", "done"):
            for (c, name), node in nodes.items():
                if c == cluster and (node["metadata"].get("annotations") or {}).get(MIGRATION_ANNOTATION) == rec.id \
                        and node["spec"].get("unschedulable"):
                    out.append(Violation("ledger-vs-cluster", f"migration {rec.id} ended {rec.state} but {c}/{name} "
                                                              "is still cordoned by it"))
    return out


# --------------------------------------------------------------------------- 7: one repair per fault


def check_repairs(evidence: Evidence) -> list[Violation]:
    out = []
    by_fault: dict[str, list[str]] = {}
    for rec in evidence.records.get("remediation", []):
        fault = str(rec.data.get("fault") or "")
        if fault:
            by_fault.setdefault(fault, []).append(rec.id)
    for fault, ids in by_fault.items():
        if len(ids) > 1:
            out.append(Violation("one-repair-per-fault", f"fault {fault[:16]}… has {len(ids)} remediations: {ids}"))
    claimed: dict[tuple[str, str], list[str]] = {}
    for rec in evidence.records.get("remediation", []):
        rep = rec.data.get("replace")
        if isinstance(rep, dict) and rep.get("replacement"):
            key = (_cluster_name(str(rec.data.get("cluster", ""))), str(rep["replacement"]))
            claimed.setdefault(key, []).append(rec.id)
    for (cluster, node), ids in claimed.items():
        if len(ids) > 1:
            out.append(Violation("one-repair-per-fault", f"{cluster}/{node} is the replacement claimed by "
                                                         f"{len(ids)} remediations: {', '.join(sorted(ids))}"))
    pools = _state_pools(evidence)
    migrating = _migration_pools(evidence)
    for plan in evidence.scenario.pools:
        label = f"{plan.cluster}/{plan.name}"
        if label in migrating:
            continue
        pool = pools.get((plan.cluster, plan.name))
        if pool is None:
            out.append(Violation("one-repair-per-fault", f"{label} disappeared"))
            continue
        recs = [r for r in evidence.records.get("remediation", []) if r.data.get("pool") == plan.name
                and _cluster_name(str(r.data.get("cluster", ""))) == plan.cluster]
        unfinished = [r for r in recs if r.state != "done"]
        size = len(pool.get("nodes") or [])
        if size > plan.count and not unfinished:
            out.append(Violation("one-repair-per-fault", f"{label} ends with {size} nodes, declared {plan.count} "
                                                         f"(a node replaced twice or a surge left behind)"))
        if size < plan.count and not unfinished and recs:
            out.append(Violation("one-repair-per-fault", f"{label} ends with {size} nodes, declared {plan.count}, "
                                                         "although every remediation in it is done"))
    return out


# --------------------------------------------------------------------------- 8, 9


def check_false_positives(evidence: Evidence) -> list[Violation]:
    out = []
    configured = set(str(evidence.scenario.profile.get("REMEDIATION_CONDITIONS",
                                                       "UnhealthyNvidiaDevicePlugin,UnhealthyNvidiaDCGMServices")).split(","))
    flapped: dict[tuple[str, str, str], tuple[float, float]] = {}
    for flap in evidence.scenario.flapping:
        names = evidence.initial_nodes.get(f"{flap['cluster']}/{flap['pool']}", [])
        if 0 <= int(flap["node_index"]) < len(names):
            begin = evidence.start + float(flap["start"])
            flapped[(flap["cluster"], names[int(flap["node_index"])], flap["type"])] = (
                begin, begin + float(flap["period_s"]) * int(flap["flips"]))
    for rec in evidence.records.get("remediation", []):
        cond = str(rec.data.get("condition", ""))
        key = (_cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", "")), cond)
        # REMEDIATION_CONDITIONS configures the NPD conditions; other signals have their policy tables
        # (soak/signal_invariants.py judges those).
        if cond and cond not in configured and str(rec.data.get("signal") or "npd") == "npd":
            out.append(Violation("no-false-positive", f"remediation {rec.id} for {cond}, which is not configured"))
        window = flapped.get(key)
        since = _since(rec)
        # The flapping's own episode, not a genuine flip that struck the same node after it (seed 954044: after
        # two replacements a flip's node_index named the node that had flapped three minutes before).
        if window is not None and (since is None or window[0] - 1.0 <= since <= window[1] + 1.0):
            out.append(Violation("no-false-positive", f"remediation {rec.id} for a flapping {cond} on {key[1]}"))
    return out


def _since(rec: Any) -> float | None:
    """When the condition a remediation acted on turned True (its ``since``), or None when unreadable."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(rec.data.get("since") or "").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def check_app_errors(evidence: Evidence) -> list[Violation]:
    return [Violation("app-error", error) for error in evidence.app_errors]


def check_liveness(evidence: Evidence) -> list[Violation]:
    configured = set(str(evidence.scenario.profile.get("REMEDIATION_CONDITIONS",
                                                       "UnhealthyNvidiaDevicePlugin,UnhealthyNvidiaDCGMServices")).split(","))
    managed = {(p.cluster, p.name) for p in evidence.scenario.pools if p.managed}
    cleared = {(f["cluster"], f["pool"], f["node_index"], f["type"]) for f in evidence.scenario.flips
               if f.get("status") == "False"}
    flips = [f for f in evidence.scenario.flips if f["type"] in configured and f.get("status", "True") == "True"
             and (f["cluster"], f["pool"]) in managed and (f["cluster"], f["pool"], f["node_index"], f["type"]) not in cleared]
    reported = [e for e in evidence.published if e.get("type") == "Steward.GpuNode.Unhealthy"]
    if flips and not reported and not evidence.records.get("remediation"):
        return [Violation("liveness", f"{len(flips)} configured condition(s) turned True and the app reported none")]
    return []


def check_explained(evidence: Evidence) -> list[Violation]:
    from shared.remediation import decisions
    from shared.remediation.refusals import RULES, SKIP_RULES

    out = []
    for rec in evidence.records.get("dedupe", []):
        code = str(rec.data.get("reason_code") or "")
        if rec.id.startswith("refused-") and code not in RULES:
            out.append(Violation("explained", f"refusal {rec.id} has code {code!r}, which no rule explains"))
    for rec in evidence.records.get(decisions.KIND, []):
        decision = decisions.load(rec)
        if decision is None or decision.code not in SKIP_RULES:
            out.append(Violation("explained", f"decision {rec.id} is not a skip any rule explains: {rec.data}"))
    return out


CHECKS = (check_liveness, check_explained, check_oracles, check_budgets, check_outcomes, check_ledger, check_repairs,
          check_false_positives, check_app_errors)


def check_all(evidence: Evidence) -> list[Violation]:
    # These modules import this one: not at its top.
    from soak.forged_row_invariants import FORGED_ROW_CHECKS, without_forged_rows
    from soak.forgery_invariants import FORGERY_CHECKS
    from soak.liveness import check_fault_liveness
    from soak.signal_invariants import SIGNAL_CHECKS
    from soak.strict_invariants import STRICT_CHECKS

    out: list[Violation] = []
    own = without_forged_rows(evidence)  # the app's own records; the forged rows are judged by their checks
    for check in (*CHECKS, *STRICT_CHECKS, *SIGNAL_CHECKS, *FORGERY_CHECKS, check_fault_liveness):
        out.extend(check(own))
    for check in FORGED_ROW_CHECKS:
        out.extend(check(evidence))
    return out

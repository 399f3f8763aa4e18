"""``fleetctl why NODE`` and ``why POOL``: what the steward decided about a node or a pool, by which rule, and
what would have to change, from the records the steward keeps (no log search).

For a node: the refusals recorded for its faults (``dedupe`` ``refused-<fault>-<code>`` rows, one per fault
and code, expiring after ``LEDGER_DEDUPE_RETENTION_DAYS``) and the sweep's skips of it while it was faulty
(``decision`` ``skip-<fault>-<code>`` rows, shared.remediation.decisions, expiring after
``LEDGER_DECISION_RETENTION_DAYS``), each explained by its rule
(shared.remediation.refusals), its remediations and their history, the safety state that applies
(breaker, pause, dry run), and, when the cluster can be reached, the node's evaluation now (the same pure
function the sweep runs: shared.remediation.health.evaluate). For a pool: its migration record, or the
plan's decision about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetctl import records, render

DEDUPE = "dedupe"
REFUSED_PREFIX = "refused-"


def _matches(data: dict[str, Any], *, cluster: str | None) -> bool:
    return cluster is None or str(data.get("cluster") or "").lower().rstrip("/").endswith("/" + cluster.lower()) or \
        str(data.get("cluster") or "").lower() == cluster.lower()


def refusals(ledger: Any, node: str, *, cluster: str | None = None) -> list[dict[str, Any]]:
    """The refusals recorded for ``node``'s faults, newest first, each with its rule."""
    from shared.remediation.refusals import explain

    out = []
    for r in records.list_records(ledger, DEDUPE):
        if not r.id.startswith(REFUSED_PREFIX) or r.data.get("node") != node or not _matches(r.data, cluster=cluster):
            continue
        code = str(r.data.get("reason_code") or "")
        rule = explain(code)
        out.append({"at": r.created_at, "code": code, "reason": r.data.get("reason") or "",
                    "cluster": r.data.get("cluster"), "rule": rule.rule, "settings": list(rule.settings),
                    "passes": rule.passes, "to_repair": rule.to_repair})
    return sorted(out, key=lambda x: x["at"] or 0, reverse=True)


def skips(ledger: Any, node: str, *, cluster: str | None = None) -> list[dict[str, Any]]:
    """The sweep's skips of ``node`` while it carried a fault, newest first, each with its rule."""
    from shared.remediation import decisions
    from shared.remediation.refusals import explain

    out = []
    for r in records.list_records(ledger, decisions.KIND):
        d = decisions.load(r)
        if d is None or d.node != node or not _matches({"cluster": d.cluster}, cluster=cluster):
            continue
        rule = explain(d.code)
        out.append({"at": d.at, "code": d.code, "reason": d.reason, "condition": d.condition, "since": d.since,
                    "cluster": d.cluster, "pool": d.pool, "rule": rule.rule, "settings": list(rule.settings),
                    "passes": rule.passes, "to_repair": rule.to_repair})
    return sorted(out, key=lambda x: x["at"] or 0, reverse=True)


def remediations(ledger: Any, node: str, *, cluster: str | None = None) -> list[dict[str, Any]]:
    found = [r for r in records.list_records(ledger, records.REMEDIATION)
             if r.data.get("node") == node and _matches(r.data, cluster=cluster)]
    return [{**records.remediation_view(r), "history": r.history} for r in found]


def safety(ledger: Any, settings: dict[str, str]) -> dict[str, Any]:
    """What stops or limits every remediation, fleet-wide, right now (the app's own setting readers)."""
    from shared.kernel.env import env_bool

    breaker = records.breaker_view(records.get_record(ledger, records.BREAKER, "fleet"))
    return {"breaker": breaker["state"], "breaker_reason": breaker["reason"],
            "paused": env_bool("STEWARD_PAUSED", False, env=settings),
            "dry_run": env_bool("REMEDIATION_DRY_RUN", False, env=settings)}


def evaluation(ctx: Any, cluster_id: str, node: str) -> dict[str, Any]:
    """The node as the sweep would judge it now (its bucket, the condition and since when)."""
    from shared.remediation import health
    from shared.remediation.admission import policy_of

    view = ctx.access.kube(cluster_id).get_node(node)
    if view is None:
        return {"bucket": "gone", "detail": f"{node} is not in the cluster any more"}
    result = health.evaluate([view], now=ctx.clock.now(), policy=policy_of(ctx))
    if result.unhealthy:
        f = result.unhealthy[0]
        return {"bucket": "unhealthy", "condition": f.condition, "since": f.since,
                "detail": f"{f.condition} True since {render.when(f.since)}, past its threshold: a fault to repair"}
    if result.pending:
        f = result.pending[0]
        return {"bucket": "pending", "condition": f.condition, "since": f.since,
                "detail": f"{f.condition} True since {render.when(f.since)}, not yet past its threshold"}
    if result.skipped:
        return {"bucket": "skipped", "detail": f"skipped by the sweep: {result.skipped[0][1]}"}
    if result.unknown:
        return {"bucket": "unknown", "detail": f"condition {result.unknown[0][1]} missing or Unknown"}
    return {"bucket": "healthy", "detail": "no fault condition is True"}


def node_text(story: dict[str, Any], *, wide: bool) -> str:
    lines = [f"node {story['node']}" + (f" (cluster {story['cluster']})" if story.get("cluster") else "")]
    now = story.get("now")
    if now:
        lines.append(f"now: {now['bucket']}: {now['detail']}")
    elif story.get("now_error"):
        lines.append(f"now: not read ({story['now_error']})")
    s = story["safety"]
    lines.append(f"safety: breaker {s['breaker']}" + (f" ({s['breaker_reason']})" if s["breaker_reason"] else "")
                 + ("; STEWARD_PAUSED" if s["paused"] else "") + ("; REMEDIATION_DRY_RUN: acts on nothing"
                                                                   if s["dry_run"] else ""))
    if not story["refusals"] and not story["remediations"] and not story.get("skips"):
        lines.append("decisions: none recorded for this node (no refusal, no skip, no remediation)")
    for k in story.get("skips", [])[: None if wide else 5]:
        lines.append(f"skipped {render.when(k['at'])} [{k['code']}]: {k['reason']}, while {k['condition']} was True "
                     f"since {render.when(k['since'])}")
        lines.append(f"  rule: {k['rule']}" + (f" (settings: {', '.join(k['settings'])})" if k["settings"] else ""))
        lines.append(f"  {'passes by itself when' if k['passes'] else 'needs a person:'} {k['to_repair']}")
    for r in story["refusals"][: None if wide else 5]:
        lines.append(f"refused {render.when(r['at'])} [{r['code']}]: {r['reason']}")
        lines.append(f"  rule: {r['rule']}" + (f" (settings: {', '.join(r['settings'])})" if r["settings"] else ""))
        lines.append(f"  {'passes by itself when' if r['passes'] else 'needs a person:'} {r['to_repair']}")
    for m in story["remediations"]:
        lines.append(f"remediation {m['id']}: {m['state']} ({m['condition'] or '-'}), last step: {m['note'] or '-'}")
        if wide:
            lines += [f"  {render.when(h.get('at'))}  {h.get('state', ''):<12} {h.get('note', '')}"
                      for h in m["history"]]
    return "\n".join(lines)


def pool_story(ledger: Any, pool: str, *, cluster: str | None, plan: Any | None) -> dict[str, Any]:
    found = [records.migration_view(r) for r in records.list_records(ledger, records.MIGRATION)
             if r.data.get("pool") == pool and (cluster is None or r.data.get("cluster_name") == cluster)]
    skipped: Sequence[Any] = getattr(plan, "skipped", ()) if plan is not None else ()
    items: Sequence[Any] = getattr(plan, "items", ()) if plan is not None else ()
    planned = [{"replacement": i.replacement, "strategy": i.strategy, "why": i.strategy_reason}
               for i in items if i.pool == pool and (cluster is None or i.cluster_name == cluster)]
    skips = [{"code": s.code, "reason": s.reason} for s in skipped
             if s.pool == pool and (cluster is None or s.cluster_name == cluster)]
    return {"pool": pool, "cluster": cluster, "migrations": found, "plan": planned, "skipped": skips}


def pool_text(story: dict[str, Any], *, off: str) -> str:
    lines = [f"pool {story['pool']}" + (f" (cluster {story['cluster']})" if story.get("cluster") else "")]
    for m in story["migrations"]:
        lines.append(f"migration {m['id']}: {m['state']} to {m['replacement']} ({m['strategy']}), "
                     f"{m['nodes_drained']}/{m['nodes_total']} nodes drained, last step: {m['note'] or '-'}")
        if m.get("reason"):
            lines.append(f"  reason: {m['reason']}")
        if m.get("waiting"):
            lines.append(f"  waiting: {m['waiting']}")
    for p in story["plan"]:
        lines.append(f"the plan migrates it to {p['replacement']} ({p['strategy']}: {p['why']})"
                     + (f"; but {off}" if off else ""))
    for s in story["skipped"]:
        lines.append(f"the plan skips it [{s['code']}]: {s['reason']}")
    if len(lines) == 1:
        lines.append("no migration recorded, and the plan does not list it (not an unmanaged GPU pool in scope)")
    return "\n".join(lines)

"""Re-reading one node's DCGM counters from their own source: before admission and before every
disruptive step of a DCGM remediation.

The sweep's instant query finds candidates; nothing is done about one until the window query
(:func:`dcgm_provenance.window_query`) confirms it: the lowest value of every sample of the last
``windowSeconds``, of every series that passes the provenance checks, must still show the fault. A
forged copy of a node's series that interleaves with the exporter's own healthy samples, or a second
copy that says healthy, never crosses this (shared.remediation.dcgm_provenance says who can write what).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shared.kernel.errors import Forbidden, Invalid, NotFound, StewardError, Throttled, Transient
from shared.kernel.timefmt import iso, parse_time
from shared.remediation import admission, attempts, health
from shared.remediation import dcgm_provenance as prov
from shared.remediation import signal_policy as sp
from shared.remediation.dcgm import DCGM_KIND, SIGNAL, Observed, Reading, _load, judge, readings_by_node
from shared.remediation.dcgm_config import PrometheusTarget
from shared.remediation.records import node_key
from shared.remediation.signals import Signal, SignalSource

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.dcgm")


def window_readings(ctx: Context, target: PrometheusTarget, node: str) -> list[Reading]:
    """The node's readings over the target's window (one query per exported counter). Raises the
    adapter's errors (Transient/Throttled: try later; Forbidden/Invalid/NotFound: cannot be read)."""
    readings: list[Reading] = []
    workspace = ctx.access.metrics(target.endpoint)
    for metric in target.counters:
        samples = workspace.query(prov.window_query(target, metric, node))
        found, _ = readings_by_node(samples, [target], metric=metric)
        readings.extend(found.get((target.cluster_id, node), []))
    return readings


def escalate(decision: sp.Decision, repeated_by: str) -> sp.Decision:
    """``restart_then_replace`` seen again after a restart: ``replace``, naming the row and the earlier repair."""
    if decision.action != sp.RESTART_THEN_REPLACE or not repeated_by:
        return decision
    return sp.Decision(sp.REPLACE, f"{decision.row}:repeat", decision.source,
                       f"seen again after remediation {repeated_by} restarted the node: {decision.note}")


#: How much a decision asks for: when a node shows several faults, the one that asks the most is acted on.
_SEVERITY: Mapping[str, int] = {sp.IGNORE: 0, sp.RECORD_ONLY: 1, sp.RESTART: 2, sp.RESTART_THEN_REPLACE: 3,
                                sp.REPLACE: 4}


def _ignored(detail: str) -> admission.Handled:
    return admission.Handled(admission.Handling.IGNORED, f"ignored: {detail}")


def recheck(ctx: Context, data: Mapping[str, Any], *, event_id: str, observed_at: float) -> admission.Handled:
    """Re-read one node's counters over the window and admit (or record) what they show now.

    Raises only Throttled/Transient (the workspace is unavailable or answered in part): Event Grid
    delivers again later, and nothing is decided from an answer that is not whole."""
    cluster_id, node_name = str(data.get("cluster") or ""), str(data.get("node") or "")
    key, since = str(data.get("condition") or ""), parse_time(data.get("since") or None)
    if not cluster_id or not node_name or not key or since is None:
        return _ignored("malformed DCGM event (needs data.cluster, node, condition, since)")
    target = ctx.settings.signals_prometheus.get(cluster_id.lower())
    if target is None:
        return _ignored(f"cluster {cluster_id} has no workspace in SIGNALS_PROMETHEUS")
    cluster, why_not = admission.scoped_cluster(ctx, cluster_id)
    if cluster is None:
        return _ignored(why_not)
    policy = admission.policy_of(ctx)
    now = ctx.clock.now()
    node = ctx.access.kube(cluster.id).get_node(node_name)
    if node is None:
        return _ignored(f"node {node_name} no longer exists")
    if target.exporter == "managed" and not prov.runs_managed_exporter(node.labels):
        return _ignored(f"AKS's managed exporter does not run on {node_name} (no {prov.EXPORTER_NODE_LABEL}=enabled): "
                        f"a series naming it was not written by it")
    skipped = next((r for _, r in health.evaluate([node], now=now, policy=policy).skipped), None)
    if skipped and skipped != health.SKIP_OPTED_OUT:  # opted out: admission refuses it, as for a condition
        return _ignored(f"node {node_name} is skipped ({skipped})")
    try:
        readings = window_readings(ctx, target, node_name)
    except (Forbidden, Invalid, NotFound) as exc:
        return _ignored(f"the workspace cannot be read ({exc}): nothing inferred")
    if not readings:
        return _ignored(f"no DCGM series for {node_name} over the last {target.window_s:.0f}s: nothing inferred")
    row = _load(ctx.ledger.get(DCGM_KIND, node_key(cluster_id, node_name)), cluster_id, node_name)
    observed, _ = judge(readings, baselines=row.baselines, overrides=ctx.settings.xid_overrides)
    found = next((o for o in observed if o.key == key), None)
    first = row.seen.get(key)
    if found is None or first is None:
        return _ignored(f"{key} does not show on {node_name} in every sample and copy of the last "
                        f"{target.window_s:.0f}s")
    if first > since + 1.0:
        return _ignored(f"stale event ({key} cleared and came back at {iso(first)})")
    if now < first + policy.threshold_for(key):
        return _ignored(f"{key} on {node_name} has not been seen for its threshold yet")
    active, repeated = attempts.earlier(ctx, cluster.id, node_name, signal=SIGNAL, now=now, policy=policy)
    if active and found.acts:
        return admission.Handled(admission.Handling.DUPLICATE, f"duplicate: remediation {active} is in progress on "
                                                               f"{node_name}; {key} is judged again after it")
    decision = escalate(found.decision, repeated)
    worst = max(((escalate(o.decision, repeated), o.key) for o in observed if o.key in row.seen),
                key=lambda c: _SEVERITY.get(c[0].action, 0))
    if _SEVERITY.get(worst[0].action, 0) > _SEVERITY.get(decision.action, 0):
        # One remediation per node: the fault that asks the most decides it (its own event admits it).
        return _ignored(f"{worst[1]} on {node_name} asks for more ({worst[0].action}) than {key}: its event decides")
    log.info("DCGM re-check of %s/%s: %s -> %s (row %s%s)", cluster.id, node_name, key, decision.action, decision.row,
             f"; repeat of {repeated}" if repeated else "")
    signal = Signal(source=SignalSource.DCGM, key=key, since=first, decision=decision,
                    detail=Observed(found.key, found.metric, found.value, found.gpus, decision).detail())
    return admission.admit_signal(ctx, cluster=cluster, node=node, signal=signal, event_id=event_id,
                                  observed_at=observed_at)


def still_present(ctx: Context, *, cluster_id: str, node: str, key: str,
                  labels: Mapping[str, str] | None = None) -> tuple[bool | None, str]:
    """Whether the DCGM fault ``key`` still holds on ``node`` over the window, re-read now: True,
    False (gone, contradicted by a sample or a copy, or the node runs no managed exporter: ``labels`` are
    the node's, read by the caller), None (the workspace cannot answer now)."""
    target = ctx.settings.signals_prometheus.get(cluster_id.lower())
    if target is None:
        return None, f"cluster {cluster_id} has no workspace in SIGNALS_PROMETHEUS any more"
    if labels is not None and target.exporter == "managed" and not prov.runs_managed_exporter(labels):
        return False, f"AKS's managed exporter does not run on {node}: no genuine series of it to believe"
    try:
        readings = window_readings(ctx, target, node)
    except (Throttled, Transient) as exc:
        return None, f"the workspace cannot answer now ({exc})"
    except StewardError as exc:
        return None, f"the workspace cannot be read ({exc})"
    if not readings:
        return None, f"no DCGM series for {node} over the last {target.window_s:.0f}s"
    row = _load(ctx.ledger.get(DCGM_KIND, node_key(cluster_id, node)), cluster_id, node)
    observed, _ = judge(readings, baselines=row.baselines, overrides=ctx.settings.xid_overrides)
    found = next((o for o in observed if o.key == key), None)
    if found is None:
        return False, f"{key} no longer shows on {node} in every sample and copy of the last {target.window_s:.0f}s"
    return True, f"{found.detail()} over the last {target.window_s:.0f}s"

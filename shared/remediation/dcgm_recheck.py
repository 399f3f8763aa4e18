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
from shared.remediation.dcgm import DCGM_KIND, SIGNAL, Observed, Reading, _load, _metric_of, judge, readings_by_node
from shared.remediation.dcgm_config import PrometheusTarget
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import fault_id, node_key
from shared.remediation.signals import Signal, SignalSource

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.dcgm")


def window_readings(ctx: Context, target: PrometheusTarget, node: str, *, at: float | None = None,
                    metrics: tuple[str, ...] | None = None, span_s: float | None = None) -> list[Reading]:
    """The node's readings over the target's window (one query per exported counter, or per one of
    ``metrics``) ending now, or at ``at``; over the last ``span_s`` seconds instead of the window when given.
    Raises the adapter's errors (Transient/Throttled: try later; Forbidden/Invalid/NotFound: cannot be read)."""
    readings: list[Reading] = []
    workspace = ctx.access.metrics(target.endpoint)
    for metric in metrics or target.counters:
        query = prov.window_query(target, metric, node, span_s=span_s)
        samples = workspace.query(query, at=at)
        found, _ = readings_by_node(samples, [target], metric=metric)
        readings.extend(found.get((target.cluster_id, node), []))
    return readings


def masked(ctx: Context, target: PrometheusTarget, node: str, key: str, *, since: float, confirmed: float | None,
           threshold_s: float, baselines: Mapping[str, float]) -> tuple[Observed | None, str]:
    """An XID the gauge no longer shows because a later XID replaced it, on a GPU never reset since.

    ``DCGM_FI_DEV_XID_ERRORS`` is the "value of the last XID error encountered" (NVIDIA/dcgm-exporter
    ``etc/default-counters.csv``): a later XID (an application's XID 13, say) replaces a double-bit ECC
    error's XID 48 on the gauge, while the memory that erred is no better. Only a reset clears the error
    (the driver reloads and the gauge reads 0). Soak seed 964797: an ECC storm's XID 48, confirmed by every
    sweep for four minutes, was published each time; Event Grid delivered every event 300 s late, after an
    XID 13 had replaced it, and the re-check, asking only the last window, saw nothing to act on: the node
    kept its failing memory in service.

    ``confirmed``: when a sweep's window query first confirmed the fault first seen at ``since`` (the
    ``dcgm-node`` row's ``confirmed``; None: never, and nothing is asked). The row is only a claim; the
    workspace decides (it keeps every sample: "data retention of up to 18 months",
    https://learn.microsoft.com/azure/azure-monitor/metrics/prometheus-metrics-overview; the query API's
    ``time`` parameter evaluates at a past moment). The XID still stands when both hold:

    - ``confirmed`` is past the fault's threshold, and every sample and copy of the window ending then
      showed it (the question the sweep asked before it published it); and
    - since then, every sample and copy of each GPU that showed it read an XID, never 0: the gauge was never
      reset (a reboot, a GPU reset) and the GPU never vanished from the workspace.

    Returns the observation as it was confirmed, with why; None with why not. Raises the adapter's errors."""
    if _metric_of(key) != sp.XID_METRIC:
        return None, f"{key} is not a last-XID value: nothing replaces it"
    if confirmed is None:
        return None, f"no sweep confirmed {key} on {node} before it was replaced"
    at, now = confirmed, ctx.clock.now()
    if not since + threshold_s <= at <= now:
        return None, f"{key} on {node} was not past its threshold at {iso(at)}: not a confirmation"
    then = window_readings(ctx, target, node, at=at, metrics=(sp.XID_METRIC,))
    observed, _ = judge(then, baselines=baselines, overrides=ctx.settings.xid_overrides)
    found = next((o for o in observed if o.key == key), None)
    if found is None:
        return None, f"{key} did not show in every sample and copy of the {target.window_s:.0f}s before {iso(at)}"
    lowest = {r.gpu: r.value for r in window_readings(ctx, target, node, metrics=(sp.XID_METRIC,), span_s=now - at)}
    for gpu in found.gpus:
        if sp.xid_of(lowest.get(gpu, 0.0)) is None:
            return None, (f"GPU {gpu} of {node} read no XID at some sample since {iso(at)} (a reset, or no series): "
                          f"{key} is gone")
    shown = ", ".join(f"GPU {gpu}: Xid{sp.xid_of(lowest[gpu])}" for gpu in found.gpus)
    return found, (f"{key} held over the {target.window_s:.0f}s before {iso(at)}; a later XID has replaced it on the "
                   f"gauge since ({shown} at least), with no reset")


def replaced_due(ctx: Context, target: PrometheusTarget, cluster_id: str, node: str, seen: Mapping[str, float], *,
                 confirmed: Mapping[str, float], shown: set[str], policy: RemediationPolicy,
                 baselines: Mapping[str, float], errors: list[str]) -> tuple[list[Observed], set[str]]:
    """The kept XIDs the gauge no longer shows because a later XID replaced them, with the GPU never reset
    since their confirmation (:func:`masked`), not yet handled: due, as if they showed; and the confirmed
    ones the workspace no longer stands behind (a reset since, or a row whose confirmation the window does
    not bear out): forgotten, as the gauge's reset says. Without this, the sweep published such an XID only
    while it showed, and an event that came too late (or a refusal of the last one) was the end of it (soak
    seed 964797). A kept XID never confirmed costs nothing; a confirmed one two queries a sweep, until a
    remediation handles it (its reset then clears the gauge)."""
    out: list[Observed] = []
    gone: set[str] = set()
    for key, first in sorted(seen.items()):
        if key in shown or _metric_of(key) != sp.XID_METRIC or key not in confirmed:
            continue
        if attempts.handling(ctx, cluster_id, node, fault_id(cluster_id, node, key, first)):
            continue  # remediated, or being remediated: its own re-reads decide
        try:
            found, why = masked(ctx, target, node, key, since=first, confirmed=confirmed[key],
                                threshold_s=policy.threshold_for(key), baselines=baselines)
        except StewardError as exc:
            errors.append(f"dcgm {cluster_id}/{node}: {key} replaced: {type(exc).__name__}: {exc}")
            continue  # nothing inferred: judged again next sweep
        log.info("dcgm %s/%s: %s", cluster_id, node, why)
        if found is None:
            gone.add(key)
        else:
            out.append(found)
    return out, gone


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
    replaced = ""
    if found is None and first is not None and first <= since + 1.0:
        # not on the gauge now: replaced by a later XID, with the GPU never reset? (the workspace decides)
        try:
            found, replaced = masked(ctx, target, node_name, key, since=first, confirmed=row.confirmed.get(key),
                                     threshold_s=policy.threshold_for(key), baselines=row.baselines)
        except (Forbidden, Invalid, NotFound) as exc:
            return _ignored(f"the workspace cannot be read ({exc}): nothing inferred")
        if found is None:
            return _ignored(f"{key} does not show on {node_name} in every sample and copy of the last "
                            f"{target.window_s:.0f}s, and {replaced}")
        observed = [*observed, found]
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
    detail = Observed(found.key, found.metric, found.value, found.gpus, decision).detail()
    signal = Signal(source=SignalSource.DCGM, key=key, since=first, decision=decision,
                    detail=f"{detail} ({replaced})" if replaced else detail)
    return admission.admit_signal(ctx, cluster=cluster, node=node, signal=signal, event_id=event_id,
                                  observed_at=observed_at)


def still_present(ctx: Context, *, cluster_id: str, node: str, key: str,
                  labels: Mapping[str, str] | None = None, since: float | None = None) -> tuple[bool | None, str]:
    """Whether the DCGM fault ``key`` still holds on ``node`` over the window, re-read now: True,
    False (gone, contradicted by a sample or a copy, or the node runs no managed exporter: ``labels`` are
    the node's, read by the caller), None (the workspace cannot answer now). An XID first seen at ``since``
    that a later XID replaced on the gauge, with no reset since, still holds (:func:`masked`)."""
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
    if found is None and since is not None:
        policy = admission.policy_of(ctx)
        try:
            replaced, why = masked(ctx, target, node, key, since=since, confirmed=row.confirmed.get(key),
                                   threshold_s=policy.threshold_for(key), baselines=row.baselines)
        except (Throttled, Transient) as exc:
            return None, f"the workspace cannot answer now ({exc})"
        except StewardError as exc:
            return None, f"the workspace cannot be read ({exc})"
        if replaced is not None:
            return True, why
    if found is None:
        return False, f"{key} no longer shows on {node} in every sample and copy of the last {target.window_s:.0f}s"
    return True, f"{found.detail()} over the last {target.window_s:.0f}s"

"""What the DCGM signal tells operators about itself: series it refused, counters it cannot read, and
its own rows kept bounded.

- **Refused series** are counted in every sweep's report and published as one
  ``Steward.Signal.SeriesRefused`` event per (workspace, refusal code) per UTC day, with a few
  examples: a forged or misrouted series is said out loud, yet a thousand phantom names cost one
  event and one small ledger row, not a thousand.
- **Inactive counters**: a policy row whose counter the cluster's exporter does not export (AKS's
  managed exporter exports only the default CSV's: shared.remediation.dcgm_provenance) can never fire.
  That is said once per cluster and exporter configuration (``Steward.Signal.CountersInactive``), and in
  ``fleetctl status`` (:func:`inactive_lines`), never left to silence.
- **Row expiry**: a ``dcgm-node`` row whose node is gone is deleted an hour after its last write; any
  row untouched for the retention is deleted (a lifetime ECC baseline is then taken afresh, which
  records, never acts); ``dcgm-report`` rows go after two days.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.kernel.errors import Conflict, StewardError
from shared.kernel.ports import Record
from shared.remediation.dcgm_config import PrometheusTarget

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.dcgm")

REPORT_KIND = "dcgm-report"
SERIES_REFUSED_EVENT = "Steward.Signal.SeriesRefused"
COUNTERS_INACTIVE_EVENT = "Steward.Signal.CountersInactive"
GONE_NODE_ROW_TTL_S = 3600.0
REPORT_ROW_TTL_S = 2 * 86400.0
MAX_DELETES_PER_SWEEP = 100
_EXAMPLES = 5


@dataclass
class Refusals:
    """Refused series of one sweep: count and a few examples per code."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, code: str, what: str) -> None:
        self.counts[code] = self.counts.get(code, 0) + 1
        ex = self.examples.setdefault(code, [])
        if len(ex) < _EXAMPLES:
            ex.append(what[:1000])

    def merge(self, other: Refusals) -> None:
        for code, n in other.counts.items():
            self.counts[code] = self.counts.get(code, 0) + n
            ex = self.examples.setdefault(code, [])
            ex.extend(other.examples.get(code, [])[: _EXAMPLES - len(ex)])


def _once(ctx: Context, key: str, *, now: float, about: Mapping[str, Any]) -> bool:
    """True the first time ``key`` is claimed (a small ledger row), False after."""
    rid = hashlib.sha256(key.encode()).hexdigest()[:40]
    try:
        ctx.ledger.create(Record(kind=REPORT_KIND, id=rid, state="reported", data=dict(about), created_at=now,
                                 updated_at=now))
    except Conflict:
        return False
    return True


def _publish(ctx: Context, type_: str, subject: str, data: Mapping[str, Any], id_: str) -> None:
    try:
        ctx.events.publish(type_=type_, subject=subject, data=data, id_=id_)
    except StewardError as exc:  # the report is best effort; the sweep's summary still carries it
        log.warning("could not publish %s: %s", type_, exc)


def report_refused(ctx: Context, endpoint: str, refusals: Refusals, *, now: float) -> None:
    """One SeriesRefused event per (workspace, code) per UTC day."""
    day = int(now // 86400)
    for code, n in sorted(refusals.counts.items()):
        key = f"refused|{endpoint.lower()}|{code}|{day}"
        about = {"workspace": endpoint, "code": code, "count": n, "examples": refusals.examples.get(code, [])}
        if _once(ctx, key, now=now, about=about):
            log.warning("DCGM: %d series from %s refused (%s), never acted on; e.g. %s", n, endpoint, code,
                        refusals.examples.get(code, [])[:2])
            _publish(ctx, SERIES_REFUSED_EVENT, f"/workspaces/{endpoint}", about,
                     hashlib.sha256(key.encode()).hexdigest()[:32])


def inactive_lines(targets: Iterable[PrometheusTarget]) -> list[str]:
    """One line per cluster whose exporter leaves policy rows without their counter (fleetctl status)."""
    out = []
    for t in sorted(targets, key=lambda t: t.cluster_id.lower()):
        if t.inactive:
            out.append(f"DCGM rows inactive on {t.cluster_id.rsplit('/', 1)[-1]} ({t.exporter} exporter does not export "
                       f"{', '.join(t.inactive)}): those faults are not seen; see docs/signals-dcgm.md")
    return out


def report_inactive(ctx: Context, target: PrometheusTarget, *, now: float) -> None:
    """Say once per cluster and configuration which counter rows cannot fire there."""
    if not target.inactive:
        return
    key = f"inactive|{target.cluster_id.lower()}|{target.exporter}|{','.join(target.inactive)}"
    about = {"cluster": target.cluster_id, "exporter": target.exporter, "inactive": list(target.inactive),
             "exported": list(target.counters),
             "remedy": "run an exporter of your own with these counters on driver-only pools and configure it as "
                       "exporter 'custom' (docs/signals-dcgm.md)"}
    if _once(ctx, key, now=now, about=about):
        log.warning("DCGM on %s: the %s exporter does not export %s: those policy rows are inactive there",
                    target.cluster_id, target.exporter, ", ".join(target.inactive))
        _publish(ctx, COUNTERS_INACTIVE_EVENT, target.cluster_id, about, hashlib.sha256(key.encode()).hexdigest()[:32])


def expire(ctx: Context, rows: Iterable[Record], *, known: Mapping[str, Mapping[str, object]], now: float,
           retention_s: float) -> int:
    """Delete ``dcgm-node`` rows of gone nodes and stale rows, and old report rows; returns how many."""
    deleted = 0
    candidates = []
    for rec in rows:
        cluster, node = str(rec.data.get("cluster") or ""), str(rec.data.get("node") or "")
        last = rec.updated_at or rec.created_at or 0.0
        nodes = known.get(cluster.lower())
        gone = nodes is not None and node not in nodes and now - last >= GONE_NODE_ROW_TTL_S
        if gone or now - last >= retention_s:
            candidates.append(rec)
    try:
        candidates.extend(r for r in ctx.ledger.list(REPORT_KIND) if now - (r.created_at or 0.0) >= REPORT_ROW_TTL_S)
    except StewardError as exc:
        log.info("listing %s rows: %s", REPORT_KIND, exc)
    for rec in candidates[:MAX_DELETES_PER_SWEEP]:
        try:
            ctx.ledger.delete(rec)
            deleted += 1
        except StewardError as exc:  # another host deleted or rewrote it: next sweep looks again
            log.info("expiring %s/%s: %s", rec.kind, rec.id, exc)
    return deleted

"""Benchmark 4: draining a node with 100 pods, against the sum and the maximum of their grace periods.

A drain that evicts pods one after another, each waiting for the last to go, takes the *sum* of the
grace periods; one that evicts all at once and waits by pod UID takes about the *maximum*. The run
(bench.remediation_run) drains a node holding 100 pods of four Deployments with grace periods of
10, 20, 30 and 60 s (no PDB in the way). The drain's length is read from the remediation record (the
step that started it to the step that found the node empty); the simulator's termination oracle
gives when each eviction happened, hence when the last pod was really gone. Simulated seconds.
"""

from __future__ import annotations

import re

from bench import remediation_run
from bench.figures import Figure, measured, not_measured, ratio_at_most
from bench.scale import Scale

_GRACE = re.compile(r"^grace(\d+)-")


def run(scale: Scale) -> list[Figure]:
    r = remediation_run.get(scale)
    label = f"drain of a node with {scale.drain_pods} pods"
    if r.error or r.drain_started_at is None or r.drained_at is None or not r.evictions:
        why = r.error or "the run recorded no drain"
        return [not_measured(f"{label} vs the longest grace period", "s (simulated)", why),
                not_measured(f"{label} vs the sum of grace periods", "s (simulated)", why),
                not_measured(f"{label}: issuing the evictions", "s (simulated)", why)]
    graces = [int(m.group(1)) for e in r.evictions if (m := _GRACE.match(str(e["pod"])))]
    ends = [float(e["t"]) + int(m.group(1)) for e in r.evictions if (m := _GRACE.match(str(e["pod"])))]
    times = sorted(float(e["t"]) for e in r.evictions)
    drain = r.drained_at - r.drain_started_at
    gone = max(ends) - r.drain_started_at if ends else None
    note = (f"{len(r.evictions)} evictions; clock x{r.speed:g}; the last pod was gone {gone:.0f} s after the drain "
            f"started (oracle); {'; '.join(r.problems) or 'no PDB violation, no pod killed without eviction'}")
    figures = [
        measured(f"{label} vs the longest grace period", drain, "s (simulated)", baseline=max(graces),
                 baseline_name="max grace", target="ratio near 1 (parallel evictions)", note=note),
        measured(f"{label} vs the sum of grace periods", drain, "s (simulated)", baseline=sum(graces),
                 baseline_name="sum of graces", target="ratio << 1", check=ratio_at_most(0.1)),
        measured(f"{label}: issuing the evictions", times[-1] - times[0], "s (simulated)",
                 note=f"first to last Eviction API call; {(times[-1] - times[0]) / r.speed:.2f} s of wall-clock time"),
    ]
    return figures

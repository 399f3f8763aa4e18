"""Benchmark 5: the 16-node pool migration against its critical path, and its ARM writes.

Issue 5's target: a 16-node pool's migration on the simulator within 1.2x of its critical path (pool
creation + the drains that the budgets allow + deletion). The run is bench.migration_run; the
critical path comes from the scenario's timings (see there). The phases are reported against their
own parts of the critical path so that a miss says where the time went. Also: ARM write calls per
migrated pool and the lowest schedulable GPU count during the surge (oracles). Simulated seconds.
"""

from __future__ import annotations

from bench import migration_run
from bench.figures import Figure, measured, not_measured, ratio_at_most
from bench.scale import Scale

_PHASES = (("creation (record planned to replacement healthy)", "planned", "cordoning", "create"),
           ("drains (first cordon to every old node drained)", "cordoning", "deleting", "drains"),
           ("deletion of the old pool", "deleting", "done", "delete"))


def _first(history: list[dict[str, object]], state: str) -> float | None:
    for line in history:
        if line.get("state") == state:
            return float(line["at"])  # type: ignore[arg-type]
    return None


def run(scale: Scale) -> list[Figure]:
    r = migration_run.get(scale)
    label = f"{scale.migration_nodes}-node pool migration"
    if r.error or r.duration_s is None:
        why = r.error or "the run did not finish"
        return [not_measured(f"{label} vs its critical path", "s (simulated)", why, baseline_name="critical path"),
                not_measured(f"ARM writes per migrated pool ({label})", "requests", why)]
    parts = r.parts
    note = (f"clock x{r.speed:g}; critical path = create {parts['create']:.0f} + {parts['batches']:.0f} drains "
            f"{parts['drains']:.0f} + delete {parts['delete']:.0f}; {'; '.join(r.problems) or 'oracles clean'}")
    figures = [measured(f"{label} vs its critical path", r.duration_s, "s (simulated)", baseline=r.critical_path_s,
                        baseline_name="critical path", target="ratio <= 1.2", check=ratio_at_most(1.2), note=note)]
    for title, start, end, part in _PHASES:
        t0, t1 = _first(r.history, start), _first(r.history, end)
        if t0 is None or t1 is None:
            figures.append(not_measured(f"migration phase: {title}", "s (simulated)",
                                        f"the record's history has no {start!r} or {end!r} step"))
            continue
        figures.append(measured(f"migration phase: {title}", t1 - t0, "s (simulated)", baseline=parts[part],
                                baseline_name="its critical part"))
    arm = r.counts.get("arm", {})
    writes = {k: v for k, v in arm.items() if k.split(" ", 1)[0] in ("PUT", "POST", "PATCH", "DELETE")}
    figures.append(measured(f"ARM writes per migrated pool ({label})", float(arm.get("writes", 0)), "requests",
                            note="; ".join(f"{v} x {k.split(' ', 1)[0]} {k.rsplit('/', 1)[-1]}"
                                           for k, v in sorted(writes.items()))))
    figures.append(measured(f"lowest schedulable GPUs during the surge ({label})", float(r.gpu_min or 0), "GPUs",
                            baseline=float(r.gpu_before), baseline_name="before the migration",
                            target="ratio >= 1 (floor 100%)", check=lambda f: (f.ratio or 0) >= 1.0))
    return figures

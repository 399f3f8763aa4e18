"""The soak's summary: scenarios run, faults injected by kind, outcomes, invariant failures by seed.

A failing run is printed as soon as it fails, with its seed and the command that replays it, so a
long soak is useful even when interrupted; the summary at the end repeats every failure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from soak.runner import RunResult


@dataclass
class Summary:
    runs: int = 0
    modes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    by_cause: Counter[str] = field(default_factory=Counter)
    failures: list[RunResult] = field(default_factory=list)
    by_invariant: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    sim_s: float = 0.0

    def add(self, result: RunResult) -> None:
        self.runs += 1
        self.modes[result.mode] += 1
        self.faults.update(result.faults)
        self.outcomes.update(result.outcomes)
        self.by_cause.update(result.by_cause)
        self.wall_s += result.wall_s
        self.sim_s += result.sim_s
        if result.failed:
            self.failures.append(result)
            for v in result.violations:
                self.by_invariant[v.invariant] += 1
            if result.error:
                self.by_invariant["run-error"] += 1


def failure_text(result: RunResult) -> str:
    lines = [f"FAILED seed {result.seed} ({result.mode}): replay with `python -m soak --replay {result.seed}`",
             f"  {result.description}", f"  ended: {result.end_reason}"]
    lines += [f"  - {v}" for v in result.violations]
    if result.error:
        lines.append("  - run error: " + result.error.replace("\n", "\n    "))
    lines += [f"  | {note}" for note in result.notes]
    return "\n".join(lines)


def print_summary(summary: Summary, out: TextIO) -> None:
    print("", file=out)
    print("=" * 72, file=out)
    print(f"soak: {summary.runs} scenarios run ({', '.join(f'{n} {m}' for m, n in sorted(summary.modes.items()))}); "
          f"{summary.sim_s / 3600:.1f} simulated hours in {summary.wall_s:.0f} s", file=out)
    print(f"faults injected by kind ({sum(summary.faults.values())} in all):", file=out)
    for kind, n in sorted(summary.faults.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:7d}  {kind}", file=out)
    print("outcomes:", file=out)
    for kind, n in sorted(summary.outcomes.items()):
        print(f"  {n:7d}  {kind}", file=out)
    print("genuine faults and migrations, by how they ended (soak.liveness):", file=out)
    for kind, n in sorted(summary.by_cause.items()):
        print(f"  {n:7d}  {kind}", file=out)
    print(f"invariant failures: {sum(summary.by_invariant.values())} in {len(summary.failures)} scenario(s)", file=out)
    for inv, n in sorted(summary.by_invariant.items()):
        print(f"  {n:7d}  {inv}", file=out)
    for result in summary.failures:
        print(failure_text(result), file=out)

"""``python -m bench``: run every benchmark, print the table, write ``bench-results.json``.

Benchmarks run one after another (they share a 2-core machine with the simulator they start); a
benchmark that raises is reported as "not measured" with the error, and the others still run.
``--only`` picks benchmarks by module name; ``--scale tiny`` is what the smoke test uses.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from bench import report
from bench.figures import Figure, not_measured
from bench.scale import SCALES

#: Module names in the order they run: the independent measurements first, the ones that need the
#: remediation and migration jobs (and a whole local stack) last.
BENCHMARKS: tuple[str, ...] = ("cold_import", "sweep_cost", "sim_share", "realkube_list", "reaction", "drain_time",
                               "time_to_repair", "migration_time", "requests")


def run_all(names: tuple[str, ...], *, scale_name: str, progress: bool = True) -> list[Figure]:
    scale = SCALES[scale_name]
    figures: list[Figure] = []
    for name in names:
        started = time.monotonic()
        if progress:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"bench.{name}")
            got = list(module.run(scale))
        except Exception as error:  # a broken benchmark must not hide the others' figures
            got = [not_measured(f"{name} (whole benchmark)", "-", f"{type(error).__name__}: {error}"[:300])]
        figures += got
        if progress:
            print(f"[bench] {name} done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="full", help="full (make bench) or tiny (smoke test)")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, default=None, help="run only these benchmarks")
    parser.add_argument("--out", default="bench-results.json", help="where to write the figures as JSON")
    args = parser.parse_args(argv)
    names = tuple(args.only) if args.only else BENCHMARKS
    started = time.monotonic()
    figures = run_all(names, scale_name=args.scale)
    elapsed = time.monotonic() - started
    print(report.table(figures))
    report.write(Path(args.out), figures, scale=args.scale, elapsed_s=elapsed)
    load = report.document([], scale=args.scale, elapsed_s=elapsed)["machine"]["load_average_at_end"]
    print(f"\n{len(figures)} figures ({sum(1 for f in figures if f.not_measured)} not measured) in {elapsed:.0f} s "
          f"-> {args.out} (load average {load})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

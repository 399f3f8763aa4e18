"""``python -m soak``: run the seeded fault-injection soak and print what it found.

    python -m soak                      SOAK_RUNS scenarios (default 1000), seeds 0..N-1
    python -m soak --seed 500 --runs 50 seeds 500..549
    python -m soak --replay 1234        one scenario, exactly as the soak ran it, with details

Exit status 1 when any invariant failed (each failure is printed with its seed).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from soak.generate import generate
from soak.report import Summary, failure_text, print_summary
from soak.runner import Mix, run_seeds, shared_azurite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--runs", type=int, default=None, help="scenarios to run (default: SOAK_RUNS or 1000)")
    parser.add_argument("--replay", type=int, default=None, metavar="SEED", help="run this one seed and explain it")
    parser.add_argument("--short", action="store_true", help="small scenarios (what the test suite's soak runs)")
    parser.add_argument("--process-every", type=int, default=20,
                        help="every N-th seed runs real host processes killed at random (0 = never; default 20)")
    parser.add_argument("--table-every", type=int, default=5,
                        help="every N-th in-process seed uses the Azurite table as its ledger (0 = never; default 5)")
    parser.add_argument("--wall-budget", type=float, default=300.0, help="wall seconds one scenario may take")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("SOAK_JOBS", "2")),
                        help="scenarios run at once, each in its own worker process (SOAK_JOBS; default 2)")
    parser.add_argument("--no-strict", action="store_true",
                        help="leave out the stricter faults of issue 10 (soak/strict.py): the scenarios as before them")
    parser.add_argument("--no-signals", action="store_true",
                        help="leave out issue 13's fault signals (soak/signals.py): Resource Health events, DCGM faults")
    parser.add_argument("--no-forgeries", action="store_true",
                        help="leave out issue 18's forged DCGM series (soak/forgeries.py): tenant series, a cluster "
                             "alias, phantom node names")
    parser.add_argument("--no-forged-rows", action="store_true",
                        help="leave out issue 19's forged ledger rows (soak/forged_rows.py): remediation rows written "
                             "straight into the table for healthy nodes")
    parser.add_argument("-v", "--verbose", action="store_true", help="the app's warnings on stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL, stream=sys.stderr)

    mix = Mix(process_every=args.process_every, table_every=args.table_every, strict=not args.no_strict,
              signals=False if args.no_signals else None, forgeries=False if args.no_forgeries else None,
              forged_rows=False if args.no_forged_rows else None)
    if args.replay is not None:
        seeds = [args.replay]
    else:
        runs = args.runs if args.runs is not None else int(os.environ.get("SOAK_RUNS", "1000"))
        seeds = list(range(args.seed, args.seed + runs))
    needs_azurite = any(mix.process_mode(s) or mix.use_table(s) for s in seeds)
    summary = Summary()
    started = time.monotonic()
    with shared_azurite(needs_azurite) as azurite:
        if args.replay is not None:
            print(generate(args.replay, short=args.short, process_mode=mix.process_mode(args.replay),
                           strict=mix.strict, signals=mix.signals, forgeries=mix.forgeries,
                           forged_rows=mix.forged_rows).describe())
        jobs = 1 if args.replay is not None else args.jobs
        results = run_seeds(seeds, mix=mix, short=args.short, azurite=azurite, jobs=jobs,
                            wall_budget_s=args.wall_budget)
        for i, result in enumerate(results, 1):
            seed = result.seed
            summary.add(result)
            status = "FAIL" if result.failed else "ok"
            print(f"[{i}/{len(seeds)}] seed {seed} {status} {result.mode} {result.wall_s:.1f}s "
                  f"({result.sim_s:.0f} sim s; {result.end_reason})", flush=True)
            if result.failed:
                print(failure_text(result), flush=True)
            elif args.replay is not None:
                print(f"  faults: {dict(result.faults)}\n  outcomes: {dict(result.outcomes)}")
                for note in result.notes:
                    print(f"  {note}")
    print_summary(summary, sys.stdout)
    print(f"total wall time {time.monotonic() - started:.0f} s")
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())

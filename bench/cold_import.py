"""Benchmark 7: ``function_app``'s cold import, against importing the SDKs eagerly.

A Functions worker imports ``function_app`` on every cold start, so what it imports at module level
is paid before the first invocation. The app imports the heavy SDKs lazily (shared.entrypoints,
shared.wiring); the baseline is the same import preceded by the SDKs an eager app would import at
the top: azure.mgmt.containerservice, azure.mgmt.compute, kubernetes, azure.identity,
azure.eventgrid and azure.data.tables. Each variant runs in a fresh interpreter (``-X importtime``
is not used; the child times itself with ``perf_counter`` and measures ``tracemalloc``'s peak in a
second fresh process, since tracing slows imports down); the median of the runs is reported.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.figures import Figure, measured, not_measured

ROOT = Path(__file__).resolve().parent.parent
EAGER_SDKS = ("azure.mgmt.containerservice", "azure.mgmt.compute", "kubernetes", "azure.identity", "azure.eventgrid",
              "azure.data.tables")

_CHILD = """
import json, sys, time, tracemalloc
mods = json.loads(sys.argv[1]); trace = sys.argv[2] == "1"
if trace:
    tracemalloc.start()
t0 = time.perf_counter()
import importlib
for m in mods:
    importlib.import_module(m)
elapsed = time.perf_counter() - t0
peak = tracemalloc.get_traced_memory()[1] if trace else 0
print(json.dumps({"s": elapsed, "peak": peak, "modules": len(sys.modules)}))
"""


def _child(modules: list[str], *, trace: bool) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(modules), "1" if trace else "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"importing {modules} failed: {out.stderr.strip()[-400:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(modules: list[str], *, runs: int) -> dict[str, float]:
    times = [_child(modules, trace=False) for _ in range(runs)]
    traced = _child(modules, trace=True)
    return {"s": statistics.median(t["s"] for t in times), "peak": traced["peak"], "modules": traced["modules"]}


def run(scale: object) -> list[Figure]:
    runs = int(getattr(scale, "import_runs", 3))
    try:
        lazy = measure(["function_app"], runs=runs)
        eager = measure([*EAGER_SDKS, "function_app"], runs=runs)
    except Exception as error:
        why = f"{type(error).__name__}: {error}"[:300]
        return [not_measured("function_app cold import time", "ms", why, baseline_name="SDKs imported eagerly"),
                not_measured("function_app cold import memory (tracemalloc peak)", "MiB", why,
                             baseline_name="SDKs imported eagerly")]
    note = (f"time: median of {runs} fresh processes, memory: one traced fresh process; "
            f"{int(lazy['modules'])} modules loaded vs {int(eager['modules'])} eagerly")
    return [
        measured("function_app cold import time", lazy["s"] * 1000, "ms", baseline=eager["s"] * 1000,
                 baseline_name="SDKs imported eagerly", note=note),
        measured("function_app cold import memory (tracemalloc peak)", lazy["peak"] / 2**20, "MiB",
                 baseline=eager["peak"] / 2**20, baseline_name="SDKs imported eagerly", note=note),
    ]

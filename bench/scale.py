"""How big each benchmark runs: ``FULL`` for ``make bench``, ``TINY`` for the smoke test.

The smoke test (tests/bench) runs every benchmark at ``TINY`` to prove it produces well-formed
figures; only ``FULL`` sizes are the figures the issues ask for.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    name: str
    sweep_fleets: tuple[int, ...]  # GPU nodes per fleet measured by the sweep benchmark
    sweep_clusters: int  # clusters each fleet is spread over
    sweep_page_size: int
    sweep_fixed_page: int  # a page size every cluster of every fleet fills (for the memory-growth figure)
    share_nodes: int  # nodes of the one cluster listed for the simulator's share
    realkube_nodes: tuple[int, ...]  # GPU nodes listed from the real kube-apiserver (realkube_list), in pages of sweep_page_size
    import_runs: int  # fresh processes per cold-import variant (the median is reported)
    drain_pods: int  # pods on the drained node
    migration_nodes: int  # nodes of the migrated pool
    speed: float  # simulated seconds per wall second for the timed benchmarks
    timeout_s: float  # wall-clock budget of each timed benchmark


FULL = Scale(name="full", sweep_fleets=(1_000, 5_000, 20_000), sweep_clusters=50, sweep_page_size=500, sweep_fixed_page=20,
             share_nodes=5_000, realkube_nodes=(1_000, 5_000), import_runs=3,
             drain_pods=100, migration_nodes=16, speed=10.0, timeout_s=240.0)

TINY = Scale(name="tiny", sweep_fleets=(40, 80), sweep_clusters=4, sweep_page_size=10, sweep_fixed_page=5,
             share_nodes=60, realkube_nodes=(50, 200), import_runs=1,
             drain_pods=8, migration_nodes=2, speed=40.0, timeout_s=120.0)

SCALES = {s.name: s for s in (FULL, TINY)}

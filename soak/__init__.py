"""The seeded fault-injection soak (``python -m soak``): random fleets, bad days, safety invariants.

The project claims that no safety invariant is ever broken: no PDB violated, no pod killed outside
the Eviction API, no budget exceeded, no pool deleted under its workloads, every long job ends in a
stated outcome, the ledger agrees with the clusters, no node replaced twice for one fault. Tests
check those claims on hand-written stories; this package attacks them with many generated ones.
Each run is fully described by one integer seed (fleet, workloads, condition flips, fault rules,
crashes, hosts), so a failing run prints its seed and ``python -m soak --replay SEED`` runs it again.

Modules: :mod:`soak.generate` (seed -> scenario, pure), :mod:`soak.simclock` (the app's clock tied to
the simulator's manual clock), :mod:`soak.crash` (crashes between two steps), :mod:`soak.inprocess`
(the app in this process, several contexts), :mod:`soak.processes` (real host processes killed at
random), :mod:`soak.audit` (what the fleet and the ledger look like at the end),
:mod:`soak.invariants` (pure checks), :mod:`soak.runner` and :mod:`soak.report`. Layers drawn from RNGs of
their own on top of a seed, each with its actions and its checks: :mod:`soak.strict` (issue 10,
:mod:`soak.strict_invariants`), :mod:`soak.signals` (issue 13, :mod:`soak.signal_invariants`) and
:mod:`soak.forgeries` (issue 18's forged DCGM series, :mod:`soak.forgery_invariants`) and
:mod:`soak.forged_rows` (issue 19's forged ledger rows, :mod:`soak.forged_row_invariants`).
"""

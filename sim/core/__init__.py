"""What no single simulated server owns: the HTTP layer every handler speaks (:mod:`sim.core.http`), the
listeners, TLS and dispatch (:mod:`sim.core.server`, :mod:`sim.core.certs`), the ``/_sim`` control API,
fault rules, the safety oracles, VM size facts both halves use (:mod:`sim.core.gpu_catalog`,
:mod:`sim.core.sizes`) and scheduled spot evictions.

The fleet model and the public entry points stay at the top of the package: :mod:`sim.model`,
:mod:`sim.scenario`, :mod:`sim.generate`, :mod:`sim.testing`.
"""

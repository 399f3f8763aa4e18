"""The fleet's Azure Monitor workspace, a Prometheus-compatible query endpoint: the workspace and its
series (:mod:`sim.prometheus.api`), the PromQL subset it evaluates (:mod:`sim.prometheus.promql`) and the
dcgm-exporter series of the simulated GPU nodes (:class:`sim.prometheus.dcgm.FleetDcgm`, the handler).
"""

"""The MetricsPort fake: an Azure Monitor workspace answering PromQL over the simulator's DCGM model.

It parses and evaluates queries with the simulator's own PromQL subset (sim/prometheus/promql.py) at the test's
clock, so a query the simulator would refuse is refused here too (``Invalid`` with ``bad_data``, as the
adapter maps an HTTP 400); ``error`` makes every query fail the way an outage, a 4xx or a partial
answer does.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.kernel.errors import Invalid
from shared.kernel.ports import Sample
from sim.prometheus.api import PrometheusModel, PromQLError, evaluate, parse


class FakeWorkspace:
    """The MetricsPort over the simulator's model: ``error`` makes every query fail (outage, 4xx, partial)."""

    def __init__(self, now: Callable[[], float] = lambda: 0.0) -> None:
        self.now = now
        self.model = PrometheusModel(now=now)
        self.queries: list[str] = []
        self.error: Exception | None = None

    def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        """``at``: the evaluation time (the test's clock when None), as the HTTP API's ``time`` parameter."""
        self.queries.append(promql)
        if self.error is not None:
            raise self.error
        try:
            query = parse(promql)
            at = self.now() if at is None else at
            return [Sample(labels=labels, value=v, at=at) for labels, v in evaluate(query, self.model.writers(), at=at)]
        except PromQLError as exc:
            raise Invalid(f"HTTP 400 bad_data {exc}", code="bad_data") from None

"""ClusterAccess in memory: hands out the fakes of one test world (ARM, Microsoft.Compute, each cluster's API).

The access reads the world's fakes on every call, as the real one hands out cached adapters: a test that
swaps ``world.compute`` for a fake of its own after building a context is still heard.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from shared.kernel.errors import Forbidden, NotFound
from shared.kernel.ports import MetricsPort
from tests.fakes.aks import FakeAks
from tests.fakes.compute import FakeCompute
from tests.fakes.kube import FakeKube


class World(Protocol):
    """What a test world holds: ARM, Microsoft.Compute (None: the scenario never calls it), and the API of
    each cluster (``kube_of`` raises NotFound for a cluster it has none of)."""

    aks: FakeAks
    compute: FakeCompute | None

    def kube_of(self, cluster_id: str) -> FakeKube: ...


@dataclass
class Fakes:
    """The plain world: the fakes held as given; ``kubes`` by cluster id in lower case, a missing one made by
    ``new_kube`` when given (every cluster reachable), else NotFound."""

    aks: FakeAks
    compute: FakeCompute | None = None
    kubes: dict[str, FakeKube] = field(default_factory=dict)
    new_kube: Callable[[str], FakeKube] | None = None

    def kube_of(self, cluster_id: str) -> FakeKube:
        key = cluster_id.lower()
        if key not in self.kubes:
            if self.new_kube is None:
                raise NotFound(cluster_id)
            self.kubes[key] = self.new_kube(cluster_id)
        return self.kubes[key]


class FakeAccess:
    """ClusterAccess over a :class:`World`; ``workspaces`` maps a configured PromQL endpoint (lower case) to
    its MetricsPort, and any other endpoint is Forbidden, as shared.wiring's access answers."""

    def __init__(self, world: World, *, workspaces: Mapping[str, MetricsPort] | None = None) -> None:
        self.world = world
        self.workspaces = dict(workspaces or {})

    def aks(self) -> FakeAks:
        return self.world.aks

    def compute(self) -> FakeCompute:
        if self.world.compute is None:
            raise AssertionError("this scenario never calls Microsoft.Compute")
        return self.world.compute

    def kube(self, cluster_id: str) -> FakeKube:
        return self.world.kube_of(cluster_id)

    def metrics(self, endpoint: str) -> MetricsPort:
        try:
            return self.workspaces[endpoint.lower()]
        except KeyError:
            raise Forbidden(f"{endpoint} is not a configured query endpoint") from None

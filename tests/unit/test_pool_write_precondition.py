"""A pool is written only over the version the decision was made on, with or without an eTag
(shared.fleet.pool_writes, issue 23)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.fleet.pool_writes import changes, precondition
from shared.kernel.errors import Conflict
from shared.kernel.ports import PoolInfo

CLUSTER = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1"


def pool(**props: Any) -> PoolInfo:
    return PoolInfo(cluster_id=CLUSTER, name="gpu", properties={"count": 3, "provisioningState": "Succeeded", **props})


class Arm:
    """ARM as a fresh read sees it (and how often it was asked)."""

    def __init__(self, current: PoolInfo | None) -> None:
        self.current = current
        self.reads = 0

    def get_pool(self, cluster_id: str, name: str) -> PoolInfo | None:
        self.reads += 1
        return self.current


def test_a_pool_with_an_etag_is_written_under_it_without_another_read() -> None:
    arm = Arm(pool(count=9))
    assert precondition(arm, pool(eTag="abc")) == "abc"
    assert arm.reads == 0, "AKS compares the eTag itself, atomically"


def test_a_pool_without_an_etag_is_written_only_after_a_fresh_read_shows_it_unchanged() -> None:
    arm = Arm(pool())
    assert precondition(arm, pool()) is None
    assert arm.reads == 1


@pytest.mark.parametrize(("now", "named"), [
    pytest.param(pool(count=4), "count", id="an operator scaled it"),
    pytest.param(pool(provisioningState="Updating"), "provisioningState", id="an operation started"),
    pytest.param(pool(nodeLabels={"team": "b"}), "nodeLabels", id="a label was added"),
])
def test_a_pool_without_an_etag_that_changed_since_the_decision_is_not_written(now: PoolInfo, named: str) -> None:
    with pytest.raises(Conflict, match=named):
        precondition(Arm(now), pool())


def test_a_pool_without_an_etag_that_is_gone_is_not_written() -> None:
    with pytest.raises(Conflict, match="gone"):
        precondition(Arm(None), pool())


def test_changes_names_each_property_that_differs_once() -> None:
    assert changes(pool(), pool(count=4, maxPods=30)) == ["count", "maxPods"]

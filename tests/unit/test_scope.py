"""The fleet scope: the app never looks at, let alone touches, a cluster outside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from shared.fleet.scope import discover, in_scope
from shared.kernel.errors import NotFound
from shared.kernel.ports import ClusterInfo, MachineInfo, PoolInfo
from shared.settings import Settings

SUB_A = "11111111-1111-1111-1111-111111111111"
SUB_B = "22222222-2222-2222-2222-222222222222"
SUB_OTHER = "99999999-9999-9999-9999-999999999999"


def cid(sub: str, name: str, rg: str = "rg") -> str:
    return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.ContainerService/managedClusters/{name}"


def cluster(sub: str, name: str, tags: Mapping[str, str] | None = None) -> ClusterInfo:
    return ClusterInfo(id=cid(sub, name), name=name, subscription=sub, resource_group="rg", location="eastus",
                       tags=dict(tags or {}), node_resource_group=f"MC_rg_{name}")


TAG = ("gpu-fleet-steward", "enabled")

CASES = [
    ("tagged-in-a-subscription-in-scope", cluster(SUB_A, "c1", {"gpu-fleet-steward": "enabled"}), TAG, (), True),
    ("tag-key-differs-only-in-case", cluster(SUB_A, "c1", {"GPU-Fleet-Steward": "enabled"}), TAG, (), True),
    ("tag-value-differs", cluster(SUB_A, "c1", {"gpu-fleet-steward": "disabled"}), TAG, (), False),
    ("tag-value-differs-in-case", cluster(SUB_A, "c1", {"gpu-fleet-steward": "Enabled"}), TAG, (), False),
    ("untagged", cluster(SUB_A, "c1"), TAG, (), False),
    ("tagged-but-foreign-subscription", cluster(SUB_OTHER, "c1", {"gpu-fleet-steward": "enabled"}), TAG, (), False),
    ("empty-value-in-setting-accepts-any-value", cluster(SUB_A, "c1", {"gpu-fleet-steward": "x"}),
     ("gpu-fleet-steward", ""), (), True),
    ("listed-cluster-without-tag", cluster(SUB_B, "c2"), TAG, (cid(SUB_B, "c2"),), True),
    ("listed-cluster-id-in-another-case", cluster(SUB_B, "c2"), TAG, (cid(SUB_B, "c2").upper(),), True),
    ("tagged-but-not-in-the-list", cluster(SUB_A, "c1", {"gpu-fleet-steward": "enabled"}), TAG, (cid(SUB_B, "c2"),),
     False),
    ("listed-but-foreign-subscription", cluster(SUB_OTHER, "c9"), TAG, (cid(SUB_OTHER, "c9"),), False),
    ("subscription-field-lies-about-the-id",
     ClusterInfo(id=cid(SUB_OTHER, "c1"), name="c1", subscription=SUB_A, resource_group="rg", location="x",
                 tags={"gpu-fleet-steward": "enabled"}, node_resource_group="n"), TAG, (), False),
    ("no-tag-and-no-list", cluster(SUB_A, "c1", {"gpu-fleet-steward": "enabled"}), None, (), False),
]


@pytest.mark.parametrize(("info", "tag", "listed", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_scope_decisions(info: ClusterInfo, tag: tuple[str, str] | None, listed: tuple[str, ...],
                         expected: bool) -> None:
    ok, reason = in_scope(info, subscriptions=[SUB_A, SUB_B], cluster_tag=tag, cluster_ids=listed)
    assert ok is expected
    assert reason


class FakeAks:
    """Just enough of AksPort for discovery; records what was asked."""

    def __init__(self, clusters: Sequence[ClusterInfo]) -> None:
        self.clusters = {c.id.lower(): c for c in clusters}
        self.listed: list[str] = []
        self.got: list[str] = []

    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        self.listed.append(subscription)
        return [c for c in self.clusters.values() if c.subscription == subscription]

    def get_cluster(self, cluster_id: str) -> ClusterInfo:
        self.got.append(cluster_id)
        try:
            return self.clusters[cluster_id.lower()]
        except KeyError:
            raise NotFound(cluster_id) from None

    def list_pools(self, cluster_id: str) -> list[PoolInfo]:
        raise AssertionError("discovery does not list pools")

    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        raise AssertionError("discovery does not read pools")

    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], *, api_version: str | None = None) -> None:
        raise AssertionError("discovery never writes")

    def begin_delete_pool(self, cluster_id: str, pool: str, *, ignore_pdb: bool = False) -> None:
        raise AssertionError("discovery never writes")

    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Sequence[str]) -> None:
        raise AssertionError("discovery never writes")

    def list_machines(self, cluster_id: str, pool: str) -> list[MachineInfo]:
        raise AssertionError("discovery does not list machines")

    def list_maintenance_configurations(self, cluster_id: str) -> list[Mapping[str, Any]]:
        raise AssertionError("discovery does not read maintenance configurations")

    def kubeconfig(self, cluster_id: str) -> bytes:
        raise AssertionError("discovery never asks for credentials")


FLEET = [
    cluster(SUB_A, "a1", {"gpu-fleet-steward": "enabled"}),
    cluster(SUB_A, "a2"),
    cluster(SUB_B, "b1", {"gpu-fleet-steward": "enabled"}),
    cluster(SUB_OTHER, "x1", {"gpu-fleet-steward": "enabled"}),
]


def test_discovery_by_tag_lists_each_subscription_and_keeps_the_tagged_clusters() -> None:
    aks = FakeAks(FLEET)
    settings = Settings(subscriptions=(SUB_A, SUB_B), eventgrid_topic_endpoint="https://eg.example")
    found = discover(aks, settings)
    assert [c.name for c in found] == ["a1", "b1"]
    assert aks.listed == [SUB_A, SUB_B] and aks.got == []


def test_discovery_by_list_reads_only_the_listed_clusters_and_skips_missing_ones() -> None:
    aks = FakeAks(FLEET)
    settings = Settings(subscriptions=(SUB_A, SUB_B), eventgrid_topic_endpoint="https://eg.example",
                        cluster_ids=(cid(SUB_A, "a2"), cid(SUB_B, "gone")))
    found = discover(aks, settings)
    assert [c.name for c in found] == ["a2"]
    assert aks.listed == [] and aks.got == [cid(SUB_A, "a2"), cid(SUB_B, "gone")]

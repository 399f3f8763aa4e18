"""The plan says, before anything changes, which pools migrate, how, in what order, and why the rest wait."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from shared.fleet.pool_clone import MANAGED_GPU_PROFILE
from shared.kernel.ports import ClusterInfo, PoolInfo, Record
from shared.migration.plan import migration_id, plan, render_table, to_json
from shared.migration.policy import MigrationPolicy
from tests.unit.fakes_migration import cluster_id

NOW = 1_764_684_000.0  # 2025-12-02T14:00Z, a Tuesday
CID = cluster_id("c1")
CLUSTER = ClusterInfo(id=CID, name="c1", subscription="s", resource_group="rg", location="eastus",
                      tags={"gpu-fleet-steward": "enabled"}, node_resource_group="MC")


def pool(name: str, **props: Any) -> PoolInfo:
    base = {"vmSize": "Standard_NC4as_T4_v3", "count": 2, "osType": "Linux", "mode": "User",
            "provisioningState": "Succeeded", "nodeTaints": ["sku=gpu:NoSchedule"], "gpuProfile": {"driver": "Install"}}
    base.update(props)
    return PoolInfo(cluster_id=CID, name=name, properties=base)


def make_plan(pools: list[PoolInfo], *, policy: MigrationPolicy | None = None, migrations: list[Record] = (),  # type: ignore[assignment]
              maintenance: list | None = None, quotas: dict | None = None, clusters: list[ClusterInfo] | None = None):
    policy = policy or MigrationPolicy(max_concurrent=10)
    if quotas:  # (location, family) -> free vCPUs, as MIGRATION_GPU_VCPU_HEADROOM gives them
        policy = dataclasses.replace(policy, gpu_vcpu_headroom={f"{loc}:{fam}": v for (loc, fam), v in quotas.items()})
    return plan(clusters or [CLUSTER], {CID: pools}, migrations=list(migrations),
                maintenance_by_cluster={CID: maintenance or []}, policy=policy, now=NOW)


SKIPS = {
    "MIG by gpuInstanceProfile": (pool("mig", vmSize="Standard_ND96asr_v4", gpuInstanceProfile="MIG3g"), "mig"),
    "MIG by migStrategy": (pool("mig2", vmSize="Standard_NC24ads_A100_v4",
                                gpuProfile={"driver": "Install", "nvidia": {"migStrategy": "Single"}}), "mig"),
    "system pool": (pool("sysgpu", mode="System"), "system"),
    "Windows pool": (pool("win", osType="Windows"), "windows"),
    "AMD size": (pool("amd", vmSize="Standard_NV4as_v4"), "not-nvidia"),
    "pool still updating": (pool("busy", provisioningState="Updating"), "not-succeeded"),
}


@pytest.mark.parametrize(("candidate", "code"), SKIPS.values(), ids=SKIPS.keys())
def test_pools_that_must_not_migrate_are_skipped_with_their_reason(candidate: PoolInfo, code: str) -> None:
    result = make_plan([candidate])
    assert result.items == ()
    assert [(s.pool, s.code) for s in result.skipped] == [(candidate.name, code)]
    assert result.skipped[0].reason


def test_managed_and_non_gpu_pools_are_not_candidates_at_all() -> None:
    result = make_plan([pool("done", gpuProfile=MANAGED_GPU_PROFILE), pool("cpu", vmSize="Standard_D4s_v5")])
    assert result.items == () and result.skipped == ()


def test_an_unmanaged_gpu_pool_gets_an_item_with_a_cloned_managed_body_and_a_free_name() -> None:
    result = make_plan([pool("gpu", nodeLabels={"team": "a"}), pool("gpum1", gpuProfile=MANAGED_GPU_PROFILE)])
    (item,) = result.items
    assert item.pool == "gpu" and item.replacement == "gpum2"
    assert item.record_id == migration_id(CID, "gpu")
    assert item.body["gpuProfile"] == MANAGED_GPU_PROFILE and item.body["nodeLabels"] == {"team": "a"}


def test_a_pool_with_an_active_migration_is_skipped_and_its_replacement_name_stays_reserved() -> None:
    active = Record(kind="migration", id=migration_id(CID, "a"), state="draining",
                    data={"cluster_id": CID, "pool": "a", "replacement": "bm1"})
    result = make_plan([pool("a"), pool("b")], migrations=[active])
    assert [(s.pool, s.code) for s in result.skipped] == [("a", "migrating")]
    assert result.items[0].replacement == "bm2"


def test_a_pool_whose_migration_ended_is_not_retried_by_itself() -> None:
    ended = Record(kind="migration", id=migration_id(CID, "a"), state="rolled_back",
                   data={"cluster_id": CID, "pool": "a", "reason": "never healthy"})
    result = make_plan([pool("a")], migrations=[ended])
    assert result.skipped[0].code == "finished-before" and "never healthy" in result.skipped[0].reason


def test_a_cluster_outside_its_window_waits_for_it_rather_than_being_dropped() -> None:
    result = make_plan([pool("gpu")], policy=MigrationPolicy(window="Sat 01:00-06:00 UTC"))
    (skip,) = result.skipped
    assert skip.code == "window" and skip.reason.startswith("waiting for window") and skip.next_open and skip.next_open > NOW


def test_the_fleet_cap_counts_active_migrations_and_defers_the_rest_in_order() -> None:
    active = Record(kind="migration", id="x", state="creating", data={"cluster_id": CID, "pool": "other"})
    result = make_plan([pool("a"), pool("b"), pool("c")], policy=MigrationPolicy(max_concurrent=2), migrations=[active])
    assert [i.pool for i in result.items] == ["a"]
    assert [(s.pool, s.code) for s in result.skipped] == [("b", "cap"), ("c", "cap")]


STRATEGY = {
    "headroom unknown: rolling to be safe": (MigrationPolicy(max_concurrent=10), None, "rolling"),
    "headroom holds the whole replacement: surge": (MigrationPolicy(max_concurrent=10), 8, "surge"),
    "headroom holds one batch only: rolling": (MigrationPolicy(max_concurrent=10), 4, "rolling"),
    "forced surge": (MigrationPolicy(max_concurrent=10, strategy="surge"), None, "surge"),
    "forced rolling despite headroom": (MigrationPolicy(max_concurrent=10, strategy="rolling"), 100, "rolling"),
}


@pytest.mark.parametrize(("policy", "headroom", "strategy"), STRATEGY.values(), ids=STRATEGY.keys())
def test_the_strategy_follows_the_gpu_quota_unless_configured(policy: MigrationPolicy, headroom: int | None,
                                                               strategy: str) -> None:
    quotas = None if headroom is None else {("eastus", "standardncasv3_t4family"): headroom}
    (item,) = make_plan([pool("gpu")], policy=policy, quotas=quotas).items
    assert item.strategy == strategy and item.strategy_reason


def test_headroom_is_shared_between_pools_of_one_family() -> None:
    quotas = {("eastus", "standardncasv3_t4family"): 12}  # holds one T4 pool of 2 x 4 vCPUs, then one batch
    result = make_plan([pool("a"), pool("b"), pool("c")], quotas=quotas)
    assert [(i.pool, i.strategy) for i in result.items] == [("a", "surge"), ("b", "rolling")]
    assert [(s.pool, s.code) for s in result.skipped] == [("c", "quota")]


def test_headroom_from_the_policy_is_used_when_no_quota_is_observed() -> None:
    policy = MigrationPolicy(max_concurrent=10, gpu_vcpu_headroom={"eastus:standardncasv3_t4family": 100})
    assert make_plan([pool("gpu")], policy=policy).items[0].strategy == "surge"


def test_the_plan_renders_as_a_table_and_as_json_with_the_same_content() -> None:
    result = make_plan([pool("gpu"), pool("mig", vmSize="Standard_ND96asr_v4", gpuInstanceProfile="MIG1g")])
    table = render_table(result)
    assert "gpu" in table and "gpum1" in table and "rolling" in table and "mig" in table and "Skipped:" in table
    data = json.loads(json.dumps(to_json(result)))
    assert [i["pool"] for i in data["items"]] == ["gpu"] and [s["code"] for s in data["skipped"]] == ["mig"]
    assert data["items"][0]["body"]["gpuProfile"] == MANAGED_GPU_PROFILE


def test_pools_are_ordered_by_cluster_then_pool_name() -> None:
    other = ClusterInfo(id=cluster_id("a0"), name="a0", subscription="s", resource_group="rg", location="eastus",
                        tags={}, node_resource_group="MC")
    result = plan([CLUSTER, other], {CID: [pool("z"), pool("b")], other.id: [PoolInfo(cluster_id=other.id, name="q",
                                                                                     properties=pool("q").properties)]},
                  migrations=[], maintenance_by_cluster={}, policy=MigrationPolicy(max_concurrent=10), now=NOW)
    assert [(i.cluster_name, i.pool, i.order) for i in result.items] == [("a0", "q", 1), ("c1", "b", 2), ("c1", "z", 3)]


# --------------------------------------------------------------------------- issue 21: nothing is lost unsaid

TOMORROW = {
    "a property no api-version the app speaks has": (pool("tomorrow", somethingNew={"enabled": True}), "somethingNew"),
    "a nested property no api-version has": (
        pool("nested", kubeletConfig={"cpuManagerPolicy": "static", "aNewThreshold": "1Gi"}), "kubeletConfig.aNewThreshold"),
}


@pytest.mark.parametrize(("candidate", "field"), TOMORROW.values(), ids=TOMORROW.keys())
def test_a_pool_carrying_what_the_clone_cannot_carry_is_skipped_naming_it(candidate: PoolInfo, field: str) -> None:
    result = make_plan([candidate], policy=MigrationPolicy(enabled=True, max_concurrent=10))
    assert result.items == ()
    (skip,) = result.skipped
    assert skip.code == "unwritable" and field in skip.reason and "nothing is written" in skip.reason
    assert "unwritable" in render_table(result) and field in render_table(result)


def test_a_pool_with_preview_only_settings_is_planned_and_its_body_keeps_them() -> None:
    kubelet = {"cpuManagerPolicy": "static", "kubeReserved": {"cpuMillicores": 100}, "seccompDefault": "RuntimeDefault"}
    result = make_plan([pool("tuned", kubeletConfig=kubelet, nodeInitializationTaints=["boot=wait:NoSchedule"])],
                       policy=MigrationPolicy(enabled=True, max_concurrent=10))
    (item,) = result.items
    assert item.body["kubeletConfig"] == kubelet and item.body["nodeInitializationTaints"] == ["boot=wait:NoSchedule"]

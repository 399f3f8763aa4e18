"""A migrated pool is the old pool, property by property, as the AKS REST definitions describe it (issue 21).

Generated old pools (tests/agentpools.py: every writable property of the preview api-version's AgentPool
definition set, from the definition's types and enum values) are created on the simulator by the harness,
as their owners would create them. Then the app's own code runs: discovery reads the pool
(``AksClient.list_pools``), the plan clones it (``shared.migration.plan.plan``), the adapter creates the
replacement on the api-version its body needs, and the replacement ARM returns is compared with the old
pool ARM returns, row by row of ``shared.fleet.pool_clone.CLONE_TABLE``. The old pool's autoscaler-off
rewrite (``frozen_old_pool``) and its restore on rollback go through the same check.

Removing any row of the table makes the plan skip the pool (``unwritable``) and this test fail; sending a
body on an api-version that lacks one of its properties makes the simulator drop it (it keeps what ARM
keeps: shared.kernel.definitions, sim/arm/common.py ``project``) and this test fail.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import ssl
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.fleet.pool_clone import (
    CLONE_TABLE,
    COPY,
    MANAGED_GPU_PROFILE,
    OMIT,
    RESERVED_LABEL_PREFIXES,
    SET,
    TAG_AUTOSCALER,
    TAG_MIGRATED_FROM,
    frozen_old_pool,
    replacement_count,
)
from shared.kernel import definitions
from shared.kernel.clock import ManualClock
from shared.kernel.ports import PoolInfo
from shared.migration.plan import plan
from shared.migration.policy import MigrationPolicy
from tests.agentpools import LINKED_RG, pools

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app

SUB = "8f2d4c1e-5a3b-4c7d-9e0f-0000000000c1"
PREVIEW = definitions.definitions(definitions.PREVIEW_API_VERSION)
SIZES = ["Standard_NC4as_T4_v3", "Standard_NC8as_T4_v3", "Standard_NC24ads_A100_v4"]
EXAMPLES = 200
# ARM and the simulator own these: state, not configuration (their rows say so), or chosen at creation.
SERVER_SET = frozenset({"eTag", "provisioningState", "currentOrchestratorVersion", "nodeImageVersion", "powerState",
                        "status", "virtualMachineNodesStatus"})


def scenario() -> dict[str, Any]:
    return {
        "seed": 21, "clock": {"manual": True},
        # Operations of one sim second, so that 200 pools live within one token's lifetime of sim time.
        "timings": {"pool_create_s": 1, "pool_delete_s": 1, "pool_scale_s": 1, "pool_update_s": 1,
                    "node_ready_s": 1},
        "arm_linked_resource_groups": [LINKED_RG],
        "subscriptions": [{
            "id": SUB,
            "quotas": [{"location": "eastus", "family": family, "limit": 1_000_000}
                       for family in ("standardNCASv3_T4Family", "StandardNCADSA100v4Family", "lowPriorityCores",
                                      "standardDSv5Family")],
            "clusters": [{"name": "roundtrip", "resource_group": "rg-roundtrip", "location": "eastus",
                          "tags": {"gpu-fleet-steward": "enabled"},
                          "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}],
        }],
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=scenario()) as handle:
        yield handle


@pytest.fixture(scope="module")
def world(sim: SimHandle) -> dict[str, Any]:
    from shared.fleet import scope
    from shared.wiring import FleetAccess

    settings_ = app_settings(sim)
    aks = FleetAccess(settings_, clock=ManualClock()).aks()
    cluster = next(c for c in scope.discover(aks, settings_) if c.name == "roundtrip")
    return {"aks": aks, "cluster": cluster, "token": sim.token("https://management.azure.com/"),
            "names": (f"rt{n}" for n in itertools.count(1))}


def owner_put(sim: SimHandle, world: dict[str, Any], pool: str, props: Mapping[str, Any]) -> None:
    """The pool's owner creates it (the harness as the subscription's owner, on the preview api-version)."""
    url = (f"{sim.endpoints['arm_endpoint'].rstrip('/')}{world['cluster'].id}/agentPools/{pool}"
           f"?api-version={definitions.PREVIEW_API_VERSION}")
    request = urllib.request.Request(url, data=json.dumps({"properties": props}).encode(), method="PUT",
                                     headers={"Authorization": f"Bearer {world['token']}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=sim.ca_bundle), timeout=30) as response:
        assert response.status in (200, 201), response.status


def settle(sim: SimHandle) -> None:
    sim.control("POST", "/advance", {"seconds": 2})


def writable(props: Mapping[str, Any]) -> dict[str, Any]:
    return PREVIEW.writable(props)


def assert_copied(old: Mapping[str, Any], new: Mapping[str, Any], *, what: str) -> None:
    for key, rule in CLONE_TABLE.items():
        if rule.action == COPY:
            assert writable({key: old.get(key)}) == writable({key: new.get(key)}), f"{what}: {key} not copied"


def check_replacement(old: PoolInfo, new: PoolInfo, body: Mapping[str, Any]) -> None:
    """Every row of the table, checked: copied as read, set as the rule says, omitted from the body."""
    before, after = old.properties, new.properties
    assert_copied(before, after, what=f"replacement of {old.name}")
    for key, rule in CLONE_TABLE.items():
        if rule.action == OMIT:
            assert key not in body, f"{key} is omitted by its row but was sent"
        elif rule.action == SET:
            assert key in body, f"{key} is set by its row but was not sent"
    labels = {k: v for k, v in (before.get("nodeLabels") or {}).items() if not k.startswith(RESERVED_LABEL_PREFIXES)}
    assert (after.get("nodeLabels") or {}) == labels
    tags = {**(before.get("tags") or {}), TAG_MIGRATED_FROM: old.name}
    if before.get("enableAutoScaling"):
        tags[TAG_AUTOSCALER] = f"{before.get('minCount')}-{before.get('maxCount')}"
    assert after.get("tags") == tags
    assert after.get("gpuProfile") == dict(MANAGED_GPU_PROFILE)
    assert after.get("count") == replacement_count(before)
    assert after.get("enableAutoScaling") is False
    assert after.get("minCount") is None and after.get("maxCount") is None
    assert after.get("gpuInstanceProfile") is None and after.get("creationData") is None


def check_rewrite(old: Mapping[str, Any], new: Mapping[str, Any], *, changed: set[str], what: str,
                  only_old: bool = False) -> None:
    """``new`` is ``old`` on every property but ``changed`` and what ARM sets itself (``only_old``: on the
    properties ``old`` has; ARM adds its defaults to the others)."""
    keys = (set(old) if only_old else set(old) | set(new)) - changed - SERVER_SET
    differ = sorted(k for k in keys if writable({k: old.get(k)}) != writable({k: new.get(k)}))
    assert differ == [], f"{what}: {differ} changed"


@settings(max_examples=20, deadline=None, database=None)
@given(generated=pools(PREVIEW, sizes=SIZES))
def test_every_row_of_the_table_is_exercised_by_the_generated_pools(generated: dict[str, Any]) -> None:
    """The generator sets every property a create may carry, so a row removed from the table is met."""
    writable_names = {k for k, p in PREVIEW.pool_properties().items() if not p.read_only and "create" in p.visibility}
    always = writable_names - {"gpuInstanceProfile", "orchestratorVersion", "minCount", "maxCount",
                               "scaleSetPriority", "scaleSetEvictionPolicy", "spotMaxPrice"}  # spot pools only
    assert always <= set(generated), sorted(always - set(generated))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(props=pools(PREVIEW, sizes=SIZES), restore_autoscaler=st.booleans())
def test_a_generated_pool_survives_discovery_plan_creation_freeze_and_restore(
        sim: SimHandle, world: dict[str, Any], props: dict[str, Any], restore_autoscaler: bool) -> None:
    aks, cluster = world["aks"], world["cluster"]
    name = next(world["names"])
    owner_put(sim, world, name, props)
    settle(sim)

    # Discovery: the pool as the app reads it, every generated property kept.
    old = next(p for p in aks.list_pools(cluster.id) if p.name == name)
    check_rewrite(props, old.properties, changed={"count"} if props.get("enableAutoScaling") else set(),
                  what="the owner's pool as read", only_old=True)

    # Plan: the pool is a candidate and its replacement body is the clone.
    policy = MigrationPolicy(enabled=True, strategy="surge", max_concurrent=1000)
    result = plan([cluster], {cluster.id: [old]}, migrations=[], maintenance_by_cluster={}, policy=policy,
                  now=sim.control("GET", "/clock")["now"])
    assert [s.reason for s in result.skipped] == []
    (item,) = result.items

    # The replacement, created by the adapter on the api-version its body needs.
    aks.begin_put_pool(cluster.id, item.replacement, {"properties": item.body}, create_only=True)
    settle(sim)
    new = aks.get_pool(cluster.id, item.replacement)
    assert new is not None and new.provisioning_state == "Succeeded"
    check_replacement(old, new, item.body)

    # The old pool's autoscaler off while it drains, then back on a rollback.
    aks.begin_put_pool(cluster.id, name, {"properties": frozen_old_pool(old, enable_autoscaling=False)}, etag=old.etag)
    settle(sim)
    frozen = aks.get_pool(cluster.id, name)
    assert frozen is not None and frozen.properties.get("enableAutoScaling") is False
    check_rewrite(old.properties, frozen.properties, changed={"enableAutoScaling", "minCount", "maxCount"},
                  what="the frozen old pool")
    if old.properties.get("enableAutoScaling") and restore_autoscaler:
        body = frozen_old_pool(frozen, enable_autoscaling=True, min_count=old.properties["minCount"],
                               max_count=old.properties["maxCount"])
        aks.begin_put_pool(cluster.id, name, {"properties": body}, etag=frozen.etag)
        settle(sim)
        restored = aks.get_pool(cluster.id, name)
        assert restored is not None
        check_rewrite(old.properties, restored.properties, changed=set(), what="the restored old pool")

    for pool in (name, item.replacement):
        aks.begin_delete_pool(cluster.id, pool)
    settle(sim)

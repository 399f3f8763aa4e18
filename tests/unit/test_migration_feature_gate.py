"""A migration whose replacement AKS refuses for an unregistered preview feature blocks, and its
reason tells the subscription's owner how to register the feature (issue 10, ARM 4).

The refusal arrives as the adapter's ``FeatureNotRegistered`` (shared.adapters.arm.map_arm_error, decided by
the error code ``PreviewFeatureNotRegistered``); the core never reads the message text for it.
"""

from __future__ import annotations

from shared.kernel.errors import FeatureNotRegistered
from shared.migration.planner import run_planner
from shared.migration.policy import MigrationPolicy
from tests.unit.test_migration import World


def test_a_replacement_refused_for_an_unregistered_preview_feature_blocks_with_how_to_register_it() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge"))
    world.fleet.fail_next["begin_put_pool"] = FeatureNotRegistered(
        "Preview feature Microsoft.ContainerService/ManagedGPUExperiencePreview not registered.",
        code="PreviewFeatureNotRegistered", feature="Microsoft.ContainerService/ManagedGPUExperiencePreview")
    run_planner(world.ctx())
    record = world.drive()
    assert record.state == "blocked"
    reason = str(record.data.get("reason") or record.data.get("last_note") or "")
    assert "az feature register --namespace Microsoft.ContainerService --name ManagedGPUExperiencePreview" in reason
    assert world.pool("gpu") is not None and world.pool(str(record.data["replacement"])) is None
    blocked = [e for e in world.events.published if e["type"].endswith("Migration.Blocked")]
    assert blocked and "az feature register" in str(blocked[-1]["data"])


def test_a_migration_whose_pool_gains_a_property_the_clone_cannot_carry_blocks_before_any_write() -> None:
    """Issue 21: the migration started, then the old pool got a setting no api-version the app speaks has (set
    through a newer one): the next step re-reads the pool, refuses it naming the property, and writes nothing
    more."""
    from shared.migration.records import KIND

    world = World(policy=MigrationPolicy(enabled=True, strategy="surge"))
    run_planner(world.ctx())
    (planned,) = world.ledger.list(KIND)
    world.fleet.aks.pool_props(world.cid, "gpu")["kubeletConfig"] = {"aThresholdOfTomorrow": "1Gi"}
    writes_before = len(world.fleet.aks.writes)
    record = world.drive()
    assert record.id == planned.id and record.state == "blocked"
    assert "kubeletConfig.aThresholdOfTomorrow" in str(record.data.get("reason"))
    assert world.fleet.aks.writes[writes_before:] == []  # neither pool written after the change
    assert world.pool("gpu") is not None

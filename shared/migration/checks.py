"""Whether ARM agrees that a migration may act: a ledger row is only a claim.

Whoever can write the ledger table can write any row, so before any step writes, the row must
agree with itself (:func:`shared.migration.plan.record_problems`), its cluster must be in the
fleet's scope, its old pool must be one the planner would migrate, of the recorded size, and its
replacement must be the managed pool of that size this app created for that old pool (tagged
``TAG_MIGRATED_FROM``, which only this app sets: shared.fleet.pool_clone). Each function here
answers "why not" ("" = it may), from what ARM showed; only :func:`refusal` reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.fleet import gpu_sizes, scope
from shared.fleet.pool_clone import TAG_AUTOSCALER, TAG_MIGRATED_FROM
from shared.kernel.ports import ClusterInfo, PoolInfo, Record
from shared.migration import plan as migration_plan
from shared.migration.records import AutoscalerBounds, MigrationData, MigrationState

if TYPE_CHECKING:
    from shared.kernel.context import Context


def _tagged_from(pool: PoolInfo) -> str:
    return str((pool.properties.get("tags") or {}).get(TAG_MIGRATED_FROM) or "")


def pool_refusal(d: MigrationData, old: PoolInfo) -> str:
    """Why ARM says ``old`` is not a pool this migration may act on: the planner's own rules
    (:func:`shared.migration.plan.pool_ineligibility`: an unmanaged NVIDIA Linux User pool, not MIG),
    and the size the record was planned for."""
    found = migration_plan.pool_ineligibility(old, size=gpu_sizes.lookup(old.vm_size))
    if found is not None:
        return found[1]
    if not d.vm_size or old.vm_size.lower() != d.vm_size.lower():
        return f"{old.name} is {old.vm_size or 'of no size'}, not the recorded {d.vm_size or '(none)'}"
    return ""


def replacement_refusal(d: MigrationData, new: PoolInfo) -> str:
    """Why ARM says ``new`` is not this migration's replacement."""
    if _tagged_from(new) != d.pool:
        return f"{new.name} does not carry {TAG_MIGRATED_FROM}={d.pool}: it was not created by a migration of {d.pool}"
    if new.management_mode != "Managed":
        return f"the replacement {new.name} is not managed"
    if new.vm_size.lower() != d.vm_size.lower():
        return f"the replacement {new.name} is {new.vm_size}, not {d.vm_size or '(none)'}"
    return ""


def autoscaler_refusal(was: AutoscalerBounds, new: PoolInfo | None, name: str) -> str:
    """Why the recorded autoscaler bounds are not restored: they must be those the replacement,
    tagged by this app when it cloned the old pool, remembers in ``TAG_AUTOSCALER``."""
    bounds = f"{was.min}-{was.max}"
    if new is None:
        return f"the replacement {name}, which remembers the old bounds, is gone: restore {bounds} by hand if right"
    tagged = str((new.properties.get("tags") or {}).get(TAG_AUTOSCALER) or "")
    if tagged != bounds:
        return f"the recorded bounds {bounds} are not the ones {name} was tagged with ({tagged or 'none'})"
    return ""


def old_pool_refusal(d: MigrationData, old: PoolInfo, new: PoolInfo | None) -> str:
    """Why ARM says ``old`` is not the pool this migration may delete: it must still be the unmanaged
    User pool of the recorded size, and its managed replacement, of the same size, must exist carrying
    ``TAG_MIGRATED_FROM=<old>``."""
    pool, name = old.name, d.replacement
    if old.management_mode == "Managed":
        return f"{pool} has a managed GPU profile: it is not the unmanaged pool this migration replaces"
    if str(old.properties.get("mode") or "User") != "User":
        return f"{pool} is a {old.properties.get('mode')} pool, not a User pool"
    if not d.vm_size or old.vm_size.lower() != d.vm_size.lower():
        return f"{pool} is {old.vm_size or 'of no size'}, not the recorded {d.vm_size or '(none)'}"
    if new is None:
        return f"the replacement {name or '(none recorded)'} does not exist: {pool} is not deleted without it"
    return replacement_refusal(d, new)


def refusal(ctx: Context, record: Record, d: MigrationData, cluster: ClusterInfo | None) -> str:
    """Why this record may not take its next step, from ARM's truth (see the module docstring).
    ``d`` is the record's data, already read; ``record_problems`` was checked before reading it."""
    if cluster is None:
        return f"the cluster {d.cluster_id} does not exist in ARM"
    inside, why = scope.cluster_in_scope(cluster, ctx.settings)
    if not inside:
        return f"the cluster {cluster.name} is out of the fleet's scope: {why}"
    aks = ctx.access.aks()
    old = aks.get_pool(d.cluster_id, d.pool)
    if old is not None:
        problem = pool_refusal(d, old)  # a managed pool included: AKS never turns a pool managed in place
        if problem:
            return problem
    if record.state != MigrationState.PLANNED:
        new = aks.get_pool(d.cluster_id, d.replacement)
        if new is not None:
            return replacement_refusal(d, new)
    return ""

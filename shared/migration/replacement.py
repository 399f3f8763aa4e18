"""The replacement pool: created as the managed clone of the old one, proven to work, grown when rolling.

AKS cannot turn an existing GPU pool into a managed one, so a migration creates a replacement
(cloned by :mod:`shared.fleet.pool_clone`), proves its GPU stack works (:mod:`shared.fleet.stack`)
and checks that the old pool's pods would fit on it (:mod:`shared.migration.fit`), before anything
on the old pool is touched. What is created is the clone of the pool ARM shows, at most its size:
never a body the row made up. A surge refused for want of quota falls back to rolling: one batch
first, then one more batch per drained batch of the old pool (:func:`grow_phase`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from shared.drain.parallel import bounded_map
from shared.fleet.pool_clone import TAG_MIGRATED_FROM
from shared.fleet.stack import evaluate_stack
from shared.kernel.errors import Conflict, FeatureNotRegistered, Invalid, QuotaExceeded
from shared.kernel.ports import NodeView, PoolInfo, Record
from shared.kernel.steps import Transition
from shared.migration import plan as migration_plan
from shared.migration.draining import drain_preflight
from shared.migration.fit import NodeShape, body_taints, fit_problems, predicted_labels
from shared.migration.policy import MigrationPolicy
from shared.migration.proofs import fit_refusal
from shared.migration.reads import closed_window, etag, old_pods, pool_nodes
from shared.migration.records import ACTIVE_STATES, KIND, MigrationData, MigrationState, Phase, Strategy, read
from shared.migration.transitions import blocked, changed, moved, parts, publication, wait

if TYPE_CHECKING:
    from shared.kernel.context import Context

MANAGED_GPU_FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"  # what AKS names when it refuses


def put_replacement(ctx: Context, d: MigrationData, *, count: int, existing: PoolInfo | None) -> None:
    """PUT the recorded replacement body with ``count`` nodes. Over ``existing`` (the replacement as read
    and verified) its eTag is sent as If-Match, so a pool changed since is not written (412 -> Conflict).
    With none the PUT creates the replacement and sends If-None-Match: * : a pool someone made under
    that name since the read is never overwritten (412 -> Conflict; the next step finds it and refuses
    it for want of the migrated-from tag)."""
    body = {**d.body, "count": count}
    aks = ctx.access.aks()
    aks.begin_put_pool(d.cluster_id, d.replacement, {"properties": body}, etag=etag(aks, existing),
                       create_only=existing is None)


def _started_elsewhere(ctx: Context, record: Record) -> int:
    active = sorted(s for s in ACTIVE_STATES if s != MigrationState.PLANNED)
    return sum(1 for r in ctx.ledger.list(KIND, states=active) if r.id != record.id)


def _creation_refused(d: MigrationData, exc: Invalid) -> str:
    """Why the replacement was not created; for an unregistered preview feature, how to register it
    (https://learn.microsoft.com/azure/azure-resource-manager/management/preview-features)."""
    if not isinstance(exc, FeatureNotRegistered):
        return f"creating the replacement was refused: {exc.reason}"
    feature = exc.feature or MANAGED_GPU_FEATURE
    namespace, _, name = feature.partition("/")
    sub = d.cluster_id.split("/")[2]
    return (f"creating the replacement was refused: subscription {sub} has not registered the preview feature "
            f"{feature}, which managed GPU pools need; an owner runs az feature register --namespace {namespace} "
            f"--name {name} --subscription {sub}, waits for it to show Registered, runs az provider register "
            f"--namespace {namespace} --subscription {sub}, and removes this migration's record to start it again "
            f"(Azure said: {exc.reason})")


def _fit_before_creating(ctx: Context, record: Record, d: MigrationData, old_nodes: Sequence[NodeView], *,
                         now: float, policy: MigrationPolicy) -> str:
    """Why the replacement must not be created: the old pods would not fit it, or the drain would refuse one."""
    kube = ctx.access.kube(d.cluster_id)
    shapes = [NodeShape(predicted_labels(n, old_pool=d.pool, new_pool=d.replacement), body_taints(d.body), n.allocatable)
              for n in old_nodes]
    names = [n.name for n in old_nodes]  # each node's pods listed once, for the fit and the drain checks
    listed = dict(zip(names, bounded_map(lambda n: kube.list_pods(node_name=n), names, name="drain-list"), strict=True))
    problems = fit_problems(old_pods(kube, old_nodes, listed), shapes=shapes, node_count=int(d.body.get("count") or 0))
    if problems:
        return "the old pool's pods would not fit the replacement: " + "; ".join(problems[:5])
    # A pod the drain would refuse (no controller, emptyDir under "refuse", two PDBs) would block the
    # migration at its first batch with both pools billed: say so before a GPU is bought.
    refusal = drain_preflight(ctx, d, names, now=now, policy=policy, listed=listed)
    if refusal:
        return "drain refused before evicting anything (checked before creating the replacement): " + refusal
    return ""


def step_planned(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    if not policy.enabled:  # the planner records nothing then (shared.migration.planner.run_planner)
        return blocked(record, now=now, reason="nothing is created: MIGRATION_ENABLED is false, so this app starts no "
                       "migration and its planner wrote no planned row; set it to true and delete this record to plan again")
    waiting = closed_window(ctx, record, now=now, policy=policy)
    if waiting is not None:
        return waiting
    if _started_elsewhere(ctx, record) >= policy.max_concurrent:
        return wait(record, now=now, until=now + policy.poll_interval_s * 4,
                    why=f"fleet cap of {policy.max_concurrent} concurrent migrations reached")
    d = read(record.data)
    aks = ctx.access.aks()
    old = aks.get_pool(d.cluster_id, d.pool)
    if old is None:
        return blocked(record, now=now, reason=f"the old pool {d.pool} no longer exists")
    if old.operation_ended_undone:
        return blocked(record, now=now, reason=f"the old pool {d.pool} is {old.provisioning_state} (its last operation "
                       "ended without finishing): nothing was created; once it is Succeeded again, remove this row "
                       "to migrate it")
    if old.provisioning_state != "Succeeded":
        return wait(record, now=now, until=now + policy.poll_interval_s, why=f"old pool is {old.provisioning_state}")
    # What is created is the managed clone of the pool ARM shows, at most its size: never a body the row made up.
    unlike = migration_plan.body_problems(old, record)
    full, bound = int(d.body.get("count") or 0), migration_plan.count_bound(old)
    if not unlike and full > bound:
        unlike = f"the recorded replacement has {full} nodes; {d.pool} has {old.count} (at most {bound})"
    if unlike:
        return blocked(record, now=now, reason=f"nothing is created: {unlike}")
    existing = aks.get_pool(d.cluster_id, d.replacement)
    if existing is not None and (existing.properties.get("tags") or {}).get(TAG_MIGRATED_FROM) != d.pool:
        return blocked(record, now=now, reason=f"a pool named {d.replacement} exists and was not created by this migration")
    old_nodes = pool_nodes(ctx.access.kube(d.cluster_id), d.pool)
    if existing is None and old_nodes:
        problem = _fit_before_creating(ctx, record, d, old_nodes, now=now, policy=policy)
        if problem:
            return blocked(record, now=now, reason=problem)
    strategy, batch = d.strategy, d.batch_size
    switched: dict[str, str] = {}
    if existing is None:
        count = full if strategy == Strategy.SURGE else min(full, batch)
        try:
            put_replacement(ctx, d, count=count, existing=None)
        except Invalid as exc:
            if not isinstance(exc, QuotaExceeded) or strategy != Strategy.SURGE:
                return blocked(record, now=now, reason=_creation_refused(d, exc))
            count = min(full, batch)
            switched = {"strategy": Strategy.ROLLING,
                        "strategy_switched": f"surge refused by quota ({exc.reason}); switched to rolling"}
            try:
                put_replacement(ctx, d, count=count, existing=None)
            except Invalid as again:
                return blocked(record, now=now, reason=f"GPU quota cannot hold one batch of the replacement: {again.reason}",
                               data=changed(d, **switched))
    else:
        count = existing.count
        if strategy == Strategy.SURGE and count < full:
            # A crash after a quota-driven switch lost the record's copy of it: the pool says rolling.
            switched = {"strategy": Strategy.ROLLING,
                        "strategy_switched": f"the replacement exists with {count} of {full} nodes: continuing rolling"}
    after = msgspec.structs.replace(d, replacement_count=count, create_deadline=now + policy.create_timeout_s, **switched)
    done = moved(record, MigrationState.CREATING, now=now,
                 note=switched.get("strategy_switched", f"creating {d.replacement} with {count} nodes"), **changed(after))
    return done.publish(*parts(publication(done.record, "Started", replacement_count=count)))


def step_creating(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    d = read(record.data)
    new = ctx.access.aks().get_pool(d.cluster_id, d.replacement)
    deadline = d.create_deadline or now
    if new is None:
        if now > deadline:
            return moved(record, MigrationState.ROLLING_BACK, now=now, note="the replacement never appeared",
                         reason="replacement never appeared")
        return moved(record, MigrationState.PLANNED, now=now, note="the replacement is not there: creating it again")
    state = new.provisioning_state
    if state == "Succeeded":
        return moved(record, MigrationState.VALIDATING, now=now, note=f"{new.name} provisioned; validating its GPU stack",
                     validate_deadline=now + policy.validate_timeout_s)
    if new.operation_ended_undone or now > deadline:
        reason = f"the replacement is {state}" if new.operation_ended_undone else "the replacement took too long to create"
        return moved(record, MigrationState.ROLLING_BACK, now=now, note=reason, reason=reason)
    return wait(record, now=now, until=now + policy.poll_interval_s, why=f"replacement is {state}")


def step_validating(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    d = read(record.data)
    new = ctx.access.aks().get_pool(d.cluster_id, d.replacement)
    if new is None:
        return moved(record, MigrationState.ROLLING_BACK, now=now, note="the replacement disappeared",
                     reason="replacement disappeared")
    kube = ctx.access.kube(d.cluster_id)
    nodes = pool_nodes(kube, d.replacement)
    report = evaluate_stack(pool=new, nodes=nodes, expected_count=d.replacement_count, now=now)
    if not report.ok:
        if now > (d.validate_deadline or now):
            reason = "the replacement did not become healthy: " + "; ".join(report.problems[:5])
            return moved(record, MigrationState.ROLLING_BACK, now=now, note=reason, reason=reason)
        return wait(record, now=now, until=now + policy.poll_interval_s, why="; ".join(report.problems[:3]))
    problems = fit_refusal(kube, d, nodes, pool_nodes(kube, d.pool))
    if problems:
        return moved(record, MigrationState.ROLLING_BACK, now=now, note=problems, reason=problems,
                     final=MigrationState.BLOCKED.value)
    return moved(record, MigrationState.CORDONING, now=now, note=f"{d.replacement} is healthy ({report.ready_nodes} nodes, "
                 f"{report.gpu_allocatable} GPUs)")


def grow_phase(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    """Rolling: add one batch to the replacement (between drained batches of the old pool), then prove it."""
    d = read(record.data)
    aks = ctx.access.aks()
    total = d.nodes_total or int(d.body.get("count") or 0)
    target = max(min(total, len(d.removed) + d.batch_size), d.replacement_count)
    new = aks.get_pool(d.cluster_id, d.replacement)
    if new is None:
        return blocked(record, now=now, reason="the replacement disappeared during a rolling migration")
    d = msgspec.structs.replace(d, grow_deadline=d.grow_deadline or now + policy.validate_timeout_s)
    if new.provisioning_state != "Succeeded":  # an operation is running (ours, most likely): never stack PUTs
        if new.operation_ended_undone or now > d.grow_deadline:
            return blocked(record, now=now, data=changed(d),
                           reason=f"the replacement stayed {new.provisioning_state} while growing to {target} nodes")
        return wait(record, now=now, until=now + policy.poll_interval_s, why=f"{d.replacement} is {new.provisioning_state}",
                    **changed(d))
    # The row's counts are claims too: one grow adds at most one batch (the record's, never more than
    # MIGRATION_BATCH_SIZE) to what ARM shows, and grows happen only between drained batches of the old pool.
    target = min(target, new.count + max(1, min(d.batch_size, policy.batch_size)))
    if new.count < target:
        waiting = closed_window(ctx, record, now=now, policy=policy)
        if waiting is not None:
            return waiting.with_data(grow_deadline=d.grow_deadline)
        try:
            put_replacement(ctx, d, count=target, existing=new)
        except Conflict as exc:
            return wait(record, now=now, until=now + policy.poll_interval_s, **changed(d),
                        why=f"{d.replacement} was not written ({type(exc).__name__}: {exc}): looking again")
        except Invalid as exc:
            return blocked(record, now=now, reason=f"growing the replacement to {target} nodes was refused: {exc.reason}",
                           data=changed(d))
        return wait(record, now=now, until=now + policy.poll_interval_s, why=f"growing {d.replacement} to {target} nodes",
                    **changed(d))
    report = evaluate_stack(pool=new, nodes=pool_nodes(ctx.access.kube(d.cluster_id), d.replacement),
                            expected_count=target, now=now)
    if not report.ok:
        if now > d.grow_deadline:
            return blocked(record, now=now, data=changed(d),
                           reason=f"the replacement did not become healthy at {target} nodes: " + "; ".join(report.problems[:5]))
        return wait(record, now=now, until=now + policy.poll_interval_s, why="; ".join(report.problems[:3]), **changed(d))
    return moved(record, MigrationState.DRAINING, now=now, note=f"{d.replacement} healthy at {target} nodes",
                 **changed(d, phase=Phase.DRAIN, replacement_count=target, grow_deadline=0.0))

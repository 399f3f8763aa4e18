"""The migration timer: plan, record each planned item, and take each new record's first step.

``run_planner`` turns the plan of :mod:`shared.migration.plan` into records: the record id is
derived from (cluster, pool), so create-if-absent guarantees one migration per pool even when two
hosts plan at once. It then takes each new record's first step itself, through the reconciler's
claim, with the cluster's Kubernetes client already built, rather than leaving it to the
reconciler's next tick: the record's clock starts when the app is ready to act on it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shared.fleet import scope
from shared.kernel.errors import Conflict, NotFound, StewardError
from shared.kernel.ports import ClusterInfo, PoolInfo, Record
from shared.kernel.reconciler import ReconcileReport, advance_record
from shared.migration import plan as migration_plan
from shared.migration import steps
from shared.migration.plan import Plan, PlanItem
from shared.migration.policy import MigrationPolicy
from shared.migration.records import ACTIVE_STATES, KIND, MigrationData, MigrationState, Phase, Strategy, written
from shared.migration.transitions import publication, publisher

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.migration")


def _observe(ctx: Context) -> tuple[list[ClusterInfo], dict[str, list[PoolInfo]], dict[str, list[Mapping[str, Any]]]]:
    aks = ctx.access.aks()
    clusters = []
    pools: dict[str, list[PoolInfo]] = {}
    maintenance: dict[str, list[Mapping[str, Any]]] = {}
    for cluster in scope.discover(aks, ctx.settings):
        try:
            pools[cluster.id] = aks.list_pools(cluster.id)
            try:
                maintenance[cluster.id] = list(aks.list_maintenance_configurations(cluster.id))
            except NotFound:
                maintenance[cluster.id] = []
        except StewardError as exc:  # one unreadable cluster never hides the rest of the fleet's plan
            log.warning("cluster %s left out of the migration plan: %s", cluster.id, exc)
            continue
        clusters.append(cluster)
    return clusters, pools, maintenance


def observe_plan(ctx: Context) -> Plan:
    """Discover and plan, changing nothing (the CLI's ``plan``)."""
    clusters, pools, maintenance = _observe(ctx)
    return migration_plan.plan(clusters, pools, migrations=ctx.ledger.list(KIND), maintenance_by_cluster=maintenance,
                               policy=ctx.settings.migration or MigrationPolicy(), now=ctx.clock.now())


def record_for(item: PlanItem, *, now: float) -> Record:
    """The record of a planned item, exactly as the plan printed it."""
    data = MigrationData(
        cluster_id=item.cluster_id, cluster_name=item.cluster_name, location=item.location, pool=item.pool,
        replacement=item.replacement, vm_size=item.vm_size, node_count=item.node_count,
        strategy=Strategy(item.strategy), strategy_reason=item.strategy_reason, batch_size=item.batch_size,
        family=item.family, vcpus_per_node=item.vcpus_per_node, gpus_per_node=item.gpus_per_node, order=item.order,
        body=item.body, quota=item.quota or item.family, autoscaler=item.autoscaler, phase=Phase.DRAIN)
    state = MigrationState.PLANNED
    return Record(kind=KIND, id=item.record_id, state=state, data=written(data), next_at=now, created_at=now,
                  updated_at=now, history=[{"at": now, "state": state.value, "note": item.strategy_reason}])


def _warm_clients(ctx: Context, plan: Plan) -> None:
    """Build the Kubernetes clients the first steps will need (a cold worker imports the client here).

    Best effort: a cluster whose client cannot be built now is left to the step, which reports why.
    """
    for cluster_id in sorted({item.cluster_id for item in plan.items}):
        try:
            ctx.access.kube(cluster_id)
        except StewardError as exc:
            log.info("Kubernetes client of %s not built ahead of its migration: %s", cluster_id, exc)


def run_planner(ctx: Context, *, start: bool = True) -> Plan:
    """The timer: plan, then record each planned item (create-if-absent) when migrations are enabled.

    With ``start`` (the timer's default) each record this call created is advanced at once, through
    the reconciler's claim (so never by two instances), instead of waiting for the reconciler's tick.
    """
    plan = observe_plan(ctx)
    policy = ctx.settings.migration or MigrationPolicy()
    if not policy.enabled or ctx.settings.paused:
        log.info("migration plan (not started: %s): %d items, %d skipped",
                 "STEWARD_PAUSED" if policy.enabled else "MIGRATION_ENABLED=false", len(plan.items), len(plan.skipped))
        return plan
    if start and plan.items:
        _warm_clients(ctx, plan)
    now = ctx.clock.now()
    publish = publisher(ctx)
    created_records: list[Record] = []
    for item in plan.items:
        if ctx.ledger.get(KIND, item.record_id) is not None:
            continue  # recorded by an earlier run or another instance: announced then
        record = record_for(item, now=now)
        # Announce before the record exists: once it does, any instance's reconciler may claim it and
        # publish its first Step, and a migration's story must open with Planned. A planner racing this
        # one publishes the same deterministic id, which consumers dedupe.
        publish(publication(record, "Planned", order=item.order, vm_size=item.vm_size, node_count=item.node_count,
                            strategy_reason=item.strategy_reason))
        try:
            created_records.append(ctx.ledger.create(record))
        except Conflict:
            log.info("migration %s already recorded by another instance", item.record_id)
    if start and created_records:
        report = ReconcileReport()
        for created in created_records:
            advance_record(created, ctx, report=report, advance=steps.advance, active=ACTIVE_STATES,
                           give_up=steps.give_up)
        log.info("migrations started by the planner: %s", report.advanced or "none (another instance has them)")
    return plan

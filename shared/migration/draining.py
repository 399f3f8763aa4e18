"""Cordoning the old pool and draining it, a batch of nodes at a time, through the Eviction API.

``cordoning`` freezes the old pool's autoscaler (so it neither adds nodes for evicted pods nor
fights the deletions) and cordons its nodes, marking each with :data:`MIGRATION_ANNOTATION` (the
record id): only a node carrying the marker is evicted from or has its machine deleted, and the old
pool is deleted only once every node of it carries it (shared.migration.proofs: nothing on the
row's word). Before the first node is marked, what ``validating`` proved is proved again from the
world, since a row may have been written straight into a later state. ``draining`` then runs in phases: ``drain``
takes the next batch and drains it with the one drain runner (:mod:`shared.drain.runner`); with the
rolling strategy, ``shrink`` deletes the drained batch's machines from the old pool and ``grow``
(shared.migration.replacement) adds a batch to the replacement.

Decided before disrupting: before the first batch every old node is checked against the drain's pod
rules (kubectl ``GetPodsForDeletion``), and a batch whose drain is refused or stalls stops the whole
migration (``blocked``), never half a pool. Old nodes the platform takes away (a spot eviction,
shared.fleet.node_fate) leave the migration: AKS drains them, and their loss is Azure's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from shared.drain.filters import plan_drain
from shared.drain.parallel import bounded_map
from shared.drain.runner import DrainRound, advance_drain, fetch_pdbs
from shared.drain.settings import DrainSettings
from shared.drain.state import DRAINED, REFUSED, STALLED, TIMED_OUT, DrainState
from shared.fleet.node_fate import going_away
from shared.fleet.pool_clone import frozen_old_pool
from shared.fleet.stack import gpu_resources
from shared.kernel.errors import Conflict
from shared.kernel.ports import KubePort, NodeView, PodView, Record
from shared.kernel.steps import Publication, Transition
from shared.migration.checks import pool_refusal
from shared.migration.policy import MigrationPolicy
from shared.migration.proofs import (
    MIGRATION_ANNOTATION,
    entry_refusal,
    not_held,
    not_machines,
    not_serving,
    ours,
    replacement_now,
)
from shared.migration.reads import closed_window, etag, pool_nodes, read_again, workload_pods
from shared.migration.records import AutoscalerBounds, MigrationData, MigrationState, Phase, Strategy, progress, read
from shared.migration.transitions import blocked, changed, moved, publication, wait

if TYPE_CHECKING:
    from shared.kernel.context import Context

DRAINING = MigrationState.DRAINING
_STOP_LEAD = {TIMED_OUT: "drain stalled past MIGRATION_DRAIN_TIMEOUT_S: ",
              STALLED: "drain stalled on a PodDisruptionBudget (DRAIN_PDB_BLOCKED_TIMEOUT_S): ",
              REFUSED: "drain refused before evicting anything: "}


def node_event(kube: KubePort, node: NodeView | str, record: Record, reason: str, message: str) -> None:
    kube.create_event(node=node, reason=reason, message=message, action="Migrate", correlation_id=record.id)


def cordon(kube: KubePort, node: NodeView, record: Record, d: MigrationData) -> NodeView:
    """Cordon ``node`` with this record's marker; a node someone else cordoned gets the marker too (this
    migration drains it), and the event says whose cordon it was."""
    patched = kube.patch_node(node.name, {"metadata": {"annotations": {MIGRATION_ANNOTATION: record.id}},
                                          "spec": {"unschedulable": True}})
    found = " (it was already cordoned by someone else)" if node.unschedulable else ""
    node_event(kube, node, record, "MigrationCordoned",
               f"cordoned to migrate pool {d.pool} to managed pool {d.replacement}{found}")
    return patched


def take(ctx: Context, record: Record, d: MigrationData, nodes: Sequence[NodeView], *,
         now: float) -> list[NodeView] | str:
    """The old pool's ``nodes`` as they are once they carry this record's cordon, or why none is touched:
    the replacement must exist and serve (and, while no old node carries this record's cordon yet, pass
    what ``validating`` proves: a row may have been written straight into a later state), and every node
    to mark must be a machine of the old pool in ARM."""
    new, missing = replacement_now(ctx, d)
    kube = ctx.access.kube(d.cluster_id)
    first = not any(ours(n, record) for n in nodes)
    unfit = missing or ("" if new is None else entry_refusal(kube, d, new, now=now) if first else not_serving(kube, new))
    if unfit:
        return f"{unfit}: no old node is cordoned or drained"
    # A node the platform is taking away (shared.fleet.node_fate) leaves the migration: never marked; its
    # machine may already be gone from ARM.
    to_mark = [n for n in nodes if not (ours(n, record) and n.unschedulable) and not going_away(n)]
    foreign = not_machines(ctx, d, d.pool, to_mark)
    if foreign:
        return f"{foreign}: no old node is cordoned or drained"
    marked = {n.name for n in to_mark}
    return bounded_map(lambda n: cordon(kube, n, record, d) if n.name in marked else n, nodes, name="cordon")


def step_cordoning(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    waiting = closed_window(ctx, record, now=now, policy=policy)
    if waiting is not None:
        return waiting
    d = read(record.data)
    aks = ctx.access.aks()
    old = aks.get_pool(d.cluster_id, d.pool)
    if old is None:
        return blocked(record, now=now, reason=f"the old pool {d.pool} disappeared during the migration")
    if old.operation_ended_undone:
        return blocked(record, now=now, reason=f"the old pool {d.pool} is {old.provisioning_state} (its last operation "
                       "ended without finishing): not cordoned; a person looks at it")
    if old.provisioning_state != "Succeeded":
        return wait(record, now=now, until=now + policy.poll_interval_s, why=f"old pool is {old.provisioning_state}")
    # What validating proved, proved again from the world: a row written straight into cordoning skips it.
    new, missing = replacement_now(ctx, d)
    unfit = missing or (entry_refusal(ctx.access.kube(d.cluster_id), d, new, now=now) if new is not None else "")
    if unfit:
        return blocked(record, now=now, reason=f"{d.pool} is not cordoned: {unfit}")
    if old.properties.get("enableAutoScaling"):
        # Freeze the old pool's autoscaler so it neither adds nodes for evicted pods nor fights deletions.
        # If-Match: written only over the version just read (and verified by checks.refusal): else 412, look again.
        try:
            aks.begin_put_pool(d.cluster_id, d.pool, {"properties": frozen_old_pool(old, enable_autoscaling=False)},
                               etag=etag(aks, old))
        except Conflict as exc:
            return wait(record, now=now, until=now + policy.poll_interval_s,
                        why=f"{d.pool} was not written ({type(exc).__name__}: {exc}): looking again")
        frozen = AutoscalerBounds(min=old.properties.get("minCount"), max=old.properties.get("maxCount"))
        return wait(record, now=now, until=now + policy.poll_interval_s, why="turning the old pool's autoscaler off",
                    **changed(d, autoscaler_was=frozen))
    kube = ctx.access.kube(d.cluster_id)
    nodes = pool_nodes(kube, d.pool)
    seen = take(ctx, record, d, nodes, now=now)
    if isinstance(seen, str):
        return blocked(record, now=now, reason=seen)
    mine = [node.name for node in seen if ours(node, record)]  # carrying our marker (someone else's cordon kept)
    after = msgspec.structs.replace(d, cordoned=mine, nodes_total=len(nodes), phase=Phase.DRAIN, batch=[])
    return moved(record, DRAINING, now=now, note=f"cordoned {len(mine)} of {len(nodes)} old nodes",
                 event_note=f"cordoned {len(mine)} old nodes", **changed(after, progress=progress(after)))


def drain_settings(base: DrainSettings, policy: MigrationPolicy) -> DrainSettings:
    """The drain of a migration: the app's pod rules and DRAIN_* bounds (``Settings.drain``), with the
    migration's own deadline (MIGRATION_DRAIN_TIMEOUT_S) and pace. A PDB's 429 carries no Retry-After;
    the budget frees up when a replacement pod turns Ready, which the next poll can see, so a refused
    eviction is asked again at the poll interval (at most 5 s)."""
    poll = min(policy.poll_interval_s, 20)
    return dataclasses.replace(base, drain_timeout_s=policy.drain_timeout_s, eviction_retry_s=min(5.0, poll), poll_s=poll,
                               pdb_blocked_timeout_s=min(base.pdb_blocked_timeout_s, policy.drain_timeout_s))


def drain_preflight(ctx: Context, d: MigrationData, nodes: Sequence[str], *, now: float, policy: MigrationPolicy,
                    listed: Mapping[str, Sequence[PodView]] | None = None) -> str:
    """kubectl ``GetPodsForDeletion`` over every old node still to drain, before the next batch is
    disrupted: the refusal (which pod, which rule, which setting) or "" when every node can be drained.
    ``listed``: each node's pods as this step already listed them."""
    kube = ctx.access.kube(d.cluster_id)
    settings = drain_settings(ctx.settings.drain, policy)
    pdbs = fetch_pdbs(kube)
    names = list(nodes)
    found = ([listed[n] for n in names] if listed is not None
             else bounded_map(lambda n: kube.list_pods(node_name=n), names, name="drain-list"))
    refusals = []
    for name, pods in zip(names, found, strict=True):
        plan = plan_drain([p for p in pods if p.node_name in ("", name)], settings, now=now, pdbs=pdbs)
        if plan.refused:
            refusals.append(f"{name}: {plan.refused_pods(limit=3)}")
    return "; ".join(refusals[:3])


def drain_batch(ctx: Context, record: Record, d: MigrationData, nodes: Sequence[str], *, now: float,
                policy: MigrationPolicy) -> DrainRound:
    """One round of the drain of ``nodes`` (shared.drain.runner), with the nodes' Kubernetes events."""
    kube = ctx.access.kube(d.cluster_id)
    previous = {n: DrainState.from_data(d.drain.get(n)) for n in nodes}
    result = advance_drain(kube, nodes, previous=previous, now=now, settings=drain_settings(ctx.settings.drain, policy))
    bounded_map(lambda n: node_event(kube, n, record, "MigrationDraining",
                                     f"evicting {result.nodes[n].sent} pods (Eviction API, PDBs respected)"),
                result.started, name="events")
    bounded_map(lambda n: node_event(kube, n, record, "MigrationDrainRefused" if result.nodes[n].state.outcome == REFUSED
                                     else "MigrationDrainBlocked", result.nodes[n].state.reason), result.stopped,
                name="events")
    return result


def leave_out_departing(record: Record, d: MigrationData, old_nodes: Sequence[NodeView], *,
                        now: float) -> tuple[Record, list[NodeView], tuple[Publication, ...]]:
    """Old nodes the platform is taking away (a spot eviction, shared.fleet.node_fate) leave the migration.

    They are not drained (AKS drains a preempted node itself, and a stopped VM runs nothing), not
    waited for, and not counted in the capacity floor: their loss is Azure's, not this migration's.
    Each is recorded once in ``lost`` with the reason, in the history and as a ``Step`` event (returned
    for the step's transition to publish).
    """
    departing = {n.name: why for n in old_nodes if (why := going_away(n))}
    new = {name: why for name, why in departing.items() if name not in d.lost}
    remaining = [n for n in old_nodes if n.name not in departing]
    if not new:
        return record, remaining, ()
    note = "; ".join(f"{name} left out: {why}" for name, why in sorted(new.items()))
    data = changed(d, lost={**d.lost, **new}, batch=[n for n in d.batch if n not in new],
                   drain={k: v for k, v in d.drain.items() if k not in new})
    record = record.moved(record.state, at=now, note=note, next_at=now, **data)
    return record, remaining, (publication(record, "Step", previous=str(record.state), note=note),)


def capacity_ok(ctx: Context, d: MigrationData, batch: Sequence[str], *, old_nodes: Sequence[NodeView],
                policy: MigrationPolicy) -> tuple[bool, str]:
    """Surge only: GPUs on Ready nodes (replacement + undrained old) minus the batch stay above the floor.

    The floor is a share of the GPUs the old pool really serves less those of nodes the platform took
    away (spot evictions) from either pool: that loss is not this migration's, and counting it would
    hold the drain for ever (AKS does not bring an evicted spot node back by itself). "Really serves":
    the nodes this migration drained, and the undrained old nodes that are Ready with GPUs allocatable
    now. A node of the old pool without GPUs (a remediation's surge node whose device plugin never came
    up, a node handed to an operator with a dead GPU) is capacity the tenant does not have; counting it
    would ask the drain to keep GPUs that do not exist (soak seed 961801: a surge node of a replace that
    gave up made the pool 4 nodes, 3 of them with a GPU, and the floor 4 never opened).
    """
    if d.strategy != Strategy.SURGE or policy.capacity_floor_pct <= 0:
        return True, ""
    kube = ctx.access.kube(d.cluster_id)
    drained = set(d.drained)

    def gpus(n: NodeView) -> int:
        return sum(gpu_resources(n).values()) if n.ready else 0

    new_nodes = [n for n in pool_nodes(kube, d.replacement) if not going_away(n)]
    # A surge replacement has every node from the start: one missing or going away was taken by Azure.
    new_lost = max(0, d.replacement_count - len(new_nodes))
    serving = sum(1 for n in old_nodes if n.name not in drained and gpus(n) > 0)
    taken = len(drained - set(d.lost))
    baseline = d.gpus_per_node * max(0, min((d.nodes_total or len(old_nodes)) - len(d.lost), taken + serving) - new_lost)
    new_gpus = sum(gpus(n) for n in new_nodes)
    old_gpus = sum(gpus(n) for n in old_nodes if n.name not in drained and n.name not in batch)
    floor = baseline * policy.capacity_floor_pct / 100.0
    if new_gpus + old_gpus >= floor:
        return True, ""
    return False, f"GPU capacity {new_gpus + old_gpus} would drop below the floor {floor:g} ({policy.capacity_floor_pct}%)"


def _next_batch(ctx: Context, record: Record, d: MigrationData, old_nodes: Sequence[NodeView], *, now: float,
                policy: MigrationPolicy) -> tuple[MigrationData, list[NodeView]] | Transition:
    """The next batch to drain, chosen and checked (the data with it, and the old nodes as they are once
    they carry this record's cordon), or what stops the phase instead."""
    remaining = [n.name for n in old_nodes if n.name not in d.drained]
    if not remaining:
        return moved(record, MigrationState.DELETING, now=now, note="every old node is drained")
    waiting = closed_window(ctx, record, now=now, policy=policy)
    if waiting is not None:
        return waiting
    old = ctx.access.aks().get_pool(d.cluster_id, d.pool)
    if old is not None and old.properties.get("enableAutoScaling"):  # never drained while its autoscaler runs
        return moved(record, MigrationState.CORDONING, now=now, note=f"{d.pool}'s autoscaler is on: freezing it first")
    # A node that appeared, was uncordoned or lost our marker since: cordon it too, once the world shows
    # the replacement serving and the node a machine of the old pool.
    seen = take(ctx, record, d, old_nodes, now=now)
    if isinstance(seen, str):
        return blocked(record, now=now, reason=seen)
    cordoned = sorted(set(d.cordoned) | {n.name for n in seen if ours(n, record)})
    batch = remaining[: d.batch_size]
    ok, why = capacity_ok(ctx, d, batch, old_nodes=old_nodes, policy=policy)
    if not ok:
        # A gate that never opens (the replacement's GPUs lost and never repaired) must not hold the old
        # pool cordoned for ever with nobody told: after the drain timeout it is an operator's.
        since = d.capacity_held_since or now
        if now - since >= policy.drain_timeout_s:
            return blocked(record, now=now, data=changed(d, cordoned=cordoned),
                           reason=f"{why}, and has for {int(now - since)}s (MIGRATION_DRAIN_TIMEOUT_S "
                                  f"{policy.drain_timeout_s}): {d.pool} stays cordoned with {', '.join(remaining)} "
                                  f"undrained")
        return wait(record, now=now, until=now + policy.poll_interval_s, why=why,
                    **changed(d, cordoned=cordoned, capacity_held_since=since))
    d = msgspec.structs.replace(d, capacity_held_since=0.0)
    # Decide before disrupting: before the first batch, every old node is checked (once: each later
    # batch's drain step still refuses its own nodes before evicting anything).
    refusal = "" if d.drained else drain_preflight(ctx, d, remaining, now=now, policy=policy)
    if refusal:  # no node of the pool is drained when one of them cannot be
        return blocked(record, now=now, reason="drain refused before evicting anything: " + refusal,
                       data=changed(d, cordoned=cordoned))
    return msgspec.structs.replace(d, batch=batch, drain={}, cordoned=cordoned), seen


def _in_progress(ctx: Context, d: MigrationData) -> str:
    """Why a batch the row says is being drained may not get another eviction round: the replacement
    that takes its pods must exist and serve ("" = it does)."""
    new, missing = replacement_now(ctx, d)
    return missing or (not_serving(ctx.access.kube(d.cluster_id), new) if new is not None else "")


def drain_phase(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    d = read(record.data)
    kube = ctx.access.kube(d.cluster_id)
    record, old_nodes, said = leave_out_departing(record, d, pool_nodes(kube, d.pool), now=now)
    d = read(record.data)
    present = {n.name for n in old_nodes}
    d = msgspec.structs.replace(d, batch=[n for n in d.batch if n in present])
    seen = list(old_nodes)
    if not d.batch:
        chosen = _next_batch(ctx, record, d, old_nodes, now=now, policy=policy)
        if isinstance(chosen, Transition):
            return Transition(chosen.record, chosen.outcome, (*said, *chosen.events))
        d, seen = chosen
    else:
        unfit = _in_progress(ctx, d)
        if unfit:
            return _with(said, blocked(record, now=now, reason=f"{unfit}: nothing more is evicted from {d.pool}"))
    # Each eviction round only on nodes that carry this record's cordon (written after the world proofs
    # of ``take``) and are unschedulable, as the API server shows them now: never on the row's word.
    views = {n.name: n for n in seen}
    unheld = not_held([views[n] for n in d.batch], record)
    if unheld:
        return _with(said, blocked(record, now=now, reason=f"nothing is evicted: {unheld}"))
    result = drain_batch(ctx, record, d, d.batch, now=now, policy=policy)
    d = msgspec.structs.replace(d, drain={**d.drain, **result.states()})
    if result.outcome in _STOP_LEAD:
        done = blocked(record, now=now, reason=_STOP_LEAD[result.outcome] + "; ".join(result.messages[:5]), data=changed(d))
    elif result.outcome != DRAINED:
        wake = result.wake_at if result.wake_at is not None else now + policy.poll_interval_s
        done = wait(record, now=now, until=max(now, wake), **changed(d, progress=progress(d)),
                    why="draining " + ", ".join(d.batch) + (f" ({result.messages[0]})" if result.messages else ""))
    else:
        bounded_map(lambda name: node_event(kube, name, record, "MigrationDrained", "no workload pod left on the node"),
                    d.batch, name="events")
        batch = d.batch
        drained = sorted(set(d.drained) | set(batch))
        rolling = d.strategy == Strategy.ROLLING and any(n not in drained for n in present)
        d = msgspec.structs.replace(d, drained=drained, batch=[], drain={}, phase=Phase.SHRINK if rolling else Phase.DRAIN,
                                    shrinking=batch if rolling else [])
        d = msgspec.structs.replace(d, progress=progress(d))
        done = moved(record, DRAINING, now=now, note=f"drained {', '.join(batch)}", **changed(d))
    return _with(said, done)


def _with(said: tuple[Publication, ...], done: Transition) -> Transition:
    return Transition(done.record, done.outcome, (*said, *done.events))


def shrink_phase(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    d = read(record.data)
    aks = ctx.access.aks()
    present = [m.name for m in aks.list_machines(d.cluster_id, d.pool) if m.name in d.shrinking]
    if not present:
        return moved(record, DRAINING, now=now, note=f"removed {', '.join(d.shrinking)} from {d.pool}",
                     **changed(d, removed=sorted(set(d.removed) | set(d.shrinking)), shrinking=[], shrink_sent=False,
                               phase=Phase.GROW))
    if not d.shrink_sent:
        kube = ctx.access.kube(d.cluster_id)
        busy = [n for n, pods in zip(present, bounded_map(lambda n: workload_pods(kube, n), present, name="drain-list"),
                                     strict=True) if pods]
        if busy:  # a pod landed there since the drain: drain again rather than kill it with the VM
            return moved(record, DRAINING, now=now, note=f"workload pods back on {', '.join(busy)}: draining again",
                         **changed(d, drained=[n for n in d.drained if n not in busy], phase=Phase.DRAIN, shrinking=[]))
        # Only machines whose nodes this record cordoned and drained (its marker, unschedulable, as the API
        # server shows them now), and only while the replacement serves: never a list the row made up.
        views = {n.name: n for n in pool_nodes(kube, d.pool)}
        unheld = "; ".join(f"{n} has no node in the cluster" for n in present if n not in views)
        unheld = unheld or not_held([views[n] for n in present], record) or _in_progress(ctx, d)
        if unheld:
            return blocked(record, now=now, reason=f"no machine of {d.pool} is deleted: {unheld}")
        # deleteMachines takes no If-Match: AgentPools_DeleteMachines declares no such header, where
        # AgentPools_Delete declares ``if-match`` (Azure/azure-rest-api-specs specification/containerservice/
        # resource-manager/Microsoft.ContainerService/aks/stable/2025-10-01/managedClusters.json; the SDK's
        # build_agent_pools_delete_machines_request sends none either). So the pool and its machines are
        # read again right before the call, and the pool must still be the one this migration drains.
        again = read_again(aks, d.cluster_id, d.pool)
        refusal = "it no longer exists" if again is None else pool_refusal(d, again)
        if refusal:
            return blocked(record, now=now, reason=f"no machine of {d.pool} is deleted: {refusal}")
        still = {m.name for m in aks.list_machines(d.cluster_id, d.pool)}
        present = [n for n in present if n in still]
        if present:
            aks.begin_delete_machines(d.cluster_id, d.pool, present)
        d = msgspec.structs.replace(d, shrink_sent=True)
    return wait(record, now=now, until=now + policy.poll_interval_s, why=f"deleting machines {', '.join(present)}",
                **changed(d))

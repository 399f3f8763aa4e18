"""The two ways a migration ends with a pool deleted: the old one once drained, or the replacement on a rollback.

Every delete is of a pool as ARM shows it right now, verified first (shared.migration.checks) and
sent with its eTag as If-Match, so a pool changed after the check is never deleted (412 -> look
again). Neither pool is deleted while a workload pod runs on it: the old pool's nodes are checked
right before the DELETE (and drained again if a pod came back, or if a node does not carry this
record's cordon), and on a rollback the replacement is cordoned and its pods moved back to the old
pool first. A rollback undoes only what the app itself rolls back (before it cordons the old pool):
it needs the old pool, none of whose nodes carries this record's cordon, and a Ready, schedulable
node there before it evicts anything from the replacement (shared.migration.proofs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from shared.drain.parallel import bounded_map
from shared.fleet.node_fate import going_away, is_shut_down
from shared.fleet.pool_clone import frozen_old_pool
from shared.kernel.errors import Conflict
from shared.kernel.ports import KubePort, PoolInfo, Record
from shared.kernel.steps import Transition
from shared.migration.checks import autoscaler_refusal, old_pool_refusal, pool_refusal, replacement_refusal
from shared.migration.draining import cordon, drain_batch
from shared.migration.policy import MigrationPolicy
from shared.migration.proofs import not_machines, not_serving, ours
from shared.migration.reads import CANCELED, closed_window, etag, pool_nodes, workload_pods
from shared.migration.records import MigrationState, Phase, progress, read
from shared.migration.transitions import blocked, changed, finished, moved, wait

if TYPE_CHECKING:
    from shared.kernel.context import Context


def _busy(kube: KubePort, names: list[str]) -> list[str]:
    """The nodes among ``names`` that run a workload pod."""
    found = bounded_map(lambda n: workload_pods(kube, n), names, name="drain-list")
    return [n for n, pods in zip(names, found, strict=True) if pods]


def step_deleting(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    d = read(record.data)
    aks = ctx.access.aks()
    old = aks.get_pool(d.cluster_id, d.pool)
    if old is None:
        if d.replacement and aks.get_pool(d.cluster_id, d.replacement) is None:  # checks.refusal judged one that exists
            return blocked(record, now=now, reason=f"neither {d.pool} nor its replacement {d.replacement} exists in ARM: "
                           "this row's migration did not happen here")
        return finished(record, MigrationState.DONE, now=now, note=f"{d.pool} deleted; {d.replacement} serves",
                        event="Completed", progress=msgspec.to_builtins(progress(d)))
    if d.delete_sent and old.provisioning_state == "Deleting":
        return wait(record, now=now, until=now + policy.poll_interval_s, why=f"{d.pool} is Deleting")
    if d.delete_sent and old.provisioning_state == CANCELED:
        # Someone aborted the deletion (az aks nodepool operation-abort): a person's decision, never overridden by
        # sending it again. (A deletion that Failed is sent again below, after every proof is made afresh.)
        return blocked(record, now=now, reason=f"the deletion of {d.pool} was Canceled (aborted): not sent again; "
                       f"{d.replacement} serves, {d.pool} is drained and cordoned")
    # Trust ARM, not the row: the pool to delete is derived from what ARM shows, before anything is touched.
    new = aks.get_pool(d.cluster_id, d.replacement) if d.replacement else None
    refusal = old_pool_refusal(d, old, new)
    if refusal:
        return blocked(record, now=now, reason=f"{d.pool} is not deleted: {refusal}")
    waiting = closed_window(ctx, record, now=now, policy=policy)
    if waiting is not None:
        return waiting
    kube = ctx.access.kube(d.cluster_id)
    unfit = not_serving(kube, new) if new is not None else "no replacement"
    if unfit:
        return wait(record, now=now, until=now + policy.poll_interval_s, why=f"{unfit}: {d.pool} is kept until it serves")
    nodes = pool_nodes(kube, d.pool)
    # A node whose VM is stopped (a spot eviction with the Deallocate policy) runs nothing, whatever
    # pods the API still binds to it; one under a Preempt notice is about to go: wait for it, never
    # drain it again (AKS is draining it).
    leaving = {n.name for n in nodes if going_away(n) and not is_shut_down(n)}
    busy = _busy(kube, [n.name for n in nodes if not is_shut_down(n)])
    if busy and set(busy) <= leaving:
        return wait(record, now=now, until=now + policy.poll_interval_s,
                    why=f"waiting for Azure to take back {', '.join(busy)} (spot eviction) before deleting {d.pool}")
    busy = [n for n in busy if n not in leaving]
    if busy:  # re-checked right before the DELETE: never delete a pool that still runs workload pods
        return moved(record, MigrationState.DRAINING, now=now, note=f"workload pods still on {', '.join(busy)}: draining again",
                     **changed(d, drained=[n for n in d.drained if n not in busy], phase=Phase.DRAIN, batch=[]))
    # The pool goes only once this record drained it: each of its nodes still running carries this record's
    # cordon (the steward wrote it after its proofs; a table writer cannot), else it is drained first.
    unheld = [n.name for n in nodes if not is_shut_down(n) and n.name not in leaving
              and not (ours(n, record) and n.unschedulable)]
    if unheld:
        return moved(record, MigrationState.DRAINING, now=now,
                     note=f"{', '.join(unheld[:5])} not cordoned by this migration: draining before {d.pool} is deleted",
                     **changed(d, drained=[n for n in d.drained if n not in unheld], phase=Phase.DRAIN, batch=[]))
    # If-Match: deleted only if the pool is still the version read and verified above (412 -> Conflict: look again).
    aks.begin_delete_pool(d.cluster_id, d.pool, etag=etag(aks, old))
    return wait(record, now=now, until=now + policy.poll_interval_s, why=f"deleting {d.pool}", delete_sent=True)


def _rollback_refusal(ctx: Context, record: Record, old: PoolInfo | None, pool: str) -> str:
    """Why this row may not roll back ("" = it may): the app rolls back only before it cordons anything of
    the old pool (creating, validating), so the old pool must exist and none of its nodes may carry this
    record's cordon; a row that says otherwise asks to undo a drain, which is a decision for a person."""
    if old is None:
        return f"the old pool {pool} does not exist: removing the replacement would leave no pool to serve"
    kube = ctx.access.kube(str(record.data["cluster_id"]))
    marked = [n.name for n in pool_nodes(kube, pool) if ours(n, record)]
    if marked:
        return (f"{', '.join(marked[:5])} of {pool} carry this migration's cordon: it got past cordoning, where the "
                "app never rolls back (uncordon them and delete the replacement by hand if that is right)")
    return ""


def _old_pool_serves(kube: KubePort, old: PoolInfo) -> str:
    """Why the old pool cannot take the replacement's pods back ("" = it can): a Ready, schedulable node."""
    if any(n.ready and not n.unschedulable for n in pool_nodes(kube, old.name)):
        return ""
    return f"{old.name} has no Ready, schedulable node to take the pods back"


def step_rolling_back(record: Record, ctx: Context, *, now: float, policy: MigrationPolicy) -> Transition:
    d = read(record.data)
    aks = ctx.access.aks()
    pool, name = d.pool, d.replacement
    kube = ctx.access.kube(d.cluster_id)
    old = aks.get_pool(d.cluster_id, pool)
    new = aks.get_pool(d.cluster_id, name)
    stop = _rollback_refusal(ctx, record, old, pool)
    if stop:
        return blocked(record, now=now, reason=f"not rolled back, nothing touched: {stop}")
    was = d.autoscaler_was
    if was and old is not None and not old.properties.get("enableAutoScaling") and old.provisioning_state == "Succeeded":
        # On the very read whose eTag conditions the PUT; and the bounds restored are the ones the
        # replacement was tagged with when it was cloned (TAG_AUTOSCALER), never a row's say-so alone.
        refusal = pool_refusal(d, old) or autoscaler_refusal(was, new, name)
        if refusal:
            return blocked(record, now=now, reason=f"{pool}'s autoscaler is not restored: {refusal}")
        try:
            aks.begin_put_pool(d.cluster_id, pool, {"properties": frozen_old_pool(
                old, enable_autoscaling=True, min_count=was.min, max_count=was.max)}, etag=etag(aks, old))
        except Conflict as exc:
            return wait(record, now=now, until=now + policy.poll_interval_s,
                        why=f"{pool} was not written ({type(exc).__name__}: {exc}): looking again")
        d = msgspec.structs.replace(d, autoscaler_was=None)
    if new is None:
        event = "Blocked" if d.final == MigrationState.BLOCKED else "RolledBack"
        return finished(record, d.final, now=now, note=f"{name} removed; {pool} serves again", event=event,
                        **changed(d, uncordoned=True))
    refusal = replacement_refusal(d, new)
    if refusal:
        return blocked(record, now=now, reason=f"{name} is not deleted: {refusal}", data=changed(d))
    new_nodes = pool_nodes(kube, name)
    busy = _busy(kube, [n.name for n in new_nodes])
    to_cordon = [n for n in new_nodes if not (ours(n, record) and n.unschedulable)]  # evicted only under our cordon
    unfit = (_old_pool_serves(kube, old) if busy and old is not None else "") or not_machines(ctx, d, name, to_cordon)
    if unfit:
        return blocked(record, now=now, reason=f"{name} is not cordoned, drained nor deleted: {unfit}", data=changed(d))
    for node in to_cordon:  # nothing new may land on the replacement from now on (pods being recreated included)
        cordon(kube, node, record, d)
    if busy:  # never delete a pool that runs workload pods: move them back to the old pool first
        result = drain_batch(ctx, record, d, busy, now=now, policy=policy)
        wake = result.wake_at if result.wake_at is not None else now + policy.poll_interval_s
        return wait(record, now=now, until=max(now, wake), **changed(d, drain={**d.drain, **result.states()}),
                    why="moving pods back off the replacement: " + ("; ".join(result.messages[:2]) or ", ".join(busy)))
    if d.delete_sent and new.provisioning_state == CANCELED:  # an abort: a person's decision (see step_deleting)
        return blocked(record, now=now, reason=f"the deletion of the replacement {name} was Canceled (aborted): not "
                       "sent again", data=changed(d))
    if not d.delete_sent or new.provisioning_state != "Deleting":
        # If-Match: the replacement is deleted only if it is still the version read and verified above
        # (tagged by this migration, managed, empty); a 412 means it changed since: look again next poll.
        try:
            aks.begin_delete_pool(d.cluster_id, name, etag=etag(aks, new))
        except Conflict as exc:
            return wait(record, now=now, until=now + policy.poll_interval_s, **changed(d),
                        why=f"{name} was not written ({type(exc).__name__}: {exc}): looking again")
        d = msgspec.structs.replace(d, delete_sent=True)
    return wait(record, now=now, until=now + policy.poll_interval_s, why=f"deleting the replacement {name}", **changed(d))

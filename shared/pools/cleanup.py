"""A failed request does not leave its pool billing: the pool it created is deleted, or scaled to zero.

A pool this request created whose provisioning fails, or whose validation (stack check, sample job)
fails or times out, is removed as POOL_REQUEST_FAILED_POOL_ACTION says (default ``delete``), unless
workload pods already run on it; the failed outcome's ``cleanup`` says which. The target is derived
from ARM (or the Kubernetes API for node auto-provisioning) right before the call, never from the
ledger alone: only the pool tagged with this request's id, and still of the request's mode, size and
GPU management, is touched, with the ETag read as If-Match (the ``If-Match`` header of Agent Pools -
Delete / Create Or Update, https://learn.microsoft.com/rest/api/aks/agent-pools).

A preview feature the subscription has not registered (``FeatureNotRegistered``, chosen by the
adapter from ARM's error code) fails the request with the commands that register it
(https://learn.microsoft.com/azure/azure-resource-manager/management/preview-features).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from shared.fleet import pool_clone
from shared.fleet.pool_writes import precondition
from shared.kernel.errors import Conflict, Forbidden, Invalid, NotFound
from shared.kernel.ports import Record
from shared.kernel.steps import Transition, stay
from shared.pools import nap
from shared.pools import spec as pool_spec
from shared.pools.outcomes import fail
from shared.pools.policy import PoolRequestPolicy
from shared.pools.proof import FAILING_WAIT_MAX_S
from shared.pools.records import Cleanup, CleanupAction, Failing, JobRef, PoolRequestData, StackReport, builtins
from shared.pools.request import PoolRequest

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.pool_creation")



def _workload_pods(ctx: Context, req: PoolRequest, *, nap_pool: bool) -> list[str]:
    """Pods other than DaemonSet, mirror, kube-system and the steward's own sample job on the pool's nodes."""
    kube = ctx.access.kube(req.cluster)
    label = nap.NODEPOOL_LABEL if nap_pool else pool_spec.AGENTPOOL_LABEL
    found: list[str] = []
    for node in kube.list_nodes(label_selector=f"{label}={req.pool_name}"):
        for pod in kube.list_pods(node_name=node.name):
            owner = pod.controller()
            if (pod.phase in ("Succeeded", "Failed") or pod.is_mirror or pod.namespace == "kube-system"
                    or (owner is not None and owner.kind == "DaemonSet")
                    or pod.labels.get(nap.LABEL_MANAGED_BY) == nap.MANAGED_BY):
                continue
            found.append(f"{pod.namespace}/{pod.name}")
    return found


def _cleanup_created_pool(ctx: Context, req: PoolRequest, *, nap_pool: bool, policy: PoolRequestPolicy) -> Cleanup:
    """Delete (or scale to zero) the pool this request created, so that a failed one does not keep billing.

    Raises Conflict (AKS: another operation is running on the pool) when it must be tried again later.
    """
    if nap_pool:
        kube = ctx.access.kube(req.cluster)
        ours = [(api, kind, str((obj.get("metadata") or {}).get("uid") or ""))
                for api, kind in ((nap.NODEPOOL_API, "NodePool"), (nap.NODECLASS_API, "AKSNodeClass"))
                if (obj := kube.get_object(api, kind, req.pool_name)) is not None
                and nap.made_by(dict(obj), req.request_id, requester=req.requester)]
        if not ours:
            return Cleanup(action=CleanupAction.NONE, note="no Karpenter object of this request is left")
    else:
        pool = ctx.access.aks().get_pool(req.cluster, req.pool_name)
        if pool is None:
            return Cleanup(action=CleanupAction.NONE, note=f"the pool {req.pool_name} no longer exists")
        if not pool_spec.created_by(pool.properties, req.request_id, requester=req.requester):
            return Cleanup(action=CleanupAction.NONE, note=f"the pool {req.pool_name} was not created by this request: "
                                                                  "left alone")
        # Still the pool the request describes (mode, size, GPU management), as ARM shows it now: a ledger
        # row alone never names a pool to delete.
        unlike = pool_spec.spec_differences(pool.properties, req)
        if str(pool.properties.get("mode") or "User") != "User":
            unlike.insert(0, f"mode is {pool.properties.get('mode')!r}, not 'User'")
        if unlike:
            return Cleanup(action=CleanupAction.NONE, note=f"the pool {req.pool_name} is not the pool this request describes "
                                              f"({'; '.join(unlike[:3])}): left alone")
    workload = _workload_pods(ctx, req, nap_pool=nap_pool)
    if workload:
        return Cleanup(action=CleanupAction.KEPT, note=f"{len(workload)} workload pod(s) already run on the pool "
                                          f"({', '.join(workload[:5])}): delete or scale it yourself")
    if ctx.settings.paused:
        return Cleanup(action=CleanupAction.KEPT, note="STEWARD_PAUSED is set: the pool was left as it is; it may be billing")
    if nap_pool:
        # Karpenter removes a NodePool's nodes with it; "scale to zero" has no Karpenter equivalent.
        kube = ctx.access.kube(req.cluster)
        for api, kind, uid in ours:  # the uid read above as a precondition: an object that took the name since stays
            with contextlib.suppress(NotFound):
                kube.delete_object(api, kind, req.pool_name, uid=uid or None)
        return Cleanup(action=CleanupAction.DELETED,
                       note=f"NodePool/AKSNodeClass {req.pool_name} deleted (node auto-provisioning)")
    if pool is None:  # not reached: the branch above returned when ARM had no pool
        return Cleanup(action=CleanupAction.NONE, note=f"the pool {req.pool_name} no longer exists")
    aks = ctx.access.aks()
    # If-Match: only the version of the pool read and verified above (412 -> Conflict: tried again later);
    # a pool without an eTag is read again first and must be unchanged (shared.fleet.pool_writes).
    etag = precondition(aks, pool)
    if policy.failed_pool_action == "scaleToZero":
        body = pool_clone.update_properties(pool, count=0, enableAutoScaling=False, minCount=None, maxCount=None)
        aks.begin_put_pool(req.cluster, req.pool_name, {"properties": body}, etag=etag)
        return Cleanup(action=CleanupAction.SCALED_TO_ZERO, note=f"pool {req.pool_name} scaled to 0 nodes "
                                                  "(POOL_REQUEST_FAILED_POOL_ACTION=scaleToZero); delete it when done")
    aks.begin_delete_pool(req.cluster, req.pool_name, etag=etag)
    return Cleanup(action=CleanupAction.DELETED, note=f"pool {req.pool_name} deleted (POOL_REQUEST_FAILED_POOL_ACTION=delete)")


def fail_created(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy, data: PoolRequestData,
                 req: PoolRequest, code: str, message: str, stack: StackReport | None = None,
                 job: JobRef | None = None) -> Transition:
    """Fail a request whose pool exists (provisioning failed, or validation failed or timed out), after
    deleting or scaling down that pool; the outcome's ``cleanup`` says what was done.

    AKS refuses the removal while another operation runs on the pool (Conflict): the failure is then
    remembered in ``failing`` and tried again at each poll, for at most :data:`FAILING_WAIT_MAX_S`.
    """
    since = data.failing.since if data.failing is not None else now
    try:
        cleanup = _cleanup_created_pool(ctx, req, nap_pool=data.nap, policy=policy)
    except Conflict as error:
        if now - since < FAILING_WAIT_MAX_S:
            failing = Failing(code=code, message=message, since=since, stack=stack, job=job)
            return stay(record, now=now, until=now + policy.poll_interval_s, failing=builtins(failing),
                        waiting=f"failing ({code}); waiting for the pool to accept its cleanup: {error}")
        cleanup = Cleanup(action=CleanupAction.FAILED, note=f"the pool stayed busy for {FAILING_WAIT_MAX_S:.0f}s: "
                                                            f"{error}; it may be billing, remove it yourself")
    except (Invalid, Forbidden) as error:
        cleanup = Cleanup(action=CleanupAction.FAILED, note=f"the pool could not be removed: {error}; it may be "
                                                            "billing, remove it yourself")
    log.info("pool request %s failed (%s); pool cleanup: %s", record.id, code, cleanup.action)
    return fail(record, now=now, code=code, message=message, cleanup=cleanup, stack=stack, job=job)

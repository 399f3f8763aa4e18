"""The pool-request record: from a queue message to a managed GPU pool known to work.

Two entry points. :func:`accept` runs in the queue trigger: it validates the message and writes
the durable record (or a terminal ``rejected`` record with every reason), then returns quickly;
creating a GPU pool takes many minutes and is never waited for inside one invocation.
:func:`advance` is called by the reconciler (shared.reconciler), which claims the record, calls it
once per step and saves what it returns (ETag-guarded). Each step re-observes the world first, so
running a step twice, or after a crash between "pool requested" and "record saved", is harmless:
the pool is re-read and recognised by the steward's request-id tag before anything is PUT again.

    accepted -> creating -> validating -> [testing] -> succeeded
        \\__________\\____________\\____________\\______-> failed (Azure's error, or a timeout)
    (queue) -> rejected (final, never retried)

On clusters with node auto-provisioning the "pool" is a Karpenter NodePool + AKSNodeClass
(shared.nap) applied through the Kubernetes API instead of an AgentPool PUT.

Outcomes are published as CloudEvents ``Steward.PoolRequest.Accepted|Rejected|Created|Failed``
with deterministic ids (``pool-request/<id>/<Type>``), so that a repeat after a lost save is
recognisable downstream, and are kept in the record's ``data``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from shared import gpu_sizes, nap, pool_spec, scope
from shared.errors import Conflict, Forbidden, Invalid, NotFound, Transient
from shared.pool_policy import PoolRequestPolicy
from shared.pool_request import PoolRequest, Problem, Rejection, ValidatedRequest, parse_and_validate
from shared.ports import PoolInfo, Record
from shared.stack import GPU_RESOURCE, evaluate_stack

if TYPE_CHECKING:
    from shared.context import Context

log = logging.getLogger("steward.pool_creation")

KIND = "pool-request"
ACCEPTED, CREATING, VALIDATING, TESTING = "accepted", "creating", "validating", "testing"
SUCCEEDED, REJECTED, FAILED = "succeeded", "rejected", "failed"
ACTIVE_STATES: tuple[str, ...] = (ACCEPTED, CREATING, VALIDATING, TESTING)
TERMINAL_STATES: tuple[str, ...] = (SUCCEEDED, REJECTED, FAILED)

EVENT_ACCEPTED = "Steward.PoolRequest.Accepted"
EVENT_REJECTED = "Steward.PoolRequest.Rejected"
EVENT_CREATED = "Steward.PoolRequest.Created"
EVENT_FAILED = "Steward.PoolRequest.Failed"

AGENTPOOL_LABEL = "kubernetes.azure.com/agentpool"
MAX_PUTS = 3  # a pool that vanishes after its PUT was accepted is PUT again at most this often
PAUSED_RETRY_S = 60.0


@dataclass(frozen=True)
class AcceptOutcome:
    """What became of a queue message: ``accepted``, ``duplicate`` (already recorded) or ``rejected``."""

    status: str
    request_id: str  # the record's id (the requestId, or ``msg-<sha256>`` for unreadable messages)
    message: str = ""
    problems: tuple[Problem, ...] = ()


def _policy(ctx: Context) -> PoolRequestPolicy:
    policy = getattr(ctx.settings, "pool_requests", None)
    return policy if isinstance(policy, PoolRequestPolicy) else PoolRequestPolicy()


def _paused(ctx: Context) -> bool:
    return bool(getattr(ctx.settings, "paused", False))


# =============================================================================== accept (queue)


def scope_check(ctx: Context) -> Callable[[str], bool]:
    """``in_scope(cluster_id)`` for validation: the fleet scope of shared.scope, read from ARM.

    A cluster in a subscription outside FLEET_SUBSCRIPTIONS is refused without any ARM call; one
    ARM cannot find or will not show us is out of scope too. Throttled/Transient propagate (the
    queue retries the message). Tests may put their own callable in ``ctx.extras["in_scope"]``.
    """
    override = ctx.extras.get("in_scope")
    if callable(override):
        return override  # type: ignore[no-any-return]

    def check(cluster_id: str) -> bool:
        settings = ctx.settings
        if scope.subscription_of(cluster_id) not in {s.lower() for s in settings.subscriptions}:
            return False
        try:
            cluster = ctx.access.aks().get_cluster(cluster_id)
        except (NotFound, Forbidden):
            return False
        ok, _ = scope.cluster_in_scope(cluster, settings)
        return ok

    return check


def accept(raw: bytes | str, *, dequeue_count: int, ctx: Context) -> AcceptOutcome:
    """Validate one queue message and record it. Raises only Throttled/Transient (retry the message)."""
    now = ctx.clock.now()
    result = parse_and_validate(raw, policy=_policy(ctx), in_scope=scope_check(ctx))
    if isinstance(result, Rejection):
        return _reject(result, ctx=ctx, now=now, dequeue_count=dequeue_count)

    existing = ctx.ledger.get(KIND, result.request_id)
    if existing is None:
        try:
            existing = ctx.ledger.create(_announced(ctx, _new_record(result, now=now, dequeue_count=dequeue_count),
                                                    result))
            status = "accepted"
        except Conflict:  # another delivery of a message with this id won the race
            existing = ctx.ledger.get(KIND, result.request_id)
            if existing is None:
                raise Transient("pool request record vanished right after a conflicting create") from None
            status = "duplicate"
    elif existing.state == REJECTED and existing.data.get("fingerprint") is None:
        # A rejected id may be reused by the corrected request: the rejection stays in its history.
        fresh = _new_record(result, now=now, dequeue_count=dequeue_count)
        fresh = msgspec.structs.replace(fresh, etag=existing.etag, history=[*existing.history, *fresh.history][-50:])
        fresh = _announced(ctx, fresh, result)
        try:
            existing = ctx.ledger.save(fresh)
        except (Conflict, NotFound):
            raise Transient("pool request record changed while replacing a rejection; retry") from None
        status = "accepted"
    else:
        status = "duplicate"

    if existing.data.get("fingerprint") != result.fingerprint:
        reuse = Problem("requestId", f"{result.request_id!r} was already used for a different request "
                        f"(now {existing.state})",
                        "use a new requestId for a new request; resend the original unchanged to retry it")
        digest = hashlib.sha256(raw.encode() if isinstance(raw, str) else bytes(raw)).hexdigest()
        rejection = Rejection((reuse,), request_id=None, requester=result.request.requester,
                              cluster=result.request.cluster, pool_name=result.request.pool_name, digest=digest)
        return _reject(rejection, ctx=ctx, now=now, dequeue_count=dequeue_count, reused_id=result.request_id)

    if not existing.data.get("announced"):  # recorded by a version that announced after writing
        _announce(ctx, existing, result)
        _mark_announced(ctx, existing)
    log.info("pool request %s %s", result.request_id, status)
    return AcceptOutcome(status=status, request_id=result.request_id)


def _new_record(v: ValidatedRequest, *, now: float, dequeue_count: int) -> Record:
    req = v.request
    data = {"request": msgspec.to_builtins(req), "fingerprint": v.fingerprint, "cluster": req.cluster,
            "pool": req.pool_name, "requester": req.requester, "vmSize": v.size.name,
            "dequeueCount": dequeue_count}
    return Record(kind=KIND, id=req.request_id, state=ACCEPTED, data=data, created_at=now, updated_at=now,
                  next_at=now, history=[{"at": now, "state": ACCEPTED, "note": "validated and recorded"}])


def _announce(ctx: Context, record: Record, result: ValidatedRequest) -> None:
    _publish(ctx, EVENT_ACCEPTED, record, {"state": record.state, "vmSize": result.request.vm_size,
                                           "installProfile": result.request.install_profile})


def _announced(ctx: Context, record: Record, result: ValidatedRequest) -> Record:
    """Publish Accepted, then return the record marked as announced, ready to be written.

    The event goes out before the record can be seen: once it is written, any instance's reconciler
    may claim it and report progress, and a request's story must open with Accepted. If the write
    then loses a race, the winner published the same id, which consumers dedupe.
    """
    _announce(ctx, record, result)
    return msgspec.structs.replace(record, data={**record.data, "announced": True})


def _mark_announced(ctx: Context, record: Record) -> None:
    data = dict(record.data)
    data["announced"] = True
    # If the reconciler claimed it meanwhile, the event is out anyway; a re-publish carries the same id.
    with contextlib.suppress(Conflict, NotFound):
        ctx.ledger.save(msgspec.structs.replace(record, data=data))


def _reject(rejection: Rejection, *, ctx: Context, now: float, dequeue_count: int,
            reused_id: str | None = None) -> AcceptOutcome:
    """Write the terminal ``rejected`` record (once) and publish the reasons. Never retried."""
    by_digest = f"msg-{rejection.digest[:40]}"
    record_id = rejection.request_id or by_digest
    data: dict[str, Any] = {
        "reasons": [str(p) for p in rejection.problems],
        "problems": [{"field": p.field, "problem": p.problem, "fix": p.fix} for p in rejection.problems],
        "message": rejection.message, "digest": rejection.digest, "requestId": reused_id or rejection.request_id,
        "requester": rejection.requester, "cluster": rejection.cluster, "pool": rejection.pool_name,
        "dequeueCount": dequeue_count,
    }
    record = Record(kind=KIND, id=record_id, state=REJECTED, data=data, created_at=now, updated_at=now,
                    history=[{"at": now, "state": REJECTED, "note": rejection.message[:500]}])
    stored = _create_or_get(ctx, record)
    if stored.data.get("digest") != rejection.digest and record_id != by_digest:
        # The id belongs to another request: file this rejection under the message's digest instead.
        record = msgspec.structs.replace(record, id=by_digest)
        stored = _create_or_get(ctx, record)
    if not stored.data.get("announced"):
        _publish(ctx, EVENT_REJECTED, stored, {"reasons": data["reasons"], "problems": data["problems"],
                                               "message": rejection.message})
        _mark_announced(ctx, stored)
    log.info("pool request rejected (%s): %d problems", stored.id, len(rejection.problems))
    return AcceptOutcome(status="rejected", request_id=stored.id, message=rejection.message,
                         problems=rejection.problems)


def _create_or_get(ctx: Context, record: Record) -> Record:
    try:
        return ctx.ledger.create(record)
    except Conflict:
        existing = ctx.ledger.get(record.kind, record.id)
        if existing is None:
            raise Transient("record vanished right after a conflicting create") from None
        return existing


# =============================================================================== events


def _subject(record: Record) -> str:
    cluster, pool = record.data.get("cluster"), record.data.get("pool")
    if cluster and pool:
        return f"{cluster}/agentPools/{pool}"
    return f"/pool-requests/{record.id}"


def _publish(ctx: Context, type_: str, record: Record, extra: Mapping[str, Any]) -> None:
    data = {"requestId": record.data.get("requestId") or record.id, "requester": record.data.get("requester"),
            "cluster": record.data.get("cluster"), "poolName": record.data.get("pool"), **extra}
    event_id = f"pool-request/{record.id}/{type_.rsplit('.', 1)[-1]}"
    ctx.events.publish(type_=type_, subject=_subject(record), data=data, id_=event_id)


# =============================================================================== advance (reconciler)


def _request(record: Record) -> PoolRequest:
    return msgspec.convert(record.data["request"], PoolRequest)


def _later(record: Record, *, now: float, delay: float, **data: Any) -> Record:
    """Stay in the same state and look again after ``delay`` (no history line: waiting is not news)."""
    merged = dict(record.data)
    merged.update(data)
    return msgspec.structs.replace(record, data=merged, next_at=now + delay, updated_at=now)


def _fail(record: Record, ctx: Context, *, now: float, code: str, message: str, **data: Any) -> Record:
    error = {"code": code, "message": message[:2000]}
    outcome = {"state": FAILED, "stage": record.state, **error}
    _publish(ctx, EVENT_FAILED, record, {"stage": record.state, "error": error, **data})
    return record.moved(FAILED, at=now, note=f"{code}: {message}"[:500], next_at=0.0, error=error,
                        outcome=outcome, **data)


def _succeed(record: Record, ctx: Context, *, now: float, **outcome: Any) -> Record:
    result = {"state": SUCCEEDED, **outcome}
    _publish(ctx, EVENT_CREATED, record, {"outcome": result})
    return record.moved(SUCCEEDED, at=now, note="pool created and validated", next_at=0.0, outcome=result)


def advance(record: Record, ctx: Context) -> Record:
    """One short, idempotent step of a pool request; the reconciler saves what this returns.

    Throttled/Transient/Conflict propagate (the reconciler backs off and calls again); answers from
    Azure that will not change (Invalid, Forbidden, a failed provisioning) end the request as failed.
    """
    now = ctx.clock.now()
    if record.state not in ACTIVE_STATES:
        return record
    try:
        req = _request(record)
    except (KeyError, msgspec.ValidationError) as error:
        # Only this module writes the field; a record that does not decode cannot be advanced safely.
        return _fail(record, ctx, now=now, code="CorruptRecord", message=f"the stored request does not decode: {error}")
    return _STEPS[record.state](record, req, ctx, now)


def _deadline(record: Record, default: float) -> float:
    value = record.data.get("deadline")
    return float(value) if value is not None else default


# ----------------------------------------------------------------------------- accepted


def _step_accepted(record: Record, req: PoolRequest, ctx: Context, now: float) -> Record:
    policy = _policy(ctx)
    create_deadline = record.created_at + policy.create_timeout_s
    if now > create_deadline:
        return _fail(record, ctx, now=now, code="PoolCreateTimeout",
                     message=f"the pool could not be requested within {policy.create_timeout_s}s")
    aks = ctx.access.aks()
    try:
        cluster = aks.get_cluster(req.cluster)
    except NotFound:
        return _fail(record, ctx, now=now, code="ClusterNotFound", message=f"cluster {req.cluster} no longer exists")
    if cluster.node_provisioning_mode.lower() == "auto":
        return _start_nap(record, req, ctx, now, location=cluster.location, deadline=create_deadline)

    existing = aks.get_pool(req.cluster, req.pool_name)
    if existing is not None:
        return _adopt_or_refuse(record, req, ctx, now, existing, deadline=create_deadline)
    if _paused(ctx):
        return _later(record, now=now, delay=PAUSED_RETRY_S, waiting="STEWARD_PAUSED is set: no writes")
    body, preview = pool_spec.agent_pool_body(req)
    try:
        aks.begin_put_pool(req.cluster, req.pool_name, body, preview=preview)
    except Invalid as error:
        return _fail(record, ctx, now=now, code=error.code or "InvalidRequest", message=error.reason)
    except Forbidden as error:
        return _fail(record, ctx, now=now, code="AuthorizationFailed", message=str(error))
    except NotFound as error:
        return _fail(record, ctx, now=now, code="ClusterNotFound", message=str(error))
    except Conflict:
        # ARM 409: another operation on the cluster or pool is in progress. Ask again later.
        return _later(record, now=now, delay=policy.poll_interval_s, waiting="another operation is in progress")
    puts = int(record.data.get("puts", 0)) + 1
    return record.moved(CREATING, at=now, note=f"AgentPool PUT accepted ({'preview' if preview else 'stable'} api)",
                        next_at=now + policy.poll_interval_s, preview=preview, puts=puts, deadline=create_deadline,
                        nap=False)


def _adopt_or_refuse(record: Record, req: PoolRequest, ctx: Context, now: float, existing: PoolInfo, *,
                     deadline: float) -> Record:
    """A pool with the name exists: ours from an earlier (crashed) step, or someone else's."""
    if not pool_spec.created_by(existing.properties, req.request_id):
        return _fail(record, ctx, now=now, code="PoolNameTaken",
                     message=f"a node pool named {req.pool_name!r} already exists in the cluster (vmSize "
                             f"{existing.vm_size}) and was not created by this request; choose another poolName")
    differences = pool_spec.spec_differences(existing.properties, req)
    if differences:
        return _fail(record, ctx, now=now, code="PoolSpecMismatch",
                     message="the pool this request created differs from the request: " + "; ".join(differences))
    return record.moved(CREATING, at=now, note="pool already requested: following it", next_at=now,
                        deadline=deadline, nap=False, puts=max(1, int(record.data.get("puts", 0))))


def _start_nap(record: Record, req: PoolRequest, ctx: Context, now: float, *, location: str,
               deadline: float) -> Record:
    why = nap.unsupported(req)
    if why:
        return _fail(record, ctx, now=now, code="UnsupportedOnNodeAutoProvisioning", message=why)
    size = gpu_sizes.lookup(req.vm_size)
    if size is None:  # validated on accept; the catalogue changed since
        return _fail(record, ctx, now=now, code="UnknownVmSize", message=f"{req.vm_size} is no longer in the catalogue")
    kube = ctx.access.kube(req.cluster)
    objects = (nap.node_class(req), nap.node_pool(req, size=size, location=location))
    for obj in objects:
        current = kube.get_object(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        if current is not None and not nap.made_by(dict(current), req.request_id):
            return _fail(record, ctx, now=now, code="PoolNameTaken",
                         message=f"a {obj['kind']} named {req.pool_name!r} already exists and was not created by "
                                 "this request; choose another poolName")
    if _paused(ctx):
        return _later(record, now=now, delay=PAUSED_RETRY_S, waiting="STEWARD_PAUSED is set: no writes")
    for obj in objects:
        try:
            kube.apply_object(obj)
        except Invalid as error:
            return _fail(record, ctx, now=now, code=error.code or "InvalidKarpenterObject", message=error.reason)
    return record.moved(CREATING, at=now, note="NodePool and AKSNodeClass applied (node auto-provisioning)",
                        next_at=now, nap=True, deadline=deadline, location=location)


# ----------------------------------------------------------------------------- creating


def provisioning_error(pool: PoolInfo) -> tuple[str, str]:
    """Azure's error for a Failed pool, from wherever this api-version puts it."""
    props = pool.properties
    for candidate in ((props.get("status") or {}).get("provisioningError"), props.get("provisioningError"),
                      props.get("error")):
        if isinstance(candidate, Mapping) and candidate.get("code"):
            return str(candidate["code"]), str(candidate.get("message") or "")
    return "ProvisioningFailed", f"pool {pool.name} provisioningState is {pool.provisioning_state}"


def _step_creating(record: Record, req: PoolRequest, ctx: Context, now: float) -> Record:
    policy = _policy(ctx)
    deadline = _deadline(record, record.created_at + policy.create_timeout_s)
    if record.data.get("nap"):
        return _nap_created(record, req, ctx, now)
    pool = ctx.access.aks().get_pool(req.cluster, req.pool_name)
    if pool is None:
        if int(record.data.get("puts", 0)) >= MAX_PUTS:
            return _fail(record, ctx, now=now, code="PoolDisappeared",
                         message=f"the pool vanished after {MAX_PUTS} accepted PUTs")
        return record.moved(ACCEPTED, at=now, note="pool not visible after its PUT: requesting it again", next_at=now)
    if not pool_spec.created_by(pool.properties, req.request_id):
        return _fail(record, ctx, now=now, code="PoolNameTaken",
                     message=f"the node pool {req.pool_name!r} now belongs to another request or owner")
    state = pool.provisioning_state
    if state == "Succeeded":
        return record.moved(VALIDATING, at=now, note="pool provisioned; validating the GPU stack", next_at=now,
                            deadline=now + policy.validate_timeout_s)
    if state in ("Failed", "Canceled"):
        code, message = provisioning_error(pool)
        return _fail(record, ctx, now=now, code=code, message=message)
    if now > deadline:
        return _fail(record, ctx, now=now, code="PoolCreateTimeout",
                     message=f"the pool was still {state or 'not reporting a state'} after {policy.create_timeout_s}s")
    return _later(record, now=now, delay=policy.poll_interval_s, provisioningState=state)


def _nap_created(record: Record, req: PoolRequest, ctx: Context, now: float) -> Record:
    policy = _policy(ctx)
    kube = ctx.access.kube(req.cluster)
    missing = [kind for api, kind in ((nap.NODECLASS_API, "AKSNodeClass"), (nap.NODEPOOL_API, "NodePool"))
               if kube.get_object(api, kind, req.pool_name) is None]
    if missing:
        puts = int(record.data.get("puts", 0)) + 1
        if puts > MAX_PUTS:
            return _fail(record, ctx, now=now, code="PoolDisappeared",
                         message=f"{', '.join(missing)} vanished after being applied {MAX_PUTS} times")
        return record.moved(ACCEPTED, at=now, note=f"{', '.join(missing)} not found: applying again", next_at=now,
                            puts=puts)
    return record.moved(VALIDATING, at=now, note="Karpenter objects in place; validating", next_at=now,
                        deadline=now + policy.validate_timeout_s)


# ----------------------------------------------------------------------------- validating


def _observe(req: PoolRequest, record: Record, ctx: Context) -> tuple[PoolInfo | None, list[Any], int]:
    """The pool as ARM sees it, its nodes, and how many nodes it should have."""
    kube = ctx.access.kube(req.cluster)
    if record.data.get("nap"):
        # Karpenter makes nodes only for pending pods: none are expected before the sample job.
        pool = PoolInfo(cluster_id=req.cluster, name=req.pool_name,
                        properties={"provisioningState": "Succeeded", "gpuProfile": pool_spec.gpu_profile(req)})
        nodes = list(kube.list_nodes(label_selector=f"{nap.NODEPOOL_LABEL}={req.pool_name}"))
        return pool, nodes, 0
    pool = ctx.access.aks().get_pool(req.cluster, req.pool_name)
    if pool is not None:
        pool = PoolInfo(cluster_id=pool.cluster_id, name=pool.name,
                        properties=pool_spec.with_requested_mig(pool.properties, req))
    nodes = list(kube.list_nodes(label_selector=f"{AGENTPOOL_LABEL}={req.pool_name}"))
    return pool, nodes, req.node_count


def _step_validating(record: Record, req: PoolRequest, ctx: Context, now: float) -> Record:
    policy = _policy(ctx)
    pool, nodes, expected = _observe(req, record, ctx)
    if pool is None:
        return _fail(record, ctx, now=now, code="PoolDisappeared", message="the pool was deleted during validation")
    report = evaluate_stack(pool=pool, nodes=nodes, expected_count=expected, now=now)
    stack = {"ok": report.ok, "problems": list(report.problems), "readyNodes": report.ready_nodes,
             "gpuAllocatable": report.gpu_allocatable, "resources": dict(report.resources)}
    if report.ok:
        if req.validate_workload:
            return record.moved(TESTING, at=now, note="GPU stack healthy; running the sample GPU job", next_at=now,
                                stack=stack, deadline=now + policy.sample_job_timeout_s)
        return _succeed(record, ctx, now=now, nodes=report.ready_nodes, resources=dict(report.resources),
                        sampleJob="not requested", stack=stack)
    if now > _deadline(record, now):
        return _fail(record, ctx, now=now, code="StackValidationTimeout",
                     message=f"the GPU stack was not healthy after {policy.validate_timeout_s}s: "
                             + "; ".join(report.problems[:10]), stack=stack)
    return _later(record, now=now, delay=policy.poll_interval_s, stack=stack)


# ----------------------------------------------------------------------------- testing


def job_name(req: PoolRequest) -> str:
    digest = hashlib.sha256(req.request_id.encode()).hexdigest()[:10]
    return f"steward-gpu-check-{req.pool_name}-{digest}"


def gpu_request_resource(req: PoolRequest) -> str:
    """What the sample job asks for: one MIG instance on Mixed pools, else one ``nvidia.com/gpu``."""
    if req.mig_strategy == "Mixed" and req.mig_profile:
        size = gpu_sizes.lookup(req.vm_size)
        profile = size.mig_profile(req.mig_profile) if size else None
        if profile is not None:
            return profile.resource
    return GPU_RESOURCE


def sample_job(req: PoolRequest, *, policy: PoolRequestPolicy, nap_cluster: bool) -> dict[str, Any]:
    """A one-shot Job pinned to the pool, tolerating its taints, asking for one GPU (or MIG slice)."""
    selector = {nap.NODEPOOL_LABEL if nap_cluster else AGENTPOOL_LABEL: req.pool_name}
    tolerations = [{"key": k, "operator": "Equal", "value": v, "effect": e} if v else
                   {"key": k, "operator": "Exists", "effect": e} for k, v, e in pool_spec.pool_taints(req)]
    resource = gpu_request_resource(req)
    container: dict[str, Any] = {"name": "gpu-check", "image": policy.sample_job_image,
                                 "resources": {"limits": {resource: "1"}}}
    if policy.sample_job_args:
        container["args"] = list(policy.sample_job_args)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(req), "namespace": policy.sample_job_namespace,
                     "labels": {nap.LABEL_MANAGED_BY: nap.MANAGED_BY},
                     "annotations": {nap.ANNOTATION_REQUEST_ID: req.request_id}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": policy.sample_job_timeout_s,
            "ttlSecondsAfterFinished": 600,
            "template": {"metadata": {"labels": {nap.LABEL_MANAGED_BY: nap.MANAGED_BY}},
                         "spec": {"restartPolicy": "Never", "nodeSelector": selector, "tolerations": tolerations,
                                  "containers": [container]}},
        },
    }


def job_outcome(job: Mapping[str, Any]) -> str:
    """``succeeded``, ``failed`` or ``running`` from a Job's status."""
    status = job.get("status") or {}
    for cond in status.get("conditions") or ():
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    if int(status.get("succeeded") or 0) >= 1:
        return "succeeded"
    backoff = int(((job.get("spec") or {}).get("backoffLimit")) or 0)
    if int(status.get("failed") or 0) > backoff:
        return "failed"
    return "running"


def _delete_job(ctx: Context, req: PoolRequest, policy: PoolRequestPolicy) -> None:
    with contextlib.suppress(NotFound):
        ctx.access.kube(req.cluster).delete_object("batch/v1", "Job", job_name(req), policy.sample_job_namespace)


def _step_testing(record: Record, req: PoolRequest, ctx: Context, now: float) -> Record:
    policy = _policy(ctx)
    kube = ctx.access.kube(req.cluster)
    name, namespace = job_name(req), policy.sample_job_namespace
    deadline = _deadline(record, now + policy.sample_job_timeout_s)
    job = kube.get_object("batch/v1", "Job", name, namespace)
    if job is None:
        if now > deadline:
            return _fail(record, ctx, now=now, code="SampleJobTimeout",
                         message=f"the sample GPU job could not run within {policy.sample_job_timeout_s}s")
        if _paused(ctx):
            return _later(record, now=now, delay=PAUSED_RETRY_S, waiting="STEWARD_PAUSED is set: no writes")
        with contextlib.suppress(Conflict):  # created by an earlier run of this step
            kube.create_object(sample_job(req, policy=policy, nap_cluster=bool(record.data.get("nap"))))
        return _later(record, now=now, delay=policy.poll_interval_s, job={"name": name, "namespace": namespace})
    outcome = job_outcome(job)
    if outcome == "succeeded":
        _delete_job(ctx, req, policy)
        stack = record.data.get("stack") or {}
        return _succeed(record, ctx, now=now, nodes=stack.get("readyNodes"), resources=stack.get("resources"),
                        sampleJob="succeeded", stack=stack)
    if outcome == "failed":
        _delete_job(ctx, req, policy)
        return _fail(record, ctx, now=now, code="SampleJobFailed",
                     message=f"the sample GPU job {namespace}/{name} failed: {_job_reason(job)}")
    if now > deadline:
        _delete_job(ctx, req, policy)
        return _fail(record, ctx, now=now, code="SampleJobTimeout",
                     message=f"the sample GPU job did not complete within {policy.sample_job_timeout_s}s")
    return _later(record, now=now, delay=policy.poll_interval_s)


def _job_reason(job: Mapping[str, Any]) -> str:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Failed":
            return f"{cond.get('reason', '')} {cond.get('message', '')}".strip() or "failed"
    return "its pod failed"


_STEPS: dict[str, Callable[[Record, PoolRequest, Context, float], Record]] = {
    ACCEPTED: _step_accepted,
    CREATING: _step_creating,
    VALIDATING: _step_validating,
    TESTING: _step_testing,
}

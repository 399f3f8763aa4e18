"""The pool-request record's steps: from ``accepted`` to a managed GPU pool known to work.

:func:`advance` is called by the reconciler (shared.kernel.reconciler), which claims the record, calls
it once per step and saves what it returns (ETag-guarded). Each state has one step with the kernel's
contract, ``step(record, ctx, *, now, policy) -> Transition`` (shared.kernel.steps), which
re-observes the world first, so running a step twice, or after a crash between "pool requested" and
"record saved", is harmless: the pool is re-read and recognised by the steward's request-id and team
tags before anything is PUT again. The row itself is not believed: past ``accepted`` every step first
has the world show the request's own, recently made pool (shared.pools.proof), else the row ends
``blocked`` having touched nothing.

    accepted -> creating -> validating -> [testing] -> succeeded
        \\__________\\____________\\____________\\______-> failed (Azure's error, or a timeout)
    (queue) -> rejected (final, never retried; shared.pools.intake)
    (any active state) -> blocked (a row the world does not bear out; nothing touched)

On clusters with node auto-provisioning the "pool" is a Karpenter NodePool + AKSNodeClass
(shared.pools.nap) created through the Kubernetes API (create-only) instead of an AgentPool PUT.
Azure's refusals are told apart by error type (shared.kernel.errors, chosen by the adapter from ARM's codes), never
by message text. A failed request's pool is cleaned up by shared.pools.cleanup; the sample job is
shared.pools.sample_job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import gpu_sizes, scope
from shared.fleet.features import MANAGED_GPU_FEATURE, feature_registration_help
from shared.fleet.stack import evaluate_stack
from shared.kernel.errors import Conflict, FeatureNotRegistered, Forbidden, Invalid, LinkedAuthorizationFailed, NotFound
from shared.kernel.ports import KubePort, NodeView, PoolInfo, Record
from shared.kernel.steps import Transition, move, stay
from shared.pools import nap, proof, records
from shared.pools import policy as pool_policy
from shared.pools import spec as pool_spec
from shared.pools.cleanup import fail_created
from shared.pools.outcomes import block, fail, settle, succeed
from shared.pools.policy import PoolRequestPolicy
from shared.pools.recheck import recheck
from shared.pools.records import KIND, SampleJobResult, StackReport, State, builtins, typed
from shared.pools.request import PoolRequest
from shared.pools.sample_job import PAUSED_RETRY_S, step_testing

if TYPE_CHECKING:
    from shared.kernel.context import Context

__all__ = ["ACTIVE_STATES", "KIND", "advance", "give_up"]

log = logging.getLogger("steward.pool_creation")

ACTIVE_STATES = records.ACTIVE_STATES
MAX_PUTS = 3  # a pool that vanishes after its PUT was accepted is PUT again at most this often

Step = Callable[..., Transition]  # step(record, ctx, *, now, policy) -> Transition


def advance(record: Record, ctx: Context) -> Record:
    """One short, idempotent step of a pool request; the reconciler saves what this returns.

    Throttled/Transient/Conflict propagate (the reconciler backs off and calls again); answers from
    Azure that will not change (Invalid, Forbidden, a failed provisioning) end the request as failed.
    """
    now = ctx.clock.now()
    if record.state not in ACTIVE_STATES:
        return record
    policy = pool_policy.of(ctx.settings)
    try:
        record = records.normalised(record)
        data, req = typed(record)
    except msgspec.ValidationError as error:
        # Only this app writes the record; one that does not decode cannot be advanced safely.
        return settle(fail(record, now=now, code="CorruptRecord",
                           message=f"the stored request does not decode: {error}"), ctx)
    record, held = hold_if_paused(record, ctx, now=now, policy=policy, req=req)
    if held is not None:
        return records.normalised(settle(held, ctx))
    if record.state != State.ACCEPTED or data.failing is not None:
        # Past "accepted" a step follows (and may clean up) a pool this request made: the world must show it.
        refused, record = _proven(record, ctx, now=now, policy=policy, req=req, nap_pool=data.nap)
        if refused is not None:
            log.warning("pool request %s blocked in %s: %s", record.id, record.state, refused)
            return records.normalised(settle(block(record, now=now, code="RowNotProven", reason=refused), ctx))
    if data.failing is not None:  # decided to fail; the pool's cleanup had to wait for a running operation
        transition = fail_created(record, ctx, now=now, policy=policy, data=data, req=req, code=data.failing.code,
                                  message=data.failing.message, stack=data.failing.stack, job=data.failing.job)
    else:
        transition = STEPS[State(record.state)](record, ctx, now=now, policy=policy)
    return records.normalised(settle(transition, ctx))


def _proven(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy, req: PoolRequest,
            nap_pool: bool) -> tuple[str | None, Record]:
    """``(why the row is refused, record)``: the world's view of the request's pool (shared.pools.proof), and the
    record with its deadline floored at the pool's creation mark plus the state's timeout."""
    seen = proof.see(ctx, req, nap_pool=nap_pool, now=now, policy=policy)
    prefix = f"this {record.state} row names {req.pool_name!r} on {req.cluster.rstrip('/').rsplit('/', 1)[-1]}, but "
    if seen.refused:
        return prefix + seen.refused + "; nothing was created, changed or deleted", record
    if seen.born is None and (record.state == State.TESTING or (record.state == State.VALIDATING and nap_pool)):
        what = "its NodePool/AKSNodeClass do" if nap_pool else "the pool does"
        return prefix + f"{what} not exist: no sample job is run and nothing is cleaned up", record
    return None, proof.floored(record, born=seen.born, policy=policy)


def hold_if_paused(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy,
                   req: PoolRequest) -> tuple[Record, Transition | None]:
    """``(record, held)``: hold the request while its cluster carries ``gpu-fleet-steward/paused=true``.

    The tag is read from ARM at every step (shared.fleet.scope.cluster_paused). A request that has not made
    anything yet (``accepted``) waits, and fails ``ClusterPaused`` (nothing was created, nothing to clean
    up) once the pause has lasted longer than its create timeout. A request in flight holds where it is
    (no PUT, no Job, no cleanup) and its step deadline is moved on by the time it was held when the
    pause is lifted, so a pause never makes a validation time out.
    """
    why = scope.cluster_paused(ctx.access.aks(), req.cluster)
    data = records.decode(record.data)
    since = data.paused_since
    if not why:
        if since is None:
            return record, None
        shifted: dict[str, float | str | None] = {"paused_since": None, "waiting": ""}
        if data.deadline is not None:
            shifted["deadline"] = data.deadline + max(0.0, now - since)
        return record.moved(record.state, at=now, note="the cluster pause was lifted: resuming", next_at=now,
                            **shifted), None
    if record.state == State.ACCEPTED and now > record.created_at + policy.create_timeout_s:
        return record, fail(record, now=now, code="ClusterPaused",
                            message=f"{why} for longer than the create timeout ({policy.create_timeout_s:.0f}s): "
                                    "nothing was created; submit the request again once the pause is lifted")
    if since is None:
        return record, move(record, record.state, now=now, note=f"held: {why}", next_at=now + PAUSED_RETRY_S,
                            paused_since=now, waiting=why)
    return record, stay(record, now=now, until=now + PAUSED_RETRY_S, waiting=why)


def give_up(record: Record, ctx: Context, *, reason: str) -> Record:
    """The reconciler's hook after RECONCILE_MAX_PERMANENT_TRIES permanent errors in a row: ``failed``.

    The request ends with the reason (code ``GaveUp``) in its outcome and a ``Failed`` event. Nothing
    more is written to Azure: the errors that led here are the kind that repeating cannot cure, and a
    pool this request may have created is left as it is (the outcome says so) for an operator.
    """
    if record.state not in ACTIVE_STATES:
        return record
    now = ctx.clock.now()
    pool = record.data.get("pool") or "?"
    cleanup = None if record.state == State.ACCEPTED else records.Cleanup(
        action=records.CleanupAction.NONE, note=f"the request gave up in {record.state}: a pool or NodePool it may "
                                                 f"have created ({pool}) was left as it is")
    return settle(fail(record, now=now, code="GaveUp", message=reason, cleanup=cleanup), ctx)


# ----------------------------------------------------------------------------- accepted


def step_accepted(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy) -> Transition:
    """Judge the stored request again, then PUT the pool (or apply the Karpenter objects) once."""
    data, req = typed(record)
    create_deadline = record.created_at + policy.create_timeout_s
    if now > create_deadline:
        return fail(record, now=now, code="PoolCreateTimeout",
                    message=f"the pool could not be requested within {policy.create_timeout_s}s")
    broken = recheck(record, req, ctx, policy=policy)
    if broken:
        log.warning("pool request %s refused before creation: %s", record.id, "; ".join(broken))
        return block(record, now=now, code="RequestNotAllowed",
                     reason="the stored request breaks the rules it is judged by before any pool is created "
                            "(a ledger row edited after intake, or rules changed since): " + "; ".join(broken))
    aks = ctx.access.aks()
    try:
        cluster = aks.get_cluster(req.cluster)
    except NotFound:
        return fail(record, now=now, code="ClusterNotFound", message=f"cluster {req.cluster} no longer exists")
    if cluster.node_provisioning_mode.lower() == "auto":
        return _start_nap(record, ctx, now=now, req=req, location=cluster.location, deadline=create_deadline,
                          poll_s=policy.poll_interval_s)

    existing = aks.get_pool(req.cluster, req.pool_name)
    if existing is not None:
        return _adopt_or_refuse(record, now=now, req=req, existing=existing, deadline=create_deadline, puts=data.puts)
    if ctx.settings.paused:
        return stay(record, now=now, until=now + PAUSED_RETRY_S, waiting="STEWARD_PAUSED is set: no writes")
    body, api_version = pool_spec.agent_pool_body(req, created_at=now)
    try:
        aks.begin_put_pool(req.cluster, req.pool_name, body, api_version=api_version, create_only=True)
    except FeatureNotRegistered as error:
        return fail(record, now=now, code="PreviewFeatureNotRegistered",
                    message=feature_registration_help(error, subscription=scope.subscription_of(req.cluster)),
                    feature=error.feature or MANAGED_GPU_FEATURE)
    except Invalid as error:
        return fail(record, now=now, code=error.code or "InvalidRequest", message=error.reason)
    except LinkedAuthorizationFailed as error:
        return fail(record, now=now, code=error.code or "LinkedAuthorizationFailed", message=error.reason)
    except Forbidden as error:
        return fail(record, now=now, code="AuthorizationFailed", message=str(error))
    except NotFound as error:
        return fail(record, now=now, code="ClusterNotFound", message=str(error))
    except Conflict:  # ARM 409 (OperationInProgress...): another operation on the cluster or pool. Ask again later.
        return stay(record, now=now, until=now + policy.poll_interval_s, waiting="another operation is in progress")
    return move(record, State.CREATING, now=now, note=f"AgentPool PUT accepted (api-version {api_version})",
                next_at=now + policy.poll_interval_s, preview=api_version.endswith("-preview"), puts=data.puts + 1,
                deadline=create_deadline,
                nap=False)


def _adopt_or_refuse(record: Record, *, now: float, req: PoolRequest, existing: PoolInfo, deadline: float,
                     puts: int) -> Transition:
    """A pool with the name exists: ours from an earlier (crashed) step, or someone else's."""
    if not pool_spec.created_by(existing.properties, req.request_id, requester=req.requester):
        return fail(record, now=now, code="PoolNameTaken",
                    message=f"a node pool named {req.pool_name!r} already exists in the cluster (vmSize "
                            f"{existing.vm_size}) and was not created by this request; choose another poolName")
    differences = pool_spec.spec_differences(existing.properties, req)
    if differences:
        return fail(record, now=now, code="PoolSpecMismatch",
                    message="the pool this request created differs from the request: " + "; ".join(differences))
    return move(record, State.CREATING, now=now, note="pool already requested: following it", deadline=deadline,
                nap=False, puts=max(1, puts))


def _start_nap(record: Record, ctx: Context, *, now: float, req: PoolRequest, location: str,
               deadline: float, poll_s: float) -> Transition:
    why = nap.unsupported(req)
    if why:
        return fail(record, now=now, code="UnsupportedOnNodeAutoProvisioning", message=why)
    size = gpu_sizes.lookup(req.vm_size)
    if size is None:  # validated on accept; the catalogue changed since
        return fail(record, now=now, code="UnknownVmSize", message=f"{req.vm_size} is no longer in the catalogue")
    kube = ctx.access.kube(req.cluster)
    objects = (nap.node_class(req, created_at=now), nap.node_pool(req, size=size, location=location, created_at=now))
    found: dict[str, Mapping[str, Any] | None] = {}
    for obj in objects:
        current = kube.get_object(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        if current is not None and not nap.made_by(dict(current), req.request_id, requester=req.requester):
            return fail(record, now=now, code="PoolNameTaken",
                        message=f"a {obj['kind']} named {req.pool_name!r} already exists and was not created by "
                                "this request; choose another poolName")
        found[obj["kind"]] = current
    if ctx.settings.paused:
        return stay(record, now=now, until=now + PAUSED_RETRY_S, waiting="STEWARD_PAUSED is set: no writes")
    for obj in objects:
        try:
            _write_karpenter(kube, obj, found[obj["kind"]])
        except (Conflict, NotFound):  # made, changed or deleted since the read: judged again from a fresh read
            return stay(record, now=now, until=now + poll_s,
                        waiting=f"the {obj['kind']} {req.pool_name} changed since it was read; reading it again")
        except Invalid as error:
            return fail(record, now=now, code=error.code or "InvalidKarpenterObject", message=error.reason)
    return move(record, State.CREATING, now=now, note="NodePool and AKSNodeClass created (node auto-provisioning)",
                nap=True, deadline=deadline, location=location)


def _write_karpenter(kube: KubePort, obj: Mapping[str, Any], current: Mapping[str, Any] | None) -> None:
    """Create ``obj`` (create-only: 409 if the name was taken since the read), or bring this request's own
    ``current`` object back to ``obj``, replacing exactly the ``resourceVersion`` read and checked (409 if it
    changed since). Nothing is written when ``current`` already says what ``obj`` says."""
    if current is None:
        kube.create_object(obj)
        return
    meta = dict(current.get("metadata") or {})
    spec = dict(current.get("spec") or {})
    if all(spec.get(key) == value for key, value in obj["spec"].items()):
        return
    version = meta.get("resourceVersion")
    if not version:
        raise Conflict(f"{obj['kind']} {meta.get('name')} was read without a resourceVersion")
    annotations = {**obj["metadata"]["annotations"], **{k: v for k, v in (meta.get("annotations") or {}).items()
                                                         if k == nap.ANNOTATION_CREATED_AT}}
    kube.apply_object({**obj, "metadata": {**obj["metadata"], "annotations": annotations, "resourceVersion": version}})


# ----------------------------------------------------------------------------- creating


def step_creating(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy) -> Transition:
    """Follow the pool until ARM says Succeeded (then validate), Failed (then clean up and fail), or time runs out."""
    data, req = typed(record)
    deadline = data.deadline if data.deadline is not None else record.created_at + policy.create_timeout_s
    if data.nap:
        return _nap_created(record, ctx, now=now, policy=policy, req=req, puts=data.puts)
    pool = ctx.access.aks().get_pool(req.cluster, req.pool_name)
    if pool is None:
        if data.puts >= MAX_PUTS:
            return fail(record, now=now, code="PoolDisappeared", message=f"the pool vanished after {MAX_PUTS} accepted PUTs")
        return move(record, State.ACCEPTED, now=now, note="pool not visible after its PUT: requesting it again")
    if not pool_spec.created_by(pool.properties, req.request_id, requester=req.requester):
        return fail(record, now=now, code="PoolNameTaken",
                    message=f"the node pool {req.pool_name!r} now belongs to another request or owner")
    state = pool.provisioning_state
    if state == "Succeeded":
        return move(record, State.VALIDATING, now=now, note="pool provisioned; validating the GPU stack",
                    deadline=now + policy.validate_timeout_s)
    if state in ("Failed", "Canceled"):
        code, message = pool.provisioning_error
        return fail_created(record, ctx, now=now, policy=policy, data=data, req=req, code=code, message=message)
    if now > deadline:
        return fail_created(record, ctx, now=now, policy=policy, data=data, req=req, code="PoolCreateTimeout",
                            message=f"the pool was still {state or 'not reporting a state'} after "
                                    f"{policy.create_timeout_s}s")
    return stay(record, now=now, until=now + policy.poll_interval_s, provisioning_state=state)


def _nap_created(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy, req: PoolRequest,
                 puts: int) -> Transition:
    kube = ctx.access.kube(req.cluster)
    missing = [kind for api, kind in ((nap.NODECLASS_API, "AKSNodeClass"), (nap.NODEPOOL_API, "NodePool"))
               if kube.get_object(api, kind, req.pool_name) is None]
    if missing:
        if puts + 1 > MAX_PUTS:
            return fail(record, now=now, code="PoolDisappeared",
                        message=f"{', '.join(missing)} vanished after being applied {MAX_PUTS} times")
        return move(record, State.ACCEPTED, now=now, note=f"{', '.join(missing)} not found: applying again", puts=puts + 1)
    return move(record, State.VALIDATING, now=now, note="Karpenter objects in place; validating",
                deadline=now + policy.validate_timeout_s)


# ----------------------------------------------------------------------------- validating


def _observe(ctx: Context, req: PoolRequest, *, nap_pool: bool) -> tuple[PoolInfo | None, list[NodeView], int]:
    """The pool as ARM sees it, its nodes, and how many nodes it should have."""
    kube = ctx.access.kube(req.cluster)
    if nap_pool:
        # Karpenter makes nodes only for pending pods: none are expected before the sample job.
        karpenter = PoolInfo(cluster_id=req.cluster, name=req.pool_name,
                             properties={"provisioningState": "Succeeded", "gpuProfile": pool_spec.gpu_profile(req)})
        return karpenter, list(kube.list_nodes(label_selector=f"{nap.NODEPOOL_LABEL}={req.pool_name}")), 0
    found = ctx.access.aks().get_pool(req.cluster, req.pool_name)
    pool = None if found is None else PoolInfo(cluster_id=found.cluster_id, name=found.name,
                                               properties=pool_spec.with_requested_mig(found.properties, req))
    return pool, list(kube.list_nodes(label_selector=f"{pool_spec.AGENTPOOL_LABEL}={req.pool_name}")), req.node_count


def step_validating(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy) -> Transition:
    """Check the GPU stack on the pool's nodes until it is healthy (then test or succeed) or time runs out."""
    data, req = typed(record)
    pool, nodes, expected = _observe(ctx, req, nap_pool=data.nap)
    if pool is None:
        return fail(record, now=now, code="PoolDisappeared", message="the pool was deleted during validation")
    report = evaluate_stack(pool=pool, nodes=nodes, expected_count=expected, now=now)
    stack = StackReport(ok=report.ok, problems=list(report.problems), ready_nodes=report.ready_nodes,
                        gpu_allocatable=report.gpu_allocatable, resources=dict(report.resources))
    if report.ok:
        if req.validate_workload:
            return move(record, State.TESTING, now=now, note="GPU stack healthy; running the sample GPU job",
                        stack=builtins(stack), deadline=now + policy.sample_job_timeout_s)
        return succeed(record, now=now, stack=stack, sample_job=SampleJobResult.NOT_REQUESTED)
    if now > (data.deadline if data.deadline is not None else now):
        return fail_created(record, ctx, now=now, policy=policy, data=data, req=req, code="StackValidationTimeout",
                            message=f"the GPU stack was not healthy after {policy.validate_timeout_s}s: "
                                    + "; ".join(report.problems[:10]), stack=stack)
    return stay(record, now=now, until=now + policy.poll_interval_s, stack=builtins(stack))


STEPS: Mapping[State, Step] = {
    State.ACCEPTED: step_accepted,
    State.CREATING: step_creating,
    State.VALIDATING: step_validating,
    State.TESTING: step_testing,
}

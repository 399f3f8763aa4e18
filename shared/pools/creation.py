"""The pool-request record: from a queue message to a managed GPU pool known to work.

Two entry points. :func:`accept` runs in the queue trigger: it validates the message and writes
the durable record (or a terminal ``rejected`` record with every reason), then returns quickly;
creating a GPU pool takes many minutes and is never waited for inside one invocation.
:func:`advance` is called by the reconciler (shared.kernel.reconciler), which claims the record, calls it
once per step and saves what it returns (ETag-guarded). Each step re-observes the world first, so
running a step twice, or after a crash between "pool requested" and "record saved", is harmless:
the pool is re-read and recognised by the steward's request-id tag before anything is PUT again.

    accepted -> creating -> validating -> [testing] -> succeeded
        \\__________\\____________\\____________\\______-> failed (Azure's error, or a timeout)
    (queue) -> rejected (final, never retried)

On clusters with node auto-provisioning the "pool" is a Karpenter NodePool + AKSNodeClass
(shared.pools.nap) applied through the Kubernetes API instead of an AgentPool PUT.

A pool this request created whose provisioning fails, or whose validation (stack check, sample job)
fails or times out, is not left billing: it is deleted, or scaled to zero, as
POOL_REQUEST_FAILED_POOL_ACTION says (default ``delete``), unless workload pods already run on it;
the failed outcome's ``cleanup`` says which. Azure's refusals are told apart by error type
(shared.kernel.errors, chosen by the adapter from ARM's codes), never by message text; a preview feature
that the subscription has not registered fails the request with the registration commands.

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

from shared.adapters.aks import error_of_detail, pool_etag
from shared.adapters.ledger import PROPERTY_LIMIT_BYTES, to_entity
from shared.fleet import gpu_sizes, pool_clone, scope
from shared.fleet.stack import GPU_RESOURCE, evaluate_stack
from shared.kernel.errors import (
    Conflict,
    FeatureNotRegistered,
    Forbidden,
    Invalid,
    LinkedAuthorizationFailed,
    NotFound,
    Transient,
)
from shared.kernel.ports import PoolInfo, Record
from shared.pools import nap, teams
from shared.pools import spec as pool_spec
from shared.pools.policy import PoolRequestPolicy
from shared.pools.request import PoolRequest, Problem, Rejection, ValidatedRequest, evidence, parse_and_validate
from shared.settings import DEFAULT_STEWARD_NAMESPACE

if TYPE_CHECKING:
    from shared.kernel.context import Context
    from shared.pools.teams import Team

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
    """``in_scope(cluster_id)`` for validation: the fleet scope of shared.fleet.scope, read from ARM.

    A cluster in a subscription outside FLEET_SUBSCRIPTIONS is refused without any ARM call; one
    ARM cannot find or will not show us is out of scope too. Throttled/Transient propagate (the
    queue retries the message).
    """
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


def accept(raw: bytes | str, *, dequeue_count: int, ctx: Context, team: Team | None = None) -> AcceptOutcome:
    """Validate one queue message and record it. Raises only Throttled/Transient (retry the message).

    ``team`` is the team whose queue the message came from (shared.pools.teams; the trigger always
    passes it): it becomes the request's requester whatever the message claims, and the request
    must stay within the team's clusters, sizes and GPUs per request. ``None`` applies no team
    rules; only tests and tools that call this directly use it.
    """
    now = ctx.clock.now()
    result = parse_and_validate(raw, policy=_policy(ctx), in_scope=scope_check(ctx),
                                requester=team.name if team is not None else None)
    if isinstance(result, Rejection):
        return _reject(result, ctx=ctx, now=now, dequeue_count=dequeue_count)
    if team is not None:
        req = result.request
        found = _team_violations(ctx, team, result)
        if found:
            rejection = Rejection(tuple(Problem(v.field, v.problem, v.fix) for v in found), request_id=req.request_id,
                                  requester=team.name, cluster=req.cluster, pool_name=req.pool_name, **evidence(raw))
            return _reject(rejection, ctx=ctx, now=now, dequeue_count=dequeue_count)

    def fresh(v: ValidatedRequest, *, now: float, dequeue_count: int) -> Record:
        record = _new_record(v, now=now, dequeue_count=dequeue_count)
        if team is None:
            return record
        return msgspec.structs.replace(record, data={**record.data, "team": team.name, "queue": team.queue,
                                                     "claimedRequester": v.claimed_requester})

    too_large = _too_large_to_record(fresh(result, now=now, dequeue_count=dequeue_count))
    if too_large is not None:  # before anything is published: Accepted must never precede a failed write
        req = result.request
        rejection = Rejection((too_large,), request_id=req.request_id, requester=req.requester, cluster=req.cluster,
                              pool_name=req.pool_name, **evidence(raw))
        return _reject(rejection, ctx=ctx, now=now, dequeue_count=dequeue_count)

    existing = ctx.ledger.get(KIND, result.request_id)
    if existing is None:
        try:
            existing = ctx.ledger.create(_announced(ctx, fresh(result, now=now, dequeue_count=dequeue_count),
                                                    result))
            status = "accepted"
        except Conflict:  # another delivery of a message with this id won the race
            existing = ctx.ledger.get(KIND, result.request_id)
            if existing is None:
                raise Transient("pool request record vanished right after a conflicting create") from None
            status = "duplicate"
    elif existing.state == REJECTED and existing.data.get("fingerprint") is None:
        # A rejected id may be reused by the corrected request: the rejection stays in its history.
        replacement = fresh(result, now=now, dequeue_count=dequeue_count)
        replacement = msgspec.structs.replace(replacement, etag=existing.etag,
                                              history=[*existing.history, *replacement.history][-50:])
        replacement = _announced(ctx, replacement, result)
        try:
            existing = ctx.ledger.save(replacement)
        except (Conflict, NotFound):
            raise Transient("pool request record changed while replacing a rejection; retry") from None
        status = "accepted"
    else:
        status = "duplicate"

    if existing.data.get("fingerprint") != result.fingerprint:
        reuse = Problem("requestId", f"{result.request_id!r} was already used for a different request "
                        f"(now {existing.state})",
                        "use a new requestId for a new request; resend the original unchanged to retry it")
        rejection = Rejection((reuse,), request_id=None, requester=result.request.requester,
                              cluster=result.request.cluster, pool_name=result.request.pool_name, **evidence(raw))
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
    """Write the terminal ``rejected`` record (once) and publish the reasons. Never retried.

    The record and the Rejected event carry the message's sha256, size and first bytes (escaped,
    shared.pools.request.escape_head) so an operator can see what was sent. Problems beyond
    :data:`MAX_PROBLEMS_RECORDED`, or beyond what fits the ledger's property limit, are counted but
    not listed: a rejection that cannot be recorded would be retried into the poison queue.
    """
    by_digest = f"msg-{rejection.digest[:40]}"
    record_id = rejection.request_id or by_digest
    total = len(rejection.problems)
    shown = min(total, MAX_PROBLEMS_RECORDED)
    while True:
        problems = rejection.problems[:shown]
        message = f"pool request rejected: {total} problem{'s' if total != 1 else ''}" \
            + "".join(f"\n- {p}" for p in problems) + (f"\n- ... and {total - shown} more" if shown < total else "")
        data: dict[str, Any] = {
            "reasons": [str(p) for p in problems],
            "problems": [{"field": p.field, "problem": p.problem, "fix": p.fix} for p in problems],
            "problemCount": total,
            "message": message, "digest": rejection.digest, "messageBytes": rejection.size,
            "messageHead": rejection.head, "requestId": reused_id or rejection.request_id,
            "requester": rejection.requester, "cluster": rejection.cluster, "pool": rejection.pool_name,
            "dequeueCount": dequeue_count,
        }
        record = Record(kind=KIND, id=record_id, state=REJECTED, data=data, created_at=now, updated_at=now,
                        history=[{"at": now, "state": REJECTED, "note": message[:500]}])
        if shown == 0 or _too_large_to_record(record) is None:
            break
        shown //= 2
    stored = _create_or_get(ctx, record)
    if stored.data.get("digest") != rejection.digest and record_id != by_digest:
        # The id belongs to another request: file this rejection under the message's digest instead.
        record = msgspec.structs.replace(record, id=by_digest)
        stored = _create_or_get(ctx, record)
    if not stored.data.get("announced"):
        _publish(ctx, EVENT_REJECTED, stored, {
            "reasons": data["reasons"], "problems": data["problems"], "problemCount": total, "message": message,
            "digest": rejection.digest, "messageBytes": rejection.size, "messageHead": rejection.head})
        _mark_announced(ctx, stored)
    log.info("pool request rejected (%s): %d problems, sha256 %s", stored.id, total, rejection.digest)
    return AcceptOutcome(status="rejected", request_id=stored.id, message=message, problems=problems)


# What a pool-request record may weigh when it is first written. The ledger keeps ``data`` as one
# JSON string property, and Azure Table storage allows 64 KiB per string property (UTF-16, so 32 Ki
# characters; json.dumps escapes non-ASCII as \uXXXX, 12 bytes a character) and 1 MiB per entity
# (https://learn.microsoft.com/rest/api/storageservices/understanding-the-table-service-data-model).
# The entity limit never binds: data <= 64 KiB + history <= 48 KiB (shared.adapters.ledger) + a few scalars.
# The steps after acceptance add to ``data`` (PUT count, stack verdict, job, at most 2 x 2,000
# characters of Azure's error on failure, about 10 KiB at worst as UTF-16), so the first write keeps
# RECORD_GROWTH_RESERVE_BYTES free: a request that would start closer to the limit could be
# accepted and then fail to save its progress.
RECORD_GROWTH_RESERVE_BYTES = 16 * 1024
RECORD_START_BUDGET_BYTES = PROPERTY_LIMIT_BYTES - RECORD_GROWTH_RESERVE_BYTES
MAX_PROBLEMS_RECORDED = 20


def _too_large_to_record(record: Record) -> Problem | None:
    """Why ``record`` may not be written as it is (its ``data`` over the start budget), or None."""
    try:
        size = len(to_entity(record)["data"].encode("utf-16-le"))
    except Invalid:  # already over the property limit itself
        size = PROPERTY_LIMIT_BYTES + 1
    if size <= RECORD_START_BUDGET_BYTES:
        return None
    shown = f"{size} bytes" if size <= PROPERTY_LIMIT_BYTES else f"more than {PROPERTY_LIMIT_BYTES} bytes"
    return Problem("$", f"the request is valid but too large to record: it would be stored as {shown} "
                   f"(UTF-16 JSON), over the {RECORD_START_BUDGET_BYTES} bytes a request may take "
                   f"(Azure Table storage holds {PROPERTY_LIMIT_BYTES} bytes per property; "
                   f"{RECORD_GROWTH_RESERVE_BYTES} are kept for the request's progress)",
                   "send fewer or shorter tags and labels (non-ASCII characters count six times); "
                   f"about {RECORD_START_BUDGET_BYTES // 2 - 4096} ASCII characters of request fit")


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
    if data.get("cleanup"):
        outcome["cleanup"] = data["cleanup"]
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
    record, held = hold_if_paused(record, req, ctx, now=now)
    if held:
        return record
    failing = record.data.get("failing")
    if isinstance(failing, Mapping):  # decided to fail; the pool's cleanup had to wait for a running operation
        return _fail_created(record, req, ctx, now, code=str(failing.get("code")), message=str(failing.get("message")),
                             **dict(failing.get("data") or {}))
    return _STEPS[record.state](record, req, ctx, now)


def _deadline(record: Record, default: float) -> float:
    value = record.data.get("deadline")
    return float(value) if value is not None else default


# ----------------------------------------------------------------------------- accepted


def recheck(record: Record, req: PoolRequest, ctx: Context) -> list[str]:
    """Every rule the stored request breaks now; empty when it may still be created.

    The ledger is not the truth: anyone who can write the table can put an ``accepted`` row there,
    or rewrite a T4 request into 125 H100s. So before the one step that spends money (the PUT),
    the stored request is judged again exactly as a queue message would be: the seed's rules
    (:func:`shared.pools.request.parse_and_validate`), the cluster's scope (tags read from ARM now)
    and, when teams are configured, the rules of the team it names (clusters, sizes, GPUs per
    request and in total, shared.pools.teams). A rule that changed since intake (a size dropped from a
    team, a cluster leaving scope) refuses the request too: it is judged by today's rules.
    """
    result = parse_and_validate(msgspec.json.encode(msgspec.to_builtins(req)), policy=_policy(ctx),
                                in_scope=scope_check(ctx))
    if isinstance(result, Rejection):
        return [f"{p.field}: {p.problem}" for p in result.problems]
    problems: list[str] = []
    if record.id != req.request_id:
        problems.append(f"requestId: the record {record.id!r} holds request {req.request_id!r}")
    configured = tuple(getattr(ctx.settings, "teams", ()) or ())
    if not configured:
        return problems
    team = teams.by_name(configured, req.requester)
    if team is None:
        return [*problems, f"requester: {req.requester!r} is not a team of {teams.SETTING}"]
    return [*problems, *(f"{v.field}: {v.problem}" for v in _team_violations(ctx, team, result))]


def _team_violations(ctx: Context, team: Team, result: ValidatedRequest) -> list[teams.Violation]:
    """``team``'s rules over a valid request (its GPUs in use read from ARM and the ledger when it has a total)."""
    req = result.request
    in_use = None
    if team.max_gpus_total is not None:
        from shared.pools import team_usage

        in_use = team_usage.gpus_in_use(ctx, team, exclude_request_id=req.request_id)
    return teams.violations(team, cluster=req.cluster, vm_size=result.size.name, gpus_per_vm=result.size.gpus,
                            count=req.count, autoscale_max=req.autoscale.max if req.autoscale else None,
                            in_use=in_use)


def _step_accepted(record: Record, req: PoolRequest, ctx: Context, now: float) -> Record:
    policy = _policy(ctx)
    create_deadline = record.created_at + policy.create_timeout_s
    if now > create_deadline:
        return _fail(record, ctx, now=now, code="PoolCreateTimeout",
                     message=f"the pool could not be requested within {policy.create_timeout_s}s")
    broken = recheck(record, req, ctx)
    if broken:
        log.warning("pool request %s refused before creation: %s", record.id, "; ".join(broken))
        return _fail(record, ctx, now=now, code="RequestNotAllowed",
                     message="the stored request breaks the rules it is judged by before any pool is created "
                             "(a ledger row edited after intake, or rules changed since): " + "; ".join(broken))
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
        aks.begin_put_pool(req.cluster, req.pool_name, body, preview=preview, create_only=True)
    except FeatureNotRegistered as error:
        return _fail(record, ctx, now=now, code="PreviewFeatureNotRegistered",
                     message=feature_registration_help(error, subscription=scope.subscription_of(req.cluster)),
                     feature=error.feature or MANAGED_GPU_FEATURE)
    except Invalid as error:
        return _fail(record, ctx, now=now, code=error.code or "InvalidRequest", message=error.reason)
    except LinkedAuthorizationFailed as error:
        return _fail(record, ctx, now=now, code=error.code or "LinkedAuthorizationFailed", message=error.reason)
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
    """Azure's error for a Failed pool, from wherever this api-version puts it.

    The code is the most specific one its ``details[]`` name (shared.adapters.aks.error_of_detail): Compute's
    ``QuotaExceeded`` inside AKS's ``InvalidTemplateDeployment``, not the wrapper.
    """
    props = pool.properties
    for candidate in ((props.get("status") or {}).get("provisioningError"), props.get("provisioningError"),
                      props.get("error")):
        if isinstance(candidate, Mapping) and candidate.get("code"):
            specific = error_of_detail(candidate)
            return str(getattr(specific, "code", None) or candidate["code"]), str(candidate.get("message") or "")
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
        return _fail_created(record, req, ctx, now, code=code, message=message)
    if now > deadline:
        return _fail_created(record, req, ctx, now, code="PoolCreateTimeout",
                             message=f"the pool was still {state or 'not reporting a state'} after "
                                     f"{policy.create_timeout_s}s")
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
        return _fail_created(record, req, ctx, now, code="StackValidationTimeout",
                             message=f"the GPU stack was not healthy after {policy.validate_timeout_s}s: "
                                     + "; ".join(report.problems[:10]), stack=stack)
    return _later(record, now=now, delay=policy.poll_interval_s, stack=stack)


# ----------------------------------------------------------------------------- testing


#: The sample job's numeric user and group. Pod Security ``restricted`` (the app's namespace enforces it)
#: needs runAsNonRoot, and a numeric runAsUser lets the kubelet verify it without trusting the image's
#: USER. NVIDIA's CUDA samples do not need root: the vectorAdd binary is world-executable and the GPU
#: device nodes the device plugin passes in are mode 0666, so any non-root uid can use the GPU (NVIDIA's
#: own OpenShift check of cuda-sample runs it with runAsNonRoot under an arbitrary non-root uid). 65534
#: ("nobody") would do as well; 1000 is the conventional first unprivileged user.
SAMPLE_JOB_UID = 1000
JOB_API = "batch/v1"


def app_namespace(ctx: Context) -> str:
    """Where the sample job runs: the app's own namespace (setting STEWARD_NAMESPACE, default
    gpu-fleet-steward, infra/kubernetes/namespace.yaml), where its Role grants Jobs create/get/delete."""
    return str(getattr(ctx.settings, "namespace", "") or DEFAULT_STEWARD_NAMESPACE)


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


def sample_job(req: PoolRequest, *, policy: PoolRequestPolicy, nap_cluster: bool, namespace: str) -> dict[str, Any]:
    """A one-shot Job pinned to the pool, tolerating its taints, asking for one GPU (or MIG slice).

    Least privilege: it runs in the app's own ``namespace``, from an image pinned by digest, with no
    service-account token mounted (it never calls the API server) and a security context that passes
    Pod Security ``restricted``: non-root numeric user, no privilege escalation, every capability
    dropped, the runtime's default seccomp profile. Its annotation names the request that made it.
    """
    selector = {nap.NODEPOOL_LABEL if nap_cluster else AGENTPOOL_LABEL: req.pool_name}
    tolerations = [{"key": k, "operator": "Equal", "value": v, "effect": e} if v else
                   {"key": k, "operator": "Exists", "effect": e} for k, v, e in pool_spec.pool_taints(req)]
    resource = gpu_request_resource(req)
    container: dict[str, Any] = {
        "name": "gpu-check", "image": policy.sample_job_image, "resources": {"limits": {resource: "1"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "runAsUser": SAMPLE_JOB_UID, "runAsGroup": SAMPLE_JOB_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if policy.sample_job_args:
        container["args"] = list(policy.sample_job_args)
    return {
        "apiVersion": JOB_API,
        "kind": "Job",
        "metadata": {"name": job_name(req), "namespace": namespace,
                     "labels": {nap.LABEL_MANAGED_BY: nap.MANAGED_BY},
                     "annotations": {nap.ANNOTATION_REQUEST_ID: req.request_id}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": policy.sample_job_timeout_s,
            "ttlSecondsAfterFinished": 600,
            "template": {"metadata": {"labels": {nap.LABEL_MANAGED_BY: nap.MANAGED_BY}},
                         "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                                  "securityContext": {"runAsNonRoot": True, "runAsUser": SAMPLE_JOB_UID,
                                                      "runAsGroup": SAMPLE_JOB_UID,
                                                      "seccompProfile": {"type": "RuntimeDefault"}},
                                  "nodeSelector": selector, "tolerations": tolerations,
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


def _job_uid(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("uid") or "")


def _pod_essentials(job: Mapping[str, Any]) -> dict[str, Any]:
    """What decides what the sample job's pod runs and as whom (fields the API server does not default)."""
    pod = (((job.get("spec") or {}).get("template") or {}).get("spec")) or {}
    return {"automountServiceAccountToken": pod.get("automountServiceAccountToken"),
            "securityContext": pod.get("securityContext"), "nodeSelector": pod.get("nodeSelector"),
            "containers": [{"name": c.get("name"), "image": c.get("image"), "command": c.get("command"),
                            "args": c.get("args"), "securityContext": c.get("securityContext"),
                            "limits": (c.get("resources") or {}).get("limits")}
                           for c in pod.get("containers") or ()],
            "initContainers": len(pod.get("initContainers") or ())}


def job_not_ours(job: Mapping[str, Any], *, request_id: str, uid: str, expected: Mapping[str, Any]) -> str | None:
    """Why ``job`` is not the sample job this request created, or None when it is.

    It must carry the request's annotation, and have the uid recorded in the ledger when the request
    created it. With no uid recorded (the create went through but saving the record did not), the Job
    is adopted only if it runs exactly the pod this request would create. A Job that is not ours is
    never read as a pass and never deleted: a same-named Job made by someone else could otherwise
    "prove" a broken pool, or be deleted by the steward.
    """
    meta = job.get("metadata") or {}
    claimed = (meta.get("annotations") or {}).get(nap.ANNOTATION_REQUEST_ID)
    if claimed != request_id:
        return (f"it does not carry this request's annotation {nap.ANNOTATION_REQUEST_ID}={request_id}"
                + (f" (it says {str(claimed)[:80]!r})" if claimed else ""))
    if uid:
        if _job_uid(job) != uid:
            return f"its uid {_job_uid(job) or '(none)'} is not {uid}, the uid of the Job this request created"
        return None
    if _pod_essentials(job) != _pod_essentials(expected):
        return "its pod template is not the one this request creates (image, command, security context or placement)"
    return None


def _delete_job(ctx: Context, req: PoolRequest, job: Mapping[str, Any], *, uid: str) -> None:
    """Delete the sample job, only when ``job`` (just read) is the one this request created."""
    meta = job.get("metadata") or {}
    if not uid or _job_uid(job) != uid:
        log.warning("pool request %s: not deleting Job %s/%s (uid %s), not the one it created (%s)", req.request_id,
                    meta.get("namespace"), meta.get("name"), _job_uid(job), uid or "none recorded")
        return
    try:  # the uid travels as a precondition: a Job that took the name since the read is not deleted
        ctx.access.kube(req.cluster).delete_object(JOB_API, "Job", str(meta.get("name")), str(meta.get("namespace")),
                                                   uid=uid)
    except NotFound:
        return
    except Conflict:
        log.warning("pool request %s: Job %s/%s was replaced by another since it was read; not deleted",
                    req.request_id, meta.get("namespace"), meta.get("name"))


def _step_testing(record: Record, req: PoolRequest, ctx: Context, now: float) -> Record:
    policy = _policy(ctx)
    kube = ctx.access.kube(req.cluster)
    name, namespace = job_name(req), app_namespace(ctx)
    expected = sample_job(req, policy=policy, nap_cluster=bool(record.data.get("nap")), namespace=namespace)
    recorded = record.data.get("job")
    uid = ""
    if isinstance(recorded, Mapping) and recorded.get("name") == name and recorded.get("namespace") == namespace:
        uid = str(recorded.get("uid") or "")
    deadline = _deadline(record, now + policy.sample_job_timeout_s)
    job = kube.get_object(JOB_API, "Job", name, namespace)
    if job is None:
        if now > deadline:
            return _fail_created(record, req, ctx, now, code="SampleJobTimeout",
                                 message=f"the sample GPU job could not run within {policy.sample_job_timeout_s}s")
        if _paused(ctx):
            return _later(record, now=now, delay=PAUSED_RETRY_S, waiting="STEWARD_PAUSED is set: no writes")
        try:
            created = kube.create_object(expected)
        except Conflict:  # a Job of that name appeared since the read: judged (ours or not) on the next pass
            return _later(record, now=now, delay=policy.poll_interval_s)
        # the uid the API server gave it: the only proof, later, that a Job of this name is ours
        return _later(record, now=now, delay=policy.poll_interval_s,
                      job={"name": name, "namespace": namespace, "uid": _job_uid(created)})
    problem = job_not_ours(job, request_id=req.request_id, uid=uid, expected=expected)
    if problem is not None:
        return _fail_created(record, req, ctx, now, code="SampleJobNotOurs",
                             message=f"refused to use the Job {namespace}/{name}: {problem}. It was neither trusted as "
                                     "a pass nor deleted; find out who created it",
                             job={"name": name, "namespace": namespace, "uid": uid, "foundUid": _job_uid(job)})
    if not uid:  # adopted: ours by annotation and template, created by a pass whose save was lost
        uid = _job_uid(job)
        record = msgspec.structs.replace(record, data={**record.data,
                                                       "job": {"name": name, "namespace": namespace, "uid": uid}})
    outcome = job_outcome(job)
    if outcome == "succeeded":
        _delete_job(ctx, req, job, uid=uid)
        stack = record.data.get("stack") or {}
        return _succeed(record, ctx, now=now, nodes=stack.get("readyNodes"), resources=stack.get("resources"),
                        sampleJob="succeeded", stack=stack)
    if outcome == "failed":
        _delete_job(ctx, req, job, uid=uid)
        return _fail_created(record, req, ctx, now, code="SampleJobFailed",
                             message=f"the sample GPU job {namespace}/{name} failed: {_job_reason(job)}")
    if now > deadline:
        _delete_job(ctx, req, job, uid=uid)
        return _fail_created(record, req, ctx, now, code="SampleJobTimeout",
                             message=f"the sample GPU job did not complete within {policy.sample_job_timeout_s}s")
    return _later(record, now=now, delay=policy.poll_interval_s)


def _job_reason(job: Mapping[str, Any]) -> str:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Failed":
            return f"{cond.get('reason', '')} {cond.get('message', '')}".strip() or "failed"
    return "its pod failed"


# ----------------------------------------------------------------------------- failures: preview feature, cleanup

MANAGED_GPU_FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"
FAILING_WAIT_MAX_S = 1800.0  # how long a decided failure waits for the pool to accept its cleanup


def feature_registration_help(error: FeatureNotRegistered, *, subscription: str) -> str:
    """What the requester must do when AKS refused a pool for an unregistered preview feature."""
    feature = error.feature or MANAGED_GPU_FEATURE
    namespace, _, name = feature.partition("/")
    return (f"subscription {subscription} has not registered the preview feature {feature}, which managed GPU node "
            f"pools need. An owner of the subscription registers it with: az feature register --namespace {namespace} "
            f"--name {name} --subscription {subscription}; waits until az feature show --namespace {namespace} --name "
            f"{name} --subscription {subscription} says Registered; then runs az provider register --namespace "
            f"{namespace} --subscription {subscription}. Then send the request again with a new requestId. "
            f"(Azure said: {error.reason})")


def _workload_pods(ctx: Context, req: PoolRequest, *, nap_pool: bool) -> list[str]:
    """Pods other than DaemonSet, mirror, kube-system and the steward's own sample job on the pool's nodes."""
    kube = ctx.access.kube(req.cluster)
    label = nap.NODEPOOL_LABEL if nap_pool else AGENTPOOL_LABEL
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


def _cleanup_created_pool(record: Record, req: PoolRequest, ctx: Context) -> dict[str, Any]:
    """Delete (or scale to zero) the pool this request created, so that a failed one does not keep billing.

    Raises Conflict (AKS: another operation is running on the pool) when it must be tried again later.
    """
    policy = _policy(ctx)
    nap_pool = bool(record.data.get("nap"))
    if nap_pool:
        kube = ctx.access.kube(req.cluster)
        ours = [(api, kind, str((obj.get("metadata") or {}).get("uid") or ""))
                for api, kind in ((nap.NODEPOOL_API, "NodePool"), (nap.NODECLASS_API, "AKSNodeClass"))
                if (obj := kube.get_object(api, kind, req.pool_name)) is not None and nap.made_by(dict(obj), req.request_id)]
        if not ours:
            return {"action": "none", "note": "no Karpenter object of this request is left"}
    else:
        pool = ctx.access.aks().get_pool(req.cluster, req.pool_name)
        if pool is None:
            return {"action": "none", "note": f"the pool {req.pool_name} no longer exists"}
        if not pool_spec.created_by(pool.properties, req.request_id):
            return {"action": "none", "note": f"the pool {req.pool_name} was not created by this request: left alone"}
        # Still the pool the request describes (mode, size, GPU management), as ARM shows it now: a ledger
        # row alone never names a pool to delete.
        unlike = pool_spec.spec_differences(pool.properties, req)
        if str(pool.properties.get("mode") or "User") != "User":
            unlike.insert(0, f"mode is {pool.properties.get('mode')!r}, not 'User'")
        if unlike:
            return {"action": "none", "note": f"the pool {req.pool_name} is not the pool this request describes "
                                              f"({'; '.join(unlike[:3])}): left alone"}
    workload = _workload_pods(ctx, req, nap_pool=nap_pool)
    if workload:
        return {"action": "kept", "note": f"{len(workload)} workload pod(s) already run on the pool "
                                          f"({', '.join(workload[:5])}): delete or scale it yourself"}
    if _paused(ctx):
        return {"action": "kept", "note": "STEWARD_PAUSED is set: the pool was left as it is; it may be billing"}
    if nap_pool:
        # Karpenter removes a NodePool's nodes with it; "scale to zero" has no Karpenter equivalent.
        kube = ctx.access.kube(req.cluster)
        for api, kind, uid in ours:  # the uid read above as a precondition: an object that took the name since stays
            with contextlib.suppress(NotFound):
                kube.delete_object(api, kind, req.pool_name, uid=uid or None)
        return {"action": "deleted", "note": f"NodePool/AKSNodeClass {req.pool_name} deleted (node auto-provisioning)"}
    aks = ctx.access.aks()
    # If-Match: only the version of the pool read and verified above (412 -> Conflict: tried again later).
    etag = pool_etag(pool)
    if policy.failed_pool_action == "scaleToZero":
        body = pool_clone.update_properties(pool, count=0, enableAutoScaling=False, minCount=None, maxCount=None)
        aks.begin_put_pool(req.cluster, req.pool_name, {"properties": body}, etag=etag)
        return {"action": "scaledToZero", "note": f"pool {req.pool_name} scaled to 0 nodes "
                                                  "(POOL_REQUEST_FAILED_POOL_ACTION=scaleToZero); delete it when done"}
    aks.begin_delete_pool(req.cluster, req.pool_name, etag=etag)
    return {"action": "deleted", "note": f"pool {req.pool_name} deleted (POOL_REQUEST_FAILED_POOL_ACTION=delete)"}


def _fail_created(record: Record, req: PoolRequest, ctx: Context, now: float, *, code: str, message: str,
                  **data: Any) -> Record:
    """Fail a request whose pool exists (provisioning failed, or validation failed or timed out), after
    deleting or scaling down that pool; the outcome's ``cleanup`` says what was done."""
    failing = record.data.get("failing")
    since = float(failing.get("since", now)) if isinstance(failing, Mapping) else now
    try:
        cleanup = _cleanup_created_pool(record, req, ctx)
    except Conflict as error:
        if now - since < FAILING_WAIT_MAX_S:
            return _later(record, now=now, delay=_policy(ctx).poll_interval_s,
                          failing={"code": code, "message": message, "since": since, "data": data},
                          waiting=f"failing ({code}); waiting for the pool to accept its cleanup: {error}")
        cleanup = {"action": "failed", "note": f"the pool stayed busy for {FAILING_WAIT_MAX_S:.0f}s: {error}; "
                                               "it may be billing, remove it yourself"}
    except (Invalid, Forbidden) as error:
        cleanup = {"action": "failed", "note": f"the pool could not be removed: {error}; it may be billing, "
                                               "remove it yourself"}
    log.info("pool request %s failed (%s); pool cleanup: %s", record.id, code, cleanup.get("action"))
    return _fail(record, ctx, now=now, code=code, message=message, cleanup=cleanup, failing=None, **data)


_STEPS: dict[str, Callable[[Record, PoolRequest, Context, float], Record]] = {
    ACCEPTED: _step_accepted,
    CREATING: _step_creating,
    VALIDATING: _step_validating,
    TESTING: _step_testing,
}


# ----------------------------------------------------------------------------- the cluster pause tag, giving up


def hold_if_paused(record: Record, req: PoolRequest, ctx: Context, *, now: float) -> tuple[Record, bool]:
    """``(record, held)``: hold the request while its cluster carries ``gpu-fleet-steward/paused=true``.

    The tag is read from ARM at every step (shared.fleet.scope.cluster_paused). A request that has not made
    anything yet (``accepted``) waits, and fails ``ClusterPaused`` (nothing was created, nothing to clean
    up) once the pause has lasted longer than its create timeout. A request in flight holds where it is
    (no PUT, no Job, no cleanup) and its step deadline is moved on by the time it was held when the
    pause is lifted, so a pause never makes a validation time out.
    """
    why = scope.cluster_paused(ctx.access.aks(), req.cluster)
    since = record.data.get("paused_since")
    if not why:
        if since is None:
            return record, False
        shifted: dict[str, Any] = {"paused_since": None, "waiting": ""}
        if record.data.get("deadline") is not None:
            shifted["deadline"] = float(record.data["deadline"]) + max(0.0, now - float(since))
        return record.moved(record.state, at=now, note="the cluster pause was lifted: resuming", next_at=now,
                            **shifted), False
    if record.state == ACCEPTED and now > record.created_at + _policy(ctx).create_timeout_s:
        return _fail(record, ctx, now=now, code="ClusterPaused",
                     message=f"{why} for longer than the create timeout ({_policy(ctx).create_timeout_s:.0f}s): "
                             "nothing was created; submit the request again once the pause is lifted"), True
    if since is None:
        return record.moved(record.state, at=now, note=f"held: {why}", next_at=now + PAUSED_RETRY_S,
                            paused_since=now, waiting=why), True
    return _later(record, now=now, delay=PAUSED_RETRY_S, waiting=why), True


def give_up(record: Record, ctx: Context, *, reason: str) -> Record:
    """The reconciler's hook after RECONCILE_MAX_PERMANENT_TRIES permanent errors in a row: ``failed``.

    The request ends with the reason (code ``GaveUp``) in its outcome and a ``Failed`` event. Nothing
    more is written to Azure: the errors that led here are the kind that repeating cannot cure, and a
    pool this request may have created is left as it is (the outcome says so) for an operator.
    """
    if record.state not in ACTIVE_STATES:
        return record
    now = ctx.clock.now()
    cleanup = None if record.state == ACCEPTED else {
        "action": "none", "note": f"the request gave up in {record.state}: a pool or NodePool it may have created "
                                  f"({record.data.get('request', {}).get('poolName', '?')}) was left as it is"}
    return _fail(record, ctx, now=now, code="GaveUp", message=reason, cleanup=cleanup, failing=None)

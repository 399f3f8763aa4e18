"""What the world must show before a pool request past ``accepted`` may act on its row (issue 19).

The ledger is not the truth: anyone with data rights on the table can write a ``pool-request`` row in
any state, or put a finished row back into one. Only ``accepted`` creates anything, and it judges the
stored request again first (shared.pools.recheck). The later states follow a pool this request has
already created; what they can write is the sample Job (``testing``) and the cleanup of a failed
pool (any state, through shared.pools.cleanup). So before ``creating``, ``validating`` and ``testing``
(and a failure waiting for its cleanup) act, this module re-reads the pool from ARM (the NodePool
and AKSNodeClass from the Kubernetes API on node auto-provisioning clusters) and requires:

- it is this request's own: tagged (annotated) with the request id *and* the team
  (shared.pools.spec.created_by, shared.pools.nap.made_by);
- it was made recently enough to belong to a request still in flight: its creation mark (the tag
  ``gpu-fleet-steward-created-at`` the PUT wrote; the API server's ``creationTimestamp`` for
  Karpenter objects) is at most :func:`life_s` old, the longest a genuine request can still be
  working on it. A row put back in flight for an old, idle pool of a finished request is refused.

A row that fails either ends ``blocked`` (shared.pools.outcomes.block) with the reason and a Blocked
event, having touched nothing. The row's deadlines are not believed either: :func:`floored` moves a
deadline no earlier than the pool's creation mark plus the state's timeout, so an edited deadline
cannot make a pool "time out" (and be deleted) sooner than a genuine request's could.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from shared.kernel.ports import Record
from shared.pools import nap
from shared.pools import spec as pool_spec
from shared.pools.policy import PoolRequestPolicy
from shared.pools.records import State
from shared.pools.request import PoolRequest

if TYPE_CHECKING:
    from shared.kernel.context import Context

FAILING_WAIT_MAX_S = 1800.0  # how long a decided failure waits for the pool to accept its cleanup
LIFE_MARGIN_S = 600.0  # polls, backoffs and a pause or two: slack on top of the timeouts


def life_s(policy: PoolRequestPolicy) -> float:
    """The oldest a pool can be while a genuine request still works on it: every timeout of the
    request in a row, the wait of a failure's cleanup, and a margin."""
    return (policy.create_timeout_s + policy.validate_timeout_s + policy.sample_job_timeout_s
            + FAILING_WAIT_MAX_S + LIFE_MARGIN_S)


@dataclass(frozen=True)
class Seen:
    """What the world shows of the request's pool: ``born`` (None = no pool of the name yet) or why it is not
    this request's pool in flight (``refused``)."""

    born: float | None = None
    refused: str = ""


def _age_problem(born: float | None, *, what: str, now: float, policy: PoolRequestPolicy) -> str:
    if born is None:
        return (f"{what} carries no creation mark the steward writes (made before this check existed, or by "
                "someone else)")
    if now - born > life_s(policy):
        return (f"{what} was made {int((now - born) // 60)} min ago, longer than any request can still be working "
                f"on it ({int(life_s(policy) // 60)} min): the row is not a request in flight")
    return ""


def see(ctx: Context, req: PoolRequest, *, nap_pool: bool, now: float, policy: PoolRequestPolicy) -> Seen:
    """Re-read the request's pool (or Karpenter objects) and judge it (see the module docstring)."""
    owner = f"request {req.request_id!r} of {req.requester!r}"
    if nap_pool:
        kube = ctx.access.kube(req.cluster)
        found: list[tuple[str, Mapping[str, Any]]] = []
        for api, kind in ((nap.NODEPOOL_API, "NodePool"), (nap.NODECLASS_API, "AKSNodeClass")):
            obj = kube.get_object(api, kind, req.pool_name)
            if obj is not None:
                found.append((kind, obj))
        if not found:
            return Seen()
        for kind, obj in found:
            if not nap.made_by(dict(obj), req.request_id, requester=req.requester):
                return Seen(refused=f"the {kind} {req.pool_name!r} on the cluster was not made by {owner}")
        births = [nap.created_at(obj) for _, obj in found]
        born = None if None in births else min(b for b in births if b is not None)  # the oldest decides
        problem = _age_problem(born, what=f"the NodePool/AKSNodeClass {req.pool_name!r}", now=now, policy=policy)
        return Seen(refused=problem) if problem else Seen(born=born)
    pool = ctx.access.aks().get_pool(req.cluster, req.pool_name)
    if pool is None:
        return Seen()
    if not pool_spec.created_by(pool.properties, req.request_id, requester=req.requester):
        return Seen(refused=f"the node pool {req.pool_name!r} was not created by {owner} (ARM shows no such tags)")
    born = pool_spec.created_at(pool.properties)
    problem = _age_problem(born, what=f"the node pool {req.pool_name!r}", now=now, policy=policy)
    return Seen(refused=problem) if problem else Seen(born=born)


#: The timeout each state's deadline runs on, counted from the pool's creation mark at the earliest.
_STATE_TIMEOUTS = {State.CREATING: "create_timeout_s", State.VALIDATING: "validate_timeout_s",
                   State.TESTING: "sample_job_timeout_s"}


def floored(record: Record, *, born: float | None, policy: PoolRequestPolicy) -> Record:
    """``record`` with its ``deadline`` no earlier than ``born`` plus its state's timeout (unchanged when
    nothing exists yet, or the state has no deadline)."""
    attr = _STATE_TIMEOUTS.get(State(record.state)) if record.state in set(_STATE_TIMEOUTS) else None
    if born is None or attr is None:
        return record
    floor = born + float(getattr(policy, attr))
    deadline = record.data.get("deadline")
    if isinstance(deadline, int | float) and not isinstance(deadline, bool) and deadline >= floor:
        return record
    return msgspec.structs.replace(record, data={**record.data, "deadline": floor})

"""The rules a request is judged by, at intake and again right before its pool is created.

Intake (shared.pools.intake) and the ``accepted`` step (shared.pools.steps) judge a request the same
way: the seed's rules (:func:`shared.pools.validation.parse_and_validate`), the cluster's scope (tags
read from ARM now, :func:`scope_check`) and, when teams are configured, the rules of the team
(clusters, sizes, GPUs per request and in total, shared.pools.teams).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from shared.fleet import scope
from shared.kernel.errors import Forbidden, Invalid, NotFound
from shared.kernel.ports import Record
from shared.pools import teams
from shared.pools.policy import PoolRequestPolicy
from shared.pools.records import record_id
from shared.pools.request import PoolRequest
from shared.pools.validation import Rejection, ValidatedRequest, parse_and_validate

if TYPE_CHECKING:
    from shared.kernel.context import Context
    from shared.pools.teams import Team


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


def team_violations(ctx: Context, team: Team, result: ValidatedRequest) -> list[teams.Violation]:
    """``team``'s rules over a valid request (its GPUs in use read from ARM and the ledger when it has a total).

    GPUs in use that cannot be counted (a pool or an in-flight request whose count does not read as a
    whole number) are a violation of the total: an unreadable number never lets a request fit.
    """
    req = result.request
    in_use = None
    if team.max_gpus_total is not None:
        from shared.pools import team_usage

        try:
            in_use = team_usage.gpus_in_use(ctx, team, exclude_request_id=req.request_id)
        except Invalid as error:
            field = "count" if req.count is not None else "autoscale.max"
            return [teams.Violation(field, f"the GPUs team {team.name!r} holds cannot be counted ({error.reason}), "
                                    f"so its maxGpusTotal cannot be checked",
                                    "ask the fleet operators to look at the pool or request named")]
    return teams.violations(team, cluster=req.cluster, vm_size=result.size.name, gpus_per_vm=result.size.gpus,
                            count=req.count, autoscale_max=req.autoscale.max if req.autoscale else None,
                            in_use=in_use)


def recheck(record: Record, req: PoolRequest, ctx: Context, *, policy: PoolRequestPolicy) -> list[str]:
    """Every rule the stored request breaks now; empty when it may still be created.

    The ledger is not the truth: anyone who can write the table can put an ``accepted`` row there,
    or rewrite a T4 request into 125 H100s. So before the one step that spends money (the PUT),
    the stored request is judged again exactly as a queue message would be. A rule that changed since
    intake (a size dropped from a team, a cluster leaving scope) refuses the request too: it is
    judged by today's rules.
    """
    result = parse_and_validate(msgspec.json.encode(msgspec.to_builtins(req)), policy=policy, in_scope=scope_check(ctx))
    if isinstance(result, Rejection):
        return [f"{p.field}: {p.problem}" for p in result.problems]
    problems: list[str] = []
    if record.id not in (record_id(req.requester, req.request_id), req.request_id):
        problems.append(f"requestId: the record {record.id!r} holds request {req.request_id!r} of "
                        f"{req.requester!r} (its row would be {record_id(req.requester, req.request_id)!r})")
    configured = ctx.settings.teams
    if not configured:
        return problems
    team = teams.by_name(configured, req.requester)
    if team is None:
        return [*problems, f"requester: {req.requester!r} is not a team of {teams.SETTING}"]
    return [*problems, *(f"{v.field}: {v.problem}" for v in team_violations(ctx, team, result))]

"""How many GPUs a team holds now, read from ARM and the ledger (the I/O behind ``maxGpusTotal``).

ARM is the truth for pools that exist: every agent pool on the team's clusters (its listed
clusters, or every cluster in scope for ``"*"``) tagged with the team as requester, one list call
per cluster. On node auto-provisioning clusters a pool is a Karpenter NodePool, counted at its
``nvidia.com/gpu`` limit as the cluster shows it now (a team capped at 8 GPUs cannot make request after
request of 8); the app may get NodePools by name but not list them, so the names come from the team's
rows. The ledger adds the team's requests still in flight, whose pools ARM may not show yet.
The arithmetic is :func:`shared.pools.teams.gpus_in_use` (pure). Only called for a team that has
``maxGpusTotal``, at intake, which runs at the pace people submit requests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import scope
from shared.kernel.errors import Forbidden, Invalid, NotFound
from shared.kernel.ports import Record
from shared.pools import nap, records, teams

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.teams")


def gpus_in_use(ctx: Context, team: teams.Team, *, exclude_request_id: str = "") -> int:
    """GPUs in the team's pools plus its requests in flight. Throttled/Transient propagate (retry);
    Invalid when a pool's or a request's numbers cannot be read (never counted as zero)."""
    aks = ctx.access.aks()
    if team.clusters is not None:
        cluster_ids = list(team.clusters)
    else:
        cluster_ids = [c.id for c in scope.discover(aks, ctx.settings)]
    pools: list[dict[str, Any]] = []
    for cluster_id in cluster_ids:
        try:
            pools.extend(dict(p.properties) for p in aks.list_pools(cluster_id))
        except (NotFound, Forbidden) as error:  # gone, or not the steward's to see: it holds nothing of ours
            log.info("team %s: not counting pools of %s (%s)", team.name, cluster_id, type(error).__name__)
    rows = list(ctx.ledger.list(records.KIND))
    active = [_in_flight(r) for r in rows if r.state in records.ACTIVE_STATES]
    return teams.gpus_in_use(team.name, pools=pools, active_requests=active, exclude_request_id=exclude_request_id,
                             nodepools=nap_holds(ctx, team, rows))


def nap_holds(ctx: Context, team: teams.Team, rows: list[Record]) -> list[teams.NapHold]:
    """The NodePools the steward made for ``team``'s requests on node auto-provisioning clusters, at their limits.

    A NodePool outlives its request (a succeeded request's pool is the team's to use), so every row of the team
    that went past ``accepted`` on such a cluster names one to look for; the NodePool itself, read from the
    cluster now, says what it may grow to. It counts when it carries the request's annotation (and the team's,
    or none: NodePools made before that annotation existed are counted rather than forgotten). Objects that
    cannot be read raise Invalid (an unreadable limit never lets a request fit); Transient propagates.
    """
    holds: list[teams.NapHold] = []
    looked: set[tuple[str, str]] = set()
    for row in rows:
        if row.state == records.State.REJECTED or not row.data.get("nap"):
            continue
        try:
            data = records.decode(row.data)
        except msgspec.ValidationError as error:
            raise Invalid(f"pool request {row.id}: its record does not decode ({error})") from None
        req = data.request
        if req is None or (data.requester or req.requester) != team.name:
            continue
        where = (req.cluster.lower(), req.pool_name)
        if where in looked:
            continue
        looked.add(where)
        try:
            obj = ctx.access.kube(req.cluster).get_object(nap.NODEPOOL_API, "NodePool", req.pool_name)
        except NotFound:  # the cluster is gone, and its NodePools with it
            continue
        except Forbidden as error:
            raise Invalid(f"NodePool {req.pool_name!r} on {req.cluster.rsplit('/', 1)[-1]} cannot be read "
                          f"({error})") from None
        if obj is None or not _counts_for(obj, request_id=req.request_id, team=team.name):
            continue
        try:
            gpus = nap.gpu_limit(obj)
        except ValueError as error:
            raise Invalid(f"NodePool {req.pool_name!r}: {error}") from None
        holds.append(teams.NapHold(request_id=req.request_id, name=req.pool_name, gpus=gpus))
    return holds


def _counts_for(obj: Mapping[str, Any], *, request_id: str, team: str) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return (annotations.get(nap.ANNOTATION_REQUEST_ID) == request_id
            and annotations.get(nap.ANNOTATION_REQUESTER, team) == team)


def _in_flight(record: Record) -> teams.InFlight:
    """What an active record asks for. A row that does not decode raises Invalid: it is not counted as nothing."""
    try:
        data = records.decode(record.data)
    except msgspec.ValidationError as error:
        raise Invalid(f"pool request {record.id}: its record does not decode ({error})") from None
    req = data.request
    if req is None:
        raise Invalid(f"pool request {record.id}: an active record without its request")
    return teams.InFlight(requester=data.requester or "", request_id=req.request_id, vm_size=data.vm_size or req.vm_size,
                          count=req.count, autoscale_max=req.autoscale.max if req.autoscale else None)

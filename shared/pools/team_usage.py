"""How many GPUs a team holds now, read from ARM and the ledger (the I/O behind ``maxGpusTotal``).

ARM is the truth for pools that exist: every agent pool on the team's clusters (its listed
clusters, or every cluster in scope for ``"*"``) tagged with the team as requester, one list call
per cluster. The ledger adds the team's requests still in flight, whose pools ARM may not show yet.
The arithmetic is :func:`shared.pools.teams.gpus_in_use` (pure). Only called for a team that has
``maxGpusTotal``, at intake, which runs at the pace people submit requests.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import scope
from shared.kernel.errors import Forbidden, Invalid, NotFound
from shared.kernel.ports import Record
from shared.pools import records, teams

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
    active = [_in_flight(r) for r in ctx.ledger.list(records.KIND, states=records.ACTIVE_STATES)]
    return teams.gpus_in_use(team.name, pools=pools, active_requests=active, exclude_request_id=exclude_request_id)


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

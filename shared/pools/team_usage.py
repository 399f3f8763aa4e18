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

from shared.fleet import scope
from shared.kernel.errors import Forbidden, NotFound
from shared.pools import teams

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.teams")



def gpus_in_use(ctx: Context, team: teams.Team, *, exclude_request_id: str = "") -> int:
    """GPUs in the team's pools plus its requests in flight. Throttled/Transient propagate (retry)."""
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
    from shared.pools.creation import ACTIVE_STATES, KIND

    active = [r.data for r in ctx.ledger.list(KIND, states=ACTIVE_STATES)]
    return teams.gpus_in_use(team.name, pools=pools, active_requests=active, exclude_request_id=exclude_request_id)

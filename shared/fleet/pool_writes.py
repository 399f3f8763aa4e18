"""A pool is written only over the version a decision was made on, with or without an ``eTag`` (issue 23).

Every write of an existing pool (a surge, a scale back, an autoscaler freeze and restore, a deletion) is
decided on a pool as read. AKS's answer to "did it change since?" is the pool's ``properties.eTag`` sent as
``If-Match`` (412 when it changed: learn.microsoft.com/azure/aks/use-etags). But not every pool carries
one: the Azure CLI's recorded AKS traffic shows none on agent pools as late as 2025-05 (AKS rolled eTags
out during 2025; tests/replay/recordings), and a write without a precondition would overwrite whatever an
operator or the autoscaler did in between. So :func:`precondition` gives the ``etag`` a write sends:

- the pool's eTag when it has one (AKS compares it, atomically);
- otherwise ``None``, but only after a fresh read proves the pool is still exactly what the decision saw
  (every property, provisioningState and count included): a change raises
  :class:`~shared.kernel.errors.Conflict`, the same answer as a 412, and the step looks again later.

The fresh read narrows the window to one round trip; it cannot close it. docs/security.md says so.
"""

from __future__ import annotations

import json
from typing import Any

from shared.kernel.errors import Conflict
from shared.kernel.ports import AksPort, PoolInfo


def _fingerprint(pool: PoolInfo) -> str:
    return json.dumps(pool.properties, sort_keys=True, default=str)


def changes(before: PoolInfo, after: PoolInfo) -> list[str]:
    """The top-level properties that differ between two reads of a pool (for the Conflict's message)."""
    keys = set(before.properties) | set(after.properties)
    return sorted(k for k in keys if json.dumps(before.properties.get(k), sort_keys=True, default=str)
                  != json.dumps(after.properties.get(k), sort_keys=True, default=str))


def precondition(aks: AksPort | Any, pool: PoolInfo) -> str | None:
    """The ``etag`` to write ``pool`` (as read for the decision) with: its eTag, or None once a fresh read
    proved nothing changed. Raises Conflict when the pool changed or went away since it was read."""
    if pool.etag:
        return pool.etag
    fresh = aks.get_pool(pool.cluster_id, pool.name)
    if fresh is None:
        raise Conflict(f"pool {pool.name} is gone since it was read (it has no eTag: read again before writing)")
    if _fingerprint(fresh) != _fingerprint(pool):
        raise Conflict(f"pool {pool.name} changed since it was read ({', '.join(changes(pool, fresh)) or '?'}; it has "
                       "no eTag: read again before writing): looking again")
    return None

"""What a migration step reads: one view of the agent pools per step, and a pool's nodes and pods.

A step first verifies the pools it will write (shared.migration.checks) and then writes them with
their eTag as If-Match, so a pool changed after the check is never written (412 -> Conflict, the
step looks again). That holds only if the pool verified is the pool written: :class:`StepReads`
reads each agent pool from ARM once per step, and again only after the step itself wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shared.drain.filters import is_workload, skip_terminating
from shared.drain.parallel import bounded_map
from shared.fleet.pool_writes import precondition
from shared.kernel.ports import ClusterAccess, KubePort, NodeView, PodView, PoolInfo, Record
from shared.kernel.steps import Transition
from shared.migration.maintenance import window_open
from shared.migration.policy import MigrationPolicy
from shared.migration.transitions import wait

if TYPE_CHECKING:
    from shared.kernel.context import Context

POOL_LABEL = "kubernetes.azure.com/agentpool"


CANCELED = "Canceled"  # an aborted operation's end (shared.kernel.ports.ENDED_UNDONE)


def etag(aks: Any, pool: PoolInfo | None) -> str | None:
    """What a write over ``pool`` (as read for the decision) sends as If-Match: its ``properties.eTag``, or,
    on a pool without one, None once a fresh read proved it unchanged (shared.fleet.pool_writes: Conflict
    when it changed). None for no pool (a create)."""
    return precondition(aks, pool) if pool is not None else None


def pool_nodes(kube: KubePort, pool: str) -> list[NodeView]:
    return sorted(kube.list_nodes(label_selector=f"{POOL_LABEL}={pool}"), key=lambda n: n.name)


def workload_pods(kube: KubePort, node: str, *, listed: Sequence[PodView] | None = None) -> list[PodView]:
    """Pods that must leave before the node's pool may go (shared.drain.filters.is_workload).
    ``listed``: the node's pods as already listed in this step (else they are listed now)."""
    found = kube.list_pods(node_name=node) if listed is None else listed
    return [p for p in found if p.node_name in ("", node) and is_workload(p)]


def old_pods(kube: KubePort, nodes: Sequence[NodeView], listed: Mapping[str, Sequence[PodView]] | None = None,
             ) -> list[PodView]:
    """The workload pods of the old nodes that are not terminating: the ones the replacement must take."""
    found = bounded_map(lambda n: workload_pods(kube, n.name, listed=None if listed is None else listed[n.name]), nodes,
                        name="drain-list")
    return [p for pods in found for p in pods if skip_terminating(p).delete]


def read_again(aks: Any, cluster_id: str, pool: str) -> PoolInfo | None:
    """The pool as ARM shows it now, past the step's view (:class:`StepReads`)."""
    forget = getattr(aks, "forget", None)
    if forget is not None:
        forget(cluster_id, pool)
    found: PoolInfo | None = aks.get_pool(cluster_id, pool)
    return found


class StepReads:
    """ClusterAccess for one step: each agent pool is read from ARM once, and read again only after the
    step itself wrote it. Everything else passes through to the access it wraps."""

    def __init__(self, access: ClusterAccess) -> None:
        self._access = access
        self._aks: _OnceAks | None = None

    def aks(self) -> Any:
        if self._aks is None:
            self._aks = _OnceAks(self._access.aks())
        return self._aks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._access, name)


class _OnceAks:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._pools: dict[tuple[str, str], PoolInfo | None] = {}

    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        key = (cluster_id.lower(), pool)
        if key not in self._pools:
            self._pools[key] = self._inner.get_pool(cluster_id, pool)
        return self._pools[key]

    def forget(self, cluster_id: str, pool: str) -> None:
        """The next read of ``pool`` goes to ARM (a write with no If-Match must see the pool as it is now)."""
        self._pools.pop((cluster_id.lower(), pool), None)

    _wrote = forget

    def begin_put_pool(self, cluster_id: str, pool: str, body: Any, **kwargs: Any) -> None:
        self._wrote(cluster_id, pool)
        self._inner.begin_put_pool(cluster_id, pool, body, **kwargs)

    def begin_delete_pool(self, cluster_id: str, pool: str, **kwargs: Any) -> None:
        self._wrote(cluster_id, pool)
        self._inner.begin_delete_pool(cluster_id, pool, **kwargs)

    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Any) -> None:
        self._wrote(cluster_id, pool)
        self._inner.begin_delete_machines(cluster_id, pool, machines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def closed_window(ctx: Context, record: Record, *, now: float, policy: MigrationPolicy) -> Transition | None:
    """A wait when the cluster's maintenance window is closed, else None (writes may go ahead)."""
    cluster_id = str(record.data["cluster_id"])
    configs = ctx.access.aks().list_maintenance_configurations(cluster_id)
    is_open, next_open, why = window_open(configs, now=now, policy=policy)
    if is_open:
        return None
    return wait(record, now=now, until=next_open if next_open is not None else now + 3600.0,
                why=f"paused between steps: {why}")

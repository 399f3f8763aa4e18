"""A pool as its per-pool budget counts it: how many nodes it has, and which are unavailable now.

Both the admission (shared.remediation.admission) and the cordon's slot (shared.remediation.preconditions
``reserve``) judge the pool budget of docs/remediation.md on the API server's node list: every node of the
pool is counted, and one NotReady or cordoned is unavailable. One exception, found by soak seed 931382: a
surge replace scales the pool to count+1 (shared.remediation.replace, ``ReplaceMode.SURGE``) before it
deletes the broken machine. The surge node stands in for that machine; it is not capacity the team has,
and counting it raised a three-node pool's 50 % budget from one node to two while the broken node was
still cordoned: a neighbour was admitted, and two of the team's three nodes were out at once. So each
active surge replace in the pool whose broken node is still listed takes one node off the pool's size.
Counting it from the moment the rung plans the surge (before the pool grows) only makes the budget
stricter for those seconds; once the broken node is gone, nothing is taken off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from shared.remediation.records import KIND, ReplaceMode

if TYPE_CHECKING:
    from shared.kernel.context import Context
    from shared.kernel.ports import KubePort
    from shared.remediation.records import Slot


def pool_nodes(kube: KubePort, selector: str, *, page_size: int) -> dict[str, bool]:
    """Every node of the pool, and whether it is unavailable now (NotReady or cordoned)."""
    return {n.name: (not n.ready or n.unschedulable) for n in kube.list_nodes(label_selector=selector,
                                                                              page_size=page_size)}


def surge_stand_ins(ctx: Context, slots: Mapping[str, Slot], *, cluster: str, pool: str, listed: Mapping[str, bool]) -> int:
    """How many nodes of the pool are surge nodes standing in for a broken node that is still listed."""
    count = 0
    for rid, slot in slots.items():
        if slot.cluster.lower() != cluster.lower() or slot.pool != pool or slot.node not in listed:
            continue
        record = ctx.ledger.get(KIND, rid)
        rep = record.data.get("replace") if record is not None else None
        if isinstance(rep, Mapping) and rep.get("mode") == ReplaceMode.SURGE and rep.get("target_count"):
            count += 1
    return count


def budget_view(ctx: Context, kube: KubePort, *, selector: str, slots: Mapping[str, Slot], cluster: str, pool: str,
                page_size: int) -> tuple[int, set[str]]:
    """(the pool's size for its budget, the names of its nodes unavailable now): see the module docstring."""
    listed = pool_nodes(kube, selector, page_size=page_size)
    size = len(listed) - surge_stand_ins(ctx, slots, cluster=cluster, pool=pool, listed=listed)
    return max(size, 0), {name for name, down in listed.items() if down}

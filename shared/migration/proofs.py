"""What a migration proves from the world before it disrupts anything: its row is only a claim.

Whoever can write the ledger table can write a migration row in any state, with any ``batch``,
``shrinking`` or ``drained`` list (issue 19). :mod:`shared.migration.checks` judges the row's pools
against ARM before every step; this module holds the proofs the disruptive steps add, each read from
ARM or the cluster's API server right before the write it guards, each answering "why not" ("" = it
may), so a refusal names what the world showed:

- a node is cordoned, drained or has its machine deleted only if it is a machine of that pool in ARM
  now (:func:`not_machines`: the API server's pool label is a claim a cluster admin can write; ARM's
  machine list and the node's providerID are not);
- a node is evicted from, or its machine deleted, only while it carries this record's own cordon
  (:data:`MIGRATION_ANNOTATION` = the record id, written by the steward's ``cordon``; a table writer
  cannot write Nodes) and is unschedulable (:func:`not_held`);
- the old pool is cordoned, drained or deleted only while its replacement serves: Succeeded, with
  Ready nodes advertising GPUs (:func:`not_serving`); cordoning starts only when the replacement
  passes the full GPU stack check that ``validating`` proved (:func:`not_healthy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.fleet.node_truth import vm_of_provider_id
from shared.fleet.stack import evaluate_stack, gpu_resources
from shared.kernel.errors import NotFound
from shared.kernel.ports import KubePort, NodeView, PoolInfo, Record
from shared.migration.fit import NodeShape, fit_problems
from shared.migration.reads import old_pods, pool_nodes
from shared.migration.records import MigrationData

if TYPE_CHECKING:
    from shared.kernel.context import Context

MIGRATION_ANNOTATION = "gpu-fleet-steward/migration"  # value: the record id of the migration that cordoned the node
ZONE_LABEL = "topology.kubernetes.io/zone"
_UNUSABLE = ("Failed", "Canceled", "Deleting")
_SHOWN = 3


def _listed(problems: Sequence[str]) -> str:
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return "; ".join(problems[:_SHOWN]) + more


def ours(node: NodeView, record: Record) -> bool:
    """Whether the node carries this record's cordon marker."""
    return node.annotations.get(MIGRATION_ANNOTATION) == record.id


def not_held(nodes: Sequence[NodeView], record: Record) -> str:
    """Why some of ``nodes`` may not be evicted from or removed by this record ("" = every one carries this
    record's cordon marker and is unschedulable, as the API server shows it now)."""
    problems = []
    for node in nodes:
        if not ours(node, record):
            found = node.annotations.get(MIGRATION_ANNOTATION)
            problems.append(f"{node.name} does not carry this migration's cordon ({MIGRATION_ANNOTATION}="
                            f"{record.id}; it has {found or 'none'})")
        elif not node.unschedulable:
            problems.append(f"{node.name} carries this migration's cordon but is schedulable (uncordoned by someone)")
    return _listed(problems)


def not_machines(ctx: Context, d: MigrationData, pool: str, nodes: Sequence[NodeView]) -> str:
    """Why some of ``nodes`` are not machines of ``pool`` as ARM lists them now ("" = all are): the node's
    name must be one of the pool's machines and its providerID, when it has one, that machine's VM."""
    if not nodes:
        return ""
    try:
        machines = {m.name: m for m in ctx.access.aks().list_machines(d.cluster_id, pool)}
    except NotFound:
        machines = {}
    problems = []
    for node in nodes:
        machine = machines.get(node.name)
        if machine is None:
            problems.append(f"{node.name} is labelled a node of {pool} but is not one of its machines in ARM")
        elif node.provider_id and vm_of_provider_id(node.provider_id).lower() != machine.resource_id.lower():
            problems.append(f"{node.name} says its VM is {node.provider_id}, ARM says {machine.resource_id}")
    return _listed(problems)


def not_serving(kube: KubePort, new: PoolInfo) -> str:
    """Why the replacement cannot take the old pool's pods now ("" = it can): an ARM state it is not usable
    in, or no Ready node advertising a GPU (a pool ARM sizes at zero nodes needs none)."""
    if new.provisioning_state in _UNUSABLE:
        return f"the replacement {new.name} is {new.provisioning_state}"
    serving = [n for n in pool_nodes(kube, new.name) if n.ready and not n.unschedulable and gpu_resources(n)]
    if not serving and new.count > 0:
        return f"the replacement {new.name} has no Ready node that is schedulable and advertises a GPU"
    return ""


def not_healthy(kube: KubePort, new: PoolInfo, *, now: float) -> str:
    """Why the replacement does not pass the GPU stack check ``validating`` proved ("" = it does), at the
    node count ARM shows for it now."""
    report = evaluate_stack(pool=new, nodes=pool_nodes(kube, new.name), expected_count=new.count, now=now)
    if report.ok:
        return ""
    return f"the replacement {new.name} does not pass its GPU stack check: " + "; ".join(report.problems[:_SHOWN])


def fit_refusal(kube: KubePort, d: MigrationData, new_nodes: Sequence[NodeView], old_nodes: Sequence[NodeView]) -> str:
    """Why the old pool's pods would not fit the replacement's real nodes ("" = they would, or it has none
    yet). A rolling replacement starts with one batch, in fewer zones than it will span; it has the old
    pool's availabilityZones, so its nodes will also come up in every zone the old ones are in."""
    if not new_nodes:
        return ""
    shapes = [NodeShape(n.labels, n.taints, n.allocatable) for n in new_nodes]
    zones = sorted({n.labels[ZONE_LABEL] for n in old_nodes if ZONE_LABEL in n.labels})
    first = new_nodes[0]
    shapes += [NodeShape({**first.labels, ZONE_LABEL: z}, first.taints, first.allocatable) for z in zones]
    problems = fit_problems(old_pods(kube, old_nodes), shapes=shapes, node_count=int(d.body.get("count") or 0))
    return "the old pool's pods would not fit the replacement: " + "; ".join(problems[:5]) if problems else ""


def entry_refusal(kube: KubePort, d: MigrationData, new: PoolInfo, *, now: float) -> str:
    """Why the old pool may not start being cordoned ("" = it may): what ``validating`` proved, proved again
    from the world (the GPU stack at the count ARM shows, and the fit of the old pods), because a row
    written straight into a later state never went through ``validating``."""
    return not_healthy(kube, new, now=now) or fit_refusal(kube, d, pool_nodes(kube, new.name), pool_nodes(kube, d.pool))


def replacement_now(ctx: Context, d: MigrationData) -> tuple[PoolInfo | None, str]:
    """The replacement as ARM shows it in this step, or why there is none to hand the old pool's pods to
    (``checks.refusal`` already refused one that is not this migration's)."""
    new: PoolInfo | None = ctx.access.aks().get_pool(d.cluster_id, d.replacement) if d.replacement else None
    if new is None:
        return None, f"the replacement {d.replacement or '(none recorded)'} does not exist in ARM"
    return new, ""

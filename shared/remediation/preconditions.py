"""What a remediation step must prove from the world before it disrupts anything.

A remediation record is a row in a table that people other than the app can write (docs/security.md,
"Ledger rows"). So no step trusts what its row says it already did: before the cordon, each eviction
round and each VM action, the step reads the world and checks the marks only this remediation can
have left there, and the budgets it must hold now:

- **This record's own cordon marker.** When the steward cordons a node (or finds it cordoned by
  someone else) it writes the annotation ``gpu-fleet-steward/cordoned-for: <record id>`` on the Node.
  A table writer cannot write Nodes, so a row that claims to be past its cordon while the node lacks
  the marker was not made by the steward's own steps: it ends ``blocked``.
- **The node is unschedulable, and nothing the drain rules would evict is left on it** before a VM
  action (``shared.drain.filters.plan_drain``: the same rules the drain used). A row claiming the drain
  is done is checked against the pods on the node now.
- **The identity is the admitted one, and it is known**: ``node_uid`` and ``arm_vm_id`` must be
  non-empty and equal to what the API server and ARM say now (shared.remediation.ladder.admitted_vm).
- **A live budget slot** (:func:`reserve`): a row that reaches a disruptive step without one takes one
  then, by the same rules as admission (breaker, cooldown and attempt cap, pool budget, fleet cap), or
  waits. A forged row therefore never acts past the budgets, and a row whose slot was given up (a
  drain held by a PodDisruptionBudget) resumes only when a slot is free again.
- **The fault itself**, re-read from its own source (shared.remediation.fault_source).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from shared.drain.filters import plan_drain
from shared.drain.runner import fetch_pdbs
from shared.drain.settings import DrainSettings
from shared.kernel.errors import Conflict
from shared.kernel.ports import KubePort, NodeView, Record
from shared.remediation import attempts, breaker, budget, health, pool_view
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    ACTIVE_STATES,
    BUDGET_ID,
    BUDGET_KIND,
    KIND,
    NODE_KIND,
    BudgetData,
    NodeData,
    RemediationData,
    Slot,
    decode,
    node_key,
    to_data,
)

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation")

# Codes of a ``blocked`` remediation (stable: in the Blocked event, the record and docs/security.md).
NOT_OUR_CORDON = "NotOurCordon"  # the node does not carry this record's cordon marker
NOT_CORDONED = "NotCordoned"  # the node is schedulable where the row says it was cordoned
PODS_LEFT = "PodsLeft"  # pods the drain would evict are still on the node
UNKNOWN_IDENTITY = "UnknownIdentity"  # the row names no node uid or no VM
NOT_ADMITTED = "NotAdmitted"  # no admission on record for this row, and the fault is not there
BLOCKED_CODES = frozenset({NOT_OUR_CORDON, NOT_CORDONED, PODS_LEFT, UNKNOWN_IDENTITY, NOT_ADMITTED})
_SLOT_TRIES = 3


@dataclass(frozen=True)
class Proof:
    """``ok``, or the blocked ``code`` and the sentence an operator reads."""

    ok: bool
    code: str = ""
    reason: str = ""

    @classmethod
    def refuse(cls, code: str, reason: str) -> Proof:
        return cls(False, code, reason)


PROVEN = Proof(True)


def marked(node: NodeView, record_id: str) -> Proof:
    """The node carries this record's cordon marker and is unschedulable."""
    marker = node.annotations.get(health.CORDON_FOR_ANNOTATION, "")
    if marker != record_id:
        owner = f"remediation {marker}'s" if marker else "no steward"
        return Proof.refuse(NOT_OUR_CORDON, f"{node.name} carries {owner} cordon marker, not this remediation's "
                                            f"({record_id}): this row's cordon was never made by the steward")
    if not node.unschedulable:
        return Proof.refuse(NOT_CORDONED, f"{node.name} is schedulable: its cordon was lifted")
    return PROVEN


def identity(node: NodeView, d: RemediationData) -> Proof:
    """The row names the node's uid (and, for a VMSS node, its VM), and the uid is the node's now."""
    if not d.node_uid:
        return Proof.refuse(UNKNOWN_IDENTITY, "the row names no node uid: which Node was admitted is unknown")
    if not d.nap and not d.arm_vm_id:
        return Proof.refuse(UNKNOWN_IDENTITY, "the row names no VM: which machine was admitted is unknown")
    return PROVEN


def drained(kube: KubePort, node: NodeView, settings: DrainSettings, *, now: float) -> Proof:
    """Nothing the drain rules would evict is left on the node (daemon and mirror pods stay, as in a drain)."""
    pods = kube.list_pods(node_name=node.name)
    plan = plan_drain(pods, settings, now=now, pdbs=fetch_pdbs(kube))
    left = [f"{p.namespace}/{p.name}" for p in plan.evict if not p.deletion_timestamp]
    if left:
        return Proof.refuse(PODS_LEFT, f"{len(left)} pod(s) the drain would evict are still on {node.name} "
                                       f"({', '.join(left[:5])}): no VM action with workloads on the node")
    return PROVEN


def before_vm_action(ctx: Context, kube: KubePort, record: Record, d: RemediationData, node: NodeView, *,
                     settings: DrainSettings, now: float) -> Proof:
    """Everything a VM action needs from the world, its identity first."""
    for proof in (identity(node, d), marked(node, record.id)):
        if not proof.ok:
            return proof
    return drained(kube, node, settings, now=now)


def was_admitted(ctx: Context, record: Record, d: RemediationData) -> bool:
    """Whether admission recorded this row: as an attempt on its node (the per-node row), or as a budget slot
    for this node of this cluster.

    Admission takes the slot before it creates the record, and notes the attempt after it (best effort): a
    host that dies in between leaves a genuine record with its slot and no note, which the next admission on
    the node repairs. When no admission follows (the fault cleared by itself), the slot is the mark admission
    left (soak seed 957010: such a record was blocked ``NotAdmitted`` instead of released). Only a slot taken
    at the record's creation is admission's: :func:`reserve` takes one later for a row that has none (its
    ``at`` is that step's time). Both are admission's own rows, in the same table, and neither is more than
    that: a row with neither is not ours.
    """
    return attempts.own(ctx, d.cluster, d.node)(record)


def _live(ctx: Context, slots: dict[str, Slot], now: float) -> dict[str, Slot]:
    from shared.remediation.admission import SLOT_ORPHAN_S

    live: dict[str, Slot] = {}
    for rid, slot in slots.items():
        rec = ctx.ledger.get(KIND, rid)
        if (rec is None and now - slot.at < SLOT_ORPHAN_S) or (rec is not None and rec.state in ACTIVE_STATES):
            live[rid] = slot
    return live


def _node_check(ctx: Context, record: Record, d: RemediationData, *, now: float,
                policy: RemediationPolicy) -> budget.Admission:
    """Cooldown and attempt cap from the per-node row, this record's own attempt left out."""
    rec = ctx.ledger.get(NODE_KIND, node_key(d.cluster, d.node))
    nd = decode(rec.data, NodeData) if rec is not None else NodeData(cluster=d.cluster, node=d.node)
    others = [a for a in nd.attempts if a.id != record.id]
    last = ctx.ledger.get(KIND, others[-1].id) if others else None
    finished = last.updated_at if last is not None and last.state not in ACTIVE_STATES else None
    return budget.node_admission(attempts=[a.at for a in others], last_finished_at=finished, now=now, policy=policy)


def reserve(ctx: Context, kube: KubePort, record: Record, d: RemediationData, *, now: float,
            policy: RemediationPolicy) -> tuple[bool, str]:
    """(True, why) when this record holds a live fleet budget slot, taking a free one if it holds none;
    (False, why to wait) otherwise. Dry runs hold nothing and need nothing."""
    if d.dry_run:
        return True, "dry run"
    for _ in range(_SLOT_TRIES):
        budget_rec = ctx.ledger.get(BUDGET_KIND, BUDGET_ID)
        slots = _live(ctx, dict(decode(budget_rec.data, BudgetData).slots) if budget_rec else {}, now)
        if record.id in slots:
            return True, "holds its budget slot"
        state = breaker.current(ctx)
        in_pool = {s.node for s in slots.values() if s.cluster == d.cluster and s.pool == d.pool}
        size, unavailable = 0, set[str]()
        if d.pool_selector:  # a surge node standing in for a broken one is not the team's capacity (pool_view)
            size, unavailable = pool_view.budget_view(ctx, kube, selector=d.pool_selector, slots=slots,
                                                      cluster=d.cluster, pool=d.pool, page_size=policy.page_size)
        unavailable.discard(d.node)  # this node's own cordon is the slot being taken
        verdict = budget.admit(paused=None, breaker_open=state.is_open,
                               node=_node_check(ctx, record, d, now=now, policy=policy),
                               pool=budget.pool_admission(pool=d.pool, pool_size=max(size, 1),
                                                          unavailable=unavailable | (in_pool - {d.node}),
                                                          candidate=d.node, policy=policy),
                               cluster=budget.cluster_admission(
                                   cluster=d.cluster, fleet_clusters=state.fleet_clusters, policy=policy,
                                   in_flight_in_cluster=sum(1 for s in slots.values()
                                                            if s.cluster.lower() == d.cluster.lower())),
                               fleet=budget.fleet_admission(in_flight=len(slots), policy=policy))
        if not verdict.allowed:
            return False, f"no budget slot for this step ({verdict.code}): {verdict.reason}"
        slots[record.id] = Slot(cluster=d.cluster, pool=d.pool, node=d.node, at=now)
        data = to_data(BudgetData(slots=slots))
        try:
            if budget_rec is None:
                ctx.ledger.create(Record(kind=BUDGET_KIND, id=BUDGET_ID, state="open", data=data, created_at=now,
                                         updated_at=now))
            else:
                ctx.ledger.save(msgspec.structs.replace(budget_rec, data=data, updated_at=now))
        except Conflict:
            continue
        log.info("remediation %s took a budget slot at its step (%s)", record.id, verdict.reason)
        return True, f"took a budget slot: {verdict.reason}"
    return False, "the budget record stayed contended"

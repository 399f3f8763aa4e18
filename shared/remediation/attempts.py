"""What earlier remediations of a node say about a fault seen again: shared by the signals that keep
their own first sightings (DCGM counters, GPU capacity).

Read by admission's deterministic record ids (``<node key>-<n>``) and the per-node row, never from an
event: a fault handled by an active remediation is left to it, one handled by a remediation that ended
is a new fault, and a ``restart_then_replace`` fault seen again after a restart that ended ``done``
goes to replace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    ACTIVE_STATES,
    KIND,
    NODE_KIND,
    NodeData,
    RemediationData,
    Rung,
    State,
    decode,
    node_key,
)

if TYPE_CHECKING:
    from shared.kernel.context import Context

MAX_ATTEMPT_IDS = 50  # a node's remediations are few (BUDGET_NODE_MAX_ATTEMPTS in a window); a bound all the same


def handling(ctx: Context, cluster: str, node: str, fault: str) -> str:
    """``""`` when no admission took ``fault``; ``"active"`` while its remediation runs; ``"ended"`` after."""
    rec = ctx.ledger.get(NODE_KIND, node_key(cluster, node))
    nd = decode(rec.data, NodeData) if rec is not None else None
    if nd is None or fault not in nd.faults:
        return ""
    attempt = next((a for a in reversed(nd.attempts) if a.fault == fault), None)
    remediation = ctx.ledger.get(KIND, attempt.id) if attempt is not None else None
    return "active" if remediation is not None and remediation.state in ACTIVE_STATES else "ended"


def earlier(ctx: Context, cluster_id: str, node: str, *, signal: str, now: float,
            policy: RemediationPolicy) -> tuple[str, str]:
    """(a remediation of the node still in progress, an earlier ``signal`` remediation that restarted it
    and ended done within the attempt window), each ``""`` when none."""
    nk = node_key(cluster_id, node)
    active = repeated = ""
    for n in range(1, MAX_ATTEMPT_IDS + 1):
        rec = ctx.ledger.get(KIND, f"{nk}-{n}")
        if rec is None:
            break
        if rec.state in ACTIVE_STATES:
            active = rec.id
        if rec.state != State.DONE or now - rec.created_at > policy.attempt_window_s:
            continue
        d = decode(rec.data, RemediationData)
        if d.signal == signal and not d.dry_run and Rung.RESTART in d.ladder[: d.rung_index + 1]:
            repeated = rec.id
    return active, repeated

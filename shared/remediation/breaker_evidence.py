"""What the fleet breaker may count: nodes ARM vouches for, each with its cluster (issue 19).

The sweep gathers the breaker's observations (nodes whose condition turned True, pending or over its
threshold; DCGM faults; GPU-capacity faults), keyed by node key. A Node object is written by its
cluster's admin, so before the breaker counts a node it must pass the check admission makes
(shared.fleet.node_truth, through :func:`shared.remediation.admission.judge_node`, remembered a minute
per process): the pool it claims is a User NVIDIA GPU pool in ARM and the node is one of that pool's
machines, in the cluster's own node resource group. A fake Node is no evidence of a storm, so one
cluster admin's fakes cannot switch repair off for every team; and each counted node carries its
cluster, so that a cluster's genuine faults count at most its share (shared.remediation.breaker).

Cheap by construction, because healthy nodes are never observations:

- a node already in the breaker's window was checked when it entered and is not checked again;
- a node whose fault began before the window (or before the last reset) would not count: not checked;
- an open or disabled breaker counts nothing more: nothing is checked;
- a cluster's nodes beyond what its share can count are not checked, and checking stops once the
  checked nodes would open the breaker;
- at most ``breaker_verify_max_nodes`` (BREAKER_VERIFY_MAX_NODES) nodes are checked per sweep, taken
  in turn from each cluster, earliest fault first, so one cluster's flood cannot delay another's.

A node left unchecked is still unhealthy at the next sweep, with the same transition time, and is
counted then. A node that cannot be checked (its cluster or ARM unreadable) is not counted: admission
reads the same and admits nothing either.

The other side of the fraction is bounded too: fake *healthy* Nodes would swell the fleet's GPU node
count until the percentage could never be reached. So once the breaker might open (at least
``breaker_min_nodes`` counted), each cluster's listed GPU nodes count at most as many as ARM says its
User NVIDIA GPU pools have (one pool listing per cluster, only then); a node auto-provisioning cluster's
Karpenter nodes have no pool in ARM, and there the listing is taken as it is.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.fleet import node_truth
from shared.kernel.errors import StewardError
from shared.kernel.ports import ClusterInfo
from shared.remediation import admission, breaker
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import node_key

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.breaker")

GONE = "NodeGone"  # not counted: the node was deleted between the listing and its check
_COUNTED, _REFUSED, _UNREADABLE = "counted", "refused", "unreadable"  # what checking one node found


@dataclass
class Evidence:
    """What the breaker may count after one sweep (``observations``, ``origins``, ``fleet_clusters`` are
    :func:`shared.remediation.breaker.update`'s arguments) and what was left out, for the sweep's report."""

    observations: dict[str, float] = field(default_factory=dict)  # node key -> since: checked, or in the window
    origins: dict[str, str] = field(default_factory=dict)  # node key -> its cluster's ARM id
    fleet_clusters: int = 0  # clusters with GPU nodes in this sweep
    fleet_nodes: int = 0  # the fleet's GPU nodes: listed, each cluster's at most what ARM has (when it matters)
    checked: int = 0  # nodes judged against ARM in this sweep
    refused: dict[str, int] = field(default_factory=dict)  # node_truth refusal code -> nodes not counted
    deferred: int = 0  # left for a later sweep (BREAKER_VERIFY_MAX_NODES)
    beyond_share: int = 0  # not checked: their cluster already has all the breaker counts of it
    unattributed: int = 0  # observed keys of no listed node (a cluster whose listing failed)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"counted": len(self.observations), "checked": self.checked, "refused": dict(self.refused),
                "deferred": self.deferred, "beyond_share": self.beyond_share, "unattributed": self.unattributed,
                "fleet_clusters": self.fleet_clusters, "fleet_nodes": self.fleet_nodes}


def locate(observations: Mapping[str, float], known: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each observed node key's (cluster id in lower case, node name), from the nodes the sweep listed
    (``known``: cluster id in lower case -> its GPU nodes' names); keys of no listed node are left out."""
    wanted = set(observations)
    found: dict[str, tuple[str, str]] = {}
    if not wanted:
        return found
    for cluster_id, names in known.items():
        for name in names:
            key = node_key(cluster_id, name)
            if key in wanted:
                found[key] = (cluster_id, name)
        if len(found) == len(wanted):
            break
    return found


def _candidates(new: Mapping[str, tuple[str, str]], observations: Mapping[str, float],
                need: Mapping[str, int | None]) -> tuple[dict[str, deque[str]], int]:
    """Per cluster, the keys worth checking, earliest fault first (at most what its share still counts),
    and how many were left out for being beyond the share."""
    queues: dict[str, deque[str]] = {}
    beyond = 0
    by_cluster: dict[str, list[str]] = {}
    for key, (cluster_id, _) in new.items():
        by_cluster.setdefault(cluster_id, []).append(key)
    for cluster_id, keys in sorted(by_cluster.items()):
        keys.sort(key=lambda k: (observations[k], k))
        room = need.get(cluster_id)
        if room is not None:
            beyond += max(0, len(keys) - room)
            keys = keys[:max(0, room)]
        if keys:
            queues[cluster_id] = deque(keys)
    return queues, beyond


def gather(ctx: Context, *, clusters: Sequence[ClusterInfo], known: Mapping[str, Mapping[str, Any]],
           observations: Mapping[str, float], fleet_nodes: int, policy: RemediationPolicy) -> Evidence:
    """The observations the breaker may count, each with its cluster (see the module docstring).

    ``known`` is the sweep's listing (cluster id in lower case -> its GPU nodes' names), ``clusters``
    the clusters swept (ARM's view, for the check). Raises only what reading the breaker's record raises.
    """
    ev = Evidence(fleet_clusters=sum(1 for names in known.values() if names), fleet_nodes=fleet_nodes)
    located = locate(observations, known)
    ev.unattributed = len(observations) - len(located)
    state = breaker.current(ctx)
    trip = breaker.trip_count(fleet_nodes, policy)
    if state.is_open or trip is None:
        return ev
    floor = max(ctx.clock.now() - policy.breaker_window_s, state.reset_at)
    in_window: dict[str, int] = {}  # cluster tag -> nodes already counted
    for key, since in state.window.items():
        if since >= floor:
            tag = state.origins.get(key, breaker.UNATTRIBUTED)
            in_window[tag] = in_window.get(tag, 0) + 1
    new: dict[str, tuple[str, str]] = {}
    by_id = {c.id.lower(): c for c in clusters}
    for key, (cluster_id, node) in located.items():
        if key in state.window:  # checked when it entered the window
            ev.observations[key] = observations[key]
            ev.origins[key] = by_id[cluster_id].id if cluster_id in by_id else cluster_id
        elif observations[key] >= floor and cluster_id in by_id:
            new[key] = (cluster_id, node)
    cap = breaker.cluster_cap(fleet_nodes=fleet_nodes, fleet_clusters=ev.fleet_clusters, policy=policy)
    need = {cid: None if cap is None else cap - in_window.get(breaker.cluster_tag(cid), 0) for cid in by_id}
    queues, ev.beyond_share = _candidates(new, observations, need)
    projected = dict(in_window)
    budget = policy.breaker_verify_max_nodes
    while queues and budget > 0 and breaker_count(projected, cap) < trip:
        for cluster_id in list(queues):
            if budget <= 0 or breaker_count(projected, cap) >= trip:
                break
            key = queues[cluster_id].popleft()
            budget -= 1
            outcome = _check(ctx, ev, by_id[cluster_id], located[key][1], key=key, since=observations[key])
            if outcome == _COUNTED:
                tag = breaker.cluster_tag(cluster_id)
                projected[tag] = projected.get(tag, 0) + 1
            elif outcome == _UNREADABLE:
                queues[cluster_id].clear()  # the cluster or ARM cannot be read now: the next sweep tries again
            if not queues[cluster_id]:
                del queues[cluster_id]
    ev.deferred = sum(len(q) for q in queues.values())
    if breaker_count(projected, cap) >= policy.breaker_min_nodes:
        ev.fleet_nodes = _bounded_fleet(ctx, ev, by_id, known)
    if ev.refused or ev.deferred:
        log.info("breaker evidence: %s", ev.summary())
    return ev


def _bounded_fleet(ctx: Context, ev: Evidence, clusters: Mapping[str, ClusterInfo],
                   known: Mapping[str, Mapping[str, Any]]) -> int:
    """The fleet's GPU nodes with each cluster's listing bounded by ARM's count of its GPU pools' nodes."""
    total = 0
    for cluster_id, names in known.items():
        listed = len(names)
        cluster = clusters.get(cluster_id)
        if cluster is None or cluster.node_provisioning_mode.lower() == "auto" or not listed:
            total += listed  # Karpenter's nodes have no pool in ARM to bound them
            continue
        try:
            pools = ctx.access.aks().list_pools(cluster.id)
        except StewardError as exc:
            ev.errors.append(f"breaker evidence: {cluster.id}: listing its pools: {type(exc).__name__}: {exc}")
            total += listed
            continue
        in_arm = sum(p.count for p in pools if node_truth.check_pool(cluster, p.name, p).ok)
        total += min(listed, in_arm)
    return total


def breaker_count(per_cluster: Mapping[str, int], cap: int | None) -> int:
    """What the breaker counts of these per-cluster numbers of nodes (at most ``cap`` each)."""
    return sum(n if cap is None else min(n, cap) for n in per_cluster.values())


def _check(ctx: Context, ev: Evidence, cluster: ClusterInfo, name: str, *, key: str, since: float) -> str:
    """Judge one node against ARM; it is counted only when ARM vouches for it."""
    ev.checked += 1
    try:
        view = ctx.access.kube(cluster.id).get_node(name)
        verdict = admission.judge_node(ctx, cluster, view) if view is not None else None
    except StewardError as exc:
        ev.errors.append(f"breaker evidence: {cluster.id}/{name}: {type(exc).__name__}: {exc}")
        return _UNREADABLE
    if verdict is None or not verdict.ok:
        code = GONE if verdict is None else verdict.code
        ev.refused[code] = ev.refused.get(code, 0) + 1
        return _REFUSED
    ev.observations[key] = since
    ev.origins[key] = cluster.id
    return _COUNTED

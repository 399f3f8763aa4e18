"""Spot evictions as a scenario fault: Azure takes spot VMs back at given times.

A scenario lists them under ``spot_evictions``::

    spot_evictions:
      - {cluster: c1, pool: gpuspot, node_index: 0, at: 120}      # 120 s after the start
      - {cluster: c1, node: aks-gpuspot-12345678-vmss000001, at: 300, notice_s: 30}

Each one calls :meth:`sim.model.Cluster.spot_evict` when due (a Preempt notice, then the VM goes
``notice_s`` later as the pool's ``scaleSetEvictionPolicy`` says); the node is resolved when the
eviction fires, so it may name a node that a scale-up creates later. A node that is gone, or not a
spot node, by then is skipped (Azure evicts only spot VMs that exist). The same fault is available
at run time as ``POST /_sim/spot-evict {"cluster", "node"[, "notice_s"]}``.
"""

from __future__ import annotations

import logging
from typing import Any

from sim.model import SPOT_LABEL, SPOT_NOTICE_S, Cluster, Fleet

log = logging.getLogger("sim.core.spot")

KEYS = {"cluster", "node", "pool", "node_index", "at", "notice_s"}


class SpotEvictionError(ValueError):
    """A spot eviction that cannot be scheduled; the message names the offending path."""


def _target(fleet: Fleet, spec: Any, where: str) -> Cluster:
    if not isinstance(spec, dict):
        raise SpotEvictionError(f"{where} must be a mapping")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise SpotEvictionError(f"{where}: unknown keys {unknown}; known: {sorted(KEYS)}")
    name = str(spec.get("cluster") or "")
    cluster = fleet.cluster_by_name(name)
    if cluster is None:
        raise SpotEvictionError(f"{where}.cluster {name!r} is not in the scenario")
    if not spec.get("node"):
        pool = str(spec.get("pool") or "")
        if pool not in cluster.pools:
            raise SpotEvictionError(f"{where} needs a node, or a pool of {name} (and a node_index)")
        if str(cluster.pools[pool].properties.get("scaleSetPriority") or "").lower() != "spot":
            raise SpotEvictionError(f"{where}.pool {pool!r} is not a spot pool: Azure evicts only spot VMs")
    for key in ("at", "notice_s"):
        if key in spec and (not isinstance(spec[key], int | float) or spec[key] < 0):
            raise SpotEvictionError(f"{where}.{key} must be a non-negative number of seconds")
    return cluster


def _resolve(cluster: Cluster, spec: dict[str, Any]) -> str | None:
    if spec.get("node"):
        return str(spec["node"])
    nodes = cluster.pool_nodes(str(spec["pool"]))
    index = int(spec.get("node_index", 0))
    return nodes[index].name if 0 <= index < len(nodes) else None


def schedule_spot_eviction(fleet: Fleet, spec: Any, where: str, t0: float) -> None:
    """Check ``spec`` now and evict its node at ``t0 + at``."""
    cluster = _target(fleet, spec, where)
    notice = float(spec.get("notice_s", SPOT_NOTICE_S))

    def fire() -> None:
        node = _resolve(cluster, spec)
        if node is None or node not in cluster.nodes or cluster.nodes[node].labels.get(SPOT_LABEL) != "spot":
            log.info("%s: no spot node to evict (%s)", where, node)
            return
        cluster.spot_evict(node, notice_s=notice)

    fleet.at(t0 + float(spec.get("at", 0)), fire)


def schedule_spot_evictions(fleet: Fleet, specs: Any, t0: float, *, where: str = "spot_evictions") -> None:
    if specs in (None, []):
        return
    if not isinstance(specs, list):
        raise SpotEvictionError(f"{where} must be a list")
    for i, spec in enumerate(specs):
        schedule_spot_eviction(fleet, spec, f"{where}[{i}]", t0)

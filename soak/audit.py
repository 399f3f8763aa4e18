"""What the fleet and the ledger look like, read as an auditor would: never through the app's code.

The invariants must not trust the app's own account of its work, so the fleet is read from the
simulator (``/_sim/state``, ``/_sim/oracles``) and straight from each cluster's Kubernetes API with
a plain HTTPS GET, and the ledger straight from its table. :class:`Sampler` also keeps, at every
step of a run, how many established nodes of each pool were unavailable (cordoned or NotReady),
which is what the budgets bound.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.kernel.ports import Record

AKS_SERVER_APP = "6dae42f8-4368-4678-94ff-3960e28e3630"
#: The records the invariants read: the long jobs, and the DCGM sweep's node rows and the fleet breaker
#: (soak/forgery_invariants.py: no row for a phantom node, no breaker opened by forged series), and the per-node
#: rows whose attempts say which remediations admission created (soak/forged_row_invariants.py).
KINDS = ("remediation", "migration", "pool-request", "dcgm-node", "breaker", "remediation-node", "dedupe", "decision",
         "pending-fault")


def kube_nodes(sim: Any, cluster: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every node object of a simulated cluster, from its API server (labels and annotations included)."""
    token = sim.token(AKS_SERVER_APP)
    context = ssl.create_default_context(cafile=str(sim.endpoints["ca_bundle"]))
    request = urllib.request.Request(f"{cluster['kube_server']}/api/v1/nodes",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return list(json.loads(response.read()).get("items") or [])


def ledger_records(ledger: Any, kinds: Iterable[str] = KINDS) -> dict[str, list[Record]]:
    return {kind: list(ledger.list(kind)) for kind in kinds}


def active_records(ledger: Any) -> int:
    """How many remediation, migration and pool-request records are still in an active state, and kept faults."""
    from shared.migration import steps as migration
    from shared.pools import steps as pool_steps
    from shared.remediation import pending_faults
    from shared.remediation import steps as remediation

    # a kept refused fault is work still to do: the run is not quiet while one waits (issue 24)
    return sum(len(ledger.list(m.KIND, states=sorted(m.ACTIVE_STATES))) for m in (remediation, migration, pool_steps)) + \
        len(ledger.list(pending_faults.KIND))


@dataclass
class Sampler:
    """Per pool, the most established nodes unavailable at once (sampled at every driver step).

    A node is *established* once it has been seen Ready and schedulable: a node that is still
    joining (a surge or a replacement) adds capacity, it does not take any away.
    """

    established: set[tuple[str, str]] = field(default_factory=set)
    max_unavailable: dict[str, int] = field(default_factory=dict)
    worst_at: dict[str, tuple[float, list[str]]] = field(default_factory=dict)
    samples: int = 0
    initial_nodes: dict[str, list[str]] = field(default_factory=dict)  # "cluster/pool" -> node names at start
    # For the checks of issue 10: every node seen and its pool (Karpenter nodes come and go), and at
    # each step the nodes that turned schedulable again and the GPU conditions that turned True, with
    # the previous sample's time (the event happened in between).
    first_t: float = 0.0
    node_pools: dict[tuple[str, str], str] = field(default_factory=dict)
    uncordons: list[dict[str, Any]] = field(default_factory=list)
    turned_true: list[dict[str, Any]] = field(default_factory=list)
    _last: dict[tuple[str, str], tuple[bool, frozenset[str]]] = field(default_factory=dict)
    _last_t: float = 0.0

    def _transitions(self, key: tuple[str, str], node: Mapping[str, Any], now: float) -> None:
        unschedulable = bool(node.get("unschedulable"))
        unhealthy = frozenset(str(c) for c in node.get("unhealthy") or [])
        before = self._last.get(key)
        self._last[key] = (unschedulable, unhealthy)
        if before is None:
            if self.samples > 1 and unhealthy:
                # A node that joined since the last sample already showing a condition True (a flip struck it
                # while it booted: sim/scenario.py resolves node_index among the pool's nodes then) turned
                # it True in between too (seed 955084: the node made for a replace, the give-up naming it).
                self.turned_true.append({"t": now, "prev_t": self._last_t, "cluster": key[0], "node": key[1],
                                         "conditions": sorted(unhealthy)})
            return
        if before[0] and not unschedulable:
            self.uncordons.append({"t": now, "prev_t": self._last_t, "cluster": key[0], "node": key[1],
                                   "unhealthy": sorted(unhealthy)})
        if unhealthy - before[1]:
            self.turned_true.append({"t": now, "prev_t": self._last_t, "cluster": key[0], "node": key[1],
                                     "conditions": sorted(unhealthy - before[1])})

    def sample(self, state: Mapping[str, Any]) -> None:
        self.samples += 1
        now = float((state.get("clock") or {}).get("now", 0.0))
        if self.samples == 1:
            self.first_t = now
        for cluster in state.get("clusters") or []:
            cname = str(cluster["name"])
            down: dict[str, list[str]] = {}
            for node in cluster.get("nodes") or []:
                key = (cname, str(node["name"]))
                self.node_pools[key] = str(node.get("pool", ""))
                self._transitions(key, node, now)
                healthy = bool(node.get("ready")) and not node.get("unschedulable")
                if healthy:
                    self.established.add(key)
                    continue
                if key in self.established:
                    down.setdefault(f"{cname}/{node['pool']}", []).append(str(node["name"]))
            if self.samples == 1:
                for pool in cluster.get("pools") or []:
                    self.initial_nodes[f"{cname}/{pool['name']}"] = list(pool.get("nodes") or [])
                    for name in pool.get("nodes") or []:
                        self.established.add((cname, str(name)))
            for label, names in down.items():
                if len(names) > self.max_unavailable.get(label, 0):
                    self.max_unavailable[label] = len(names)
                    self.worst_at[label] = (now, sorted(names))
        self._last_t = now

"""The invariants of issue 18's forged DCGM series (soak/forgeries.py), checked after every soak run.

Pure functions over the run's :class:`soak.invariants.Evidence`, like the others. The ground truth is
what the driver did (``evidence.actions``: the nodes each forgery named, resolved when it was played)
minus every node some genuine fault touched: a GPU condition that turned True on it (the sampler's
transitions: NPD flips, flapping, NAP flips), a Resource Health scenario or a genuine DCGM fault played
on it. What is left was named only by forged series; those nodes, and the phantom names, are judged
from the simulator's oracles, the node objects and the ledger, never from the app's account:

21. ``forged-series``: no node named only by forged series was cordoned, drained (a pod evicted from it),
    restarted, reimaged or replaced, unless a remediation from another signal explains it; and no
    remediation with signal ``dcgm`` exists for it.
22. ``breaker-forged``: the fleet breaker never opened because of forged series: an open breaker whose
    window (frozen when it opened) counts forged-only or phantom nodes must still trip without them, and
    in a run with no genuine GPU fault at all it must not be open.
23. ``phantom-node``: no ``dcgm-node`` row and no remediation names a phantom node (a name of the burst,
    or a node of another cluster under an alias), nor any node its cluster never had.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shared.remediation.records import node_key
from soak.forgeries import ALIAS_REVERT, FORGE_ALIAS, FORGE_SERIES, PHANTOMS, phantom_names
from soak.invariants import Evidence, Violation, _cluster_name

DCGM = "dcgm"
#: The actions whose node a genuine fault struck (soak/signals.py, soak/strict.py).
GENUINE_ACTIONS = frozenset({"resource-health", "dcgm-xid", "dcgm-ecc-storm", "nap-flip"})

Node = tuple[str, str]  # (cluster name, node name)


@dataclass
class Truth:
    """Who named what: nodes named by forged series, by genuine faults, and the phantom names."""

    forged: set[Node] = field(default_factory=set)
    genuine: set[Node] = field(default_factory=set)
    phantoms: set[Node] = field(default_factory=set)
    forged_series: int = 0

    @property
    def forged_only(self) -> set[Node]:
        return self.forged - self.genuine


def _done(evidence: Evidence, *kinds: str) -> list[dict[str, Any]]:
    return [a for a in evidence.actions if a.get("kind") in kinds and a.get("ok")]


def ground_truth(evidence: Evidence) -> Truth:
    truth = Truth()
    # The cluster label a series got is its cluster's alias when one was set (label_cluster): a node named
    # under another cluster's name is a phantom there.
    for action in _done(evidence, FORGE_SERIES):
        node = (str(action["node_cluster"]), str(action["node"]))
        truth.forged.add(node)
        truth.forged_series += 1
        if action.get("label_cluster") and action["label_cluster"] != node[0]:
            truth.phantoms.add((str(action["label_cluster"]), node[1]))
    for action in _done(evidence, FORGE_ALIAS):
        truth.forged.add((str(action["node_cluster"]), str(action["node"])))
        truth.forged.add((str(action["cluster"]), str(action["phantom"])))  # its own node, named under the alias
        truth.phantoms.add((str(action.get("label_cluster") or action["alias"]), str(action["phantom"])))
        truth.forged_series += 2
    clusters = {str(c.get("name")) for c in evidence.state.get("clusters") or []}
    for action in _done(evidence, PHANTOMS):  # no cluster has them, whatever alias their series carried
        for cluster in clusters | {str(action["cluster"]), str(action.get("label_cluster") or action["cluster"])}:
            truth.phantoms.update((cluster, name) for name in phantom_names(action))
    for action in _done(evidence, *GENUINE_ACTIONS):
        if action.get("node"):
            truth.genuine.add((str(action["cluster"]), str(action["node"])))
    for change in evidence.turned_true:
        truth.genuine.add((str(change["cluster"]), str(change["node"])))
    return truth


def _rec_node(rec: Any) -> Node:
    return _cluster_name(str(rec.data.get("cluster", ""))), str(rec.data.get("node", ""))


def _signal(rec: Any) -> str:
    return str(rec.data.get("signal") or "npd")


def _unschedulable(evidence: Evidence) -> set[Node]:
    return {(cluster, str((n.get("metadata") or {}).get("name", ""))) for cluster, nodes in evidence.nodes.items()
            for n in nodes if (n.get("spec") or {}).get("unschedulable")}


def check_forged_series(evidence: Evidence) -> list[Violation]:
    truth = ground_truth(evidence)
    victims = truth.forged_only
    if not victims:
        return []
    out = []
    explained: set[Node] = set()
    for rec in evidence.records.get("remediation", []):
        node = _rec_node(rec)
        if node not in victims:
            continue
        if _signal(rec) == DCGM:
            out.append(Violation("forged-series", f"{node[0]}/{node[1]}, named only by forged DCGM series, has "
                                                  f"remediation {rec.id} ({rec.data.get('condition')}, "
                                                  f"{rec.data.get('policy_row')}, {rec.state})"))
        else:
            explained.add(node)
    suspects = victims - explained

    def charge(node: Node, what: str) -> None:
        out.append(Violation("forged-series", f"{node[0]}/{node[1]}, named only by forged DCGM series, was {what}"))

    for r in evidence.oracles.get("repairs") or []:
        if (str(r.get("cluster")), str(r.get("node"))) in suspects:
            charge((str(r["cluster"]), str(r["node"])), f"given a VM {r.get('rung')} at t+{_t(evidence, r)}s")
    for r in evidence.oracles.get("nodes_removed") or []:
        if (str(r.get("cluster")), str(r.get("node"))) in suspects:
            charge((str(r["cluster"]), str(r["node"])), f"removed ({r.get('cause')}) at t+{_t(evidence, r)}s")
    drained = {(str(t.get("cluster")), str(t.get("node"))) for t in evidence.oracles.get("terminations") or []
               if t.get("cause") == "eviction"}
    for node in sorted(suspects & drained):
        charge(node, "drained (pods evicted from it)")
    cordoned = {(str(u["cluster"]), str(u["node"])) for u in evidence.uncordons} | _unschedulable(evidence)
    for node in sorted(suspects & cordoned):
        charge(node, "cordoned")
    return out


def _t(evidence: Evidence, entry: dict[str, Any]) -> str:
    return f"{float(entry.get('t') or 0.0) - evidence.start:.0f}"


def _cluster_ids(evidence: Evidence) -> dict[str, str]:
    ids = {str(c.get("name")): str(c.get("id")) for c in evidence.state.get("clusters") or [] if c.get("id")}
    for rec in evidence.records.get("remediation", []):
        cid = str(rec.data.get("cluster", ""))
        if cid:
            ids.setdefault(_cluster_name(cid), cid)
    return ids


def _keys(nodes: Iterable[Node], ids: dict[str, str]) -> dict[str, Node]:
    return {node_key(ids[c], n): (c, n) for c, n in nodes if c in ids}


def would_trip(count: int, fleet_nodes: int, profile: dict[str, str]) -> bool:
    """The breaker's rule (docs/remediation.md), restated on purpose: BREAKER_MAX_NODES, or more than
    BREAKER_PERCENT of the fleet once BREAKER_MIN_NODES turned unhealthy."""
    if str(profile.get("BREAKER_ENABLED", "true")).lower() == "false":
        return False
    most = int(profile.get("BREAKER_MAX_NODES", "0") or 0)
    if most and count >= most:
        return True
    least, percent = int(profile.get("BREAKER_MIN_NODES", "3")), int(profile.get("BREAKER_PERCENT", "30"))
    return count >= least and fleet_nodes > 0 and count * 100 > percent * fleet_nodes


def _breaker(evidence: Evidence) -> Any:
    return next((r for r in evidence.records.get("breaker", []) if r.id == "fleet"), None)


def _opened(rec: Any) -> bool:
    return rec.state == "open" or any(h.get("state") == "open" for h in rec.history or [])


def check_breaker_forged(evidence: Evidence) -> list[Violation]:
    rec = _breaker(evidence)
    truth = ground_truth(evidence)
    if rec is None or not _opened(rec) or not (truth.forged or truth.phantoms):
        return []
    ids = _cluster_ids(evidence)
    forged = _keys(truth.forged_only | truth.phantoms, ids)
    window = {str(k) for k in (rec.data.get("window") or {})}
    counted = sorted(forged[k] for k in window & set(forged))
    fleet = int(rec.data.get("fleet_nodes") or 0)
    out = []
    if counted and not would_trip(len(window) - len(counted), fleet, evidence.scenario.profile):
        names = ", ".join(f"{c}/{n}" for c, n in counted[:6])
        out.append(Violation("breaker-forged", f"the breaker opened ({rec.data.get('reason')}) counting "
                                               f"{len(counted)} node(s) named only by forged series ({names}); "
                                               f"without them {len(window) - len(counted)} of {fleet} would not "
                                               "trip it"))
    elif not truth.genuine:
        out.append(Violation("breaker-forged", f"the breaker opened ({rec.data.get('reason')}) in a run whose only "
                                               "GPU faults were forged DCGM series"))
    return out


def check_phantom_nodes(evidence: Evidence) -> list[Violation]:
    truth = ground_truth(evidence)
    if not (truth.forged or truth.phantoms):
        return []
    existed = {(str(c), str((n.get("metadata") or {}).get("name", ""))) for c, nodes in evidence.nodes.items()
               for n in nodes}
    existed |= {(str(r.get("cluster")), str(r.get("node"))) for r in evidence.oracles.get("nodes_removed") or []}
    existed |= set(evidence.node_pools)
    out = []
    for rec in evidence.records.get("dcgm-node", []):
        node = _rec_node(rec)
        if node in truth.phantoms:
            out.append(Violation("phantom-node", f"dcgm-node row {rec.id} names the phantom {node[0]}/{node[1]}"))
        elif node not in existed:
            out.append(Violation("phantom-node", f"dcgm-node row {rec.id} names {node[0]}/{node[1]}, which that "
                                                 "cluster never had"))
    for rec in evidence.records.get("remediation", []):
        if _rec_node(rec) in truth.phantoms:
            out.append(Violation("phantom-node", f"remediation {rec.id} ({_signal(rec)}) names the phantom "
                                                 f"{'/'.join(_rec_node(rec))}"))
    return out


def forgery_tally(evidence: Evidence) -> tuple[Counter[str], Counter[str]]:
    """For the summary: what was injected (series, phantom names) and what the app made of it."""
    injected: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    truth = ground_truth(evidence)
    if not (truth.forged or truth.phantoms or _done(evidence, ALIAS_REVERT)):
        return injected, seen
    injected["forgeries: forged series naming a fleet node"] += truth.forged_series
    injected["forgeries: phantom node names"] += sum(int(a.get("sent") or 0) for a in _done(evidence, PHANTOMS))
    injected["forgeries: cluster_alias forgery"] += len(_done(evidence, FORGE_ALIAS))
    seen["forgeries: nodes named only by forged series"] += len(truth.forged_only)
    victims = {n for c, n in truth.forged_only}
    reported = {str((e.get("data") or {}).get("node")) for e in evidence.published
                if e.get("type") == "Steward.GpuNode.Unhealthy" and (e.get("data") or {}).get("signal") == DCGM}
    seen["forgeries:   of them published Unhealthy by a sweep (re-check refused)"] += len(victims & reported)
    rec = _breaker(evidence)
    if rec is not None:
        counted = set(_keys(truth.forged_only | truth.phantoms, _cluster_ids(evidence))) & set(rec.data.get("window") or {})
        seen[f"forgeries:   of them in the breaker's final window ({rec.state})"] += len(counted)
    return +injected, +seen  # without the zeros


def truth_note(evidence: Evidence) -> str:
    """The ground truth in one line, for ``--replay`` and failure reports ("" when nothing was forged)."""
    truth = ground_truth(evidence)
    if not (truth.forged or truth.phantoms):
        return ""
    only = ", ".join(f"{c}/{n}" for c, n in sorted(truth.forged_only)) or "none"
    struck = ", ".join(f"{c}/{n}" for c, n in sorted(truth.forged & truth.genuine)) or "none"
    names = len({n for _, n in truth.phantoms})
    return (f"forgeries: named only by forged series: {only}; also struck by a genuine fault: {struck}; "
            f"{names} phantom name(s)")


FORGERY_CHECKS = (check_forged_series, check_breaker_forged, check_phantom_nodes)

"""Issue 18's forged DCGM series in the soak: tenants and cluster admins writing what looks like a fault.

Drawn from a fourth RNG, ``random.Random(f"forgeries:{seed}")``, after :mod:`soak.generate`
(``Random(seed)``), :mod:`soak.strict` (``Random(f"strict:{seed}")``) and :mod:`soak.signals`
(``Random(f"signals:{seed}")``) have drawn: every earlier draw stays exactly as it was, so a seed's fleet,
flips, fault rules, crashes, strict faults and genuine signals are the same with or without this layer,
which only adds timed actions. It draws only where :mod:`soak.signals` drew DCGM (the clusters send
dcgm-exporter metrics to the simulator's workspace), because a forged series needs a workspace that
the app reads. What a forger can write is what shared/remediation/dcgm_provenance.py says AKS lets
them write (sim/prometheus/dcgm.py plays each through ``/_sim/dcgm/...``):

- **a tenant pod scraped through pod annotations** (ama-metrics' ``kubernetes-pods`` job), its pod
  labelled ``job=dcgm-exporter`` and ``instance=<a healthy node>``: the series carries the job's own
  ``kubernetes_namespace``/``kubernetes_pod_name`` labels (refused: ``foreign-labels``);
- **a tenant's PodMonitor** with ``honorLabels`` and a ``labeldrop`` of the operator's labels: exactly
  the managed exporter's five labels, naming a healthy node (a copy contradicted by the node's own
  exporter: the window re-check's ``min_over_time`` never confirms it);
- **a cluster admin's ``cluster_alias``** (only when two clusters share the workspace): the second
  cluster's alias is set to the first's name for a while, and a PodMonitor in the second cluster names a
  healthy node of the first (a copy, as above) and one of its own nodes (a node the first cluster does not
  have: a phantom);
- **a burst of phantom node names**: a few hundred PodMonitor series in the managed shape, each naming
  a node that no cluster has (``aks-ghost...``), all with fault values.

Every forgery stays in the workspace until the run ends (the cluster alias is lifted after 30-150 s, so
that a genuine fault of the second cluster is seen again). An alias renames everything its cluster sends,
tenant series included (:func:`_relabel`). The invariants (soak/forgery_invariants.py)
judge from the simulator's oracles and the ledger: a node named only by forgeries is never touched, the
breaker is never opened by them, and no ``dcgm-node`` row names a phantom.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

P_FORGERIES = 0.85  # given DCGM (the rest keeps issue 13's genuine-only DCGM runs)
P_ALIAS = 0.8  # given forgeries and two clusters on the workspace
P_PHANTOMS = 0.85  # given forgeries

XID = "DCGM_FI_DEV_XID_ERRORS"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
#: The faults a forger writes: the managed exporter exports only these two counters (default-counters.csv),
#: and each value is one a policy row acts on (restart then replace, restart, replace).
FORGED_FAULTS: tuple[tuple[str, int], ...] = ((XID, 79), (XID, 48), (XID, 95), (REMAP_FAILURE, 1))
MANAGED_JOB = "dcgm-exporter"
#: What a PodMonitor's metricRelabelings drop to leave the managed exporter's shape (sim/prometheus/dcgm.py adds them).
OPERATOR_LABELS = ("namespace", "pod", "container", "endpoint")
#: Phantom node names: no pool of any soak fleet is called this (pools are gpu1, gpu2, old, system, NAP's gpu).
PHANTOM_POOL = "ghost"

FORGE_SERIES = "dcgm-forge-series"
FORGE_ALIAS = "dcgm-forge-alias"
ALIAS_REVERT = "dcgm-alias-revert"
PHANTOMS = "dcgm-phantoms"
KINDS = frozenset({FORGE_SERIES, FORGE_ALIAS, ALIAS_REVERT, PHANTOMS})


@dataclass
class ForgeryLayer:
    actions: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


def phantom_names(action: dict[str, Any]) -> list[str]:
    """The node names of a phantom burst (derived from its tag and count, so the scenario stays small)."""
    tag, count = int(action["tag"]), int(action["count"])
    return [f"aks-{PHANTOM_POOL}{tag % 10}-{tag:08d}-vmss{i:06d}" for i in range(count)]


def add_dcgm_forgeries(seed: int, *, pools: Sequence[Any], dcgm_clusters: Sequence[str], grace: float,
                       span: float) -> ForgeryLayer:
    """The forgeries of ``seed`` against the managed pools of the clusters in ``dcgm_clusters``."""
    rng = random.Random(f"forgeries:{seed}")
    layer = ForgeryLayer()
    clusters = sorted(set(dcgm_clusters))
    managed = [p for p in pools if p.managed and p.cluster in clusters]
    if not managed or rng.random() >= P_FORGERIES:
        return layer

    def when() -> float:
        return round(grace + rng.uniform(0, span), 1)

    def fault() -> dict[str, Any]:
        metric, value = rng.choice(FORGED_FAULTS)
        return {"metric": metric, "value": value, "gpu": 0}

    scrapes = {"annotations": rng.randint(1, 2), "podmonitor": rng.randint(1, 4)}
    for scrape, n in scrapes.items():
        for _ in range(n):
            pool = rng.choice(managed)
            layer.actions.append({"at": when(), "kind": FORGE_SERIES, "cluster": pool.cluster, "pool": pool.name,
                                  "node_index": rng.randrange(pool.count), "scrape": scrape, **fault()})
        layer.kinds.append(f"{n} forged dcgm series ({scrape})")

    if len(clusters) >= 2 and rng.random() < P_ALIAS:
        home, alias = rng.sample(clusters, 2)  # home's admin sets cluster_alias to alias's name
        victims = [p for p in managed if p.cluster == alias]
        own = [p for p in managed if p.cluster == home]
        if victims and own:
            victim, mine = rng.choice(victims), rng.choice(own)
            at = when()
            layer.actions.append({"at": at, "kind": FORGE_ALIAS, "cluster": home, "alias": alias,
                                  "pool": victim.name, "node_index": rng.randrange(victim.count),
                                  "own_pool": mine.name, "own_index": rng.randrange(mine.count), **fault()})
            layer.actions.append({"at": round(at + rng.uniform(30, 150), 1), "kind": ALIAS_REVERT, "cluster": home})
            layer.kinds.append("cluster_alias set to another cluster's name")

    if rng.random() < P_PHANTOMS:
        layer.actions.append({"at": when(), "kind": PHANTOMS, "cluster": rng.choice(clusters),
                              "count": rng.randint(150, 400), "tag": rng.randrange(10**8), **fault()})
        layer.kinds.append("phantom node names burst")
    return layer


# --------------------------------------------------------------------------- performing them (soak.actions)


def _healthy_node(sim: Any, cluster: str, pool: str, index: int) -> str | None:
    """The ``index``-th (modulo) Ready, schedulable node of a pool with no GPU condition True, when due."""
    state = sim.state()
    found = next((c for c in state.get("clusters") or [] if c["name"] == cluster), None) or {}
    healthy = {str(n["name"]) for n in found.get("nodes") or []
               if n.get("ready") and not n.get("unschedulable") and not n.get("unhealthy")}
    members = next((p.get("nodes") or [] for p in found.get("pools") or [] if p["name"] == pool), [])
    nodes = [str(n) for n in members if str(n) in healthy]
    return nodes[index % len(nodes)] if nodes else None


def _send(sim: Any, body: dict[str, Any], sent: list[dict[str, Any]]) -> dict[str, str]:
    labels = dict(sim.control("POST", "/dcgm/tenant-series", body)["labels"])
    sent.append(body)
    return labels


def _podmonitor(sim: Any, cluster: str, node: str, action: dict[str, Any], sent: list[dict[str, Any]]) -> dict[str, str]:
    """A PodMonitor series in the managed exporter's exact shape, naming ``node`` (sent by ``cluster``)."""
    body = {"cluster": cluster, "scrape": "podmonitor", "honor_labels": True, "drop_labels": list(OPERATOR_LABELS),
            "labels": {"job": MANAGED_JOB, "instance": node, "gpu": str(action.get("gpu", 0))},
            "metric": action["metric"], "value": action["value"]}
    return _send(sim, body, sent)


def _relabel(sim: Any, sent: list[dict[str, Any]]) -> None:
    """After a cluster_alias change, send every tenant series again. ama-metrics puts a cluster's alias on
    everything the cluster sends, the tenants' series included, and the simulator now does too
    (sim/prometheus/api.py ``writers``); before it did, a forged copy sent before the alias kept the old name
    alone (seed 124). The re-send is kept so that existing seeds replay as they did."""
    sim.control("POST", "/dcgm/tenant-series/clear", {})
    for body in sent:
        sim.control("POST", "/dcgm/tenant-series", body)


def perform(sim: Any, action: dict[str, Any], *, sent: list[dict[str, Any]]) -> str:
    """Play one forgery through the simulator's control API; what it named is kept in ``action``.

    ``sent``: every tenant series sent so far in this run (sent again after an alias change). Progress is
    kept in ``action``, so a retry after an injected fault does not repeat what was done."""
    kind = action["kind"]
    if kind == FORGE_SERIES:
        node = _healthy_node(sim, action["cluster"], action["pool"], int(action["node_index"]))
        if node is None:
            return "skipped: no healthy node in the pool"
        if action["scrape"] == "annotations":
            body = {"cluster": action["cluster"], "scrape": "annotations", "metric": action["metric"],
                    "value": action["value"], "labels": {"gpu": str(action.get("gpu", 0))},
                    "pod_labels": {"job": MANAGED_JOB, "instance": node}}
            labels = _send(sim, body, sent)
        else:
            labels = _podmonitor(sim, action["cluster"], node, action, sent)
        action.update(node=node, node_cluster=action["cluster"], labels=sorted(labels), label_cluster=labels.get("cluster"))
        return f"{action['scrape']} series {action['metric']}={action['value']} naming {node}"
    if kind == FORGE_ALIAS:
        if "node" not in action:
            node = _healthy_node(sim, action["alias"], action["pool"], int(action["node_index"]))
            own = _healthy_node(sim, action["cluster"], action["own_pool"], int(action["own_index"]))
            if node is None or own is None:
                return "skipped: no healthy node to name"
            action.update(node=node, node_cluster=action["alias"], phantom=own)
        sim.control("POST", "/dcgm/cluster-alias", {"cluster": action["cluster"], "alias": action["alias"]})
        _relabel(sim, sent)
        for key in ("node", "phantom"):
            if not action.get(f"{key}_sent"):
                action["label_cluster"] = _podmonitor(sim, action["cluster"], action[key], action, sent).get("cluster")
                action[f"{key}_sent"] = True
        return (f"{action['cluster']} aliased as {action['alias']}: series naming {action['node']} and its own "
                f"{action['phantom']}")
    if kind == ALIAS_REVERT:
        sim.control("POST", "/dcgm/cluster-alias", {"cluster": action["cluster"], "alias": ""})
        _relabel(sim, sent)
        return f"{action['cluster']}'s cluster_alias lifted"
    if kind == PHANTOMS:
        names = phantom_names(action)
        for name in names[int(action.get("sent", 0)):]:  # under the alias of its cluster, if one is set
            action["label_cluster"] = _podmonitor(sim, action["cluster"], name, action, sent).get("cluster")
            action["sent"] = int(action.get("sent", 0)) + 1
        return f"{len(names)} phantom node names with {action['metric']}={action['value']}"
    raise ValueError(f"unknown forgery {kind!r}")

"""The stricter faults of issue 10: what real clusters do that a lenient simulator did not.

Drawn from a second RNG, ``random.Random(f"strict:{seed}")``, on top of what ``soak.generate`` draws
from ``random.Random(seed)``: every earlier draw stays exactly as it was, so a seed's fleet, flips,
fault rules and crashes are the same with or without this layer, and this layer only adds. Each
fault has its own probability, so that in 200 seeds every kind appears many times:

- **a namespace deleted mid-run** (``batch``): a real ``DELETE /api/v1/namespaces/batch`` through the
  cluster's API server at a sim second, often just after a GPU fault on the pool its pods run on, so
  that a drain meets a namespace going away (pods deleted by the namespace controller, evictions
  refused with 403 ``NamespaceTerminating``); sometimes its pods carry finalizers, so the namespace
  stays ``Terminating``;
- **pods held by finalizers** (``hold``): a deleted (evicted) pod stays Terminating until its
  finalizer goes: removed by a timed patch (someone cleans up), by its owner after a delay (the
  simulator's ``pod_finalizers_release_s``), or never;
- **unready pods under a PDB** (``serve``): a Deployment whose pods never turn Ready, with a PDB that
  says ``IfHealthyBudget`` (the default: no eviction while the budget is short) or ``AlwaysAllow``;
- **a second PDB** over the pods of a Deployment (the Eviction API answers 500: the drain must refuse
  the node before evicting anything), and ``REMEDIATION_EMPTY_DIR=refuse`` (the emptyDir pods refuse
  the node up front);
- **a locked node resource group** (``ReadOnly`` lockdown: VMSS restart and reimage get 403), from the
  start or from a sim second on, sometimes lifted later;
- **a node auto-provisioning cluster** (``nap1``): a Karpenter GPU NodePool whose nodes Karpenter
  creates for pending GPU pods, and GPU condition flips on those nodes (resolved when they fire:
  the nodes exist only once Karpenter made them).

The drain's bounds (``DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S``, ``DRAIN_PDB_BLOCKED_TIMEOUT_S``) are
drawn here too, scaled to the soak's timings.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

FINALIZER = "soak.example.com/hold"
NAP_CLUSTER = "nap1"
NAP_POOL = "gpu"
NAP_SIZE = "Standard_NC4as_T4_v3"
GPU_TAINT = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}

# Probabilities per seed (each independent).
P_NAMESPACE = 0.35
P_FINALIZERS = 0.35
P_UNREADY = 0.35
P_SECOND_PDB = 0.15
P_EMPTY_DIR_REFUSE = 0.2
P_LOCK = 0.3
P_NAP = 0.3


@dataclass
class StrictLayer:
    actions: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    nap_pools: list[tuple[str, str]] = field(default_factory=list)


def _cluster(sim_clusters: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(c for c in sim_clusters if c["name"] == name)


def _near_a_flip(rng: random.Random, flips: list[dict[str, Any]], pool: Any, *, grace: float, span: float) -> float:
    """A sim second shortly after a GPU fault on ``pool`` (when its drain may be running), else any time."""
    mine = [f for f in flips if f["cluster"] == pool.cluster and f["pool"] == pool.name and f.get("status") == "True"]
    if mine and rng.random() < 0.75:
        return round(rng.choice(mine)["at"] + rng.uniform(15, 90), 1)
    return round(grace + rng.uniform(0, span), 1)


def add_strict_faults(seed: int, *, short: bool, pools: list[Any], profile: dict[str, str],
                      sim_clusters: list[dict[str, Any]], timings: dict[str, float], flips: list[dict[str, Any]],
                      grace: float, span: float) -> StrictLayer:
    """Add the stricter faults of ``seed`` to the scenario being built (in place) and return the rest."""
    rng = random.Random(f"strict:{seed}")
    layer = StrictLayer()
    managed = [p for p in pools if p.managed]
    profile["DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S"] = str(rng.choice([0, 20, 45, 90]))
    profile["DRAIN_PDB_BLOCKED_TIMEOUT_S"] = str(rng.choice([0, 40, 90]))

    def placement(pool: Any) -> dict[str, Any]:
        return {"tolerations": [dict(GPU_TAINT)], "nodeSelector": {"kubernetes.azure.com/agentpool": pool.name}}

    if managed and rng.random() < P_NAMESPACE:
        pool = rng.choice(managed)
        wl: dict[str, Any] = {"kind": "Deployment", "name": f"{pool.name}-etl", "namespace": "batch",
                              "replicas": rng.randint(1, pool.count), "resources": {"cpu": "100m"},
                              "terminationGracePeriodSeconds": rng.choice([2, 10, 30]), **placement(pool)}
        if rng.random() < 0.5:
            wl["pdb"] = {"maxUnavailable": 1}
        held = rng.random() < 0.4
        if held:
            wl["pod_finalizers"] = [FINALIZER]
            if rng.random() < 0.5:
                wl["pod_finalizers_release_s"] = rng.choice([20, 90])
        _cluster(sim_clusters, pool.cluster)["workloads"].append(wl)
        layer.actions.append({"at": _near_a_flip(rng, flips, pool, grace=grace, span=span), "kind": "delete-namespace",
                              "cluster": pool.cluster, "namespace": "batch"})
        layer.kinds.append("namespace deleted" + (" (pods with finalizers)" if held else ""))

    if managed and rng.random() < P_FINALIZERS:
        pool = rng.choice(managed)
        wl = {"kind": "Deployment", "name": f"{pool.name}-cache", "namespace": "hold",
              "replicas": rng.randint(1, max(1, pool.count - 1)), "resources": {"cpu": "100m"},
              "terminationGracePeriodSeconds": rng.choice([1, 3]), "pod_finalizers": [FINALIZER], **placement(pool)}
        how = rng.choice(["patch", "owner", "never"])
        if how == "owner":
            wl["pod_finalizers_release_s"] = rng.choice([10, 60, 200])
        if how == "patch":
            for _ in range(rng.randint(1, 2)):
                layer.actions.append({"at": _near_a_flip(rng, flips, pool, grace=grace, span=span) + 30,
                                      "kind": "remove-finalizers", "cluster": pool.cluster, "namespace": "hold"})
        _cluster(sim_clusters, pool.cluster)["workloads"].append(wl)
        layer.kinds.append(f"pods with finalizers (removed: {how})")

    if managed and rng.random() < P_UNREADY:
        pool = rng.choice(managed)
        policy = rng.choice(["IfHealthyBudget", "AlwaysAllow", ""])
        pdb: dict[str, Any] = dict(rng.choice([{"minAvailable": 1}, {"minAvailable": "50%"}, {"maxUnavailable": 1}]))
        if policy:
            pdb["unhealthyPodEvictionPolicy"] = policy
        _cluster(sim_clusters, pool.cluster)["workloads"].append(
            {"kind": "Deployment", "name": f"{pool.name}-warmup", "namespace": "serve",
             "replicas": rng.randint(1, max(1, pool.count - 1)), "resources": {"cpu": "100m"}, "ready": False,
             "terminationGracePeriodSeconds": rng.choice([1, 5]), "pdb": pdb, **placement(pool)})
        layer.kinds.append(f"unready pods under a PDB ({policy or 'IfHealthyBudget by default'})")

    if managed and rng.random() < P_SECOND_PDB:
        pool = rng.choice(managed)
        cluster = _cluster(sim_clusters, pool.cluster)
        covered = [w for w in cluster["workloads"] if w.get("kind") == "Deployment" and w.get("pdb")
                   and w["name"].startswith(f"{pool.name}-") and w.get("namespace") in ("ml", "web")]
        if covered:
            target = rng.choice(covered)
            cluster["workloads"].append({"manifest": {
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": f"{target['name']}-extra", "namespace": target["namespace"]},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": target["name"]}}}}})
            layer.kinds.append("a pod under two PDBs")

    if rng.random() < P_EMPTY_DIR_REFUSE:
        profile["REMEDIATION_EMPTY_DIR"] = "refuse"
        layer.kinds.append("REMEDIATION_EMPTY_DIR=refuse")

    arm_clusters = sorted({p.cluster for p in pools})
    if rng.random() < P_LOCK:
        name = rng.choice(arm_clusters)
        if rng.random() < 0.5:
            _cluster(sim_clusters, name)["node_resource_group_lockdown"] = "ReadOnly"
            layer.kinds.append("node resource group locked (from the start)")
        else:
            at = round(grace + rng.uniform(0, span * 0.7), 1)
            layer.actions.append({"at": at, "kind": "lock-node-rg", "cluster": name, "locked": True})
            kind = "node resource group locked (mid-run)"
            if rng.random() < 0.3:
                layer.actions.append({"at": round(at + rng.uniform(60, 200), 1), "kind": "lock-node-rg",
                                      "cluster": name, "locked": False})
                kind += ", lifted later"
            layer.kinds.append(kind)

    if rng.random() < P_NAP:
        replicas = rng.randint(1, 2 if short else 3)
        timings["nap_provision_s"] = 10.0
        sim_clusters.append({
            "name": NAP_CLUSTER, "resource_group": f"rg-{NAP_CLUSTER}", "location": "eastus",
            "tags": {"gpu-fleet-steward": "enabled"}, "node_provisioning_mode": "Auto",
            "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}],
            "karpenter": {
                "nodeclasses": [{"name": "managed", "tags": {"EnableManagedGPUExperience": "true"}}],
                "nodepools": [{"name": NAP_POOL, "node_class": "managed",
                               "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                 "values": [NAP_SIZE]}],
                               "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]}]},
            "workloads": [{"kind": "Deployment", "name": "nap-infer", "namespace": "ml", "replicas": replicas,
                           "resources": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"},
                           "tolerations": [dict(GPU_TAINT)], "pdb": {"maxUnavailable": 1},
                           "terminationGracePeriodSeconds": rng.choice([2, 5])}]})
        layer.nap_pools.append((NAP_CLUSTER, NAP_POOL))
        for _ in range(rng.randint(1, 2)):
            layer.actions.append({"at": round(grace + 20 + rng.uniform(0, span), 1), "kind": "nap-flip",
                                  "cluster": NAP_CLUSTER, "nodepool": NAP_POOL, "node_index": rng.randrange(replicas),
                                  "type": rng.choice(["UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices"])})
        layer.kinds.append(f"NAP cluster ({replicas} GPU pods)")

    layer.actions.sort(key=lambda a: (a["at"], a["kind"]))
    return layer

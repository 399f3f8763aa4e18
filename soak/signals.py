"""Issue 13's fault signals in the soak: Azure Resource Health events and DCGM error counters.

Drawn from a third RNG, ``random.Random(f"signals:{seed}")``, after :mod:`soak.generate` (``Random(seed)``)
and :mod:`soak.strict` (``Random(f"strict:{seed}")``) have drawn: every earlier draw stays exactly as it
was, so a seed's fleet, flips, fault rules, crashes and strict faults are the same with or without this
layer, which only adds timed actions (performed by :mod:`soak.actions` through the simulator's control
API, ``/_sim/resource-health`` and ``/_sim/dcgm/...``) and, when DCGM is drawn, the clusters whose
workspace the app reads (SIGNALS_PROMETHEUS, built from the simulator's endpoint when the run starts:
:func:`prometheus_setting`). Each kind has its own probability, so that 200 seeds see every kind many
times:

- **Resource Health** on a node of a managed pool (sim/arm/resource_health.py scenarios): a degraded host
  (cordon and drain ahead of the failure), a host failure (straight to replace), planned maintenance
  (only recorded) and a reboot for repair (only recorded);
- **forged HealthResources events** for VMs outside the fleet: in a subscription the app does not
  watch, or in the fleet's subscription but in no cluster's node resource group (a forger with the
  publishing key, a misrouted topic): nothing may be touched;
- **DCGM faults** on a node's GPU, on a fleet whose clusters send dcgm-exporter metrics to a workspace:
  XID 79 (restart, then replace), XID 48 (double-bit ECC), application XIDs 13/31/43 (ignored), an ECC
  storm (errors back after every reset, or not), and a **workspace outage** (503 from the query API, for
  a while; sometimes over a fault's first sighting): nothing may be inferred from the missing data.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Probabilities per seed (each independent).
P_RESOURCE_HEALTH = 0.5
P_FORGED = 0.3
P_DCGM = 0.5
P_OUTAGE = 0.4  # given DCGM

WORKSPACE = "soak-workspace"
#: The actions that put a genuine fault on a GPU, and how long after one the app may first act on it: the
#: exporter's next scrape (30 s) and a window re-check (``windowSeconds``, 90 s by default) whose every sample
#: shows it. The run lasts that long after the last one (soak.generate), or a fault drawn late is never seen.
GENUINE_DCGM = frozenset({"dcgm-xid", "dcgm-ecc-storm"})
DCGM_CONFIRM_S = 30.0 + 90.0
#: The scenarios of sim/eventgrid/health_resources.py played on a fleet node, with their weights.
HEALTH_SCENARIOS = (("degraded-host", 4), ("host-failure", 2), ("planned-maintenance", 3), ("reboot-for-repair", 1))
#: Scenarios whose every event a policy row only records (shared/remediation/signal_policy.py): they never
#: start a remediation.
RECORD_ONLY_SCENARIOS = frozenset({"planned-maintenance", "reboot-for-repair"})
APPLICATION_XIDS = (13, 31, 43)
#: VMs outside the fleet: another subscription, and the fleet's subscription in a group that is no node RG.
FOREIGN_SUBSCRIPTION = "0f0e0d0c-0000-4000-8000-00000000f0e1"


@dataclass
class SignalLayer:
    actions: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    dcgm_clusters: list[str] = field(default_factory=list)


def _weighted(rng: random.Random, choices: Sequence[tuple[str, int]]) -> str:
    return rng.choices([c for c, _ in choices], weights=[w for _, w in choices])[0]


def foreign_vm(rng: random.Random, subscription: str) -> str:
    """A VMSS VM id the fleet does not have: another subscription, or a group of ours that is no node RG."""
    if rng.random() < 0.5:
        sub, group = FOREIGN_SUBSCRIPTION, f"MC_rg-elsewhere_aks-{rng.randint(1, 99)}_eastus"
    else:
        sub, group = subscription, f"rg-not-a-node-group-{rng.randint(1, 99)}"
    return (f"/subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachineScaleSets/"
            f"aks-gpu-{rng.randint(10000000, 99999999)}-vmss/virtualMachines/{rng.randint(0, 9)}")


def add_signal_faults(seed: int, *, pools: Sequence[Any], clusters: Sequence[str], subscription: str, grace: float,
                      span: float) -> SignalLayer:
    """The signal faults of ``seed`` on the managed pools of ``pools`` (``soak.generate.PoolPlan``)."""
    rng = random.Random(f"signals:{seed}")
    layer = SignalLayer()
    managed = [p for p in pools if p.managed]

    def when() -> float:
        return round(grace + rng.uniform(0, span), 1)

    if managed and rng.random() < P_RESOURCE_HEALTH:
        for _ in range(rng.randint(1, 2)):
            pool = rng.choice(managed)
            scenario = _weighted(rng, HEALTH_SCENARIOS)
            action: dict[str, Any] = {"at": when(), "kind": "resource-health", "cluster": pool.cluster,
                                      "pool": pool.name, "node_index": rng.randrange(pool.count), "scenario": scenario}
            if scenario == "planned-maintenance":
                action["down_s"] = rng.choice([5, 20, 60])
            layer.actions.append(action)
            layer.kinds.append(f"resource health {scenario}")

    if rng.random() < P_FORGED:
        for _ in range(rng.randint(1, 2)):
            scenario = rng.choice(["host-failure", "degraded-host"])
            layer.actions.append({"at": when(), "kind": "resource-health-forged", "vm": foreign_vm(rng, subscription),
                                  "scenario": scenario})
            layer.kinds.append("forged health event for a VM outside the fleet")

    if managed and rng.random() < P_DCGM:
        layer.dcgm_clusters = sorted(set(clusters))
        for _ in range(rng.randint(1, 2)):
            pool = rng.choice(managed)
            target = {"cluster": pool.cluster, "pool": pool.name, "node_index": rng.randrange(pool.count), "gpu": 0}
            what = rng.choices(["xid79", "xid48", "app-xid", "ecc-storm"], weights=[4, 1, 3, 2])[0]
            if what == "ecc-storm":
                persist = rng.random() < 0.5
                layer.actions.append({"at": when(), "kind": "dcgm-ecc-storm", **target, "persist": persist})
                layer.kinds.append("dcgm ECC storm" + (" (failing memory)" if persist else ""))
            else:
                xid = {"xid79": 79, "xid48": 48}.get(what) or rng.choice(APPLICATION_XIDS)
                layer.actions.append({"at": when(), "kind": "dcgm-xid", **target, "xid": xid})
                layer.kinds.append("dcgm application XID" if what == "app-xid" else f"dcgm XID {xid}")
        if rng.random() < P_OUTAGE:
            down = when()
            layer.actions.append({"at": down, "kind": "dcgm-outage", "down": True})
            layer.actions.append({"at": round(down + rng.uniform(20, 150), 1), "kind": "dcgm-outage", "down": False})
            layer.kinds.append("prometheus outage")
    return layer


def prometheus_setting(endpoints: Mapping[str, Any], clusters: Sequence[str]) -> dict[str, str]:
    """SIGNALS_PROMETHEUS for ``clusters`` (names): the simulator's workspace, whose endpoint has its port."""
    if not clusters:
        return {}
    endpoint = f"{str(endpoints['arm_endpoint']).rstrip('/')}/prometheus/{WORKSPACE}"
    ids = {str(c["name"]): str(c["id"]) for c in endpoints.get("clusters") or []}
    return {"SIGNALS_PROMETHEUS": json.dumps({ids[name]: {"endpoint": endpoint} for name in clusters if name in ids})}

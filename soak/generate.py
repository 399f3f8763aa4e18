"""Seed -> one soak scenario: a small random fleet, its bad day, and how the app is run against it.

Pure and deterministic: everything comes from ``random.Random(seed)``, so a seed printed by a
failing run is all it takes to replay it. A scenario is deliberately small (one or two clusters,
pools of two to six GPU nodes, a few faults) and the simulated timings and app policies are short,
so that a run costs seconds; what makes the soak strong is the number and variety of runs, not
their size.

What is drawn: cluster and pool sizes; workloads (Deployments with PDBs that use GPUs or only CPU,
DaemonSets, emptyDir pods, sometimes a bare pod that a drain must refuse); GPU condition flips
(what repairs them: restart, reimage, replace or nothing) and flapping conditions; sometimes an
unmanaged pool to migrate (surge, rolling or auto, tight quota or not, scarce capacity or not);
fault rules (ARM 429/5xx, failed LROs, QuotaExceeded, AllocationFailed, Kubernetes API errors,
dropped connections standing in for timeouts, slow answers, Event Grid duplicates, delays and
reordering); crashes of the app between two steps; one or two hosts at once.

Three layers add to that, each from an RNG of its own so that every draw here stays as it was:
:mod:`soak.strict` (issue 10's stricter faults), :mod:`soak.signals` (issue 13's fault signals:
Azure Resource Health events, forged ones, DCGM faults and a Prometheus outage) and, where DCGM was
drawn, :mod:`soak.forgeries` (issue 18's forged DCGM series: tenant series, a cluster alias, phantom names);
:mod:`soak.forged_rows` (issue 19's forged ledger rows: remediation rows written straight into the table for
healthy nodes) draws from a fifth.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

#: Simulated time starts here (a Monday, 00:00 UTC). Fixed, so that a replay sees the same
#: timestamps; in the future, so that tokens the simulator issues look valid to azure-identity,
#: which judges expiry on the machine's clock.
CLOCK_START = 1_893_974_400.0
SUBSCRIPTION = "5eed0000-0000-0000-0000-000000000001"
LOCATION = "eastus"
T4_FAMILY = "standardNCASv3_T4Family"
GPU_SIZES = {"Standard_NC4as_T4_v3": 4, "Standard_NC8as_T4_v3": 8}
CONDITIONS = ("UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices")
GPU_TAINT = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}

#: Simulated durations: seconds instead of minutes, so a run is a few hundred simulated seconds.
TIMINGS: dict[str, float] = {
    "pool_create_s": 20, "pool_delete_s": 15, "pool_scale_s": 10, "delete_machines_s": 10,
    "node_ready_s": 5, "restart_s": 8, "reimage_s": 15, "lro_retry_after_s": 2, "pod_start_s": 1,
    "job_run_s": 60,
}

#: App policies scaled to those timings (every one an ordinary app setting).
BASE_PROFILE: dict[str, str] = {
    "REMEDIATION_DEFAULT_THRESHOLD_S": "20",
    "REMEDIATION_STARTUP_GRACE_S": "30",
    "REMEDIATION_SETTLE_S": "12",
    "REMEDIATION_POLL_S": "4",
    "REMEDIATION_RUNG_TIMEOUTS": "restart=80,reimage=120,replace=240",
    "REMEDIATION_DRAIN_TIMEOUT_S": "150",
    "REMEDIATION_EVICTION_RETRY_S": "2",
    "REMEDIATION_NODE_LEASE_S": "60",
    "BUDGET_NODE_COOLDOWN_S": "120",
    "BREAKER_WINDOW_S": "120",
    "MIGRATION_POLL_INTERVAL_S": "4",
    "MIGRATION_VALIDATE_TIMEOUT_S": "200",
    "MIGRATION_CREATE_TIMEOUT_S": "200",
    "MIGRATION_DRAIN_TIMEOUT_S": "240",
    "POOL_REQUEST_POLL_INTERVAL_S": "2",
}


@dataclass(frozen=True)
class PoolPlan:
    cluster: str
    name: str
    vm_size: str
    count: int
    managed: bool
    migrate: bool = False


@dataclass(frozen=True)
class Crash:
    """Host ``host`` dies at its ``write``-th ledger write (``when`` before or after it)."""

    host: int
    write: int
    when: str


@dataclass
class SoakScenario:
    seed: int
    sim: dict[str, Any]
    profile: dict[str, str]
    pools: list[PoolPlan]
    hosts: int
    crashes: list[Crash]
    faults: list[dict[str, Any]]
    flips: list[dict[str, Any]]
    flapping: list[dict[str, Any]]
    quiet_after_s: float
    horizon_s: float
    process_mode: bool = False
    kills: list[float] = field(default_factory=list)  # process mode: sim seconds at which a host is killed
    # The stricter faults (soak.strict, drawn from a second RNG): timed actions the driver performs at
    # their sim second (delete a namespace, remove finalizers, lock a node resource group, flip a
    # condition on a NAP node), what was drawn (for the summary), and the Karpenter NodePools.
    actions: list[dict[str, Any]] = field(default_factory=list)
    strict_faults: list[str] = field(default_factory=list)
    nap_pools: list[tuple[str, str]] = field(default_factory=list)  # (cluster, NodePool)
    # Issue 13's fault signals (soak.signals, a third RNG): what was drawn, and the clusters whose DCGM
    # series the app reads (SIGNALS_PROMETHEUS is built from the simulator's endpoint when the run starts).
    signal_faults: list[str] = field(default_factory=list)
    dcgm_clusters: list[str] = field(default_factory=list)
    # Issue 18's forged DCGM series (soak.forgeries, a fourth RNG): what was drawn, for the summary.
    forgeries: list[str] = field(default_factory=list)
    # Issue 19's forged ledger rows (soak.forged_rows, a fifth RNG): what was drawn, for the summary.
    forged_rows: list[str] = field(default_factory=list)

    def describe(self) -> str:
        clusters = sorted({p.cluster for p in self.pools})
        pools = ", ".join(f"{p.cluster}/{p.name}:{p.count}{'(managed)' if p.managed else '(migrate)' if p.migrate else ''}"
                          for p in self.pools)
        mode = f", host processes with {len(self.kills)} kill(s)" if self.process_mode else ""
        strict = f"; strict: {', '.join(self.strict_faults)}" if self.strict_faults else ""
        signals = f"; signals: {', '.join(self.signal_faults)}" if self.signal_faults else ""
        forged = f"; forgeries: {', '.join(self.forgeries)}" if self.forgeries else ""
        forged += f"; forged rows: {', '.join(self.forged_rows)}" if self.forged_rows else ""
        return (f"seed {self.seed}: {len(clusters)} cluster(s) [{pools}], {len(self.flips)} flip(s), "
                f"{len(self.flapping)} flapping, {len(self.faults)} fault rule(s), {self.hosts} host(s), "
                f"{len(self.crashes)} crash(es){mode}{strict}{signals}{forged}")


def _fault_rules(rng: random.Random, *, clusters: list[str], window: float) -> list[dict[str, Any]]:
    """A handful of fault rules, each active in a random window with a random probability."""
    menu = [
        lambda: {"target": "arm", "status": 429, "retry_after": rng.choice([1, 2, 4])},
        lambda: {"target": "arm", "status": rng.choice([500, 503])},
        lambda: {"target": "arm", "method": "PUT", "path": "agentPools", "status": 400, "code": "QuotaExceeded",
                 "message": "Operation could not be completed as it results in exceeding approved quota.",
                 "count": rng.randint(1, 2)},
        lambda: {"target": "lro", "path": "agentPools", "code": rng.choice(["AllocationFailed",
                                                                            "InternalOperationError"]),
                 "count": rng.randint(1, 2)},
        lambda: {"target": "lro", "path": "virtualMachines", "code": "InternalOperationError", "count": 1},
        lambda: {"target": "kube", "status": rng.choice([429, 500, 503]),
                 **({"retry_after": 1} if rng.random() < 0.5 else {})},
        lambda: {"target": "kube", "drop": True},
        lambda: {"target": "kube", "method": rng.choice(["PATCH", "POST"]), "status": rng.choice([500, 503])},
        lambda: {"target": "kube", "delay_s": 0.05},
        lambda: {"target": "eventgrid", "status": 503},
        lambda: {"target": "eventgrid-delivery", "duplicate": True},
        lambda: {"target": "eventgrid-delivery", "delay_s": rng.choice([10, 30, 60, 300])},
        lambda: {"target": "eventgrid-delivery", "reorder": True},
    ]
    rules = []
    for _ in range(rng.randint(1, 5)):
        rule = rng.choice(menu)()
        if "count" not in rule:  # counted rules (quota, allocation, failed LROs) wait for the app's writes
            start = rng.uniform(0, window * 0.6)
            rule["after_s"] = round(start, 1)
            rule["until_s"] = round(start + rng.uniform(30, window * 0.5), 1)
        if rule["target"] in ("arm", "kube", "eventgrid") and "count" not in rule:
            rule["probability"] = round(rng.choice([0.05, 0.1, 0.2, 0.3]), 2)
        if rule["target"] == "eventgrid-delivery":
            rule["probability"] = round(rng.choice([0.3, 0.6, 1.0]), 2)
        if rule["target"] in ("kube", "arm", "lro") and rng.random() < 0.3:
            rule["cluster"] = rng.choice(clusters)
        rules.append(rule)
    return rules


def _workloads(rng: random.Random, pool: PoolPlan) -> list[dict[str, Any]]:
    # A pool to migrate is selected by a label of its own (copied to the replacement), as a team
    # that plans a migration would; a selector on the pool's name would (rightly) block it.
    sel = {"kubernetes.azure.com/agentpool": pool.name} if not pool.migrate else {"soak/role": "legacy-gpu"}
    tol = [GPU_TAINT] if pool.managed else [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    out: list[dict[str, Any]] = []
    gpu_replicas = rng.randint(0, max(0, pool.count - 1))
    if gpu_replicas:
        pdb = rng.choice([{"maxUnavailable": 1}, {"minAvailable": max(1, gpu_replicas - 1)}])
        out.append({"kind": "Deployment", "name": f"{pool.name}-train", "namespace": "ml", "replicas": gpu_replicas,
                    "resources": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}, "tolerations": tol,
                    "nodeSelector": sel, "pdb": pdb, "terminationGracePeriodSeconds": rng.choice([2, 5, 10])})
    cpu_replicas = rng.randint(0, pool.count * 2)
    if cpu_replicas:
        out.append({"kind": "Deployment", "name": f"{pool.name}-api", "namespace": "web", "replicas": cpu_replicas,
                    "resources": {"cpu": "250m", "memory": "256Mi"}, "tolerations": tol, "nodeSelector": sel,
                    "pdb": rng.choice([{"maxUnavailable": 1}, {"minAvailable": "50%"}, {"maxUnavailable": "25%"}]),
                    "terminationGracePeriodSeconds": rng.choice([1, 3, 8])})
    if rng.random() < 0.3:
        out.append({"kind": "Deployment", "name": f"{pool.name}-scratch", "namespace": "web", "replicas": 1,
                    "emptyDir": True, "resources": {"cpu": "100m"}, "tolerations": tol, "nodeSelector": sel,
                    "terminationGracePeriodSeconds": 2})
    if rng.random() < 0.15:
        out.append({"kind": "Pod", "name": f"{pool.name}-notebook", "namespace": "lab",
                    "resources": {"cpu": "100m"}, "tolerations": tol, "nodeSelector": sel})
    return out


def generate(seed: int, *, short: bool = False, process_mode: bool = False, strict: bool = True,
             signals: bool | None = None, forgeries: bool | None = None,
             forged_rows: bool | None = None) -> SoakScenario:
    """The scenario of ``seed``. ``short`` keeps it small enough for the test suite's soak.

    ``strict`` adds the stricter faults of :mod:`soak.strict` (terminating namespaces, pods held by
    finalizers, unready pods under a PDB, a locked node resource group, a NAP cluster), drawn from a
    second RNG so that everything drawn here is the same with or without them; ``strict=False`` is
    the scenario as it was before them (the pinned regression seeds run that way).
    ``signals`` (by default: as ``strict``) adds issue 13's fault signals of :mod:`soak.signals`, drawn
    from a third RNG: Resource Health events (real and forged), DCGM faults and a Prometheus outage.
    ``forgeries`` (by default: as ``signals``) adds issue 18's forged DCGM series of :mod:`soak.forgeries`
    where DCGM was drawn, from a fourth RNG.
    ``forged_rows`` (by default: as ``strict``) adds issue 19's forged ledger rows of :mod:`soak.forged_rows`,
    from a fifth RNG.
    """
    rng = random.Random(seed)
    n_clusters = 1 if short or rng.random() < 0.6 else 2
    clusters = [f"soak{i + 1}" for i in range(n_clusters)]
    pools: list[PoolPlan] = []
    for cname in clusters:
        for j in range(1 if short else rng.randint(1, 2)):
            size = rng.choice(list(GPU_SIZES))
            pools.append(PoolPlan(cluster=cname, name=f"gpu{j + 1}", vm_size=size,
                                  count=rng.randint(2, 4 if short else 6), managed=True))
    migrating = rng.random() < (0.35 if short else 0.45)
    if migrating:
        pools.append(PoolPlan(cluster=rng.choice(clusters), name="old", vm_size="Standard_NC4as_T4_v3",
                              count=rng.randint(2, 3 if short else 4), managed=False, migrate=True))

    profile = dict(BASE_PROFILE)
    profile["REMEDIATION_LADDER"] = rng.choice(["restart,reimage,replace", "restart,reimage,replace", "replace",
                                                "restart,replace", "reimage"])
    profile["REMEDIATION_SURGE"] = rng.choice(["true", "true", "false"])
    profile["REMEDIATION_DRAIN_FALLBACK"] = rng.choice(["hold", "hold", "release"])
    profile["REMEDIATION_UNMANAGED_PODS"] = rng.choice(["refuse", "evict"])
    profile["BUDGET_POOL_MAX_UNAVAILABLE"] = str(rng.choice([1, 1, 2]))
    profile["BUDGET_POOL_MAX_UNAVAILABLE_PERCENT"] = str(rng.choice([20, 50, 100]))
    profile["BUDGET_MAX_IN_FLIGHT"] = str(rng.choice([1, 2, 5]))
    profile["BREAKER_MIN_NODES"] = str(rng.choice([3, 5]))
    profile["BREAKER_PERCENT"] = str(rng.choice([30, 60]))
    profile["MIGRATION_ENABLED"] = "true" if migrating else "false"
    profile["MIGRATION_STRATEGY"] = rng.choice(["auto", "surge", "rolling"])
    profile["MIGRATION_BATCH_SIZE"] = str(rng.choice([1, 1, 2]))
    profile["MIGRATION_MAX_CONCURRENT"] = str(rng.choice([1, 2]))
    if rng.random() < 0.5:
        profile["MIGRATION_GPU_VCPU_HEADROOM"] = f"{LOCATION}:{T4_FAMILY}={rng.choice([8, 32, 256])}"

    # Quota: plenty, or just enough for what exists plus a little (surges and migrations hit it).
    vcpus = sum(GPU_SIZES[p.vm_size] * p.count for p in pools)
    quota = vcpus + rng.choice([4, 8, 16, 1000])
    capacity = []
    if rng.random() < 0.2:
        capacity.append({"location": LOCATION, "vmSize": "Standard_NC4as_T4_v3", "available": rng.randint(0, 2)})

    timings = dict(TIMINGS)
    sim_clusters = []
    for cname in clusters:
        sim_pools: list[dict[str, Any]] = [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5",
                                            "count": rng.randint(1, 2)}]
        workloads: list[dict[str, Any]] = [{"kind": "DaemonSet", "name": "log-agent", "namespace": "kube-system",
                                            "resources": {"cpu": "10m"}, "tolerations": [{"operator": "Exists"}]}]
        for p in (p for p in pools if p.cluster == cname):
            spec: dict[str, Any] = {"name": p.name, "mode": "User", "vmSize": p.vm_size, "count": p.count}
            if p.managed:
                spec["gpuProfile"] = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
                spec["nodeTaints"] = ["sku=gpu:NoSchedule"]
            else:
                spec["nodeTaints"] = ["nvidia.com/gpu=present:NoSchedule"]
                spec["nodeLabels"] = {"soak/role": "legacy-gpu"}
                spec["npd"] = rng.random() < 0.5
            sim_pools.append(spec)
            workloads += _workloads(rng, p)
        sim_clusters.append({"name": cname, "resource_group": f"rg-{cname}", "location": LOCATION,
                             "tags": {"gpu-fleet-steward": "enabled"}, "pools": sim_pools, "workloads": workloads})

    grace = float(profile["REMEDIATION_STARTUP_GRACE_S"])
    span = 180.0 if short else 420.0
    flips: list[dict[str, Any]] = []
    flapping: list[dict[str, Any]] = []
    managed = [p for p in pools if p.managed]
    n_flips = rng.choice([0, 1, 1, 2, 2, 3]) if short else rng.choice([0, 1, 2, 2, 3, 4, 6])
    used: set[tuple[str, str, int]] = set()
    # GPU faults strike managed pools, and sometimes a pool being migrated (unmanaged pools with NPD):
    # remediation and migration then work on the same nodes.
    targets = managed + [p for p in pools if p.migrate and rng.random() < 0.5]
    for _ in range(n_flips):
        p = rng.choice(targets)
        idx = rng.randrange(p.count)
        used.add((p.cluster, p.name, idx))
        at = round(grace + rng.uniform(0, span), 1)
        cond = rng.choice(CONDITIONS)
        flips.append({"at": at, "cluster": p.cluster, "pool": p.name, "node_index": idx, "type": cond,
                      "status": "True", "fixed_by": rng.choice(["restart", "restart", "reimage", "replace", "never"])})
        if rng.random() < 0.2:  # the fault clears by itself, before, during or after its remediation
            flips.append({"at": round(at + rng.uniform(5, 150), 1), "cluster": p.cluster, "pool": p.name,
                          "node_index": idx, "type": cond, "status": "False", "fixed_by": "restart"})
    if rng.random() < 0.3:  # a burst: several nodes of one pool fail at the same moment (budgets, breaker)
        p = rng.choice(managed)
        at = round(grace + rng.uniform(0, span / 2), 1)
        for idx in rng.sample(range(p.count), k=rng.randint(2, p.count)):
            used.add((p.cluster, p.name, idx))
            flips.append({"at": at, "cluster": p.cluster, "pool": p.name, "node_index": idx,
                          "type": rng.choice(CONDITIONS), "status": "True",
                          "fixed_by": rng.choice(["restart", "reimage", "replace"])})
    if rng.random() < 0.3:
        p = rng.choice(managed)
        idx = rng.randrange(p.count)
        if (p.cluster, p.name, idx) not in used:
            threshold = float(profile["REMEDIATION_DEFAULT_THRESHOLD_S"])
            flapping.append({"start": round(grace + rng.uniform(0, span / 2), 1), "cluster": p.cluster, "pool": p.name,
                             "node_index": idx, "type": rng.choice(CONDITIONS),
                             "period_s": round(threshold * rng.uniform(0.2, 0.6), 1), "flips": rng.choice([4, 6, 8])})
    if rng.random() < 0.15 and managed:  # a condition the policy does not act on: must cause nothing
        p = rng.choice(managed)
        flips.append({"at": round(grace + rng.uniform(0, span), 1), "cluster": p.cluster, "pool": p.name,
                      "node_index": rng.randrange(p.count), "type": "XIDErrors", "status": "True",
                      "fixed_by": "restart"})

    faults = _fault_rules(rng, clusters=clusters, window=span + 200)
    hosts = 2 if rng.random() < 0.35 else 1
    crashes = []
    for _ in range(rng.choice([0, 1, 1, 2, 3, 4])):
        crashes.append(Crash(host=rng.randrange(hosts), write=rng.randint(1, 60), when=rng.choice(["before", "after"])))

    strict_layer = None
    if strict:
        from soak.strict import add_strict_faults

        strict_layer = add_strict_faults(seed, short=short, pools=pools, profile=profile, sim_clusters=sim_clusters,
                                         timings=timings, flips=flips, grace=grace, span=span)
    actions = list(strict_layer.actions) if strict_layer else []
    signal_layer = None
    if strict if signals is None else signals:
        from soak.signals import add_signal_faults

        signal_layer = add_signal_faults(seed, pools=pools, clusters=clusters, subscription=SUBSCRIPTION, grace=grace,
                                         span=span)
        actions = sorted(actions + signal_layer.actions, key=lambda a: (a["at"], a["kind"]))
    forgery_layer = None
    if signal_layer is not None and signal_layer.dcgm_clusters and (
            (strict if signals is None else signals) if forgeries is None else forgeries):
        from soak.forgeries import add_dcgm_forgeries

        forgery_layer = add_dcgm_forgeries(seed, pools=pools, dcgm_clusters=signal_layer.dcgm_clusters, grace=grace,
                                           span=span)
        actions = sorted(actions + forgery_layer.actions, key=lambda a: (a["at"], a["kind"]))
    rows_layer = None
    if strict if forged_rows is None else forged_rows:
        from soak.forged_rows import add_forged_rows

        rows_layer = add_forged_rows(seed, pools=pools, flips=flips, flapping=flapping, grace=grace, span=span)
        actions = sorted(actions + rows_layer.actions, key=lambda a: (a["at"], a["kind"]))
    last = max([f["at"] for f in flips] + [f["start"] + f["period_s"] * f["flips"] for f in flapping] + [grace]
               + [a["at"] for a in actions])
    quiet_after = last + float(profile["REMEDIATION_DEFAULT_THRESHOLD_S"]) + 60
    if signal_layer is not None:  # a genuine DCGM fault is acted on only once its window re-check confirms it
        from soak.signals import DCGM_CONFIRM_S, GENUINE_DCGM

        dcgm = [a["at"] for a in actions if a["kind"] in GENUINE_DCGM]
        dcgm_last = max(dcgm, default=0.0)
        # The workspace down hides a fault drawn before it came back: its first sighting is after the outage.
        first = min(dcgm, default=float("inf"))
        back = max([a["at"] for a in actions if a["kind"] == "dcgm-outage" and not a.get("down") and a["at"] > first],
                   default=0.0)
        quiet_after = max(quiet_after, max(dcgm_last, back) + DCGM_CONFIRM_S
                          + float(profile["REMEDIATION_DEFAULT_THRESHOLD_S"]) + 60)
    sim = {
        "seed": seed,
        "clock": {"manual": not process_mode, "start": CLOCK_START, **({"speed": 10.0} if process_mode else {})},
        "timings": timings,
        "capacity": capacity,
        "subscriptions": [{"id": SUBSCRIPTION, "quotas": [{"location": LOCATION, "family": T4_FAMILY, "limit": quota},
                                                          {"location": LOCATION, "family": "standardDSv5Family",
                                                           "limit": 1000}],
                           "clusters": sim_clusters}],
        "conditions": flips,
        "flapping": flapping,
        "faults": faults,
    }
    kills = []
    if process_mode:
        kills = sorted(round(rng.uniform(20, quiet_after), 1) for _ in range(rng.randint(1, 3)))
    return SoakScenario(seed=seed, sim=sim, profile=profile, pools=pools, hosts=hosts, crashes=crashes, faults=faults,
                        flips=flips, flapping=flapping, quiet_after_s=quiet_after, horizon_s=quiet_after + 1500,
                        process_mode=process_mode, kills=kills, actions=actions,
                        strict_faults=strict_layer.kinds if strict_layer else [],
                        nap_pools=strict_layer.nap_pools if strict_layer else [],
                        signal_faults=signal_layer.kinds if signal_layer else [],
                        dcgm_clusters=signal_layer.dcgm_clusters if signal_layer else [],
                        forgeries=forgery_layer.kinds if forgery_layer else [],
                        forged_rows=rows_layer.kinds if rows_layer else [])

"""Scenario files: a declarative fleet (YAML or JSON), loaded into a :class:`sim.model.Fleet`.

A scenario is what a test, the demo or a user's drill needs to say about the world: subscriptions
with quotas, clusters with pools (ARM camelCase properties) and workloads (short forms for
Deployments with PDBs, DaemonSets, StatefulSets, Jobs, bare and emptyDir pods, or raw manifests),
Karpenter objects for node auto-provisioning clusters, regional capacity, faults, and node
condition flips over time. The schema is documented in ``sim/scenarios/README.md``; errors name the
offending path. Same scenario + seed = same fleet, because every random choice goes through
``fleet.rng`` and every collection is walked in a fixed order.
"""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path
from typing import Any

import yaml

from sim.arm.common import recorded_pool_defaults
from sim.core import gpu_catalog
from sim.model import (
    DEFAULT_TIMINGS,
    FINALIZER_RELEASE_ANNOTATION,
    NPD_GPU_CONDITIONS,
    OPTIONAL_TIMINGS,
    REPAIR_RUNGS,
    Cluster,
    Fleet,
    Pool,
    SimClock,
    parse_iso,
)

SCENARIO_DIR = Path(__file__).parent / "scenarios"
DEFAULT_SCENARIO = SCENARIO_DIR / "default.yaml"
DEFAULT_EPOCH = 1_764_684_000.0  # 2025-12-02T14:00:00Z, used when the clock is manual and no start is given
BOOTSTRAP_HORIZON_S = 3600.0


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message names the path of the bad field."""


_TOP_KEYS = {"seed", "clock", "timings", "subscriptions", "capacity", "faults", "conditions", "flapping",
             "description", "name", "arm_linked_resource_groups"}
_SUB_KEYS = {"id", "quotas", "clusters", "name", "features"}  # features: read by sim.arm (Microsoft.Features)
_CLUSTER_KEYS = {"name", "resource_group", "location", "tags", "node_provisioning_mode", "kubernetes_version",
                 "maintenance_configurations", "namespaces", "pools", "karpenter", "workloads",
                 "node_resource_group_lockdown", "pool_etags"}
_WORKLOAD_KEYS = {"kind", "name", "namespace", "replicas", "resources", "tolerations", "nodeSelector", "affinity",
                  "pdb", "terminationGracePeriodSeconds", "emptyDir", "labels", "annotations", "image", "container",
                  "run_s", "completions", "parallelism", "backoffLimit", "priorityClassName", "pod_finalizers",
                  "pod_finalizers_release_s", "ready"}
_PDB_POLICIES = ("IfHealthyBudget", "AlwaysAllow")


def _known(d: Any, keys: set[str], where: str) -> None:
    """Typos must not pass silently: a drill with a misspelt field would test nothing."""
    if not isinstance(d, dict):
        raise ScenarioError(f"{where} must be a mapping")
    unknown = sorted(set(d) - keys)
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {unknown}; known: {sorted(keys)}")


def load(source: str | Path | dict[str, Any] | None) -> dict[str, Any]:
    """A scenario as a dict: from a dict, a path (YAML or JSON), a name in sim/scenarios/, or the default."""
    if source is None:
        source = DEFAULT_SCENARIO
    if isinstance(source, dict):
        return copy.deepcopy(source)
    path = Path(source)
    if not path.exists() and (SCENARIO_DIR / f"{source}.yaml").exists():
        path = SCENARIO_DIR / f"{source}.yaml"
    if not path.exists():
        raise ScenarioError(f"scenario file {source} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ScenarioError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: the top level must be a mapping")
    return data


def _req(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] in (None, ""):
        raise ScenarioError(f"{where}.{key} is required")
    return d[key]


def _start(clock: dict[str, Any]) -> float | None:
    start = clock.get("start")
    if start is None:
        return DEFAULT_EPOCH if clock.get("manual") else None
    if isinstance(start, int | float):
        return float(start)
    try:
        return parse_iso(str(start).replace("+00:00", "Z"))
    except ValueError:
        raise ScenarioError(f"clock.start must be epoch seconds or YYYY-MM-DDTHH:MM:SSZ, not {start!r}") from None


def build_fleet(source: str | Path | dict[str, Any] | None = None, *, seed: int | None = None,
                speed: float | None = None) -> Fleet:
    """Load a scenario and build the fleet it describes, already settled at its start time."""
    sc = load(source)
    clock_cfg = sc.get("clock") or {}
    if not isinstance(clock_cfg, dict):
        raise ScenarioError("clock must be a mapping")
    timings = sc.get("timings") or {}
    unknown = sorted(set(timings) - set(DEFAULT_TIMINGS) - OPTIONAL_TIMINGS)
    if unknown:
        raise ScenarioError(f"timings: unknown keys {unknown}; known: {sorted({*DEFAULT_TIMINGS, *OPTIONAL_TIMINGS})}")
    clock = SimClock(speed=float(speed if speed is not None else clock_cfg.get("speed", 1.0)),
                     epoch_sim=_start(clock_cfg), manual=bool(clock_cfg.get("manual", False)))
    _known(sc, _TOP_KEYS, "scenario")
    fleet_seed = int(seed if seed is not None else sc.get("seed", 0))
    try:
        fleet = Fleet(seed=fleet_seed, clock=clock, timings=timings, faults=list(sc.get("faults") or []))
    except ValueError as e:  # a bad fault rule (sim.core.faults.FaultRuleError)
        raise ScenarioError(f"faults: {e}") from None
    fleet.scenario = sc
    linked_groups = sc.get("arm_linked_resource_groups") or []
    if not isinstance(linked_groups, list) or not all(isinstance(g, str) for g in linked_groups):
        raise ScenarioError("arm_linked_resource_groups must be a list of resource group ids")
    fleet.arm_linked_resource_groups = set(linked_groups)  # sim/arm/rbac.py linked_scopes
    t0 = clock.now()
    # Building 100k nodes makes millions of small dicts; the cyclic GC would rescan them again and
    # again. Pause it while building (``python -m sim serve`` then freezes what was built).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    with fleet.lock:
        fleet._now_override = t0
        try:
            for i, sub in enumerate(sc.get("subscriptions") or []):
                _load_subscription(fleet, sub, f"subscriptions[{i}]")
            for i, cap in enumerate(sc.get("capacity") or []):
                where = f"capacity[{i}]"
                fleet.capacity[(str(_req(cap, "location", where)).lower(), str(_req(cap, "vmSize", where)))] = int(
                    _req(cap, "available", where))
            _bootstrap(fleet, t0)
            fleet.oracles.start_of_run()
        finally:
            fleet._now_override = None
            if gc_was_enabled:
                gc.enable()
        for i, flip in enumerate(sc.get("conditions") or []):
            _schedule_flip(fleet, flip, f"conditions[{i}]", t0)
        for i, flap in enumerate(sc.get("flapping") or []):
            _schedule_flapping(fleet, flap, f"flapping[{i}]", t0)
    return fleet


def _bootstrap(fleet: Fleet, t0: float) -> None:
    """Run the start-up callbacks (nodes joining, pods starting) as if they had happened at t0."""
    horizon = t0 + max(fleet.timings["node_ready_s"], fleet.timings["pod_start_s"], fleet.timings["nap_provision_s"])
    fleet.settle()
    for _ in range(100):
        due = [t for t in fleet._timers if t[0] <= horizon]
        if not due:
            break
        import heapq

        keep = [t for t in fleet._timers if t[0] > horizon]
        heapq.heapify(keep)
        fleet._timers = keep
        for _when, _seq, fn in sorted(due, key=lambda t: (t[0], t[1])):
            fleet._now_override = t0
            fn()
        fleet.settle()  # once per round: every node of the round is Ready before pods are placed
        # callbacks scheduled during bootstrap were stamped relative to t0 and may be due too


def _load_subscription(fleet: Fleet, sub: dict[str, Any], where: str) -> None:
    _known(sub, _SUB_KEYS, where)
    sid = str(_req(sub, "id", where))
    for i, q in enumerate(sub.get("quotas") or []):
        w = f"{where}.quotas[{i}]"
        fleet.quotas[(sid, str(_req(q, "location", w)).lower(), str(_req(q, "family", w)))] = int(_req(q, "limit", w))
    for i, c in enumerate(sub.get("clusters") or []):
        _load_cluster(fleet, sid, c, f"{where}.clusters[{i}]")


def _load_cluster(fleet: Fleet, sub: str, spec: dict[str, Any], where: str) -> Cluster:
    _known(spec, _CLUSTER_KEYS, where)
    mode = str(spec.get("node_provisioning_mode", "Manual"))
    if mode not in ("Manual", "Auto"):
        raise ScenarioError(f"{where}.node_provisioning_mode must be Manual or Auto, not {mode!r}")
    cluster = fleet.add_cluster(subscription=sub, resource_group=str(_req(spec, "resource_group", where)),
                                name=str(_req(spec, "name", where)), location=str(spec.get("location", "eastus")),
                                tags={str(k): str(v) for k, v in (spec.get("tags") or {}).items()},
                                node_provisioning_mode=mode,
                                kubernetes_version=str(spec.get("kubernetes_version", "1.32.4")))
    lockdown = str(spec.get("node_resource_group_lockdown", "Unrestricted"))
    if lockdown not in ("ReadOnly", "Unrestricted"):  # ManagedClusterNodeResourceGroupRestrictionLevel
        raise ScenarioError(f"{where}.node_resource_group_lockdown must be ReadOnly or Unrestricted, not {lockdown!r}")
    cluster.node_rg_locked = lockdown == "ReadOnly"
    # pool_etags (default true): whether the cluster's agent pools carry properties.eTag. AKS rolled pool eTags
    # out in 2025 (learn.microsoft.com/azure/aks/use-etags); recordings up to 2025-05 carry none
    # (tests/replay/recordings/test_aks_create_gpu_driver_flow.json). false: no eTag in any pool body, and an
    # If-Match naming a tag is refused with 412 (sim/arm/validation.py _check_preconditions).
    etags = spec.get("pool_etags", True)
    if not isinstance(etags, bool):
        raise ScenarioError(f"{where}.pool_etags must be true or false, not {etags!r}")
    cluster.pool_etags = etags
    for name, props in sorted((spec.get("maintenance_configurations") or {}).items()):
        cluster.maintenance_configurations[str(name)] = dict(props or {})
    for i, ns in enumerate(spec.get("namespaces") or []):
        cluster.ensure_namespace(str(ns)) if isinstance(ns, str) else _bad(f"{where}.namespaces[{i}]", "a name")
    for i, p in enumerate(spec.get("pools") or []):
        add_pool(cluster, p, f"{where}.pools[{i}]")
    karp = spec.get("karpenter") or {}
    if karp and not cluster.nap:
        raise ScenarioError(f"{where}.karpenter needs node_provisioning_mode: Auto")
    for i, nc in enumerate(karp.get("nodeclasses") or []):
        cluster.put("aksnodeclasses.karpenter.azure.com", _nodeclass(nc, f"{where}.karpenter.nodeclasses[{i}]"))
    for i, np_ in enumerate(karp.get("nodepools") or []):
        cluster.put("nodepools.karpenter.sh", _nodepool(np_, f"{where}.karpenter.nodepools[{i}]"))
    for i, w in enumerate(spec.get("workloads") or []):
        add_workload(cluster, w, f"{where}.workloads[{i}]")
    return cluster


def _bad(where: str, what: str) -> None:
    raise ScenarioError(f"{where} must be {what}")


_POOL_SIM_KEYS = {"name", "npd", "device_plugin"}


def pool_properties(spec: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    """ARM properties of a pool as ARM returns them, from the scenario's camelCase subset.

    A property the newest api-version's AgentPool definition does not have (shared.kernel.definitions) is a
    mistake in the scenario: ARM could never show it."""
    from shared.kernel import definitions

    props = {k: copy.deepcopy(v) for k, v in spec.items() if k not in _POOL_SIM_KEYS}
    unknown = definitions.definitions(definitions.PREVIEW_API_VERSION).unknown(props)
    if unknown:
        raise ScenarioError(f"pool {spec.get('name')!r}: {', '.join(unknown)} is not an AgentPool property "
                            f"(api-version {definitions.PREVIEW_API_VERSION})")
    props.setdefault("count", 1)
    props.setdefault("vmSize", "Standard_D4s_v5")
    props.setdefault("osType", "Linux")
    props.setdefault("osSKU", "Ubuntu" if props["osType"] == "Linux" else "Windows2022")
    props.setdefault("mode", "User")
    props.setdefault("type", "VirtualMachineScaleSets")
    # the same defaults as an ARM create (sim/arm/validation.py _defaults), so a PUT that leaves them out is no change
    size = gpu_catalog.lookup(str(props["vmSize"]))
    props.setdefault("maxPods", size.max_pods if size is not None else 250)
    gpu_catalog.os_disk_defaults(size, props)
    props.setdefault("kubeletDiskType", "OS")
    props.setdefault("enableAutoScaling", False)
    props.setdefault("enableNodePublicIP", False)
    props.setdefault("scaleSetPriority", "Regular")
    recorded_pool_defaults(props)
    props.setdefault("orchestratorVersion", cluster.kubernetes_version)
    props.setdefault("currentOrchestratorVersion", cluster.kubernetes_version)
    props.setdefault("nodeImageVersion", "AKSUbuntu-2204gen2containerd-202611.05.0")
    props.setdefault("upgradeSettings", {"maxSurge": "10%"})
    props["provisioningState"] = "Succeeded"
    props["powerState"] = {"code": "Running"}
    return props


def add_pool(cluster: Cluster, spec: dict[str, Any], where: str = "pool") -> Pool:
    name = str(_req(spec, "name", where))
    if name in cluster.pools:
        raise ScenarioError(f"{where}.name {name!r} is used twice in cluster {cluster.name}")
    props = pool_properties(spec, cluster)
    if not isinstance(props["count"], int) or props["count"] < 0:
        raise ScenarioError(f"{where}.count must be a non-negative integer")
    pool = Pool(name=name, properties=props, npd=bool(spec.get("npd", False)),
                device_plugin=spec.get("device_plugin"))
    cluster.pools[name] = pool
    cluster.materialise_pool(pool)
    return pool


# --------------------------------------------------------------------------- workloads

_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "Pod"}


def add_workload(cluster: Cluster, spec: dict[str, Any], where: str = "workload") -> list[str]:
    """Create a workload (short form or raw ``manifest``) in the cluster; returns what was created."""
    if not isinstance(spec, dict):
        raise ScenarioError(f"{where} must be a mapping")
    if "manifest" in spec:
        return [_create_manifest(cluster, m, f"{where}.manifest") for m in _as_list(spec["manifest"])]
    kind = str(_req(spec, "kind", where))
    _known(spec, _WORKLOAD_KEYS, where)
    if kind not in _KINDS:
        raise ScenarioError(f"{where}.kind must be one of {sorted(_KINDS)}, not {kind!r}")
    name = str(_req(spec, "name", where))
    ns = str(spec.get("namespace", "default"))
    cluster.ensure_namespace(ns)
    labels = {"app": name, **{str(k): str(v) for k, v in (spec.get("labels") or {}).items()}}
    pod_spec = _pod_spec(spec, where)
    pod_meta = _pod_meta(spec, where)
    template = {"metadata": {"labels": dict(labels), **pod_meta}, "spec": pod_spec}
    created = []
    if kind == "Pod":
        cluster.create_pod({"metadata": {"name": name, "namespace": ns, "labels": labels,
                                         **copy.deepcopy(pod_meta)}, "spec": pod_spec},
                           run_s=spec.get("run_s"))
        created.append(f"pods/{ns}/{name}")
    else:
        body: dict[str, Any] = {"metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
                                "spec": {"selector": {"matchLabels": {"app": name}}, "template": template}}
        if kind in ("Deployment", "StatefulSet"):
            body["spec"]["replicas"] = int(spec.get("replicas", 1))
        if kind == "StatefulSet":
            body["spec"]["serviceName"] = name
        if kind == "Job":
            body["spec"]["completions"] = int(spec.get("completions", 1))
            body["spec"]["parallelism"] = int(spec.get("parallelism", 1))
            body["spec"]["backoffLimit"] = int(spec.get("backoffLimit", 6))
            template["spec"]["restartPolicy"] = "Never"
            if spec.get("run_s") is not None:
                cluster.job_run_s[(ns, name)] = float(spec["run_s"])
        resource = {"Deployment": "deployments.apps", "DaemonSet": "daemonsets.apps",
                    "StatefulSet": "statefulsets.apps", "Job": "jobs.batch"}[kind]
        if cluster.get(resource, ns, name) is not None:
            raise ScenarioError(f"{where}: {kind} {ns}/{name} already exists in {cluster.name}")
        cluster.put(resource, body)
        created.append(f"{resource}/{ns}/{name}")
    pdb = spec.get("pdb")
    if pdb:
        if not isinstance(pdb, dict) or not ({"minAvailable", "maxUnavailable"} & set(pdb)):
            raise ScenarioError(f"{where}.pdb needs minAvailable or maxUnavailable")
        pdb_spec = {k: pdb[k] for k in ("minAvailable", "maxUnavailable") if k in pdb}
        if "unhealthyPodEvictionPolicy" in pdb:
            if pdb["unhealthyPodEvictionPolicy"] not in _PDB_POLICIES:
                raise ScenarioError(f"{where}.pdb.unhealthyPodEvictionPolicy must be one of {list(_PDB_POLICIES)}")
            pdb_spec["unhealthyPodEvictionPolicy"] = pdb["unhealthyPodEvictionPolicy"]
        pdb_spec["selector"] = {"matchLabels": {"app": name}}
        cluster.put("poddisruptionbudgets.policy", {"metadata": {"name": str(pdb.get("name", name)), "namespace": ns},
                                                    "spec": pdb_spec})
        created.append(f"poddisruptionbudgets.policy/{ns}/{pdb.get('name', name)}")
    cluster.dirty = True
    return created


def _pod_meta(spec: dict[str, Any], where: str) -> dict[str, Any]:
    """Annotations and finalizers of the workload's pods (template metadata, copied into each pod)."""
    annotations = {str(k): str(v) for k, v in (spec.get("annotations") or {}).items()}
    meta: dict[str, Any] = {"annotations": annotations}
    finalizers = spec.get("pod_finalizers")
    if finalizers is not None:
        if not isinstance(finalizers, list) or not all(isinstance(f, str) and "/" in f for f in finalizers):
            raise ScenarioError(f"{where}.pod_finalizers must be a list of qualified names (example.com/hold)")
        if finalizers:
            meta["finalizers"] = list(finalizers)
    release = spec.get("pod_finalizers_release_s")
    if release is not None:
        if not finalizers or not isinstance(release, int | float) or release <= 0:
            raise ScenarioError(f"{where}.pod_finalizers_release_s must be a positive number, with pod_finalizers")
        annotations[FINALIZER_RELEASE_ANNOTATION] = str(float(release))
    return meta


def _pod_spec(spec: dict[str, Any], where: str) -> dict[str, Any]:
    resources = {str(k): str(v) for k, v in (spec.get("resources") or {}).items()}
    container: dict[str, Any] = {"name": str(spec.get("container", "main")),
                                 "image": str(spec.get("image", "mcr.microsoft.com/azurelinux/base/core:3.0"))}
    if resources:
        limits = {k: v for k, v in resources.items() if k.startswith("nvidia.com/")}
        container["resources"] = {"requests": dict(resources), **({"limits": limits} if limits else {})}
    pod: dict[str, Any] = {"containers": [container],
                           "terminationGracePeriodSeconds": int(spec.get("terminationGracePeriodSeconds", 30))}
    if spec.get("tolerations"):
        pod["tolerations"] = copy.deepcopy(spec["tolerations"])
    if spec.get("nodeSelector"):
        pod["nodeSelector"] = {str(k): str(v) for k, v in spec["nodeSelector"].items()}
    if spec.get("affinity"):
        pod["affinity"] = copy.deepcopy(spec["affinity"])
    if spec.get("emptyDir"):
        pod["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        container["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    if spec.get("priorityClassName"):
        pod["priorityClassName"] = str(spec["priorityClassName"])
    ready = spec.get("ready", True)
    if not isinstance(ready, bool):
        raise ScenarioError(f"{where}.ready must be true or false")
    if not ready:  # runs, but its readiness probe never passes (sim.model.never_ready)
        container["readinessProbe"] = {"exec": {"command": ["/bin/false"]}, "periodSeconds": 10}
    return pod


def _as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


_MANIFEST_RESOURCES = {
    ("apps/v1", "Deployment"): "deployments.apps", ("apps/v1", "DaemonSet"): "daemonsets.apps",
    ("apps/v1", "StatefulSet"): "statefulsets.apps", ("apps/v1", "ReplicaSet"): "replicasets.apps",
    ("batch/v1", "Job"): "jobs.batch", ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets.policy",
    ("v1", "ConfigMap"): "configmaps", ("v1", "Namespace"): "namespaces",
    ("karpenter.sh/v1", "NodePool"): "nodepools.karpenter.sh",
    ("karpenter.azure.com/v1beta1", "AKSNodeClass"): "aksnodeclasses.karpenter.azure.com",
}


def _create_manifest(cluster: Cluster, m: dict[str, Any], where: str) -> str:
    if not isinstance(m, dict):
        raise ScenarioError(f"{where} must be a Kubernetes object")
    av, kind = m.get("apiVersion"), m.get("kind")
    name = (m.get("metadata") or {}).get("name")
    if not name:
        raise ScenarioError(f"{where}.metadata.name is required")
    obj = copy.deepcopy(m)
    if (av, kind) == ("v1", "Pod"):
        obj["metadata"].setdefault("namespace", "default")
        cluster.ensure_namespace(obj["metadata"]["namespace"])
        cluster.create_pod(obj)
        return f"pods/{obj['metadata']['namespace']}/{name}"
    resource = _MANIFEST_RESOURCES.get((av, kind))
    if resource is None or resource not in cluster.resources():
        raise ScenarioError(f"{where}: {av} {kind} is not supported here")
    if cluster.resources()[resource][3]:
        obj["metadata"].setdefault("namespace", "default")
        cluster.ensure_namespace(obj["metadata"]["namespace"])
    cluster.put(resource, obj)
    return f"{resource}/{obj['metadata'].get('namespace', '')}/{name}"


def _nodeclass(spec: dict[str, Any], where: str) -> dict[str, Any]:
    if "apiVersion" in spec:
        return copy.deepcopy(spec)
    name = str(_req(spec, "name", where))
    body: dict[str, Any] = {"imageFamily": str(spec.get("imageFamily", "Ubuntu2204")),
                            "tags": {str(k): str(v) for k, v in (spec.get("tags") or {}).items()}}
    if spec.get("gpu_mode"):
        body["gpu"] = {"mode": str(spec["gpu_mode"])}
    return {"metadata": {"name": name}, "spec": body}


def _nodepool(spec: dict[str, Any], where: str) -> dict[str, Any]:
    if "apiVersion" in spec:
        return copy.deepcopy(spec)
    name = str(_req(spec, "name", where))
    tspec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.azure.com", "kind": "AKSNodeClass",
                         "name": str(spec.get("node_class", "default"))},
        "requirements": copy.deepcopy(spec.get("requirements") or []),
    }
    if spec.get("taints"):
        tspec["taints"] = copy.deepcopy(spec["taints"])
    return {"metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": dict(spec.get("labels") or {})}, "spec": tspec},
                     "limits": dict(spec.get("limits") or {}), "disruption": {"consolidationPolicy": "WhenEmpty",
                                                                             "consolidateAfter": "30s"}}}


# --------------------------------------------------------------------------- condition flips


def _flip_target(fleet: Fleet, flip: dict[str, Any], where: str) -> tuple[Cluster, str | None]:
    cname = str(_req(flip, "cluster", where))
    cluster = fleet.cluster_by_name(cname)
    if cluster is None:
        raise ScenarioError(f"{where}.cluster {cname!r} is not in the scenario")
    if flip.get("node"):
        return cluster, str(flip["node"])
    pool = str(_req(flip, "pool", where))
    if pool not in cluster.pools:
        raise ScenarioError(f"{where}.pool {pool!r} is not a pool of {cname}")
    return cluster, None


def _resolve_node(cluster: Cluster, flip: dict[str, Any]) -> str | None:
    if flip.get("node"):
        return str(flip["node"])
    nodes = cluster.pool_nodes(str(flip["pool"]))
    idx = int(flip.get("node_index", 0))
    return nodes[idx].name if 0 <= idx < len(nodes) else None


def _check_flip(flip: dict[str, Any], where: str) -> None:
    t = str(_req(flip, "type", where))
    if t not in NPD_GPU_CONDITIONS and not flip.get("allow_any_type"):
        raise ScenarioError(f"{where}.type must be one of {list(NPD_GPU_CONDITIONS)}, not {t!r}")
    if str(flip.get("status", "True")) not in ("True", "False", "Unknown"):
        raise ScenarioError(f"{where}.status must be True, False or Unknown")
    if str(flip.get("fixed_by", "restart")) not in REPAIR_RUNGS:
        raise ScenarioError(f"{where}.fixed_by must be one of {list(REPAIR_RUNGS)}")


def _schedule_flip(fleet: Fleet, flip: dict[str, Any], where: str, t0: float) -> None:
    cluster, _ = _flip_target(fleet, flip, where)
    _check_flip(flip, where)
    at = float(flip.get("at", 0))

    def fire() -> None:
        node = _resolve_node(cluster, flip)
        if node:
            cluster.set_condition(node, str(flip["type"]), str(flip.get("status", "True")),
                                  fixed_by=str(flip.get("fixed_by", "restart")))
            fleet.oracles.record_flip(cluster, node, flip)

    fleet.at(t0 + at, fire)


def _schedule_flapping(fleet: Fleet, flap: dict[str, Any], where: str, t0: float) -> None:
    """A condition that goes True and False every ``period_s``, ``flips`` times from ``start``.

    The flapping is one node's (a device that comes and goes): ``node_index`` is resolved at the first flip
    and every later flip lands on that node, or nowhere once it has left. Resolved afresh at each flip, a
    replacement in the pool meanwhile moved the flapping to another node, leaving one True for good (soak
    seed 954044): a persistent fault nobody drew.
    """
    cluster, _ = _flip_target(fleet, flap, where)
    _check_flip(flap, where)
    start, period, flips = float(flap.get("start", 0)), float(flap.get("period_s", 30)), int(flap.get("flips", 6))
    if period <= 0:
        raise ScenarioError(f"{where}.period_s must be positive")
    target: list[str | None] = []  # the node, once the first flip resolved it

    for i in range(flips):
        status = "True" if i % 2 == 0 else "False"

        def fire(status: str = status) -> None:
            if not target:
                target.append(_resolve_node(cluster, flap))
            node = target[0]
            if node and node in cluster.nodes:
                cluster.set_condition(node, str(flap["type"]), status, fixed_by=str(flap.get("fixed_by", "never")))

        fleet.at(t0 + start + i * period, fire)


def flip_now(fleet: Fleet, body: dict[str, Any]) -> str:
    """/_sim/conditions: flip a node condition now; returns the node name."""
    cluster, _ = _flip_target(fleet, body, "body")
    _check_flip({"allow_any_type": True, **body}, "body")
    node = _resolve_node(cluster, body)
    if node is None or node not in cluster.nodes:
        raise ScenarioError(f"body: no such node in {cluster.name}")
    cluster.set_condition(node, str(body["type"]), str(body.get("status", "True")),
                          fixed_by=str(body.get("fixed_by", "restart")))
    return node

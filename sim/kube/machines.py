"""Agent pool machines: the VMSS instances behind a pool's nodes (the ARM half calls these), how a new
node object looks as AKS and the kubelet register it, its GPU resources, and spot VM eviction.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sim.core.sizes import size_info
from sim.kube import gpu_faults
from sim.kube.nodes import NPD_BASE_CONDITIONS, NPD_GPU_CONDITIONS, NPD_GPU_REASONS, node_condition
from sim.kube.objects import Node, Pool, base36, iso

SPOT_LABEL = "kubernetes.azure.com/scalesetpriority"  # label and taint key of spot nodes (AKS)

# AKS node auto-drain cordons a spot node whose VM got a Preempt scheduled event with this taint
# (https://learn.microsoft.com/azure/aks/node-auto-drain).
PREEMPT_TAINT = "remediator.kubernetes.azure.com/unschedulable"

# The cloud node lifecycle controller taints a node whose VM is stopped or deallocated
# (kubernetes/cloud-provider controllers/nodelifecycle/node_lifecycle_controller.go, ShutdownTaint).
SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"

# A Preempt scheduled event comes at least 30 s ahead (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events).
SPOT_NOTICE_S = 30.0


def _parse_taint(text: str | dict[str, Any]) -> dict[str, Any]:
    """ARM's ``key=value:Effect`` taint string as a Kubernetes taint."""
    if isinstance(text, dict):
        return dict(text)
    kv, _, effect = str(text).partition(":")
    key, _, value = kv.partition("=")
    out = {"key": key, "effect": effect or "NoSchedule"}
    if value:
        out["value"] = value
    return out


_BASE_IMAGES = [
    ("mcr.microsoft.com/oss/kubernetes/kube-proxy", "v1.32.4-hotfix.20260105", 31_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/azuredisk-csi", "v1.31.5", 82_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/azurefile-csi", "v1.31.3", 78_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/csi-node-driver-registrar", "v2.12.0", 10_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/livenessprobe", "v2.14.0", 9_000_000),
    ("mcr.microsoft.com/containernetworking/azure-cns", "v1.6.21", 120_000_000),
    ("mcr.microsoft.com/containernetworking/azure-ip-masq-agent", "v0.1.15", 25_000_000),
    ("mcr.microsoft.com/containernetworking/cilium/cilium", "v1.16.6-250129", 230_000_000),
    ("mcr.microsoft.com/oss/kubernetes/pause", "3.6", 300_000),
    ("mcr.microsoft.com/oss/kubernetes/node-problem-detector", "v0.8.20", 40_000_000),
    ("mcr.microsoft.com/azuremonitor/containerinsights/ciprod", "3.1.24", 180_000_000),
    ("mcr.microsoft.com/oss/v2/kubernetes/coredns", "v1.11.3-8", 20_000_000),
]

_GPU_IMAGES = [
    ("mcr.microsoft.com/oss/nvidia/k8s-device-plugin", "v0.17.0", 150_000_000),
    ("nvcr.io/nvidia/k8s/dcgm-exporter", "4.1.1-4.0.4-ubuntu22.04", 420_000_000),
]

_IMAGES_CACHE: dict[bool, list[dict[str, Any]]] = {}


def _node_images(gpu: bool) -> list[dict[str, Any]]:
    """The image list of a node (one shared, never mutated list per kind: 100k nodes fit in memory)."""
    if gpu in _IMAGES_CACHE:
        return _IMAGES_CACHE[gpu]
    images = []
    for repo, tag, size in _BASE_IMAGES + (_GPU_IMAGES if gpu else []):
        digest = hashlib.sha256(f"{repo}:{tag}".encode()).hexdigest()
        images.append({"names": [f"{repo}@sha256:{digest}", f"{repo}:{tag}"], "sizeBytes": size})
    _IMAGES_CACHE[gpu] = images
    return images


def _unique_taints(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Taints unique by (key, effect), the first of each kept (an API server refuses duplicates)."""
    seen: set[tuple[Any, Any]] = set()
    out = []
    for t in taints:
        k = (t.get("key"), t.get("effect"))
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out


class Machines:
    """Part of :class:`sim.model.Cluster`: pools' VMs and the nodes they register. State: ``pools``,
    ``nodes``, ``pods_by_node``.
    """

    def vmss_name(self, pool: Pool) -> str:
        self._ensure_node_id(pool)
        return f"aks-{pool.name}-{pool.node_id}-vmss"

    def _ensure_node_id(self, pool: Pool) -> None:
        if not pool.node_id:
            digest = hashlib.sha256(f"{self.fleet.seed}|{self.id.lower()}|{pool.name}".encode()).hexdigest()
            pool.node_id = f"{int(digest[:12], 16) % 10**8:08d}"

    def pool_nodes(self, pool: Pool | str) -> list[Node]:
        name = pool if isinstance(pool, str) else pool.name
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].pool == name and not self.nodes[n].nap]

    def materialise_pool(self, pool: Pool) -> None:
        """Create nodes to match ``pool.properties["count"]``; they join NotReady and turn Ready later."""
        with self.fleet.lock:
            self.pools.setdefault(pool.name, pool)
            self.scale_nodes(pool, int(pool.properties.get("count") or 0))

    def scale_nodes(self, pool: Pool, count: int) -> None:
        """Add nodes, or remove (cordoned first, then newest) with their pods."""
        with self.fleet.lock:
            nodes = self.pool_nodes(pool)
            if count > len(nodes):
                for _ in range(count - len(nodes)):
                    self._add_pool_node(pool)
            elif count < len(nodes):
                victims = sorted(nodes, key=lambda n: (not n.unschedulable, -n.instance_id))[: len(nodes) - count]
                for n in victims:
                    self.delete_node(n.name, cause="scale_down")

    def remove_pool_nodes(self, pool: Pool) -> None:
        with self.fleet.lock:
            for n in self.pool_nodes(pool):
                self.delete_node(n.name, cause="pool_deleted")

    def remove_machines(self, pool: Pool, names: list[str]) -> None:
        with self.fleet.lock:
            for name in names:
                node = self.nodes.get(name)
                if node is not None and node.pool == pool.name:
                    self.delete_node(name, cause="machine_deleted")

    def machines(self, pool: Pool) -> list[dict[str, Any]]:
        with self.fleet.lock:
            out = []
            for n in self.pool_nodes(pool):
                zone = n.labels.get("topology.kubernetes.io/zone", "0")
                zones = [zone.rsplit("-", 1)[-1]] if "-" in zone else []
                out.append({"name": n.name, "resourceId": self._vm_id(n.vmss, n.instance_id), "zones": zones})
            return out

    def node_by_vmss_instance(self, vmss: str, instance_id: str) -> str | None:
        with self.fleet.lock:
            for name in sorted(self.nodes):
                n = self.nodes[name]
                if n.vmss.lower() == vmss.lower() and str(n.instance_id) == str(instance_id):
                    return name
            return None

    def _vm_id(self, vmss: str, instance_id: int) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.node_resource_group}"
                f"/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{instance_id}")

    def _add_pool_node(self, pool: Pool) -> Node:
        self._ensure_node_id(pool)
        iid = pool.next_instance
        pool.next_instance += 1
        vmss = self.vmss_name(pool)
        name = f"{vmss}{base36(iid)}"
        props = pool.properties
        zones = props.get("availabilityZones") or []
        zone = f"{self.location}-{zones[iid % len(zones)]}" if zones else "0"
        labels = {
            "agentpool": pool.name,
            "kubernetes.azure.com/agentpool": pool.name,
            "kubernetes.azure.com/cluster": self.node_resource_group,
            "kubernetes.azure.com/mode": str(props.get("mode") or "User").lower(),
            "kubernetes.azure.com/node-image-version": "AKSUbuntu-2204gen2containerd-202611.05.0",
            "kubernetes.azure.com/os-sku": str(props.get("osSKU") or "Ubuntu"),
            "kubernetes.azure.com/role": "agent",
            "kubernetes.io/os": str(props.get("osType") or "Linux").lower(),
            "node.kubernetes.io/instance-type": str(props.get("vmSize") or "Standard_D4s_v5"),
            "topology.kubernetes.io/region": self.location,
            "topology.kubernetes.io/zone": zone,
        }
        taints = [_parse_taint(t) for t in props.get("nodeTaints") or []]
        if str(props.get("scaleSetPriority") or "").lower() == "spot":
            # AKS gives every spot pool this label and taint and lists them in the pool's own
            # nodeLabels/nodeTaints (https://learn.microsoft.com/azure/aks/spot-node-pool; Azure/AKS#1719):
            # a pool that names them (as AKS returns it, or as a scenario lists it) still yields
            # nodes that carry them once. A node with the same (key, effect) twice is invalid
            # (kubernetes/kubernetes pkg/apis/core/validation/validation.go validateNodeTaints).
            labels[SPOT_LABEL] = "spot"
            taints.append({"key": SPOT_LABEL, "value": "spot", "effect": "NoSchedule"})
        labels.update({str(k): str(v) for k, v in (props.get("nodeLabels") or {}).items()})
        taints = _unique_taints(taints)
        node = self._build_node(name=name, pool=pool.name, instance_id=iid, vmss=vmss, labels=labels, taints=taints,
                                vm_size=labels["node.kubernetes.io/instance-type"],
                                max_pods=int(props.get("maxPods") or 110), gpu=self._gpu_setup(pool))
        return node

    def spot_evict(self, name: str, *, notice_s: float = SPOT_NOTICE_S) -> dict[str, Any]:
        """Azure takes a spot VM back (a fault of nature, never the app's doing).

        Now: the VM gets a ``Preempt`` scheduled event, at least 30 s ahead
        (https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events), and AKS node
        auto-drain cordons the node with :data:`PREEMPT_TAINT`
        (https://learn.microsoft.com/azure/aks/node-auto-drain). ``notice_s`` later the VM goes as
        the pool's ``scaleSetEvictionPolicy`` says (https://learn.microsoft.com/azure/aks/spot-node-pool):
        ``Delete`` (the default): the VM is deleted, the kubelet stops and the cloud node lifecycle
        controller deletes the Node with its pods; ``Deallocate``: the VM is stopped-deallocated,
        the Node stays NotReady with :data:`SHUTDOWN_TAINT` (kubernetes/cloud-provider
        controllers/nodelifecycle/node_lifecycle_controller.go) and its pods stay bound to it.
        Pods lost with the VM are recorded with cause ``spot_eviction``, not as the app's losses.
        Raises KeyError for an unknown node, ValueError for a node that is not spot.
        """
        with self.fleet.lock:
            node = self.nodes.get(name)
            if node is None:
                raise KeyError(f"no node {name!r} in cluster {self.name}")
            if node.labels.get(SPOT_LABEL) != "spot":
                raise ValueError(f"node {name} is not a spot node (no {SPOT_LABEL}=spot label): Azure evicts only spot VMs")
            pool = self.pools.get(node.pool)
            policy = str(((pool.properties if pool else {}) or {}).get("scaleSetEvictionPolicy") or "Delete")
            now = self.fleet.now()
            taints = [t for t in node.obj["spec"].get("taints") or [] if t.get("key") != PREEMPT_TAINT]
            node.obj["spec"]["taints"] = [*taints, {"key": PREEMPT_TAINT, "effect": "NoSchedule", "timeAdded": iso(now)}]
            node.obj["spec"]["unschedulable"] = True
            self.sync_node(node)

            def vm_gone() -> None:
                n = self.nodes.get(name)
                if n is None:
                    return
                if policy.lower() == "deallocate":
                    # The VM stops: its pods stop running now, though the API keeps them bound to the
                    # NotReady node (until taint-based eviction, and the node's deletion, remove them).
                    # Their loss is recorded now, as Azure's; pod.cause marks them for later accounting.
                    for key in sorted(self.pods_by_node.get(name, set())):
                        pod = self.pods.get(key)
                        if pod is not None and not pod.terminating and pod.phase == "Running":
                            self.fleet.oracles.pod_terminated(self, pod, cause="spot_eviction")
                            pod.cause = "spot_eviction"
                    self._set_ready(n, False)
                    rest = [t for t in n.obj["spec"].get("taints") or [] if t.get("key") != SHUTDOWN_TAINT]
                    n.obj["spec"]["taints"] = [*rest, {"key": SHUTDOWN_TAINT, "effect": "NoSchedule"}]
                    self.touch(n)
                    return
                for key in sorted(self.pods_by_node.get(name, set())):
                    pod = self.pods.get(key)
                    if pod is not None:
                        self.fleet.oracles.pod_terminated(self, pod, cause="spot_eviction")
                        self._drop_pod(pod)
                self.delete_node(name, cause="spot_eviction")

            self.fleet.after(notice_s, vm_gone)
            return {"node": name, "pool": node.pool, "evictionPolicy": policy, "notBefore": iso(now + notice_s)}

    def _gpu_setup(self, pool: Pool) -> dict[str, Any]:
        """How a pool's GPUs show up: managed stack, NPD, device plugin, MIG strategy."""
        props = pool.properties
        gp = props.get("gpuProfile") or {}
        nvidia = gp.get("nvidia") or {}
        managed = pool.managed_gpu
        driver_none = str(gp.get("driver") or "").lower() == "none" and not managed
        mig_profile = ""
        strategy = ""
        if nvidia.get("migStrategy") and str(nvidia.get("migStrategy")).lower() != "none":
            strategy = str(nvidia["migStrategy"]).lower()
            profiles = nvidia.get("migProfiles") or []
            mig_profile = str(profiles[0]) if profiles else str(props.get("gpuInstanceProfile") or "")
        elif props.get("gpuInstanceProfile"):
            mig_profile = str(props["gpuInstanceProfile"])
            strategy = str((props.get("nodeLabels") or {}).get("nvidia.com/mig.strategy") or "mixed").lower()
        return {"managed": managed, "driver_none": driver_none, "npd": managed or pool.npd,
                "device_plugin": pool.device_plugin, "mig_profile": mig_profile, "mig_strategy": strategy}

    def _build_node(self, *, name: str, pool: str, instance_id: int, vmss: str, labels: dict[str, str],
                    taints: list[dict[str, Any]], vm_size: str, max_pods: int, gpu: dict[str, Any],
                    nap: bool = False, provider_id: str | None = None, ready_s: float | None = None) -> Node:
        fleet = self.fleet
        now = fleet.now()
        info = size_info(vm_size)
        gpus = int(getattr(info, "gpus", 0) or 0) if getattr(info, "nvidia", False) else 0
        if gpus:
            if not nap:
                # Karpenter (node auto-provisioning) nodes do not carry it: removed in
                # Azure/karpenter-provider-azure#837 as redundant with karpenter.azure.com/sku-gpu-name
                # (designs/0006-requirements-and-labels.md).
                labels["kubernetes.azure.com/accelerator"] = "nvidia"
            if gpu.get("managed"):
                labels["kubernetes.azure.com/dcgm-exporter"] = "enabled"
        vcpus = int(info.vcpus)
        mem_ki = int(float(info.memory_gib) * 1024 * 1024)
        capacity = {"cpu": str(vcpus), "memory": f"{mem_ki}Ki", "pods": str(max_pods),
                    "ephemeral-storage": "129886128Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        allocatable = {"cpu": f"{vcpus * 1000 - 140 - 60 * max(0, vcpus - 1) // 4}m",
                       "memory": f"{int(mem_ki * 0.85)}Ki", "pods": str(max_pods),
                       "ephemeral-storage": "119703055367", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        conditions = [node_condition("NetworkUnavailable", "False", now, "RouteCreated", "RouteController created a route")]
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            conditions.append(node_condition(t, "False", now, f"KubeletHasNo{t.replace('Pressure', '')}Pressure",
                                    f"kubelet has no {t.lower()}"))
        conditions.append(node_condition("Ready", "False", now, "KubeletNotReady", "container runtime network not ready"))
        for t in NPD_BASE_CONDITIONS:
            conditions.append(node_condition(t, "False", now, f"No{t}", f"node has no {t}"))
        if gpus and gpu.get("npd"):
            for t in NPD_GPU_CONDITIONS:
                ok, _bad = NPD_GPU_REASONS[t]
                conditions.append(node_condition(t, "False", now, ok, f"{t}: healthy"))
        taints = [dict(t) for t in taints] + [
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": iso(now)},
        ]
        ip = f"10.{224 + (len(self.nodes) // 65536) % 32}.{(len(self.nodes) // 256) % 256}.{len(self.nodes) % 256}"
        obj: dict[str, Any] = {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {
                "name": name, "uid": fleet.new_uid(), "resourceVersion": self.next_rv(),
                "creationTimestamp": iso(now), "labels": dict(sorted(labels.items())),
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                    "csi.volume.kubernetes.io/nodeid": '{"disk.csi.azure.com":"' + name + '"}',
                },
            },
            "spec": {"podCIDR": f"10.244.{len(self.nodes) % 256}.0/24",
                     "providerID": provider_id or f"azure://{self._vm_id(vmss, instance_id)}",
                     "taints": taints},
            "status": {
                "capacity": capacity, "allocatable": allocatable, "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "machineID": fleet.new_uid().replace("-", ""), "systemUUID": fleet.new_uid(),
                    "bootID": fleet.new_uid(), "kernelVersion": "5.15.0-1079-azure",
                    "osImage": "Ubuntu 22.04.5 LTS", "containerRuntimeVersion": "containerd://1.7.27-1",
                    "kubeletVersion": f"v{self.kubernetes_version}", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64",
                },
                "images": _node_images(gpus > 0),
            },
        }
        node = Node(obj, pool=pool, instance_id=instance_id, vmss=vmss, nap=nap)
        node.gpu = gpu
        self.nodes[name] = node
        self.pods_by_node.setdefault(name, set())
        self._apply_gpu_resources(node)
        self.log_change(node, "ADDED")
        self.dirty = True
        fleet.oracles.node_changed(self, node)
        self._schedule_ready(node, fleet.timings["node_ready_s"] if ready_s is None else ready_s)
        return node

    def _apply_gpu_resources(self, node: Node) -> None:
        """Advertise nvidia.com/gpu or nvidia.com/mig-<profile> when the stack that would do so is present."""
        gpu = node.gpu
        info = size_info(node.labels.get("node.kubernetes.io/instance-type", ""))
        gpus = int(getattr(info, "gpus", 0) or 0) if getattr(info, "nvidia", False) else 0
        status = node.obj["status"]
        for block in (status["capacity"], status["allocatable"]):
            for k in [k for k in block if k.startswith("nvidia.com/")]:
                del block[k]
        if not gpus or gpu.get("driver_none"):
            return
        advertised = gpu.get("managed") or gpu.get("device_plugin")
        if gpu.get("device_plugin") is None and not gpu.get("managed"):
            advertised = self._device_plugin_covers(node)
        if not advertised:
            return
        res: dict[str, str] = {}
        profile = gpu.get("mig_profile") or ""
        profiles = dict(getattr(info, "mig_profiles", {}) or {})
        if profile and profile in profiles:
            suffix, per_gpu = profiles[profile]
            if gpu.get("mig_strategy") == "single":
                res["nvidia.com/gpu"] = str(gpus * per_gpu)
            else:
                res[f"nvidia.com/mig-{suffix}"] = str(gpus * per_gpu)
        else:
            res["nvidia.com/gpu"] = str(gpus)
        capacity, allocatable = gpu_faults.shape(gpu, res)  # a GPU off the bus, a node that never shows them all
        status["capacity"].update(capacity)
        status["allocatable"].update(allocatable)

    def _device_plugin_covers(self, node: Node) -> bool:
        return any("nvidia-device-plugin" in ds.name and self._ds_wants(ds, node)
                   for ds in self.items("daemonsets.apps"))

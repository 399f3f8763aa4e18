"""Node auto-provisioning (Karpenter on AKS): a NodeClaim and its node for a pod nothing else can
hold, labelled as karpenter-provider-azure labels them, and the termination of a deleted NodeClaim.
"""

from __future__ import annotations

import re
from typing import Any

from sim.core.sizes import gpu_sizes, size_info
from sim.kube.objects import MANAGED_GPU_TAG, KObj, Node, Pod, iso, parse_quantity
from sim.kube.scheduler import tolerates
from sim.kube.selectors import match_requirements

NAP_RESOURCES: dict[str, tuple[str, str, str, bool]] = {
    "nodepools.karpenter.sh": ("karpenter.sh", "v1", "NodePool", False),
    "nodeclaims.karpenter.sh": ("karpenter.sh", "v1", "NodeClaim", False),
    "aksnodeclasses.karpenter.azure.com": ("karpenter.azure.com", "v1beta1", "AKSNodeClass", False),
}


def _nap_size_labels(size: Any) -> dict[str, str]:
    name = str(size.name)
    m = re.match(r"Standard_([A-Z]+)", name)
    family = (m.group(1)[0] if m else "D")
    labels = {"node.kubernetes.io/instance-type": name, "karpenter.azure.com/sku-name": name,
              "karpenter.azure.com/sku-family": family, "karpenter.azure.com/sku-cpu": str(size.vcpus),
              "karpenter.sh/capacity-type": "on-demand", "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}
    if getattr(size, "nvidia", False):
        labels["karpenter.azure.com/sku-gpu-manufacturer"] = "nvidia"
        labels["karpenter.azure.com/sku-gpu-name"] = str(getattr(size, "gpu_model", "") or "")
        labels["karpenter.azure.com/sku-gpu-count"] = str(getattr(size, "gpus", 0))
    return labels


class Autoprovisioner:
    """Part of :class:`sim.model.Cluster`: Karpenter's provisioning and termination. State:
    ``nap_inflight``.
    """

    def _autoprovision(self) -> None:
        for key in sorted(self.pending):
            pod = self.pods.get(key)
            if pod is None or pod.node_name or pod.terminating:
                continue
            uid = pod.meta["uid"]
            if uid in self.nap_inflight and self.nap_inflight[uid] in self.nodes:
                continue
            choice = self._nap_choice(pod)
            if choice is None:
                continue
            nodepool, size, managed, chosen = choice
            node = self._add_nap_node(nodepool, size, managed=managed, chosen=chosen)
            self.nap_inflight[uid] = node.name

    def _nap_choice(self, pod: Pod) -> tuple[KObj, Any, bool, dict[str, str]] | None:
        """The first NodePool (by name) that admits the pod, the smallest size it allows, and the labels
        chosen for the flexible requirements (zone, capacity type)."""
        for np_obj in self.items("nodepools.karpenter.sh"):
            tmpl = ((np_obj.obj.get("spec") or {}).get("template") or {})
            tspec = tmpl.get("spec") or {}
            taints = list(tspec.get("taints") or [])
            if not tolerates(pod.obj["spec"].get("tolerations") or [], taints):
                continue
            reqs = [(r.get("key", ""), r.get("operator", "In"), tuple(r.get("values") or ()))
                    for r in tspec.get("requirements") or []]
            chosen = {"topology.kubernetes.io/zone": f"{self.location}-1", "karpenter.sh/capacity-type": "on-demand"}
            for key, op, values in reqs:
                if key in chosen and op == "In" and values:
                    chosen[key] = str(values[0])
            labels_fixed = dict((tmpl.get("metadata") or {}).get("labels") or {})
            class_name = ((tspec.get("nodeClassRef") or {}).get("name")) or "default"
            node_class = self.get("aksnodeclasses.karpenter.azure.com", "", class_name)
            managed = bool(node_class and str(((node_class.obj.get("spec") or {}).get("tags") or {})
                                            .get(MANAGED_GPU_TAG, "")).lower() == "true")
            wants_gpu = pod.requests.get("nvidia.com/gpu", 0) > 0
            candidates = gpu_sizes() if wants_gpu else [size_info("Standard_D4s_v5"), size_info("Standard_D8s_v5")]
            for size in candidates:
                labels = dict(labels_fixed)
                labels.update(_nap_size_labels(size))
                labels.update(chosen)
                if not match_requirements(labels, reqs):
                    continue
                if wants_gpu and int(getattr(size, "gpus", 0)) < pod.requests.get("nvidia.com/gpu", 0):
                    continue
                if int(size.vcpus) * 1000 < pod.requests.get("cpu", 0) * 1000:
                    continue
                if not self._within_limits(np_obj, size):
                    continue
                sel = pod.obj["spec"].get("nodeSelector") or {}
                probe = dict(labels)
                probe.update({"karpenter.sh/nodepool": np_obj.name, "kubernetes.io/os": "linux"})
                if any(probe.get(k) != v for k, v in sel.items()):
                    continue
                return np_obj, size, managed, chosen
        return None

    def _within_limits(self, np_obj: KObj, size: Any) -> bool:
        """NodePool ``spec.limits`` (cpu, memory, nvidia.com/gpu) over its nodes plus one more of ``size``."""
        limits = (np_obj.obj.get("spec") or {}).get("limits") or {}
        if not limits:
            return True
        used = {"cpu": float(size.vcpus), "memory": float(size.memory_gib) * 1024**3,
                "nvidia.com/gpu": float(getattr(size, "gpus", 0) or 0)}
        for node in self.nodes.values():
            if node.nap and node.pool == np_obj.name:
                info = size_info(node.labels.get("node.kubernetes.io/instance-type", ""))
                used["cpu"] += float(info.vcpus)
                used["memory"] += float(info.memory_gib) * 1024**3
                used["nvidia.com/gpu"] += float(getattr(info, "gpus", 0) or 0)
        for key, value in limits.items():
            try:
                if key in used and used[key] > parse_quantity(value) + 1e-9:
                    return False
            except ValueError:
                continue
        return True

    def _add_nap_node(self, np_obj: KObj, size: Any, *, managed: bool, chosen: dict[str, str]) -> Node:
        """A Karpenter node and its NodeClaim, labelled as karpenter-provider-azure labels them.

        Azure/karpenter-provider-azure: the NodeClaim is ``<nodepool>-<suffix>`` and its VM (and so the
        node) ``aks-<nodeclaim>`` (pkg/providers/instance); labels: the NodePool's template labels, the
        well-known requirements (pkg/apis/v1beta1/labels.go: karpenter.azure.com/sku-*,
        kubernetes.azure.com/mode, os-sku, priority...) and AddAgentBakerGeneratedLabels
        (pkg/providers/imagefamily/labels/labels.go: kubernetes.azure.com/role, cluster). Not set:
        ``kubernetes.azure.com/agentpool``, ``agentpool`` and ``kubernetes.azure.com/accelerator``
        (designs/0006-requirements-and-labels.md, "Karpenter (written to node)"). The node is a
        standalone VM: ``providerID`` azure:///subscriptions/.../virtualMachines/<name>.
        """
        tmpl = ((np_obj.obj.get("spec") or {}).get("template") or {})
        tspec = tmpl.get("spec") or {}
        claim = f"{np_obj.name}-{self.fleet.rand_suffix(5)}"
        name = f"aks-{claim}"
        labels = {"karpenter.sh/nodepool": np_obj.name, "karpenter.sh/registered": "true",
                  "karpenter.sh/initialized": "true",
                  "kubernetes.azure.com/cluster": self.node_resource_group, "kubernetes.azure.com/role": "agent",
                  "kubernetes.azure.com/mode": "user", "kubernetes.azure.com/priority": "regular",
                  "kubernetes.azure.com/os-sku": "Ubuntu", "kubernetes.io/os": "linux",
                  "node.kubernetes.io/instance-type": size.name, "topology.kubernetes.io/region": self.location,
                  "topology.kubernetes.io/zone": f"{self.location}-1"}
        labels.update({str(k): str(v) for k, v in ((tmpl.get("metadata") or {}).get("labels") or {}).items()})
        labels.update(_nap_size_labels(size))
        labels.update(chosen)
        provider = (f"azure:///subscriptions/{self.subscription}/resourceGroups/{self.node_resource_group}"
                    f"/providers/Microsoft.Compute/virtualMachines/{name}")
        node = self._build_node(name=name, pool=np_obj.name, instance_id=0, vmss="", labels=labels,
                                taints=[dict(t) for t in tspec.get("taints") or []], vm_size=size.name, max_pods=250,
                                gpu={"managed": managed, "npd": managed, "device_plugin": True, "mig_profile": "",
                                     "mig_strategy": ""}, nap=True, provider_id=provider,
                                ready_s=self.fleet.timings["nap_provision_s"])
        claim_obj = self.put("nodeclaims.karpenter.sh", {
            "metadata": {"name": claim, "labels": {"karpenter.sh/nodepool": np_obj.name},
                         "finalizers": ["karpenter.sh/termination"]},
            "spec": {"nodeClassRef": tspec.get("nodeClassRef") or {}, "requirements": tspec.get("requirements") or []},
            "status": {"nodeName": name, "providerID": provider}})
        # kubernetes-sigs/karpenter pkg/controllers/nodeclaim/lifecycle/registration.go: the node is owned by
        # its NodeClaim (blockOwnerDeletion).
        node.meta["ownerReferences"] = [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": claim,
                                         "uid": claim_obj.meta.get("uid", ""), "blockOwnerDeletion": True}]
        node.invalidate()
        return node

    def delete_nodeclaim(self, name: str) -> KObj | None:
        """A NodeClaim was deleted: Karpenter's termination controller takes its node and VM away.

        kubernetes-sigs/karpenter pkg/controllers/node/termination (the ``karpenter.sh/termination``
        finalizer): the claim gets its deletionTimestamp, the node is tainted ``karpenter.sh/disrupted``
        (NoSchedule) and drained, the instance deleted, then the node and, last, the claim. The drain is
        not modelled (the steward has drained already; pods still there go with the node); the whole
        termination takes ``nap_terminate_s``. A pending pod then gets a new node as usual.
        """
        claim = self.get("nodeclaims.karpenter.sh", "", name)
        if claim is None:
            return None
        if claim.meta.get("deletionTimestamp"):
            return claim  # already terminating: deleting again changes nothing
        claim.meta["deletionTimestamp"] = iso(self.fleet.now())
        self.touch(claim)
        node_name = str((claim.obj.get("status") or {}).get("nodeName") or "")
        node = self.nodes.get(node_name)
        if node is not None:
            taints = [t for t in node.obj["spec"].get("taints") or [] if t.get("key") != "karpenter.sh/disrupted"]
            node.obj["spec"]["taints"] = [*taints, {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
            node.meta["deletionTimestamp"] = iso(self.fleet.now())
            self.touch(node)
        uid = claim.meta.get("uid")

        def terminated() -> None:
            current = self.get("nodeclaims.karpenter.sh", "", name)
            if current is None or current.meta.get("uid") != uid:
                return
            if node_name in self.nodes:
                self.delete_node(node_name, cause="nodeclaim_deleted")
            gone = self.store["nodeclaims.karpenter.sh"].pop(("", name), None)
            if gone is not None:
                self.dirty = True
                self.log_change(gone, "DELETED")

        self.fleet.after(self.fleet.timings.get("nap_terminate_s", 10.0), terminated)
        return claim

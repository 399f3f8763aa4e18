"""A pool request for a cluster with node auto-provisioning, as Karpenter objects (pure builders).

On clusters whose ``nodeProvisioningProfile.mode`` is ``Auto`` (AKS Automatic, or Standard with
NAP) nodes are not made by agent pools but by Karpenter. The seed says to configure the managed GPU
stack in the ``AKSNodeClass`` there
(https://learn.microsoft.com/azure/aks/node-autoprovision): the tag ``EnableManagedGPUExperience: "true"``
in ``spec.tags`` and ``spec.gpu.mode`` ``driver`` or ``none``. The ``NodePool`` restricts Karpenter to
the requested NVIDIA size and carries the taints, labels and limits. MIG settings for NAP are not
documented for node auto-provisioning, so such requests are refused by the caller
(:func:`unsupported`).

Both objects are cluster-scoped and named after the request's ``poolName``; the steward's
annotations record which request made them.
"""

from __future__ import annotations

from typing import Any

from shared.fleet import gpu_sizes
from shared.pools.request import PoolRequest
from shared.pools.spec import TAG_MANAGED_GPU, pool_taints, steward_tags

NODEPOOL_API = "karpenter.sh/v1"
NODECLASS_API = "karpenter.azure.com/v1beta1"
ANNOTATION_REQUEST_ID = "gpu-fleet-steward/request-id"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-fleet-steward"
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # Karpenter's label on the nodes it makes for a NodePool


def unsupported(req: PoolRequest) -> str | None:
    """Why this request cannot be met on a NAP cluster, or None."""
    if req.mig_strategy != "None" or req.mig_profile:
        return "MIG settings for node auto-provisioning are not documented; use a cluster without NAP for MIG pools"
    return None


def _metadata(req: PoolRequest) -> dict[str, Any]:
    return {"name": req.pool_name, "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {ANNOTATION_REQUEST_ID: req.request_id}}


def node_class(req: PoolRequest) -> dict[str, Any]:
    """The ``AKSNodeClass``: image family, max pods, tags (managed-GPU tag on managed), GPU driver mode."""
    tags = {**req.tags, **steward_tags(req)}
    if req.install_profile == "managed":
        tags[TAG_MANAGED_GPU] = "true"
    else:
        tags.pop(TAG_MANAGED_GPU, None)
    spec: dict[str, Any] = {
        "imageFamily": req.os_sku,  # Ubuntu | AzureLinux
        "tags": tags,
        "gpu": {"mode": "none" if req.install_profile == "none" else "driver"},
    }
    if req.max_pods is not None:
        spec["maxPods"] = req.max_pods
    return {"apiVersion": NODECLASS_API, "kind": "AKSNodeClass", "metadata": _metadata(req), "spec": spec}


def node_pool(req: PoolRequest, *, size: gpu_sizes.GpuSize, location: str) -> dict[str, Any]:
    """The Karpenter ``NodePool`` limited to the requested size, with the pool's taints and labels.

    ``limits`` cap the pool at the requested node count (or ``autoscale.max``) in vCPUs and GPUs.
    """
    nodes = req.autoscale.max if req.autoscale is not None else req.node_count
    requirements: list[dict[str, Any]] = [
        {"key": "karpenter.azure.com/sku-family", "operator": "In", "values": ["N"]},
        {"key": "karpenter.azure.com/sku-gpu-manufacturer", "operator": "In", "values": ["nvidia"]},
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [size.name]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot" if req.spot_enabled else "on-demand"]},
    ]
    if req.zones:
        requirements.append({"key": "topology.kubernetes.io/zone", "operator": "In",
                             "values": [f"{location}-{zone}" for zone in req.zones]})
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.azure.com", "kind": "AKSNodeClass", "name": req.pool_name},
        "requirements": requirements,
        "taints": [{"key": k, "value": v, "effect": e} if v else {"key": k, "effect": e}
                   for k, v, e in pool_taints(req) if not (req.spot_enabled and k == "kubernetes.azure.com/scalesetpriority")],
    }
    return {
        "apiVersion": NODEPOOL_API,
        "kind": "NodePool",
        "metadata": _metadata(req),
        "spec": {
            "template": {"metadata": {"labels": dict(req.labels)}, "spec": template_spec},
            "limits": {"cpu": str(nodes * size.vcpus), "nvidia.com/gpu": str(nodes * size.gpus)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
        },
    }


def made_by(obj: dict[str, Any] | Any, request_id: str) -> bool:
    """Whether an existing Karpenter object was made for this request."""
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_REQUEST_ID) == request_id

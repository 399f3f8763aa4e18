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
annotations record which request (request id and team) made them, and when. They are created with
create-only semantics (shared.pools.steps): an object of the name is never replaced unless it carries
this request's annotations, and then only at the ``resourceVersion`` that was read and checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from shared.fleet import gpu_sizes
from shared.pools.request import PoolRequest
from shared.pools.spec import TAG_MANAGED_GPU, pool_taints, steward_tags

NODEPOOL_API = "karpenter.sh/v1"
NODECLASS_API = "karpenter.azure.com/v1beta1"
ANNOTATION_REQUEST_ID = "gpu-fleet-steward/request-id"
ANNOTATION_REQUESTER = "gpu-fleet-steward/requester"
ANNOTATION_CREATED_AT = "gpu-fleet-steward/created-at"  # unix seconds; the server's creationTimestamp wins
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-fleet-steward"
GPU_LIMIT = "nvidia.com/gpu"
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # Karpenter's label on the nodes it makes for a NodePool


def unsupported(req: PoolRequest) -> str | None:
    """Why this request cannot be met on a NAP cluster, or None."""
    if req.mig_strategy != "None" or req.mig_profile:
        return "MIG settings for node auto-provisioning are not documented; use a cluster without NAP for MIG pools"
    return None


def _metadata(req: PoolRequest, created_at: float | None) -> dict[str, Any]:
    annotations = {ANNOTATION_REQUEST_ID: req.request_id, ANNOTATION_REQUESTER: req.requester}
    if created_at is not None:
        annotations[ANNOTATION_CREATED_AT] = str(int(created_at))
    return {"name": req.pool_name, "labels": {LABEL_MANAGED_BY: MANAGED_BY}, "annotations": annotations}


def node_class(req: PoolRequest, *, created_at: float | None = None) -> dict[str, Any]:
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
    return {"apiVersion": NODECLASS_API, "kind": "AKSNodeClass", "metadata": _metadata(req, created_at), "spec": spec}


def node_pool(req: PoolRequest, *, size: gpu_sizes.GpuSize, location: str,
              created_at: float | None = None) -> dict[str, Any]:
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
        "metadata": _metadata(req, created_at),
        "spec": {
            "template": {"metadata": {"labels": dict(req.labels)}, "spec": template_spec},
            "limits": {"cpu": str(nodes * size.vcpus), "nvidia.com/gpu": str(nodes * size.gpus)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
        },
    }


def made_by(obj: dict[str, Any] | Any, request_id: str, *, requester: str | None = None) -> bool:
    """Whether an existing Karpenter object was made for this request (and, given ``requester``, this team's:
    objects made before the team annotation existed carry none, and are then nobody's to touch)."""
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    if requester is not None and annotations.get(ANNOTATION_REQUESTER) != requester:
        return False
    return annotations.get(ANNOTATION_REQUEST_ID) == request_id


def created_at(obj: Mapping[str, Any] | Any) -> float | None:
    """When the object was made: the API server's ``creationTimestamp`` (nobody can set it), else the steward's
    :data:`ANNOTATION_CREATED_AT`; None when neither reads."""
    meta = (obj or {}).get("metadata") or {}
    stamp = meta.get("creationTimestamp")
    if isinstance(stamp, str) and stamp:
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    value = str((meta.get("annotations") or {}).get(ANNOTATION_CREATED_AT, ""))
    return float(value) if value.isdigit() else None


def gpu_limit(obj: Mapping[str, Any]) -> int | None:
    """The ``nvidia.com/gpu`` a NodePool may grow to (``spec.limits``), None when it has no such limit.

    Raises ValueError for a limit that is not a whole number of GPUs (never read as zero)."""
    limits = ((obj.get("spec") or {}).get("limits")) or {}
    value = limits.get(GPU_LIMIT)
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise ValueError(f"{GPU_LIMIT} limit {text[:40]!r} is not a whole number of GPUs")
    return int(text)

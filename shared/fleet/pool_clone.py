"""The replacement of an unmanaged GPU pool: the same pool, field by field, with a managed GPU profile.

AKS cannot switch a pool to the managed GPU stack in place (``gpuProfile`` is immutable), so the
migration creates a new pool that must be indistinguishable from the old one for the workloads:
same size, placement, network, spot settings, labels, taints, node configuration. This module
decides that body, purely, from the old pool as ARM returned it (Azure/azure-rest-api-specs
specification/containerservice/resource-manager/Microsoft.ContainerService/aks, AgentPools_CreateOrUpdate):

- copied: the fields of :data:`COPIED` (compute, placement and networking, spot, Kubernetes
  metadata, node configuration and security, scaling);
- never copied: read-only fields (:data:`READ_ONLY`), ``nodeImageVersion`` (writable since
  2026-08-01, and writing it rolls a pool back), ``powerState``, ``status``, ``creationData``,
  ``virtualMachineNodesStatus``, ``gpuInstanceProfile`` (MIG pools are never migrated);
- node labels under the reserved prefixes ``kubernetes.azure.com/`` and ``kubernetes.io/`` are
  dropped (AKS sets them itself and refuses them in a request);
- ``gpuProfile`` is set fresh: ``{"driver": "Install", "nvidia": {"managementMode": "Managed"}}``;
- the cluster autoscaler is off (not supported on managed GPU pools during the preview):
  ``enableAutoScaling: false``, no ``minCount``/``maxCount``, and ``count`` = the old pool's
  current count (what runs now) clamped into the old [minCount, maxCount]. The old bounds are kept
  in a tag so that an operator can turn the autoscaler back on once it is supported;
- tags: the old pool's tags plus :data:`TAG_MIGRATED_FROM` (and :data:`TAG_AUTOSCALER` when the
  old pool autoscaled). Azure tag names may not contain ``/``, hence the dashes.

Fields ARM adds that this module does not know are not copied (an allowlist is the safe side: an
unknown field may be read-only); :func:`clone_differences` lists every field that differs and why,
for the plan and for the field-by-field comparison in the tests.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from shared.kernel.ports import PoolInfo

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,11}$")
MANAGED_GPU_PROFILE: Mapping[str, Any] = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
RESERVED_LABEL_PREFIXES: tuple[str, ...] = ("kubernetes.azure.com/", "kubernetes.io/")
TAG_MIGRATED_FROM = "gpu-fleet-steward-migrated-from"
TAG_AUTOSCALER = "gpu-fleet-steward-autoscaler-was"

COPIED: tuple[str, ...] = (
    # compute
    "vmSize", "count", "osType", "osSKU", "osDiskSizeGB", "osDiskType", "kubeletDiskType", "maxPods",
    "mode", "type", "orchestratorVersion",
    # placement and networking
    "availabilityZones", "vnetSubnetID", "podSubnetID", "podIPAllocationMode", "enableNodePublicIP",
    "nodePublicIPPrefixID", "proximityPlacementGroupID", "capacityReservationGroupID", "hostGroupID",
    "networkProfile",
    # spot
    "scaleSetPriority", "scaleSetEvictionPolicy", "spotMaxPrice", "scaleDownMode",
    # Kubernetes metadata
    "nodeLabels", "nodeTaints", "tags",
    # node configuration and security
    "kubeletConfig", "linuxOSConfig", "upgradeSettings", "enableEncryptionAtHost", "enableUltraSSD",
    "enableFIPS", "securityProfile", "workloadRuntime", "messageOfTheDay", "localDNSProfile",
    # scaling (autoscaler forced off, see the module docstring)
    "enableAutoScaling",
)
READ_ONLY: tuple[str, ...] = ("id", "name", "eTag", "currentOrchestratorVersion", "provisioningState")
NEVER_COPIED: Mapping[str, str] = {
    "nodeImageVersion": "writing it rolls a pool back to that image; AKS picks the current one",
    "powerState": "state, not configuration",
    "status": "read-only information",
    "creationData": "a snapshot source applies to the old pool's creation only",
    "virtualMachineNodesStatus": "state, not configuration",
    "gpuInstanceProfile": "MIG pools are not migrated",
    "minCount": "the autoscaler is off on managed GPU pools during the preview",
    "maxCount": "the autoscaler is off on managed GPU pools during the preview",
    "gpuProfile": "set fresh to the managed profile",
}


def _reserved(label: str) -> bool:
    return any(label.startswith(prefix) for prefix in RESERVED_LABEL_PREFIXES)


def replacement_count(old: Mapping[str, Any]) -> int:
    """The old pool's current count, clamped into its autoscaler bounds when it autoscales."""
    count = int(old.get("count") or 0)
    if old.get("enableAutoScaling"):
        low, high = old.get("minCount"), old.get("maxCount")
        if low is not None:
            count = max(count, int(low))
        if high is not None:
            count = min(count, int(high))
    return count


def clone_for_managed(old: PoolInfo, *, new_name: str, count: int | None = None) -> dict[str, Any]:
    """The ``properties`` of the replacement pool (the PUT body is ``{"properties": ...}``).

    ``count`` overrides the node count (the rolling strategy starts the replacement with one batch).
    """
    if not NAME_PATTERN.match(new_name):
        raise ValueError(f"replacement name {new_name!r} does not match {NAME_PATTERN.pattern}")
    props = old.properties
    body: dict[str, Any] = {}
    for key in COPIED:
        if key in props and props[key] is not None:
            body[key] = _copy(props[key])
    if "nodeLabels" in body:
        body["nodeLabels"] = {k: v for k, v in body["nodeLabels"].items() if not _reserved(k)}
    body["enableAutoScaling"] = False
    body["count"] = replacement_count(props) if count is None else count
    body["gpuProfile"] = _copy(MANAGED_GPU_PROFILE)
    tags = dict(body.get("tags") or {})
    tags[TAG_MIGRATED_FROM] = old.name
    if props.get("enableAutoScaling"):
        tags[TAG_AUTOSCALER] = f"{props.get('minCount', '')}-{props.get('maxCount', '')}"
    body["tags"] = tags
    return body


# What a write to an *existing* pool leaves out of the pool's own GET body: state and values ARM
# owns. ``nodeImageVersion`` is writable since 2026-08-01 but writing it rolls the pool back to that
# image (the AgentPool schema's nodeImageVersion, api-version 2026-08-01), and leaving it out keeps the
# current one. Everything else is sent back as
# read, known to this app or not: the PUT is create-or-replace, and a field left out is reset
# (Azure/azure-resource-manager-rpc v1.0/version-change.md, "the GET-PUT pipeline").
NOT_WRITTEN_BACK: frozenset[str] = frozenset({
    "provisioningState", "currentOrchestratorVersion", "eTag", "nodeImageVersion", "status",
    "virtualMachineNodesStatus",
})


def update_properties(old: PoolInfo, **changes: Any) -> dict[str, Any]:
    """The properties of a PUT that changes only ``changes`` of the existing pool ``old``.

    ``old`` must be the pool as read on the api-version that shows all its fields (shared.adapters.aks reads
    pools on the preview one); the caller sends it back on the same (AksClient.begin_put_pool picks
    the preview api-version when the body carries a preview-only field). A change whose value is
    ``None`` removes the field.
    """
    body = {k: _copy(v) for k, v in old.properties.items() if k not in NOT_WRITTEN_BACK and v is not None}
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = _copy(value)
    return body


def frozen_old_pool(old: PoolInfo, *, enable_autoscaling: bool, min_count: int | None = None,
                    max_count: int | None = None) -> dict[str, Any]:
    """The old pool's own body with its autoscaler switched off (or back on), for a PUT.

    The migration stops the autoscaler on the old pool while it drains it, so that it neither adds
    old nodes for pending pods nor fights the rolling strategy's machine deletions. Everything else
    is the old pool's own GET body (:func:`update_properties`: every field, known to this module or
    not, its immutable GPU fields included), so the PUT changes nothing but the scaling. Turning the
    autoscaler off also clears its bounds, as ``az aks nodepool update --disable-cluster-autoscaler``
    does; ``count`` stays what runs now.
    """
    count = int(old.properties.get("count") or 0)
    if enable_autoscaling:
        return update_properties(old, count=count, enableAutoScaling=True, minCount=min_count, maxCount=max_count)
    return update_properties(old, count=count, enableAutoScaling=False, minCount=None, maxCount=None)


def clone_differences(old: PoolInfo, body: Mapping[str, Any]) -> dict[str, str]:
    """Every field of the old pool that the replacement does not carry unchanged, with the reason."""
    props = old.properties
    out: dict[str, str] = {}
    for key in sorted(set(props) | set(body)):
        if key in READ_ONLY:
            out[key] = "read-only"
        elif key in NEVER_COPIED:
            if key in props or key == "gpuProfile":
                out[key] = NEVER_COPIED[key]
        elif key == "nodeLabels":
            dropped = sorted(k for k in (props.get(key) or {}) if _reserved(k))
            if dropped:
                out[key] = f"reserved labels dropped: {', '.join(dropped)}"
        elif key == "tags":
            out[key] = "migration tags added"
        elif key == "enableAutoScaling" and bool(props.get(key)) != bool(body.get(key)):
            out[key] = NEVER_COPIED["minCount"]
        elif key == "count" and props.get(key) != body.get(key):
            out[key] = "clamped into the old autoscaler bounds, or one rolling batch"
        elif key not in COPIED:
            out[key] = "not a known copyable field (allowlist)"
        elif props.get(key) != body.get(key):
            out[key] = "changed"  # never expected: the tests assert this does not happen
    return out


def replacement_name(old_name: str, existing_names: Collection[str]) -> str:
    """A valid, deterministic pool name for the replacement that collides with none of ``existing_names``.

    The old name cut to fit, ``m`` and the smallest number that is free: ``gpu`` -> ``gpum1``,
    ``verylongname1`` -> ``verylongnam1``... (``^[a-z][a-z0-9]{0,11}$``, Linux limit 12).
    """
    taken = {n.lower() for n in existing_names} | {old_name.lower()}
    number = 1
    while (candidate := candidate_name(old_name, number)) in taken:
        number += 1
    return candidate


def candidate_name(old_name: str, number: int) -> str:
    """The replacement name with ``number`` (:func:`replacement_name` takes the first one that is free)."""
    base = re.sub(r"[^a-z0-9]", "", old_name.lower()) or "gpu"
    if not base[0].isalpha():
        base = "p" + base
    suffix = f"m{number}"
    return base[: 12 - len(suffix)] + suffix


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value

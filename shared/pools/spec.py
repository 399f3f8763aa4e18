"""A validated pool request as the AgentPool body ARM expects (pure).

The body is built by hand in ARM's camelCase rather than through SDK models so that exactly the
fields we mean are sent and nothing else:

- ``gpuProfile.driver`` is always sent explicitly (the seed warns that the default install profile
  is documented both ways).
- ``gpuProfile.nvidia`` is sent only for the managed install profile. It is the managed GPU
  experience's block (a preview feature, ``ManagedGPUExperiencePreview``); driver-only and
  no-driver pools carry no ``nvidia`` block at all.
- Managed MIG is sent the way api-version 2026-08-02-preview documents it
  (examples/AgentPoolsCreate_SingleMIG.json): ``nvidia.migStrategy`` plus ``nvidia.migProfiles``,
  and *no* top-level ``gpuInstanceProfile``, which the spec declares mutually exclusive with
  ``migProfiles``. Those fields exist only in preview api-versions, so such a body is PUT with the
  preview api-version (:func:`shared.kernel.definitions.api_version_for`). Classic MIG (a profile without a managed
  strategy, for driver-only pools) keeps the top-level ``gpuInstanceProfile`` of every api-version.

The steward's tags on the pool (request id, requester) are how a later step recognises a pool it
created itself after a crash between "PUT sent" and "record saved".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.kernel.definitions import api_version_for, unrepresentable
from shared.pools.request import PoolRequest
from shared.pools.rules import parse_taint

TAG_REQUEST_ID = "gpu-fleet-steward-request-id"
TAG_REQUESTER = "gpu-fleet-steward-requester"
TAG_CREATED_AT = "gpu-fleet-steward-created-at"  # unix seconds of the PUT: the pool's age as ARM shows it (proof)
TAG_MANAGED_GPU = "EnableManagedGPUExperience"  # the older node-pool tag AgentBaker's CSE reads

AGENTPOOL_LABEL = "kubernetes.azure.com/agentpool"  # the label AKS puts on every node of an agent pool

SPOT_TAINT = "kubernetes.azure.com/scalesetpriority=spot:NoSchedule"  # AKS adds it to every spot pool


def gpu_profile(req: PoolRequest) -> dict[str, Any]:
    """``gpuProfile`` for the request's install profile.

    managed: ``{"driver": "Install", "nvidia": {"managementMode": "Managed"[, "migStrategy", "migProfiles"]}}``;
    driverOnly: ``{"driver": "Install"}``; none: ``{"driver": "None"}`` (no ``nvidia`` block).
    """
    if req.install_profile != "managed":
        return {"driver": req.driver}
    nvidia: dict[str, Any] = {"managementMode": req.management_mode}
    if req.mig_strategy != "None":
        nvidia["migStrategy"] = req.mig_strategy
        if req.mig_profile:
            nvidia["migProfiles"] = [req.mig_profile]
    return {"driver": req.driver, "nvidia": nvidia}


def steward_tags(req: PoolRequest) -> dict[str, str]:
    tags = {TAG_REQUEST_ID: req.request_id, TAG_REQUESTER: req.requester}
    if req.install_profile == "managed":
        tags[TAG_MANAGED_GPU] = "true"
    return tags


def agent_pool_body(req: PoolRequest, *, created_at: float | None = None) -> tuple[dict[str, Any], str]:
    """The AgentPool PUT body ``{"properties": {...}}`` and the api-version to send it on (the first whose
    definition carries every property of it: the preview one for managed MIG).

    ``created_at`` (the time of the PUT) is written as the tag :data:`TAG_CREATED_AT`: later steps act on
    the pool only while ARM shows it young enough to belong to a request in flight (shared.pools.proof)."""
    props: dict[str, Any] = {
        "vmSize": req.vm_size,
        "osType": "Linux",
        "osSKU": req.os_sku,
        "mode": "User",
        "type": "VirtualMachineScaleSets",
        "gpuProfile": gpu_profile(req),
        "nodeTaints": list(req.effective_taints),
        "nodeLabels": dict(req.labels),
        "tags": {**req.tags, **steward_tags(req)},
    }
    if created_at is not None:
        props["tags"][TAG_CREATED_AT] = str(int(created_at))
    if req.autoscale is not None:
        props.update(enableAutoScaling=True, minCount=req.autoscale.min, maxCount=req.autoscale.max,
                     count=req.autoscale.min)
    else:
        props.update(enableAutoScaling=False, count=req.node_count)
    if req.mig_profile and req.mig_strategy == "None":
        props["gpuInstanceProfile"] = req.mig_profile  # classic MIG; managed MIG uses nvidia.migProfiles
    if req.zones:
        props["availabilityZones"] = list(req.zones)
    if req.max_pods is not None:
        props["maxPods"] = req.max_pods
    if req.spot_enabled and req.spot is not None:
        props.update(scaleSetPriority="Spot", scaleSetEvictionPolicy=req.spot.eviction_policy,
                     spotMaxPrice=req.spot.max_price)
    version = api_version_for(props)
    if version is None:  # a request's fields are all the app's own: a definitions file lost one
        raise ValueError(f"no api-version carries {', '.join(unrepresentable(props))}")
    return {"properties": props}, version


def pool_taints(req: PoolRequest) -> list[tuple[str, str, str]]:
    """The taints the pool's nodes will carry, as (key, value, effect): the request's plus spot's."""
    taints = [t for t in (parse_taint(s) for s in req.effective_taints) if t is not None]
    if req.spot_enabled:
        spot = parse_taint(SPOT_TAINT)
        if spot is not None and spot not in taints:
            taints.append(spot)
    return taints


def created_by(properties: Mapping[str, Any], request_id: str, *, requester: str | None = None) -> bool:
    """Whether an existing pool carries this request's tags, i.e. it is the pool this request made.

    ``requester``: the team must match too (two teams may use the same request id; the team's tag tells
    their pools apart, so one team's request never adopts, validates or deletes the other's pool)."""
    tags = properties.get("tags") or {}
    if requester is not None and str(tags.get(TAG_REQUESTER, "")) != requester:
        return False
    return str(tags.get(TAG_REQUEST_ID, "")) == request_id


def created_at(properties: Mapping[str, Any]) -> float | None:
    """When the steward PUT this pool (its :data:`TAG_CREATED_AT`), or None when it carries no readable mark."""
    value = str((properties.get("tags") or {}).get(TAG_CREATED_AT, ""))
    return float(value) if value.isdigit() else None


def spec_differences(properties: Mapping[str, Any], req: PoolRequest) -> list[str]:
    """The immutable facts of an existing pool that differ from the request (empty = same pool)."""
    wanted = agent_pool_body(req)[0]["properties"]
    out: list[str] = []
    if str(properties.get("vmSize", "")).lower() != wanted["vmSize"].lower():
        out.append(f"vmSize is {properties.get('vmSize')!r}, the request asks {wanted['vmSize']!r}")
    have_gpu = properties.get("gpuProfile") or {}
    have_driver = str(have_gpu.get("driver") or "Install")
    have_mode = str((have_gpu.get("nvidia") or {}).get("managementMode") or "Unmanaged")
    have_nvidia = have_gpu.get("nvidia") or {}
    want_gpu = wanted["gpuProfile"]
    # A pool read with a stable api-version does not show migStrategy (a preview field): compare it
    # only when the read shows it.
    have_mig = str(have_nvidia.get("migStrategy") or "None") if "migStrategy" in have_nvidia else \
        want_gpu.get("nvidia", {}).get("migStrategy", "None")
    if have_driver != want_gpu["driver"]:
        out.append(f"gpuProfile.driver is {have_driver!r}, the request asks {want_gpu['driver']!r}")
    want_mode = want_gpu.get("nvidia", {}).get("managementMode", "Unmanaged")
    if have_mode != want_mode:
        out.append(f"managementMode is {have_mode!r}, the request asks {want_mode!r}")
    want_mig = want_gpu.get("nvidia", {}).get("migStrategy", "None")
    if have_mig != want_mig:
        out.append(f"migStrategy is {have_mig!r}, the request asks {want_mig!r}")
    have_profiles = have_nvidia.get("migProfiles") or ([properties["gpuInstanceProfile"]]
                                                       if properties.get("gpuInstanceProfile") else [])
    if "migProfiles" in have_nvidia or properties.get("gpuInstanceProfile"):
        want_profiles = [req.mig_profile] if req.mig_profile else []
        if list(have_profiles) != want_profiles:
            out.append(f"the MIG profile is {list(have_profiles)!r}, the request asks {want_profiles!r}")
    return out


def with_requested_mig(properties: Mapping[str, Any], req: PoolRequest) -> dict[str, Any]:
    """``properties`` with the request's ``migStrategy`` filled in where the read did not show it.

    ARM returns preview fields only on preview api-versions; the strategy is immutable, so what the
    request asked (and ARM accepted) is what the pool has.
    """
    out = dict(properties)
    gpu = dict(out.get("gpuProfile") or {})
    nvidia = dict(gpu.get("nvidia") or {})
    if req.mig_strategy != "None" and "migStrategy" not in nvidia:
        nvidia["migStrategy"] = req.mig_strategy
        gpu["nvidia"] = nvidia
        out["gpuProfile"] = gpu
    return out

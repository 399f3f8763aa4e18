"""Is the GPU stack of this pool working? (pure, over observed nodes)

The seed's "validate the stack" step, as a decision: given the pool as ARM describes it and its
nodes as Kubernetes shows them, list what is not (yet) right. Used by pool creation after the pool
reports Succeeded, and by the migration job for the replacement pool, so the signature is fixed.

What is required depends on what AKS installed (from ``gpuProfile``):

| check | managed | driverOnly | none |
|---|---|---|---|
| ``expected_count`` nodes, every node Ready | yes | yes | yes |
| GPU resource allocatable on every node | yes | no | no |
| DCGM exporter label ``kubernetes.azure.com/dcgm-exporter=enabled`` | yes | no | no |
| NPD conditions ``UnhealthyNvidiaDevicePlugin``/``UnhealthyNvidiaDCGMServices`` present and False | yes | no | no |

Only a managed pool has an AKS device plugin; on driverOnly and none pools the device plugin (and
so ``nvidia.com/gpu``), DCGM and NPD are the team's to install, possibly after the pool exists, so
their absence is not a failure of the pool. What *is* advertised is still reported in
``resources``, and a GPU condition that is present and True is a problem on any pool: a node that
says its GPU is broken is not a working pool, whoever installed the detector.

The GPU resource is ``nvidia.com/gpu`` (MIG strategy None or Single) or any ``nvidia.com/mig-*``
(MIG strategy Mixed). ``nodes`` are the pool's nodes (the caller selects them by label).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.kernel.errors import Invalid
from shared.kernel.ports import NodeView, PoolInfo
from shared.kernel.quantity import whole_units

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DCGM_LABEL = "kubernetes.azure.com/dcgm-exporter"
GPU_CONDITIONS: tuple[str, ...] = ("UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices")


@dataclass(frozen=True)
class StackReport:
    ok: bool
    problems: tuple[str, ...]
    ready_nodes: int
    gpu_allocatable: int  # total GPU resource units (GPUs or MIG instances) across Ready nodes
    resources: Mapping[str, int] = field(default_factory=dict)  # GPU resource name -> total allocatable


@dataclass(frozen=True)
class _Profile:
    managed: bool
    mig_mixed: bool
    install: str  # managed | driverOnly | none


def _profile(pool: PoolInfo) -> _Profile:
    gpu = pool.properties.get("gpuProfile") or {}
    nvidia = gpu.get("nvidia") or {}
    managed = str(nvidia.get("managementMode") or "Unmanaged") == "Managed"
    driver = str(gpu.get("driver") or "Install")
    install = "managed" if managed else ("none" if driver == "None" else "driverOnly")
    return _Profile(managed=managed, mig_mixed=str(nvidia.get("migStrategy") or "None") == "Mixed", install=install)


def _units(text: str) -> int:
    """Whole units of an extended resource (shared.kernel.quantity); 0 for a value that is not a quantity.

    The API server validates quantities, so a malformed one can only come from a forged or broken
    object: it counts as no GPU, which fails the stack check rather than passing it.
    """
    try:
        return whole_units(text)
    except Invalid:
        return 0


def gpu_resources(node: NodeView) -> dict[str, int]:
    """The GPU extended resources a node advertises as allocatable (non-zero only)."""
    out: dict[str, int] = {}
    for name, value in node.allocatable.items():
        if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
            amount = _units(str(value))
            if amount > 0:
                out[name] = amount
    return out


def _node_gpu_units(resources: Mapping[str, int], *, mig_mixed: bool) -> int:
    if mig_mixed:
        return sum(v for k, v in resources.items() if k.startswith(MIG_RESOURCE_PREFIX))
    return resources.get(GPU_RESOURCE, 0)


def evaluate_stack(*, pool: PoolInfo, nodes: Sequence[NodeView], expected_count: int, now: float) -> StackReport:
    """What is wrong with the pool's GPU stack now (``ok`` when nothing is)."""
    profile = _profile(pool)
    problems: list[str] = []
    state = pool.provisioning_state
    if state and state != "Succeeded":
        problems.append(f"pool {pool.name} is {state}, not Succeeded")

    ready = [n for n in sorted(nodes, key=lambda n: n.name) if n.ready]
    if len(ready) < expected_count:
        problems.append(f"{len(ready)} of {expected_count} nodes are Ready")
    for node in sorted(nodes, key=lambda n: n.name):
        if not node.ready:
            cond = node.condition("Ready")
            since = f" for {int(now - cond.last_transition)}s" if cond and cond.last_transition else ""
            problems.append(f"node {node.name} is not Ready{since}")

    totals: dict[str, int] = {}
    for node in ready:
        resources = gpu_resources(node)
        for name, amount in resources.items():
            totals[name] = totals.get(name, 0) + amount
        if profile.managed:
            if _node_gpu_units(resources, mig_mixed=profile.mig_mixed) <= 0:
                wanted = f"{MIG_RESOURCE_PREFIX}*" if profile.mig_mixed else GPU_RESOURCE
                problems.append(f"node {node.name} advertises no allocatable {wanted} (device plugin not ready)")
            if node.labels.get(DCGM_LABEL) != "enabled":
                problems.append(f"node {node.name} lacks the label {DCGM_LABEL}=enabled (DCGM exporter not installed)")
        for type_ in GPU_CONDITIONS:
            cond = node.condition(type_)
            if cond is None:
                if profile.managed:
                    problems.append(f"node {node.name} has no {type_} condition yet (NPD GPU health not reporting)")
            elif cond.status != "False":
                detail = f": {cond.reason}" if cond.reason else ""
                problems.append(f"node {node.name} reports {type_}={cond.status}{detail}")

    total_units = sum(v for k, v in totals.items() if k.startswith(MIG_RESOURCE_PREFIX)) if profile.mig_mixed \
        else totals.get(GPU_RESOURCE, 0)
    return StackReport(ok=not problems, problems=tuple(problems), ready_nodes=len(ready),
                       gpu_allocatable=total_units, resources=totals)

"""VM sizes the simulated fleet knows: vCPUs, memory, GPUs, the quota family, MIG profiles.

Both halves of the simulator need the same facts about a VM size: ARM checks quota (vCPUs per quota
family), GPU rules (``gpuProfile.nvidia`` only on NVIDIA sizes, ``migStrategy`` only on
A100/H100/H200) and capacity; the Kubernetes half gives nodes their ``cpu``, ``memory``,
``nvidia.com/gpu`` and ``nvidia.com/mig-*`` capacity. One table keeps the two consistent.

Sources: learn.microsoft.com/azure/aks/use-nvidia-gpu (the sizes AKS supports for NVIDIA GPUs),
learn.microsoft.com/azure/aks/gpu-multi-instance (the MIG profiles) and the public Azure VM size
pages for vCPU/memory/family. ``max_pods`` is AKS's default for the network the simulated clusters show
(Azure CNI Overlay, 250: learn.microsoft.com/azure/aks/azure-cni-overlay; recorded ``maxPods: 250`` on the
system and GPU pools of tests/replay/recordings/test_aks_create_gpu_driver_flow.json); the scenario may override it
per pool. ``ephemeral_os_disk_gb`` is the OS disk size AKS defaults to with an ephemeral OS disk, known only where
recorded (see :func:`os_disk_defaults`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIG_NAMES = ("MIG1g", "MIG2g", "MIG3g", "MIG4g", "MIG7g")


def _mig(slices: tuple[int, int, int, int, int]) -> dict[str, tuple[str, int]]:
    """MIG profiles from the memory (GB) of each slice: name -> (resource suffix, instances per GPU)."""
    compute = (1, 2, 3, 4, 7)
    per_gpu = (7, 3, 2, 1, 1)
    return {name: (f"{g}g.{mem}gb", n) for name, g, mem, n in zip(MIG_NAMES, compute, slices, per_gpu, strict=True)}


# Memory of each MIG slice (GB) for profiles 1g, 2g, 3g, 4g, 7g, as NVIDIA names the resources.
_A100_40 = _mig((5, 10, 20, 20, 40))
_A100_80 = _mig((10, 20, 40, 40, 80))
_H100_80 = _mig((10, 20, 40, 40, 80))
_H100_NVL = _mig((12, 24, 47, 47, 94))
_H200 = _mig((18, 35, 71, 71, 141))


@dataclass(frozen=True)
class SizeInfo:
    name: str
    vcpus: int
    memory_gib: int
    gpus: int
    gpu_model: str  # "" for sizes without a GPU
    family: str  # the Azure quota family (what QuotaExceeded names)
    nvidia: bool
    mig_capable: bool
    mig_profiles: dict[str, tuple[str, int]] = field(default_factory=dict)  # MIGng -> (suffix, instances/GPU)
    max_pods: int = 250
    ephemeral_os_disk_gb: int | None = None  # AKS's default ephemeral OS disk size; None: not known (recorded only)

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0


def _gpu(name: str, vcpus: int, mem: int, gpus: int, model: str, family: str,
         mig: dict[str, tuple[str, int]] | None = None, *, nvidia: bool = True,
         ephemeral_os_disk_gb: int | None = None) -> SizeInfo:
    return SizeInfo(name=name, vcpus=vcpus, memory_gib=mem, gpus=gpus, gpu_model=model, family=family,
                    nvidia=nvidia, mig_capable=bool(mig), mig_profiles=dict(mig or {}),
                    ephemeral_os_disk_gb=ephemeral_os_disk_gb)


def _cpu(name: str, vcpus: int, mem: int, family: str) -> SizeInfo:
    return SizeInfo(name=name, vcpus=vcpus, memory_gib=mem, gpus=0, gpu_model="", family=family,
                    nvidia=False, mig_capable=False)


_SIZES: tuple[SizeInfo, ...] = (
    # NVIDIA T4 (NCasT4_v3): the minimum recommended GPU size on AKS.
    _gpu("Standard_NC4as_T4_v3", 4, 28, 1, "T4", "standardNCASv3_T4Family"),
    _gpu("Standard_NC8as_T4_v3", 8, 56, 1, "T4", "standardNCASv3_T4Family"),
    _gpu("Standard_NC16as_T4_v3", 16, 110, 1, "T4", "standardNCASv3_T4Family"),
    _gpu("Standard_NC64as_T4_v3", 64, 440, 4, "T4", "standardNCASv3_T4Family"),
    # NVIDIA V100 (NCv3): older, still common.
    # Ephemeral 320 GB by default: recorded (test_aks_create_gpu_driver_flow.json put_agentpool_create_gpu_driver_none).
    _gpu("Standard_NC6s_v3", 6, 112, 1, "V100", "standardNCSv3Family", ephemeral_os_disk_gb=320),
    _gpu("Standard_NC24s_v3", 24, 448, 4, "V100", "standardNCSv3Family"),
    # NVIDIA A100 80GB PCIe (NCads_A100_v4).
    _gpu("Standard_NC24ads_A100_v4", 24, 220, 1, "A100 80GB PCIe", "StandardNCADSA100v4Family", _A100_80),
    _gpu("Standard_NC48ads_A100_v4", 48, 440, 2, "A100 80GB PCIe", "StandardNCADSA100v4Family", _A100_80),
    _gpu("Standard_NC96ads_A100_v4", 96, 880, 4, "A100 80GB PCIe", "StandardNCADSA100v4Family", _A100_80),
    # NVIDIA A100 40GB (NDasrA100_v4) and 80GB (NDm_A100_v4).
    _gpu("Standard_ND96asr_v4", 96, 900, 8, "A100 40GB", "standardNDASv4_A100Family", _A100_40),
    _gpu("Standard_ND96amsr_A100_v4", 96, 1900, 8, "A100 80GB", "standardNDAMSv4_A100Family", _A100_80),
    # NVIDIA H100 NVL (NCads_H100_v5) and H100 80GB (ND_H100_v5).
    _gpu("Standard_NC40ads_H100_v5", 40, 320, 1, "H100 NVL", "StandardNCadsH100v5Family", _H100_NVL),
    _gpu("Standard_NC80adis_H100_v5", 80, 640, 2, "H100 NVL", "StandardNCadsH100v5Family", _H100_NVL),
    _gpu("Standard_ND96isr_H100_v5", 96, 1900, 8, "H100", "standardNDSH100v5Family", _H100_80),
    # NVIDIA H200 (ND_H200_v5).
    _gpu("Standard_ND96isr_H200_v5", 96, 1850, 8, "H200", "standardNDSH200v5Family", _H200),
    # NVIDIA A10 (NVadsA10_v5, whole-GPU sizes).
    _gpu("Standard_NV36ads_A10_v5", 36, 440, 1, "A10", "StandardNVADSA10v5Family"),
    _gpu("Standard_NV72ads_A10_v5", 72, 880, 2, "A10", "StandardNVADSA10v5Family"),
    # NVIDIA GB200 (ND GB200 v6): listed by AgentBaker; MIG on AKS is documented for A100/H100/H200 only.
    _gpu("Standard_ND128isr_NDR_GB200_v6", 128, 900, 4, "GB200", "standardNDGB200v6Family"),
    # AMD (NVv4): has a GPU, but not NVIDIA; AKS does not support it for GPU workloads.
    _gpu("Standard_NV32as_v4", 32, 112, 1, "AMD Radeon Instinct MI25", "standardNVSv4Family", nvidia=False),
    # General purpose.
    _cpu("Standard_DS2_v2", 2, 7, "standardDSv2Family"),
    _cpu("Standard_DS3_v2", 4, 14, "standardDSv2Family"),
    _cpu("Standard_D2s_v3", 2, 8, "standardDSv3Family"),
    _cpu("Standard_D4s_v3", 4, 16, "standardDSv3Family"),
    _cpu("Standard_D8s_v3", 8, 32, "standardDSv3Family"),
    _cpu("Standard_D2s_v5", 2, 8, "standardDSv5Family"),
    _cpu("Standard_D4s_v5", 4, 16, "standardDSv5Family"),
    _cpu("Standard_D8s_v5", 8, 32, "standardDSv5Family"),
    _cpu("Standard_D16s_v5", 16, 64, "standardDSv5Family"),
    _cpu("Standard_D4ds_v5", 4, 16, "standardDDSv5Family"),
    _cpu("Standard_D8ds_v5", 8, 32, "standardDDSv5Family"),
    _cpu("Standard_E8s_v5", 8, 64, "standardESv5Family"),
    _cpu("Standard_B2s", 2, 4, "standardBSFamily"),
)

SIZES: dict[str, SizeInfo] = {s.name.lower(): s for s in _SIZES}


def lookup(vm_size: str | None) -> SizeInfo | None:
    """The size's facts, or None for a size this simulator does not know (ARM then answers 400)."""
    if not vm_size:
        return None
    return SIZES.get(vm_size.lower())


MANAGED_OS_DISK_GB = 128  # AKS's default managed OS disk size (recorded: osDiskSizeGB 128 on the Managed system pools)


def os_disk_defaults(size: SizeInfo | None, props: dict[str, Any]) -> None:
    """Fill in ``osDiskType`` and ``osDiskSizeGB`` where the request left them out, as AKS does.

    The documented rule (learn.microsoft.com/azure/aks/concepts-storage#ephemeral-os-disk): when the request does
    not ask for a managed OS disk, AKS uses an ephemeral one if the VM size supports it and its cache/temp disk holds
    the requested (or default) OS disk size; otherwise a managed one. The simulator knows a size's ephemeral capacity
    only where a recording shows it (``ephemeral_os_disk_gb``: Standard_NC6s_v3 -> Ephemeral, 320 GB, recorded
    test_aks_create_gpu_driver_flow.json put_agentpool_create_gpu_driver_none); every other size keeps a managed
    128 GB disk, as before. Which size AKS picks for an ephemeral disk (the cache size, capped?) is not documented:
    only the recorded value is used (docs/fidelity.md). An explicit ``osDiskType`` is never changed.
    """
    cache = size.ephemeral_os_disk_gb if size is not None else None
    requested = props.get("osDiskSizeGB")
    if props.get("osDiskType") is None:
        fits = cache is not None and (requested is None or (isinstance(requested, int) and requested <= cache))
        props["osDiskType"] = "Ephemeral" if fits else "Managed"
    if requested is None:
        ephemeral = props["osDiskType"] == "Ephemeral" and cache is not None
        props["osDiskSizeGB"] = cache if ephemeral else MANAGED_OS_DISK_GB

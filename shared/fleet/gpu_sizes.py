"""The NVIDIA GPU VM sizes AKS can run as (managed) GPU node pools, and what each one offers.

Validation refuses a pool request before any Azure call when the size is not an NVIDIA GPU size,
when MIG is asked on a GPU that cannot be partitioned, or when a MIG profile does not exist for the
GPU; the stack check and the sample job need to know which resource a node should advertise
(``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>``). Those facts live here, in one table, taken
from Azure/AgentBaker pkg/agent/datamodel/const.go (``NvidiaEnabledSKUs``, ``FabricManagerGPUSizes``) and the
AKS docs https://learn.microsoft.com/azure/aks/use-nvidia-gpu and https://learn.microsoft.com/azure/aks/gpu-multi-instance.

Lookups are case-insensitive because ARM is (``standard_nc4as_t4_v3`` is the same size). Sizes
that are GPU sizes but not NVIDIA (AMD NVv4, NGads V620, MI300X) are known as such so that the
rejection can say *why* they are refused, rather than "unknown size".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# --------------------------------------------------------------------------- MIG


@dataclass(frozen=True)
class MigProfile:
    """One MIG partition shape on one GPU model, e.g. ``MIG1g`` = ``1g.10gb`` x7 on A100 80GB."""

    name: str  # the AKS gpuInstanceProfile: MIG1g | MIG2g | MIG3g | MIG4g | MIG7g
    slice: str  # NVIDIA's profile name, e.g. "1g.10gb"
    instances_per_gpu: int

    @property
    def resource(self) -> str:
        """The extended resource the device plugin advertises with the Mixed strategy."""
        return f"nvidia.com/mig-{self.slice}"


MIG_PROFILE_NAMES: tuple[str, ...] = ("MIG1g", "MIG2g", "MIG3g", "MIG4g", "MIG7g")
_INSTANCES = {"MIG1g": 7, "MIG2g": 3, "MIG3g": 2, "MIG4g": 1, "MIG7g": 1}


def _mig(*slices: str) -> tuple[MigProfile, ...]:
    """Profiles for one GPU model from its five NVIDIA slice names, in MIG1g..MIG7g order."""
    return tuple(MigProfile(name, slice_, _INSTANCES[name]) for name, slice_ in zip(MIG_PROFILE_NAMES, slices, strict=True))


# Memory per slice differs per GPU model; the compute slices (1g..7g) do not.
_MIG_A100_40GB = _mig("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_MIG_A100_80GB = _mig("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_MIG_H100_80GB = _mig("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_MIG_H100_NVL = _mig("1g.12gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")
_MIG_H200 = _mig("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")


# --------------------------------------------------------------------------- sizes


class Vendor(StrEnum):
    NVIDIA = "nvidia"
    AMD = "amd"


@dataclass(frozen=True)
class GpuSize:
    """One VM size. ``gpus`` is the number of GPU devices the VM sees (1 for a fractional vGPU)."""

    name: str  # canonical spelling, e.g. "Standard_NC4as_T4_v3"
    series: str  # e.g. "NCasT4_v3"
    gpu_model: str  # e.g. "T4", "A100 80GB"
    gpus: int
    vcpus: int
    family: str  # the compute quota family, e.g. "standardNCASv3_T4Family"
    vendor: Vendor = Vendor.NVIDIA
    mig_profiles: tuple[MigProfile, ...] = ()
    gpu_fraction: float = 1.0  # share of one physical GPU per device (A10 vGPU sizes)

    @property
    def is_nvidia(self) -> bool:
        return self.vendor is Vendor.NVIDIA

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile | None:
        for profile in self.mig_profiles:
            if profile.name.lower() == name.lower():
                return profile
        return None


def _nv(name: str, series: str, model: str, gpus: int, vcpus: int, family: str,
        mig: tuple[MigProfile, ...] = (), fraction: float = 1.0) -> GpuSize:
    return GpuSize(name, series, model, gpus, vcpus, family, Vendor.NVIDIA, mig, fraction)


def _amd(name: str, series: str, model: str, gpus: int, vcpus: int, family: str) -> GpuSize:
    return GpuSize(name, series, model, gpus, vcpus, family, Vendor.AMD)


_T4 = "standardNCASv3_T4Family"
_NCA100 = "StandardNCADSA100v4Family"
_NCH100 = "StandardNCadsH100v5Family"
_NVA10 = "StandardNVADSA10v5Family"
_NCA10 = "StandardNCADSA10v4Family"
_RTX = "StandardNCdsRTXPRO6000BSEv6XLFamily"

CATALOGUE: tuple[GpuSize, ...] = (
    # NCasT4_v3: the minimum recommended size for AKS GPU pools.
    _nv("Standard_NC4as_T4_v3", "NCasT4_v3", "T4", 1, 4, _T4),
    _nv("Standard_NC8as_T4_v3", "NCasT4_v3", "T4", 1, 8, _T4),
    _nv("Standard_NC16as_T4_v3", "NCasT4_v3", "T4", 1, 16, _T4),
    _nv("Standard_NC64as_T4_v3", "NCasT4_v3", "T4", 4, 64, _T4),
    # NCads_A100_v4: A100 80GB PCIe.
    _nv("Standard_NC24ads_A100_v4", "NCads_A100_v4", "A100 80GB", 1, 24, _NCA100, _MIG_A100_80GB),
    _nv("Standard_NC48ads_A100_v4", "NCads_A100_v4", "A100 80GB", 2, 48, _NCA100, _MIG_A100_80GB),
    _nv("Standard_NC96ads_A100_v4", "NCads_A100_v4", "A100 80GB", 4, 96, _NCA100, _MIG_A100_80GB),
    # NDasrA100_v4: A100 40GB SXM (the gpu-multi-instance.md example: 1g.5gb x7 ...).
    _nv("Standard_ND96asr_v4", "NDasrA100_v4", "A100 40GB", 8, 96, "standardNDASv4_A100Family", _MIG_A100_40GB),
    # NDm_A100_v4: A100 80GB SXM.
    _nv("Standard_ND96amsr_A100_v4", "NDm_A100_v4", "A100 80GB", 8, 96, "standardNDAMSv4_A100Family", _MIG_A100_80GB),
    # NCads_H100_v5: H100 NVL (94GB).
    _nv("Standard_NC40ads_H100_v5", "NCads_H100_v5", "H100 NVL", 1, 40, _NCH100, _MIG_H100_NVL),
    _nv("Standard_NC80adis_H100_v5", "NCads_H100_v5", "H100 NVL", 2, 80, _NCH100, _MIG_H100_NVL),
    # ND_H100_v5 / ND_H200_v5.
    _nv("Standard_ND96isr_H100_v5", "ND_H100_v5", "H100 80GB", 8, 96, "standardNDSH100v5Family", _MIG_H100_80GB),
    _nv("Standard_ND96isr_H200_v5", "ND_H200_v5", "H200", 8, 96, "standardNDISRH200V5Family", _MIG_H200),
    # A10: vGPU sizes (GRID / converged driver); fractional sizes see one device.
    _nv("Standard_NV6ads_A10_v5", "NVadsA10_v5", "A10", 1, 6, _NVA10, fraction=1 / 6),
    _nv("Standard_NV12ads_A10_v5", "NVadsA10_v5", "A10", 1, 12, _NVA10, fraction=1 / 3),
    _nv("Standard_NV18ads_A10_v5", "NVadsA10_v5", "A10", 1, 18, _NVA10, fraction=1 / 2),
    _nv("Standard_NV36ads_A10_v5", "NVadsA10_v5", "A10", 1, 36, _NVA10),
    _nv("Standard_NV36adms_A10_v5", "NVadsA10_v5", "A10", 1, 36, _NVA10),
    _nv("Standard_NV72ads_A10_v5", "NVadsA10_v5", "A10", 2, 72, _NVA10),
    _nv("Standard_NC8ads_A10_v4", "NCads_A10_v4", "A10", 1, 8, _NCA10, fraction=1 / 3),
    _nv("Standard_NC16ads_A10_v4", "NCads_A10_v4", "A10", 1, 16, _NCA10, fraction=1 / 2),
    _nv("Standard_NC32ads_A10_v4", "NCads_A10_v4", "A10", 1, 32, _NCA10),
    # RTX PRO 6000 Blackwell Server Edition (GRID v20).
    _nv("Standard_NC144ds_xl_RTXPRO6000BSE_v6", "NC_RTXPRO6000BSE_v6", "RTX PRO 6000", 1, 144, _RTX),
    _nv("Standard_NC144lds_xl_RTXPRO6000BSE_v6", "NC_RTXPRO6000BSE_v6", "RTX PRO 6000", 1, 144, _RTX),
    _nv("Standard_NC288ds_xl_RTXPRO6000BSE_v6", "NC_RTXPRO6000BSE_v6", "RTX PRO 6000", 2, 288, _RTX),
    _nv("Standard_NC288lds_xl_RTXPRO6000BSE_v6", "NC_RTXPRO6000BSE_v6", "RTX PRO 6000", 2, 288, _RTX),
    # ND GB200 v6.
    _nv("Standard_ND128isr_NDR_GB200_v6", "ND_GB200_v6", "GB200", 4, 128, "standardNDISRGB200V6NDRFamily"),
    # NCv3 (V100): retired by Azure in 2025 but still in AgentBaker's NVIDIA list; kept so that
    # existing pools of this size are recognised (e.g. by the migration job).
    _nv("Standard_NC6s_v3", "NCv3", "V100", 1, 6, "standardNCSv3Family"),
    _nv("Standard_NC12s_v3", "NCv3", "V100", 2, 12, "standardNCSv3Family"),
    _nv("Standard_NC24s_v3", "NCv3", "V100", 4, 24, "standardNCSv3Family"),
    _nv("Standard_NC24rs_v3", "NCv3", "V100", 4, 24, "standardNCSv3Family"),
    # AMD GPU sizes: known so the rejection can name the reason (managed GPU pools are NVIDIA only).
    _amd("Standard_NV4as_v4", "NVv4", "Radeon Instinct MI25", 1, 4, "standardNVASv4Family"),
    _amd("Standard_NV8as_v4", "NVv4", "Radeon Instinct MI25", 1, 8, "standardNVASv4Family"),
    _amd("Standard_NV16as_v4", "NVv4", "Radeon Instinct MI25", 1, 16, "standardNVASv4Family"),
    _amd("Standard_NV32as_v4", "NVv4", "Radeon Instinct MI25", 1, 32, "standardNVASv4Family"),
    _amd("Standard_NG8ads_V620_v1", "NGads_V620", "Radeon PRO V620", 1, 8, "StandardNGadsV620v1Family"),
    _amd("Standard_NG16ads_V620_v1", "NGads_V620", "Radeon PRO V620", 1, 16, "StandardNGadsV620v1Family"),
    _amd("Standard_NG32ads_V620_v1", "NGads_V620", "Radeon PRO V620", 1, 32, "StandardNGadsV620v1Family"),
    _amd("Standard_ND96isr_MI300X_v5", "ND_MI300X_v5", "MI300X", 8, 96, "standardNDISv5MI300XFamily"),
)

_BY_NAME: dict[str, GpuSize] = {size.name.lower(): size for size in CATALOGUE}

# Every Azure GPU size is in the N family (NC, ND, NV, NG); anything else is a general-purpose size.
_AZURE_SIZE = re.compile(r"^standard_[a-z][a-z0-9_\-]*$", re.IGNORECASE)
_GPU_FAMILY = re.compile(r"^standard_n", re.IGNORECASE)


class SizeKind(StrEnum):
    NVIDIA = "nvidia"
    AMD = "amd"
    NOT_GPU = "not-gpu"  # a well-formed Azure size outside the N family (D, E, F, B, ...)
    UNKNOWN = "unknown"  # an N-family size this catalogue does not know, or not a size at all


def lookup(size: str) -> GpuSize | None:
    """The catalogue entry for ``size`` (any case), NVIDIA or AMD; None when not a known GPU size."""
    return _BY_NAME.get(size.strip().lower())


def classify(size: str) -> SizeKind:
    """Why a size is or is not acceptable for a managed GPU pool."""
    known = lookup(size)
    if known is not None:
        return SizeKind.NVIDIA if known.is_nvidia else SizeKind.AMD
    if _AZURE_SIZE.match(size) and not _GPU_FAMILY.match(size):
        return SizeKind.NOT_GPU
    return SizeKind.UNKNOWN


def nvidia_sizes() -> tuple[GpuSize, ...]:
    return tuple(size for size in CATALOGUE if size.is_nvidia)

"""VM size facts for the model (vCPUs, memory, GPUs, MIG profiles): sim.core.gpu_catalog when it knows the
size, else a small private table of the GPU sizes the scenarios use, else a guess from the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class _Size:
    name: str
    vcpus: int
    memory_gib: float
    gpus: int = 0
    gpu_model: str = ""
    family: str = ""
    nvidia: bool = False
    mig_capable: bool = False
    mig_profiles: dict[str, tuple[str, int]] = field(default_factory=dict)


_MIG_A100_40 = {"MIG1g": ("1g.5gb", 7), "MIG2g": ("2g.10gb", 3), "MIG3g": ("3g.20gb", 2), "MIG4g": ("4g.20gb", 1),
                "MIG7g": ("7g.40gb", 1)}

_MIG_80 = {"MIG1g": ("1g.10gb", 7), "MIG2g": ("2g.20gb", 3), "MIG3g": ("3g.40gb", 2), "MIG4g": ("4g.40gb", 1),
           "MIG7g": ("7g.80gb", 1)}

_FALLBACK_SIZES = {s.name.lower(): s for s in (
    _Size("Standard_NC4as_T4_v3", 4, 28, 1, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC8as_T4_v3", 8, 56, 1, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC16as_T4_v3", 16, 110, 1, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC64as_T4_v3", 64, 440, 4, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC24ads_A100_v4", 24, 220, 1, "A100", "StandardNCADSA100v4Family", True, True, _MIG_80),
    _Size("Standard_NC48ads_A100_v4", 48, 440, 2, "A100", "StandardNCADSA100v4Family", True, True, _MIG_80),
    _Size("Standard_NC96ads_A100_v4", 96, 880, 4, "A100", "StandardNCADSA100v4Family", True, True, _MIG_80),
    _Size("Standard_ND96asr_v4", 96, 900, 8, "A100", "standardNDASv4_A100Family", True, True, _MIG_A100_40),
    _Size("Standard_ND96amsr_A100_v4", 96, 1900, 8, "A100", "standardNDAMSv4_A100Family", True, True, _MIG_80),
    _Size("Standard_NC40ads_H100_v5", 40, 320, 1, "H100", "standardNCadsH100v5Family", True, True, _MIG_80),
    _Size("Standard_ND96isr_H100_v5", 96, 1900, 8, "H100", "standardNDSH100v5Family", True, True, _MIG_80),
)}


def size_info(vm_size: str) -> Any:
    """Facts about a VM size: sim.core.gpu_catalog when present, else a small private table, else the name."""
    try:
        from sim.core import gpu_catalog  # type: ignore[attr-defined]

        info = gpu_catalog.lookup(vm_size)
        if info is not None:
            return info
    except ImportError:
        pass
    known = _FALLBACK_SIZES.get(vm_size.lower())
    if known:
        return known
    m = re.search(r"_[A-Z]+?(\d+)", vm_size)
    vcpus = int(m.group(1)) if m else 2
    return _Size(vm_size, vcpus, float(vcpus * 4), family="standardDSv5Family")


def gpu_sizes() -> list[Any]:
    """The NVIDIA sizes known to the catalogue (for node auto-provisioning)."""
    try:
        from sim.core import gpu_catalog  # type: ignore[attr-defined]

        sizes = getattr(gpu_catalog, "SIZES", None)
        if sizes:
            values = sizes.values() if isinstance(sizes, dict) else sizes
            return sorted((s for s in values if getattr(s, "nvidia", False)), key=lambda s: (s.vcpus, s.name))
    except ImportError:
        pass
    return sorted((s for s in _FALLBACK_SIZES.values() if s.nvidia), key=lambda s: (s.vcpus, s.name))

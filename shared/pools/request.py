"""Pool request schema version 1: the message a team sends, as typed structs (pure).

The wire shape is camelCase (``schemaVersion``, ``vmSize``); the structs use snake_case with
msgspec's ``rename="camel"``. Types are checked strictly (``"3"`` is not a count) and unknown fields
are refused, field by field (shared.pools.validation), so that a typo (``"vmsize"``) is named rather
than silently ignored. The JSON Schema in schemas/pool-request.v1.json documents the same shape for
callers; docs/pool-requests.md explains each field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

SCHEMA_VERSION = "1"
KNOWN_SCHEMA_VERSIONS: tuple[str, ...] = (SCHEMA_VERSION,)

InstallProfile = Literal["managed", "driverOnly", "none"]
MigStrategy = Literal["None", "Single", "Mixed"]
MigProfileName = Literal["MIG1g", "MIG2g", "MIG3g", "MIG4g", "MIG7g"]


class Autoscale(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    min: int
    max: int


class Mig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    strategy: MigStrategy = "None"
    profile: MigProfileName | None = None


class Spot(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    enabled: bool = True
    max_price: float = -1.0  # -1 = pay up to the on-demand price
    eviction_policy: Literal["Delete", "Deallocate"] = "Delete"


class PoolRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """Pool request schema version 1 (see docs/pool-requests.md)."""

    schema_version: Literal["1"]
    request_id: str
    requester: str
    cluster: str
    pool_name: str
    vm_size: str
    count: int | None = None
    autoscale: Autoscale | None = None
    os_type: Literal["Linux", "Windows"] = "Linux"
    os_sku: Literal["Ubuntu", "AzureLinux"] = "Ubuntu"
    install_profile: InstallProfile = "managed"
    gpu_driver: Literal["Install", "None"] | None = None
    mig: Mig | None = None
    taints: tuple[str, ...] | None = None
    labels: dict[str, str] = {}
    zones: tuple[str, ...] = ()
    max_pods: int | None = None
    spot: Spot | None = None
    tags: dict[str, str] = {}
    validate_workload: bool = False

    # ------------------------------------------------------------------ derived, for the builders

    @property
    def driver(self) -> str:
        """``gpuProfile.driver``: managed and driverOnly install it, none does not."""
        return "None" if self.install_profile == "none" else "Install"

    @property
    def management_mode(self) -> str:
        return "Managed" if self.install_profile == "managed" else "Unmanaged"

    @property
    def mig_strategy(self) -> str:
        return self.mig.strategy if self.mig else "None"

    @property
    def mig_profile(self) -> str | None:
        return self.mig.profile if self.mig else None

    @property
    def node_count(self) -> int:
        """Nodes the pool starts with (``autoscale.min`` for an autoscaled pool)."""
        if self.count is not None:
            return self.count
        return self.autoscale.min if self.autoscale else 0

    @property
    def spot_enabled(self) -> bool:
        return bool(self.spot and self.spot.enabled)

    @property
    def effective_taints(self) -> tuple[str, ...]:
        return self.taints or ()


# ------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a request: where, what, and what to do about it."""

    field: str  # JSON path, e.g. "mig.profile" or "labels[\"kubernetes.io/x\"]"; "$" = the whole message
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem} ({self.fix})"

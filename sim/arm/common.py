"""What every part of the simulated AKS resource provider shares: the api-versions and what each one's
agent-pool schema has, ARM's error shape, and a pool's properties as one api-version sees them.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from sim.core.http import Response
from sim.identity.tokens import AKS_AUDIENCES

AKS_SERVER_APP_ID = AKS_AUDIENCES[0]

KUBELOGIN_CLIENT_ID = "80faf920-1908-4b52-b5ef-a8e7bedfc67a"

POOL_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")

WINDOWS_POOL_NAME_MAX = 6

MAX_COUNT = 1000


@dataclass(frozen=True)
class AksApiVersion:
    """What one Microsoft.ContainerService api-version has in its agent-pool GPU schema."""

    name: str
    nvidia: bool = False  # gpuProfile.nvidia.managementMode
    mig_strategy: bool = False  # nvidia.migStrategy
    driver_mode: bool = False  # nvidia.driverMode
    mig_profiles: bool = False  # nvidia.migProfiles
    driver_type: bool = False  # gpuProfile.driverType

    @property
    def preview(self) -> bool:
        return self.name.endswith("-preview")


AKS_API_VERSIONS: dict[str, AksApiVersion] = {v.name: v for v in (
    AksApiVersion("2025-10-01"),
    AksApiVersion("2026-01-02-preview", nvidia=True, mig_strategy=True, driver_type=True),
    AksApiVersion("2026-07-01"),
    AksApiVersion("2026-08-01", nvidia=True),
    AksApiVersion("2026-08-02-preview", nvidia=True, mig_strategy=True, driver_mode=True, mig_profiles=True,
                  driver_type=True),
)}

# azure-mgmt-compute 39.0.0 sends 2026-04-01 for VMSS VM operations; older ones for other callers.
COMPUTE_API_VERSIONS = ("2024-07-01", "2024-11-01", "2025-04-01", "2026-04-01")

# Microsoft.Features (azure-rest-api-specs specification/resources/resource-manager/Microsoft.Features/stable/);
# `az feature show/register` sends 2021-07-01.
FEATURES_API_VERSIONS = ("2015-12-01", "2021-07-01", "2025-03-01")

MANAGED_GPU_FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"

# Registered on every subscription unless its scenario says otherwise (subscriptions[].features).
DEFAULT_FEATURES: dict[str, str] = {MANAGED_GPU_FEATURE: "Registered"}

POOL_TYPE = "Microsoft.ContainerService/managedClusters/agentPools"

NODE_IMAGE = "AKSUbuntu-2204gen2containerd-202611.05.0"


class ArmError(Exception):
    def __init__(self, status: int, code: str, message: str, *, target: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.target = target
        self.headers = headers or {}

    def response(self) -> Response:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            err["target"] = self.target
        return Response.json(self.status, {"error": err}, self.headers)


def invalid(message: str, target: str) -> ArmError:
    """ARM's 400 ``InvalidParameter`` naming the property at fault."""
    return ArmError(400, "InvalidParameter", message, target=target)


def project(properties: dict[str, Any], api: AksApiVersion) -> dict[str, Any]:
    """``properties`` as ``api`` sees them: every property the version's AgentPool definition lacks is dropped,
    at every depth (shared.kernel.definitions, derived from the SDK's models of that api-version). The
    versions the app never speaks (2025-10-01, 2026-01-02-preview, 2026-07-01) have no derived definition
    here: for them only the GPU fields their flags name are dropped (docs/fidelity.md)."""
    from shared.kernel import definitions

    if api.name in definitions.API_VERSIONS:
        return definitions.definitions(api.name).keep_known(copy.deepcopy(properties))
    props = copy.deepcopy(properties)
    gp = props.get("gpuProfile")
    if isinstance(gp, dict):
        if not api.driver_type:
            gp.pop("driverType", None)
        nvidia = gp.get("nvidia")
        if not api.nvidia:
            gp.pop("nvidia", None)
        elif isinstance(nvidia, dict):
            for flag, key in ((api.mig_strategy, "migStrategy"), (api.driver_mode, "driverMode"),
                              (api.mig_profiles, "migProfiles")):
                if not flag:
                    nvidia.pop(key, None)
    return props


def key_lookup(table: dict[Any, int], key: tuple[str, ...]) -> int | None:
    """A quota/capacity entry whatever the case of its key parts."""
    if key in table:
        return table[key]
    low = tuple(k.lower() for k in key)
    for k, v in table.items():
        if tuple(str(x).lower() for x in k) == low:
            return v
    return None


def key_adjust(table: dict[Any, int], key: tuple[str, ...], delta: int) -> None:
    """Add ``delta`` (never below 0) to a quota/capacity entry whatever the case of its key parts."""
    low = tuple(k.lower() for k in key)
    for k in list(table):
        if tuple(str(x).lower() for x in k) == low:
            table[k] = max(0, int(table[k]) + delta)
            return

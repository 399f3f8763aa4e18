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
    """An error answer in ARM's wrapped shape, ``{"error": {"code", "message", "target"?}}``: what ARM's own
    gateway sends and what resource providers that follow the ARM RPC error contract send (Microsoft.Compute,
    Microsoft.Features, Microsoft.ResourceHealth). Raise :class:`GatewayError` for ARM's own refusals and
    :class:`AksError` for the AKS resource provider's (flat); plain ``ArmError`` is for those other providers.
    """

    flat = False

    def __init__(self, status: int, code: str, message: str, *, target: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.target = target
        self.headers = headers or {}

    def response(self) -> Response:
        if self.flat:
            return Response.aks_error(self.status, self.code, self.message, self.headers, target=self.target)
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            err["target"] = self.target
        return Response.json(self.status, {"error": err}, self.headers)


class GatewayError(ArmError):
    """An error of ARM's gateway (front door), before or instead of the resource provider: authentication and
    authorization (401/403 ``AuthenticationFailed``, ``InvalidAuthenticationToken*``, ``AuthorizationFailed``,
    ``LinkedAuthorizationFailed``, deny assignments), api-version and routing errors, an unreadable body, 429
    throttling, and 404 ``ResourceNotFound`` for a top-level resource (a managed cluster, a scale set) or a
    resource group that does not exist. Wrapped: recorded as
    ``{"error": {"code": "ResourceNotFound", "message": "The Resource 'Microsoft.ContainerService/managedClusters/
    <name>' under resource group '<rg>' was not found. For more details please go to
    https://aka.ms/ARMResourceNotFoundFix"}}`` (tests/replay/recordings/*.json, every ``get_cluster_404``; the
    recorded header ``x-ms-failure-cause: gateway``)."""


class AksError(ArmError):
    """An error of the AKS resource provider itself (Microsoft.ContainerService behind ARM): flat,
    ``{"code", "message", "subcode": "", "details": null}``. Everything about an existing cluster's child
    resources and the rules of a write: an agent pool, machine, maintenance configuration or operation not found,
    ``InvalidParameter``, ``OperationNotAllowed``, ``PropertyChangeNotAllowed``, ``PreconditionFailed``,
    ``ErrCode_InsufficientVCPUQuota``.

    Source of the shape: no AKS RP error is in the recordings (tests/replay/recordings/README.md, finding 1);
    third-party logs of AKS answers show exactly ``{"code": "ErrCode_InsufficientVCPUQuota", "details": null,
    "message": "...", "subcode": ""}`` (docs/fidelity.md). ``target`` is added when the error names the property at
    fault: the Azure CLI prints AKS's errors with a ``Target:`` line (e.g. ``agentPoolProfile.name``); whether it
    sits in the flat body exactly so is not recorded (docs/fidelity.md)."""

    flat = True


def invalid(message: str, target: str) -> ArmError:
    """The AKS resource provider's 400 ``InvalidParameter`` naming the property at fault (flat)."""
    return AksError(400, "InvalidParameter", message, target=target)


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


def recorded_pool_defaults(props: dict[str, Any]) -> None:
    """Defaults AKS fills on every agent pool, as recorded (tests/replay/recordings/test_aks_create_gpu_driver_flow.json:
    list_agentpools and put_agentpool_create_gpu_driver_none, api-version 2026-07-01): security profile off,
    no host encryption, FIPS or Ultra SSD, scale-down by deleting. Applied by an ARM create
    (sim/arm/validation.py ``_defaults``) and to a scenario's pools (sim/scenario.py ``pool_properties``) alike,
    so a PUT that leaves them out changes nothing."""
    props.setdefault("enableEncryptionAtHost", False)
    props.setdefault("enableFIPS", False)
    props.setdefault("enableUltraSSD", False)
    props.setdefault("scaleDownMode", "Delete")
    security = props.setdefault("securityProfile", {})
    if isinstance(security, dict):
        security.setdefault("enableVTPM", False)
        security.setdefault("enableSecureBoot", False)


def present_pool(props: dict[str, Any]) -> dict[str, Any]:
    """A pool's properties as AKS answers them: what a request sent but AKS does not echo is left out
    (recorded: put_agentpool_create_gpu_driver_none sent ``nodeTaints: []``, ``scaleSetPriority: Regular``,
    ``scaleSetEvictionPolicy: Delete`` and ``spotMaxPrice: -1``; neither its 201 nor any later GET or list
    carries them). Spot pools keep all three (they are what makes them spot)."""
    if props.get("nodeTaints") == []:
        props.pop("nodeTaints")
    if str(props.get("scaleSetPriority") or "Regular") == "Regular":
        for key in ("scaleSetPriority", "scaleSetEvictionPolicy", "spotMaxPrice"):
            props.pop(key, None)
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

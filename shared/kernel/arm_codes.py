"""What Azure Resource Manager's error codes mean, decided on codes alone.

An ARM refusal (an HTTP error) and a resource's own error field (a pool's
``status.provisioningError``, a failed operation's ``error``) share one shape, the ARM RPC's
ErrorDetail (Azure/azure-resource-manager-rpc v1.0/common-api-details.md, "Error Response Content").
The ARM adapter maps refusals through these functions at the edge (shared.adapters.arm); a job that
reads a resource's error field uses the same ones, so both arrive at the same error type and the
core only ever matches types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from shared.kernel.errors import (
    AllocationFailed,
    FeatureNotRegistered,
    Invalid,
    LinkedAuthorizationFailed,
    QuotaExceeded,
    StewardError,
)

QUOTA_CODES = frozenset({"QuotaExceeded", "InsufficientVCPUQuota", "ErrCode_InsufficientVCPUQuota"})
"""vCPU quota: AKS's pre-flight ``InsufficientVCPUQuota`` (surfaced by some clients as
``ErrCode_InsufficientVCPUQuota``) and Compute's ``QuotaExceeded`` (usually inside a deployment error)."""
ALLOCATION_CODES = frozenset({"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                              "OverconstrainedZonalAllocationRequest", "SkuNotAvailable"})
"""No capacity for the size in the region/zone (Compute's allocation errors, passed on by AKS)."""
FEATURE_CODES = frozenset({"PreviewFeatureNotRegistered", "FeatureNotRegistered"})
"""AKS: "Preview feature Microsoft.ContainerService/X not registered." (code PreviewFeatureNotRegistered)."""
LINKED_AUTH_CODES = frozenset({"LinkedAuthorizationFailed", "LinkedInvalidPropertyId"})
"""ARM: the caller may not use a resource the body links to (subnet join, public IP prefix, PPG)."""
INVALID_CODES = frozenset({
    "OperationNotAllowed", "InvalidParameter", "BadRequest", "PropertyChangeNotAllowed",
    "InvalidTemplateDeployment", "DeploymentFailed",
}) | QUOTA_CODES | ALLOCATION_CODES | FEATURE_CODES
"""ARM error codes that are answers about the request itself, whatever the HTTP status says."""
_FEATURE_NAME = re.compile(r"\b(Microsoft\.[A-Za-z]+/[A-Za-z0-9]+)\b")


def error_codes(detail: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every ``code`` of an ARM ErrorDetail, its own first, then those of its ``details[]`` (depth first).

    AKS reports Compute's refusal inside a deployment error, e.g. ``{"code": "InvalidTemplateDeployment",
    "details": [{"code": "QuotaExceeded", ...}]}`` (MicrosoftDocs/azure-docs#62378, mspnp/aks-baseline#377).
    """
    out: list[str] = []

    def walk(d: Any, depth: int) -> None:
        if not isinstance(d, Mapping) or depth > 5:
            return
        if d.get("code"):
            out.append(str(d["code"]))
        for sub in d.get("details") or ():
            walk(sub, depth + 1)

    walk(detail, 0)
    return tuple(out)


def classify_arm_error(codes: Sequence[str], message: str) -> StewardError | None:
    """The specific error of an ARM refusal whose codes (top level and details) say what it is; None
    when none does. Decided on codes only; the message is carried, and read only to name the feature."""
    for c in codes:
        if c in FEATURE_CODES:
            named = _FEATURE_NAME.search(message)
            return FeatureNotRegistered(message, code=c, feature=named.group(1) if named else None)
    for c in codes:
        if c in LINKED_AUTH_CODES:
            return LinkedAuthorizationFailed(message, code=c)
    for c in codes:
        if c in QUOTA_CODES:
            return QuotaExceeded(message, code=c)
    for c in codes:
        if c in ALLOCATION_CODES:
            return AllocationFailed(message, code=c)
    return None


def error_of_detail(detail: Mapping[str, Any] | None) -> StewardError:
    """An ARM ErrorDetail (a failed operation's ``error``, a pool's ``status.provisioningError``) as
    the specific error its codes name (QuotaExceeded, LinkedAuthorizationFailed...), else
    :class:`Invalid` with its own code."""
    detail = detail or {}
    message = str(detail.get("message") or "")
    codes = error_codes(detail)
    specific = classify_arm_error(codes, message)
    if specific is not None:
        return specific
    code = codes[0] if codes else "ProvisioningFailed"
    return Invalid(message or code, code=code)

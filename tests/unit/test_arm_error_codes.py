"""Issue 10, AKS/ARM 7: ARM refusals become specific error types chosen by *code*, never by message text.

The adapter (shared.adapters.arm.map_arm_error) reads ARM's ``error.code`` and the codes of ``error.details[]``
(AKS wraps Compute's refusal in a deployment error), so the core can ``except QuotaExceeded`` instead
of searching a message for "quota". The error bodies below are the real shapes: AKS's pre-flight
``InsufficientVCPUQuota`` (1ChristianAlex/motordesk#14), Compute's ``QuotaExceeded`` inside
``InvalidTemplateDeployment`` (MicrosoftDocs/azure-docs#62378), ``PreviewFeatureNotRegistered``
(hashicorp/terraform-provider-azurerm#13684) and ARM's ``LinkedAuthorizationFailed``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError

from shared.adapters.arm import map_arm_error
from shared.kernel.arm_codes import error_of_detail
from shared.kernel.errors import (
    AllocationFailed,
    Conflict,
    FeatureNotRegistered,
    Forbidden,
    Invalid,
    LinkedAuthorizationFailed,
    OperationInProgress,
    QuotaExceeded,
    StewardError,
)


class _Response:
    """The little of an azure-core HTTP response that HttpResponseError reads."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status_code = status
        self.reason = "error"
        self.headers = {"Content-Type": "application/json"}
        self.content_type = "application/json"
        self.request = None
        self._text = json.dumps(body)

    def text(self, encoding: str | None = None) -> str:
        return self._text

    def json(self) -> Any:
        return json.loads(self._text)

    def body(self) -> bytes:
        return self._text.encode()


def arm_error(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> HttpResponseError:
    err: dict[str, Any] = {"code": code, "message": message}
    if details:
        err["details"] = details
    return HttpResponseError(response=_Response(status, {"error": err}))


QUOTA_MESSAGE = ("Operation could not be completed as it results in exceeding approved Total Regional Cores quota. "
                 "Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 4, "
                 "Current Usage: 4, Additional Required: 2, (Minimum) New Limit Required: 6.")


@pytest.mark.parametrize(("error", "kind", "code"), [
    pytest.param(arm_error(400, "InsufficientVCPUQuota", "Insufficient vcpu quota requested 8, remaining 0 for family "
                                                         "standardNCASv3_T4Family for region eastus."),
                 QuotaExceeded, "InsufficientVCPUQuota", id="AKS pre-flight InsufficientVCPUQuota"),
    pytest.param(arm_error(400, "InvalidTemplateDeployment", "The template deployment 'x' is not valid according to "
                                                             "the validation procedure. See inner errors for details.",
                           [{"code": "QuotaExceeded", "message": QUOTA_MESSAGE}]),
                 QuotaExceeded, "QuotaExceeded", id="QuotaExceeded wrapped in a deployment error"),
    pytest.param(arm_error(409, "QuotaExceeded", QUOTA_MESSAGE), QuotaExceeded, "QuotaExceeded",
                 id="QuotaExceeded with a 409 is still an answer"),
    pytest.param(arm_error(400, "DeploymentFailed", "At least one resource deployment operation failed.",
                           [{"code": "ZonalAllocationFailed", "message": "Allocation failed."}]),
                 AllocationFailed, "ZonalAllocationFailed", id="allocation failure inside a deployment error"),
    pytest.param(arm_error(400, "PreviewFeatureNotRegistered",
                           "Preview feature Microsoft.ContainerService/ManagedGPUExperiencePreview not registered."),
                 FeatureNotRegistered, "PreviewFeatureNotRegistered", id="preview feature not registered"),
    pytest.param(arm_error(403, "LinkedAuthorizationFailed", "The client has permission to perform action "
                                                             "'Microsoft.ContainerService/managedClusters/agentPools/"
                                                             "write'; however, it does not have permission to perform "
                                                             "action 'Microsoft.Network/virtualNetworks/subnets/join/"
                                                             "action' on the linked scope(s)."),
                 LinkedAuthorizationFailed, "LinkedAuthorizationFailed", id="linked authorization"),
])
def test_arm_refusals_map_to_specific_error_types_by_code(error: HttpResponseError, kind: type[StewardError],
                                                          code: str) -> None:
    mapped = map_arm_error(error, what="put pool gpu")
    assert type(mapped) is kind
    assert mapped.code == code  # type: ignore[union-attr]


def test_the_specific_types_still_are_the_general_ones_the_core_already_catches() -> None:
    assert issubclass(QuotaExceeded, Invalid) and issubclass(AllocationFailed, Invalid)
    assert issubclass(FeatureNotRegistered, Invalid) and issubclass(LinkedAuthorizationFailed, Forbidden)
    assert issubclass(OperationInProgress, Conflict)


def test_the_unregistered_feature_is_named_for_the_requester() -> None:
    mapped = map_arm_error(arm_error(400, "PreviewFeatureNotRegistered", "Preview feature "
                                     "Microsoft.ContainerService/ManagedGPUExperiencePreview not registered."), what="x")
    assert isinstance(mapped, FeatureNotRegistered)
    assert mapped.feature == "Microsoft.ContainerService/ManagedGPUExperiencePreview"


def test_another_operation_in_progress_is_operation_in_progress_whatever_its_message() -> None:
    mapped = map_arm_error(arm_error(409, "OperationNotAllowed", "Operation is not allowed: Another agentpool "
                                     "operation (gpu - Scaling) is in progress"), what="x")
    assert isinstance(mapped, OperationInProgress)
    worded_differently = map_arm_error(arm_error(409, "OperationNotAllowed", "Busy."), what="x")
    assert isinstance(worded_differently, OperationInProgress)


@pytest.mark.parametrize("message", ["The quota of family X is fine, but the name is bad", "quota", "allocation"])
def test_message_text_alone_never_makes_a_quota_or_allocation_error(message: str) -> None:
    mapped = map_arm_error(arm_error(400, "InvalidParameter", message), what="x")
    assert type(mapped) is Invalid and mapped.code == "InvalidParameter"


def test_a_failed_pools_provisioning_error_is_classified_by_its_innermost_code() -> None:
    detail = {"code": "InvalidTemplateDeployment", "message": "Provisioning of resource(s) for Agent Pool gpu failed.",
              "details": [{"code": "QuotaExceeded", "message": QUOTA_MESSAGE}]}
    specific = error_of_detail(detail)
    assert isinstance(specific, QuotaExceeded) and specific.code == "QuotaExceeded"
    plain = error_of_detail({"code": "VMExtensionProvisioningError", "message": "the CSE failed"})
    assert type(plain) is Invalid and plain.code == "VMExtensionProvisioningError"
    linked = error_of_detail({"code": "InvalidTemplateDeployment", "message": "failed",
                              "details": [{"code": "LinkedAuthorizationFailed", "message": "no join on the subnet"}]})
    assert isinstance(linked, LinkedAuthorizationFailed) and linked.code == "LinkedAuthorizationFailed"


def test_a_401_is_unauthorized_and_a_403_is_only_forbidden() -> None:
    from shared.kernel.errors import Unauthorized

    expired = map_arm_error(arm_error(401, "ExpiredAuthenticationToken", "The access token expiry UTC time is earlier "
                                                                         "than current UTC time."), what="get cluster")
    denied = map_arm_error(arm_error(403, "AuthorizationFailed", "The client does not have authorization to perform "
                                                                 "action over scope."), what="get cluster")
    assert isinstance(expired, Unauthorized) and isinstance(expired, Forbidden)
    assert isinstance(denied, Forbidden) and not isinstance(denied, Unauthorized)

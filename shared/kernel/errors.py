"""The few errors the core understands.

Adapters translate SDK exceptions (azure-core, kubernetes, azure-data-tables) into these at the
edge, so that decisions and state machines never depend on a client library's exception zoo.
Only :class:`Throttled` and :class:`Transient` are worth retrying; everything else is an answer.
"""

from __future__ import annotations


class StewardError(Exception):
    """Base of every error the core raises on purpose."""


class Throttled(StewardError):
    """The server asked us to slow down (HTTP 429); ``retry_after`` is its hint in seconds."""

    def __init__(self, message: str = "throttled", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Transient(StewardError):
    """A failure that may pass by itself: 5xx, a dropped connection, a timeout."""

    def __init__(self, message: str = "transient failure", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Conflict(StewardError):
    """Someone else changed the thing first (HTTP 409/412, an ETag or resourceVersion mismatch)."""


class NotFound(StewardError):
    """The thing does not exist (any more)."""


class Forbidden(StewardError):
    """We are not allowed to do this (HTTP 401/403): a configuration problem, never retried."""


class Unauthorized(Forbidden):
    """The server did not accept our credentials (HTTP 401): the token expired early, was revoked, or
    is for another audience. The Kubernetes adapter fetches one fresh token and tries once more on it;
    anything that still answers 401 is a configuration problem like any other :class:`Forbidden`."""


class Invalid(StewardError):
    """The request was refused as invalid (HTTP 400/422, ARM validation); ``code`` is Azure's."""

    def __init__(self, reason: str, *, code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


RETRYABLE: tuple[type[StewardError], ...] = (Throttled, Transient)


# --------------------------------------------------------------------------- specific answers from Azure
# The adapters (shared/adapters/arm.py map_arm_error) choose these from ARM's error *code* (and the codes of
# its details[]), never from message text, so the core can catch what it means: ``except
# QuotaExceeded`` instead of searching a message for "quota". Each one subclasses the general type it
# refines, so code that catches Invalid / Forbidden / Conflict keeps working.


class Unwritable(Invalid):
    """A write was not sent because no api-version the app speaks carries every property of its body
    (shared.kernel.definitions): sent anyway, the properties it lacks would silently not be written.
    ``fields`` names them."""

    def __init__(self, message: str, *, fields: list[str]) -> None:
        super().__init__(message, code="Unwritable")
        self.fields = fields


class QuotaExceeded(Invalid):
    """Not enough vCPU quota for the request.

    AKS refuses a pool write up front with ``InsufficientVCPUQuota`` ("Insufficient vcpu quota
    requested N, remaining M for family F for region R"); Compute refuses a VM scale set deployment
    with ``QuotaExceeded``, which AKS passes on wrapped in a deployment error
    (``InvalidTemplateDeployment`` / ``DeploymentFailed`` with ``details[].code == QuotaExceeded``).
    Raising the quota or asking for fewer vCPUs are the only ways out; retrying does not help.
    """


class AllocationFailed(Invalid):
    """Azure has no capacity for the size in the region or zone (``AllocationFailed``,
    ``ZonalAllocationFailed``, ``OverconstrainedAllocationRequest``, ``SkuNotAvailable``...): it may
    pass later, or with another size or zone, but not on an immediate retry."""


class FeatureNotRegistered(Invalid):
    """A preview feature the request needs is not registered on the subscription.

    AKS answers ``PreviewFeatureNotRegistered`` ("Preview feature Microsoft.ContainerService/X not
    registered."). ``feature`` is ``Namespace/Name`` when the adapter could tell which one.
    """

    def __init__(self, reason: str, *, code: str | None = None, feature: str | None = None) -> None:
        super().__init__(reason, code=code)
        self.feature = feature


class LinkedAuthorizationFailed(Forbidden):
    """ARM refused a write because the caller lacks a permission on a *linked* resource (a subnet's
    ``join/action``, a public IP prefix, a proximity placement group) named in the request body."""

    def __init__(self, reason: str, *, code: str | None = "LinkedAuthorizationFailed") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class OperationInProgress(Conflict):
    """AKS refused a write because another operation runs on the pool or cluster
    (``OperationNotAllowed`` ... "in progress", or ``AgentPoolOperationInProgress``): wait, then retry."""


class VmActionDenied(Forbidden):
    """Azure refused a VM action (restart, reimage) on authorization grounds (403): missing RBAC, a deny
    assignment such as AKS node resource group lockdown (``DenyAssignmentAuthorizationFailed``), or an
    Azure Policy deny; ``code`` is ARM's error code. The repair ladder escalates to the AKS API."""

    def __init__(self, message: str, *, code: str | None) -> None:
        super().__init__(message)
        self.code = code


class VmActionImpossible(Invalid):
    """The VM cannot take this action in its current state (409 ``OperationNotAllowed``): a deallocated
    spot VM, but also a VM in the middle of another operation, so the caller judges by the node."""


# --------------------------------------------------------------------------- specific answers from Kubernetes
# The Kubernetes adapter (shared/adapters/kube/errors.py map_kube_error) chooses these from the status code
# and the Status body's ``reason`` / ``details.causes[].reason``, never from message text.


class NamespaceTerminating(Forbidden):
    """A create in a namespace being deleted was refused (403, cause ``NamespaceTerminating``: the
    NamespaceLifecycle admission plugin, staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle).
    Nothing is wrong with our permissions: the namespace is going away. The Eviction API's answer of the
    same kind is not raised but classified (``EvictionResult`` outcome ``namespace_terminating``)."""

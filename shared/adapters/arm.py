"""The one way the adapters call Azure Resource Manager, and what ARM's refusals mean.

Every ARM-backed adapter (Microsoft.ContainerService in :mod:`shared.adapters.aks`, Microsoft.Compute in
:mod:`shared.adapters.compute`, and the Event Grid publisher in :mod:`shared.adapters.events`, which speaks
azure-core too) builds its SDK clients with :func:`arm_client_options` and runs each SDK call through
:func:`call_arm`, which translates azure-core exceptions at the edge (:func:`map_arm_error`):

- 429 is :class:`Throttled` and 408/5xx :class:`Transient`, both with the server's ``Retry-After``
  (seconds, an HTTP date or ``retry-after-ms``): only those are retried, by :mod:`shared.kernel.retry`.
- A refusal is refined by ARM's error *code*, and the codes of ``details[]`` (AKS puts Compute's
  error inside a deployment error), into QuotaExceeded / AllocationFailed / FeatureNotRegistered /
  LinkedAuthorizationFailed / OperationInProgress (shared.kernel.errors); 401 is :class:`Unauthorized`.
  The core catches types, it never searches message text: the message is carried, and read here only
  to name the preview feature to register.

Error shape: the ARM RPC's error response contract
(Azure/azure-resource-manager-rpc v1.0/common-api-details.md, "Error Response Content").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from shared.kernel.arm_codes import INVALID_CODES, classify_arm_error, error_codes
from shared.kernel.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    OperationInProgress,
    StewardError,
    Throttled,
    Transient,
    Unauthorized,
)

if TYPE_CHECKING:
    from shared.settings import Settings

T = TypeVar("T")



# --------------------------------------------------------------------------- clients


def arm_client_options(settings: Settings) -> dict[str, Any]:
    """Options every ARM management client gets: our endpoint and audience, our CA bundle, and no
    retries of its own (shared.kernel.retry decides what is worth retrying, honouring Retry-After)."""
    options: dict[str, Any] = {
        "base_url": settings.arm_endpoint,
        "credential_scopes": [settings.arm_scope],
        "retry_total": 0,
        "connection_timeout": 10,
        "read_timeout": 60,
    }
    if settings.ca_bundle:
        options["connection_verify"] = settings.ca_bundle
    return options


# --------------------------------------------------------------------------- error mapping


def retry_after_seconds(response: Any) -> float | None:
    """The server's Retry-After hint in seconds (seconds or an HTTP date), if any."""
    headers = getattr(response, "headers", None) or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        ms = headers.get("retry-after-ms") or headers.get("x-ms-retry-after-ms")
        try:
            return float(ms) / 1000.0 if ms is not None else None
        except ValueError:
            return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        import time
        from email.utils import parsedate_to_datetime

        # An HTTP date is the server's wall clock, so the delay is measured on the wall clock too.
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _error_body(error: Any) -> Mapping[str, Any] | None:
    """ARM's ``{"error": {...}}`` object of an HttpResponseError, from the response body."""
    response = getattr(error, "response", None)
    try:
        body = response.json() if response is not None else None
    except Exception:  # a non-JSON error body (a proxy's HTML page): keep the status only
        return None
    if isinstance(body, Mapping):
        inner = body.get("error")
        return inner if isinstance(inner, Mapping) else body
    return None


def arm_error_code_and_message(error: Any) -> tuple[str | None, str]:
    """ARM's ``error.code`` and ``error.message`` from an HttpResponseError (body or parsed model)."""
    odata = getattr(error, "error", None)
    code = getattr(odata, "code", None)
    message = getattr(odata, "message", None)
    if not code:
        inner = _error_body(error)
        if inner is not None:
            code = inner.get("code") or code
            message = inner.get("message") or message
    text = str(message or getattr(error, "reason", "") or error)
    return (str(code) if code else None), text.strip()[:1000]


def _sdk_error_codes(error: Any, code: str | None) -> tuple[str, ...]:
    inner = _error_body(error)
    codes = error_codes(inner) if inner is not None else ()
    if not codes:
        odata = getattr(error, "error", None)
        codes = tuple(str(c) for c in [getattr(odata, "code", None)] + [getattr(d, "code", None) for d in
                                                                        (getattr(odata, "details", None) or ())] if c)
    return codes or ((code,) if code else ())


def map_arm_error(error: BaseException, *, what: str) -> StewardError | None:
    """Translate an azure-core exception into a shared.kernel.errors one; None when it is not an SDK error."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(error, StewardError):
        return error
    if isinstance(error, (ServiceRequestError, ServiceResponseError)):
        return Transient(f"{what}: connection failed ({type(error).__name__}: {str(error)[:200]})")
    if isinstance(error, HttpResponseError):
        status = error.status_code
        code, message = arm_error_code_and_message(error)
        label = f"{what}: {status} {code or ''} {message}".replace("  ", " ")
        if status is None:
            if isinstance(error, ClientAuthenticationError):
                # The credential could not get a token (identity endpoint down or misconfigured).
                return Transient(f"{what}: no token: {str(error)[:300]}")
            return Transient(label)
        if status == 429:
            return Throttled(label, retry_after=retry_after_seconds(error.response))
        if status == 408 or status >= 500:
            return Transient(label, retry_after=retry_after_seconds(error.response))
        specific = classify_arm_error(_sdk_error_codes(error, code), message or label)
        if specific is not None:
            return specific
        if status == 409:
            # AKS answers 409 OperationNotAllowed while another operation runs on the pool or
            # cluster: that passes by itself (looked at again later), it is not an answer about us.
            return OperationInProgress(label)
        if status == 412:
            return Conflict(label)  # If-Match: someone else wrote first
        if code in INVALID_CODES:
            return Invalid(message or label, code=code)
        if status == 401:
            return Unauthorized(label)
        if status == 403:
            return Forbidden(label)
        if status == 404:
            return NotFound(label)
        return Invalid(message or label, code=code)
    if isinstance(error, ValueError) and "token" in str(error).lower():
        return Forbidden(f"{what}: {error}")  # e.g. bearer tokens refused over plain http
    return None


def call_arm(fn: Callable[[], T], *, what: str) -> T:
    """Run one SDK call, translating its exceptions."""
    try:
        return fn()
    except Exception as error:
        mapped = map_arm_error(error, what=what)
        if mapped is None or mapped is error:
            raise
        raise mapped from error


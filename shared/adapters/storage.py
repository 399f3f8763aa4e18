"""Clients of the host's storage account (the ledger's table, the nudge queue), built one way, and
their errors translated one way (:func:`map_table_error`).

Locally (Azurite) the settings carry a connection string; in Azure the account is reached by
identity (``AzureWebJobsStorage__*`` settings: the account's table/queue URI and, optionally, the
client id of a user-assigned identity, else the app's own). The SDK's own retries are off: shared.kernel.retry
decides what is retried, honouring Retry-After, on the injected clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shared.kernel.errors import Conflict, Forbidden, Invalid, NotFound, StewardError, Throttled, Transient, Unauthorized

if TYPE_CHECKING:
    from shared.settings import Settings

TRANSPORT_OPTIONS: dict[str, Any] = {"retry_total": 0, "connection_timeout": 10, "read_timeout": 30}


def storage_client(client_cls: Any, settings: Settings, *, url_keyword: str, url: str, **names: Any) -> Any:
    """``client_cls`` (``TableClient``, ``QueueClient``...) for ``names`` (``table_name=``, ``queue_name=``...).

    ``url_keyword``/``url``: how the class takes the account endpoint when connecting by identity
    (``endpoint=`` for tables, ``account_url=`` for queues)."""
    options = {**TRANSPORT_OPTIONS, **names}
    if settings.storage_connection_string:
        return client_cls.from_connection_string(settings.storage_connection_string, **options)
    from shared.adapters.identity import credential_for

    credential = credential_for(settings.storage_client_id or settings.azure_client_id or None,
                                managed_identity=settings.managed_identity_available)
    return client_cls(**{url_keyword: url}, credential=credential, **options)


def _retry_after(error: Any) -> float | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name in ("Retry-After", "retry-after", "x-ms-retry-after-ms"):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            continue
        return seconds / 1000.0 if name.endswith("-ms") else seconds
    return None


def map_table_error(error: Exception, *, what: str) -> StewardError | None:
    """Translate an azure-core / azure-data-tables / azure-storage-queue exception into a shared.kernel.errors
    one (None: not ours)."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceExistsError,
        ResourceModifiedError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(error, ResourceExistsError):
        return Conflict(f"{what}: already exists")
    if isinstance(error, ResourceModifiedError):
        return Conflict(f"{what}: changed by someone else (ETag mismatch)")
    if isinstance(error, ResourceNotFoundError):
        return NotFound(f"{what}: not found")
    if isinstance(error, ClientAuthenticationError):
        if error.status_code == 401:
            return Unauthorized(f"{what}: not authorised ({error.status_code})")
        return Forbidden(f"{what}: not authorised ({error.status_code})")
    if isinstance(error, (ServiceRequestError, ServiceResponseError)):
        return Transient(f"{what}: connection failed: {type(error).__name__}")
    if isinstance(error, HttpResponseError):
        status = error.status_code or 0
        code = getattr(error, "error_code", None)
        if status == 429:
            return Throttled(f"{what}: throttled", retry_after=_retry_after(error))
        if status in (409,):
            return Conflict(f"{what}: conflict ({code})")
        if status == 412:
            return Conflict(f"{what}: changed by someone else (ETag mismatch)")
        if status == 404:
            return NotFound(f"{what}: not found ({code})")
        if status == 401:
            return Unauthorized(f"{what}: not authorised ({status} {code})")
        if status == 403:
            return Forbidden(f"{what}: not authorised ({status} {code})")
        if status == 408 or status >= 500:
            return Transient(f"{what}: storage answered {status} ({code})", retry_after=_retry_after(error))
        return Invalid(f"{what}: storage refused the request ({status} {code})", code=str(code) if code else None)
    return None

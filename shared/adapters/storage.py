"""Clients of the host's storage account (the ledger's table, the nudge queue), built one way.

Locally (Azurite) the settings carry a connection string; in Azure the account is reached by
identity (``AzureWebJobsStorage__*`` settings: the account's table/queue URI and, optionally, the
client id of a user-assigned identity, else the app's own). The SDK's own retries are off: shared.kernel.retry
decides what is retried, honouring Retry-After, on the injected clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

"""One Azure credential per process (per client id), chosen the way the platform expects.

In Azure (and under the local host, which points ``IDENTITY_ENDPOINT`` at the simulator) the app
is a user-assigned managed identity: ``ManagedIdentityCredential(client_id=AZURE_CLIENT_ID)``. On a
laptop against a real subscription, ``DefaultAzureCredential`` (environment, workload identity,
Azure CLI...) without interactive prompts. Credentials cache their tokens, so building one per
call would defeat the cache and hammer the identity endpoint: they are cached here.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

    from shared.settings import Settings

_lock = threading.Lock()
_credentials: dict[tuple[str, bool], Any] = {}


def credential_for(client_id: str | None, *, managed_identity: bool = False) -> TokenCredential:
    """The process-wide credential for ``client_id``.

    A managed identity is used when the platform offers one (``managed_identity``: IDENTITY_ENDPOINT or
    MSI_ENDPOINT is set) or a client id is given; otherwise DefaultAzureCredential.
    """
    use_managed = managed_identity or bool(client_id)
    key = (client_id or "", use_managed)
    with _lock:
        cached = _credentials.get(key)
        if cached is not None:
            return cached
        if use_managed:
            from azure.identity import ManagedIdentityCredential

            credential: Any = ManagedIdentityCredential(client_id=client_id or None)
        else:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential(exclude_interactive_browser_credential=True)
        _credentials[key] = credential
        return credential


def get_credential(settings: Settings) -> TokenCredential:
    """The app's own identity (AZURE_CLIENT_ID), for ARM, the clusters and Event Grid."""
    return credential_for(settings.azure_client_id or None, managed_identity=settings.managed_identity_available)


def reset() -> None:
    """Forget the cached credentials (tests that switch identity endpoints)."""
    with _lock:
        _credentials.clear()

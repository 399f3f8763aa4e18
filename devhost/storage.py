"""Queue clients for a binding's ``connection``, built the way the Functions host resolves them.

A connection name is an app-setting prefix: either the setting itself holds a connection string
(Azurite locally, ``UseDevelopmentStorage=true``), or ``<name>__queueServiceUri`` (with optional
``__clientId``) names an identity-based connection, as in Azure. The host handles message encoding
itself (base64 by default), so the clients are created without encode/decode policies.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from typing import Any

from devhost.settings import SettingsError


class QueueClients:
    """Cached QueueClients per (connection, queue)."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self._settings = settings
        self._services: dict[str, Any] = {}
        self._queues: dict[tuple[str, str], Any] = {}
        self._created: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _service(self, connection: str) -> Any:
        from azure.storage.queue import QueueServiceClient

        with self._lock:
            client = self._services.get(connection)
            if client is not None:
                return client
            settings = {**os.environ, **self._settings}  # the host's settings are the process environment
            value = settings.get(connection, "")
            uri = settings.get(f"{connection}__queueServiceUri", "")
            if value:
                client = QueueServiceClient.from_connection_string(value)
            elif uri:
                from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

                client_id = settings.get(f"{connection}__clientId", "")
                credential = (ManagedIdentityCredential(client_id=client_id)
                              if settings.get(f"{connection}__credential", "").lower() == "managedidentity"
                              else DefaultAzureCredential(managed_identity_client_id=client_id or None))
                client = QueueServiceClient(account_url=uri, credential=credential)
            else:
                raise SettingsError(f"connection {connection!r}: neither setting {connection} (a connection string) "
                                    f"nor {connection}__queueServiceUri is set")
            self._services[connection] = client
            return client

    def queue(self, connection: str, name: str) -> Any:
        key = (connection, name)
        with self._lock:
            client = self._queues.get(key)
        if client is None:
            client = self._service(connection).get_queue_client(name)
            with self._lock:
                self._queues[key] = client
        return client

    def ensure(self, connection: str, name: str) -> Any:
        """The queue client, creating the queue on first use (as output bindings and the poison path do)."""
        from azure.core.exceptions import ResourceExistsError

        client = self.queue(connection, name)
        if (connection, name) not in self._created:
            with contextlib.suppress(ResourceExistsError):
                client.create_queue()
            with self._lock:
                self._created.add((connection, name))
        return client

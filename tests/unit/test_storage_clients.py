"""The ledger's table and the nudge queue connect as the settings say, with the SDK's retries off.

Locally a connection string (Azurite); in Azure the account URI and a managed identity: the one named
by ``AzureWebJobsStorage__clientId`` when set, else the app's own. Real SDK clients are built (no
request is sent) and their endpoint, credential and retry policy read back.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shared.adapters import identity
from shared.adapters.ledger import TableLedger
from shared.adapters.nudge_queue import QueueNudger

AZURITE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
           "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
           "TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;")
STORAGE_ID = "00000000-0000-0000-0000-0000000000aa"
APP_ID = "00000000-0000-0000-0000-0000000000bb"


def settings(*, connection: str = "", storage_id: str = "", app_id: str = APP_ID) -> Any:
    return SimpleNamespace(storage_connection_string=connection, storage_client_id=storage_id,
                           azure_client_id=app_id, managed_identity_available=True,
                           storage_table_uri="https://stfleet.table.core.windows.net",
                           storage_queue_uri="https://stfleet.queue.core.windows.net",
                           ledger_table="stewardledger", nudge_queue="steward-nudges")


@pytest.fixture(autouse=True)
def fresh_credentials() -> Any:
    identity.reset()
    yield
    identity.reset()


def _clients(s: Any) -> tuple[Any, Any]:
    return TableLedger.from_settings(s)._table, QueueNudger.from_settings(s)._queue


def _retry_total(client: Any) -> int:
    """``total_retries`` of the retry policy in the client's pipeline (azure-core's policy chain)."""
    pipeline = client._client._client._pipeline if hasattr(client._client, "_client") else client._pipeline
    [retry] = [p for p in (getattr(q, "_policy", q) for q in pipeline._impl_policies) if "Retry" in type(p).__name__]
    return int(retry.total_retries)


@pytest.mark.parametrize(("storage_id", "expected"), [(STORAGE_ID, STORAGE_ID), ("", APP_ID)],
                         ids=["the-storage-identity", "the-apps-identity"])
def test_in_azure_the_account_uri_and_a_managed_identity_are_used(storage_id: str, expected: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TableLedger, "_ensure_table", lambda self: None)
    table, queue = _clients(settings(storage_id=storage_id))
    assert table.url.startswith("https://stfleet.table.core.windows.net") and table.table_name == "stewardledger"
    assert queue.url.startswith("https://stfleet.queue.core.windows.net/steward-nudges")
    for client in (table, queue):
        assert type(client.credential).__name__ == "ManagedIdentityCredential"
        assert client.credential is identity.credential_for(expected, managed_identity=True)
        assert _retry_total(client) == 0


def test_locally_the_connection_string_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TableLedger, "_ensure_table", lambda self: None)
    table, queue = _clients(settings(connection=AZURITE))
    assert table.url.startswith("http://127.0.0.1:10002/devstoreaccount1")
    assert queue.url.startswith("http://127.0.0.1:10001/devstoreaccount1/steward-nudges")
    assert type(queue._message_encode_policy).__name__ == "TextBase64EncodePolicy"  # what the queue trigger decodes
    assert _retry_total(table) == 0 and _retry_total(queue) == 0

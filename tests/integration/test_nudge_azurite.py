"""The delayed nudge against Azure Queue storage (Azurite): hidden until due, then readable by the host.

What the reconciler's unit tests take on trust from :class:`tests.fakes.nudge.RecordingNudger` is checked
here on the real client and service: the visibility timeout is set (the message is not delivered
early), the body decodes as host.json's ``messageEncoding: base64`` says, a missing queue is
created, and a storage failure comes back as a project error the reconciler can log and ignore.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from devhost.queues import decode_body
from shared.adapters.nudge_queue import QueueNudger
from shared.kernel.clock import ManualClock
from shared.kernel.errors import StewardError
from tests.waiting import wait_until

AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _settings(connection: str, queue: str) -> Any:
    return SimpleNamespace(storage_connection_string=connection, nudge_queue=queue, storage_queue_uri="",
                           storage_client_id="", azure_client_id="", managed_identity_available=False)


def _receive(connection: str, queue: str) -> list[Any]:
    client = QueueClient.from_connection_string(connection, queue)
    return list(client.receive_messages(max_messages=32, visibility_timeout=30))


def test_a_nudge_stays_invisible_until_its_time_and_then_carries_the_hint(
        storage_connection_string: str, names: Any) -> None:
    queue = names.queue("nudge")
    clock = ManualClock(1_764_684_000.0)
    nudger = QueueNudger.from_settings(_settings(storage_connection_string, queue), clock=clock)
    sent = time.monotonic()
    nudger.nudge_at(clock.now() + 3.0, hint="pool-request:r1")  # the queue does not exist yet: created on first send

    assert _receive(storage_connection_string, queue) == []  # hidden, though it is there:
    props = QueueClient.from_connection_string(storage_connection_string, queue).get_queue_properties()
    assert props.approximate_message_count == 1

    messages: list[Any] = wait_until(lambda: _receive(storage_connection_string, queue), interval=0.2,
                                     timeout=sent + 10.0 - time.monotonic(), what="the nudge to become visible")
    visible_after = time.monotonic() - sent
    assert len(messages) == 1, "the nudge never became visible"
    assert 2.5 <= visible_after <= 6.0
    assert decode_body(messages[0].content, "base64") == b"pool-request:r1"


def test_a_nudge_for_a_time_already_past_is_visible_at_once(storage_connection_string: str, names: Any) -> None:
    queue = names.queue("nudge")
    clock = ManualClock(1_764_684_000.0)
    QueueNudger.from_settings(_settings(storage_connection_string, queue), clock=clock).nudge_at(
        clock.now() - 10.0, hint="remediation:n1")
    assert [decode_body(m.content, "base64") for m in _receive(storage_connection_string, queue)] == [b"remediation:n1"]


def test_storage_that_cannot_be_reached_is_a_project_error_not_a_crash(names: Any) -> None:
    unreachable = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                   f"AccountKey={AZURITE_KEY};QueueEndpoint=http://127.0.0.1:9/devstoreaccount1")
    nudger = QueueNudger.from_settings(_settings(unreachable, names.queue("nudge")), clock=ManualClock())
    with pytest.raises(StewardError):
        nudger.nudge_at(ManualClock().now() + 30.0, hint="migration:m1")

"""Host processes: two instances share a queue; a crashed instance's message comes back to the other."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient

from devhost.processes import HostProcess
from tests.waiting import poll, wait_until

FAKE_APP = Path(__file__).resolve().parent / "fake_app"


def _settings(connection: str, queues: dict[str, str]) -> dict[str, str]:
    return {"AzureWebJobsStorage": connection, "TICK_SCHEDULE": "0 0 0 1 1 *", **queues}


def _host(settings: dict[str, str], tmp_path: Path, name: str, **kwargs: Any) -> HostProcess:
    return HostProcess(settings, app_dir=FAKE_APP, subscriptions=FAKE_APP / "eventgrid_subscriptions.json",
                       name=name, work_dir=tmp_path, **kwargs)


def _queue(connection: str, name: str) -> QueueClient:
    client = QueueClient.from_connection_string(connection, name)
    with contextlib.suppress(ResourceExistsError):
        client.create_queue()
    return client


def _send(client: QueueClient, body: dict[str, Any]) -> None:
    client.send_message(base64.b64encode(json.dumps(body).encode()).decode())


def _drained(client: QueueClient, timeout: float) -> bool:
    return bool(poll(lambda: client.get_queue_properties().approximate_message_count == 0, timeout=timeout,
                     interval=0.1))


def test_two_host_processes_share_the_work_of_one_queue(storage_connection_string: str, queues: dict[str, str],
                                                        tmp_path: Path) -> None:
    settings = _settings(storage_connection_string, queues)
    client = _queue(storage_connection_string, queues["WORK_QUEUE"])
    first, second = _host(settings, tmp_path, "first").start(), _host(settings, tmp_path, "second").start()
    try:
        for n in range(12):
            _send(client, {"n": n})
        assert _drained(client, 30)
    finally:
        stats = [first.stop(), second.stop()]
    assert sum(s["functions"]["work"]["succeeded"] for s in stats) == 12
    assert sum(s["functions"]["work"]["failed"] for s in stats) == 0


def test_a_message_held_by_a_crashed_host_is_processed_by_another_after_its_lease(
        storage_connection_string: str, queues: dict[str, str], tmp_path: Path) -> None:
    settings = _settings(storage_connection_string, queues)
    client = _queue(storage_connection_string, queues["WORK_QUEUE"])
    doomed = _host(settings, tmp_path, "doomed", queue_lease_s=2).start()
    _send(client, {"sleep_on_first_delivery": 60})
    wait_until(lambda: "Executing 'Functions.work'" in doomed.log(), timeout=20, what="the doomed host to take the message")
    doomed.kill()  # mid-invocation: the message is neither deleted nor released
    assert doomed.stats() == {}
    survivor = _host(settings, tmp_path, "survivor", queue_lease_s=2).start()
    try:
        assert _drained(client, 20)  # it reappears once the dead host's 2-second lease runs out
    finally:
        stats = survivor.stop()
    assert stats["functions"]["work"]["succeeded"] == 1

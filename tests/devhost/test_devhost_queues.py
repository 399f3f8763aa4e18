"""Queue triggers on Azurite behave as the Functions host's Storage queues extension does."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient

from devhost.host import Host
from tests.waiting import wait_until


def _client(connection: str, name: str) -> QueueClient:
    client = QueueClient.from_connection_string(connection, name)
    with contextlib.suppress(ResourceExistsError):
        client.create_queue()
    return client


def _send(connection: str, name: str, body: Any) -> str:
    text = json.dumps(body) if not isinstance(body, str) else body
    return _client(connection, name).send_message(base64.b64encode(text.encode()).decode()).id


def _calls(app: ModuleType, function: str) -> list[dict[str, Any]]:
    return [c for c in list(app.CALLS) if c["function"] == function]


def _wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    wait_until(predicate, timeout=timeout, what="the host to get there")


def _remaining(connection: str, name: str) -> int:
    return int(_client(connection, name).get_queue_properties().approximate_message_count)


def test_a_message_is_processed_once_and_then_deleted(make_host: Callable[..., Host], fake_app: ModuleType,
                                                     storage_connection_string: str, queues: dict[str, str]) -> None:
    host = make_host()
    message_id = _send(storage_connection_string, queues["WORK_QUEUE"], {"tag": "once"})
    assert host.wait_idle(20)
    calls = _calls(fake_app, "work")
    assert [c["id"] for c in calls] == [message_id]
    assert calls[0]["dequeue_count"] == 1
    assert calls[0]["message_type"] == "QueueMessage" and calls[0]["pop_receipt"]
    assert calls[0]["insertion_time"] is not None
    assert _remaining(storage_connection_string, queues["WORK_QUEUE"]) == 0
    assert host.stats()["functions"]["work"]["succeeded"] == 1


def test_the_body_is_base64_decoded_as_the_host_does(make_host: Callable[..., Host], fake_app: ModuleType,
                                                    storage_connection_string: str, queues: dict[str, str]) -> None:
    host = make_host()
    _send(storage_connection_string, queues["WORK_QUEUE"], {"tag": "ünïcode ✓", "n": 3})
    assert host.wait_idle(20)
    assert _calls(fake_app, "work")[0]["body"] == {"tag": "ünïcode ✓", "n": 3}


def test_a_failing_message_is_retried_with_a_growing_dequeue_count_then_poisoned_with_its_body(
        make_host: Callable[..., Host], fake_app: ModuleType, storage_connection_string: str,
        queues: dict[str, str]) -> None:
    host = make_host()
    body = {"tag": "doomed", "fail": True}
    _send(storage_connection_string, queues["WORK_QUEUE"], body)
    _wait_for(lambda: host.stats()["poisoned"] == 1)
    assert host.wait_idle(20)
    assert [c["dequeue_count"] for c in _calls(fake_app, "work")] == [1, 2, 3]  # maxDequeueCount is 3
    poison = _client(storage_connection_string, queues["WORK_QUEUE"] + "-poison")
    moved = list(poison.receive_messages(max_messages=5))
    assert len(moved) == 1
    assert json.loads(base64.b64decode(moved[0].content)) == body
    assert _remaining(storage_connection_string, queues["WORK_QUEUE"]) == 0
    stats = host.stats()["functions"]["work"]
    assert (stats["failed"], stats["poisoned"]) == (3, 1)
    assert "asked to fail" in stats["last_error"]


def test_a_message_that_is_not_base64_goes_to_the_poison_queue_without_an_invocation(
        make_host: Callable[..., Host], fake_app: ModuleType, storage_connection_string: str,
        queues: dict[str, str]) -> None:
    host = make_host()
    _client(storage_connection_string, queues["WORK_QUEUE"]).send_message('{"plain": "json, not base64"}')
    _wait_for(lambda: host.stats()["poisoned"] == 1)
    assert _calls(fake_app, "work") == []
    poison = _client(storage_connection_string, queues["WORK_QUEUE"] + "-poison")
    assert [m.content for m in poison.receive_messages(max_messages=5)] == ['{"plain": "json, not base64"}']


def test_queue_outputs_are_sent_base64_encoded_and_trigger_the_next_function(
        make_host: Callable[..., Host], fake_app: ModuleType, storage_connection_string: str,
        queues: dict[str, str]) -> None:
    make_host()
    _send(storage_connection_string, queues["WORK_QUEUE"], {"nudge": "pool-request:r1", "audit": "seen r1"})
    _wait_for(lambda: len(_calls(fake_app, "nudged")) == 1)
    assert _calls(fake_app, "nudged")[0]["body"] == "pool-request:r1"
    audit = list(_client(storage_connection_string, queues["AUDIT_QUEUE"]).receive_messages(max_messages=5))
    assert [base64.b64decode(m.content).decode() for m in audit] == ["seen r1"]


def test_outputs_of_a_failed_invocation_are_not_sent(make_host: Callable[..., Host], fake_app: ModuleType,
                                                   storage_connection_string: str, queues: dict[str, str]) -> None:
    host = make_host()
    _send(storage_connection_string, queues["WORK_QUEUE"], {"audit": "must not appear", "fail": True})
    _wait_for(lambda: host.stats()["poisoned"] == 1)
    assert _remaining(storage_connection_string, queues["AUDIT_QUEUE"]) == 0


def test_two_hosts_on_one_queue_process_each_message_exactly_once(
        make_host: Callable[..., Host], fake_app: ModuleType, storage_connection_string: str,
        queues: dict[str, str]) -> None:
    first, second = make_host(name="first"), make_host(name="second")
    sent = {_send(storage_connection_string, queues["WORK_QUEUE"], {"n": n}) for n in range(24)}
    _wait_for(lambda: len(_calls(fake_app, "work")) >= 24)
    assert first.wait_idle(20) and second.wait_idle(20)
    seen = [c["id"] for c in _calls(fake_app, "work")]
    assert sorted(seen) == sorted(sent)
    total = first.stats()["functions"]["work"]["succeeded"] + second.stats()["functions"]["work"]["succeeded"]
    assert total == 24


def test_an_invocation_over_function_timeout_is_reported_and_still_completes(
        make_host: Callable[..., Host], fake_app: ModuleType, storage_connection_string: str,
        queues: dict[str, str]) -> None:
    host = make_host()  # the fake app's functionTimeout is one second
    _send(storage_connection_string, queues["WORK_QUEUE"], {"sleep": 2.5})
    _wait_for(lambda: host.stats()["functions"]["work"]["succeeded"] == 1)
    assert host.stats()["functions"]["work"]["timeouts"] == 1


def test_a_message_received_more_often_than_max_dequeue_count_is_poisoned_before_running(
        make_host: Callable[..., Host], fake_app: ModuleType, storage_connection_string: str,
        queues: dict[str, str]) -> None:
    client = _client(storage_connection_string, queues["WORK_QUEUE"])
    _send(storage_connection_string, queues["WORK_QUEUE"], {"tag": "crashed hosts"})
    for _ in range(3):  # three hosts took it and died: it comes back with dequeue count 4
        [held] = list(client.receive_messages(max_messages=1, visibility_timeout=30))
        client.update_message(held.id, held.pop_receipt, visibility_timeout=0)  # its lease ran out
    host = make_host()
    _wait_for(lambda: host.stats()["poisoned"] == 1)
    assert _calls(fake_app, "work") == []


def test_a_queue_message_can_be_run_on_demand(make_host: Callable[..., Host], fake_app: ModuleType) -> None:
    host = make_host()
    outputs = host.trigger("work", {"nudge": "hello"}).result(timeout=10)
    assert outputs == {"nudge": "hello"}
    assert _calls(fake_app, "work")[0]["dequeue_count"] == 1


def test_wait_idle_does_not_return_before_a_message_sent_just_before_it_is_processed(
        make_host: Callable[..., Host], fake_app: ModuleType, storage_connection_string: str,
        queues: dict[str, str]) -> None:
    host = make_host()
    assert host.wait_idle(20)  # the host has polled an empty queue and been quiet for longer than quiet_s
    message_id = _send(storage_connection_string, queues["WORK_QUEUE"], {"tag": "late"})
    assert host.wait_idle(20)
    assert [c["id"] for c in _calls(fake_app, "work")] == [message_id]

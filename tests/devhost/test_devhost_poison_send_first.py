"""The host moves a failed message to its poison queue by sending first, and creates the queue only
when it is missing, as the Storage queues extension does
(Azure/azure-sdk-for-net, Microsoft.Azure.WebJobs.Extensions.Storage.Common
StorageQueueExtensions.AddMessageAndCreateIfNotExistsAsync). A provisioned poison queue therefore
needs only Message Sender, never the right to create queues (infra/app/team-queues-access.bicep)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from devhost.hostjson import QueueOptions
from devhost.indexing import Binding, FunctionSpec
from devhost.queues import InFlight, QueueListener


class FakeQueue:
    def __init__(self, log: list[str], name: str, *, exists: bool) -> None:
        self.log, self.name, self.exists = log, name, exists

    def send_message(self, content: str) -> None:
        self.log.append(f"send {self.name}")
        if not self.exists:
            raise ResourceNotFoundError("The specified queue does not exist.")

    def create_queue(self) -> None:
        self.log.append(f"create {self.name}")
        self.exists = True

    def delete_message(self, *_: Any) -> None:
        self.log.append(f"delete-from {self.name}")


class FakeQueues:
    def __init__(self, *, poison_exists: bool) -> None:
        self.log: list[str] = []
        self.clients = {"work": FakeQueue(self.log, "work", exists=True),
                        "work-poison": FakeQueue(self.log, "work-poison", exists=poison_exists)}

    def queue(self, connection: str, name: str) -> FakeQueue:
        return self.clients[name]

    def ensure(self, connection: str, name: str) -> FakeQueue:
        """As devhost.storage.QueueClients.ensure: create_queue on first use (an existing queue is kept)."""
        client = self.clients[name]
        client.create_queue()
        return client


def _poison(*, poison_exists: bool) -> list[str]:
    queues = FakeQueues(poison_exists=poison_exists)
    host = SimpleNamespace(queues=queues, record_poison=lambda *a, **k: None)
    trigger = Binding(type="queueTrigger", name="msg", direction="in", properties={"queueName": "work"})
    spec = FunctionSpec(name="work", trigger=trigger, outputs=(), func=lambda msg: None, parameters=("msg",))
    listener = QueueListener(host, spec, QueueOptions())  # type: ignore[arg-type]
    message = SimpleNamespace(id="m1", content="Ym9keQ==", dequeue_count=5)
    listener._poison(InFlight(message=message, pop_receipt="r", renewed_at=0.0), reason="boom")
    return queues.log


def test_a_provisioned_poison_queue_is_only_sent_to_never_created() -> None:
    assert _poison(poison_exists=True) == ["send work-poison", "delete-from work"]


def test_a_missing_poison_queue_is_created_after_the_send_answers_not_found() -> None:
    assert _poison(poison_exists=False) == ["send work-poison", "create work-poison", "send work-poison",
                                            "delete-from work"]

"""The NudgePort over an Azure Storage queue: a delayed message that wakes the reconciler.

The reconciler decides when to wake (:mod:`shared.kernel.nudge`); this sends the message on ``NUDGE_QUEUE``
(which triggers the reconciler) with a *visibility timeout* equal to the wait, over ``azure-storage-queue``
with the host's storage connection (``AzureWebJobsStorage``: a connection string locally, the queue
service URI and the managed identity in Azure), as :mod:`shared.adapters.ledger` does for the table.
The body is base64-encoded, as host.json's ``messageEncoding`` expects (learn.microsoft.com/azure/
azure-functions/functions-bindings-storage-queue#hostjson-settings). The queue is created on first
need: sent to first, created only when missing, as the host's output binding does.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from shared.adapters.storage import map_table_error
from shared.kernel.errors import Transient
from shared.kernel.nudge import wall_delay_s

if TYPE_CHECKING:
    from shared.kernel.clock import Clock
    from shared.settings import Settings


class QueueNudger:
    """NudgePort over an Azure Storage queue (``azure.storage.queue.QueueClient``)."""

    def __init__(self, queue_client: Any, *, clock: Clock | None = None) -> None:
        self._queue = queue_client
        self._clock = clock
        self._created = False
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock | None = None) -> QueueNudger:
        """Connect as the settings say: a connection string locally, the managed identity in Azure."""
        from azure.storage.queue import QueueClient, TextBase64EncodePolicy

        from shared.adapters.storage import storage_client

        client = storage_client(QueueClient, settings, url_keyword="account_url", url=settings.storage_queue_uri,
                                queue_name=settings.nudge_queue, message_encode_policy=TextBase64EncodePolicy())
        return cls(client, clock=clock)

    def _now_and_speed(self) -> tuple[float, float]:
        from shared.kernel import clock as clocks

        clock = self._clock or clocks.current()
        return clock.now(), float(getattr(clock, "speed", 1.0) or 1.0)

    def nudge_at(self, when: float, *, hint: str) -> None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        now, speed = self._now_and_speed()
        delay = wall_delay_s(when, now=now, speed=speed)
        try:
            try:
                self._queue.send_message(hint, visibility_timeout=delay)
            except ResourceNotFoundError:
                # As the host's output binding does: send first, create the queue only when it is missing.
                self._create()
                self._queue.send_message(hint, visibility_timeout=delay)
        except AzureError as error:
            mapped = map_table_error(error, what=f"nudge queue {getattr(self._queue, 'queue_name', '')}")
            raise (mapped or Transient(f"nudge: {type(error).__name__}: {error}")) from error

    def _create(self) -> None:
        from azure.core.exceptions import ResourceExistsError

        with self._lock:
            if self._created:
                return
            with contextlib.suppress(ResourceExistsError):
                self._queue.create_queue()
            self._created = True

"""Queue triggers: poll a Storage queue and run the function once per message, as the host does.

The Storage queues extension (5.x) loop, reproduced:

- receive up to ``batchSize`` messages, invisible for 10 minutes while they run (renewed at half
  time, so a long invocation does not get its message delivered twice);
- fetch the next batch only when no more than ``newBatchThreshold`` of ours are still running;
- when the queue is empty, wait with randomized exponential back-off from 100 ms up to
  ``maxPollingInterval``; any message found resets it, and a message this host itself sends to
  the queue (an output binding) wakes the poller at once;
- decode the body per ``messageEncoding`` (a message that is not valid base64 goes to the poison
  queue at once, as the extension does since it cannot ever be bound);
- success: delete the message; failure: make it visible again after ``visibilityTimeout`` (its
  dequeue count grows with each receive); a failure at ``maxDequeueCount``, or a message already
  received more often than that (a host died holding it), moves it to ``<queue>-poison`` with its
  original text and logs the last error.
"""

from __future__ import annotations

import base64
import binascii
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from devhost import invoke
from devhost.hostjson import QueueOptions
from devhost.indexing import FunctionSpec

if TYPE_CHECKING:
    from devhost.host import Host

log = logging.getLogger("devhost.queues")

MIN_POLLING_INTERVAL_S = 0.1
LEASE_S = 600.0  # the extension receives with a 10-minute visibility timeout and renews it


class BadEncoding(ValueError):
    """The message text is not in the configured encoding."""


def decode_body(text: str, encoding: str) -> bytes:
    """The message body the function sees, from the text stored in the queue."""
    if encoding == "none":
        return text.encode("utf-8")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as error:
        raise BadEncoding(f"message is not valid base64 ({error}); check messageEncoding in host.json "
                          "and that the producer encodes with TextBase64EncodePolicy") from None


def encode_body(text: str, encoding: str) -> str:
    """The queue text for a message the function sends through an output binding."""
    if encoding == "none":
        return text
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


@dataclass
class Backoff:
    """RandomizedExponentialBackoffStrategy: 100 ms doubling (with jitter) up to the maximum."""

    maximum: float
    minimum: float = MIN_POLLING_INTERVAL_S
    current: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def reset(self) -> float:
        self.current = 0.0
        return 0.0

    def next(self) -> float:
        if self.current <= 0:
            self.current = self.minimum
        else:
            self.current = min(self.maximum, self.current * 2 * (0.8 + 0.4 * self.rng.random()))
        return max(self.minimum, min(self.maximum, self.current))


@dataclass
class InFlight:
    """A received message while its invocation runs (for lease renewal)."""

    message: Any
    pop_receipt: str
    renewed_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)


class QueueListener:
    """One queue-triggered function: a polling thread feeding the host's worker pool."""

    def __init__(self, host: Host, spec: FunctionSpec, options: QueueOptions, *, lease_s: float = LEASE_S) -> None:
        self.host = host
        self.spec = spec
        self.options = options
        self.lease_s = lease_s
        self.queue_name = spec.trigger.queue_name
        self.connection = spec.trigger.connection
        self.client = host.queues.queue(self.connection, self.queue_name)
        self.poison_name = f"{self.queue_name}-poison"
        self.backoff = Backoff(maximum=options.max_polling_interval_s)
        self._wake = threading.Event()
        self._changed = threading.Condition()
        self._in_flight: dict[str, InFlight] = {}
        self._thread: threading.Thread | None = None
        self.last_empty_poll = 0.0  # monotonic time the last poll that found nothing was started

    # -- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"devhost-queue-{self.spec.name}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop_polling(self) -> None:
        self._wake.set()
        with self._changed:
            self._changed.notify_all()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def in_flight(self) -> int:
        with self._changed:
            return len(self._in_flight)

    # -- polling

    def _run(self) -> None:
        threshold = self.options.new_batch_threshold
        while not self.host.stopping:
            with self._changed:
                while len(self._in_flight) > threshold and not self.host.stopping:
                    self._changed.wait(0.5)
            if self.host.stopping:
                return
            poll_started = time.monotonic()
            try:
                messages = self._receive()
            except Exception as error:  # storage down: keep polling, slower
                log.warning("%s: receiving from queue %s failed: %s", self.spec.name, self.queue_name, error)
                messages = []
            if messages:
                self.backoff.reset()
                for message in messages:
                    self._dispatch(message)
                continue
            self.last_empty_poll = poll_started
            delay = self.backoff.next()
            self._wake.wait(delay)
            self._wake.clear()

    def _receive(self) -> list[Any]:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            pages = self.client.receive_messages(messages_per_page=self.options.batch_size,
                                                 max_messages=self.options.batch_size,
                                                 visibility_timeout=int(self.lease_s))
            return list(pages)
        except ResourceNotFoundError:
            return []  # the queue does not exist yet: nothing to do, as for the host

    def _dispatch(self, message: Any) -> None:
        entry = InFlight(message=message, pop_receipt=message.pop_receipt, renewed_at=time.monotonic())
        with self._changed:
            self._in_flight[message.id] = entry
        self.host.activity()
        try:
            self.host.submit(self.spec.name, lambda: self._process(entry), on_done=lambda: self._finished(message.id))
        except RuntimeError:  # the pool is shutting down: hand the message back at once
            self._release(entry, visibility_s=0)
            self._finished(message.id)

    def _finished(self, message_id: str) -> None:
        with self._changed:
            self._in_flight.pop(message_id, None)
            self._changed.notify_all()
        self.host.activity()

    # -- one message

    def _process(self, entry: InFlight) -> None:
        message = entry.message
        max_dequeue = self.options.max_dequeue_count
        if message.dequeue_count > max_dequeue:
            self._poison(entry, reason=f"dequeue count {message.dequeue_count} is over maxDequeueCount {max_dequeue}")
            return
        try:
            body = decode_body(message.content, self.options.message_encoding)
        except BadEncoding as error:
            self._poison(entry, reason=str(error))
            return
        trigger = invoke.queue_message(
            id_=message.id, body=body, dequeue_count=message.dequeue_count, insertion_time=message.inserted_on,
            expiration_time=message.expires_on, next_visible_time=message.next_visible_on,
            pop_receipt=entry.pop_receipt,
        )
        try:
            self.host.run_invocation(self.spec, trigger, lease=entry if self.lease_s > 0 else None, listener=self)
        except Exception as error:
            if message.dequeue_count >= max_dequeue:
                self._poison(entry, reason=f"{type(error).__name__}: {error}")
            else:
                self._release(entry, visibility_s=self.options.visibility_timeout_s)
            return
        self._delete(entry)

    def renew(self, entry: InFlight) -> None:
        """Keep a running message invisible (called by the host's watchdog at half the lease)."""
        with entry.lock:
            try:
                receipt = self.client.update_message(entry.message.id, entry.pop_receipt,
                                                     visibility_timeout=int(self.lease_s))
                entry.pop_receipt = receipt.pop_receipt
                entry.renewed_at = time.monotonic()
            except Exception as error:
                log.warning("%s: renewing message %s failed: %s", self.spec.name, entry.message.id, error)

    def _delete(self, entry: InFlight) -> None:
        with entry.lock:
            try:
                self.client.delete_message(entry.message.id, entry.pop_receipt)
            except Exception as error:  # it will come back; the app's ledger makes that harmless
                log.warning("%s: deleting message %s failed: %s", self.spec.name, entry.message.id, error)

    def _release(self, entry: InFlight, *, visibility_s: float) -> None:
        with entry.lock:
            try:
                receipt = self.client.update_message(entry.message.id, entry.pop_receipt,
                                                     visibility_timeout=int(visibility_s))
                entry.pop_receipt = receipt.pop_receipt
            except Exception as error:
                log.warning("%s: releasing message %s failed: %s", self.spec.name, entry.message.id, error)

    def _poison(self, entry: InFlight, *, reason: str) -> None:
        message = entry.message
        log.error("%s: message %s has reached MaxDequeueCount of %d (or cannot be bound). Moving message to "
                  "queue '%s'. Last error: %s", self.spec.name, message.id, self.options.max_dequeue_count,
                  self.poison_name, reason)
        # As the extension does (Azure/azure-sdk-for-net, Microsoft.Azure.WebJobs.Extensions.Storage.Common
        # StorageQueueExtensions.AddMessageAndCreateIfNotExistsAsync): send first, create the poison queue
        # only when the send answers QueueNotFound. A provisioned poison queue then needs only
        # Message Sender on it, never the right to create queues (infra/app/team-queues-access.bicep).
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self.host.queues.queue(self.connection, self.poison_name).send_message(message.content)
        except ResourceNotFoundError:
            self.host.queues.ensure(self.connection, self.poison_name).send_message(message.content)
        self._delete(entry)
        self.host.record_poison(self.spec.name, message_id=message.id, reason=reason)

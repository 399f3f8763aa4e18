"""Turn a trigger payload into the function's arguments, call it, and collect its outputs.

The Python worker decodes trigger data with azure.functions' own converters (``meta.Datum`` in,
``QueueMessage`` / ``TimerRequest`` / ``CloudEvent`` or ``EventGridEvent`` out) and hands each
output binding a ``func.Out``; after the call it encodes what was set. We call the same
converters, so the objects a function sees here are the ones the worker would give it with the
installed azure-functions (1.26.0: a CloudEvents 1.0 payload becomes ``func.CloudEvent``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar

import azure.functions as func
from azure.functions import meta
from azure.functions.eventgrid import EventGridEventInConverter
from azure.functions.queue import QueueMessageInConverter, QueueMessageOutConverter
from azure.functions.timer import TimerRequestConverter

from devhost.indexing import QUEUE_OUTPUT, FunctionSpec

T = TypeVar("T")


class Out(func.Out[T], Generic[T]):
    """What the worker passes for an output binding: holds the value the function sets."""

    def __init__(self) -> None:
        self._value: T | None = None
        self.was_set = False

    def set(self, val: T) -> None:
        self._value = val
        self.was_set = True

    def get(self) -> T:
        return self._value  # type: ignore[return-value]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def queue_message(*, id_: str, body: bytes, dequeue_count: int, insertion_time: datetime | None,
                  expiration_time: datetime | None, next_visible_time: datetime | None,
                  pop_receipt: str) -> Any:
    """A ``azure.functions.queue.QueueMessage`` decoded as the worker decodes it."""
    try:
        datum = meta.Datum(body.decode("utf-8"), "string")
    except UnicodeDecodeError:
        datum = meta.Datum(body, "bytes")
    metadata: dict[str, meta.Datum] = {
        "Id": meta.Datum(id_, "string"),
        "DequeueCount": meta.Datum(dequeue_count, "int"),
        "PopReceipt": meta.Datum(pop_receipt, "string"),
    }
    for key, value in (("InsertionTime", insertion_time), ("ExpirationTime", expiration_time),
                       ("NextVisibleTime", next_visible_time)):
        text = _iso(value)
        if text is not None:
            metadata[key] = meta.Datum(text, "string")
    return QueueMessageInConverter.decode(datum, trigger_metadata=metadata)


def timer_request(*, past_due: bool, last: datetime | None, next_: datetime | None,
                  last_updated: datetime | None, use_monitor: bool) -> Any:
    """A ``TimerRequest`` from the JSON the host sends (``Schedule``, ``ScheduleStatus``, ``IsPastDue``)."""
    payload: dict[str, Any] = {"Schedule": {"AdjustForDST": True}, "IsPastDue": past_due}
    if use_monitor:
        payload["ScheduleStatus"] = {"Last": _iso(last), "Next": _iso(next_), "LastUpdated": _iso(last_updated)}
    return TimerRequestConverter.decode(meta.Datum(json.dumps(payload), "json"), trigger_metadata={})


def event_grid_event(event: Mapping[str, Any]) -> Any:
    """``func.CloudEvent`` for a CloudEvents 1.0 payload, ``func.EventGridEvent`` otherwise."""
    return EventGridEventInConverter.decode(meta.Datum(json.dumps(event), "json"), trigger_metadata={})


def queue_output_messages(value: Any) -> list[str]:
    """The messages a queue output binding sends for the value set on it (one per list item)."""
    if value is None:
        return []
    datum = QueueMessageOutConverter.encode(value, expected_type=None)
    if datum.type == "string":
        return [str(datum.value)]
    if datum.type == "bytes":
        return [bytes(datum.value).decode("utf-8")]
    decoded = json.loads(datum.value)
    items = decoded if isinstance(decoded, list) else [decoded]
    return [item["body"] if isinstance(item, dict) else str(item) for item in items]


def call(spec: FunctionSpec, trigger_value: Any) -> dict[str, Any]:
    """Run the function with its trigger argument and fresh outputs; returns output name -> value set."""
    outputs = {b.name: Out[Any]() for b in spec.outputs if b.name != "$return"}
    kwargs: dict[str, Any] = {spec.trigger.name: trigger_value, **outputs}
    result = spec.func(**kwargs)
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    values = {name: out.get() for name, out in outputs.items() if out.was_set}
    if result is not None and any(b.name == "$return" for b in spec.outputs):
        values["$return"] = result
    return values


def output_queue_messages(spec: FunctionSpec, values: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(queue name, connection, message text) for every queue output the function set."""
    messages = []
    for binding in spec.outputs:
        if binding.type == QUEUE_OUTPUT and binding.name in values:
            for text in queue_output_messages(values[binding.name]):
                messages.append((binding.queue_name, binding.connection, text))
    return messages

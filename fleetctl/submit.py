"""Submitting a pool request: one JSON message on the pool-request queue, base64 as the host reads it.

The Functions host decodes queue messages from base64 (host.json ``messageEncoding``), while the
Storage SDK sends plain text unless told otherwise, so the message is sent with
``TextBase64EncodePolicy``. A request without a ``requestId`` gets one here, so that the team can
follow it (``fleetctl requests``); resending the same file with the same id is idempotent.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from fleetctl.config import ConfigError, Storage


class RequestError(ValueError):
    """The file is not a JSON object (use --raw to send it anyway, e.g. to test rejections)."""


@dataclass(frozen=True)
class Submitted:
    request_id: str
    message_id: str
    queue: str
    generated_id: bool


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def prepare(text: str, *, request_id: str | None = None, raw: bool = False) -> tuple[str, str, bool]:
    """(message text, request id, whether the id was generated) for a request document."""
    if raw:
        return text, request_id or "", False
    try:
        document: Any = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(f"the request is not valid JSON ({error}); send --raw to submit it anyway") from None
    if not isinstance(document, dict):
        raise RequestError("a pool request is one JSON object; send --raw to submit something else anyway")
    generated = False
    if request_id:
        document["requestId"] = request_id
    elif not document.get("requestId"):
        document["requestId"] = new_request_id()
        generated = True
    return json.dumps(document, separators=(",", ":")), str(document["requestId"]), generated


def submit(text: str, *, storage: Storage, queue: str, request_id: str | None = None, raw: bool = False) -> Submitted:
    """Send the request to the team's queue. Only sends: never creates the queue.

    A team holds *Storage Queue Data Message Sender* on its own queue and nothing else, so the
    queue must already exist (infra/ creates one per team); a missing queue is an error naming it.
    """
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError
    from azure.storage.queue import TextBase64DecodePolicy, TextBase64EncodePolicy

    message, rid, generated = prepare(text, request_id=request_id, raw=raw)
    if len(message.encode("utf-8")) > 48 * 1024:
        raise RequestError(f"the request is {len(message.encode())} bytes; a queue message holds at most 48 KiB "
                           "once base64-encoded (64 KiB)")
    client: Any = storage.queue_client(queue, message_encode_policy=TextBase64EncodePolicy(),
                                       message_decode_policy=TextBase64DecodePolicy())
    try:
        sent = client.send_message(message)
    except ResourceNotFoundError:
        raise ConfigError(f"queue {queue!r} does not exist. Team queues are created by the fleet operators with the "
                          "deployment (infra/: the teams parameter); ask them to add your team, or check --team/--queue"
                          ) from None
    except ClientAuthenticationError as error:
        raise ConfigError(f"not allowed to send to queue {queue!r}: {error.message}") from None
    except HttpResponseError as error:
        if error.status_code == 403:
            raise ConfigError(f"not allowed to send to queue {queue!r}: your identity needs Storage Queue Data "
                              "Message Sender on it (granted per team by infra/)") from None
        raise ConfigError(f"cannot send to queue {queue!r}: {error.message}") from None
    return Submitted(request_id=rid, message_id=str(sent.id), queue=queue, generated_id=generated)

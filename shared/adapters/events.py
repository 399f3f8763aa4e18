"""CloudEvents out to Event Grid (the EventsPort; its in-memory twin for tests is tests/fakes/events.py).

Outcomes (pool created or rejected, node remediated, migration finished) and the sweep's findings
are published as CloudEvents 1.0 with ``source = STEWARD_EVENT_SOURCE`` to EVENTGRID_TOPIC_ENDPOINT,
authenticated as the app's managed identity.

Only the public ``azure.eventgrid.EventGridPublisherClient`` is used. Two details of azure-eventgrid
4.22.1 shape this module:

- For a basic topic the public client builds its inner client *without* the keyword arguments
  given to its constructor, so ``connection_verify`` (STEWARD_CA_BUNDLE), the timeouts and
  ``retry_total=0`` (shared.kernel.retry decides) would be dropped there. azure-core reads the same options
  per request, so they travel with every ``send`` instead. On the way the basic-topic path also hands
  them to its CloudEvent model, which logs "is not a known attribute ... will be ignored" for each:
  :class:`_TransportOptionNoise` drops exactly those lines.
- The token scope is fixed to ``https://eventgrid.azure.net/.default``: a small credential wrapper
  asks for EVENTGRID_AUDIENCE's scope instead, so sovereign clouds and the simulator work with the
  same code.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shared.adapters.arm import call_arm
from shared.kernel import retry

if TYPE_CHECKING:
    from azure.core.credentials import AccessToken, TokenCredential

    from shared.kernel.clock import Clock
    from shared.settings import Settings


class AudienceCredential:
    """Asks the wrapped credential for ``scope`` whatever scope the SDK requests."""

    def __init__(self, credential: TokenCredential, scope: str) -> None:
        self._credential = credential
        self._scope = scope

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return self._credential.get_token(self._scope, **kwargs)


_TRANSPORT_OPTIONS = ("retry_total", "connection_timeout", "read_timeout", "connection_verify")


class _TransportOptionNoise(logging.Filter):
    """Drops the SDK's per-event warning about the per-request transport options, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Judged on the formatted message: shared.kernel.telemetry's record factory may already have folded the
        # arguments into ``msg`` (redaction), leaving ``args`` empty.
        message = record.getMessage()
        option, _, rest = message.partition(" ")
        return not (option in _TRANSPORT_OPTIONS and rest.startswith("is not a known attribute"))


_NOISE_FILTER = _TransportOptionNoise()
# The logger the basic-topic model base class warns on (azure-eventgrid's generated _serialization).
_SDK_MODEL_LOGGER = "azure.eventgrid._legacy._generated._serialization"


class EventPublisher:
    """EventsPort over azure-eventgrid (basic topic, CloudEvents 1.0 schema)."""

    def __init__(self, credential: TokenCredential, settings: Settings, *, clock: Clock | None = None,
                 retry_attempts: int = 3, retry_max_delay: float = 10.0) -> None:
        self._credential = credential
        self._settings = settings
        self._clock = clock
        self._attempts = retry_attempts
        self._max_delay = retry_max_delay
        self._client: Any = None
        self._lock = threading.Lock()
        self._options: dict[str, Any] = {"retry_total": 0, "connection_timeout": 10, "read_timeout": 30}
        if settings.ca_bundle:
            self._options["connection_verify"] = settings.ca_bundle

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                from azure.eventgrid import EventGridPublisherClient

                sdk_logger = logging.getLogger(_SDK_MODEL_LOGGER)
                if _NOISE_FILTER not in sdk_logger.filters:
                    sdk_logger.addFilter(_NOISE_FILTER)
                self._client = EventGridPublisherClient(
                    self._settings.eventgrid_topic_endpoint,
                    AudienceCredential(self._credential, self._settings.eventgrid_scope),
                )
            return self._client

    @property
    def request_options(self) -> dict[str, Any]:
        """The azure-core options sent with every request (CA bundle, timeouts, no SDK retries)."""
        return dict(self._options)

    def _now(self) -> float:
        from shared.kernel import clock as clocks

        return (self._clock or clocks.current()).now()

    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        from azure.core.messaging import CloudEvent

        event = CloudEvent(
            source=self._settings.event_source, type=type_, subject=subject, data=dict(data),
            id=id_ or str(uuid.uuid4()), time=datetime.fromtimestamp(self._now(), tz=UTC),
        )
        client = self._get_client()
        options = self.request_options
        send: Callable[[], None] = lambda: client.send([event], **options)  # noqa: E731
        from shared.kernel import clock as clocks

        retry.call(call_arm, send, what=f"publish {type_}", clock=self._clock or clocks.current(),
                   attempts=self._attempts, max_delay=self._max_delay)

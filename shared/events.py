"""CloudEvents out to Event Grid (the EventsPort), and an in-memory recorder for tests.

Outcomes (pool created or rejected, node remediated, migration finished) and the sweep's findings
are published as CloudEvents 1.0 with ``source = STEWARD_EVENT_SOURCE`` to EVENTGRID_TOPIC_ENDPOINT,
authenticated as the app's managed identity.

Two details of azure-eventgrid 4.22.1 shape this module. For a basic topic the public
``EventGridPublisherClient`` builds its inner (legacy) client *without* passing on keyword arguments,
so ``connection_verify`` (STEWARD_CA_BUNDLE) and ``retry_total`` would be dropped: the inner client,
which the public one instantiates itself, is built directly instead. And the token scope is fixed to
``https://eventgrid.azure.net/.default``: a small credential wrapper asks for EVENTGRID_AUDIENCE's
scope instead, so sovereign clouds and the simulator work with the same code.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shared import retry
from shared.aks import call_arm

if TYPE_CHECKING:
    from azure.core.credentials import AccessToken, TokenCredential

    from shared.clock import Clock
    from shared.settings import Settings


class AudienceCredential:
    """Asks the wrapped credential for ``scope`` whatever scope the SDK requests."""

    def __init__(self, credential: TokenCredential, scope: str) -> None:
        self._credential = credential
        self._scope = scope

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return self._credential.get_token(self._scope, **kwargs)


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

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                from azure.eventgrid._legacy import EventGridPublisherClient

                options: dict[str, Any] = {"retry_total": 0, "connection_timeout": 10, "read_timeout": 30}
                if self._settings.ca_bundle:
                    options["connection_verify"] = self._settings.ca_bundle
                self._client = EventGridPublisherClient(
                    self._settings.eventgrid_topic_endpoint,
                    AudienceCredential(self._credential, self._settings.eventgrid_scope),
                    **options,
                )
            return self._client

    def _now(self) -> float:
        from shared import clock as clocks

        return (self._clock or clocks.current()).now()

    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        from azure.core.messaging import CloudEvent

        event = CloudEvent(
            source=self._settings.event_source, type=type_, subject=subject, data=dict(data),
            id=id_ or str(uuid.uuid4()), time=datetime.fromtimestamp(self._now(), tz=UTC),
        )
        client = self._get_client()
        send: Callable[[], None] = lambda: client.send([event])  # noqa: E731
        from shared import clock as clocks

        retry.call(call_arm, send, what=f"publish {type_}", clock=self._clock or clocks.current(),
                   attempts=self._attempts, max_delay=self._max_delay)


class RecordingEvents:
    """EventsPort that keeps what was published (for tests); can be told to fail the next calls."""

    def __init__(self, *, source: str = "/gpu-fleet-steward") -> None:
        self.source = source
        self.published: list[dict[str, Any]] = []
        self.failures: list[Exception] = []
        self._lock = threading.Lock()

    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        with self._lock:
            if self.failures:
                raise self.failures.pop(0)
            self.published.append({"id": id_ or str(uuid.uuid4()), "source": self.source, "type": type_,
                                   "subject": subject, "data": dict(data)})

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.published if e["type"] == type_]

    def types(self) -> list[str]:
        with self._lock:
            return [e["type"] for e in self.published]

    def clear(self) -> None:
        with self._lock:
            self.published.clear()

"""The few errors the core understands.

Adapters translate SDK exceptions (azure-core, kubernetes, azure-data-tables) into these at the
edge, so that decisions and state machines never depend on a client library's exception zoo.
Only :class:`Throttled` and :class:`Transient` are worth retrying; everything else is an answer.
"""

from __future__ import annotations


class StewardError(Exception):
    """Base of every error the core raises on purpose."""


class Throttled(StewardError):
    """The server asked us to slow down (HTTP 429); ``retry_after`` is its hint in seconds."""

    def __init__(self, message: str = "throttled", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Transient(StewardError):
    """A failure that may pass by itself: 5xx, a dropped connection, a timeout."""

    def __init__(self, message: str = "transient failure", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Conflict(StewardError):
    """Someone else changed the thing first (HTTP 409/412, an ETag or resourceVersion mismatch)."""


class NotFound(StewardError):
    """The thing does not exist (any more)."""


class Forbidden(StewardError):
    """We are not allowed to do this (HTTP 401/403): a configuration problem, never retried."""


class Invalid(StewardError):
    """The request was refused as invalid (HTTP 400/422, ARM validation); ``code`` is Azure's."""

    def __init__(self, reason: str, *, code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


RETRYABLE: tuple[type[StewardError], ...] = (Throttled, Transient)

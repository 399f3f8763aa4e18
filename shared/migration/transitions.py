"""How a migration step says what happened: wait, move or finish, with the events that tell it.

Built on the step contract (:mod:`shared.kernel.steps`): every step returns a
:class:`~shared.kernel.steps.Transition`, and :func:`publisher` publishes its events before the
reconciler saves the record. A migration notes why it waits under the record's ``waiting`` key
(``fleetctl status`` shows it) and clears it on every move; each move publishes a ``Step`` event,
each end a ``Step`` and the end's own event (``Completed``, ``RolledBack``, ``Blocked``).

An event's id is derived from what happened (record, event, state, previous state, note), so a step
repeated after a crash publishes the same id (consumers dedupe on it) while different steps never
share one. Publishing is best effort: an event that cannot be published never stops a migration
(the record is the truth).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from shared.kernel.errors import StewardError
from shared.kernel.ports import Record
from shared.kernel.steps import Publication, Transition, finish, move, stay
from shared.kernel.telemetry import count_safely
from shared.migration.records import MigrationData, MigrationState, written

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.migration")

EVENT_PREFIX = "Steward.Migration."
NOTE_KEY = "waiting"


def subject(cluster_id: str, pool: str) -> str:
    return f"{cluster_id}/agentPools/{pool}"


def publication(record: Record, what: str, **extra: Any) -> Publication:
    """The event ``what`` about ``record`` as it is now (read from the raw data: a row that cannot be
    typed is still reported)."""
    d = record.data
    data = {"migration": record.id, "cluster": d.get("cluster_id"), "pool": d.get("pool"),
            "replacement": d.get("replacement"), "state": str(record.state), "strategy": d.get("strategy"),
            "progress": d.get("progress"), **extra}
    return Publication(EVENT_PREFIX + what, subject(str(d.get("cluster_id")), str(d.get("pool"))), data)


def event_id(event: Publication) -> str:
    data = event.data
    what = event.event_type.removeprefix(EVENT_PREFIX)
    fingerprint = f"{data['migration']}|{what}|{data['state']}|{data.get('previous', '')}|{data.get('note', '')}"
    return f"{data['migration']}-{what}-{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}"


OUTCOMES: dict[str, str] = {"Started": "started", "Completed": "completed", "RolledBack": "rolled_back",
                            "Blocked": "blocked"}
"""Migration events counted in ``migrations_total`` (``outcome``)."""


def publisher(ctx: Context) -> Callable[[Publication], None]:
    """Publish one event through ``ctx.events``, best effort (see the module docstring)."""

    def publish(event: Publication) -> None:
        what = event.event_type.removeprefix(EVENT_PREFIX)
        if what in OUTCOMES:  # the workbook's "migrations by phase" and the blocked / rolled-back alerts
            count_safely(getattr(ctx, "telemetry", None), "migrations_total", outcome=OUTCOMES[what])
        try:
            ctx.events.publish(type_=event.event_type, subject=event.subject, data=event.data, id_=event_id(event))
        except StewardError as exc:
            log.warning("could not publish %s for migration %s: %s", event.event_type, event.data["migration"], exc)

    return publish


def changed(data: MigrationData, **changes: Any) -> dict[str, Any]:
    """``data`` with ``changes`` (field names checked), as the record stores it."""
    return written(msgspec.structs.replace(data, **changes))


def wait(record: Record, *, now: float, until: float, why: str, **data: Any) -> Transition:
    """Stay in the state until ``until``, noting why (history only when the reason changes)."""
    return stay(record, now=now, until=until, note=why, note_key=NOTE_KEY, **data)


def moved(record: Record, state: str, *, now: float, note: str, event_note: str | None = None, **data: Any) -> Transition:
    """Into ``state`` (due at once), with a ``Step`` event (whose note is ``event_note`` when given)."""
    done = move(record, state, now=now, note=note, note_key=NOTE_KEY, **data).with_data(**{NOTE_KEY: ""})
    return done.publish(*parts(publication(done.record, "Step", previous=str(record.state),
                                           note=note if event_note is None else event_note)))


def finished(record: Record, state: str, *, now: float, note: str, event: str, **data: Any) -> Transition:
    """Into the terminal ``state``, with a ``Step`` event and the end's own ``event``."""
    done = finish(record, state, now=now, note=note, note_key=NOTE_KEY, **data).with_data(**{NOTE_KEY: ""})
    done = done.publish(*parts(publication(done.record, "Step", previous=str(record.state), note=note)))
    return done.publish(*parts(publication(done.record, event, reason=note)))


def blocked(record: Record, *, now: float, reason: str, data: Mapping[str, Any] | None = None) -> Transition:
    """Stopped where it is, saying why (in ``reason`` and a ``Blocked`` event); ``data`` is merged first."""
    return finished(record, MigrationState.BLOCKED, now=now, note=reason, event="Blocked", **{**(data or {}), "reason": reason})


def parts(event: Publication) -> tuple[str, str, Any]:
    """A publication as the arguments of :meth:`Transition.publish`."""
    return event.event_type, event.subject, event.data

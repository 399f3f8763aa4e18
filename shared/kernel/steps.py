"""The step contract every kind of durable record follows.

A kind (pool requests, remediations, migrations, operator commands) is a module with ``KIND``,
``ACTIVE_STATES`` and ``advance(record, ctx) -> Record``, the reconciler's only entry (see
:mod:`shared.kernel.reconciler`), plus an optional ``give_up(record, ctx, *, reason) -> Record``.
Inside a kind, every state has one step function with one signature::

    def step(record: Record, ctx: Context, *, now: float, policy: P) -> Transition

which re-observes the world, decides, acts at most one safe step, and says what happened as a
:class:`Transition`: the record to save (with :func:`stay`, :func:`move` or :func:`finish`) and the
events to publish (:func:`Transition.publish`). :func:`settle` publishes them, in order, and returns
the record for the reconciler to save. Publishing before the save keeps the outcome at least once:
a crash between the two repeats the step, and consumers de-duplicate on the event id.

Why one shape: a reader who knows one kind's steps can read the others', and the bookkeeping of a
wait (no history line unless the reason changed, so a long wait does not flood the history), a move
(one history line) and an end (nothing due again) is written once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec

from shared.kernel.ports import Record

HISTORY_MAX = 50  # history lines kept per record (oldest dropped first)


class Outcome(StrEnum):
    """How a step left its record: the reconciler's and the reports' vocabulary."""

    STAYED = "stayed"  # same state, looked at again later
    MOVED = "moved"  # next state, usually due at once
    FINISHED = "finished"  # a terminal state: never due again


@dataclass(frozen=True)
class Publication:
    """An event a step asks to publish: its type, subject and data (the kind builds all three)."""

    event_type: str
    subject: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Transition:
    """What one step did: the record to save, how it left it, and the events to publish first."""

    record: Record
    outcome: Outcome
    events: tuple[Publication, ...] = field(default=())

    def publish(self, event_type: str, subject: str, data: Mapping[str, Any]) -> Transition:
        """The same transition with one more event to publish (in order)."""
        return Transition(self.record, self.outcome, (*self.events, Publication(event_type, subject, dict(data))))

    def with_data(self, **data: Any) -> Transition:
        """The same transition with ``data`` merged into the record's data."""
        record = msgspec.structs.replace(self.record, data={**self.record.data, **data})
        return Transition(record, self.outcome, self.events)


def _shape(text: str) -> str:
    """A note with its numbers blanked: "waiting for 3 pods" and "... 2 pods" are the same news."""
    return re.sub(r"-?\d+(\.\d+)?", "#", text)


def stay(record: Record, *, now: float, until: float, note: str | None = None, note_key: str = "last_note",
         **data: Any) -> Transition:
    """Same state, due again at ``until``. A history line only when the note's shape is new."""
    merged = {**record.data, **data}
    history = record.history
    if note is not None:
        if _shape(str(record.data.get(note_key) or "")) != _shape(note):
            history = [*history, {"at": now, "state": record.state, "note": note}][-HISTORY_MAX:]
        merged[note_key] = note
    stayed = msgspec.structs.replace(record, data=merged, history=history, next_at=until, updated_at=now)
    return Transition(stayed, Outcome.STAYED)


def move(record: Record, state: str, *, now: float, note: str, next_at: float | None = None,
         note_key: str = "last_note", **data: Any) -> Transition:
    """Into ``state`` with one history line; due at ``next_at`` (at once by default)."""
    moved = record.moved(state, at=now, note=note, next_at=now if next_at is None else next_at,
                         **{**data, note_key: note})
    return Transition(moved, Outcome.MOVED)


def finish(record: Record, state: str, *, now: float, note: str, note_key: str = "last_note", **data: Any) -> Transition:
    """Into the terminal ``state`` with one history line; never due again."""
    done = record.moved(state, at=now, note=note, next_at=0.0, **{**data, note_key: note})
    return Transition(done, Outcome.FINISHED)


def settle(transition: Transition, publish: Callable[[Publication], None]) -> Record:
    """Publish the transition's events in order, then hand its record to the reconciler to save."""
    for event in transition.events:
        publish(event)
    return transition.record

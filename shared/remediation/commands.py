"""Operator commands: a validated path from ``fleetctl`` to the app, instead of raw table writes.

An operator action such as the breaker reset used to be fleetctl writing the ``breaker`` row itself:
whoever could write the table wrote the app's state directly, with any fields, any time stamp (the
laptop's clock) and no record of who asked or why beyond what that writer chose to put there. Now
fleetctl only *asks*: it writes a ``command`` record (kind ``command``, id a fresh UUID) holding a
request of a fixed schema (:class:`Command`: which command, who, when, why; unknown fields refused),
and the app applies it:

- the reconciler (``shared.kernel.reconciler``, kind ``command``) calls :func:`advance`, which validates
  the record again, whoever wrote it (:func:`parse`), and refuses what is not allowed: an unknown
  command, a missing or malformed ``by``/``reason``, a request from the future or older than
  :data:`MAX_AGE_S` (a replayed or long-forgotten row), a record in an unexpected state;
- an allowed command is carried out by the app's own code (``breaker.reset``: the app's clock, the
  app's event ``Steward.Breaker.Reset`` naming who and why) and the record ends ``applied`` with
  what was done; a refused one ends ``rejected`` with the reason and publishes
  ``Steward.Command.Rejected`` (:data:`REJECTED_EVENT`: the record, the reason, and what the row
  claimed); both stay as the audit trail (``fleetctl`` shows them);
- a command is applied once: the reconciler's claim makes one writer, and a record already
  ``applied`` is never active again.

What a row can make the app do, whatever its state (issue 19): the reconciler lists only
``requested`` rows (:data:`ACTIVE_STATES`), so a row written straight into ``applied``, ``rejected`` or
any other state is never stepped and changes nothing (it is only shown); a ``requested`` row is
carried out only if it passes every check above, and then only the one allowed command runs, with
the app's values (its clock), never a value of the row but ``by`` and ``reason``, which are recorded.

Allowed commands (:data:`ALLOWED`): ``breaker.reset``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from shared.kernel.errors import Invalid, StewardError
from shared.kernel.ports import Record
from shared.kernel.steps import Publication, Transition, finish, settle

if TYPE_CHECKING:
    from shared.kernel.context import Context
    from shared.kernel.ports import LedgerPort

log = logging.getLogger("steward.commands")

KIND = "command"
REQUESTED, APPLIED, REJECTED = "requested", "applied", "rejected"
ACTIVE_STATES = frozenset({REQUESTED})
TERMINAL_STATES = frozenset({APPLIED, REJECTED})
REJECTED_EVENT = "Steward.Command.Rejected"
BREAKER_RESET = "breaker.reset"
ALLOWED: frozenset[str] = frozenset({BREAKER_RESET})
MAX_AGE_S = 3600.0
"""A command not applied within an hour of being asked is refused (the operator asks again, knowingly)."""
FUTURE_SKEW_S = 300.0
"""How far ahead of the app's clock a request may be stamped (clock skew of the operator's machine)."""
_WHO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
_REASON_MAX = 500


class Command(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What an operator asks (the ``data`` of a ``command`` record)."""

    command: Literal["breaker.reset"]
    by: str
    reason: str
    requested_at: float


def _problems(cmd: Command) -> list[str]:
    problems = []  # ``command`` itself is one of ALLOWED: the Literal refuses anything else when decoding
    if not _WHO.fullmatch(cmd.by):
        problems.append("by must name the operator: 1-128 characters of letters, digits and . _ @ + -")
    text = cmd.reason.strip()
    if not text or len(cmd.reason) > _REASON_MAX or any(ord(c) < 32 and c not in "\t" for c in cmd.reason):
        problems.append(f"reason must be 1-{_REASON_MAX} printable characters on one line")
    return problems


def parse(data: Mapping[str, Any]) -> Command:
    """The command in ``data``, validated; Invalid (with every problem) otherwise."""
    try:
        cmd = msgspec.convert(dict(data), Command, strict=True)
    except msgspec.ValidationError as error:
        raise Invalid(f"not a valid command: {error}", code="InvalidCommand") from None
    problems = _problems(cmd)
    if problems:
        raise Invalid("not a valid command: " + "; ".join(problems), code="InvalidCommand")
    return cmd


def request(ledger: LedgerPort, *, command: str, by: str, reason: str, now: float, id_: str | None = None) -> Record:
    """Ask the app to carry out ``command`` (fleetctl): validated here, written as a new ``command`` record.

    Raises Invalid before anything is written when the request is not valid."""
    cmd = parse({"command": command, "by": by, "reason": reason, "requested_at": float(now)})
    record = Record(kind=KIND, id=id_ or uuid.uuid4().hex, state=REQUESTED, data=msgspec.to_builtins(cmd),
                    created_at=now, updated_at=now, next_at=now,
                    history=[{"at": now, "state": REQUESTED, "note": f"{cmd.command} asked by {cmd.by}: {cmd.reason}"}])
    return ledger.create(record)


def _claimed(value: Any) -> str:
    """A value of the row as it may be shown in an event: text, at most 128 characters, on one line."""
    return "".join(c if c.isprintable() else " " for c in str(value))[:128] if value is not None else ""


def _reject(record: Record, *, now: float, reason: str) -> Transition:
    log.warning("command %s rejected: %s", record.id, reason)
    done = finish(record, REJECTED, now=now, note=reason, rejected_because=reason, finished_at=now)
    return done.publish(REJECTED_EVENT, f"commands/{record.id}", {
        "command_record": record.id, "reason": reason, "state_written": _claimed(record.state),
        "command": _claimed(record.data.get("command")), "by": _claimed(record.data.get("by"))})


def publisher(ctx: Context) -> Callable[[Publication], None]:
    """Publish a command's event through ``ctx.events``, best effort (the record is the audit trail); the
    id is derived from the record and the event, so a step repeated after a crash publishes the same id."""

    def publish(event: Publication) -> None:
        key = f"{event.data.get('command_record')}|{event.event_type}"
        try:
            ctx.events.publish(type_=event.event_type, subject=f"{ctx.settings.event_source}/{event.subject}",
                               data=event.data, id_=hashlib.sha256(key.encode()).hexdigest())
        except StewardError as exc:
            log.warning("could not publish %s: %s", event.event_type, exc)

    return publish


def step_requested(record: Record, ctx: Context, *, now: float, policy: None = None) -> Transition:
    """Validate the command again (whoever wrote the row) and carry it out once (shared.kernel.steps contract;
    commands have no policy of their own)."""
    if record.state != REQUESTED:
        return _reject(record, now=now, reason=f"a command in state {record.state!r} is not applied")
    fields = {k: v for k, v in record.data.items() if not k.startswith("_")}
    try:
        cmd = parse(fields)
    except Invalid as error:
        return _reject(record, now=now, reason=error.reason)
    if cmd.requested_at > now + FUTURE_SKEW_S:
        return _reject(record, now=now, reason=f"requested at {cmd.requested_at:.0f}, in the future (now {now:.0f})")
    if now - cmd.requested_at > MAX_AGE_S:
        return _reject(record, now=now, reason=f"requested {now - cmd.requested_at:.0f}s ago, more than "
                                                f"{MAX_AGE_S:.0f}s: ask again")
    if cmd.command == BREAKER_RESET:
        from shared.remediation import breaker

        state = breaker.reset(ctx, by=cmd.by, reason=cmd.reason, command=record.id)
        log.info("breaker reset by %s (command %s): %s", cmd.by, record.id, cmd.reason)
        return finish(record, APPLIED, now=now, note=f"breaker reset by {cmd.by}", finished_at=now,
                      result={"breaker": state.state, "reset_at": state.reset_at})
    return _reject(record, now=now, reason=f"command {cmd.command!r} has no handler")  # pragma: no cover - ALLOWED


def advance(record: Record, ctx: Context) -> Record:
    """The reconciler's step (the breaker publishes its own Reset event; a rejection publishes Rejected)."""
    return settle(step_requested(record, ctx, now=ctx.clock.now()), publisher(ctx))


def give_up(record: Record, ctx: Context, *, reason: str) -> Record:
    """The reconciler's hook for a command whose application keeps failing: ``rejected`` with why."""
    if record.state in TERMINAL_STATES:
        return record
    return settle(_reject(record, now=ctx.clock.now(), reason=reason), publisher(ctx))


def view(record: Record) -> dict[str, Any]:
    """What fleetctl shows of a command."""
    d = record.data
    return {"id": record.id, "state": record.state, "command": d.get("command"), "by": d.get("by"),
            "reason": d.get("reason"), "requested_at": d.get("requested_at"),
            "outcome": d.get("rejected_because") if record.state == REJECTED else (d.get("result") or {})}


__all__ = ["ACTIVE_STATES", "ALLOWED", "KIND", "REJECTED_EVENT", "Command", "advance", "give_up", "parse", "request", "view"]

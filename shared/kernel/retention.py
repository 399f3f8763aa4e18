"""How long the ledger keeps each kind of row, and the bounded sweep that deletes the rest (issue 19, item 4).

Every long job leaves rows behind: a finished remediation, a rejected pool request (one per malformed
queue message), a refusal reported once, a per-node signal row of a node long gone. Without an end the
table grows for ever, and so does every listing of a kind. Here each kind gets a :class:`Rule`: which of
its states may expire, after how long without a write (the later of ``created_at`` and ``updated_at``),
and, for a marker that belongs to a remediation, that the remediation it names is no longer active.
:func:`expired` is the pure decision; :func:`sweep` applies it, reading rows through :func:`scan` (the
store filters by kind, state and age, and returns a bounded page) and deleting at most
``LEDGER_RETENTION_MAX_DELETES`` rows per run, each under the ETag it was read with, so a row written
meanwhile is kept. An active row is never deleted: the rules name the states that may expire, and a row
whose lease is live is someone's work in progress.

The defaults (docs/architecture.md, "Durable records", says the same per kind):

- ``LEDGER_RETENTION_DAYS`` (30): finished ``remediation`` rows (done, gave_up, released, failed,
  refused, blocked), ``remediation-node`` rows once their last attempt has ended, ``pool-request`` rows that
  succeeded, failed or were blocked (a row the world did not bear out, kept for the operator),
  ``migration`` rows that are ``done``, ``command`` rows applied or rejected. A migration ``rolled_back``
  or ``blocked`` is never expired: an operator removes it to retry (otherwise the planner would plan the
  pool again by itself). A node still faulty after its rows expired is a new
  fault: at most one new attempt per retention period, under every budget.
- ``LEDGER_REJECTION_RETENTION_DAYS`` (7): ``pool-request`` rows ``rejected`` (a queue message lives at most
  7 days, so its redelivery is still recognised).
- ``LEDGER_DEDUPE_RETENTION_DAYS`` (7): ``dedupe`` markers (a refusal reported, a signal recorded, a VM
  action sent, a replace turn, a replacement claimed) and ``dcgm-report`` rows; a marker naming a
  remediation is kept while that remediation is active. An expired refusal marker means the refusal is
  reported once more if the fault is still refused.
- ``LEDGER_DECISION_RETENTION_DAYS`` (2): ``decision`` rows (a faulty node the sweep set aside, and why:
  shared.remediation.decisions), short-lived notes for ``fleetctl why``; written again while the skip lasts.
- ``LEDGER_SIGNAL_RETENTION_DAYS`` (30): per-node signal rows (``dcgm-node``, ``gpu-capacity-node``) not
  written for that long; the DCGM sweep's own, shorter expiry (SIGNALS_DCGM_ROW_RETENTION_S) still applies.
- ``budget`` and ``breaker`` are single rows, never expired.

A retention of 0 days keeps that class of rows for ever. The kinds and states are named here as data (the
kernel imports no job); tests/unit/test_retention.py holds each name to the job's own constant.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.kernel.env import env_int
from shared.kernel.errors import Conflict, StewardError
from shared.kernel.ports import LedgerPort, Record

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.retention")

DAY_S = 86400.0
SCAN_PAGE = 1000  # the most rows one scan returns (Azure Table storage's page)

REMEDIATION_ACTIVE: frozenset[str] = frozenset({"admitted", "cordoned", "draining", "repairing", "verifying"})
REMEDIATION_ENDED: frozenset[str] = frozenset({"done", "gave_up", "released", "failed", "refused", "blocked"})
POOL_REQUEST_ENDED: frozenset[str] = frozenset({"succeeded", "failed", "blocked"})
POOL_REQUEST_REJECTED: frozenset[str] = frozenset({"rejected"})
MIGRATION_DONE: frozenset[str] = frozenset({"done"})
COMMAND_ENDED: frozenset[str] = frozenset({"applied", "rejected"})


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each class of rows is kept, in days (0 = for ever), and the deletions per run."""

    terminal_days: int = 30
    rejection_days: int = 7
    dedupe_days: int = 7
    signal_days: int = 30
    decision_days: int = 2
    max_deletes: int = 200

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetentionPolicy:
        """Read the LEDGER_* retention settings (``env`` defaults to the process)."""
        return cls(
            terminal_days=env_int("LEDGER_RETENTION_DAYS", 30, env=env, minimum=0, maximum=3650),
            rejection_days=env_int("LEDGER_REJECTION_RETENTION_DAYS", 7, env=env, minimum=0, maximum=3650),
            dedupe_days=env_int("LEDGER_DEDUPE_RETENTION_DAYS", 7, env=env, minimum=0, maximum=3650),
            signal_days=env_int("LEDGER_SIGNAL_RETENTION_DAYS", 30, env=env, minimum=0, maximum=3650),
            decision_days=env_int("LEDGER_DECISION_RETENTION_DAYS", 2, env=env, minimum=0, maximum=3650),
            max_deletes=env_int("LEDGER_RETENTION_MAX_DELETES", 200, env=env, minimum=1, maximum=5000),
        )


@dataclass(frozen=True)
class Owner:
    """A row is kept while the record its ``data[field]`` names (of ``kind``) is in one of ``active``."""

    field: str
    kind: str
    active: frozenset[str]


@dataclass(frozen=True)
class Rule:
    """Rows of ``kind`` in ``states`` (None: any state) expire ``keep_s`` after their last write (0: never)."""

    kind: str
    keep_s: float
    states: frozenset[str] | None = None
    owner: Owner | None = None


def standard_rules(policy: RetentionPolicy) -> tuple[Rule, ...]:
    """The retention of every kind the app writes (see the module docstring)."""
    terminal, rejected = policy.terminal_days * DAY_S, policy.rejection_days * DAY_S
    dedupe, signal = policy.dedupe_days * DAY_S, policy.signal_days * DAY_S

    def remediation(field: str) -> Owner:
        return Owner(field=field, kind="remediation", active=REMEDIATION_ACTIVE)

    return (
        Rule("remediation", terminal, REMEDIATION_ENDED),
        Rule("remediation-node", terminal, owner=remediation("last_id")),
        Rule("pool-request", terminal, POOL_REQUEST_ENDED),
        Rule("pool-request", rejected, POOL_REQUEST_REJECTED),
        Rule("migration", terminal, MIGRATION_DONE),
        Rule("command", terminal, COMMAND_ENDED),
        Rule("dedupe", dedupe, owner=remediation("remediation")),
        Rule("dcgm-report", dedupe),
        Rule("dcgm-node", signal),
        Rule("gpu-capacity-node", signal),
        Rule("decision", policy.decision_days * DAY_S),
        Rule("pending-fault", dedupe),  # dropped by its own judge after a day (REMEDIATION_PENDING_FAULT_MAX_AGE_S)
    )


def last_written(record: Record) -> float:
    return max(record.created_at or 0.0, record.updated_at or 0.0)


def matches(record: Record, *, states: Collection[str] | None = None, due_by: float | None = None,
            older_than: float | None = None) -> bool:
    """:meth:`LedgerPort.scan`'s filter: ``state`` one of ``states``; ``next_at`` and ``lease_until`` at
    or before ``due_by`` (due, and claimed by no one); ``created_at`` and ``updated_at`` before ``older_than``."""
    if states is not None and record.state not in states:
        return False
    if due_by is not None and (record.next_at > due_by or record.lease_until > due_by):
        return False
    return older_than is None or (record.created_at < older_than and record.updated_at < older_than)


def scan(ledger: LedgerPort, kind: str, *, states: Sequence[str] | None = None, due_by: float | None = None,
         older_than: float | None = None, limit: int = SCAN_PAGE) -> list[Record]:
    """At most ``limit`` rows of ``kind`` that :func:`matches`, filtered by the store (:meth:`LedgerPort.scan`).

    A ledger that only lists (a wrapper or a test double written before ``scan``) is listed and
    filtered here, with the same result."""
    if getattr(type(ledger), "scan", None) is not None:
        return ledger.scan(kind, states=states, due_by=due_by, older_than=older_than, limit=limit)
    rows = ledger.list(kind, states=states)
    return [r for r in rows if matches(r, due_by=due_by, older_than=older_than)][:max(0, limit)]


def expired(record: Record, rule: Rule, *, now: float, owner_state: str | None = None) -> bool:
    """Whether ``rule`` lets ``record`` go now; ``owner_state`` is the state of the record its owner field
    names (None: it names none, or that record is gone)."""
    if rule.keep_s <= 0 or record.kind != rule.kind:
        return False
    if rule.states is not None and record.state not in rule.states:
        return False
    if record.lease_until > now or now - last_written(record) < rule.keep_s:
        return False
    return not (rule.owner is not None and owner_state is not None and owner_state in rule.owner.active)


@dataclass
class RetentionReport:
    deleted: dict[str, int] = field(default_factory=dict)  # kind -> rows deleted
    kept: int = 0  # old enough, but its owner is active (or it changed state)
    changed: int = 0  # written by someone else between the read and the delete: kept
    exhausted: bool = False  # the run's deletions ran out: more may be due next run
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"deleted": dict(self.deleted), "kept": self.kept, "changed": self.changed,
                "exhausted": self.exhausted, "errors": list(self.errors)}


def _owner_state(ledger: LedgerPort, record: Record, owner: Owner | None) -> str | None:
    if owner is None:
        return None
    named = record.data.get(owner.field)
    if not named:
        return None
    found = ledger.get(owner.kind, str(named))
    return found.state if found is not None else None


def _expire(ctx: Context, rule: Rule, *, quota: int, now: float, report: RetentionReport) -> int:
    """Delete up to ``quota`` expired rows of one rule; returns how many went."""
    rows = scan(ctx.ledger, rule.kind, states=sorted(rule.states) if rule.states is not None else None,
                older_than=now - rule.keep_s, limit=min(SCAN_PAGE, 2 * quota))
    deleted = 0
    for record in rows:
        if deleted >= quota:
            break
        if not expired(record, rule, now=now, owner_state=_owner_state(ctx.ledger, record, rule.owner)):
            report.kept += 1
            continue
        try:
            ctx.ledger.delete(record)  # conditional on the ETag read with the row
        except Conflict:
            report.changed += 1
            continue
        deleted += 1
    if deleted:
        report.deleted[rule.kind] = report.deleted.get(rule.kind, 0) + deleted
    return deleted


def sweep(ctx: Context, *, policy: RetentionPolicy, rules: Sequence[Rule] | None = None) -> RetentionReport:
    """Delete expired rows, at most ``policy.max_deletes`` in this run.

    Each rule first gets an equal part of the run's deletions, so a flood of one kind (rejections of
    malformed messages) cannot hold back the others; what is left goes to the rules that had more."""
    now = ctx.clock.now()
    report = RetentionReport()
    live = [r for r in (rules if rules is not None else standard_rules(policy)) if r.keep_s > 0]
    if not live:
        return report
    left = policy.max_deletes
    part = max(1, left // len(live))
    more: list[Rule] = []
    for rounds, todo in enumerate((live, more)):
        for rule in list(todo):
            if left <= 0:
                break
            quota = min(part, left) if rounds == 0 else left
            try:
                done = _expire(ctx, rule, quota=quota, now=now, report=report)
            except StewardError as exc:
                report.errors.append(f"{rule.kind}: {type(exc).__name__}: {exc}")
                continue
            left -= done
            if rounds == 0 and done >= quota:
                more.append(rule)
    report.exhausted = left <= 0
    if report.deleted or report.errors:
        log.info("ledger retention: %s", report.summary())
    return report

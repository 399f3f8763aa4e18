"""A migration's record: its states, its phases, and its data as one typed struct.

The ledger stores a record's ``data`` as JSON (shared.adapters.ledger); :func:`read` turns it into
a :class:`MigrationData` the steps read by attribute, and :func:`written` turns one back into the
mapping a step merges into the record. Keys are snake_case throughout; ``body`` alone keeps ARM's
camelCase, because it is the replacement pool's ``properties`` exactly as they are PUT.

Rows written before the struct existed still load: every field has a default (a row gains keys as
its migration goes on), and :func:`upgrade` maps the few stored values the struct spells
differently. tests/fixtures/stored_records/migration.json holds a row of every shape the code
wrote before; tests/unit/test_migration_records.py decodes each one.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgspec

from shared.kernel.errors import Invalid

KIND = "migration"


class MigrationState(StrEnum):
    """Where a migration is (``Record.state``); docs/migration.md draws the transitions."""

    PLANNED = "planned"  # recorded by the planner; nothing created yet
    CREATING = "creating"  # the replacement's PUT was sent
    VALIDATING = "validating"  # the replacement exists: its GPU stack and the pods' fit are checked
    CORDONING = "cordoning"  # the old pool's autoscaler is frozen and its nodes cordoned
    DRAINING = "draining"  # old nodes drained in batches (phases: drain, then shrink and grow when rolling)
    DELETING = "deleting"  # every old node drained: the old pool is deleted
    ROLLING_BACK = "rolling_back"  # the replacement is removed and the old pool serves again
    DONE = "done"
    ROLLED_BACK = "rolled_back"
    BLOCKED = "blocked"  # stopped where it was, with the reason; an operator removes the record to retry


ACTIVE_STATES: frozenset[str] = frozenset({
    MigrationState.PLANNED, MigrationState.CREATING, MigrationState.VALIDATING, MigrationState.CORDONING,
    MigrationState.DRAINING, MigrationState.DELETING, MigrationState.ROLLING_BACK})
TERMINAL_STATES: frozenset[str] = frozenset({MigrationState.DONE, MigrationState.ROLLED_BACK, MigrationState.BLOCKED})


class Phase(StrEnum):
    """Sub-steps of ``draining``: drain a batch; with the rolling strategy, then remove its machines
    from the old pool (shrink) and add a batch to the replacement (grow)."""

    DRAIN = "drain"
    SHRINK = "shrink"
    GROW = "grow"


class Strategy(StrEnum):
    """``surge``: the whole replacement first; ``rolling``: one batch at a time, for want of quota."""

    SURGE = "surge"
    ROLLING = "rolling"


class AutoscalerBounds(msgspec.Struct, kw_only=True):
    """The old pool's autoscaler bounds, remembered while it is frozen (restored only on a rollback)."""

    min: int | None = None
    max: int | None = None


class Progress(msgspec.Struct, kw_only=True):
    """How far the drain is, as the events and ``fleetctl status`` show it."""

    nodes_drained: int = 0
    nodes_total: int = 0
    batch: int = 0
    batches: int = 0
    nodes_lost: int = 0
    phase: Phase = Phase.DRAIN


class MigrationData(msgspec.Struct, kw_only=True):
    """Everything a migration record carries (``Record.data``), as the steps read and write it."""

    # What the plan promised (shared.migration.planner.record_for); checked against ARM at every step.
    cluster_id: str = ""
    cluster_name: str = ""
    location: str = ""
    pool: str = ""
    replacement: str = ""
    vm_size: str = ""
    node_count: int = 0
    strategy: Strategy = Strategy.ROLLING
    strategy_reason: str = ""
    batch_size: int = 1
    family: str = ""
    vcpus_per_node: int = 0
    gpus_per_node: int = 0
    order: int = 0
    body: dict[str, Any] = {}  # the replacement's ARM properties (full count), camelCase as PUT
    quota: str = ""
    autoscaler: str = ""  # what happens to the cluster autoscaler (shared.migration.plan.autoscaler_note)
    # How it goes.
    waiting: str = ""  # why the current state waits ("" after a move)
    strategy_switched: str = ""
    replacement_count: int = 0
    create_deadline: float = 0.0
    validate_deadline: float = 0.0
    grow_deadline: float = 0.0
    autoscaler_was: AutoscalerBounds | None = None
    cordoned: list[str] = []
    nodes_total: int = 0
    phase: Phase = Phase.DRAIN
    batch: list[str] = []
    drain: dict[str, dict[str, Any]] = {}  # node -> shared.drain.state.DrainState.to_data()
    drained: list[str] = []
    shrinking: list[str] = []
    shrink_sent: bool = False
    removed: list[str] = []
    lost: dict[str, str] = {}  # node -> why the platform took it (a spot eviction)
    capacity_held_since: float = 0.0  # when the capacity floor first held the next batch (0 = it does not)
    progress: Progress | None = None
    delete_sent: bool = False
    reason: str = ""  # why it rolls back, or why it is blocked
    final: MigrationState = MigrationState.ROLLED_BACK  # where a rollback ends
    uncordoned: bool = False


_OPTIONAL = frozenset({"autoscaler_was", "progress"})


def upgrade(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored row's data in the struct's spelling: a ``null`` the code once wrote for a field that is
    not optional (``autoscaler`` was written as ``null`` when neither pool autoscaled) reads as the
    field's default. Keys the struct does not know (the reconciler's ``_last_error``...) are kept."""
    return {k: v for k, v in raw.items() if v is not None or k in _OPTIONAL}


def read(data: Mapping[str, Any]) -> MigrationData:
    """The record's data as a :class:`MigrationData`; Invalid (with the field) when a value has the wrong type."""
    try:
        return msgspec.convert(upgrade(data), MigrationData)
    except msgspec.ValidationError as exc:
        raise Invalid(f"the migration record cannot be read: {exc}") from None


def written(data: MigrationData) -> dict[str, Any]:
    """The data as the record stores it (every field, so a value set back to its default is stored too)."""
    out: dict[str, Any] = msgspec.to_builtins(data)
    return out


def progress(data: MigrationData) -> Progress:
    """Nodes drained of the total, and which batch of how many."""
    total = data.nodes_total or data.node_count
    drained = len(data.drained)
    batch = max(1, data.batch_size)
    batches = (total + batch - 1) // batch if total else 0
    current = min(batches, drained // batch + (1 if data.batch else 0))
    return Progress(nodes_drained=drained, nodes_total=total, batch=current, batches=batches,
                    nodes_lost=len(data.lost), phase=data.phase)

"""What a remediation writes to the ledger: its states, rungs and phases, its typed data, and its ids.

Four kinds of rows belong to remediation (docs/remediation.md lists their fields):

- ``remediation`` — one per attempt on one node, data :class:`RemediationData`;
- ``remediation-node`` — one per node, the attempts and faults already handled (:class:`NodeData`);
- ``budget``/``fleet`` — the slots of remediations in flight (:class:`BudgetData`);
- ``dedupe`` — insert-if-absent markers: a refusal reported (:class:`RefusedMarker`), a VM action or
  ``deleteMachines`` sent (:class:`OpMarker`), a pool's replace turn (:class:`TurnMarker`), a
  replacement node claimed (:class:`ClaimMarker`).

``Record.data`` stays a plain mapping in the ledger (the reconciler keeps its own ``_``-prefixed keys
in it too); a step reads it through :func:`load` and writes it through :func:`fields`, so both sides go
through the same typed fields with one key style (snake_case). Rows stored by earlier versions load
through :func:`upgrade`; tests/fixtures/stored_records/remediation.json holds one of every stored shape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

import msgspec

from shared.kernel.ports import Record
from shared.kernel.timefmt import iso, parse_time

KIND = "remediation"
NODE_KIND = "remediation-node"
BUDGET_KIND, BUDGET_ID = "budget", "fleet"
DEDUPE_KIND = "dedupe"


class State(StrEnum):
    """A remediation record's state: ``admitted → cordoned → draining → repairing → verifying → done``."""

    ADMITTED = "admitted"
    CORDONED = "cordoned"
    DRAINING = "draining"
    REPAIRING = "repairing"
    VERIFYING = "verifying"
    DONE = "done"
    GAVE_UP = "gave_up"  # every rung failed, or a permanent error: the node stays cordoned (if ours)
    RELEASED = "released"  # nothing left to do, or the "release" drain fallback
    FAILED = "failed"  # we are not allowed to act
    REFUSED = "refused"  # the node's identity is in doubt, or the platform is taking it away
    BLOCKED = "blocked"  # the world does not bear the row out (no marker of ours, no admission): nothing touched


ACTIVE_STATES: frozenset[str] = frozenset({State.ADMITTED, State.CORDONED, State.DRAINING, State.REPAIRING,
                                           State.VERIFYING})
TERMINAL_STATES: frozenset[str] = frozenset({State.DONE, State.GAVE_UP, State.RELEASED, State.FAILED, State.REFUSED,
                                             State.BLOCKED})


class Rung(StrEnum):
    """A step of the repair ladder (REMEDIATION_LADDER), cheapest first."""

    RESTART = "restart"
    REIMAGE = "reimage"
    REPLACE = "replace"


class RungPhase(StrEnum):
    """Where a rung is: restart/reimage use start → (requested) → wait; replace its own phases."""

    START = "start"
    REQUESTED = "requested"  # a VM action may have gone out: judged from the node, never sent blindly
    WAIT = "wait"
    SURGE = "surge"
    SURGE_WAIT = "surge_wait"
    DELETE = "delete"
    DELETE_WAIT = "delete_wait"
    SCALE_BACK = "scale_back"
    AWAIT_REPLACEMENT = "await_replacement"
    CLAIM_WAIT = "claim_wait"  # node auto-provisioning: the NodeClaim was deleted


class ReplaceMode(StrEnum):
    SURGE = "surge"  # count+1 first, then delete the broken machine
    DELETE_FIRST = "delete-first"  # delete, then restore the count
    NODECLAIM = "nodeclaim"  # Karpenter: delete the NodeClaim


class Event(StrEnum):
    """The outcome CloudEvents, published as ``Steward.Remediation.<name>``."""

    ADMITTED = "Admitted"
    CORDONED = "Cordoned"
    DRAINED = "Drained"
    RESTARTED = "Restarted"
    REIMAGED = "Reimaged"
    REPLACED = "Replaced"
    RECOVERED = "Recovered"
    REFUSED = "Refused"
    GAVE_UP = "GaveUp"
    FAILED = "Failed"
    DRY_RUN = "DryRun"
    BLOCKED = "Blocked"  # a row whose preconditions the world does not prove (shared.remediation.preconditions)
    SIGNAL_RECORDED = "SignalRecorded"  # a signal whose policy row only records it (shared.remediation.signals)
    PENDING_DROPPED = "PendingDropped"  # a kept refused fault let go (shared.remediation.pending_faults)


UNHEALTHY_EVENT = "Steward.GpuNode.Unhealthy"
EVENT_PREFIX = "Steward.Remediation."
RUNG_EVENTS: Mapping[str, Event] = {Rung.RESTART: Event.RESTARTED, Rung.REIMAGE: Event.REIMAGED,
                                    Rung.REPLACE: Event.REPLACED}
GOING_AWAY = "GoingAway"  # refusal code: the platform is taking the node away (shared.fleet.node_fate)
POOL_LABEL = "kubernetes.azure.com/agentpool"


# --------------------------------------------------------------------------- typed data


class ReplaceData(msgspec.Struct, kw_only=True):
    """The replace rung's own progress (``data.replace``)."""

    mode: ReplaceMode | None = None
    original_count: int | None = None
    target_count: int | None = None
    autoscaled: bool = False
    replacement: str = ""
    note: str = ""
    delete_seq: int | None = None
    surge_error: str = ""
    nodeclaim: str = ""
    gone_at: float | None = None
    found_at: float | None = None  # when the replacement was first read healthy (and claimed)
    newcomer: str = ""  # the node that came for the broken one but was not healthy when the rung gave up


class Escalation(msgspec.Struct, kw_only=True, rename={"from_": "from"}):
    """Why a VM-level rung was skipped for ``replace`` (``data.escalation``)."""

    from_: str
    code: str
    reason: str
    at: float


class Refusal(msgspec.Struct, kw_only=True):
    code: str
    reason: str


class RemediationData(msgspec.Struct, kw_only=True):
    """``Record.data`` of a ``remediation`` record. Unknown keys (the reconciler's ``_...``) are ignored."""

    cluster: str
    node: str
    node_uid: str = ""
    pool: str = ""
    pool_selector: str = ""
    nap: bool = False
    provider_id: str = ""
    arm_vm_id: str = ""
    condition: str = ""
    since: str = ""
    since_ts: float = 0.0
    fault: str = ""
    event_id: str = ""
    attempt: int = 0
    dry_run: bool = False
    ladder: list[Rung] = []
    rung_index: int = 0
    rung_phase: RungPhase = RungPhase.START
    cap_reached: str = ""
    admitted_by: str = ""
    admitted_at: float = 0.0
    signal: str = "npd"  # where the fault was seen (shared.remediation.signals.SignalSource); old rows: NPD
    signal_detail: str = ""  # the source's own words, for the report
    policy_row: str = ""  # the row of shared.remediation.signal_policy that matched ("" for an NPD condition)
    last_note: str = ""
    cordoned_by_us: bool = False
    cordoned_at: float | None = None
    drain: dict[str, Any] = {}  # shared.drain's DrainState.to_data(): the drain package owns its shape
    drain_started_at: float | None = None
    slot_released_at: float | None = None  # a drain held by a PDB gave its budget slot back (preconditions.reserve)
    drain_outcome: str = ""
    rung_entered_at: float | None = None
    rung_started_at: float | None = None
    rung_away_s: float = 0.0  # time this rung's steps ran late (a crashed host's lease, a lost nudge): not Azure's
    away_total_s: float = 0.0  # every rung's credit for that, summed (how much longer than its timeouts it may run)
    requested_at: float | None = None
    op_seq: int | None = None
    vm_id: str = ""
    boot_id_before: str = ""
    replace: ReplaceData = msgspec.field(default_factory=ReplaceData)
    escalation: Escalation | None = None
    refusal: Refusal | None = None
    verify_since: float | None = None
    target: str = ""
    finished_at: float | None = None

    @property
    def rung(self) -> Rung | None:
        """The rung the ladder is on (None once it ran out, or for a cordon-only remediation)."""
        return self.ladder[self.rung_index] if self.rung_index < len(self.ladder) else None


class Attempt(msgspec.Struct, kw_only=True):
    id: str
    at: float
    fault: str = ""


class NodeData(msgspec.Struct, kw_only=True):
    """``Record.data`` of a ``remediation-node`` record: what was already done on one node."""

    cluster: str
    node: str
    attempts: list[Attempt] = []
    faults: list[str] = []
    last_id: str = ""
    count: int = 0


class Slot(msgspec.Struct, kw_only=True):
    cluster: str
    pool: str
    node: str
    at: float = 0.0


class BudgetData(msgspec.Struct, kw_only=True):
    """``Record.data`` of the ``budget``/``fleet`` record: the slots of remediations in flight, by record id."""

    slots: dict[str, Slot] = {}


class RefusedMarker(msgspec.Struct, kw_only=True):
    """``dedupe`` ``refused-<fault>-<code>``: this refusal was reported once."""

    reason: str
    reason_code: str
    cluster: str | None = None
    node: str | None = None


class OpMarker(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``dedupe`` ``op-...``: a restart/reimage (``vm_id``) or a deleteMachines (``machine``) may have been sent."""

    remediation: str
    rung: Rung
    requested_at: float
    by: str = ""
    vm_id: str = ""
    machine: str = ""
    boot_id: str = ""


class TurnMarker(msgspec.Struct, kw_only=True):
    """``dedupe`` ``replace-turn-...``: the one remediation of a pool allowed to replace right now."""

    remediation: str
    cluster: str
    pool: str
    at: float = 0.0
    by: str = ""


class ClaimMarker(msgspec.Struct, kw_only=True):
    """``dedupe`` ``replacement-...``: a node taken as one remediation's replacement."""

    remediation: str
    cluster: str
    pool: str
    node: str
    uid: str


S = TypeVar("S", bound=msgspec.Struct)


def upgrade(data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored remediation's data in today's shape.

    Every key was snake_case already, so nothing is renamed. What differs between stored rows is what
    an earlier step left behind: ``replace``, ``escalation`` and ``refusal`` written as ``{}`` or
    ``None`` meant "none"; ``since_ts`` was derived from ``since`` before it was stored on its own.
    """
    out = dict(data)
    for key in ("escalation", "refusal"):
        if not out.get(key):
            out.pop(key, None)
    if not out.get("replace"):
        out.pop("replace", None)
    if out.get("since_ts") is None and out.get("since"):
        out["since_ts"] = parse_time(out["since"]) or 0.0
    if out.get("drain") is None:
        out.pop("drain", None)
    return out


def load(record: Record) -> RemediationData:
    """The typed view of a remediation record's data (raises msgspec.ValidationError on a broken row)."""
    return msgspec.convert(upgrade(record.data), RemediationData, strict=False)


def decode(data: Mapping[str, Any], type_: type[S]) -> S:
    """A stored node / budget / dedupe row's data as its Struct."""
    return msgspec.convert(dict(data), type_, strict=False)


def to_data(value: msgspec.Struct) -> dict[str, Any]:
    """A Struct as the plain mapping the ledger stores."""
    return msgspec.to_builtins(value)


_FIELDS = frozenset(RemediationData.__struct_fields__)


def fields(**changes: Any) -> dict[str, Any]:
    """Changes to a remediation's data, checked against :class:`RemediationData` (one key style, no typos)
    and turned into what the ledger stores (Structs and enums as plain values)."""
    unknown = sorted(set(changes) - _FIELDS)
    if unknown:
        raise TypeError(f"not fields of a remediation's data: {', '.join(unknown)}")
    return {k: msgspec.to_builtins(v) if isinstance(v, msgspec.Struct | StrEnum | list) else v
            for k, v in changes.items()}


# --------------------------------------------------------------------------- identities

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]")
TURN_PREFIX, CLAIM_PREFIX = "replace-turn-", "replacement-"


def node_key(cluster_id: str, node: str) -> str:
    return hashlib.sha256(f"{cluster_id.lower()}/{node}".encode()).hexdigest()[:24]


def fault_id(cluster_id: str, node: str, condition: str, since: float) -> str:
    """The id of one fault (and of its Unhealthy CloudEvent): sha256(cluster|node|condition|transition)."""
    return hashlib.sha256(f"{cluster_id.lower()}|{node}|{condition}|{iso(since)}".encode()).hexdigest()


def subject(cluster_id: str, pool: str, node: str) -> str:
    return f"{cluster_id}/agentPools/{pool}/nodes/{node}"


def label_value(text: str) -> str:
    """``text`` as a valid Kubernetes label value (63 characters, alphanumeric at both ends)."""
    return (_LABEL_VALUE.sub("-", text).strip("-._") or "steward")[:63].rstrip("-._") or "steward"


def lease_name(node: str) -> str:
    return f"gpu-fleet-steward-{label_value(node)}"


def op_key(record_id: str, rung_index: int, rung: str, seq: int) -> str:
    return f"op-{record_id}-{rung_index}-{rung}-{seq}"


def turn_key(cluster_id: str, pool: str) -> str:
    return TURN_PREFIX + hashlib.sha256(f"{cluster_id.lower()}/{pool}".encode()).hexdigest()[:24]


def claim_key(cluster_id: str, node: str, uid: str) -> str:
    return CLAIM_PREFIX + hashlib.sha256(f"{cluster_id.lower()}/{node}/{uid}".encode()).hexdigest()[:32]

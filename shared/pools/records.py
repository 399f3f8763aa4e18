"""The pool-request record: its states, its typed data, and how rows stored by older versions load.

A pool request lives in the ledger as a :class:`~shared.kernel.ports.Record` of kind ``pool-request``
whose ``data`` is described by :class:`PoolRequestData`: one msgspec Struct, snake_case keys, enums for
states and outcomes. Steps read the record through :func:`decode` and write with the kernel's
``stay/move/finish`` (snake_case keyword arguments, builtins only), so what is stored is always what
:class:`PoolRequestData` decodes; :func:`normalised` re-encodes it after every step.

The submitted request (``data.request``) keeps its documented wire schema, camelCase
(schemas/pool-request.v1.json, :class:`shared.pools.request.PoolRequest`), and so do the CloudEvents
(:func:`wire`): only the record's own keys changed style. Rows written before the change used a few
camelCase keys (``vmSize``, ``dequeueCount``, ``readyNodes``...); :func:`upgrade_keys` maps them on read,
so those rows still load and are stored in the new style at their next save.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgspec

from shared.kernel.ports import Record
from shared.pools.request import PoolRequest

KIND = "pool-request"


class State(StrEnum):
    """Where a pool request is. ``accepted -> creating -> validating -> [testing] -> succeeded``;
    any active state may end ``failed``; an invalid message ends ``rejected`` at once; a row the world
    does not bear out (shared.pools.proof: a forged or edited ledger row) ends ``blocked`` untouched."""

    ACCEPTED = "accepted"
    CREATING = "creating"
    VALIDATING = "validating"
    TESTING = "testing"
    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    FAILED = "failed"
    BLOCKED = "blocked"


ACTIVE_STATES: tuple[State, ...] = (State.ACCEPTED, State.CREATING, State.VALIDATING, State.TESTING)
TERMINAL_STATES: tuple[State, ...] = (State.SUCCEEDED, State.REJECTED, State.FAILED, State.BLOCKED)

#: Between a team's name and its request id in a row's id: neither may contain it
#: (shared.pools.teams.TEAM_NAME, shared.pools.rules.REQUEST_ID).
ID_SEPARATOR = ":"


def record_id(team: str | None, request_id: str) -> str:
    """The ledger id of a request: ``<team>:<requestId>``, so that two teams may use the same request id and
    neither can take (or "adopt") the other's. Without a team (tools and tests calling intake directly) it
    is the request id, as every row was keyed before teams owned their ids."""
    return f"{team}{ID_SEPARATOR}{request_id}" if team else request_id


def split_id(value: str) -> tuple[str | None, str]:
    """``(team, request id)`` of a row id; ``(None, id)`` for a row keyed by its request id alone."""
    team, sep, request_id = value.partition(ID_SEPARATOR)
    return (team, request_id) if sep else (None, value)


class SampleJobResult(StrEnum):
    """What the outcome says of the sample GPU job."""

    SUCCEEDED = "succeeded"
    NOT_REQUESTED = "not requested"


class CleanupAction(StrEnum):
    """What became of the pool of a failed request (POOL_REQUEST_FAILED_POOL_ACTION, docs/pool-requests.md)."""

    NONE = "none"  # nothing of this request's to remove, or not ours to touch
    KEPT = "kept"  # workload pods run on it, or the steward is paused
    DELETED = "deleted"
    SCALED_TO_ZERO = "scaledToZero"
    FAILED = "failed"  # the removal itself failed: the pool may be billing


class _Data(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of the record's structs: snake_case keys, unset fields left out of the stored JSON."""


class StackReport(_Data):
    """The GPU stack check's verdict (shared.fleet.stack.evaluate_stack) as the record keeps it."""

    ok: bool
    problems: list[str]
    ready_nodes: int
    gpu_allocatable: int
    resources: dict[str, int]


class JobRef(_Data):
    """The sample Job this request created: ``uid`` is the only proof, later, that a Job of the name is ours."""

    name: str
    namespace: str
    uid: str = ""
    found_uid: str | None = None  # the uid of a same-named Job that was not ours


class Cleanup(_Data):
    action: CleanupAction
    note: str = ""


class ErrorInfo(_Data):
    code: str
    message: str = ""


class Failing(_Data):
    """A failure decided while the pool's cleanup had to wait for a running operation on it."""

    code: str
    message: str = ""
    since: float = 0.0
    stack: StackReport | None = None
    job: JobRef | None = None


class Outcome(_Data):
    """The end of a request, as the record keeps it and the Created/Failed events carry it."""

    state: State
    nodes: int | None = None
    resources: dict[str, int] | None = None
    sample_job: SampleJobResult | None = None
    stack: StackReport | None = None
    stage: State | None = None
    code: str | None = None
    message: str | None = None
    cleanup: Cleanup | None = None


class ProblemRow(_Data):
    """One reason a message was rejected (shared.pools.validation.Problem)."""

    field: str
    problem: str
    fix: str


class PoolRequestData(_Data):
    """``record.data`` of a pool request (every key any version of this kind writes)."""

    # intake
    request: PoolRequest | None = None  # the validated request, in its wire schema (camelCase)
    fingerprint: str | None = None
    cluster: str | None = None
    pool: str | None = None
    requester: str | None = None
    vm_size: str | None = None
    dequeue_count: int = 0
    announced: bool = False
    team: str | None = None
    queue: str | None = None
    claimed_requester: str | None = None
    # a rejected message (no request)
    request_id: str | None = None
    reasons: list[str] = []
    problems: list[ProblemRow] = []
    problem_count: int = 0
    message: str | None = None
    digest: str | None = None
    message_bytes: int = 0
    message_head: str | None = None
    # progress
    puts: int = 0
    preview: bool | None = None
    nap: bool = False
    location: str | None = None
    deadline: float | None = None
    provisioning_state: str | None = None
    stack: StackReport | None = None
    job: JobRef | None = None
    paused_since: float | None = None
    waiting: str | None = None
    last_note: str | None = None
    failing: Failing | None = None
    # the end
    error: ErrorInfo | None = None
    outcome: Outcome | None = None
    cleanup: Cleanup | None = None
    feature: str | None = None
    reason: str | None = None  # why the row was blocked (shared.pools.proof)
    # the reconciler's bookkeeping (shared.kernel.reconciler)
    error_streak: int | None = msgspec.field(default=None, name="_error_streak")
    last_error: str | None = msgspec.field(default=None, name="_last_error")
    permanent_tries: int | None = msgspec.field(default=None, name="_permanent_tries")
    stuck: str | None = msgspec.field(default=None, name="_stuck")


# ----------------------------------------------------------------------------- rows of older versions

#: Keys of ``data`` that versions before the typed record wrote in camelCase.
RENAMED_KEYS: Mapping[str, str] = {
    "vmSize": "vm_size", "dequeueCount": "dequeue_count", "claimedRequester": "claimed_requester",
    "provisioningState": "provisioning_state", "problemCount": "problem_count", "messageBytes": "message_bytes",
    "messageHead": "message_head", "requestId": "request_id",
}
_RENAMED_NESTED: Mapping[str, str] = {"readyNodes": "ready_nodes", "gpuAllocatable": "gpu_allocatable",
                                      "sampleJob": "sample_job", "foundUid": "found_uid"}


def _renamed(value: Any) -> Any:
    return {_RENAMED_NESTED.get(k, k): v for k, v in value.items()} if isinstance(value, Mapping) else value


def upgrade_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with the keys older versions wrote mapped to today's (a row already new is unchanged).

    Only the record's own keys are renamed: ``request`` is the wire schema and is left as it is. A
    new key wins over an old one of the same meaning. ``failing.data`` (the extra fields of a failure
    waiting for its cleanup) became fields of ``failing`` itself.
    """
    out = {RENAMED_KEYS.get(k, k): v for k, v in data.items() if k not in RENAMED_KEYS or RENAMED_KEYS[k] not in data}
    for key in ("stack", "job"):
        out[key] = _renamed(out[key]) if key in out else None
        if out[key] is None:
            del out[key]
    outcome = out.get("outcome")
    if isinstance(outcome, Mapping):
        out["outcome"] = {**_renamed(outcome), **({"stack": _renamed(outcome["stack"])} if "stack" in outcome else {})}
    failing = out.get("failing")
    if isinstance(failing, Mapping):
        extra = failing.get("data")
        extra = extra if isinstance(extra, Mapping) else {}
        merged = {k: v for k, v in failing.items() if k != "data"}
        merged.update({k: _renamed(v) for k, v in extra.items() if k in ("stack", "job")})
        out["failing"] = merged
    return out


def decode(data: Mapping[str, Any]) -> PoolRequestData:
    """The typed data of a stored row (any version). Raises msgspec.ValidationError when it does not decode."""
    return msgspec.convert(upgrade_keys(data), PoolRequestData)


def typed(record: Record) -> tuple[PoolRequestData, PoolRequest]:
    """The typed data of an active record and its request; a step's first line.

    Raises msgspec.ValidationError when the data does not decode, or holds no request (only the
    intake writes it, so such a row was not written by this app: shared.pools.steps fails it).
    """
    data = decode(record.data)
    if data.request is None:
        raise msgspec.ValidationError("the record holds no request (`$.request` is missing)")
    return data, data.request


def encode(data: PoolRequestData) -> dict[str, Any]:
    """What is stored for ``data`` (builtins, snake_case, unset fields left out)."""
    result: dict[str, Any] = msgspec.to_builtins(data)
    return result


def normalised(record: Record) -> Record:
    """``record`` with its data decoded and re-encoded: every key typed, old keys renamed, ``None`` dropped."""
    return msgspec.structs.replace(record, data=encode(decode(record.data)))


def builtins(value: Any) -> Any:
    """A struct as the builtins a step writes into ``data`` (``None`` stays ``None``)."""
    return None if value is None else msgspec.to_builtins(value)


# ----------------------------------------------------------------------------- events

def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def wire(value: Any) -> Any:
    """A struct as CloudEvent data: field names in camelCase, as the events have always carried them.

    Unset (``None``) fields are left out. Only struct field names change: the keys of free maps
    (resource names in ``resources``) are data and pass through untouched.
    """
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        for field in msgspec.structs.fields(type(value)):
            item = getattr(value, field.name)
            if item is None:
                continue
            out[_camel(field.encode_name)] = wire(item)
        return out
    if isinstance(value, StrEnum):
        return str(value)
    if isinstance(value, Mapping):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [wire(v) for v in value]
    return value

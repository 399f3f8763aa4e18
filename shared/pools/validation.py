"""Whether a queue message is a valid version-1 pool request (pure): parse, type-check, apply the rules.

Teams drop a JSON message on their pool-request queue; this module decides, before any Azure call,
whether it can become a managed GPU node pool. The message is size-capped, decoded as UTF-8 JSON,
type-checked field by field against :class:`~shared.pools.request.PoolRequest` (unknown fields named,
with a "did you mean"), and judged by the rules of :mod:`shared.pools.rules`; *all* problems are
reported at once. Nothing here executes, formats into a query, or logs a raw message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Union, get_args, get_origin, get_type_hints

import msgspec

from shared.fleet import gpu_sizes
from shared.pools.policy import PoolRequestPolicy
from shared.pools.request import KNOWN_SCHEMA_VERSIONS, SCHEMA_VERSION, PoolRequest, Problem
from shared.pools.rules import CLUSTER_ID, POOL_NAME, REQUEST_ID, REQUESTER, check_rules, show


@dataclass(frozen=True)
class Rejection:
    """A request that can never succeed as sent. Final: the message is not retried."""

    problems: tuple[Problem, ...]
    request_id: str | None = None  # when the message carried a well-formed requestId
    requester: str | None = None
    cluster: str | None = None
    pool_name: str | None = None
    digest: str = ""  # sha256 of the raw message (keys the ledger entry when request_id is None)
    size: int = 0  # bytes of the raw message
    head: str = ""  # its first HEAD_BYTES bytes, escaped to printable ASCII (see escape_head)

    @property
    def message(self) -> str:
        count = len(self.problems)
        head = f"pool request rejected: {count} problem{'s' if count != 1 else ''}"
        return head + "".join(f"\n- {p}" for p in self.problems)


@dataclass(frozen=True)
class ValidatedRequest:
    """A request that passed every rule, with defaults applied (taints, gpuDriver)."""

    request: PoolRequest
    size: gpu_sizes.GpuSize
    fingerprint: str  # sha256 of the normalised request: tells a re-delivery from a reused id
    claimed_requester: str = ""  # the message's own ``requester`` when the queue's team replaced it

    @property
    def request_id(self) -> str:
        return self.request.request_id



HEAD_BYTES = 256
"""How much of a rejected message is kept (record and Rejected event), so an operator sees what was sent."""


def message_bytes(raw: bytes | str) -> bytes:
    """The message as the bytes that were sent (a str from the trigger is UTF-8; lone surrogates kept)."""
    return raw.encode("utf-8", errors="surrogatepass") if isinstance(raw, str) else bytes(raw)


def escape_head(data: bytes, limit: int = HEAD_BYTES) -> str:
    """The first ``limit`` bytes as printable ASCII: other bytes (and ``\\``) become ``\\xNN``.

    Safe to put in a table row, a CloudEvent, a log line or a terminal: no control character, no
    newline, no markup survives, and the bytes can be recovered exactly.
    """
    return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in data[:limit])


def evidence(raw: bytes | str) -> dict[str, Any]:
    """``digest`` (sha256 hex), ``size`` and ``head`` of a message, the fields a Rejection carries."""
    data = message_bytes(raw)
    return {"digest": hashlib.sha256(data).hexdigest(), "size": len(data), "head": escape_head(data)}


# ------------------------------------------------------------------------------- entry point


def parse_and_validate(raw: bytes | str, *, policy: PoolRequestPolicy,
                       in_scope: Callable[[str], bool], requester: str | None = None) -> ValidatedRequest | Rejection:
    """Decide whether ``raw`` is a valid version-1 pool request.

    ``in_scope(cluster_id)`` says whether the cluster belongs to the fleet this app manages; it is
    called only with a well-formed cluster ARM id. It may do I/O (a tag lookup) and may raise
    Throttled/Transient, which the caller lets through so that the queue retries the message.

    ``requester``: who really asked, known from the queue the message came from (shared.pools.teams).
    It replaces the message's own ``requester`` in the result (and in a rejection), so the record,
    the fingerprint and the pool's requester tag name the team; the message's claim is kept as
    ``claimed_requester`` and used for nothing else.
    """
    result = _parse_and_validate(raw, policy=policy, in_scope=in_scope)
    if requester is None:
        return result
    if isinstance(result, Rejection):
        return dataclasses.replace(result, requester=requester)
    claimed = result.request.requester
    request = msgspec.structs.replace(result.request, requester=requester)
    fingerprint = hashlib.sha256(msgspec.json.encode(request, order="sorted")).hexdigest()
    return ValidatedRequest(request, result.size, fingerprint, claimed_requester=claimed)


def _parse_and_validate(raw: bytes | str, *, policy: PoolRequestPolicy,
                        in_scope: Callable[[str], bool]) -> ValidatedRequest | Rejection:
    data = message_bytes(raw)
    seen = evidence(data)
    if len(data) > policy.max_payload_bytes:
        return Rejection((Problem("$", f"the message is {len(data)} bytes, over the limit of {policy.max_payload_bytes}",
                                  "send only the request fields; large values do not belong in a pool request"),),
                         **seen)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Rejection((Problem("$", "the message is not UTF-8 text", "send the request as UTF-8 encoded JSON"),),
                         **seen)
    try:
        obj = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:
        return Rejection((Problem("$", f"the message is not valid JSON ({_short_error(exc)})",
                                  "send one JSON object, e.g. {\"schemaVersion\": \"1\", ...}"),), **seen)
    if not isinstance(obj, dict):
        return Rejection((Problem("$", f"the message is JSON {type(obj).__name__}, not an object",
                                  "send one JSON object with the request fields"),), **seen)

    ids = _readable_ids(obj)
    version = obj.get("schemaVersion")
    if version is None:
        return Rejection((Problem("schemaVersion", "is missing",
                                  f"set \"schemaVersion\": \"{SCHEMA_VERSION}\""),), **seen, **ids)
    if version not in KNOWN_SCHEMA_VERSIONS:
        return Rejection((Problem("schemaVersion", f"{show(version)} is not a schema version this service understands",
                                  f"use one of {', '.join(KNOWN_SCHEMA_VERSIONS)}"),), **seen, **ids)

    problems: list[Problem] = []
    _check_shape(obj, PoolRequest, "", problems)
    typed_ok = not problems
    request: PoolRequest | None = None
    if typed_ok:
        try:
            request = msgspec.convert(obj, PoolRequest)
        except msgspec.ValidationError as exc:  # a shape the field-by-field check did not foresee
            problems.append(Problem("$", _short_error(exc), "fix the field named in the error"))
    # Rules run on whatever fields have the right type, so the team sees every problem at once.
    fields = _typed_fields(obj, problems)
    present = {key for key, value in obj.items() if value is not None}
    size = check_rules(fields, present=present, policy=policy, in_scope=in_scope, problems=problems)
    if problems or request is None or size is None:
        return Rejection(tuple(_dedupe(problems)), **seen, **ids)

    normalised = _with_defaults(request, policy)
    fingerprint = hashlib.sha256(msgspec.json.encode(normalised, order="sorted")).hexdigest()
    return ValidatedRequest(normalised, size, fingerprint)


def _short_error(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


def _dedupe(problems: Iterable[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out: list[Problem] = []
    for p in problems:
        if (p.field, p.problem) not in seen:
            seen.add((p.field, p.problem))
            out.append(p)
    return out


class _Ids(TypedDict):
    """The identifying fields of a :class:`Rejection`, by name, so ``**ids`` is checked against it."""

    request_id: str | None
    requester: str | None
    cluster: str | None
    pool_name: str | None


def _readable_ids(obj: dict[str, Any]) -> _Ids:
    """The identifiers the rejection can be filed under, kept only when well-formed."""

    def pick(key: str, pattern: re.Pattern[str]) -> str | None:
        value = obj.get(key)
        return value if isinstance(value, str) and pattern.fullmatch(value) else None

    return {"request_id": pick("requestId", REQUEST_ID), "requester": pick("requester", REQUESTER),
            "cluster": pick("cluster", CLUSTER_ID), "pool_name": pick("poolName", POOL_NAME)}


def _with_defaults(request: PoolRequest, policy: PoolRequestPolicy) -> PoolRequest:
    changes: dict[str, Any] = {}
    if request.taints is None:
        changes["taints"] = tuple(policy.default_taints)
    if request.gpu_driver is None:
        changes["gpu_driver"] = request.driver
    size = gpu_sizes.lookup(request.vm_size)
    if size is not None and size.name != request.vm_size:
        changes["vm_size"] = size.name  # ARM's canonical spelling
    return msgspec.structs.replace(request, **changes) if changes else request


# ------------------------------------------------------------------------------- shape (types)


def _check_shape(obj: dict[str, Any], struct: type[msgspec.Struct], path: str, problems: list[Problem]) -> None:
    """Type-check every field of ``obj`` against ``struct`` and name unknown/missing fields."""
    info = msgspec.structs.fields(struct)
    hints = get_type_hints(struct)
    by_wire = {f.encode_name: f for f in info}
    for key in obj:
        if key not in by_wire:
            near = _near(key, by_wire)
            problems.append(Problem(_join(path, key), "is not a field of a version-1 pool request",
                                    f"did you mean {near!r}?" if near else
                                    f"remove it; known fields are {', '.join(sorted(by_wire))}"))
    for f in info:
        field_path = _join(path, f.encode_name)
        if f.encode_name not in obj:
            if f.required:
                problems.append(Problem(field_path, "is missing", f"add {f.encode_name!r}; it is required"))
            continue
        value = obj[f.encode_name]
        annotation = hints[f.name]
        nested = _struct_of(annotation)
        if nested is not None and isinstance(value, dict):
            _check_shape(value, nested, field_path, problems)
            continue
        try:
            msgspec.convert(value, annotation, strict=True)
        except msgspec.ValidationError as exc:
            problems.append(Problem(field_path, _type_problem(exc, value), f"send {_describe(annotation)}"))


def _struct_of(annotation: Any) -> type[msgspec.Struct] | None:
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    if get_origin(annotation) in (Union, type(int | None)):
        for arg in get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
                return arg
    return None


def _type_problem(exc: msgspec.ValidationError, value: Any) -> str:
    text = str(exc)
    where = ""
    if " - at `$" in text:
        text, _, at = text.partition(" - at `$")
        where = at.rstrip("`")
    text = text.replace("`", "")
    return f"has the wrong type: {text[:1].lower()}{text[1:]}{' at ' + where if where else ''} (value {show(value)})"


def _describe(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(annotation))
    if origin in (Union, type(int | None)):
        return " or ".join(_describe(a) for a in get_args(annotation) if a is not type(None))
    if origin is tuple:
        return f"a JSON array of {_describe(get_args(annotation)[0])}"
    if origin is dict:
        return "a JSON object of strings to strings"
    names = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _near(key: str, known: Iterable[str]) -> str | None:
    lowered = key.lower().replace("_", "").replace("-", "")
    for name in known:
        if name.lower() == lowered:
            return name
    return None


def _typed_fields(obj: dict[str, Any], problems: list[Problem]) -> dict[str, Any]:
    """The top-level fields whose types are right (others already have a problem)."""
    bad = {p.field.split(".")[0].split("[")[0] for p in problems}
    return {k: v for k, v in obj.items() if k not in bad}

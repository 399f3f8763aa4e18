"""Pool request schema version 1, and its validation (pure).

Teams drop a JSON message on the pool-request queue; this module decides, before any Azure call,
whether it can become a managed GPU node pool. Every rule of the seed and of the reference aks-api.md is
checked here, and *all* problems are reported at once (a team should not have to fix a message one
error at a time): each :class:`Problem` names the field path, what is wrong and what to do.

Strings from the message are only ever data: they are length-capped, checked against charsets,
and echoed back shortened. Nothing here executes, formats into a query, or logs a raw message.

The wire shape is camelCase (``schemaVersion``, ``vmSize``); the structs use snake_case with
msgspec's ``rename="camel"``. Types are checked strictly (``"3"`` is not a count) and unknown fields
are refused, field by field, so that a typo (``"vmsize"``) is named rather than silently ignored.
The JSON Schema in schemas/pool-request.v1.json documents the same shape for callers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import msgspec

from shared.fleet import gpu_sizes
from shared.pools.policy import PoolRequestPolicy

SCHEMA_VERSION = "1"
KNOWN_SCHEMA_VERSIONS: tuple[str, ...] = (SCHEMA_VERSION,)

InstallProfile = Literal["managed", "driverOnly", "none"]
MigStrategy = Literal["None", "Single", "Mixed"]
MigProfileName = Literal["MIG1g", "MIG2g", "MIG3g", "MIG4g", "MIG7g"]


class Autoscale(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    min: int
    max: int


class Mig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    strategy: MigStrategy = "None"
    profile: MigProfileName | None = None


class Spot(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    enabled: bool = True
    max_price: float = -1.0  # -1 = pay up to the on-demand price
    eviction_policy: Literal["Delete", "Deallocate"] = "Delete"


class PoolRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """Pool request schema version 1 (see docs/pool-requests.md)."""

    schema_version: Literal["1"]
    request_id: str
    requester: str
    cluster: str
    pool_name: str
    vm_size: str
    count: int | None = None
    autoscale: Autoscale | None = None
    os_type: Literal["Linux", "Windows"] = "Linux"
    os_sku: Literal["Ubuntu", "AzureLinux"] = "Ubuntu"
    install_profile: InstallProfile = "managed"
    gpu_driver: Literal["Install", "None"] | None = None
    mig: Mig | None = None
    taints: tuple[str, ...] | None = None
    labels: dict[str, str] = {}
    zones: tuple[str, ...] = ()
    max_pods: int | None = None
    spot: Spot | None = None
    tags: dict[str, str] = {}
    validate_workload: bool = False

    # ------------------------------------------------------------------ derived, for the builders

    @property
    def driver(self) -> str:
        """``gpuProfile.driver``: managed and driverOnly install it, none does not."""
        return "None" if self.install_profile == "none" else "Install"

    @property
    def management_mode(self) -> str:
        return "Managed" if self.install_profile == "managed" else "Unmanaged"

    @property
    def mig_strategy(self) -> str:
        return self.mig.strategy if self.mig else "None"

    @property
    def mig_profile(self) -> str | None:
        return self.mig.profile if self.mig else None

    @property
    def node_count(self) -> int:
        """Nodes the pool starts with (``autoscale.min`` for an autoscaled pool)."""
        if self.count is not None:
            return self.count
        return self.autoscale.min if self.autoscale else 0

    @property
    def spot_enabled(self) -> bool:
        return bool(self.spot and self.spot.enabled)

    @property
    def effective_taints(self) -> tuple[str, ...]:
        return self.taints or ()


# ------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a request: where, what, and what to do about it."""

    field: str  # JSON path, e.g. "mig.profile" or "labels[\"kubernetes.io/x\"]"; "$" = the whole message
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem} ({self.fix})"


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

    def mentions(self, field: str) -> bool:
        return any(p.field == field for p in self.problems)


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


# ------------------------------------------------------------------------------- patterns

REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
REQUESTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@._+-]{0,127}\Z")
POOL_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}\Z")
CLUSTER_ID = re.compile(
    r"^/subscriptions/(?P<sub>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"/resourceGroups/(?P<rg>[-\w.()]{0,89}[-\w()])"
    r"/providers/Microsoft\.ContainerService/managedClusters/(?P<name>[A-Za-z0-9][-_A-Za-z0-9]{0,62})\Z",
    re.IGNORECASE | re.ASCII,
)
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*\Z")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")
TAINT = re.compile(r"^(?P<key>[^=:\s]+)(=(?P<value>[^:\s]*))?:(?P<effect>[A-Za-z]+)\Z")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
RESERVED_LABEL_DOMAINS = ("kubernetes.azure.com", "kubernetes.io", "k8s.io")
RESERVED_TAG_PREFIXES = ("microsoft", "azure", "windows")
STEWARD_TAG_PREFIX = "gpu-fleet-steward"
_TAG_KEY_FORBIDDEN = re.compile(r"[<>%&\\?/]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

MAX_TAINTS = 20
MAX_LABELS = 50
MAX_TAGS = 47  # Azure allows 50 per resource; the steward adds up to 3 of its own
MAX_TAG_KEY = 512
MAX_TAG_VALUE = 256
MIN_MAX_PODS, MAX_MAX_PODS = 10, 250
MAX_SPOT_PRICE = 100_000.0


def _show(value: Any, limit: int = 40) -> str:
    """A safe, short rendering of a value from the message for use in a problem."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        return Rejection((Problem("schemaVersion", f"{_show(version)} is not a schema version this service understands",
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
    size = _check_rules(fields, present=present, policy=policy, in_scope=in_scope, problems=problems)
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


def _readable_ids(obj: dict[str, Any]) -> dict[str, str | None]:
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
    return f"has the wrong type: {text[:1].lower()}{text[1:]}{' at ' + where if where else ''} (value {_show(value)})"


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


# ------------------------------------------------------------------------------- rules


def _check_rules(f: dict[str, Any], *, present: set[str], policy: PoolRequestPolicy,
                 in_scope: Callable[[str], bool], problems: list[Problem]) -> gpu_sizes.GpuSize | None:
    add = problems.append

    request_id = f.get("requestId")
    if isinstance(request_id, str) and not REQUEST_ID.fullmatch(request_id):
        add(Problem("requestId", f"{_show(request_id)} is not a valid request id",
                    "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (a UUID is fine)"))
    requester = f.get("requester")
    if isinstance(requester, str) and not REQUESTER.fullmatch(requester):
        add(Problem("requester", f"{_show(requester)} is not a valid requester",
                    "use an e-mail, UPN, object id or team slug: 1-128 of letters, digits, '@', '.', '_', '+', '-'"))

    cluster = f.get("cluster")
    if isinstance(cluster, str):
        if not CLUSTER_ID.fullmatch(cluster):
            add(Problem("cluster", f"{_show(cluster)} is not an AKS cluster ARM id",
                        "use /subscriptions/<guid>/resourceGroups/<rg>/providers/"
                        "Microsoft.ContainerService/managedClusters/<name>"))
        elif not in_scope(cluster):
            add(Problem("cluster", f"{_show(cluster, 200)} is not in the fleet this service manages",
                        "ask the fleet operators to add the cluster (tag or FLEET_CLUSTERS), or target a cluster in scope"))

    pool_name = f.get("poolName")
    if isinstance(pool_name, str) and not POOL_NAME.fullmatch(pool_name):
        add(Problem("poolName", f"{_show(pool_name)} is not a valid AKS node pool name",
                    "use 1-12 lowercase letters and digits, starting with a letter (e.g. 'gpunp')"))

    if f.get("osType") == "Windows":
        add(Problem("osType", "Windows node pools are not supported by managed GPU pools (no GPU metrics on Windows)",
                    "use osType 'Linux' (or omit it)"))

    size = _check_size(f.get("vmSize"), policy, problems)
    profile = f.get("installProfile", "managed")
    _check_driver(profile, f.get("gpuDriver"), problems)
    _check_scale(f, present, profile, policy, problems)
    _check_mig(f.get("mig"), profile, size, problems)
    _check_taints(f.get("taints"), problems)
    _check_labels(f.get("labels"), problems)
    _check_zones(f.get("zones"), problems)
    _check_max_pods(f.get("maxPods"), problems)
    _check_spot(f.get("spot"), problems)
    _check_tags(f.get("tags"), problems)
    return size if size is not None and size.is_nvidia else None


def _check_size(vm_size: Any, policy: PoolRequestPolicy, problems: list[Problem]) -> gpu_sizes.GpuSize | None:
    if not isinstance(vm_size, str):
        return None
    if vm_size != vm_size.strip() or _CONTROL.search(vm_size):
        # gpu_sizes.lookup forgives surrounding blanks; a request must still say exactly one size.
        problems.append(Problem("vmSize", f"{_show(vm_size)} has leading or trailing whitespace or control characters",
                                "send the size name alone, e.g. \"Standard_NC4as_T4_v3\""))
        return None
    kind = gpu_sizes.classify(vm_size)
    size = gpu_sizes.lookup(vm_size)
    examples = "e.g. Standard_NC4as_T4_v3 (the smallest recommended), Standard_NC24ads_A100_v4"
    if kind is gpu_sizes.SizeKind.AMD and size is not None:
        problems.append(Problem("vmSize", f"{size.name} is an AMD GPU size ({size.gpu_model}); managed GPU pools are NVIDIA only",
                                f"choose an NVIDIA GPU size, {examples}"))
        return None
    if kind is gpu_sizes.SizeKind.NOT_GPU:
        problems.append(Problem("vmSize", f"{_show(vm_size)} is not a GPU size",
                                f"choose an NVIDIA GPU size, {examples}"))
        return None
    if size is None:
        problems.append(Problem("vmSize", f"{_show(vm_size)} is not a known NVIDIA GPU size",
                                f"check the spelling; supported sizes include {examples}"))
        return None
    allowed = {s.lower() for s in policy.allowed_sizes}
    if allowed and size.name.lower() not in allowed:
        problems.append(Problem("vmSize", f"{size.name} is not among the sizes this fleet allows",
                                f"choose one of {', '.join(policy.allowed_sizes)}"))
    return size


def _check_driver(profile: Any, driver: Any, problems: list[Problem]) -> None:
    if driver is None or profile not in ("managed", "driverOnly", "none"):
        return
    if profile == "managed" and driver == "None":
        problems.append(Problem("gpuDriver", "'None' cannot be combined with installProfile 'managed': "
                                "the managed GPU stack needs the driver (AKS would install it anyway)",
                                "omit gpuDriver, or use installProfile 'none' to bring your own driver"))
    elif profile == "driverOnly" and driver == "None":
        problems.append(Problem("gpuDriver", "'None' contradicts installProfile 'driverOnly', which installs the driver",
                                "omit gpuDriver, or use installProfile 'none' to skip the driver"))
    elif profile == "none" and driver == "Install":
        problems.append(Problem("gpuDriver", "'Install' contradicts installProfile 'none', which installs nothing",
                                "omit gpuDriver, or use installProfile 'driverOnly' to get the driver alone"))


def _check_scale(f: dict[str, Any], present: set[str], profile: Any, policy: PoolRequestPolicy,
                 problems: list[Problem]) -> None:
    count, autoscale = f.get("count"), f.get("autoscale")
    if "count" in present and "autoscale" in present:
        problems.append(Problem("autoscale", "cannot be combined with count",
                                "send either a fixed count or autoscale {min, max}, not both"))
    if "count" not in present and "autoscale" not in present:
        problems.append(Problem("count", "is missing (and there is no autoscale)",
                                "add \"count\": N (1 or more), or autoscale {min, max} where allowed"))
    if isinstance(count, int) and not 1 <= count <= policy.max_count:
        problems.append(Problem("count", f"{count} is out of range",
                                f"use 1 to {policy.max_count}: a pool needs at least one node to be validated"))
    if isinstance(autoscale, dict):
        if profile == "managed":
            problems.append(Problem("autoscale", "the cluster autoscaler is not supported on managed GPU pools "
                                    "while the feature is in preview",
                                    "use a fixed count, or installProfile 'driverOnly'/'none' to autoscale"))
        lo, hi = autoscale.get("min"), autoscale.get("max")
        if isinstance(lo, int) and not 1 <= lo <= policy.max_count:
            problems.append(Problem("autoscale.min", f"{lo} is out of range",
                                    f"use 1 to {policy.max_count}: the first node is what gets validated"))
        if isinstance(hi, int) and not 1 <= hi <= policy.max_count:
            problems.append(Problem("autoscale.max", f"{hi} is out of range", f"use 1 to {policy.max_count}"))
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            problems.append(Problem("autoscale", f"min {lo} is larger than max {hi}", "make min <= max"))


def _check_mig(mig: Any, profile: Any, size: gpu_sizes.GpuSize | None, problems: list[Problem]) -> None:
    if not isinstance(mig, dict):
        return
    strategy = mig.get("strategy", "None")
    name = mig.get("profile")
    if strategy == "None" and name is None:
        return
    if size is not None and not size.mig_capable:
        problems.append(Problem("mig", f"{size.name} ({size.gpu_model}) cannot be partitioned with MIG",
                                "MIG needs an A100, H100 or H200 size (e.g. Standard_NC24ads_A100_v4), or drop mig"))
        return
    if strategy in ("Single", "Mixed"):
        if name is None:
            problems.append(Problem("mig.profile", f"is required with strategy {strategy}",
                                    "set one of " + ", ".join(gpu_sizes.MIG_PROFILE_NAMES)))
        if profile in ("driverOnly", "none"):
            problems.append(Problem("mig.strategy", f"{strategy} configures the AKS-managed device plugin, "
                                    f"which installProfile {profile!r} does not install",
                                    "use installProfile 'managed', or keep strategy 'None' with a profile and "
                                    "configure your own device plugin's MIG strategy"))
    elif name is not None and profile == "managed":
        problems.append(Problem("mig.strategy", "is 'None' but a MIG profile is set: the managed device plugin "
                                "would not advertise the partitions", "set strategy 'Single' or 'Mixed'"))
    if size is not None and isinstance(name, str) and size.mig_profile(name) is None:
        problems.append(Problem("mig.profile", f"{_show(name)} does not exist on {size.gpu_model}",
                                "use one of " + ", ".join(p.name for p in size.mig_profiles)))


def parse_taint(text: str) -> tuple[str, str, str] | None:
    """``key=value:Effect`` (or ``key:Effect``) as (key, value, effect); None when malformed."""
    m = TAINT.fullmatch(text)
    if not m or m.group("effect") not in TAINT_EFFECTS:
        return None
    key, value = m.group("key"), m.group("value") or ""
    if _qualified_name_problem(key) or not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
        return None
    return key, value, m.group("effect")


def _check_taints(taints: Any, problems: list[Problem]) -> None:
    if not isinstance(taints, list):
        return
    if len(taints) > MAX_TAINTS:
        problems.append(Problem("taints", f"has {len(taints)} entries", f"use at most {MAX_TAINTS}"))
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(taints):
        parsed = parse_taint(taint)
        if parsed is None:
            problems.append(Problem(f"taints[{i}]", f"{_show(taint)} is not a valid taint",
                                    "write key=value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute "
                                    "(e.g. sku=gpu:NoSchedule)"))
            continue
        key, _, effect = parsed
        if _reserved_domain(key):
            problems.append(Problem(f"taints[{i}]", f"{_show(key)} uses a reserved prefix",
                                    "do not use kubernetes.azure.com/, kubernetes.io/ or k8s.io/ keys"))
        if (key, effect) in seen:
            problems.append(Problem(f"taints[{i}]", f"repeats key {_show(key)} with effect {effect}", "list each taint once"))
        seen.add((key, effect))


def _qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes qualified name (``[prefix/]name``), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return "its prefix must be a DNS subdomain (lowercase, e.g. team.example.com/)"
    if not name or len(name) > 63 or not _NAME_PART.fullmatch(name):
        return "its name must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    return None


def _reserved_domain(key: str) -> bool:
    prefix, slash, _ = key.rpartition("/")
    if not slash:
        return False
    prefix = prefix.lower()
    return any(prefix == d or prefix.endswith("." + d) for d in RESERVED_LABEL_DOMAINS)


def _check_labels(labels: Any, problems: list[Problem]) -> None:
    if not isinstance(labels, dict):
        return
    if len(labels) > MAX_LABELS:
        problems.append(Problem("labels", f"has {len(labels)} entries", f"use at most {MAX_LABELS}"))
    for key, value in labels.items():
        where = f"labels[{_show(key, 70)}]"
        why = _qualified_name_problem(key)
        if why:
            problems.append(Problem(where, f"the key is not a valid label key: {why}", "fix the label key"))
        elif _reserved_domain(key):
            problems.append(Problem(where, "uses a reserved prefix (kubernetes.azure.com/, kubernetes.io/, k8s.io/)",
                                    "AKS and Kubernetes own those labels; use your own prefix, e.g. team.example.com/"))
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            problems.append(Problem(where, f"the value {_show(value)} is not a valid label value",
                                    "use at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"))


def _check_zones(zones: Any, problems: list[Problem]) -> None:
    if not isinstance(zones, list):
        return
    for i, zone in enumerate(zones):
        if zone not in ("1", "2", "3"):
            problems.append(Problem(f"zones[{i}]", f"{_show(zone)} is not an availability zone",
                                    "use \"1\", \"2\" or \"3\""))
    if len(set(zones)) != len(zones):
        problems.append(Problem("zones", "lists a zone more than once", "list each zone once"))


def _check_max_pods(max_pods: Any, problems: list[Problem]) -> None:
    if isinstance(max_pods, int) and not MIN_MAX_PODS <= max_pods <= MAX_MAX_PODS:
        problems.append(Problem("maxPods", f"{max_pods} is out of range",
                                f"use {MIN_MAX_PODS} to {MAX_MAX_PODS} (AKS's limits), or omit it for the default"))


def _check_spot(spot: Any, problems: list[Problem]) -> None:
    if not isinstance(spot, dict):
        return
    price = spot.get("maxPrice", -1.0)
    if isinstance(price, int | float) and not isinstance(price, bool) and price != -1 and not 0 < price <= MAX_SPOT_PRICE:
        problems.append(Problem("spot.maxPrice", f"{price} is not a valid spot price",
                                "use -1 (up to the on-demand price) or a positive price in US dollars per hour"))


def _check_tags(tags: Any, problems: list[Problem]) -> None:
    if not isinstance(tags, dict):
        return
    if len(tags) > MAX_TAGS:
        problems.append(Problem("tags", f"has {len(tags)} tags",
                                f"use at most {MAX_TAGS} (Azure allows 50 per resource and the steward adds its own)"))
    for key, value in tags.items():
        where = f"tags[{_show(key, 70)}]"
        if not key or len(key) > MAX_TAG_KEY or _TAG_KEY_FORBIDDEN.search(key) or _CONTROL.search(key):
            problems.append(Problem(where, "is not a valid Azure tag name",
                                    f"use 1-{MAX_TAG_KEY} characters without < > % & \\ ? / or control characters"))
        elif key.lower().startswith(RESERVED_TAG_PREFIXES) or key.lower().startswith(STEWARD_TAG_PREFIX):
            problems.append(Problem(where, "uses a reserved tag prefix (microsoft, azure, windows, gpu-fleet-steward)",
                                    "choose another tag name"))
        if len(value) > MAX_TAG_VALUE or _CONTROL.search(value):
            problems.append(Problem(where, "the value is not a valid Azure tag value",
                                    f"use at most {MAX_TAG_VALUE} characters without control characters"))

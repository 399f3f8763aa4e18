"""Who may ask for what: teams, their pool-request queues, and the limits each team is held to (pure).

The steward's identity can create GPU pools on every cluster in scope, so the queue a request
arrives on is the only thing that says who asked: each team sends to its own queue (it holds
*Storage Queue Data Message Sender* on that queue alone, in a storage account apart from the
host's), and the app records the team of the queue as the requester, whatever the message says.
The ``requester`` field of a message is kept only as the sender's claimed contact
(``claimedRequester`` in the record); it never widens what the team may do.

``POOL_REQUEST_TEAMS`` maps each team to its queue and its limits, as one JSON object::

    {"ml-platform": {"clusters": ["/subscriptions/<id>/resourceGroups/<rg>/providers/
                                   Microsoft.ContainerService/managedClusters/<name>"],
                     "sizes": ["Standard_NC24ads_A100_v4"],
                     "maxGpusPerRequest": 16,
                     "queue": "pool-requests-ml-platform"},
     "research": {"clusters": "*"}}

- ``clusters`` (required): cluster ARM ids, or ``"*"`` for every cluster in the fleet's scope
  (the scope tag or FLEET_CLUSTERS). A request must also name a cluster in scope either way.
- ``sizes`` (default :data:`DEFAULT_SIZES`, the T4 and A10 sizes): VM sizes the team may ask for,
  or ``"*"`` for every NVIDIA size the fleet allows (POOL_REQUEST_ALLOWED_SIZES still applies).
- ``maxGpusPerRequest`` (default :data:`DEFAULT_MAX_GPUS_PER_REQUEST` = 8): GPUs of the largest
  pool one request may ask for, counted as GPUs per VM times nodes (``count``, or ``autoscale.max``).
- ``maxGpusTotal`` (default: not enforced): GPUs the team's pools may hold together, counted
  from ARM (every pool tagged with the team as requester, at its ``count`` or autoscale
  ``maxCount``), from the Kubernetes API (every NodePool the steward made for the team's requests on
  node auto-provisioning clusters, at its ``spec.limits`` ``nvidia.com/gpu``; one without a GPU limit
  is unbounded and refuses the team's requests until it has one) plus the requests of the team still
  in flight. Measured at intake: two requests
  handled at the same instant may together pass it by one request.
- ``queue`` (default ``<POOL_REQUEST_QUEUE>-<team>``): the team's queue, in the team-requests
  storage account (connection :data:`CONNECTION`).

Why these defaults: a team entry that says nothing about sizes or counts gets the smallest
recommended GPU sizes (T4, A10: inference and development, an order of magnitude cheaper per
hour than A100/H100) and at most 8 GPUs per request (one full VM of the larger sizes, or eight
single-GPU T4 nodes), so a missing line in the setting never opens the expensive sizes or a
1,000-node pool. Anything bigger is an explicit, reviewable entry.

No team, no pool requests: with POOL_REQUEST_TEAMS empty the app registers no pool-request
trigger at all (there is no shared queue any more).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.kernel.env import SettingError
from shared.kernel.errors import Invalid

SETTING = "POOL_REQUEST_TEAMS"
CONNECTION = "TeamRequestsStorage"
"""The binding connection (app-setting prefix) of the team-facing storage account: a connection
string locally, ``TeamRequestsStorage__queueServiceUri`` (+ ``__credential``, ``__clientId``) in Azure."""

ANY = "*"
DEFAULT_MAX_GPUS_PER_REQUEST = 8
MAX_GPUS_PER_REQUEST_LIMIT = 8 * 1000  # 1,000 nodes (AKS's per-pool limit) of 8-GPU VMs
DEFAULT_GPU_MODELS: tuple[str, ...] = ("T4", "A10")

TEAM_NAME = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{0,22}[a-z0-9]\Z")
_QUEUE_NAME = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]\Z")
_CLUSTER_ID = re.compile(
    r"^/subscriptions/(?P<sub>[0-9a-fA-F-]{36})/resourcegroups/[^/]+"
    r"/providers/microsoft\.containerservice/managedclusters/[^/]+\Z",
    re.IGNORECASE,
)
_KEYS = ("clusters", "sizes", "maxGpusPerRequest", "maxGpusTotal", "queue")
TAG_REQUESTER = "gpu-fleet-steward-requester"  # shared.pools.spec.TAG_REQUESTER (not imported: it pulls msgspec in)
TAG_REQUEST_ID = "gpu-fleet-steward-request-id"  # shared.pools.spec.TAG_REQUEST_ID


def _default_sizes() -> tuple[str, ...]:
    from shared.fleet import gpu_sizes

    return tuple(s.name for s in gpu_sizes.nvidia_sizes() if s.gpu_model in DEFAULT_GPU_MODELS)


DEFAULT_SIZES: tuple[str, ...] = _default_sizes()


@dataclass(frozen=True)
class Team:
    """One team: where it sends requests and what it may ask for."""

    name: str
    queue: str
    clusters: tuple[str, ...] | None  # ARM ids as configured; None = every cluster in scope ("*")
    sizes: tuple[str, ...] | None = DEFAULT_SIZES  # canonical size names; None = every size ("*")
    max_gpus_per_request: int = DEFAULT_MAX_GPUS_PER_REQUEST
    max_gpus_total: int | None = None  # None: not enforced

    @property
    def function_name(self) -> str:
        """The name of this team's queue-trigger function (letters, digits and underscores)."""
        return "pool_requests_" + self.name.replace("-", "_")

    def describe(self) -> dict[str, Any]:
        return {"queue": self.queue, "clusters": list(self.clusters) if self.clusters is not None else ANY,
                "sizes": list(self.sizes) if self.sizes is not None else ANY,
                "maxGpusPerRequest": self.max_gpus_per_request, "maxGpusTotal": self.max_gpus_total}


@dataclass(frozen=True)
class Violation:
    """A request outside its team's rules: the field, what is wrong, and what to do."""

    field: str
    problem: str
    fix: str


# --------------------------------------------------------------------------- parsing


def parse(text: str, *, queue_prefix: str = "gpu-pool-requests",
          subscriptions: tuple[str, ...] = ()) -> tuple[Team, ...]:
    """The teams of a POOL_REQUEST_TEAMS value; SettingError naming the setting (and team) if malformed."""
    if not text.strip():
        return ()
    try:
        document = json.loads(text, object_pairs_hook=_refusing_duplicates)
    except json.JSONDecodeError as error:
        raise SettingError(f"setting {SETTING} is not valid JSON ({error.msg} at character {error.pos}); "
                           'write {"<team>": {"clusters": [...] or "*", ...}}') from None
    if not isinstance(document, dict):
        raise SettingError(f"setting {SETTING} must be a JSON object of team name to team entry")
    teams: list[Team] = []
    for name, entry in document.items():
        teams.append(_team(name, entry, queue_prefix=queue_prefix, subscriptions=subscriptions))
    queues = [t.queue for t in teams]
    for queue in sorted({q for q in queues if queues.count(q) > 1}):
        owners = ", ".join(t.name for t in teams if t.queue == queue)
        raise SettingError(f"setting {SETTING}: teams {owners} share queue {queue!r}; each team needs its own queue")
    return tuple(teams)


def _refusing_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: Python's json keeps the last of two equal keys without a
    word, so a team written twice would silently lose its first entry (its clusters, sizes, limits)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise SettingError(f"setting {SETTING}: the key {key!r} appears twice in one object; the second would "
                               "silently replace the first: write each team (and each field of a team) once")
        seen[key] = value
    return seen


def _team(name: Any, entry: Any, *, queue_prefix: str, subscriptions: tuple[str, ...]) -> Team:
    where = f"setting {SETTING}, team {name!r}"
    if not isinstance(name, str) or not TEAM_NAME.fullmatch(name):
        raise SettingError(f"{where}: a team name is 2-24 lowercase letters, digits and single hyphens, "
                           "starting and ending with a letter or digit")
    if not isinstance(entry, dict):
        raise SettingError(f"{where}: the entry must be an object with \"clusters\" (and optionally \"sizes\", "
                           "\"maxGpusPerRequest\", \"queue\")")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise SettingError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys are {', '.join(_KEYS)}")
    if "clusters" not in entry:
        raise SettingError(f"{where}: \"clusters\" is required: a list of cluster ARM ids, or \"*\" for every "
                           "cluster in the fleet's scope")
    return Team(name=name, queue=_queue(where, entry.get("queue"), f"{queue_prefix}-{name}"),
                clusters=_clusters(where, entry["clusters"], subscriptions),
                sizes=_sizes(where, entry.get("sizes", DEFAULT_SIZES)),
                max_gpus_per_request=_max_gpus(where, entry.get("maxGpusPerRequest", DEFAULT_MAX_GPUS_PER_REQUEST)),
                max_gpus_total=(None if entry.get("maxGpusTotal") is None
                                else _max_gpus(where, entry["maxGpusTotal"], key="maxGpusTotal", limit=10**6)))


def _queue(where: str, value: Any, default: str) -> str:
    queue = default if value is None else value
    if not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue):
        raise SettingError(f"{where}: queue {queue!r} is not a storage queue name (3-63 lowercase letters, digits "
                           "and single hyphens, starting and ending with a letter or digit)"
                           + ("; shorten the team name or POOL_REQUEST_QUEUE, or set \"queue\"" if value is None else ""))
    if queue.endswith("-poison"):
        raise SettingError(f"{where}: queue {queue!r} ends in -poison, the host's name for failed messages")
    return queue


def _clusters(where: str, value: Any, subscriptions: tuple[str, ...]) -> tuple[str, ...] | None:
    if value == ANY:
        return None
    if not isinstance(value, list) or not value:
        raise SettingError(f"{where}: \"clusters\" must be a non-empty list of cluster ARM ids, or \"*\"")
    out: list[str] = []
    for item in value:
        match = _CLUSTER_ID.fullmatch(item) if isinstance(item, str) else None
        if match is None:
            raise SettingError(f"{where}: {item!r} is not a managed cluster ARM id (/subscriptions/<id>/resourceGroups"
                               "/<rg>/providers/Microsoft.ContainerService/managedClusters/<name>)")
        if subscriptions and match["sub"].lower() not in subscriptions:
            raise SettingError(f"{where}: cluster {item!r} is not in FLEET_SUBSCRIPTIONS")
        out.append(item)
    return tuple(out)


def _sizes(where: str, value: Any) -> tuple[str, ...] | None:
    from shared.fleet import gpu_sizes

    if value == ANY:
        return None
    if not isinstance(value, list | tuple) or not value:
        raise SettingError(f"{where}: \"sizes\" must be a non-empty list of VM sizes, or \"*\"")
    out: list[str] = []
    for item in value:
        size = gpu_sizes.lookup(item) if isinstance(item, str) else None
        if size is None or not size.is_nvidia:
            raise SettingError(f"{where}: {item!r} is not an NVIDIA GPU size of shared/fleet/gpu_sizes.py")
        out.append(size.name)
    return tuple(out)


def _max_gpus(where: str, value: Any, *, key: str = "maxGpusPerRequest",
              limit: int = MAX_GPUS_PER_REQUEST_LIMIT) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise SettingError(f"{where}: \"{key}\" must be a whole number from 1 to {limit}, got {value!r}")
    return value


def from_env(env: Mapping[str, str] | None = None, *, subscriptions: tuple[str, ...] = ()) -> tuple[Team, ...]:
    """The teams configured in the environment (POOL_REQUEST_TEAMS, queue names from POOL_REQUEST_QUEUE)."""
    from shared.kernel.env import env_str

    prefix = env_str("POOL_REQUEST_QUEUE", "gpu-pool-requests", env=env)
    return parse(env_str("POOL_REQUEST_TEAMS", env=env), queue_prefix=prefix, subscriptions=subscriptions)


def by_name(teams: tuple[Team, ...], name: str) -> Team | None:
    return next((t for t in teams if t.name == name), None)


# --------------------------------------------------------------------------- the rule


def gpus_requested(*, gpus_per_vm: int, count: int | None, autoscale_max: int | None) -> int:
    """GPUs of the largest pool a request can grow to: GPUs per VM times its most nodes."""
    nodes = count if count is not None else (autoscale_max or 0)
    return gpus_per_vm * nodes


def _gpus_per_vm(vm_size: Any) -> int:
    from shared.fleet import gpu_sizes

    size = gpu_sizes.lookup(vm_size) if isinstance(vm_size, str) else None
    return size.gpus if size is not None else 0


@dataclass(frozen=True)
class InFlight:
    """A request of the team still in flight (from its ledger record): what its pool will hold."""

    requester: str
    request_id: str
    vm_size: str
    count: int | None
    autoscale_max: int | None


@dataclass(frozen=True)
class NapHold:
    """A Karpenter NodePool the steward made for one of the team's requests, at its ``nvidia.com/gpu`` limit:
    what it may grow to, whatever nodes it has now (shared.pools.team_usage reads it)."""

    request_id: str
    name: str
    gpus: int | None  # None: the NodePool has no GPU limit, so it may grow without bound


def _nodes(props: Mapping[str, Any]) -> int:
    """The most nodes an ARM agent pool holds: ``maxCount`` when autoscaled, else ``count``.

    ARM sends whole numbers; anything else raises Invalid rather than reading as zero, because a
    pool counted as empty would let the team's next request "fit" under its total.
    """
    key = "maxCount" if props.get("enableAutoScaling") else "count"
    value = props.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Invalid(f"pool {props.get('tags', {}).get(TAG_REQUEST_ID, '?')}: {key} {str(value)[:40]!r} is not a "
                      "node count")
    return value


def gpus_in_use(team: str, *, pools: Iterable[Mapping[str, Any]], active_requests: Iterable[InFlight],
                exclude_request_id: str = "", nodepools: Iterable[NapHold] = ()) -> int:
    """GPUs the team holds or has asked for: its pools (``properties`` of every agent pool listed, the
    ones tagged with the team as requester, at ``count`` or autoscale ``maxCount``), its node
    auto-provisioning NodePools at their GPU limits, plus its requests still in flight whose pool is not
    listed yet. ``exclude_request_id``: the request being judged (a redelivery must not count itself).
    Raises Invalid when a pool's node count is not a number, or a NodePool has no GPU limit (it may grow
    without bound, so no total can hold it)."""
    total = 0
    seen: set[str] = set()
    for hold in nodepools:
        seen.add(hold.request_id)
        if hold.request_id and hold.request_id == exclude_request_id:
            continue
        if hold.gpus is None:
            raise Invalid(f"NodePool {hold.name!r} (request {hold.request_id!r}) has no nvidia.com/gpu limit, so it "
                          "may grow without bound")
        total += hold.gpus
    for props in pools:
        tags = props.get("tags") or {}
        if tags.get(TAG_REQUESTER) != team:
            continue
        request_id = str(tags.get(TAG_REQUEST_ID, ""))
        seen.add(request_id)
        if request_id and request_id == exclude_request_id:
            continue
        total += _gpus_per_vm(props.get("vmSize")) * _nodes(props)
    for request in active_requests:
        if request.requester != team or request.request_id in seen or request.request_id == exclude_request_id:
            continue
        total += gpus_requested(gpus_per_vm=_gpus_per_vm(request.vm_size), count=request.count,
                                autoscale_max=request.autoscale_max)
    return total


def violations(team: Team, *, cluster: str, vm_size: str, gpus_per_vm: int, count: int | None,
               autoscale_max: int | None, in_use: int | None = None) -> list[Violation]:
    """Every way a (valid) request steps outside ``team``'s rules; empty when it may proceed.

    ``in_use`` (:func:`gpus_in_use`) is needed only when the team has ``maxGpusTotal``."""
    found: list[Violation] = []
    rule = f"{SETTING} team {team.name!r}"
    if team.clusters is not None and cluster.lower() not in {c.lower() for c in team.clusters}:
        found.append(Violation("cluster", f"team {team.name!r} may not create pools on this cluster "
                               f"({rule} allows {len(team.clusters)} cluster(s))",
                               "target one of your team's clusters, or ask the fleet operators to add this one "
                               "to your team's entry"))
    if team.sizes is not None and vm_size.lower() not in {s.lower() for s in team.sizes}:
        found.append(Violation("vmSize", f"team {team.name!r} may not use {vm_size} ({rule} allows "
                               f"{', '.join(team.sizes)})",
                               "choose one of your team's sizes, or ask the fleet operators to allow this one"))
    gpus = gpus_requested(gpus_per_vm=gpus_per_vm, count=count, autoscale_max=autoscale_max)
    if gpus > team.max_gpus_per_request:
        field = "count" if count is not None else "autoscale.max"
        found.append(Violation(field, f"asks for up to {gpus} GPUs ({gpus_per_vm} per VM); team {team.name!r} may "
                               f"ask for at most {team.max_gpus_per_request} per request ({rule} maxGpusPerRequest)",
                               f"ask for at most {team.max_gpus_per_request // max(gpus_per_vm, 1)} node(s) of "
                               f"{vm_size}, or ask the fleet operators to raise your team's limit"))
    if team.max_gpus_total is not None and in_use is not None and in_use + gpus > team.max_gpus_total:
        field = "count" if count is not None else "autoscale.max"
        found.append(Violation(field, f"would bring team {team.name!r} to {in_use + gpus} GPUs ({in_use} in its "
                               f"pools and requests in flight + {gpus}); {rule} maxGpusTotal is {team.max_gpus_total}",
                               "delete or shrink one of your team's pools first, or ask the fleet operators to raise "
                               "your team's total"))
    return found

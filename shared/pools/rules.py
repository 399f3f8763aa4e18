"""The rules of a version-1 pool request, one function per field or group of fields (pure).

Each check adds a :class:`~shared.pools.request.Problem` naming the field path, what is wrong and
what to do, and never stops at the first one: a team should not have to fix a message one error at
a time. The checks run on whatever top-level fields have the right type (shared.pools.validation
decides which), so the values here are untrusted builtins. Strings from the message are only ever
data: they are length-capped, checked against charsets, and echoed back shortened (:func:`show`).

Sources of the limits: node pool names, counts, max pods and taints as AKS documents them
(https://learn.microsoft.com/azure/aks/create-node-pools and the AgentPool REST reference,
https://learn.microsoft.com/rest/api/aks/agent-pools/create-or-update); label keys and values as
Kubernetes validates them (k8s.io/apimachinery/pkg/util/validation/validation.go); Azure tag names
and limits (https://learn.microsoft.com/azure/azure-resource-manager/management/tag-resources).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from shared.fleet import gpu_sizes
from shared.pools.policy import PoolRequestPolicy
from shared.pools.request import Problem

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


def show(value: Any, limit: int = 40) -> str:
    """A safe, short rendering of a value from the message for use in a problem."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_rules(f: dict[str, Any], *, present: set[str], policy: PoolRequestPolicy,
                 in_scope: Callable[[str], bool], problems: list[Problem]) -> gpu_sizes.GpuSize | None:
    add = problems.append

    request_id = f.get("requestId")
    if isinstance(request_id, str) and not REQUEST_ID.fullmatch(request_id):
        add(Problem("requestId", f"{show(request_id)} is not a valid request id",
                    "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (a UUID is fine)"))
    requester = f.get("requester")
    if isinstance(requester, str) and not REQUESTER.fullmatch(requester):
        add(Problem("requester", f"{show(requester)} is not a valid requester",
                    "use an e-mail, UPN, object id or team slug: 1-128 of letters, digits, '@', '.', '_', '+', '-'"))

    cluster = f.get("cluster")
    if isinstance(cluster, str):
        if not CLUSTER_ID.fullmatch(cluster):
            add(Problem("cluster", f"{show(cluster)} is not an AKS cluster ARM id",
                        "use /subscriptions/<guid>/resourceGroups/<rg>/providers/"
                        "Microsoft.ContainerService/managedClusters/<name>"))
        elif not in_scope(cluster):
            add(Problem("cluster", f"{show(cluster, 200)} is not in the fleet this service manages",
                        "ask the fleet operators to add the cluster (tag or FLEET_CLUSTERS), or target a cluster in scope"))

    pool_name = f.get("poolName")
    if isinstance(pool_name, str) and not POOL_NAME.fullmatch(pool_name):
        add(Problem("poolName", f"{show(pool_name)} is not a valid AKS node pool name",
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
        problems.append(Problem("vmSize", f"{show(vm_size)} has leading or trailing whitespace or control characters",
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
        problems.append(Problem("vmSize", f"{show(vm_size)} is not a GPU size",
                                f"choose an NVIDIA GPU size, {examples}"))
        return None
    if size is None:
        problems.append(Problem("vmSize", f"{show(vm_size)} is not a known NVIDIA GPU size",
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
        problems.append(Problem("mig.profile", f"{show(name)} does not exist on {size.gpu_model}",
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
            problems.append(Problem(f"taints[{i}]", f"{show(taint)} is not a valid taint",
                                    "write key=value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute "
                                    "(e.g. sku=gpu:NoSchedule)"))
            continue
        key, _, effect = parsed
        if _reserved_domain(key):
            problems.append(Problem(f"taints[{i}]", f"{show(key)} uses a reserved prefix",
                                    "do not use kubernetes.azure.com/, kubernetes.io/ or k8s.io/ keys"))
        if (key, effect) in seen:
            problems.append(Problem(f"taints[{i}]", f"repeats key {show(key)} with effect {effect}", "list each taint once"))
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
        where = f"labels[{show(key, 70)}]"
        why = _qualified_name_problem(key)
        if why:
            problems.append(Problem(where, f"the key is not a valid label key: {why}", "fix the label key"))
        elif _reserved_domain(key):
            problems.append(Problem(where, "uses a reserved prefix (kubernetes.azure.com/, kubernetes.io/, k8s.io/)",
                                    "AKS and Kubernetes own those labels; use your own prefix, e.g. team.example.com/"))
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            problems.append(Problem(where, f"the value {show(value)} is not a valid label value",
                                    "use at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"))


def _check_zones(zones: Any, problems: list[Problem]) -> None:
    if not isinstance(zones, list):
        return
    for i, zone in enumerate(zones):
        if zone not in ("1", "2", "3"):
            problems.append(Problem(f"zones[{i}]", f"{show(zone)} is not an availability zone",
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
        where = f"tags[{show(key, 70)}]"
        if not key or len(key) > MAX_TAG_KEY or _TAG_KEY_FORBIDDEN.search(key) or _CONTROL.search(key):
            problems.append(Problem(where, "is not a valid Azure tag name",
                                    f"use 1-{MAX_TAG_KEY} characters without < > % & \\ ? / or control characters"))
        elif key.lower().startswith(RESERVED_TAG_PREFIXES) or key.lower().startswith(STEWARD_TAG_PREFIX):
            problems.append(Problem(where, "uses a reserved tag prefix (microsoft, azure, windows, gpu-fleet-steward)",
                                    "choose another tag name"))
        if len(value) > MAX_TAG_VALUE or _CONTROL.search(value):
            problems.append(Problem(where, "the value is not a valid Azure tag value",
                                    f"use at most {MAX_TAG_VALUE} characters without control characters"))

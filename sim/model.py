"""The simulated fleet's state and the behaviour of its live clusters.

Everything that changes in the simulator changes here, under ``fleet.lock``: the ARM half calls the
``Cluster`` methods to make nodes appear and go, the Kubernetes API handler reads and writes the
objects, and the timed callbacks (``fleet.at``) move the world on a scaled clock (nodes turning
Ready, pods finishing their grace period, jobs completing). A small set of controllers (ReplicaSet,
Deployment, StatefulSet, DaemonSet, Job, PodDisruptionBudget status, node auto-provisioning) and a
scheduler run after every change so that a drain behaves as on a real cluster: evicted pods come
back elsewhere, and a PDB blocks until they do.

Determinism: given the same scenario and seed, names, ids and ordering depend only on ``fleet.rng``
and sorted iteration; timed callbacks run in (time, sequence) order and stamp objects with their own
due time, not with the wall clock at which the pump happened to run them.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import heapq
import inspect
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from sim import psa
from sim.tokens import TokenIssuer

log = logging.getLogger("sim.model")

DEFAULT_TIMINGS: dict[str, float] = {
    "pool_create_s": 60.0,
    "pool_delete_s": 45.0,
    "pool_scale_s": 30.0,
    "delete_machines_s": 30.0,
    "node_ready_s": 20.0,
    "restart_s": 30.0,
    "reimage_s": 90.0,
    "lro_retry_after_s": 5.0,
    "pod_start_s": 2.0,
    "job_run_s": 60.0,
    "nap_provision_s": 30.0,
    "nap_terminate_s": 10.0,  # Karpenter's termination of a deleted NodeClaim (node and VM gone)
    # node-problem-detector's custom plugin monitor after a boot: the first plugin run comes one
    # invoke_interval after start (NPD's default 30 s, pkg/custompluginmonitor/types/config.go).
    "npd_first_check_s": 30.0,
    # the disruption controller's lag: a PDB created or changed (spec, or status written by a client)
    # is observed this long after (status.observedGeneration < metadata.generation until then)
    "pdb_observe_s": 1.0,
}

NPD_GPU_CONDITIONS = ("UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices", "XIDErrors", "GPUMissing")
NPD_GPU_REASONS = {
    "UnhealthyNvidiaDevicePlugin": ("NvidiaDevicePluginHealthy", "NvidiaDevicePluginUnhealthy"),
    "UnhealthyNvidiaDCGMServices": ("NvidiaDCGMServicesHealthy", "NvidiaDCGMServicesUnhealthy"),
    "XIDErrors": ("NoXIDErrors", "XIDErrorsDetected"),
    "GPUMissing": ("AllGPUsPresent", "GPUMissing"),
}
NPD_BASE_CONDITIONS = ("KernelDeadlock", "ReadonlyFilesystem", "FrequentKubeletRestart", "FrequentContainerdRestart")
MANAGED_GPU_TAG = "EnableManagedGPUExperience"
REPAIR_RUNGS = ("restart", "reimage", "replace", "never")
# NamespaceLifecycle's immortal namespaces (admission/plugin/namespace/lifecycle/admission.go Register)
IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")
# kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go MaxDisruptedPodSize
MAX_DISRUPTED_POD_SIZE = 2000
# kubernetes/kubernetes pkg/controller/disruption/disruption.go DeletionTimeout
PDB_DELETION_TIMEOUT_S = 120.0
# simulator only: a pod with this annotation has its finalizers removed this many seconds after its
# final delete, as the controller owning the finalizer would (scenario `pod_finalizers_release_s`)
FINALIZER_RELEASE_ANNOTATION = "sim.fleet/finalizer-release-seconds"
SPOT_LABEL = "kubernetes.azure.com/scalesetpriority"  # label and taint key of spot nodes (AKS)
# AKS node auto-drain cordons a spot node whose VM got a Preempt scheduled event with this taint
# (https://learn.microsoft.com/azure/aks/node-auto-drain).
PREEMPT_TAINT = "remediator.kubernetes.azure.com/unschedulable"
# The cloud node lifecycle controller taints a node whose VM is stopped or deallocated
# (kubernetes/cloud-provider controllers/nodelifecycle/node_lifecycle_controller.go, ShutdownTaint).
SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"
LOW_PRIORITY_QUOTA = "lowPriorityCores"  # the regional Spot vCPU quota (Microsoft.Compute usages name)
# A Preempt scheduled event comes at least 30 s ahead (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events).
SPOT_NOTICE_S = 30.0

_ENCODER = msgspec.json.Encoder()


# --------------------------------------------------------------------------- helpers


def iso(t: float) -> str:
    """RFC 3339 in UTC with a Z, as the API server writes timestamps."""
    return _iso_second(int(t))


@functools.lru_cache(maxsize=4096)
def _iso_second(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def base36(n: int, width: int = 6) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return (out or "0").rjust(width, "0")


_QTY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6,
}


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``16Gi``) as a number of base units."""
    if isinstance(value, int | float):
        return float(value)
    m = _QTY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"quantities must match the regular expression: {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """Summed container requests (limits stand in for missing requests, as the API server defaults them)."""
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        req = dict(res.get("limits") or {})
        req.update(res.get("requests") or {})
        for k, v in req.items():
            try:
                total[k] = total.get(k, 0.0) + parse_quantity(v)
            except ValueError:
                continue
    return total


def is_mirror(obj: dict[str, Any]) -> bool:
    return "kubernetes.io/config.mirror" in ((obj.get("metadata") or {}).get("annotations") or {})


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def is_workload_pod(obj: dict[str, Any]) -> bool:
    """Any pod that is not a DaemonSet pod and not a mirror (static) pod."""
    ref = controller_of(obj)
    return not is_mirror(obj) and not (ref and ref.get("kind") == "DaemonSet")


def namespace_terminating_error(resource: str, namespace: str, name: str) -> Exception:
    """NamespaceLifecycle's answer to a create in a terminating namespace: ``admission.NewForbidden``
    (``<resource>[.<group>] "<name>" is forbidden: ...``) with the ``NamespaceTerminating`` cause.

    kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go,
    staging/src/k8s.io/apiserver/pkg/admission/errors.go (NewForbidden: the object's name, else "Unknown").
    ``resource`` is the store key (``pods``, ``deployments.apps``): plural then group, as GroupResource prints.
    """
    from sim.kube_api import ApiError

    plural, _, group = resource.partition(".")
    name = name or "Unknown"
    return ApiError(403, "Forbidden",
                    f'{resource} "{name}" is forbidden: unable to create new content in namespace {namespace} '
                    "because it is being terminated",
                    {"name": name, "group": group, "kind": plural,
                     "causes": [{"reason": "NamespaceTerminating",
                                 "message": f"namespace {namespace} is being terminated",
                                 "field": "metadata.namespace"}]})


def never_ready(obj: dict[str, Any]) -> bool:
    """A pod whose readiness probe can never pass (``exec: [false]``): it runs but never turns Ready,
    as a pod in CrashLoopBackOff or failing its probe does (scenario workloads with ``ready: false``)."""
    for c in (obj.get("spec") or {}).get("containers") or []:
        cmd = ((c.get("readinessProbe") or {}).get("exec") or {}).get("command") or []
        if list(cmd) in (["false"], ["/bin/false"]):
            return True
    return False


# --------------------------------------------------------------------------- label selectors


class SelectorError(ValueError):
    pass


# A port of the label selector lexer and parser of kubernetes/kubernetes
# staging/src/k8s.io/apimachinery/pkg/labels/selector.go (Lexer, Parser.parse, parseRequirement,
# parseValues, parseIdentifiersList, parseExactValue, NewRequirement) and of the key and value checks of
# staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go (IsQualifiedName, IsValidLabelValue),
# so that a malformed selector gets the API server's own error text. The server answers it as a
# 400 BadRequest whose message is this error (apiserver handlers: DecodeParameters -> NewBadRequest).
_TOKENS = {")": "ClosedPar", ",": "Comma", "!": "DoesNotExist", "==": "DoubleEquals", "=": "Equals",
           ">": "GreaterThan", "in": "In", "<": "LessThan", "!=": "NotEquals", "notin": "NotIn", "(": "OpenPar"}
_SPECIAL = set("=!(),><")
_WHITESPACE = set(" \t\r\n")
_BINARY_OPERATORS = "in, notin, =, ==, !=, gt, lt"
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_RE = re.compile(f"^{_QUALIFIED_NAME_FMT}$")
_DNS1123_SUBDOMAIN_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS1123_SUBDOMAIN_RE = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}$")
_LABEL_VALUE_FMT = f"({_QUALIFIED_NAME_FMT})?"
_LABEL_VALUE_RE = re.compile(f"^{_LABEL_VALUE_FMT}$")


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.RegexError: the examples are joined with " or " after a trailing ", " (two spaces)."""
    return msg + " (e.g. " + " or ".join(f"'{e}', " for e in examples) + f"regex used for validation is '{fmt}')"


def _label_key_errors(key: str) -> list[str]:
    """validation.IsQualifiedName."""
    errs: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 characters")
            if not _DNS1123_SUBDOMAIN_RE.match(prefix):
                errs.append("prefix part " + _regex_error(
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                    "and must start and end with an alphanumeric character", _DNS1123_SUBDOMAIN_FMT, "example.com"))
    else:
        return ["a qualified name " + _regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character", _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME_RE.match(name):
        errs.append("name part " + _regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character", _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def _label_value_errors(value: str) -> list[str]:
    """validation.IsValidLabelValue."""
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE_RE.match(value):
        errs.append(_regex_error("a valid label must be an empty string or consist of alphanumeric characters, '-', "
                                 "'_' or '.', and must start and end with an alphanumeric character",
                                 _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def _lex(text: str) -> list[tuple[str, str]]:
    """Lexer.Lex over the whole input: (token, literal) pairs ending with ("EndOfString", "")."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            out.append(("EndOfString", ""))
            return out
        if text[i] in _SPECIAL:  # scanSpecialSymbol: the longest operator made of special symbols
            buf, last, j = "", None, i
            while j < n and text[j] in _SPECIAL:
                buf += text[j]
                if buf in _TOKENS:
                    last = (_TOKENS[buf], buf)
                    j += 1
                elif last is not None:
                    break
                else:
                    j += 1
            if last is None:
                out.append(("Error", f"error expected: keyword found '{buf}'"))
                i = j
            else:
                out.append(last)
                i += len(last[1])
            continue
        j = i  # scanIDOrKeyword
        while j < n and text[j] not in _SPECIAL and text[j] not in _WHITESPACE:
            j += 1
        word = text[i:j]
        out.append((_TOKENS.get(word, "Identifier"), word))
        i = j


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.pos = 0

    def _get(self, values: bool, advance: bool) -> tuple[str, str]:
        tok, lit = self.items[min(self.pos, len(self.items) - 1)]
        if advance:
            self.pos += 1
        if values and tok in ("In", "NotIn"):  # 'in' and 'notin' are plain values in a value context
            tok = "Identifier"
        return tok, lit

    def lookahead(self, values: bool = True) -> tuple[str, str]:
        return self._get(values, False)

    def consume(self, values: bool = True) -> tuple[str, str]:
        return self._get(values, True)

    def parse(self) -> list[tuple[str, str, tuple[str, ...]]]:
        reqs: list[tuple[str, str, tuple[str, ...]]] = []
        while True:
            tok, lit = self.lookahead()
            if tok in ("Identifier", "DoesNotExist"):
                try:
                    reqs.append(self.requirement())
                except SelectorError as e:
                    raise SelectorError(f"unable to parse requirement: {e}") from None
                t, lit2 = self.consume()
                if t == "EndOfString":
                    return reqs
                if t == "Comma":
                    t2, l2 = self.lookahead()
                    if t2 not in ("Identifier", "DoesNotExist"):
                        raise SelectorError(f"found '{l2}', expected: identifier after ','")
                else:
                    raise SelectorError(f"found '{lit2}', expected: ',' or 'end of string'")
            elif tok == "EndOfString":
                return reqs
            else:
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> tuple[str, str, tuple[str, ...]]:
        op = ""
        tok, key = self.consume()
        if tok == "DoesNotExist":
            op = "DoesNotExist"
            tok, key = self.consume()
        if tok != "Identifier":
            raise SelectorError(f"found '{key}', expected: identifier")
        errs = _label_key_errors(key)
        if errs:  # validateLabelKey with a nil field path
            raise SelectorError(f'<nil>: Invalid value: "{key}": {"; ".join(errs)}')
        if op == "DoesNotExist" or self.lookahead()[0] in ("EndOfString", "Comma"):
            # '!a=b' stops after 'a' (parseRequirement returns at once), so the '=' is what is refused
            return key, op or "Exists", ()
        tok, lit = self.consume(values=False)
        ops = {"In": "In", "NotIn": "NotIn", "Equals": "=", "DoubleEquals": "==", "NotEquals": "!=",
               "GreaterThan": "gt", "LessThan": "lt"}
        if tok not in ops:
            raise SelectorError(f"found '{lit}', expected: {_BINARY_OPERATORS}")
        operator = ops[tok]
        values = self.set_values() if operator in ("In", "NotIn") else self.exact_value()
        for i, v in enumerate(values):  # NewRequirement -> validateLabelValue(path values[i][key])
            verrs = _label_value_errors(v)
            if verrs:
                raise SelectorError(f'values[{i}][{key}]: Invalid value: "{v}": {"; ".join(verrs)}')
        if operator in ("gt", "lt"):
            try:
                int(values[0])
            except ValueError:
                raise SelectorError(f"values[0]: Invalid value: \"{values[0]}\": for 'Gt', 'Lt' operators, the value "
                                    "must be an integer") from None
            return key, "Gt" if operator == "gt" else "Lt", values
        if operator in ("=", "=="):
            return key, "In", values
        if operator == "!=":
            return key, "NotIn", values
        return key, operator, values

    def set_values(self) -> tuple[str, ...]:
        tok, lit = self.consume()
        if tok != "OpenPar":
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead()
        if tok in ("Identifier", "Comma"):
            values = self.identifiers()
            if self.consume()[0] != "ClosedPar":
                raise SelectorError(f"found '{lit}', expected: ')'")
            return tuple(sorted(values))
        if tok == "ClosedPar":
            self.consume()
            return ("",)
        raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")

    def identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            tok, lit = self.consume()
            if tok == "Identifier":
                values.add(lit)
                tok2, lit2 = self.lookahead()
                if tok2 == "Comma":
                    continue
                if tok2 == "ClosedPar":
                    return values
                raise SelectorError(f"found '{lit2}', expected: ',' or ')'")
            if tok == "Comma":
                if not values:
                    values.add("")
                tok2 = self.lookahead()[0]
                if tok2 in ("ClosedPar", "Comma"):
                    values.add("")
                    if tok2 == "ClosedPar":
                        return values
                continue
            raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> tuple[str, ...]:
        if self.lookahead()[0] in ("EndOfString", "Comma"):
            return ("",)
        tok, lit = self.consume()
        if tok == "Identifier":
            return (lit,)
        raise SelectorError(f"found '{lit}', expected: identifier")


def parse_label_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """``a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3`` into (key, op, values) requirements, sorted by key
    as ``labels.Parse`` sorts them; a malformed selector raises :class:`SelectorError` with the real
    parser's message (``found '=', expected: ',' or 'end of string'``, ``unable to parse requirement:
    ...``)."""
    if not text:
        return []
    return sorted(_LabelParser(text).parse(), key=lambda r: r[0])


def match_requirements(labels: dict[str, str], reqs: Iterable[tuple[str, str, tuple[str, ...]]]) -> bool:
    for key, op, values in reqs:
        present = key in labels
        if op == "In" and (not present or labels[key] not in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op in ("Gt", "Lt"):
            try:
                lv, rv = int(labels.get(key, "")), int(values[0])
            except (ValueError, IndexError):
                return False
            if (op == "Gt" and not lv > rv) or (op == "Lt" and not lv < rv):
                return False
    return True


def selector_requirements(selector: dict[str, Any] | None) -> list[tuple[str, str, tuple[str, ...]]]:
    """A metav1.LabelSelector (matchLabels + matchExpressions) as requirements."""
    selector = selector or {}
    reqs = [(k, "In", (str(v),)) for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        reqs.append((e.get("key", ""), e.get("operator", "In"), tuple(e.get("values") or ())))
    return reqs


# --------------------------------------------------------------------------- VM sizes

@dataclass(frozen=True)
class _Size:
    name: str
    vcpus: int
    memory_gib: float
    gpus: int = 0
    gpu_model: str = ""
    family: str = ""
    nvidia: bool = False
    mig_capable: bool = False
    mig_profiles: dict[str, tuple[str, int]] = field(default_factory=dict)


_MIG_A100_40 = {"MIG1g": ("1g.5gb", 7), "MIG2g": ("2g.10gb", 3), "MIG3g": ("3g.20gb", 2), "MIG4g": ("4g.20gb", 1),
                "MIG7g": ("7g.40gb", 1)}
_MIG_80 = {"MIG1g": ("1g.10gb", 7), "MIG2g": ("2g.20gb", 3), "MIG3g": ("3g.40gb", 2), "MIG4g": ("4g.40gb", 1),
           "MIG7g": ("7g.80gb", 1)}
_FALLBACK_SIZES = {s.name.lower(): s for s in (
    _Size("Standard_NC4as_T4_v3", 4, 28, 1, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC8as_T4_v3", 8, 56, 1, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC16as_T4_v3", 16, 110, 1, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC64as_T4_v3", 64, 440, 4, "T4", "standardNCASv3_T4Family", True),
    _Size("Standard_NC24ads_A100_v4", 24, 220, 1, "A100", "StandardNCADSA100v4Family", True, True, _MIG_80),
    _Size("Standard_NC48ads_A100_v4", 48, 440, 2, "A100", "StandardNCADSA100v4Family", True, True, _MIG_80),
    _Size("Standard_NC96ads_A100_v4", 96, 880, 4, "A100", "StandardNCADSA100v4Family", True, True, _MIG_80),
    _Size("Standard_ND96asr_v4", 96, 900, 8, "A100", "standardNDASv4_A100Family", True, True, _MIG_A100_40),
    _Size("Standard_ND96amsr_A100_v4", 96, 1900, 8, "A100", "standardNDAMSv4_A100Family", True, True, _MIG_80),
    _Size("Standard_NC40ads_H100_v5", 40, 320, 1, "H100", "standardNCadsH100v5Family", True, True, _MIG_80),
    _Size("Standard_ND96isr_H100_v5", 96, 1900, 8, "H100", "standardNDSH100v5Family", True, True, _MIG_80),
)}


def size_info(vm_size: str) -> Any:
    """Facts about a VM size: sim.gpu_catalog when present, else a small private table, else the name."""
    try:
        from sim import gpu_catalog  # type: ignore[attr-defined]

        info = gpu_catalog.lookup(vm_size)
        if info is not None:
            return info
    except ImportError:
        pass
    known = _FALLBACK_SIZES.get(vm_size.lower())
    if known:
        return known
    m = re.search(r"_[A-Z]+?(\d+)", vm_size)
    vcpus = int(m.group(1)) if m else 2
    return _Size(vm_size, vcpus, float(vcpus * 4), family="standardDSv5Family")


def gpu_sizes() -> list[Any]:
    """The NVIDIA sizes known to the catalogue (for node auto-provisioning)."""
    try:
        from sim import gpu_catalog  # type: ignore[attr-defined]

        sizes = getattr(gpu_catalog, "SIZES", None)
        if sizes:
            values = sizes.values() if isinstance(sizes, dict) else sizes
            return sorted((s for s in values if getattr(s, "nvidia", False)), key=lambda s: (s.vcpus, s.name))
    except ImportError:
        pass
    return sorted((s for s in _FALLBACK_SIZES.values() if s.nvidia), key=lambda s: (s.vcpus, s.name))


# --------------------------------------------------------------------------- clock


class SimClock:
    """Fleet time: ``epoch_sim + (wall - epoch_real) * speed``; or manual (moves only on ``advance``)."""

    def __init__(self, *, speed: float = 1.0, epoch_sim: float | None = None, epoch_real: float | None = None,
                 manual: bool = False) -> None:
        self.speed = float(speed) if speed and speed > 0 else 1.0
        self.epoch_real = time.time() if epoch_real is None else float(epoch_real)
        self.epoch_sim = self.epoch_real if epoch_sim is None else float(epoch_sim)
        self.manual = manual
        self._offset = 0.0

    def now(self) -> float:
        if self.manual:
            return self.epoch_sim + self._offset
        return self.epoch_sim + (time.time() - self.epoch_real) * self.speed + self._offset

    def advance(self, seconds: float) -> None:
        self._offset += max(0.0, float(seconds))

    def published(self) -> dict[str, Any]:
        return {"epoch_real": self.epoch_real, "epoch_sim": self.epoch_sim, "speed": self.speed,
                "manual": self.manual}


# --------------------------------------------------------------------------- objects


class KObj:
    """One stored Kubernetes object: the JSON dict plus its cached serialisation."""

    __slots__ = ("_raw", "obj", "resource")

    def __init__(self, obj: dict[str, Any], resource: str = "") -> None:
        self.obj = obj
        self._raw: bytes | None = None
        self.resource = resource

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.obj["metadata"].get("namespace", "")

    @property
    def meta(self) -> dict[str, Any]:
        return self.obj["metadata"]

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = _ENCODER.encode(self.obj)
        return self._raw

    def invalidate(self) -> None:
        self._raw = None


class Node(KObj):
    __slots__ = ("boot", "gpu", "instance_id", "nap", "pool", "ready", "repair_plan", "vmss")

    def __init__(self, obj: dict[str, Any], *, pool: str, instance_id: int, vmss: str, nap: bool = False) -> None:
        super().__init__(obj, "nodes")
        self.pool = pool
        self.instance_id = instance_id
        self.vmss = vmss
        self.nap = nap
        self.ready = False
        self.boot = 0
        self.repair_plan: dict[str, str] = {}
        self.gpu: dict[str, Any] = {}

    def condition(self, type_: str) -> dict[str, Any] | None:
        for c in self.obj["status"].get("conditions") or []:
            if c.get("type") == type_:
                return c
        return None

    @property
    def unschedulable(self) -> bool:
        return bool(self.obj["spec"].get("unschedulable"))

    @property
    def labels(self) -> dict[str, str]:
        return self.obj["metadata"].setdefault("labels", {})


class Pod(KObj):
    __slots__ = ("cause", "requests", "run_s")

    def __init__(self, obj: dict[str, Any], *, run_s: float | None = None) -> None:
        super().__init__(obj, "pods")
        self.requests = pod_requests(obj.get("spec") or {})
        self.run_s = run_s
        self.cause = ""

    @property
    def node_name(self) -> str:
        return self.obj["spec"].get("nodeName") or ""

    @property
    def phase(self) -> str:
        return self.obj["status"].get("phase", "Pending")

    @property
    def terminating(self) -> bool:
        return bool(self.obj["metadata"].get("deletionTimestamp"))

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass
class Pool:
    name: str
    properties: dict[str, Any] = field(default_factory=dict)
    provisioning_state: str = "Succeeded"
    operation_until: float = 0.0
    node_id: str = ""
    next_instance: int = 0
    npd: bool = False          # unmanaged pool whose nodes run NPD (scenario); managed pools always do
    device_plugin: bool | None = None  # unmanaged pool: None = decided by a device-plugin DaemonSet

    @property
    def managed_gpu(self) -> bool:
        gp = self.properties.get("gpuProfile") or {}
        mode = ((gp.get("nvidia") or {}).get("managementMode") or "").lower()
        tags = self.properties.get("tags") or {}
        return mode == "managed" or str(tags.get(MANAGED_GPU_TAG, "")).lower() == "true"


# resources whose objects are stored generically: key -> (group, version, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, str, bool]] = {
    "namespaces": ("", "v1", "Namespace", False),
    "nodes": ("", "v1", "Node", False),
    "pods": ("", "v1", "Pod", True),
    "events": ("", "v1", "Event", True),
    "configmaps": ("", "v1", "ConfigMap", True),
    "services": ("", "v1", "Service", True),
    "serviceaccounts": ("", "v1", "ServiceAccount", True),
    "poddisruptionbudgets.policy": ("policy", "v1", "PodDisruptionBudget", True),
    "deployments.apps": ("apps", "v1", "Deployment", True),
    "replicasets.apps": ("apps", "v1", "ReplicaSet", True),
    "statefulsets.apps": ("apps", "v1", "StatefulSet", True),
    "daemonsets.apps": ("apps", "v1", "DaemonSet", True),
    "jobs.batch": ("batch", "v1", "Job", True),
    "events.events.k8s.io": ("events.k8s.io", "v1", "Event", True),
    "leases.coordination.k8s.io": ("coordination.k8s.io", "v1", "Lease", True),
    # RBAC objects, which the simulated API servers authorize requests with (sim/rbac.py)
    "clusterroles.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "ClusterRole", False),
    "clusterrolebindings.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", False),
    "roles.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "Role", True),
    "rolebindings.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "RoleBinding", True),
}
NAP_RESOURCES: dict[str, tuple[str, str, str, bool]] = {
    "nodepools.karpenter.sh": ("karpenter.sh", "v1", "NodePool", False),
    "nodeclaims.karpenter.sh": ("karpenter.sh", "v1", "NodeClaim", False),
    "aksnodeclasses.karpenter.azure.com": ("karpenter.azure.com", "v1beta1", "AKSNodeClass", False),
}


# --------------------------------------------------------------------------- fleet


class Fleet:
    """All simulated state. Build it with :func:`sim.scenario.build_fleet` or directly for unit tests."""

    def __init__(self, *, seed: int = 0, clock: SimClock | None = None, timings: dict[str, float] | None = None,
                 faults: list[dict[str, Any]] | None = None, token_key: bytes | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.lock = threading.RLock()
        self.clock = clock or SimClock()
        self.timings: dict[str, float] = dict(DEFAULT_TIMINGS)
        self.timings.update({k: float(v) for k, v in (timings or {}).items()})
        self.tokens = TokenIssuer(now=self.clock.now, key=token_key, lifetime_s=24 * 3600)
        from sim.oracles import Oracles

        self.oracles = Oracles(self)
        self.clusters: dict[str, Cluster] = {}
        self.quotas: dict[tuple[str, str, str], int] = {}
        self.capacity: dict[tuple[str, str], int] = {}
        # ARM actions taken away from the app's role (tests and the soak remove a grant to see the
        # path fail); sim.arm.granted_arm_actions subtracts them from the role the project declares.
        self.revoked_arm_actions: set[str] = set()
        # Resource group ids the linked-resources role is assigned on (infra/main.bicep linkedResourceGroupIds,
        # default []): the join/write actions on a linked subnet, IP prefix or PPG hold only inside them.
        self.arm_linked_resource_groups: set[str] = set()
        self.scenario: dict[str, Any] = {}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._now_override: float | None = None
        self._pump_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.faults: Any = _make_fault_engine(self, faults or [])

    # ---- time
    def now(self) -> float:
        """The current sim time; inside a timed callback, the callback's due time (deterministic stamps)."""
        return self._now_override if self._now_override is not None else self.clock.now()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` (under the lock) once the sim clock reaches ``when``."""
        with self.lock:
            self._seq += 1
            heapq.heappush(self._timers, (float(when), self._seq, fn))

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        self.at(self.now() + max(0.0, seconds), fn)

    def pump(self) -> None:
        """Run every timed callback that is due, then let the controllers settle."""
        with self.lock:
            now = self.clock.now()
            while self._timers and self._timers[0][0] <= now:
                when = self._timers[0][0]
                self._now_override = when
                try:
                    # everything due at the same instant first (nodes of one pool turn Ready together),
                    # then the controllers and the scheduler see the result
                    while self._timers and self._timers[0][0] == when:
                        _when, _seq, fn = heapq.heappop(self._timers)
                        try:
                            fn()
                        except Exception:
                            log.exception("timed callback failed")
                    self.settle()
                except Exception:
                    log.exception("settling after timed callbacks failed")
                finally:
                    self._now_override = None
            self.settle()

    def settle(self) -> None:
        """Run the controllers and the scheduler of every cluster that changed."""
        for key in sorted(self.clusters):
            c = self.clusters[key]
            if c.dirty:
                c.reconcile()

    def advance(self, seconds: float) -> None:
        """Move the clock forward (manual clocks) and run what became due, step by step."""
        with self.lock:
            self.pump()
            target = self.clock.now() + max(0.0, seconds)
            while self._timers and self._timers[0][0] <= target:
                step = self._timers[0][0] - self.clock.now()
                if step > 0:
                    self.clock.advance(step)
                self.pump()
            rest = target - self.clock.now()
            if rest > 0:
                self.clock.advance(rest)
            self.pump()

    def next_timer(self) -> float | None:
        with self.lock:
            return self._timers[0][0] if self._timers else None

    def start(self, interval_s: float = 0.05) -> None:
        """Start the background pump (real time)."""
        if self._pump_thread:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                if not self.clock.manual:
                    self.pump()
                self.oracles.sample_gpu_capacity()

        self._pump_thread = threading.Thread(target=loop, name="sim-pump", daemon=True)
        self._pump_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._pump_thread:
            self._pump_thread.join(timeout=2)
            self._pump_thread = None

    # ---- ids
    def new_uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def rand_suffix(self, n: int = 5) -> str:
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    # ---- clusters
    def add_cluster(self, *, subscription: str, resource_group: str, name: str, location: str = "eastus",
                    tags: dict[str, str] | None = None, node_provisioning_mode: str = "Manual",
                    kubernetes_version: str = "1.32.4") -> Cluster:
        with self.lock:
            cid = (f"/subscriptions/{subscription}/resourceGroups/{resource_group}"
                   f"/providers/Microsoft.ContainerService/managedClusters/{name}")
            c = Cluster(self, id=cid, name=name, subscription=subscription, resource_group=resource_group,
                        location=location, tags=dict(tags or {}), node_provisioning_mode=node_provisioning_mode,
                        kubernetes_version=kubernetes_version)
            self.clusters[cid.lower()] = c
            # the cluster comes "deployed": the app's namespace and RBAC (infra/kubernetes), for its identity
            from sim.identity import app_principal_id
            from sim.rbac import deploy_app_manifests

            deploy_app_manifests(c, app_principal_id(self))
            return c

    def cluster(self, sub: str, rg: str, name: str) -> Cluster | None:
        cid = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.ContainerService/managedClusters/{name}"
        return self.clusters.get(cid.lower())

    def cluster_by_name(self, name: str) -> Cluster | None:
        for key in sorted(self.clusters):
            if self.clusters[key].name == name:
                return self.clusters[key]
        return None

    def vcpus_in_use(self, sub: str, location: str, family: str) -> int:
        """vCPUs counted against a quota: a VM family's, or ``lowPriorityCores`` (every spot VM).

        Spot VMs count against the region's one low-priority quota, not their family's
        (https://learn.microsoft.com/azure/virtual-machines/spot-vms#quota; the usage name is
        ``lowPriorityCores``, "Total Regional Low-priority vCPUs").
        """
        total = 0
        low_priority = family.lower() == LOW_PRIORITY_QUOTA.lower()
        with self.lock:
            for c in self.clusters.values():
                if c.subscription.lower() != sub.lower() or c.location.lower() != location.lower():
                    continue
                for pool in c.pools.values():
                    info = size_info(pool.properties.get("vmSize", ""))
                    spot = str(pool.properties.get("scaleSetPriority") or "").lower() == "spot"
                    if spot != low_priority:
                        continue
                    if low_priority or (getattr(info, "family", "") or "").lower() == family.lower():
                        total += int(pool.properties.get("count") or 0) * int(info.vcpus)
                for node in c.nodes.values():
                    if node.nap:
                        info = size_info(node.labels.get("node.kubernetes.io/instance-type", ""))
                        if (node.labels.get("karpenter.sh/capacity-type") == "spot") != low_priority:
                            continue
                        if low_priority or (getattr(info, "family", "") or "").lower() == family.lower():
                            total += int(info.vcpus)
        return total

    def state(self) -> dict[str, Any]:
        """A summary for /_sim/state and the determinism tests (no wall-clock values)."""
        with self.lock:
            return {"clock": {"now": self.clock.now(), **self.clock.published()},
                    "clusters": [self.clusters[k].summary() for k in sorted(self.clusters)]}


def _make_fault_engine(fleet: Fleet, rules: list[dict[str, Any]]) -> Any:
    """The ARM half's FaultEngine, built with whatever of (fleet, rules, clock, rng) it asks for."""
    try:
        from sim.faults import FaultEngine  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        params = inspect.signature(FaultEngine).parameters
    except (TypeError, ValueError):
        params = {}
    offer: dict[str, Any] = {"fleet": fleet, "rules": list(rules), "clock": fleet.clock, "rng": fleet.rng,
                             "now": fleet.now}
    kwargs = {k: v for k, v in offer.items() if k in params}
    try:
        return FaultEngine(**kwargs)
    except TypeError:
        engine = FaultEngine()  # type: ignore[call-arg]
        for rule in rules:
            engine.add(rule)
        return engine


# --------------------------------------------------------------------------- cluster


class Cluster:
    def __init__(self, fleet: Fleet, *, id: str, name: str, subscription: str, resource_group: str, location: str,
                 tags: dict[str, str], node_provisioning_mode: str, kubernetes_version: str) -> None:
        self.fleet = fleet
        self.id = id
        self.name = name
        self.subscription = subscription
        self.resource_group = resource_group
        self.location = location
        self.tags = tags
        self.node_resource_group = f"MC_{resource_group}_{name}_{location}"
        # Node resource group lockdown (restrictionLevel ReadOnly, preset on AKS Automatic): a deny
        # assignment leaves only */read to everyone but AKS itself (learn.microsoft.com/azure/aks/node-resource-group-lockdown).
        self.node_rg_locked = False
        self.node_provisioning_mode = node_provisioning_mode
        self.kubernetes_version = kubernetes_version
        self.maintenance_configurations: dict[str, dict[str, Any]] = {}
        self.pools: dict[str, Pool] = {}
        self.busy_until = 0.0
        self.nodes: dict[str, Node] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.store: dict[str, dict[tuple[str, str], KObj]] = {r: {} for r in self.resources()}
        self.pods_by_node: dict[str, set[tuple[str, str]]] = {}
        self.pods_by_owner: dict[str, set[tuple[str, str]]] = {}
        self.pending: set[tuple[str, str]] = set()
        self.rv = 1000
        self.dirty = True
        self.nap_inflight: dict[str, str] = {}   # pending pod uid -> node being provisioned for it
        self.job_run_s: dict[tuple[str, str], float] = {}  # (ns, job) -> run time of its pods
        self.list_snapshots: dict[str, tuple[str, list[bytes]]] = {}
        self.watchers = 0
        self.tombstones: collections.deque[tuple[int, str, bytes]] = collections.deque(maxlen=5000)
        self.changes: collections.deque[tuple[int, str, str, bytes]] = collections.deque(maxlen=20000)
        self.changed = threading.Condition(fleet.lock)
        # deletion lifecycle: pods held by metadata.finalizers after their final delete, namespaces
        # being terminated by the namespace controller, and the disruption controller's bookkeeping
        self.finalizing: set[tuple[str, str]] = set()
        self.terminating_namespaces: set[str] = set()
        self.namespace_sync_due: dict[str, float] = {}
        self.pdb_synced_rv: dict[tuple[str, str], str] = {}
        self.pdb_observe_due: dict[tuple[str, str], float] = {}
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.ensure_namespace(ns)

    # ---- resources and storage
    def resources(self) -> dict[str, tuple[str, str, str, bool]]:
        out = dict(RESOURCES)
        if self.node_provisioning_mode.lower() == "auto":
            out.update(NAP_RESOURCES)
        return out

    @property
    def nap(self) -> bool:
        return self.node_provisioning_mode.lower() == "auto"

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def touch(self, kobj: KObj) -> None:
        """Record a change of ``kobj``: new resourceVersion, cached bytes dropped, controllers to run."""
        self._modified(kobj)
        self.dirty = True
        if isinstance(kobj, Node):
            self.fleet.oracles.node_changed(self, kobj)

    def _modified(self, kobj: KObj, kind: str = "MODIFIED") -> None:
        """A controller-side change (status): new resourceVersion and bytes, no reconcile needed."""
        kobj.meta["resourceVersion"] = self.next_rv()
        kobj.invalidate()
        self.log_change(kobj, kind)

    def log_change(self, kobj: KObj, kind: str) -> None:
        """Keep the change for watchers (only while someone watches: listing must stay cheap)."""
        if kind == "DELETED":
            kobj.meta["resourceVersion"] = self.next_rv()
            kobj.invalidate()
            self.tombstones.append((int(kobj.meta["resourceVersion"]), kobj.resource, kobj.raw()))
        if self.watchers <= 0:
            return
        with self.changed:  # re-entrant: callers usually hold fleet.lock already
            self.changes.append((int(kobj.meta.get("resourceVersion") or self.rv), kobj.resource, kind, kobj.raw()))
            self.changed.notify_all()

    def new_meta(self, name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "uid": self.fleet.new_uid(), "resourceVersion": self.next_rv(),
                                "creationTimestamp": iso(self.fleet.now())}
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update(extra)
        return meta

    def put(self, resource: str, obj: dict[str, Any]) -> KObj:
        """Store a new generic object (not nodes or pods, which have their own constructors)."""
        meta = obj.setdefault("metadata", {})
        if resource not in ("nodes", "namespaces") and self.resources()[resource][3]:
            self.admit_create(resource, str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        if resource == "poddisruptionbudgets.policy":
            # kubernetes/kubernetes pkg/registry/policy/poddisruptionbudget/strategy.go PrepareForCreate:
            # a new PDB's status is cleared; the disruption controller fills it in once it has observed it
            obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
        meta.setdefault("uid", self.fleet.new_uid())
        meta.setdefault("creationTimestamp", iso(self.fleet.now()))
        meta["resourceVersion"] = self.next_rv()
        if resource not in ("nodes", "namespaces") and self.resources()[resource][3]:
            meta.setdefault("namespace", "default")
        meta.setdefault("generation", 1)
        group, version, kind, _ns = self.resources()[resource]
        obj["apiVersion"] = f"{group}/{version}" if group else version
        obj["kind"] = kind
        kobj = KObj(obj, resource)
        self.store[resource][(meta.get("namespace", ""), meta["name"])] = kobj
        self.dirty = True
        if resource == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {"phase": "Active"})
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        self.log_change(kobj, "ADDED")
        return kobj

    def get(self, resource: str, namespace: str, name: str) -> KObj | None:
        if resource == "nodes":
            return self.nodes.get(name)
        if resource == "pods":
            return self.pods.get((namespace, name))
        return self.store.get(resource, {}).get((namespace, name))

    def items(self, resource: str, namespace: str | None = None) -> list[KObj]:
        """Objects of a resource, sorted by (namespace, name)."""
        if resource == "nodes":
            return [self.nodes[k] for k in sorted(self.nodes)]
        src: dict[tuple[str, str], Any] = self.pods if resource == "pods" else self.store.get(resource, {})
        keys = sorted(k for k in src if namespace is None or k[0] == namespace)
        return [src[k] for k in keys]

    def remove(self, resource: str, namespace: str, name: str) -> KObj | None:
        if resource == "namespaces":
            # a namespace always carries the `kubernetes` finalizer: deleting it starts its termination,
            # and the namespace controller removes it once it is empty (see begin_namespace_deletion)
            return self.begin_namespace_deletion(name)
        if resource == "nodeclaims.karpenter.sh":
            return self.delete_nodeclaim(name)  # finalizer karpenter.sh/termination: Karpenter terminates it
        kobj = self.store.get(resource, {}).pop((namespace, name), None)
        if kobj is not None:
            self.dirty = True
            self.log_change(kobj, "DELETED")
            if resource in ("deployments.apps", "replicasets.apps", "statefulsets.apps", "daemonsets.apps",
                            "jobs.batch"):
                self._cascade_delete(kobj)
        return kobj

    def ensure_namespace(self, name: str) -> None:
        if ("", name) not in self.store["namespaces"]:
            self.put("namespaces", {"metadata": {"name": name}})

    # ---- namespace lifecycle
    def namespace_terminating(self, name: str) -> bool:
        ns = self.store["namespaces"].get(("", name))
        return ns is not None and (ns.obj.get("status") or {}).get("phase") == "Terminating"

    def admit_create(self, resource: str, namespace: str, name: str) -> None:
        """NamespaceLifecycle admission: nothing new may be created in a terminating namespace (an
        Eviction is a create too). Raises the API server's 403.

        kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go
        """
        if namespace and self.namespace_terminating(namespace):
            raise namespace_terminating_error(resource, namespace, name)

    def delete_namespace(self, name: str) -> KObj:
        """``DELETE /api/v1/namespaces/<name>``: the namespace turns Terminating and the namespace
        controller starts deleting its content right away. Raises the API server's 403 for the
        immortal namespaces and its 409 when termination is already under way.

        kubernetes/kubernetes pkg/registry/core/namespace/storage/storage.go (Delete) and
        staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go
        """
        from sim.kube_api import ApiError

        if name in IMMORTAL_NAMESPACES:
            raise ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                           {"name": name, "kind": "namespaces"})
        ns = self.store["namespaces"].get(("", name))
        if ns is None:
            raise ApiError(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"})
        if ns.meta.get("deletionTimestamp") and ((ns.obj.get("spec") or {}).get("finalizers") or []):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on namespaces "{name}": The system is '
                           "ensuring all content is removed from this namespace.  Upon completion, this namespace "
                           "will automatically be purged by the system.", {"name": name, "kind": "namespaces"})
        self.begin_namespace_deletion(name)
        self._sync_namespace(name)
        return ns

    def begin_namespace_deletion(self, name: str) -> KObj | None:
        """Mark the namespace deleted (deletionTimestamp, phase Terminating); the namespace controller
        (:meth:`_sync_namespace`) empties it and purges it once nothing is left."""
        ns = self.store["namespaces"].get(("", name))
        if ns is None:
            return None
        if not ns.meta.get("deletionTimestamp"):
            now = self.fleet.now()
            ns.meta["deletionTimestamp"] = iso(now)
            ns.obj.setdefault("status", {})["phase"] = "Terminating"
            self.terminating_namespaces.add(name)
            self.namespace_sync_due[name] = now
            self._modified(ns)
            self.dirty = True
        return ns

    def _namespaces(self) -> None:
        """The namespace controller: sync every terminating namespace that is due."""
        if not self.terminating_namespaces:
            return
        now = self.fleet.now()
        for name in sorted(self.terminating_namespaces):
            if self.namespace_sync_due.get(name, 0.0) <= now:
                self._sync_namespace(name)

    def _sync_namespace(self, name: str) -> None:
        """Delete everything in a terminating namespace (pods gracefully), report what remains in its
        conditions, requeue while content remains (estimate/2 + 1 s, the estimate being the longest
        grace period or 15 s when finalizers remain), then drop the ``kubernetes`` finalizer and purge it.

        kubernetes/kubernetes pkg/controller/namespace/namespace_controller.go (requeue) and
        pkg/controller/namespace/deletion/namespaced_resources_deleter.go, status_condition_utils.go
        """
        ns = self.store["namespaces"].get(("", name))
        if ns is None or not ns.meta.get("deletionTimestamp"):
            self.terminating_namespaces.discard(name)
            self.namespace_sync_due.pop(name, None)
            return
        now = self.fleet.now()
        for key in sorted(k for k in self.pods if k[0] == name):
            pod = self.pods.get(key)
            if pod is not None and not pod.terminating:
                self.delete_pod(pod, cause="namespace_deleted")
        resources = self.resources()
        for res in sorted(self.store):
            if res == "namespaces" or not resources.get(res, ("", "", "", False))[3]:
                continue
            for key in sorted(k for k in self.store[res] if k[0] == name):
                self.remove(res, name, key[1])
        remaining = [self.pods[k] for k in sorted(k for k in self.pods if k[0] == name)]
        by_finalizer: dict[str, int] = {}
        estimate = 0
        for p in remaining:
            for f in p.meta.get("finalizers") or []:
                by_finalizer[str(f)] = by_finalizer.get(str(f), 0) + 1
            if p.phase not in ("Succeeded", "Failed"):
                estimate = max(estimate, int(p.obj["spec"].get("terminationGracePeriodSeconds") or 0))
        if by_finalizer:
            estimate = max(estimate, 15)
        content = ("NamespaceContentRemaining", "True", "SomeResourcesRemain",
                   f"Some resources are remaining: pods. has {len(remaining)} resource instances") if remaining else (
            "NamespaceContentRemaining", "False", "ContentRemoved", "All content successfully removed")
        fins = ("NamespaceFinalizersRemaining", "True", "SomeFinalizerRemain", "Some finalizers are remaining: "
                + ", ".join(f"{f} in {n} resource instances" for f, n in sorted(by_finalizer.items()))) if by_finalizer \
            else ("NamespaceFinalizersRemaining", "False", "ContentRemoved", "All content successfully removed")
        wanted = [("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered",
                   "All resources successfully discovered"),
                  ("NamespaceDeletionGroupVersionParsingFailure", "False", "ParsedGroupVersions",
                   "All legacy kube types successfully parsed"),
                  ("NamespaceDeletionContentFailure", "False", "ContentDeleted",
                   "All content successfully deleted, may be waiting on finalization"), content, fins]
        status = ns.obj.setdefault("status", {})
        old = {c.get("type"): c for c in status.get("conditions") or []}
        conditions, changed = [], False
        for type_, st, reason, message in wanted:
            prev = old.get(type_)
            if prev is not None and (prev.get("status"), prev.get("reason"), prev.get("message")) == (st, reason, message):
                conditions.append(prev)
                continue
            changed = True
            t = prev.get("lastTransitionTime") if prev is not None and prev.get("status") == st else iso(now)
            conditions.append({"type": type_, "status": st, "lastTransitionTime": t, "reason": reason,
                               "message": message})
        if changed:
            status["conditions"] = conditions
            self._modified(ns)
        if remaining:
            due = now + estimate // 2 + 1
            self.namespace_sync_due[name] = due
            self.fleet.at(due, self._wake)
            return
        spec = ns.obj.setdefault("spec", {})
        spec["finalizers"] = [f for f in spec.get("finalizers") or [] if f != "kubernetes"]
        if spec["finalizers"] or ns.meta.get("finalizers"):
            self._modified(ns)  # someone else's finalizer: it stays until they remove theirs
            self.namespace_sync_due[name] = float("inf")
            return
        self.store["namespaces"].pop(("", name), None)
        self.terminating_namespaces.discard(name)
        self.namespace_sync_due.pop(name, None)
        self.log_change(ns, "DELETED")
        self.dirty = True

    def _wake(self) -> None:
        """A timed callback with nothing to do but make the controllers run."""
        self.dirty = True

    # ---- pools and nodes (the ARM half calls these)
    def vmss_name(self, pool: Pool) -> str:
        self._ensure_node_id(pool)
        return f"aks-{pool.name}-{pool.node_id}-vmss"

    def _ensure_node_id(self, pool: Pool) -> None:
        if not pool.node_id:
            digest = hashlib.sha256(f"{self.fleet.seed}|{self.id.lower()}|{pool.name}".encode()).hexdigest()
            pool.node_id = f"{int(digest[:12], 16) % 10**8:08d}"

    def pool_nodes(self, pool: Pool | str) -> list[Node]:
        name = pool if isinstance(pool, str) else pool.name
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].pool == name and not self.nodes[n].nap]

    def materialise_pool(self, pool: Pool) -> None:
        """Create nodes to match ``pool.properties["count"]``; they join NotReady and turn Ready later."""
        with self.fleet.lock:
            self.pools.setdefault(pool.name, pool)
            self.scale_nodes(pool, int(pool.properties.get("count") or 0))

    def scale_nodes(self, pool: Pool, count: int) -> None:
        """Add nodes, or remove (cordoned first, then newest) with their pods."""
        with self.fleet.lock:
            nodes = self.pool_nodes(pool)
            if count > len(nodes):
                for _ in range(count - len(nodes)):
                    self._add_pool_node(pool)
            elif count < len(nodes):
                victims = sorted(nodes, key=lambda n: (not n.unschedulable, -n.instance_id))[: len(nodes) - count]
                for n in victims:
                    self.delete_node(n.name, cause="scale_down")

    def remove_pool_nodes(self, pool: Pool) -> None:
        with self.fleet.lock:
            for n in self.pool_nodes(pool):
                self.delete_node(n.name, cause="pool_deleted")

    def remove_machines(self, pool: Pool, names: list[str]) -> None:
        with self.fleet.lock:
            for name in names:
                node = self.nodes.get(name)
                if node is not None and node.pool == pool.name:
                    self.delete_node(name, cause="machine_deleted")

    def machines(self, pool: Pool) -> list[dict[str, Any]]:
        with self.fleet.lock:
            out = []
            for n in self.pool_nodes(pool):
                zone = n.labels.get("topology.kubernetes.io/zone", "0")
                zones = [zone.rsplit("-", 1)[-1]] if "-" in zone else []
                out.append({"name": n.name, "resourceId": self._vm_id(n.vmss, n.instance_id), "zones": zones})
            return out

    def node_by_vmss_instance(self, vmss: str, instance_id: str) -> str | None:
        with self.fleet.lock:
            for name in sorted(self.nodes):
                n = self.nodes[name]
                if n.vmss.lower() == vmss.lower() and str(n.instance_id) == str(instance_id):
                    return name
            return None

    def _vm_id(self, vmss: str, instance_id: int) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.node_resource_group}"
                f"/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{instance_id}")

    def _add_pool_node(self, pool: Pool) -> Node:
        self._ensure_node_id(pool)
        iid = pool.next_instance
        pool.next_instance += 1
        vmss = self.vmss_name(pool)
        name = f"{vmss}{base36(iid)}"
        props = pool.properties
        zones = props.get("availabilityZones") or []
        zone = f"{self.location}-{zones[iid % len(zones)]}" if zones else "0"
        labels = {
            "agentpool": pool.name,
            "kubernetes.azure.com/agentpool": pool.name,
            "kubernetes.azure.com/cluster": self.node_resource_group,
            "kubernetes.azure.com/mode": str(props.get("mode") or "User").lower(),
            "kubernetes.azure.com/node-image-version": "AKSUbuntu-2204gen2containerd-202611.05.0",
            "kubernetes.azure.com/os-sku": str(props.get("osSKU") or "Ubuntu"),
            "kubernetes.azure.com/role": "agent",
            "kubernetes.io/os": str(props.get("osType") or "Linux").lower(),
            "node.kubernetes.io/instance-type": str(props.get("vmSize") or "Standard_D4s_v5"),
            "topology.kubernetes.io/region": self.location,
            "topology.kubernetes.io/zone": zone,
        }
        taints = [_parse_taint(t) for t in props.get("nodeTaints") or []]
        if str(props.get("scaleSetPriority") or "").lower() == "spot":
            # AKS gives every spot pool this label and taint and lists them in the pool's own
            # nodeLabels/nodeTaints (https://learn.microsoft.com/azure/aks/spot-node-pool; Azure/AKS#1719):
            # a pool that names them (as AKS returns it, or as a scenario lists it) still yields
            # nodes that carry them once. A node with the same (key, effect) twice is invalid
            # (kubernetes/kubernetes pkg/apis/core/validation/validation.go validateNodeTaints).
            labels[SPOT_LABEL] = "spot"
            taints.append({"key": SPOT_LABEL, "value": "spot", "effect": "NoSchedule"})
        labels.update({str(k): str(v) for k, v in (props.get("nodeLabels") or {}).items()})
        taints = _unique_taints(taints)
        node = self._build_node(name=name, pool=pool.name, instance_id=iid, vmss=vmss, labels=labels, taints=taints,
                                vm_size=labels["node.kubernetes.io/instance-type"],
                                max_pods=int(props.get("maxPods") or 110), gpu=self._gpu_setup(pool))
        return node

    def spot_evict(self, name: str, *, notice_s: float = SPOT_NOTICE_S) -> dict[str, Any]:
        """Azure takes a spot VM back (a fault of nature, never the app's doing).

        Now: the VM gets a ``Preempt`` scheduled event, at least 30 s ahead
        (https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events), and AKS node
        auto-drain cordons the node with :data:`PREEMPT_TAINT`
        (https://learn.microsoft.com/azure/aks/node-auto-drain). ``notice_s`` later the VM goes as
        the pool's ``scaleSetEvictionPolicy`` says (https://learn.microsoft.com/azure/aks/spot-node-pool):
        ``Delete`` (the default): the VM is deleted, the kubelet stops and the cloud node lifecycle
        controller deletes the Node with its pods; ``Deallocate``: the VM is stopped-deallocated,
        the Node stays NotReady with :data:`SHUTDOWN_TAINT` (kubernetes/cloud-provider
        controllers/nodelifecycle/node_lifecycle_controller.go) and its pods stay bound to it.
        Pods lost with the VM are recorded with cause ``spot_eviction``, not as the app's losses.
        Raises KeyError for an unknown node, ValueError for a node that is not spot.
        """
        with self.fleet.lock:
            node = self.nodes.get(name)
            if node is None:
                raise KeyError(f"no node {name!r} in cluster {self.name}")
            if node.labels.get(SPOT_LABEL) != "spot":
                raise ValueError(f"node {name} is not a spot node (no {SPOT_LABEL}=spot label): Azure evicts only spot VMs")
            pool = self.pools.get(node.pool)
            policy = str(((pool.properties if pool else {}) or {}).get("scaleSetEvictionPolicy") or "Delete")
            now = self.fleet.now()
            taints = [t for t in node.obj["spec"].get("taints") or [] if t.get("key") != PREEMPT_TAINT]
            node.obj["spec"]["taints"] = [*taints, {"key": PREEMPT_TAINT, "effect": "NoSchedule", "timeAdded": iso(now)}]
            node.obj["spec"]["unschedulable"] = True
            self.sync_node(node)

            def vm_gone() -> None:
                n = self.nodes.get(name)
                if n is None:
                    return
                if policy.lower() == "deallocate":
                    # The VM stops: its pods stop running now, though the API keeps them bound to the
                    # NotReady node (until taint-based eviction, and the node's deletion, remove them).
                    # Their loss is recorded now, as Azure's; pod.cause marks them for later accounting.
                    for key in sorted(self.pods_by_node.get(name, set())):
                        pod = self.pods.get(key)
                        if pod is not None and not pod.terminating and pod.phase == "Running":
                            self.fleet.oracles.pod_terminated(self, pod, cause="spot_eviction")
                            pod.cause = "spot_eviction"
                    self._set_ready(n, False)
                    rest = [t for t in n.obj["spec"].get("taints") or [] if t.get("key") != SHUTDOWN_TAINT]
                    n.obj["spec"]["taints"] = [*rest, {"key": SHUTDOWN_TAINT, "effect": "NoSchedule"}]
                    self.touch(n)
                    return
                for key in sorted(self.pods_by_node.get(name, set())):
                    pod = self.pods.get(key)
                    if pod is not None:
                        self.fleet.oracles.pod_terminated(self, pod, cause="spot_eviction")
                        self._drop_pod(pod)
                self.delete_node(name, cause="spot_eviction")

            self.fleet.after(notice_s, vm_gone)
            return {"node": name, "pool": node.pool, "evictionPolicy": policy, "notBefore": iso(now + notice_s)}

    def _gpu_setup(self, pool: Pool) -> dict[str, Any]:
        """How a pool's GPUs show up: managed stack, NPD, device plugin, MIG strategy."""
        props = pool.properties
        gp = props.get("gpuProfile") or {}
        nvidia = gp.get("nvidia") or {}
        managed = pool.managed_gpu
        driver_none = str(gp.get("driver") or "").lower() == "none" and not managed
        mig_profile = ""
        strategy = ""
        if nvidia.get("migStrategy") and str(nvidia.get("migStrategy")).lower() != "none":
            strategy = str(nvidia["migStrategy"]).lower()
            profiles = nvidia.get("migProfiles") or []
            mig_profile = str(profiles[0]) if profiles else str(props.get("gpuInstanceProfile") or "")
        elif props.get("gpuInstanceProfile"):
            mig_profile = str(props["gpuInstanceProfile"])
            strategy = str((props.get("nodeLabels") or {}).get("nvidia.com/mig.strategy") or "mixed").lower()
        return {"managed": managed, "driver_none": driver_none, "npd": managed or pool.npd,
                "device_plugin": pool.device_plugin, "mig_profile": mig_profile, "mig_strategy": strategy}

    def _build_node(self, *, name: str, pool: str, instance_id: int, vmss: str, labels: dict[str, str],
                    taints: list[dict[str, Any]], vm_size: str, max_pods: int, gpu: dict[str, Any],
                    nap: bool = False, provider_id: str | None = None, ready_s: float | None = None) -> Node:
        fleet = self.fleet
        now = fleet.now()
        info = size_info(vm_size)
        gpus = int(getattr(info, "gpus", 0) or 0) if getattr(info, "nvidia", False) else 0
        if gpus:
            if not nap:
                # Karpenter (node auto-provisioning) nodes do not carry it: removed in
                # Azure/karpenter-provider-azure#837 as redundant with karpenter.azure.com/sku-gpu-name
                # (designs/0006-requirements-and-labels.md).
                labels["kubernetes.azure.com/accelerator"] = "nvidia"
            if gpu.get("managed"):
                labels["kubernetes.azure.com/dcgm-exporter"] = "enabled"
        vcpus = int(info.vcpus)
        mem_ki = int(float(info.memory_gib) * 1024 * 1024)
        capacity = {"cpu": str(vcpus), "memory": f"{mem_ki}Ki", "pods": str(max_pods),
                    "ephemeral-storage": "129886128Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        allocatable = {"cpu": f"{vcpus * 1000 - 140 - 60 * max(0, vcpus - 1) // 4}m",
                       "memory": f"{int(mem_ki * 0.85)}Ki", "pods": str(max_pods),
                       "ephemeral-storage": "119703055367", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        conditions = [_cond("NetworkUnavailable", "False", now, "RouteCreated", "RouteController created a route")]
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            conditions.append(_cond(t, "False", now, f"KubeletHasNo{t.replace('Pressure', '')}Pressure",
                                    f"kubelet has no {t.lower()}"))
        conditions.append(_cond("Ready", "False", now, "KubeletNotReady", "container runtime network not ready"))
        for t in NPD_BASE_CONDITIONS:
            conditions.append(_cond(t, "False", now, f"No{t}", f"node has no {t}"))
        if gpus and gpu.get("npd"):
            for t in NPD_GPU_CONDITIONS:
                ok, _bad = NPD_GPU_REASONS[t]
                conditions.append(_cond(t, "False", now, ok, f"{t}: healthy"))
        taints = [dict(t) for t in taints] + [
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": iso(now)},
        ]
        ip = f"10.{224 + (len(self.nodes) // 65536) % 32}.{(len(self.nodes) // 256) % 256}.{len(self.nodes) % 256}"
        obj: dict[str, Any] = {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {
                "name": name, "uid": fleet.new_uid(), "resourceVersion": self.next_rv(),
                "creationTimestamp": iso(now), "labels": dict(sorted(labels.items())),
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                    "csi.volume.kubernetes.io/nodeid": '{"disk.csi.azure.com":"' + name + '"}',
                },
            },
            "spec": {"podCIDR": f"10.244.{len(self.nodes) % 256}.0/24",
                     "providerID": provider_id or f"azure://{self._vm_id(vmss, instance_id)}",
                     "taints": taints},
            "status": {
                "capacity": capacity, "allocatable": allocatable, "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "machineID": fleet.new_uid().replace("-", ""), "systemUUID": fleet.new_uid(),
                    "bootID": fleet.new_uid(), "kernelVersion": "5.15.0-1079-azure",
                    "osImage": "Ubuntu 22.04.5 LTS", "containerRuntimeVersion": "containerd://1.7.27-1",
                    "kubeletVersion": f"v{self.kubernetes_version}", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64",
                },
                "images": _node_images(gpus > 0),
            },
        }
        node = Node(obj, pool=pool, instance_id=instance_id, vmss=vmss, nap=nap)
        node.gpu = gpu
        self.nodes[name] = node
        self.pods_by_node.setdefault(name, set())
        self._apply_gpu_resources(node)
        self.log_change(node, "ADDED")
        self.dirty = True
        fleet.oracles.node_changed(self, node)
        self._schedule_ready(node, fleet.timings["node_ready_s"] if ready_s is None else ready_s)
        return node

    def _apply_gpu_resources(self, node: Node) -> None:
        """Advertise nvidia.com/gpu or nvidia.com/mig-<profile> when the stack that would do so is present."""
        gpu = node.gpu
        info = size_info(node.labels.get("node.kubernetes.io/instance-type", ""))
        gpus = int(getattr(info, "gpus", 0) or 0) if getattr(info, "nvidia", False) else 0
        status = node.obj["status"]
        for block in (status["capacity"], status["allocatable"]):
            for k in [k for k in block if k.startswith("nvidia.com/")]:
                del block[k]
        if not gpus or gpu.get("driver_none"):
            return
        advertised = gpu.get("managed") or gpu.get("device_plugin")
        if gpu.get("device_plugin") is None and not gpu.get("managed"):
            advertised = self._device_plugin_covers(node)
        if not advertised:
            return
        res: dict[str, str] = {}
        profile = gpu.get("mig_profile") or ""
        profiles = dict(getattr(info, "mig_profiles", {}) or {})
        if profile and profile in profiles:
            suffix, per_gpu = profiles[profile]
            if gpu.get("mig_strategy") == "single":
                res["nvidia.com/gpu"] = str(gpus * per_gpu)
            else:
                res[f"nvidia.com/mig-{suffix}"] = str(gpus * per_gpu)
        else:
            res["nvidia.com/gpu"] = str(gpus)
        status["capacity"].update(res)
        status["allocatable"].update(res)

    def _device_plugin_covers(self, node: Node) -> bool:
        return any("nvidia-device-plugin" in ds.name and self._ds_wants(ds, node)
                   for ds in self.items("daemonsets.apps"))

    def _schedule_ready(self, node: Node, delay: float, *, clear: tuple[str, ...] = ()) -> None:
        node.boot += 1
        boot = node.boot
        name = node.name

        def become_ready() -> None:
            n = self.nodes.get(name)
            if n is None or n.boot != boot:
                return
            self._set_ready(n, True)
            for t in clear:
                self._set_condition(n, t, "False")
                n.repair_plan.pop(t, None)

        self.fleet.after(delay, become_ready)

    def _set_ready(self, node: Node, ready: bool) -> None:
        now = self.fleet.now()
        node.ready = ready
        c = node.condition("Ready")
        if c is not None:
            status = "True" if ready else "Unknown" if c["status"] == "True" else "False"
            if c["status"] != status:
                c["lastTransitionTime"] = iso(now)
            c.update(status=status, lastHeartbeatTime=iso(now),
                     reason="KubeletReady" if ready else "NodeStatusUnknown",
                     message="kubelet is posting ready status" if ready else "Kubelet stopped posting node status.")
        taints = [t for t in node.obj["spec"].get("taints") or [] if t.get("key") != "node.kubernetes.io/not-ready"
                  and t.get("key") != "node.kubernetes.io/unreachable"]
        if not ready:
            taints += [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                       {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": iso(now)}]
        node.obj["spec"]["taints"] = taints
        self.touch(node)
        self._node_pods_ready(node, ready)

    def _node_pods_ready(self, node: Node, ready: bool) -> None:
        """Pods on a node that stops posting status turn unready (and back), as the node controller does."""
        t = iso(self.fleet.now())
        if ready:
            self._kubelet_confirms_deletions(node)
        for key in sorted(self.pods_by_node.get(node.name, set())):
            pod = self.pods.get(key)
            if pod is None or pod.terminating or pod.phase != "Running" or (ready and never_ready(pod.obj)):
                continue
            changed = False
            for c in pod.obj["status"].get("conditions") or []:
                if c.get("type") in ("Ready", "ContainersReady") and (c.get("status") == "True") != ready:
                    c.update(status="True" if ready else "False", lastTransitionTime=t)
                    changed = True
            if changed:
                self.touch(pod)

    def sync_node(self, node: Node) -> None:
        """After a write through the API: keep the unschedulable taint in step with spec.unschedulable."""
        taints = [t for t in node.obj["spec"].get("taints") or [] if t.get("key") != "node.kubernetes.io/unschedulable"]
        if node.unschedulable:
            taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
                           "timeAdded": iso(self.fleet.now())})
        if taints:
            node.obj["spec"]["taints"] = taints
        else:
            node.obj["spec"].pop("taints", None)
        self.touch(node)

    def restart_node(self, name: str) -> None:
        self._repair(name, "restart", self.fleet.timings["restart_s"])

    def reimage_node(self, name: str) -> None:
        self._repair(name, "reimage", self.fleet.timings["reimage_s"])

    def _repair(self, name: str, rung: str, duration: float) -> None:
        with self.fleet.lock:
            node = self.nodes.get(name)
            if node is None:
                return
            self._set_ready(node, False)
            order = REPAIR_RUNGS.index(rung)
            clear = tuple(sorted(t for t, fix in node.repair_plan.items()
                                 if fix in REPAIR_RUNGS and REPAIR_RUNGS.index(fix) <= order))
            node.obj["status"]["nodeInfo"]["bootID"] = self.fleet.new_uid()
            self._schedule_ready(node, duration, clear=clear)
            boot = node.boot
            self.fleet.after(duration, lambda: self._npd_start(name, boot))
            self.fleet.oracles.record_repair(self, name, rung)

    def _npd_start(self, name: str, boot: int) -> None:
        """node-problem-detector starts with the boot: every custom-plugin condition is published
        ``False`` with a fresh transition time before any check ran, and a fault that survived the
        reboot turns ``True`` again only at the first check.

        kubernetes/node-problem-detector pkg/custompluginmonitor/custom_plugin_monitor.go
        (``monitorLoop`` -> ``initializeStatus`` -> ``initialConditions``: Status False, Transition now,
        unless ``skip_initial_status``); the first plugin run follows ``invoke_interval``.
        """
        node = self.nodes.get(name)
        if node is None or node.boot != boot:
            return
        now = self.fleet.now()
        reset = False
        for c in node.obj["status"].get("conditions") or []:
            if c.get("type") in NPD_GPU_CONDITIONS:
                ok, _bad = NPD_GPU_REASONS[c["type"]]
                c.update(status="False", reason=ok, message=f"{c['type']}: healthy", lastTransitionTime=iso(now),
                         lastHeartbeatTime=iso(now))
                reset = True
        if not reset:
            return
        self.touch(node)

        def first_check() -> None:
            n = self.nodes.get(name)
            if n is None or n.boot != boot:
                return
            for type_ in sorted(n.repair_plan):  # faults this boot did not fix
                self._set_condition(n, type_, "True")

        self.fleet.after(self.fleet.timings.get("npd_first_check_s", 30.0), first_check)

    def set_condition(self, node_name: str, type_: str, status: str, *, fixed_by: str = "restart",
                      reason: str = "", message: str = "") -> bool:
        """Flip a node condition now (scenario flips and /_sim/conditions)."""
        with self.fleet.lock:
            node = self.nodes.get(node_name)
            if node is None:
                return False
            self._set_condition(node, type_, status, reason=reason, message=message)
            if status == "True" and type_ in NPD_GPU_CONDITIONS:
                node.repair_plan[type_] = fixed_by if fixed_by in REPAIR_RUNGS else "restart"
            elif status != "True":
                node.repair_plan.pop(type_, None)
            return True

    def _set_condition(self, node: Node, type_: str, status: str, *, reason: str = "", message: str = "") -> None:
        now = self.fleet.now()
        ok, bad = NPD_GPU_REASONS.get(type_, (f"No{type_}", type_))
        reason = reason or (bad if status == "True" else ok)
        message = message or (f"{type_}: unhealthy" if status == "True" else f"{type_}: healthy")
        c = node.condition(type_)
        if c is None:
            node.obj["status"]["conditions"].append(_cond(type_, status, now, reason, message))
        else:
            if c.get("status") != status:
                c["lastTransitionTime"] = iso(now)
            c.update(status=status, reason=reason, message=message, lastHeartbeatTime=iso(now))
        self.touch(node)

    def delete_node(self, name: str, *, cause: str) -> None:
        """A node (VM) goes away with every pod on it."""
        node = self.nodes.get(name)
        if node is None:
            return
        for key in sorted(self.pods_by_node.get(name, set())):
            pod = self.pods.get(key)
            if pod is not None:
                # A pod already being deleted was counted when its deletion began; one that Azure took
                # with a spot VM was counted then (as ``spot_eviction``, not as the app's loss).
                if not pod.terminating and pod.cause != "spot_eviction":
                    self.fleet.oracles.pod_terminated(self, pod, cause="node_removal", detail=cause)
                # the pod garbage collector force-deletes the pods of a node that is gone
                # (kubernetes/kubernetes pkg/controller/podgc/gc_controller.go gcOrphaned)
                self._drop_pod(pod)
        self.pods_by_node.pop(name, None)
        del self.nodes[name]
        self.log_change(node, "DELETED")
        self.fleet.oracles.node_removed(self, node, cause=cause)
        self.dirty = True

    # ---- pods
    def create_pod(self, obj: dict[str, Any], *, run_s: float | None = None) -> Pod:
        """Store a new pod (from the API or a controller); the scheduler places it."""
        meta = obj.setdefault("metadata", {})
        ns = meta.setdefault("namespace", "default")
        self.admit_create("pods", ns, str(meta.get("name") or ""))
        psa.admit_pod(self, obj, ns)  # Pod Security Admission (enforce label of the namespace): sim/psa.py
        meta.setdefault("uid", self.fleet.new_uid())
        meta.setdefault("creationTimestamp", iso(self.fleet.now()))
        meta["resourceVersion"] = self.next_rv()
        obj["apiVersion"] = "v1"
        obj["kind"] = "Pod"
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        tolerations = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
        for c in spec.get("containers") or []:
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        pod = Pod(obj, run_s=run_s)
        self.pods[(ns, meta["name"])] = pod
        self.log_change(pod, "ADDED")
        ref = controller_of(obj)
        if ref:
            self.pods_by_owner.setdefault(ref["uid"], set()).add(pod.key)
        node = spec.get("nodeName")
        if node:
            self.pods_by_node.setdefault(node, set()).add(pod.key)
            self._start_pod(pod)
        else:
            self.pending.add(pod.key)
        self.dirty = True
        return pod

    def _start_pod(self, pod: Pod) -> None:
        now = self.fleet.now()
        pod.obj["status"].update(conditions=[
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": iso(now)}],
            hostIP=self._node_ip(pod.node_name))
        self.touch(pod)
        key, uid = pod.key, pod.meta["uid"]

        def running() -> None:
            p = self.pods.get(key)
            if p is None or p.meta["uid"] != uid or p.terminating or p.phase != "Pending":
                return
            t = iso(self.fleet.now())
            p.obj["status"].update(phase="Running", startTime=t)
            p.obj["status"]["podIP"] = f"10.244.{int(p.meta['uid'][:2], 16)}.{int(p.meta['uid'][2:4], 16)}"
            p.obj["status"]["conditions"] = [
                {"type": c, "status": "True", "lastProbeTime": None, "lastTransitionTime": t}
                for c in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
            unready = never_ready(p.obj)
            names = [str(c.get("name", "c")) for c in p.obj["spec"].get("containers") or []]
            if unready:  # running, readiness probe failing (pkg/kubelet/status/generate.go GeneratePodReadyCondition)
                for c in p.obj["status"]["conditions"]:
                    if c["type"] in ("Ready", "ContainersReady"):
                        c.update(status="False", reason="ContainersNotReady",
                                 message=f"containers with unready status: [{' '.join(names)}]")
            p.obj["status"]["containerStatuses"] = [
                {"name": c.get("name", "c"), "image": c.get("image", ""), "imageID": "", "ready": not unready,
                 "restartCount": 0, "started": True, "state": {"running": {"startedAt": t}},
                 "containerID": f"containerd://{uid[:12]}"}
                for c in p.obj["spec"].get("containers") or []]
            self.touch(p)
            if p.run_s is not None:
                self.fleet.after(p.run_s, complete)

        def complete() -> None:
            p = self.pods.get(key)
            if p is None or p.meta["uid"] != uid or p.terminating or p.phase != "Running":
                return
            t = iso(self.fleet.now())
            p.obj["status"]["phase"] = "Succeeded"
            for c in p.obj["status"]["conditions"]:
                if c["type"] in ("Ready", "ContainersReady"):
                    c.update(status="False", reason="PodCompleted", lastTransitionTime=t)
            for cs in p.obj["status"].get("containerStatuses") or []:
                cs.update(ready=False, started=False,
                          state={"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": t}})
            self.touch(p)
            self.fleet.oracles.pod_terminated(self, p, cause="completion")

        self.fleet.after(self.fleet.timings["pod_start_s"], running)

    def _node_ip(self, name: str) -> str:
        node = self.nodes.get(name)
        if node is None:
            return ""
        return node.obj["status"]["addresses"][0]["address"]

    def delete_pod(self, pod: Pod, *, grace: int | None = None, cause: str = "delete") -> None:
        """Begin graceful termination: deletionTimestamp = now + grace; the kubelet confirms at the end of
        the grace period and the pod goes (unless finalizers hold it, or its node cannot confirm).

        The grace period: the request's, else the pod's terminationGracePeriodSeconds; 0 for a pod that
        was never scheduled or has finished; a negative one becomes 1 (pkg/registry/core/pod/strategy.go
        CheckGracefulDelete). Deleting a pod that is already terminating may only shorten its grace
        period (staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete); 0 removes it now
        (``--force --grace-period=0``), finalizers permitting.
        """
        if grace is None:
            spec_grace = pod.obj["spec"].get("terminationGracePeriodSeconds")
            grace = 30 if spec_grace is None else int(spec_grace)
        if grace < 0:
            grace = 1
        if not pod.node_name or pod.phase in ("Succeeded", "Failed"):
            grace = 0
        now = self.fleet.now()
        if pod.terminating:
            current = pod.meta.get("deletionGracePeriodSeconds")
            if not current:
                self._drop_pod(pod)  # already final: nothing but finalizers can keep it
                return
            if grace >= int(current):
                return
            due = parse_iso(pod.meta["deletionTimestamp"]) - int(current) + grace
            pod.meta["deletionTimestamp"] = iso(due)
            pod.meta["deletionGracePeriodSeconds"] = grace
            if grace == 0:
                self._drop_pod(pod)
                return
            self.touch(pod)
            self._confirm_later(pod, max(0.0, due - now))
            return
        self.fleet.oracles.pod_terminated(self, pod, cause=cause)
        pod.meta["deletionTimestamp"] = iso(now + grace)
        pod.meta["deletionGracePeriodSeconds"] = grace
        pod.cause = cause
        self.pending.discard(pod.key)
        for c in pod.obj["status"].get("conditions") or []:
            if c["type"] in ("Ready", "ContainersReady"):
                c.update(status="False", lastTransitionTime=iso(now))
        pod.invalidate()
        if grace == 0:
            self._drop_pod(pod)
            return
        self.touch(pod)
        self._confirm_later(pod, grace)

    def _confirm_later(self, pod: Pod, delay: float) -> None:
        key, uid = pod.key, pod.meta["uid"]

        def grace_over() -> None:
            p = self.pods.get(key)
            if p is None or p.meta["uid"] != uid or not p.terminating or not p.meta.get("deletionGracePeriodSeconds"):
                return
            if parse_iso(p.meta["deletionTimestamp"]) > self.fleet.now():
                return  # shortened or re-armed: a later callback finishes it
            self._kubelet_confirm(p)

        self.fleet.after(delay, grace_over)

    def _kubelet_confirm(self, pod: Pod) -> None:
        """The grace period is over: the kubelet stops the containers and deletes the pod for good. A
        kubelet that does not post status (node NotReady or Unknown) cannot: the pod stays Terminating
        until its node comes back (:meth:`_kubelet_confirms_deletions`), the node object is deleted
        (pod GC, :meth:`delete_node`) or someone force-deletes it with gracePeriodSeconds=0.

        kubernetes/kubernetes pkg/kubelet/status/status_manager.go (canBeDeleted, then Delete with
        grace 0) and pkg/controller/podgc/gc_controller.go (gcOrphaned; gcTerminating only for nodes
        tainted node.kubernetes.io/out-of-service).
        """
        node = self.nodes.get(pod.node_name) if pod.node_name else None
        if node is not None and not node.ready:
            return
        self._drop_pod(pod)

    def _kubelet_confirms_deletions(self, node: Node) -> None:
        """A node's kubelet posts status again: it finishes the deletions whose grace period ran out."""
        now = self.fleet.now()
        for key in sorted(self.pods_by_node.get(node.name, set())):
            pod = self.pods.get(key)
            if (pod is not None and pod.terminating and pod.meta.get("deletionGracePeriodSeconds")
                    and parse_iso(pod.meta["deletionTimestamp"]) <= now):
                self._drop_pod(pod)

    def _drop_pod(self, pod: Pod) -> None:
        """The final delete (grace period over, or 0): the pod leaves the store, unless
        ``metadata.finalizers`` hold it: then it stays with deletionGracePeriodSeconds 0 (its
        containers stopped, phase Failed if it had run) until the last finalizer is removed by an
        update, when :meth:`_release_finalized` removes it.

        staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go
        (updateForGracefulDeletionAndFinalizers, deleteWithoutFinalizers on update).
        """
        key = pod.key
        if self.pods.get(key) is not pod:
            return
        if pod.meta.get("finalizers"):
            if key in self.finalizing:
                return
            now = self.fleet.now()
            pod.meta.setdefault("deletionTimestamp", iso(now))
            pod.meta["deletionGracePeriodSeconds"] = 0
            self.pending.discard(key)
            if pod.node_name and pod.phase not in ("Succeeded", "Failed"):
                t = iso(now)
                pod.obj["status"]["phase"] = "Failed"
                for c in pod.obj["status"].get("conditions") or []:
                    if c.get("type") in ("Ready", "ContainersReady") and c.get("status") != "False":
                        c.update(status="False", lastTransitionTime=t)
                for cs in pod.obj["status"].get("containerStatuses") or []:
                    cs.update(ready=False, started=False,
                              state={"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": t}})
            self.finalizing.add(key)
            self.touch(pod)
            release = (pod.meta.get("annotations") or {}).get(FINALIZER_RELEASE_ANNOTATION)
            if release:
                uid = pod.meta["uid"]

                def release_finalizers() -> None:
                    p = self.pods.get(key)
                    if p is not None and p.meta["uid"] == uid and p.meta.get("finalizers"):
                        p.meta["finalizers"] = []
                        self.touch(p)

                self.fleet.after(float(release), release_finalizers)
            return
        self._remove_pod(pod)

    def _release_finalized(self) -> None:
        """Pods held by finalizers go as soon as an update removed the last one."""
        if not self.finalizing:
            return
        for key in sorted(self.finalizing):
            pod = self.pods.get(key)
            if pod is None:
                self.finalizing.discard(key)
            elif not pod.meta.get("finalizers"):
                self.finalizing.discard(key)
                self._remove_pod(pod)

    def _remove_pod(self, pod: Pod) -> None:
        key = pod.key
        if self.pods.get(key) is not pod:
            return
        self.finalizing.discard(key)
        del self.pods[key]
        self.log_change(pod, "DELETED")
        self.pending.discard(key)
        if pod.node_name:
            self.pods_by_node.get(pod.node_name, set()).discard(key)
        ref = controller_of(pod.obj)
        if ref:
            owned = self.pods_by_owner.get(ref["uid"])
            if owned is not None:
                owned.discard(key)
        self.dirty = True

    def _cascade_delete(self, owner: KObj) -> None:
        uid = owner.meta["uid"]
        for key in sorted(self.pods_by_owner.get(uid, set())):
            pod = self.pods.get(key)
            if pod is not None:
                self.delete_pod(pod, cause="owner_deleted")
        for rs in self.items("replicasets.apps"):
            ref = controller_of(rs.obj)
            if ref and ref.get("uid") == uid:
                self.remove("replicasets.apps", rs.namespace, rs.name)

    # ---- PDBs
    def pdbs_for(self, pod: Pod) -> list[KObj]:
        labels = pod.meta.get("labels") or {}
        out = []
        for pdb in self.items("poddisruptionbudgets.policy", pod.namespace):
            try:
                reqs = selector_requirements(pdb.obj.get("spec", {}).get("selector"))
            except (TypeError, AttributeError):
                continue
            if reqs and match_requirements(labels, reqs):
                out.append(pdb)
        return out

    def pdb_status(self, pdb: KObj, *, disrupted: dict[str, Any] | None = None) -> dict[str, Any]:
        """currentHealthy, desiredHealthy, disruptionsAllowed, expectedPods, computed from the pods now.

        Without ``disrupted`` this is the truth the oracles judge by. The disruption controller passes
        the PDB's ``status.disruptedPods``: a pod whose eviction was approved less than DeletionTimeout
        ago does not count as healthy (kubernetes/kubernetes pkg/controller/disruption/disruption.go
        countHealthyPods, updatePdbStatus: no disruption is allowed while expectedPods is 0).
        """
        spec = pdb.obj.get("spec") or {}
        reqs = selector_requirements(spec.get("selector"))
        pods = [p for p in self.items("pods", pdb.namespace)
                if reqs and match_requirements(p.meta.get("labels") or {}, reqs) and p.phase not in ("Succeeded", "Failed")]
        now = self.fleet.now()
        healthy = 0
        for p in pods:
            if not _pod_ready(p):
                continue
            when = (disrupted or {}).get(p.name)
            if when is not None:
                try:
                    if parse_iso(str(when)) + PDB_DELETION_TIMEOUT_S > now:
                        continue
                except ValueError:
                    pass
            healthy += 1
        expected = self._expected_pods(pods) if pods else 0
        if spec.get("minAvailable") is not None:
            desired = _int_or_percent(spec["minAvailable"], expected, round_up=True)
        elif spec.get("maxUnavailable") is not None:
            desired = max(0, expected - _int_or_percent(spec["maxUnavailable"], expected, round_up=True))
        else:
            desired = expected
        allowed = healthy - desired if expected > 0 else 0
        return {"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                "disruptionsAllowed": max(0, allowed), "observedGeneration": pdb.meta.get("generation", 1)}

    def _expected_pods(self, pods: list[Pod]) -> int:
        """Scale of the controllers owning the pods (as the disruption controller finds it)."""
        total, seen, bare = 0, set(), 0
        for p in pods:
            ref = controller_of(p.obj)
            if not ref:
                bare += 1
                continue
            if ref["uid"] in seen:
                continue
            seen.add(ref["uid"])
            owner = self._owner(p.namespace, ref)
            spec = owner.obj.get("spec", {}) if owner else {}
            if ref.get("kind") in ("ReplicaSet", "StatefulSet"):
                total += int(spec.get("replicas", 1)) if owner else 0
            elif ref.get("kind") == "Job":
                total += int(spec.get("parallelism", 1)) if owner else 0
            else:
                total += sum(1 for q in pods if (controller_of(q.obj) or {}).get("uid") == ref["uid"])
        return total + bare

    def _owner(self, namespace: str, ref: dict[str, Any]) -> KObj | None:
        resource = {"ReplicaSet": "replicasets.apps", "StatefulSet": "statefulsets.apps",
                    "DaemonSet": "daemonsets.apps", "Job": "jobs.batch", "Deployment": "deployments.apps"}.get(
            ref.get("kind", ""))
        if not resource:
            return None
        obj = self.get(resource, namespace, ref.get("name", ""))
        return obj if obj is not None and obj.meta.get("uid") == ref.get("uid") else None

    def disruption_blockers(self, pod: Pod) -> list[tuple[KObj, dict[str, Any]]]:
        """PDBs that would go below desiredHealthy if this pod stopped being healthy now."""
        if not _pod_ready(pod):
            return []
        out = []
        for pdb in self.pdbs_for(pod):
            st = self.pdb_status(pdb)
            if st["disruptionsAllowed"] <= 0:
                out.append((pdb, st))
        return out

    # ---- controllers and scheduler
    def reconcile(self) -> None:
        """Controllers then scheduler until nothing changes (bounded)."""
        for _ in range(5):
            self.dirty = False
            self._deployments()
            self._replicasets()
            self._statefulsets()
            self._daemonsets()
            self._jobs()
            self._schedule()
            if self.nap:
                self._autoprovision()
            self._pdb_statuses()
            self._release_finalized()
            self._namespaces()
            if not self.dirty:
                break
        self.dirty = False

    def _template_pod(self, owner: KObj, kind: str, name: str, *, node: str | None = None) -> dict[str, Any]:
        tmpl = msgspec.json.decode(_ENCODER.encode((owner.obj.get("spec") or {}).get("template") or {}))
        meta = tmpl.get("metadata") or {}
        meta = {"name": name, "namespace": owner.namespace, "labels": dict(meta.get("labels") or {}),
                "annotations": dict(meta.get("annotations") or {}),
                # pkg/controller/controller_utils.go GetPodFromTemplate copies the template's finalizers
                **({"finalizers": list(meta["finalizers"])} if meta.get("finalizers") else {}),
                "ownerReferences": [{"apiVersion": owner.obj.get("apiVersion", "apps/v1"), "kind": kind,
                                     "name": owner.name, "uid": owner.meta["uid"], "controller": True,
                                     "blockOwnerDeletion": True}]}
        if kind == "ReplicaSet" and "pod-template-hash" in (owner.meta.get("labels") or {}):
            meta["labels"]["pod-template-hash"] = owner.meta["labels"]["pod-template-hash"]
        spec = tmpl.get("spec") or {}
        if node:
            spec["nodeName"] = node
        return {"metadata": meta, "spec": spec}

    def _owned_active(self, owner: KObj) -> list[Pod]:
        keys = self.pods_by_owner.get(owner.meta["uid"], set())
        pods = [self.pods[k] for k in sorted(keys) if k in self.pods]
        return [p for p in pods if not p.terminating and p.phase not in ("Succeeded", "Failed")]

    def _deployments(self) -> None:
        for dep in self.items("deployments.apps"):
            spec = dep.obj.get("spec") or {}
            tmpl_hash = hashlib.sha256(_ENCODER.encode(spec.get("template") or {})).hexdigest()
            pth = _rs_hash(tmpl_hash)
            rs_name = f"{dep.name}-{pth}"
            replicas = int(spec.get("replicas", 1))
            owned = [rs for rs in self.items("replicasets.apps", dep.namespace)
                     if (controller_of(rs.obj) or {}).get("uid") == dep.meta["uid"]]
            current = next((rs for rs in owned if rs.name == rs_name), None)
            if current is None:
                tmpl = msgspec.json.decode(_ENCODER.encode(spec.get("template") or {}))
                tmpl.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = pth
                sel = msgspec.json.decode(_ENCODER.encode(spec.get("selector") or {}))
                sel.setdefault("matchLabels", {})["pod-template-hash"] = pth
                current = self.put("replicasets.apps", {
                    "metadata": {"name": rs_name, "namespace": dep.namespace,
                                 "labels": dict(tmpl["metadata"]["labels"]),
                                 "annotations": {"deployment.kubernetes.io/revision": str(len(owned) + 1)},
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": dep.name,
                                                      "uid": dep.meta["uid"], "controller": True,
                                                      "blockOwnerDeletion": True}]},
                    "spec": {"replicas": replicas, "selector": sel, "template": tmpl}})
            for rs in owned:
                want = replicas if rs is current else 0
                if int(rs.obj["spec"].get("replicas", 0)) != want:
                    rs.obj["spec"]["replicas"] = want
                    self.touch(rs)
            active = self._owned_active(current)
            ready = sum(1 for p in active if _pod_ready(p))
            status = {"observedGeneration": dep.meta.get("generation", 1), "replicas": len(active),
                      "updatedReplicas": len(active), "readyReplicas": ready, "availableReplicas": ready,
                      "unavailableReplicas": max(0, replicas - ready)}
            if dep.obj.get("status") != status:
                dep.obj["status"] = status
                self._modified(dep)

    def _replicasets(self) -> None:
        for rs in self.items("replicasets.apps"):
            want = int((rs.obj.get("spec") or {}).get("replicas", 1))
            active = self._owned_active(rs)
            if len(active) < want:
                for _ in range(want - len(active)):
                    pod = self._template_pod(rs, "ReplicaSet", f"{rs.name}-{self.fleet.rand_suffix()}")
                    if not psa.create_controller_pod(self, rs, "ReplicaSet", pod):  # refused: FailedCreate
                        break
            elif len(active) > want:
                for pod in sorted(active, key=lambda p: (bool(p.node_name), p.meta["creationTimestamp"], p.name),
                                  reverse=False)[: len(active) - want]:
                    self.delete_pod(pod, cause="scale_down")
            self._set_status(rs, {"replicas": len(active), "readyReplicas": sum(1 for p in active if _pod_ready(p)),
                                  "availableReplicas": sum(1 for p in active if _pod_ready(p)),
                                  "observedGeneration": rs.meta.get("generation", 1)})

    def _statefulsets(self) -> None:
        for sts in self.items("statefulsets.apps"):
            want = int((sts.obj.get("spec") or {}).get("replicas", 1))
            for i in range(want):
                name = f"{sts.name}-{i}"
                if (sts.namespace, name) not in self.pods:
                    obj = self._template_pod(sts, "StatefulSet", name)
                    obj["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = name
                    obj["spec"].setdefault("hostname", name)
                    # OrderedReady: a refused ordinal stops the burst (stateful_set_control.go)
                    if not psa.create_controller_pod(self, sts, "StatefulSet", obj):
                        break
            for pod in self._owned_active(sts):
                idx = pod.name.rsplit("-", 1)[-1]
                if idx.isdigit() and int(idx) >= want:
                    self.delete_pod(pod, cause="scale_down")
            active = self._owned_active(sts)
            self._set_status(sts, {"replicas": len(active), "readyReplicas": sum(1 for p in active if _pod_ready(p)),
                                   "currentReplicas": len(active), "updatedReplicas": len(active),
                                   "availableReplicas": sum(1 for p in active if _pod_ready(p)),
                                   "observedGeneration": sts.meta.get("generation", 1)})

    def _ds_wants(self, ds: KObj, node: Node) -> bool:
        spec = ((ds.obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        tolerations = list(spec.get("tolerations") or []) + _DS_TOLERATIONS
        return _fits_placement(spec, node, tolerations)

    def _daemonsets(self) -> None:
        plugin_changed = False
        for ds in self.items("daemonsets.apps"):
            pods = [self.pods[k] for k in sorted(self.pods_by_owner.get(ds.meta["uid"], set())) if k in self.pods]
            by_node: dict[str, list[Pod]] = {}
            for p in pods:
                by_node.setdefault(p.node_name, []).append(p)
            desired = 0
            for name in sorted(self.nodes):
                node = self.nodes[name]
                if not self._ds_wants(ds, node):
                    continue
                desired += 1
                if not any(not p.terminating for p in by_node.get(name, [])):
                    obj = self._template_pod(ds, "DaemonSet", f"{ds.name}-{self.fleet.rand_suffix()}", node=name)
                    if psa.create_controller_pod(self, ds, "DaemonSet", obj):  # refused: FailedCreate
                        plugin_changed = plugin_changed or "nvidia-device-plugin" in ds.name
            active = self._owned_active(ds)
            ready = sum(1 for p in active if _pod_ready(p))
            self._set_status(ds, {"desiredNumberScheduled": desired, "currentNumberScheduled": len(active),
                                  "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": len(active),
                                  "numberMisscheduled": 0, "observedGeneration": ds.meta.get("generation", 1)})
        if plugin_changed:
            for name in sorted(self.nodes):
                node = self.nodes[name]
                before = dict(node.obj["status"]["allocatable"])
                self._apply_gpu_resources(node)
                if before != node.obj["status"]["allocatable"]:
                    self.touch(node)

    def _jobs(self) -> None:
        for job in self.items("jobs.batch"):
            spec = job.obj.get("spec") or {}
            completions = int(spec.get("completions", 1))
            parallelism = int(spec.get("parallelism", 1))
            keys = sorted(self.pods_by_owner.get(job.meta["uid"], set()))
            pods = [self.pods[k] for k in keys if k in self.pods]
            done = int((job.obj.get("status") or {}).get("succeeded", 0))
            done = max(done, sum(1 for p in pods if p.phase == "Succeeded"))
            active = [p for p in pods if not p.terminating and p.phase not in ("Succeeded", "Failed")]
            want = min(parallelism, completions - done) - len(active)
            run_s = self.job_run_s.get((job.namespace, job.name))
            if run_s is None:
                ann = (job.meta.get("annotations") or {}).get("sim.fleet/run-seconds")
                run_s = float(ann) if ann else self.fleet.timings["job_run_s"]
            for _ in range(max(0, want)):
                obj = self._template_pod(job, "Job", f"{job.name}-{self.fleet.rand_suffix()}")
                obj["metadata"]["labels"]["job-name"] = job.name
                obj["metadata"]["labels"]["batch.kubernetes.io/job-name"] = job.name
                obj["spec"].setdefault("restartPolicy", "Never")
                if not psa.create_controller_pod(self, job, "Job", obj, run_s=run_s):  # refused: FailedCreate, retried later
                    break
            status: dict[str, Any] = {"active": len(active), "succeeded": done, "ready": sum(1 for p in active if _pod_ready(p))}
            if done >= completions:
                status["conditions"] = [{"type": "Complete", "status": "True"}]
            self._set_status(job, status)

    def _set_status(self, kobj: KObj, status: dict[str, Any]) -> None:
        if kobj.obj.get("status") != status:
            kobj.obj["status"] = status
            self._modified(kobj)

    def _pdb_statuses(self) -> None:
        """The disruption controller. A PDB that was created or changed by someone else (its spec, or
        its status written by a client) is observed ``pdb_observe_s`` later: until then its status is
        left as it is, so ``status.observedGeneration < metadata.generation`` after a create or a spec
        change. Otherwise the status follows the pods at once; ``disruptedPods`` keeps the evictions
        not yet seen through (pod still there, not deleting, approved less than 2 minutes ago).

        kubernetes/kubernetes pkg/controller/disruption/disruption.go (trySync, buildDisruptedPodMap,
        updatePdbStatus) and staging/src/k8s.io/component-helpers/apps/poddisruptionbudget/helpers.go.
        """
        now = self.fleet.now()
        lag = float(self.fleet.timings.get("pdb_observe_s", 1.0))
        for pdb in self.items("poddisruptionbudgets.policy"):
            key = (pdb.namespace, pdb.name)
            if self.pdb_synced_rv.get(key) != pdb.meta.get("resourceVersion") and lag > 0:
                due = self.pdb_observe_due.get(key)
                if due is None:
                    self.pdb_observe_due[key] = now + lag
                    self.fleet.at(now + lag, functools.partial(self._pdb_observed, key))
                    continue
                if due != float("-inf"):
                    continue  # not observed yet
            self.pdb_observe_due.pop(key, None)
            old = pdb.obj.get("status") or {}
            disrupted = {}
            for name, when in sorted((old.get("disruptedPods") or {}).items()):
                p = self.pods.get((pdb.namespace, name))
                if p is None or p.terminating:
                    continue
                try:
                    if parse_iso(str(when)) + PDB_DELETION_TIMEOUT_S <= now:
                        continue
                except ValueError:
                    continue
                disrupted[name] = when
            try:
                st = self.pdb_status(pdb, disrupted=disrupted)
            except (ValueError, TypeError, AttributeError):
                self.pdb_synced_rv[key] = str(pdb.meta.get("resourceVersion"))
                continue
            if disrupted:
                st["disruptedPods"] = disrupted
            allowed = st["disruptionsAllowed"] > 0
            cond = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
            want = {"type": "DisruptionAllowed", "status": "True" if allowed else "False",
                    "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
                    "observedGeneration": st["observedGeneration"]}
            if cond is not None and all(cond.get(k) == v for k, v in want.items()):
                want["lastTransitionTime"] = cond.get("lastTransitionTime")
            else:
                keep_time = cond is not None and cond.get("status") == want["status"]
                want["lastTransitionTime"] = cond.get("lastTransitionTime") if keep_time and cond else iso(now)
            st["conditions"] = [want]
            if any(old.get(k) != v for k, v in st.items()) or (old.get("disruptedPods") and not disrupted):
                pdb.obj["status"] = st
                self._modified(pdb)
            self.pdb_synced_rv[key] = str(pdb.meta.get("resourceVersion"))

    def _pdb_observed(self, key: tuple[str, str]) -> None:
        """The disruption controller's informer delivers the PDB change: sync it now."""
        if key in self.pdb_observe_due:
            self.pdb_observe_due[key] = float("-inf")
        self.dirty = True

    def record_pdb_eviction(self, pdb: KObj, pod_name: str) -> None:
        """The eviction subresource's write: one disruption fewer, the pod noted in disruptedPods
        (kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go checkAndDecrement)."""
        st = dict(pdb.obj.get("status") or {})
        st["disruptionsAllowed"] = int(st.get("disruptionsAllowed") or 0) - 1
        if st["disruptionsAllowed"] == 0:
            conds = [c for c in st.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
            conds.append({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods", "message": "",
                          "observedGeneration": st.get("observedGeneration", 0),
                          "lastTransitionTime": iso(self.fleet.now())})
            st["conditions"] = conds
        st["disruptedPods"] = {**(st.get("disruptedPods") or {}), pod_name: iso(self.fleet.now())}
        pdb.obj["status"] = st
        self._modified(pdb)
        self.pdb_synced_rv[(pdb.namespace, pdb.name)] = str(pdb.meta.get("resourceVersion"))
        self.dirty = True

    def node_free(self, node: Node) -> dict[str, float]:
        alloc = {k: parse_quantity(v) for k, v in node.obj["status"]["allocatable"].items()}
        used: dict[str, float] = {"pods": 0.0}
        for key in self.pods_by_node.get(node.name, set()):
            p = self.pods.get(key)
            if p is None or p.phase in ("Succeeded", "Failed"):
                continue
            used["pods"] += 1
            for k, v in p.requests.items():
                used[k] = used.get(k, 0.0) + v
        return {k: alloc.get(k, 0.0) - used.get(k, 0.0) for k in set(alloc) | set(used)}

    def fits(self, pod: Pod, node: Node, *, ignore_ready: bool = False,
             free: dict[str, float] | None = None) -> bool:
        if not ignore_ready and (not node.ready or node.unschedulable):
            return False
        if free is None:
            free = self.node_free(node)
        if free.get("pods", 0) < 1:
            return False
        if not all(free.get(k, 0.0) + 1e-9 >= v for k, v in pod.requests.items() if v > 0):
            return False
        return _fits_placement(pod.obj.get("spec") or {}, node, pod.obj["spec"].get("tolerations") or [],
                               ignore_ready=ignore_ready)

    def _schedule(self) -> None:
        """Place pending pods (oldest first) on the feasible node with the fewest siblings, then the most
        free CPU. Free resources are computed once per pass and updated as pods are bound."""
        if not self.pending:
            return
        nodes = [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].ready and not self.nodes[n].unschedulable]
        free_of: dict[str, dict[str, float]] = {}
        alloc_cpu: dict[str, float] = {}
        candidates_of: dict[str, list[Node]] = {}
        sibling_count: dict[tuple[str, str], int] = {}
        order = sorted(self.pending, key=lambda k: (self.pods[k].meta["creationTimestamp"], k) if k in self.pods
                       else ("", k))
        for key in order:
            pod = self.pods.get(key)
            if pod is None or pod.terminating or pod.node_name:
                self.pending.discard(key)
                continue
            best, best_score = None, None
            owner_uid = (controller_of(pod.obj) or {}).get("uid")
            # placement (taints, selectors, affinity) is the same for every pod of one owner in a pass
            group = owner_uid or f"pod:{key}"
            if group not in candidates_of:
                spec = pod.obj.get("spec") or {}
                tolerations = spec.get("tolerations") or []
                candidates_of[group] = [n for n in nodes if _fits_placement(spec, n, tolerations)]
            for node in candidates_of[group]:
                free = free_of.get(node.name)
                if free is None:
                    free = free_of[node.name] = self.node_free(node)
                    alloc_cpu[node.name] = parse_quantity(node.obj["status"]["allocatable"].get("cpu", "1")) or 1.0
                if free.get("pods", 0) < 1 or not all(free.get(k, 0.0) + 1e-9 >= v
                                                      for k, v in pod.requests.items() if v > 0):
                    continue
                siblings = 0
                if owner_uid:
                    sk = (owner_uid, node.name)
                    siblings = sibling_count.get(sk, -1)
                    if siblings < 0:
                        siblings = sibling_count[sk] = sum(
                            1 for k in self.pods_by_node.get(node.name, ())
                            if (controller_of(self.pods[k].obj) or {}).get("uid") == owner_uid
                            and not self.pods[k].terminating)
                score = (siblings, -(free.get("cpu", 0.0) / alloc_cpu[node.name]), node.name)
                if best_score is None or score < best_score:
                    best, best_score = node, score
            if best is None:
                self._mark_unschedulable(pod)
                continue
            pod.obj["spec"]["nodeName"] = best.name
            self.pending.discard(key)
            self.pods_by_node.setdefault(best.name, set()).add(key)
            self.nap_inflight.pop(pod.meta["uid"], None)
            if owner_uid and (owner_uid, best.name) in sibling_count:
                sibling_count[(owner_uid, best.name)] += 1
            taken = free_of[best.name]
            taken["pods"] = taken.get("pods", 0.0) - 1
            for k, v in pod.requests.items():
                taken[k] = taken.get(k, 0.0) - v
            self._start_pod(pod)

    def _mark_unschedulable(self, pod: Pod) -> None:
        conds = pod.obj["status"].get("conditions") or []
        if any(c.get("reason") == "Unschedulable" for c in conds):
            return
        pod.obj["status"]["conditions"] = [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
            "lastTransitionTime": iso(self.fleet.now()),
            "message": f"0/{len(self.nodes)} nodes are available: no node fits the pod's requirements."}]
        self._modified(pod)

    # ---- node auto-provisioning (Karpenter)
    def _autoprovision(self) -> None:
        for key in sorted(self.pending):
            pod = self.pods.get(key)
            if pod is None or pod.node_name or pod.terminating:
                continue
            uid = pod.meta["uid"]
            if uid in self.nap_inflight and self.nap_inflight[uid] in self.nodes:
                continue
            choice = self._nap_choice(pod)
            if choice is None:
                continue
            nodepool, size, managed, chosen = choice
            node = self._add_nap_node(nodepool, size, managed=managed, chosen=chosen)
            self.nap_inflight[uid] = node.name

    def _nap_choice(self, pod: Pod) -> tuple[KObj, Any, bool, dict[str, str]] | None:
        """The first NodePool (by name) that admits the pod, the smallest size it allows, and the labels
        chosen for the flexible requirements (zone, capacity type)."""
        for np_obj in self.items("nodepools.karpenter.sh"):
            tmpl = ((np_obj.obj.get("spec") or {}).get("template") or {})
            tspec = tmpl.get("spec") or {}
            taints = list(tspec.get("taints") or [])
            if not _tolerates(pod.obj["spec"].get("tolerations") or [], taints):
                continue
            reqs = [(r.get("key", ""), r.get("operator", "In"), tuple(r.get("values") or ()))
                    for r in tspec.get("requirements") or []]
            chosen = {"topology.kubernetes.io/zone": f"{self.location}-1", "karpenter.sh/capacity-type": "on-demand"}
            for key, op, values in reqs:
                if key in chosen and op == "In" and values:
                    chosen[key] = str(values[0])
            labels_fixed = dict((tmpl.get("metadata") or {}).get("labels") or {})
            class_name = ((tspec.get("nodeClassRef") or {}).get("name")) or "default"
            node_class = self.get("aksnodeclasses.karpenter.azure.com", "", class_name)
            managed = bool(node_class and str(((node_class.obj.get("spec") or {}).get("tags") or {})
                                            .get(MANAGED_GPU_TAG, "")).lower() == "true")
            wants_gpu = pod.requests.get("nvidia.com/gpu", 0) > 0
            candidates = gpu_sizes() if wants_gpu else [size_info("Standard_D4s_v5"), size_info("Standard_D8s_v5")]
            for size in candidates:
                labels = dict(labels_fixed)
                labels.update(_nap_size_labels(size))
                labels.update(chosen)
                if not match_requirements(labels, reqs):
                    continue
                if wants_gpu and int(getattr(size, "gpus", 0)) < pod.requests.get("nvidia.com/gpu", 0):
                    continue
                if int(size.vcpus) * 1000 < pod.requests.get("cpu", 0) * 1000:
                    continue
                if not self._within_limits(np_obj, size):
                    continue
                sel = pod.obj["spec"].get("nodeSelector") or {}
                probe = dict(labels)
                probe.update({"karpenter.sh/nodepool": np_obj.name, "kubernetes.io/os": "linux"})
                if any(probe.get(k) != v for k, v in sel.items()):
                    continue
                return np_obj, size, managed, chosen
        return None

    def _within_limits(self, np_obj: KObj, size: Any) -> bool:
        """NodePool ``spec.limits`` (cpu, memory, nvidia.com/gpu) over its nodes plus one more of ``size``."""
        limits = (np_obj.obj.get("spec") or {}).get("limits") or {}
        if not limits:
            return True
        used = {"cpu": float(size.vcpus), "memory": float(size.memory_gib) * 1024**3,
                "nvidia.com/gpu": float(getattr(size, "gpus", 0) or 0)}
        for node in self.nodes.values():
            if node.nap and node.pool == np_obj.name:
                info = size_info(node.labels.get("node.kubernetes.io/instance-type", ""))
                used["cpu"] += float(info.vcpus)
                used["memory"] += float(info.memory_gib) * 1024**3
                used["nvidia.com/gpu"] += float(getattr(info, "gpus", 0) or 0)
        for key, value in limits.items():
            try:
                if key in used and used[key] > parse_quantity(value) + 1e-9:
                    return False
            except ValueError:
                continue
        return True

    def _add_nap_node(self, np_obj: KObj, size: Any, *, managed: bool, chosen: dict[str, str]) -> Node:
        """A Karpenter node and its NodeClaim, labelled as karpenter-provider-azure labels them.

        Azure/karpenter-provider-azure: the NodeClaim is ``<nodepool>-<suffix>`` and its VM (and so the
        node) ``aks-<nodeclaim>`` (pkg/providers/instance); labels: the NodePool's template labels, the
        well-known requirements (pkg/apis/v1beta1/labels.go: karpenter.azure.com/sku-*,
        kubernetes.azure.com/mode, os-sku, priority...) and AddAgentBakerGeneratedLabels
        (pkg/providers/imagefamily/labels/labels.go: kubernetes.azure.com/role, cluster). Not set:
        ``kubernetes.azure.com/agentpool``, ``agentpool`` and ``kubernetes.azure.com/accelerator``
        (designs/0006-requirements-and-labels.md, "Karpenter (written to node)"). The node is a
        standalone VM: ``providerID`` azure:///subscriptions/.../virtualMachines/<name>.
        """
        tmpl = ((np_obj.obj.get("spec") or {}).get("template") or {})
        tspec = tmpl.get("spec") or {}
        claim = f"{np_obj.name}-{self.fleet.rand_suffix(5)}"
        name = f"aks-{claim}"
        labels = {"karpenter.sh/nodepool": np_obj.name, "karpenter.sh/registered": "true",
                  "karpenter.sh/initialized": "true",
                  "kubernetes.azure.com/cluster": self.node_resource_group, "kubernetes.azure.com/role": "agent",
                  "kubernetes.azure.com/mode": "user", "kubernetes.azure.com/priority": "regular",
                  "kubernetes.azure.com/os-sku": "Ubuntu", "kubernetes.io/os": "linux",
                  "node.kubernetes.io/instance-type": size.name, "topology.kubernetes.io/region": self.location,
                  "topology.kubernetes.io/zone": f"{self.location}-1"}
        labels.update({str(k): str(v) for k, v in ((tmpl.get("metadata") or {}).get("labels") or {}).items()})
        labels.update(_nap_size_labels(size))
        labels.update(chosen)
        provider = (f"azure:///subscriptions/{self.subscription}/resourceGroups/{self.node_resource_group}"
                    f"/providers/Microsoft.Compute/virtualMachines/{name}")
        node = self._build_node(name=name, pool=np_obj.name, instance_id=0, vmss="", labels=labels,
                                taints=[dict(t) for t in tspec.get("taints") or []], vm_size=size.name, max_pods=250,
                                gpu={"managed": managed, "npd": managed, "device_plugin": True, "mig_profile": "",
                                     "mig_strategy": ""}, nap=True, provider_id=provider,
                                ready_s=self.fleet.timings["nap_provision_s"])
        claim_obj = self.put("nodeclaims.karpenter.sh", {
            "metadata": {"name": claim, "labels": {"karpenter.sh/nodepool": np_obj.name},
                         "finalizers": ["karpenter.sh/termination"]},
            "spec": {"nodeClassRef": tspec.get("nodeClassRef") or {}, "requirements": tspec.get("requirements") or []},
            "status": {"nodeName": name, "providerID": provider}})
        # kubernetes-sigs/karpenter pkg/controllers/nodeclaim/lifecycle/registration.go: the node is owned by
        # its NodeClaim (blockOwnerDeletion).
        node.meta["ownerReferences"] = [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": claim,
                                         "uid": claim_obj.meta.get("uid", ""), "blockOwnerDeletion": True}]
        node.invalidate()
        return node

    def delete_nodeclaim(self, name: str) -> KObj | None:
        """A NodeClaim was deleted: Karpenter's termination controller takes its node and VM away.

        kubernetes-sigs/karpenter pkg/controllers/node/termination (the ``karpenter.sh/termination``
        finalizer): the claim gets its deletionTimestamp, the node is tainted ``karpenter.sh/disrupted``
        (NoSchedule) and drained, the instance deleted, then the node and, last, the claim. The drain is
        not modelled (the steward has drained already; pods still there go with the node); the whole
        termination takes ``nap_terminate_s``. A pending pod then gets a new node as usual.
        """
        claim = self.get("nodeclaims.karpenter.sh", "", name)
        if claim is None:
            return None
        if claim.meta.get("deletionTimestamp"):
            return claim  # already terminating: deleting again changes nothing
        claim.meta["deletionTimestamp"] = iso(self.fleet.now())
        self.touch(claim)
        node_name = str((claim.obj.get("status") or {}).get("nodeName") or "")
        node = self.nodes.get(node_name)
        if node is not None:
            taints = [t for t in node.obj["spec"].get("taints") or [] if t.get("key") != "karpenter.sh/disrupted"]
            node.obj["spec"]["taints"] = [*taints, {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
            node.meta["deletionTimestamp"] = iso(self.fleet.now())
            self.touch(node)
        uid = claim.meta.get("uid")

        def terminated() -> None:
            current = self.get("nodeclaims.karpenter.sh", "", name)
            if current is None or current.meta.get("uid") != uid:
                return
            if node_name in self.nodes:
                self.delete_node(node_name, cause="nodeclaim_deleted")
            gone = self.store["nodeclaims.karpenter.sh"].pop(("", name), None)
            if gone is not None:
                self.dirty = True
                self.log_change(gone, "DELETED")

        self.fleet.after(self.fleet.timings.get("nap_terminate_s", 10.0), terminated)
        return claim

    # ---- summaries
    def register_node(self, obj: dict[str, Any]) -> Node:
        """A Node created through the API (a kubelet registering, or a cluster admin), not by a pool.

        The API server stores a Node as it is posted, status included (kubernetes/kubernetes
        pkg/registry/core/node/strategy.go ``PrepareForCreate``: "Nodes allow *all* fields, including
        status, to be set on create"), so its labels, ``spec.providerID`` and conditions are whatever the
        poster wrote. No VM backs it: it belongs to no pool here (``pool=""``), is no machine of any
        agent pool (``machines``), and no VMSS instance (``node_by_vmss_instance``) is it; ARM keeps
        describing only the VMs it made. Not modelled: the node lifecycle controller marking it
        ``Unknown`` once no kubelet renews its lease (node-monitor-grace-period, 40-50 s), so a forged
        node here stays as Ready as it was posted (harder on the app, not easier).
        """
        with self.fleet.lock:
            meta = obj.setdefault("metadata", {})
            now = iso(self.fleet.now())
            meta.update(uid=self.fleet.new_uid(), resourceVersion=self.next_rv(), creationTimestamp=now)
            meta.setdefault("labels", {})
            meta.setdefault("annotations", {})
            obj.update(kind="Node", apiVersion="v1")
            obj.setdefault("spec", {})
            status = obj.setdefault("status", {})
            status.setdefault("conditions", [])
            status.setdefault("allocatable", {})
            status.setdefault("capacity", {})
            info = status.setdefault("nodeInfo", {})
            for key in ("machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
                        "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture"):
                info.setdefault(key, "")  # NodeSystemInfo's fields have no omitempty: "" when not posted
            node = Node(obj, pool="", instance_id=-1, vmss="")
            ready = node.condition("Ready")
            node.ready = bool(ready and ready.get("status") == "True")
            self.nodes[node.name] = node
            self.pods_by_node.setdefault(node.name, set())
            self.log_change(node, "ADDED")
            self.dirty = True
            self.fleet.oracles.node_changed(self, node)
            return node

    def summary(self) -> dict[str, Any]:
        pools = []
        for pname in sorted(self.pools):
            p = self.pools[pname]
            pools.append({"name": pname, "vmSize": p.properties.get("vmSize"), "count": p.properties.get("count"),
                          "provisioningState": p.provisioning_state, "managed_gpu": p.managed_gpu,
                          "nodes": [n.name for n in self.pool_nodes(p)]})
        nodes = []
        for name in sorted(self.nodes):
            n = self.nodes[name]
            bad = sorted(c["type"] for c in n.obj["status"]["conditions"]
                         if c["type"] in NPD_GPU_CONDITIONS and c["status"] == "True")
            nodes.append({"name": name, "pool": n.pool, "ready": n.ready, "unschedulable": n.unschedulable,
                          "unhealthy": bad, "pods": len(self.pods_by_node.get(name, ())),
                          "gpu": n.obj["status"]["allocatable"].get("nvidia.com/gpu", "0")})
        pods = [{"namespace": p.namespace, "name": p.name, "node": p.node_name, "phase": p.phase,
                 "terminating": p.terminating} for p in self.items("pods")]
        return {"id": self.id, "name": self.name, "tags": dict(self.tags), "node_provisioning_mode":
                self.node_provisioning_mode, "pools": pools, "nodes": nodes, "pods": pods}


# --------------------------------------------------------------------------- placement


_DS_TOLERATIONS = [
    {"key": k, "operator": "Exists", "effect": e} for k, e in (
        ("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"), ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule"),
        ("node.kubernetes.io/not-ready", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoSchedule"))]


def _tolerates(tolerations: list[dict[str, Any]], taints: list[dict[str, Any]]) -> bool:
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        ok = False
        for tol in tolerations:
            if tol.get("effect") and tol.get("effect") != taint.get("effect"):
                continue
            op = tol.get("operator", "Equal")
            wildcard = not tol.get("key") and op == "Exists"
            same_key = tol.get("key") == taint.get("key") and (
                op == "Exists" or str(tol.get("value", "")) == str(taint.get("value", "")))
            ok = wildcard or same_key
            if ok:
                break
        if not ok:
            return False
    return True


def _fits_placement(spec: dict[str, Any], node: Node, tolerations: list[dict[str, Any]], *,
                    ignore_ready: bool = False) -> bool:
    taints = node.obj["spec"].get("taints") or []
    if ignore_ready:
        taints = [t for t in taints if not str(t.get("key", "")).startswith("node.kubernetes.io/")]
    if not _tolerates(tolerations, taints):
        return False
    labels = node.labels
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if terms:
        ok = False
        for term in terms:
            reqs = [(e.get("key", ""), e.get("operator", "In"), tuple(e.get("values") or ()))
                    for e in term.get("matchExpressions") or []]
            fields = term.get("matchFields") or []
            if any(f.get("key") == "metadata.name" and node.name not in (f.get("values") or []) for f in fields):
                continue
            if match_requirements(labels, reqs):
                ok = True
                break
        if not ok:
            return False
    return True


def _pod_ready(pod: Pod) -> bool:
    if pod.terminating or pod.phase != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.obj["status"].get("conditions") or [])


def _int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = float(value[:-1])
        exact = pct * total / 100.0
        return int(-(-exact // 1)) if round_up else int(exact)
    return int(value)


def _rs_hash(h: str) -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = int(h[:16], 16)
    out = ""
    for _ in range(10):
        n, r = divmod(n, len(alphabet))
        out += alphabet[r]
    return out


def _parse_taint(text: str | dict[str, Any]) -> dict[str, Any]:
    """ARM's ``key=value:Effect`` taint string as a Kubernetes taint."""
    if isinstance(text, dict):
        return dict(text)
    kv, _, effect = str(text).partition(":")
    key, _, value = kv.partition("=")
    out = {"key": key, "effect": effect or "NoSchedule"}
    if value:
        out["value"] = value
    return out


def _cond(type_: str, status: str, now: float, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "lastHeartbeatTime": iso(now), "lastTransitionTime": iso(now),
            "reason": reason, "message": message}


def _nap_size_labels(size: Any) -> dict[str, str]:
    name = str(size.name)
    m = re.match(r"Standard_([A-Z]+)", name)
    family = (m.group(1)[0] if m else "D")
    labels = {"node.kubernetes.io/instance-type": name, "karpenter.azure.com/sku-name": name,
              "karpenter.azure.com/sku-family": family, "karpenter.azure.com/sku-cpu": str(size.vcpus),
              "karpenter.sh/capacity-type": "on-demand", "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}
    if getattr(size, "nvidia", False):
        labels["karpenter.azure.com/sku-gpu-manufacturer"] = "nvidia"
        labels["karpenter.azure.com/sku-gpu-name"] = str(getattr(size, "gpu_model", "") or "")
        labels["karpenter.azure.com/sku-gpu-count"] = str(getattr(size, "gpus", 0))
    return labels


_BASE_IMAGES = [
    ("mcr.microsoft.com/oss/kubernetes/kube-proxy", "v1.32.4-hotfix.20260105", 31_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/azuredisk-csi", "v1.31.5", 82_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/azurefile-csi", "v1.31.3", 78_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/csi-node-driver-registrar", "v2.12.0", 10_000_000),
    ("mcr.microsoft.com/oss/kubernetes-csi/livenessprobe", "v2.14.0", 9_000_000),
    ("mcr.microsoft.com/containernetworking/azure-cns", "v1.6.21", 120_000_000),
    ("mcr.microsoft.com/containernetworking/azure-ip-masq-agent", "v0.1.15", 25_000_000),
    ("mcr.microsoft.com/containernetworking/cilium/cilium", "v1.16.6-250129", 230_000_000),
    ("mcr.microsoft.com/oss/kubernetes/pause", "3.6", 300_000),
    ("mcr.microsoft.com/oss/kubernetes/node-problem-detector", "v0.8.20", 40_000_000),
    ("mcr.microsoft.com/azuremonitor/containerinsights/ciprod", "3.1.24", 180_000_000),
    ("mcr.microsoft.com/oss/v2/kubernetes/coredns", "v1.11.3-8", 20_000_000),
]
_GPU_IMAGES = [
    ("mcr.microsoft.com/oss/nvidia/k8s-device-plugin", "v0.17.0", 150_000_000),
    ("nvcr.io/nvidia/k8s/dcgm-exporter", "4.1.1-4.0.4-ubuntu22.04", 420_000_000),
]


_IMAGES_CACHE: dict[bool, list[dict[str, Any]]] = {}


def _node_images(gpu: bool) -> list[dict[str, Any]]:
    """The image list of a node (one shared, never mutated list per kind: 100k nodes fit in memory)."""
    if gpu in _IMAGES_CACHE:
        return _IMAGES_CACHE[gpu]
    images = []
    for repo, tag, size in _BASE_IMAGES + (_GPU_IMAGES if gpu else []):
        digest = hashlib.sha256(f"{repo}:{tag}".encode()).hexdigest()
        images.append({"names": [f"{repo}@sha256:{digest}", f"{repo}:{tag}"], "sizeBytes": size})
    _IMAGES_CACHE[gpu] = images
    return images


def _unique_taints(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Taints unique by (key, effect), the first of each kept (an API server refuses duplicates)."""
    seen: set[tuple[Any, Any]] = set()
    out = []
    for t in taints:
        k = (t.get("key"), t.get("effect"))
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out

"""The stored Kubernetes objects (:class:`KObj`, :class:`Node`, :class:`Pod`), the agent pool record
and the small helpers every part of the model shares: RFC 3339 stamps, quantities, owner references.

The objects are plain JSON dicts with their serialisation cached, so that a list of 100k nodes is
served from bytes (sim/kube/reads.py) and only a changed object is encoded again.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

MANAGED_GPU_TAG = "EnableManagedGPUExperience"

# The repairs of a node, weakest first: a fault ``fixed_by`` a rung is fixed by it and by every stronger one
# (sim/kube/nodes.py repairs; sim/kube/gpu_faults.py finds a lost GPU again after its rung).
REPAIR_RUNGS = ("restart", "reimage", "replace", "never")

ENCODER = msgspec.json.Encoder()


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


def never_ready(obj: dict[str, Any]) -> bool:
    """A pod whose readiness probe can never pass (``exec: [false]``): it runs but never turns Ready,
    as a pod in CrashLoopBackOff or failing its probe does (scenario workloads with ``ready: false``)."""
    for c in (obj.get("spec") or {}).get("containers") or []:
        cmd = ((c.get("readinessProbe") or {}).get("exec") or {}).get("command") or []
        if list(cmd) in (["false"], ["/bin/false"]):
            return True
    return False


_OMITEMPTY_META = ("labels", "annotations", "finalizers", "ownerReferences")


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
        """The object as the API server serialises it: ObjectMeta's maps and lists are ``omitempty``, so
        an empty ``labels``, ``annotations``, ``finalizers`` or ``ownerReferences`` is not written
        (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go; checked against kube-apiserver
        v1.37.2 in tests/realkube, story bare_node_create)."""
        if self._raw is None:
            meta = self.obj.get("metadata")
            if isinstance(meta, dict) and any(k in meta and not meta[k] for k in _OMITEMPTY_META):
                shown = {**self.obj, "metadata": {k: v for k, v in meta.items()
                                                  if not (k in _OMITEMPTY_META and not v)}}
                self._raw = ENCODER.encode(shown)
            else:
                self._raw = ENCODER.encode(self.obj)
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


def pod_ready(pod: Pod) -> bool:
    """Running, not deleting, and its Ready condition True: healthy for controllers and PDBs."""
    if pod.terminating or pod.phase != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.obj["status"].get("conditions") or [])

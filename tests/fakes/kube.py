"""KubePort in memory: one cluster's nodes, pods, evictions under disruption budgets, events, leases and objects.

The store holds the same frozen views the adapter decodes (NodeView, PodView); nodes are listed by name, as
etcd returns their keys, pods in the order they were made. What the fake adds over a dict is what the API
server and the kubelet do on their own: a node registers NotReady and without its device plugin's
extended resources until it is Ready (``boot``); an eviction is admitted against the pod's budget one at a
time (kubernetes pkg/registry/core/pod/storage/eviction.go); a deleted pod lingers as terminating when
``evict_terminates``; a node's deletion takes its pods with it (the ``killed`` oracle).

A scenario's own model (a scheduler, controllers, long-running ARM operations) runs through ``observers``:
callables run before each read, so the world moves on when the code under test looks at it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec

from shared.kernel.clock import ManualClock
from shared.kernel.errors import Conflict, NotFound
from shared.kernel.ports import Condition, EvictionResult, NodeView, PodView, Taint
from tests.fakes.faults import Faults
from tests.fakes.objects import ObjectStore

PDB_REFUSAL = "Cannot evict pod as it would violate the pod's disruption budget."


def matches(labels: Mapping[str, str], selector: str) -> bool:
    """Equality-based label selector (``a=b,c=d``), the only form the app sends."""
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def with_condition(node: NodeView, type_: str, status: str, at: float | None) -> NodeView:
    """``node`` with condition ``type_`` set (replacing any previous one of that type)."""
    others = tuple(c for c in node.conditions if c.type != type_)
    return msgspec.structs.replace(node, conditions=(*others, Condition(type=type_, status=status, transition=at)))


class FakeKube(ObjectStore):
    """One cluster's Kubernetes API. ``writes`` lists every mutating call in order, ``events`` every Event."""

    def __init__(self, clock: ManualClock, *, faults: Faults | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.faults = faults or Faults()
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[str, PodView] = {}  # uid -> pod
        self.ready_at: dict[str, float] = {}  # node -> when it turns Ready (see boot)
        self.writes: list[tuple[Any, ...]] = []
        self.events: list[dict[str, Any]] = []
        self.leases: dict[str, tuple[str, float]] = {}  # name -> (holder, expiry), in the app's one namespace
        self.pdb_blocked: set[str] = set()  # "ns/name" whose eviction a PDB refuses, whatever the count
        self.pdbs: dict[str, int] = {}  # app label -> minAvailable of the PDB selecting app=<label>
        self.evict_terminates = False  # evicted pods linger as terminating (finish_terminating, or a model)
        self.killed: list[str] = []  # "ns/name" of pods removed with their node rather than evicted
        self.pdb_violations: list[str] = []  # "ns/name" whose granted eviction left its budget short
        self.list_calls = 0
        self.list_selectors: list[str] = []
        self.observers: list[Callable[[], None]] = []
        self._rv = itertools.count(2)
        self._admission = threading.Lock()

    def _observe(self) -> None:
        for observer in self.observers:
            observer()

    # ------------------------------------------------------------------ building the cluster

    def add(self, *nodes: NodeView) -> None:
        for n in nodes:
            self.nodes[n.name] = n

    def boot(self, node: NodeView, *, ready_at: float) -> None:
        """Register ``node`` as it will be once Ready; until ``ready_at`` it reads NotReady, without the
        extended resources (``nvidia.com/gpu``) a device plugin advertises only on a running node."""
        self.nodes[node.name] = node
        self.ready_at[node.name] = ready_at

    def remove_node(self, name: str) -> None:
        """The node and its VM are gone: its pods go with it (``killed``, DaemonSet pods excepted)."""
        self.nodes.pop(name, None)
        self.ready_at.pop(name, None)
        for uid, pod in list(self.pods.items()):
            if pod.node_name == name:
                controller = pod.controller()
                if controller is None or controller.kind != "DaemonSet":
                    self.killed.append(f"{pod.namespace}/{pod.name}")
                del self.pods[uid]

    def add_pods(self, *pods: PodView) -> None:
        for p in pods:
            self.pods[p.uid] = p

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        """A test's look at one pod (not a port method: the app lists pods, it never gets one)."""
        return next((p for p in self.pods.values() if p.namespace == namespace and p.name == name), None)

    def finish_terminating(self) -> None:
        """Every terminating pod's grace period is over: the kubelet removes them."""
        for uid in [u for u, p in self.pods.items() if p.deletion_timestamp is not None]:
            del self.pods[uid]

    def set_condition(self, name: str, type_: str, status: str, *, at: float | None = None) -> None:
        self.nodes[name] = with_condition(self.nodes[name], type_, status, self.clock.now() if at is None else at)

    def healthy(self, app: str) -> int:
        """Pods of ``app`` that count for its budget: bound, Running and not terminating."""
        return sum(1 for p in self.pods.values() if p.labels.get("app") == app and p.node_name
                   and p.phase == "Running" and p.deletion_timestamp is None)

    # ------------------------------------------------------------------ nodes

    def _view(self, node: NodeView) -> NodeView:
        ready_at = self.ready_at.get(node.name)
        if ready_at is None or self.clock.now() >= ready_at:
            return node
        allocatable = {k: v for k, v in node.allocatable.items() if "/" not in k}
        return msgspec.structs.replace(with_condition(node, "Ready", "False", ready_at), allocatable=allocatable,
                                       capacity=allocatable)

    def list_nodes(self, *, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]:
        self.faults.check("list_nodes")
        self._observe()
        self.list_calls += 1
        self.list_selectors.append(label_selector)
        return iter([self._view(n) for _, n in sorted(self.nodes.items()) if matches(n.labels, label_selector)])

    def get_node(self, name: str) -> NodeView | None:
        self.faults.check("get_node")
        node = self.nodes.get(name)
        return None if node is None else self._view(node)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        """Strategic merge of labels, annotations (None deletes), ``spec.unschedulable`` and ``spec.taints``
        (replaced whole, as the strategic merge patch of a Node does); a stale ``resourceVersion`` is a 409."""
        self.faults.check("patch_node")
        node = self.nodes.get(name)
        if node is None:
            raise NotFound(name)
        meta = patch.get("metadata") or {}
        if meta.get("resourceVersion") and meta["resourceVersion"] != node.resource_version:
            raise Conflict(f"node {name} changed")
        labels, annotations = dict(node.labels), dict(node.annotations)
        for target, changes in ((labels, meta.get("labels") or {}), (annotations, meta.get("annotations") or {})):
            for k, v in changes.items():
                if v is None:
                    target.pop(k, None)
                else:
                    target[k] = v
        spec = patch.get("spec") or {}
        taints = node.taints if "taints" not in spec else tuple(
            Taint(key=t["key"], effect=t["effect"], value=t.get("value", "")) for t in spec["taints"] or ())
        self.writes.append(("patch_node", name, patch))
        self.nodes[name] = msgspec.structs.replace(
            node, labels=labels, annotations=annotations, unschedulable=bool(spec.get("unschedulable", node.unschedulable)),
            taints=taints, resource_version=str(next(self._rv)))
        self._observe()
        return self._view(self.nodes[name])

    # ------------------------------------------------------------------ pods and evictions

    def list_pods(self, *, node_name: str | None = None, namespace: str | None = None,
                  label_selector: str = "") -> list[PodView]:
        self.faults.check("list_pods")
        self._observe()
        return [p for p in self.pods.values() if (node_name is None or p.node_name == node_name)
                and (namespace is None or p.namespace == namespace) and matches(p.labels, label_selector)]

    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        self.writes.append(("evict", namespace, name))
        self.faults.check("evict")
        with self._admission:  # the API server admits evictions against a budget one at a time
            return self._evict(namespace, name)

    def _evict(self, namespace: str, name: str) -> EvictionResult:
        pod = self.get_pod(namespace, name)
        if pod is None:
            return EvictionResult(outcome="gone")
        if pod.deletion_timestamp is not None:
            return EvictionResult(outcome="evicted")  # already going: the budget is not asked again
        key, app = f"{namespace}/{name}", pod.labels.get("app", "")
        minimum = self.pdbs.get(app)
        if key in self.pdb_blocked or (minimum is not None and self.healthy(app) - 1 < minimum):
            return EvictionResult(outcome="blocked", message=PDB_REFUSAL)
        if self.evict_terminates:
            self.pods[pod.uid] = msgspec.structs.replace(pod, deletion_timestamp=self.clock.now())
        else:
            del self.pods[pod.uid]
        if minimum is not None and self.healthy(app) < minimum:
            self.pdb_violations.append(key)
        return EvictionResult(outcome="evicted")

    def list_pdbs(self, namespace: str | None = None) -> list[Mapping[str, Any]]:
        return [{"metadata": {"name": app, "namespace": namespace or "default"},
                 "spec": {"minAvailable": minimum, "selector": {"matchLabels": {"app": app}}}}
                for app, minimum in sorted(self.pdbs.items())]

    # ------------------------------------------------------------------ events and leases

    def create_event(self, *, node: NodeView | str, reason: str, message: str, type_: str = "Normal",
                     action: str = "", correlation_id: str = "") -> None:
        self.writes.append(("event", reason))
        self.events.append({"node": node if isinstance(node, str) else node.name, "reason": reason,
                            "message": message, "type": type_})

    def acquire_lease(self, name: str, *, holder: str, duration_s: int, namespace: str | None = None) -> bool:
        current, now = self.leases.get(name), self.clock.now()
        if current is not None and current[0] != holder and current[1] > now:
            return False
        self.writes.append(("lease", name, holder))
        self.leases[name] = (holder, now + duration_s)
        return True

    def release_lease(self, name: str, *, holder: str, namespace: str | None = None) -> None:
        if self.leases.get(name, ("",))[0] == holder:
            self.writes.append(("release_lease", name))
            del self.leases[name]

    # ------------------------------------------------------------------ objects (tests/fakes/objects.py)

    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.faults.check("create_object")
        self.writes.append(("create_object", obj))
        return self.store_new(obj)

    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.faults.check("apply_object")
        self.writes.append(("apply_object", obj))
        return self.store_applied(obj)

    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        self.faults.check("get_object")
        return self.stored(api_version, kind, name, namespace)

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        self.faults.check("delete_object")
        self.writes.append(("delete_object", kind, name))
        self.remove(api_version, kind, name, namespace, uid=uid)

    def delete_nodeclaim(self, *, node_name: str, provider_id: str) -> str | None:
        """Delete the Karpenter NodeClaim whose ``status.nodeName`` or ``status.providerID`` is the node's
        (Karpenter then drains and deletes the node); its name, or None when no claim backs the node."""
        self.faults.check("delete_nodeclaim")
        for (api_version, kind, namespace, name), obj in list(self.objects.items()):
            status = obj.get("status") or {}
            if kind == "NodeClaim" and (status.get("nodeName") == node_name
                                        or (provider_id and status.get("providerID") == provider_id)):
                self.writes.append(("delete_object", kind, name))
                self.remove(api_version, kind, name, namespace or None)
                return name
        return None


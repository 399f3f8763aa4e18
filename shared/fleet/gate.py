"""The write gate: every write the app makes re-checks, at the point of the call, that it may.

The steward's identity can restart, reimage and delete GPU machines and pools across many clusters,
so checking the fleet scope only where a client is built (``shared.wiring``) is not enough: a client
built while a cluster was in scope stays cached after it leaves, a ledger row can name any cluster,
and an ARM id taken from a node can name a VM of another cluster. The gate wraps the adapters the
core is handed (:class:`GatedAks`, :class:`GatedCompute`, :class:`GatedKube`, installed by
:class:`shared.wiring.FleetAccess`) and, right before each write, checks:

- the target cluster is in the fleet scope (``shared.fleet.scope``: FLEET_SUBSCRIPTIONS, then the list
  FLEET_CLUSTERS or the tag FLEET_CLUSTER_TAG), read from ARM: :class:`OutOfScope`;
- the app is not paused (STEWARD_PAUSED) and the cluster does not carry ``gpu-fleet-steward/paused=true``:
  :class:`Paused`;
- a VM to restart or reimage sits in the subscription and node resource group of an in-scope cluster
  (the one named by the caller, when it names one): :class:`ForeignVm`.

Each refusal is raised before any request leaves the process. Reads pass through unchanged (the
sweep, planning and ``fleetctl status`` observe everything in scope, paused or not).

The cluster read is cached for :data:`CLUSTER_CACHE_S` (30 s) per cluster. That bounds the cost (a
drain step issues tens of evictions and a sweep touches every cluster; each would otherwise read the
cluster from ARM again) to one ``managedClusters`` GET per cluster per 30 s, and bounds the delay
with which a new pause tag, a removed scope tag or a moved node resource group takes effect to 30 s:
shorter than the gap between two reconciler steps of one record (the 5-minute RECONCILE_SCHEDULE
plus the delayed nudges of shared/kernel/nudge.py), so at most the step already running when an operator
pauses a cluster completes its writes. STEWARD_PAUSED needs no read and applies at once.
The node resource group of a cluster cannot change after creation (AKS: ``nodeResourceGroup`` is
immutable), so caching it is exact. A cluster ARM will not show us (403) is refused, never assumed.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shared.fleet.scope import cluster_in_scope, paused_reason, subscription_of
from shared.kernel.errors import Forbidden, StewardError
from shared.kernel.ports import AksPort, ClusterInfo, ComputePort, EvictionResult, KubePort, NodeView

if TYPE_CHECKING:
    from shared.kernel.clock import Clock
    from shared.settings import Settings

log = logging.getLogger("steward.gate")

CLUSTER_CACHE_S = 30.0
"""How long a cluster's ARM description (tags, node resource group) is trusted by the gate."""
PAUSED_RETRY_S = 60.0
"""The back-off hint a :class:`Paused` refusal carries (the reconciler honours ``retry_after``)."""

_VM_ID = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/",
                    re.IGNORECASE)
_READ_PREFIXES = ("list_", "get_", "read_", "watch_")
"""Methods passed through without a check: reads by name. Any other method the wrapped adapter has and
the wrapper does not declare (a write added later, a helper) is refused, never silently let through."""
_PASSED = frozenset({"close", "kubeconfig"})


class OutOfScope(Forbidden):
    """A write to a cluster outside the fleet scope (or one ARM will not show us)."""


class ForeignVm(Forbidden):
    """A VM action on a VM outside the node resource group and subscription of the cluster it is for."""


class Paused(StewardError):
    """A write while the app (STEWARD_PAUSED) or the cluster (tag ``gpu-fleet-steward/paused``) is paused.

    Not a Forbidden: a pause holds work where it is (the reconciler backs off and looks again, it never
    gives up on the record), it is not a refusal of the work itself."""

    def __init__(self, message: str, *, retry_after: float | None = PAUSED_RETRY_S) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def vm_location(vm_resource_id: str) -> tuple[str, str]:
    """``(subscription, resource group)`` of a Compute resource id, lower-cased; ForeignVm if it is not one."""
    match = _VM_ID.match(vm_resource_id.strip())
    if not match:
        raise ForeignVm(f"not a Compute resource id: {vm_resource_id!r}: refused")
    return match["sub"].lower(), match["rg"].lower()


class Gate:
    """The checks; one per process (held by FleetAccess), thread-safe, with the bounded cluster cache."""

    def __init__(self, settings: Settings, *, aks: Callable[[], AksPort], clock: Clock | None = None,
                 cache_s: float = CLUSTER_CACHE_S) -> None:
        self._settings = settings
        self._aks = aks  # the ungated adapter: the gate's own reads
        self._clock = clock
        self._cache_s = cache_s
        self._clusters: dict[str, tuple[float, ClusterInfo | None, str]] = {}
        self._lock = threading.Lock()

    def _now(self) -> float:
        from shared.kernel import clock as clocks

        return (self._clock or clocks.current()).now()

    # -- reads the checks need

    def _refusal_without_arm(self, cluster_id: str) -> str:
        """Why the settings alone refuse ``cluster_id`` ("" = ARM must be asked)."""
        subscriptions = {s.lower() for s in self._settings.subscriptions}
        if subscription_of(cluster_id) not in subscriptions:
            return "its subscription is not in FLEET_SUBSCRIPTIONS"
        listed = {c.lower() for c in self._settings.cluster_ids}
        if listed and cluster_id.lower() not in listed:
            return "it is not listed in FLEET_CLUSTERS"
        return ""

    def cluster(self, cluster_id: str) -> ClusterInfo:
        """The in-scope cluster as ARM described it at most :data:`CLUSTER_CACHE_S` ago; OutOfScope otherwise."""
        key = cluster_id.lower()
        now = self._now()
        with self._lock:
            hit = self._clusters.get(key)
        if hit is None or now - hit[0] > self._cache_s:
            info: ClusterInfo | None = None
            why = self._refusal_without_arm(cluster_id)
            if not why:
                try:
                    info = self._aks().get_cluster(cluster_id)
                except Forbidden as error:
                    why = f"ARM will not show it to us ({error})"
                else:
                    ok, reason = cluster_in_scope(info, self._settings)
                    if not ok:
                        info, why = None, reason
            hit = (now, info, why)
            with self._lock:
                self._clusters[key] = hit
        if hit[1] is None:
            raise OutOfScope(f"cluster {cluster_id} is outside the fleet scope: {hit[2]}")
        return hit[1]

    # -- the checks

    def check_write(self, cluster_id: str, *, what: str) -> ClusterInfo:
        """Raise Paused / OutOfScope unless ``what`` may be written to ``cluster_id`` now."""
        if getattr(self._settings, "paused", False):
            raise Paused(f"{what}: refused, the app is paused (STEWARD_PAUSED=true)")
        try:
            info = self.cluster(cluster_id)
        except OutOfScope as error:
            raise OutOfScope(f"{what}: refused: {error}") from None
        why = paused_reason(info.tags)
        if why:
            raise Paused(f"{what}: refused, {why}")
        return info

    def check_vm(self, vm_resource_id: str, *, cluster_id: str | None, what: str) -> ClusterInfo:
        """The cluster whose node resource group holds the VM, once the write is allowed there.

        With ``cluster_id``, the VM must sit in that cluster's own subscription and node resource group;
        without it, in those of a cluster in scope (a VM of no cluster in scope is refused)."""
        if getattr(self._settings, "paused", False):
            raise Paused(f"{what}: refused, the app is paused (STEWARD_PAUSED=true)")
        sub, rg = vm_location(vm_resource_id)
        if cluster_id:
            info = self.check_write(cluster_id, what=what)
            if sub != info.subscription.lower() or rg != (info.node_resource_group or "").lower():
                raise ForeignVm(f"{what}: refused: the VM is in {sub}/{rg}, not in the node resource group "
                                f"{info.subscription}/{info.node_resource_group} of {info.id}")
            return info
        if sub not in {s.lower() for s in self._settings.subscriptions}:
            raise ForeignVm(f"{what}: refused: the VM's subscription {sub} is not in FLEET_SUBSCRIPTIONS")
        owner = self._owner(sub, rg, refresh=False) or self._owner(sub, rg, refresh=True)
        if owner is None:
            raise ForeignVm(f"{what}: refused: {sub}/{rg} is the node resource group of no cluster in the fleet scope")
        return self.check_write(owner.id, what=what)

    def _owner(self, sub: str, rg: str, *, refresh: bool) -> ClusterInfo | None:
        """The in-scope cluster whose node resource group is ``sub``/``rg`` (cached, or discovered anew)."""
        now = self._now()
        if refresh:
            from shared.fleet.scope import discover

            found = discover(self._aks(), self._settings)
            with self._lock:
                for info in found:
                    self._clusters[info.id.lower()] = (now, info, "")
            candidates = found
        else:
            with self._lock:
                candidates = [h[1] for h in self._clusters.values() if h[1] is not None and now - h[0] <= self._cache_s]
        for info in candidates:
            if info.subscription.lower() == sub and (info.node_resource_group or "").lower() == rg:
                return info
        return None


class _Delegating:
    """Reads (by name) and plain attributes pass through; any other method is refused (an allow-list:
    a write the wrapper does not declare can never bypass the gate)."""

    _inner: Any

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        value = getattr(self._inner, name)
        # Private members (``_client``: the SDK client under an adapter) are the adapter's implementation, used
        # by tests to look beneath it, never by the core, which only speaks the ports (shared/kernel/ports.py).
        if callable(value) and not (name.startswith(_READ_PREFIXES) or name in _PASSED or name.startswith("_")):
            raise AttributeError(f"{type(self._inner).__name__}.{name} is not a declared read or gated write: "
                                 "refused by shared.fleet.gate")
        return value


class GatedAks(_Delegating):
    """AksPort: pool PUT/DELETE and deleteMachines pass the gate; reads pass through."""

    def __init__(self, inner: AksPort, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    # reads (list_clusters, get_cluster, list_pools, get_pool, list_machines, kubeconfig...) pass through

    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], **kwargs: Any) -> None:
        self._gate.check_write(cluster_id, what=f"PUT pool {pool}")
        self._inner.begin_put_pool(cluster_id, pool, body, **kwargs)

    def begin_delete_pool(self, cluster_id: str, pool: str, **kwargs: Any) -> None:
        self._gate.check_write(cluster_id, what=f"DELETE pool {pool}")
        self._inner.begin_delete_pool(cluster_id, pool, **kwargs)

    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Sequence[str]) -> None:
        self._gate.check_write(cluster_id, what=f"deleteMachines {', '.join(machines)} of pool {pool}")
        self._inner.begin_delete_machines(cluster_id, pool, machines)


class GatedCompute(_Delegating):
    """ComputePort: a VM restart or reimage passes the gate (scope, pause, the VM's node resource group).

    ``cluster_id``, when the caller passes it, names the cluster the VM must belong to; it is not
    passed on to the adapter."""

    def __init__(self, inner: ComputePort, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def begin_restart(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        self._gate.check_vm(vm_resource_id, cluster_id=cluster_id, what=f"restart {vm_resource_id}")
        self._inner.begin_restart(vm_resource_id)

    def begin_reimage(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        self._gate.check_vm(vm_resource_id, cluster_id=cluster_id, what=f"reimage {vm_resource_id}")
        self._inner.begin_reimage(vm_resource_id)


class GatedKube(_Delegating):
    """KubePort of one cluster: node patches, evictions, objects, leases and events pass the gate.

    ``create_event`` keeps its contract (best effort, never raises): refused, it is logged and dropped.
    """

    def __init__(self, inner: KubePort, gate: Gate, cluster_id: str) -> None:
        self._inner = inner
        self._gate = gate
        self._cluster_id = cluster_id

    def _check(self, what: str) -> None:
        self._gate.check_write(self._cluster_id, what=f"{what} in {self._cluster_id}")

    # reads (list_nodes, get_node, list_pods, list_pdbs, get_object...) pass through

    # writes
    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        self._check(f"patch node {name}")
        return self._inner.patch_node(name, patch)

    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        self._check(f"evict pod {namespace}/{name}")
        return self._inner.evict(namespace, name, grace_period_seconds=grace_period_seconds)

    def create_event(self, *, node: NodeView | str, reason: str, message: str, type_: str = "Normal",
                     action: str = "", correlation_id: str = "") -> None:
        name = node if isinstance(node, str) else node.name
        try:
            self._check(f"event {reason} on node {name}")
        except StewardError as error:  # events are auxiliary: a refused one is dropped, never raised
            log.info("Kubernetes event not written: %s", error)
            return
        self._inner.create_event(node=node, reason=reason, message=message, type_=type_, action=action,
                                 correlation_id=correlation_id)

    def acquire_lease(self, name: str, *, holder: str, duration_s: int, **kwargs: Any) -> bool:
        self._check(f"lease {name}")
        return self._inner.acquire_lease(name, holder=holder, duration_s=duration_s, **kwargs)

    def release_lease(self, name: str, *, holder: str, **kwargs: Any) -> None:
        self._check(f"release lease {name}")
        self._inner.release_lease(name, holder=holder, **kwargs)

    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check(f"create {obj.get('kind')} {(obj.get('metadata') or {}).get('name')}")
        return self._inner.create_object(obj)

    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check(f"apply {obj.get('kind')} {(obj.get('metadata') or {}).get('name')}")
        return self._inner.apply_object(obj)

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        self._check(f"delete {kind} {name}")
        self._inner.delete_object(api_version, kind, name, namespace, uid=uid)

    def delete_nodeclaim(self, *, node_name: str, provider_id: str) -> str | None:
        self._check(f"delete the NodeClaim of node {node_name}")
        return self._inner.delete_nodeclaim(node_name=node_name, provider_id=provider_id)


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` is one of the gate's refusals (for reports)."""
    return isinstance(error, (OutOfScope, ForeignVm, Paused))


__all__ = ["CLUSTER_CACHE_S", "ForeignVm", "Gate", "GatedAks", "GatedCompute", "GatedKube", "OutOfScope",
           "Paused", "is_refusal", "vm_location"]

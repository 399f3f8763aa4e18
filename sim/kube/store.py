"""The object store of a simulated cluster: resourceVersions, generic objects, and the change log that
watches read (sim/kube/reads.py serves lists, continue tokens and compaction from it).
"""

from __future__ import annotations

from typing import Any

from sim.kube.nap import NAP_RESOURCES
from sim.kube.objects import KObj, Node, iso

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
    # RBAC objects, which the simulated API servers authorize requests with (sim/kube/rbac.py)
    "clusterroles.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "ClusterRole", False),
    "clusterrolebindings.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", False),
    "roles.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "Role", True),
    "rolebindings.rbac.authorization.k8s.io": ("rbac.authorization.k8s.io", "v1", "RoleBinding", True),
}


class Store:
    """Part of :class:`sim.model.Cluster`: store, fetch and remove objects, stamp every change with a new
    resourceVersion and keep it for watchers and tombstones. State: ``store``, ``rv``, ``changes``,
    ``tombstones``, ``watchers`` (set up by ``Cluster.__init__``).
    """

    def resources(self) -> dict[str, tuple[str, str, str, bool]]:
        out = dict(RESOURCES)
        if self.node_provisioning_mode.lower() == "auto":
            out.update(NAP_RESOURCES)
        return out

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

    def _wake(self) -> None:
        """A timed callback with nothing to do but make the controllers run."""
        self.dirty = True

"""Namespaces and their deletion lifecycle: NamespaceLifecycle admission (nothing new in a terminating
namespace, immortal namespaces) and the namespace controller that empties and purges a deleted one.
"""

from __future__ import annotations

from sim.kube.errors import ApiError
from sim.kube.objects import KObj, iso

# NamespaceLifecycle's immortal namespaces (admission/plugin/namespace/lifecycle/admission.go Register)
IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")


def namespace_terminating_error(resource: str, namespace: str, name: str) -> Exception:
    """NamespaceLifecycle's answer to a create in a terminating namespace: ``admission.NewForbidden``
    (``<resource>[.<group>] "<name>" is forbidden: ...``) with the ``NamespaceTerminating`` cause.

    kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go,
    staging/src/k8s.io/apiserver/pkg/admission/errors.go (NewForbidden: the object's name, else "Unknown").
    ``resource`` is the store key (``pods``, ``deployments.apps``): plural then group, as GroupResource prints.
    """
    plural, _, group = resource.partition(".")
    name = name or "Unknown"
    return ApiError(403, "Forbidden",
                    f'{resource} "{name}" is forbidden: unable to create new content in namespace {namespace} '
                    "because it is being terminated",
                    {"name": name, "group": group, "kind": plural,
                     "causes": [{"reason": "NamespaceTerminating",
                                 "message": f"namespace {namespace} is being terminated",
                                 "field": "metadata.namespace"}]})


class Namespaces:
    """Part of :class:`sim.model.Cluster`: the namespace lifecycle. State: ``terminating_namespaces``,
    ``namespace_sync_due``.
    """

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
        immortal namespaces; a namespace already terminating is answered as it is (200).

        kubernetes/kubernetes pkg/registry/core/namespace/storage/storage.go (Delete) and
        staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go
        """
        if name in IMMORTAL_NAMESPACES:
            raise ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                           {"name": name, "kind": "namespaces"})
        ns = self.store["namespaces"].get(("", name))
        if ns is None:
            raise ApiError(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"})
        if ns.meta.get("deletionTimestamp") and ((ns.obj.get("spec") or {}).get("finalizers") or []):
            # Already terminating and its spec.finalizers not yet cleared: the namespace as it is, 200
            # ("prior to final deletion, we must ensure that finalizers is empty": return namespace, false, nil).
            # Checked against kube-apiserver v1.37.2 (tests/realkube, story terminating_namespace).
            return ns
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

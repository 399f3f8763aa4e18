"""The generic object calls of the KubePort adapter: sample Jobs and Karpenter objects.

Each method handles a fixed table of kinds (:data:`CREATE_KINDS`, :data:`APPLY_KINDS`, :data:`READ_KINDS`,
:data:`DELETE_KINDS`) and declares the grants for exactly those (``requires_kube_kinds``); any other kind is
refused before a request leaves (:meth:`KubeObjects._object_args`), so the declared rules are the calls.
Objects are created with the app's field manager and replaced with the ``resourceVersion`` read
(optimistic concurrency: kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from shared.adapters.kube.errors import call_kube, map_kube_error
from shared.adapters.kube.transport import FIELD_MANAGER, TIMEOUT, KubeTransport
from shared.adapters.permissions import kind_allowed, requires_kube, requires_kube_kinds
from shared.kernel.errors import Conflict, Invalid, NotFound, Transient

# (API group, kind) -> (plural, namespaced): the kinds create/apply/get/delete_object support.
# (API group, kind) -> (plural, namespaced): the kinds create/apply/get/delete_object support.
OBJECT_KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("batch", "Job"): ("jobs", True),
    ("karpenter.sh", "NodePool"): ("nodepools", False),
    ("karpenter.azure.com", "AKSNodeClass"): ("aksnodeclasses", False),
}


def _kinds(*keys: tuple[str, str]) -> dict[tuple[str, str], tuple[str, bool]]:
    return {key: OBJECT_KINDS[key] for key in keys}


_JOB, _NODEPOOL, _NODECLASS = ("batch", "Job"), ("karpenter.sh", "NodePool"), ("karpenter.azure.com", "AKSNodeClass")
# Which kinds each generic method handles: the app's calls, per kind (shared.pools: the sample Job is
# created, read and deleted; Karpenter objects are created (create-only), replaced only at a checked
# resourceVersion, read and, for a failed pool, deleted).
# Each method refuses every other kind, so its declared rules are exactly its calls.
CREATE_KINDS = _kinds(_JOB, _NODEPOOL, _NODECLASS)
APPLY_KINDS = _kinds(_NODEPOOL, _NODECLASS)
READ_KINDS = _kinds(_JOB, _NODEPOOL, _NODECLASS)
DELETE_KINDS = _kinds(_JOB, _NODEPOOL, _NODECLASS)


def _kind_of(api_version: str, kind: str) -> tuple[str, str, str, bool]:
    group, _, version = api_version.rpartition("/")
    try:
        plural, namespaced = OBJECT_KINDS[(group, kind)]
    except KeyError:
        supported = ", ".join(f"{g}/{k}" for g, k in OBJECT_KINDS)
        raise Invalid(f"unsupported object kind {api_version} {kind} (supported: {supported})") from None
    return group, version, plural, namespaced




class KubeObjects(KubeTransport):
    """Create, apply, read and delete the supported objects; delete Karpenter NodeClaims."""

    def _object_args(self, api_version: str, kind: str, namespace: str | None, *,
                     method: Callable[..., Any]) -> tuple[str, str, str, str | None]:
        """The call's (group, version, plural, namespace); a kind ``method`` did not declare (its
        ``requires_kube_kinds`` table) is refused here, before any request: the grants are per kind."""
        group, version, plural, namespaced = _kind_of(api_version, kind)
        if not kind_allowed(method, group, kind):
            raise Invalid(f"{method.__name__} does not handle {api_version} {kind}: the app declares (and is granted) "
                          "it for other kinds only")
        if namespaced and not namespace:
            namespace = self.namespace
        return group, version, plural, namespace if namespaced else None

    def _create(self, obj: Mapping[str, Any], *, method: Callable[..., Any]) -> Mapping[str, Any]:
        meta = obj.get("metadata") or {}
        group, version, plural, ns = self._object_args(str(obj.get("apiVersion", "")), str(obj.get("kind", "")),
                                                       meta.get("namespace"), method=method)
        body = dict(obj)
        if ns is not None:
            response = self._custom.create_namespaced_custom_object(
                group, version, ns, plural, body, field_manager=FIELD_MANAGER,
                _preload_content=False, _request_timeout=TIMEOUT)
        else:
            response = self._custom.create_cluster_custom_object(
                group, version, plural, body, field_manager=FIELD_MANAGER,
                _preload_content=False, _request_timeout=TIMEOUT)
        return dict(json.loads(self._body(response) or b"{}"))

    @requires_kube_kinds(CREATE_KINDS, "create")
    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create a sample Job, NodePool or AKSNodeClass; Conflict (409) when the name is taken: never a replace."""
        name = (obj.get("metadata") or {}).get("name", "")
        return self._run(lambda: self._create(obj, method=KubeObjects.create_object),
                         what=f"create {obj.get('kind')} {name}")

    @requires_kube_kinds(APPLY_KINDS, "get", "create", "update")
    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create or replace a Karpenter NodePool or AKSNodeClass (node auto-provisioning pools).

        With ``metadata.resourceVersion`` set, only that version is replaced (no read, no create): the caller
        read the object and checked it is its own, and an object changed or re-made since answers 409 (Conflict).
        """
        meta = dict(obj.get("metadata") or {})
        api_version, kind, name = str(obj.get("apiVersion", "")), str(obj.get("kind", "")), str(meta.get("name", ""))
        method = KubeObjects.apply_object
        group, version, plural, ns = self._object_args(api_version, kind, meta.get("namespace"), method=method)
        what = f"apply {kind} {name}"

        pinned = meta.get("resourceVersion")

        def once() -> Mapping[str, Any]:
            existing = {"metadata": {"resourceVersion": pinned}} if pinned else \
                self._get(api_version, kind, name, ns, method=method)
            if existing is None:
                try:
                    return self._create(obj, method=method)
                except Exception as error:
                    mapped = map_kube_error(error, what=what)
                    if not isinstance(mapped, Conflict):
                        raise
                    existing = self._get(api_version, kind, name, ns, method=method)
                    if existing is None:
                        raise Transient(f"{what}: created and deleted concurrently") from error
            body = dict(obj)
            body["metadata"] = {**meta, "resourceVersion": (existing.get("metadata") or {}).get("resourceVersion")}
            if ns is not None:
                response = self._custom.replace_namespaced_custom_object(
                    group, version, ns, plural, name, body, field_manager=FIELD_MANAGER,
                    _preload_content=False, _request_timeout=TIMEOUT)
            else:
                response = self._custom.replace_cluster_custom_object(
                    group, version, plural, name, body, field_manager=FIELD_MANAGER,
                    _preload_content=False, _request_timeout=TIMEOUT)
            return dict(json.loads(self._body(response) or b"{}"))

        return self._run(once, what=what)

    def _get(self, api_version: str, kind: str, name: str, namespace: str | None, *,
             method: Callable[..., Any]) -> Mapping[str, Any] | None:
        group, version, plural, ns = self._object_args(api_version, kind, namespace, method=method)
        try:
            if ns is not None:
                response = call_kube(lambda: self._custom.get_namespaced_custom_object(
                    group, version, ns, plural, name, _preload_content=False, _request_timeout=TIMEOUT),
                    what=f"get {kind} {name}")
            else:
                response = call_kube(lambda: self._custom.get_cluster_custom_object(
                    group, version, plural, name, _preload_content=False, _request_timeout=TIMEOUT),
                    what=f"get {kind} {name}")
        except NotFound:
            return None
        return dict(json.loads(self._body(response) or b"{}"))

    @requires_kube_kinds(READ_KINDS, "get")
    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        return self._run(lambda: self._get(api_version, kind, name, namespace, method=KubeObjects.get_object),
                         what=f"get {kind} {name}")

    @requires_kube_kinds(DELETE_KINDS, "delete")
    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        """Delete a sample Job, or the NodePool/AKSNodeClass of a failed node auto-provisioning pool.

        ``uid``: delete only the object with this uid (``DeleteOptions.preconditions``); an object that
        took the name since it was read answers 409, which is raised as Conflict and deletes nothing.
        """
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        group, version, plural, ns = self._object_args(api_version, kind, namespace, method=KubeObjects.delete_object)

        def delete() -> None:
            options = V1DeleteOptions(api_version="v1", kind="DeleteOptions", propagation_policy="Background",
                                      preconditions=V1Preconditions(uid=uid) if uid else None)
            if ns is not None:
                self._body(self._custom.delete_namespaced_custom_object(
                    group, version, ns, plural, name, body=options, _preload_content=False,
                    _request_timeout=TIMEOUT))
            else:
                self._body(self._custom.delete_cluster_custom_object(
                    group, version, plural, name, body=options, _preload_content=False,
                    _request_timeout=TIMEOUT))

        try:
            self._run(delete, what=f"delete {kind} {name}")
        except NotFound:
            return

    @requires_kube("karpenter.sh", "nodeclaims", "list", "delete")
    def delete_nodeclaim(self, *, node_name: str, provider_id: str) -> str | None:
        """Delete the Karpenter NodeClaim behind a node; its name, or None when no claim matches.

        The claim is found by ``status.providerID`` (the node's ``spec.providerID``), else by
        ``status.nodeName``. Deleting it is how a node auto-provisioning node is replaced: Karpenter's
        termination controller (finalizer ``karpenter.sh/termination``) drains and deletes the node and
        its VM, and provisions a new node when pods need one (kubernetes-sigs/karpenter
        pkg/controllers/node/termination). Idempotent: a claim already being deleted is deleted again
        harmlessly, and the delete carries the claim's uid as a precondition, so a new claim that took
        the same name is never deleted by mistake.
        """
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        def find() -> Mapping[str, Any] | None:
            response = self._custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims",
                                                               _preload_content=False, _request_timeout=TIMEOUT)
            items = json.loads(self._body(response) or b"{}").get("items") or []
            by_name = None
            for item in items:
                status = item.get("status") or {}
                if provider_id and status.get("providerID") == provider_id:
                    return dict(item)
                if node_name and status.get("nodeName") == node_name:
                    by_name = dict(item)
            return by_name

        claim = self._run(find, what=f"find the NodeClaim of {node_name}")
        if claim is None:
            return None
        meta = claim.get("metadata") or {}
        name = str(meta.get("name", ""))

        def delete() -> bytes:
            options = V1DeleteOptions(api_version="v1", kind="DeleteOptions", propagation_policy="Background",
                                      preconditions=V1Preconditions(uid=meta.get("uid")))
            return self._body(self._custom.delete_cluster_custom_object(
                "karpenter.sh", "v1", "nodeclaims", name, body=options, _preload_content=False,
                _request_timeout=TIMEOUT))

        try:
            self._run(delete, what=f"delete NodeClaim {name}")
        except NotFound:
            return name  # already gone
        return name

"""One cluster's Kubernetes API: the KubePort adapter, fast where the fleet is large.

Why it is built this way:

- **Connection** (:mod:`shared.adapters.kube.transport`, :mod:`shared.adapters.kube.auth`): the server and
  CA from the kubeconfig ARM hands out, a bearer token from the app's own credential, one retry policy.
- **Hot reads** (the health sweep lists every GPU node of the fleet; drains list pods) skip the
  kubernetes client's model classes entirely: the raw JSON (``_preload_content=False``) is decoded
  by msgspec into small structs holding only the fields decisions need
  (:mod:`shared.adapters.kube.decoding`), one page (``limit`` / ``continue``) at a time, so CPU stays
  low and memory is bounded by the page size. Node pages go further (the sweep reads every GPU node
  every minute): they are fetched with a plain GET through the client's own connection pool, decoded
  straight into the views' conditions and taints, and each page is let go before the next.
- **Writes** go through the kubernetes client (strategic-merge patches, the Eviction API, events,
  leases; Jobs and Karpenter objects in :mod:`shared.adapters.kube.objects`). Pods are only ever removed
  through the Eviction API, whose refusals are classified, not raised (:mod:`shared.adapters.kube.errors`).
- Errors are translated at the edge into shared.kernel.errors; each method declares the exact Kubernetes
  verbs it uses (shared.adapters.permissions), per kind for the generic object methods, cluster-wide, in
  the app's own namespace (leases, sample Jobs: ``namespace``, setting STEWARD_NAMESPACE) or, for the
  Events about Nodes, in ``default`` only (:data:`NODE_EVENTS_NAMESPACE`), from which the ClusterRole and
  the two Roles are checked (tests/infra).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from shared.adapters.kube.decoding import decode_node, decode_node_list, decode_pod_list
from shared.adapters.kube.errors import ListExpired, call_kube, classify_eviction_error, expiring
from shared.adapters.kube.objects import KubeObjects
from shared.adapters.kube.transport import TIMEOUT
from shared.adapters.permissions import requires_kube
from shared.kernel.errors import Conflict, NotFound, Transient
from shared.kernel.ports import EVICTED, EvictionResult, NodeView, PodView
from shared.kernel.timefmt import iso, parse_time

log = logging.getLogger("steward.kube")

EVENT_COMPONENT = "gpu-fleet-steward"
NODE_EVENTS_NAMESPACE = "default"
"""Where the app records its Events about Nodes (``create_event``), as the kubelet records its own.

An Event without ``eventTime`` about a cluster-scoped object (a Node has no namespace) must live in
namespace "" or ``default`` (with ``eventTime``: ``default`` or ``kube-system``); the API server refuses
any other with 422 ``involvedObject.namespace: Invalid value: "": does not match event.namespace``
(kubernetes/kubernetes pkg/apis/core/validation/events.go ``legacyValidateEvent``). ``kubectl describe
node`` finds them there: it searches Events by involvedObject in every namespace (kubectl describe.go
searchEvents). The app may create Events here and nowhere else (infra/kubernetes/role.yaml, the Role
``gpu-fleet-steward-node-events``)."""
# Leases go through the generic object API so that their MicroTime fields are sent exactly as written
# (the typed client re-serialises datetimes without the fraction the API server's MicroTime requires).
_LEASES = ("coordination.k8s.io", "v1", "leases")


def _escape_field_value(value: str) -> str:
    """A literal as a field selector value (fields.EscapeValue in k8s.io/apimachinery/pkg/fields/selector.go):
    an unescaped ``,`` or ``=`` in a value is a 400 from the server."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


# How often one list call starts again after its continue token expired before it gives up (Transient):
# a list needs to outlast only one compaction interval (5 minutes by default) to finish.
MAX_LIST_RESTARTS = 3


def _restart_or_give_up(expired: ListExpired, restarts: int, *, what: str) -> int:
    restarts += 1
    if restarts > MAX_LIST_RESTARTS:
        raise Transient(f"{what}: the list's continue token expired {restarts} times in a row; giving up for now "
                        f"({expired})") from expired
    log.warning("list token expired: listing again from the start", extra={"what": what, "restart": restarts})
    return restarts



class KubeClient(KubeObjects):
    """KubePort for one cluster (its generic object calls: :class:`shared.adapters.kube.objects.KubeObjects`)."""

    # -- nodes

    @requires_kube("", "nodes", "list")
    def list_nodes(self, *, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]:
        """GPU nodes one page at a time; a page is released before the next one is fetched.

        An expired ``continue`` token (410 Expired: etcd was compacted past the list's revision while
        the pages were being read) restarts the list from scratch, at most ``MAX_LIST_RESTARTS`` times
        (then ``Transient``). What a restart means for the consumer: every node is still handed over at
        most once per call (the names already handed over are skipped), but the list is no longer one
        snapshot: the nodes handed over before the restart are as they were then, the rest as they are
        in the new list; a node created meanwhile appears, a node deleted meanwhile may already have
        been handed over. The sweep, which judges each node on its own, is exact under that reading.
        """
        what = f"list nodes of {self.cluster_id or self.server}"
        token = ""
        seen: set[str] = set()
        restarts = 0
        while True:
            query: dict[str, str | int | None] = {"labelSelector": label_selector, "limit": page_size,
                                                  "continue": token}

            def fetch(page_query: Mapping[str, str | int | None] = query) -> bytes:
                return self._get_json("/api/v1/nodes", page_query)

            try:
                data = self._run(expiring(fetch, token=token), what=what)
            except ListExpired as expired:
                restarts = _restart_or_give_up(expired, restarts, what=what)
                token = ""
                continue
            nodes, token = decode_node_list(data)
            nodes.reverse()
            while nodes:  # hand each node over and forget it, so that only the consumer keeps the page
                node = nodes.pop()
                if node.name in seen:
                    continue  # handed over before a restart
                seen.add(node.name)
                yield node
            if not token:
                return

    @requires_kube("", "nodes", "get")
    def get_node(self, name: str) -> NodeView | None:
        try:
            data = self._run(lambda: self._body(self._core.read_node(name, _preload_content=False,
                                                                      _request_timeout=TIMEOUT)),
                             what=f"get node {name}")
        except NotFound:
            return None
        return decode_node(data)

    @requires_kube("", "nodes", "patch")
    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        data = self._run(lambda: self._body(self._core.patch_node(
            name, dict(patch), _content_type="application/strategic-merge-patch+json",
            _preload_content=False, _request_timeout=TIMEOUT)), what=f"patch node {name}")
        return decode_node(data)

    # -- pods

    @requires_kube("", "pods", "list")
    def list_pods(self, *, node_name: str | None = None, namespace: str | None = None,
                  label_selector: str = "", page_size: int = 500) -> list[PodView]:
        field_selector = f"spec.nodeName={_escape_field_value(node_name)}" if node_name else None
        what = f"list pods ({node_name or namespace or 'all'})"
        pods: list[PodView] = []
        token = ""
        restarts = 0
        while True:
            def fetch(page_token: str = token) -> bytes:
                common: dict[str, Any] = {
                    "field_selector": field_selector, "label_selector": label_selector or None, "limit": page_size,
                    "_continue": page_token or None, "_preload_content": False, "_request_timeout": TIMEOUT}
                if namespace:
                    return self._body(self._core.list_namespaced_pod(namespace, **common))
                return self._body(self._core.list_pod_for_all_namespaces(**common))

            try:
                data = self._run(expiring(fetch, token=token), what=what)
            except ListExpired as expired:  # the list starts again from scratch: one consistent list
                restarts = _restart_or_give_up(expired, restarts, what=what)
                pods, token = [], ""
                continue
            page, token = decode_pod_list(data)
            pods.extend(page)
            if not token:
                return pods

    @requires_kube("", "pods/eviction", "create")
    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        from kubernetes.client import V1DeleteOptions, V1Eviction, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        grace = None if grace_period_seconds is None else int(grace_period_seconds)

        def post() -> EvictionResult:
            options = None if grace is None else V1DeleteOptions(grace_period_seconds=grace)
            body = V1Eviction(api_version="policy/v1", kind="Eviction",
                              metadata=V1ObjectMeta(name=name, namespace=namespace), delete_options=options)
            try:
                self._body(self._core.create_namespaced_pod_eviction(
                    name, namespace, body, _preload_content=False, _request_timeout=TIMEOUT))
            except ApiException as error:
                result = classify_eviction_error(int(error.status or 0), error.body, error.headers)
                if result is None:
                    raise  # an RBAC 403, a 5xx, ...: map_kube_error decides (Forbidden, Transient)
                return result
            return EvictionResult(EVICTED)

        return self._run(post, what=f"evict {namespace}/{name}")

    @requires_kube("policy", "poddisruptionbudgets", "list")
    def list_pdbs(self, namespace: str | None = None) -> list[Mapping[str, Any]]:
        def fetch() -> bytes:
            if namespace:
                return self._body(self._policy.list_namespaced_pod_disruption_budget(
                    namespace, _preload_content=False, _request_timeout=TIMEOUT))
            return self._body(self._policy.list_pod_disruption_budget_for_all_namespaces(
                _preload_content=False, _request_timeout=TIMEOUT))

        doc = json.loads(self._run(fetch, what=f"list PDBs ({namespace or 'all'})") or b"{}")
        return list(doc.get("items") or [])

    # -- events

    @requires_kube("", "events", "create", namespace=NODE_EVENTS_NAMESPACE)
    def create_event(self, *, node: NodeView | str, reason: str, message: str, type_: str = "Normal",
                     action: str = "", correlation_id: str = "") -> None:
        from kubernetes.client import CoreV1Event, V1EventSource, V1ObjectMeta, V1ObjectReference

        name = node if isinstance(node, str) else node.name
        uid = "" if isinstance(node, str) else node.uid
        # metav1.Time has whole seconds; the client writes a datetime as RFC 3339 (datetime.isoformat).
        stamp = datetime.fromtimestamp(self._now(), tz=UTC).replace(microsecond=0)
        try:
            body = CoreV1Event(
                api_version="v1", kind="Event",
                metadata=V1ObjectMeta(name=f"{name}.{uuid.uuid4().hex[:16]}", namespace=NODE_EVENTS_NAMESPACE,
                                      annotations={"gpu-fleet-steward/correlation-id": correlation_id}
                                      if correlation_id else {}),
                involved_object=V1ObjectReference(api_version="v1", kind="Node", name=name, uid=uid or None),
                reason=reason, message=message[:1024], type=type_, action=action or reason,
                source=V1EventSource(component=EVENT_COMPONENT),
                reporting_component=EVENT_COMPONENT, reporting_instance=EVENT_COMPONENT,
                first_timestamp=stamp, last_timestamp=stamp, count=1,
            )
            # In `default`, never the app's namespace: the API server refuses an Event about a Node anywhere
            # else (NODE_EVENTS_NAMESPACE); `kubectl describe node` finds it in every namespace.
            call_kube(lambda: self._body(self._core.create_namespaced_event(
                NODE_EVENTS_NAMESPACE, body, _preload_content=False, _request_timeout=TIMEOUT)),
                what=f"event {reason} on node {name}")
        except Exception as error:  # events are auxiliary: log and carry on
            log.warning("could not record a Kubernetes event", extra={"node": name, "reason": reason,
                                                                      "error": str(error)[:300]})

    # -- leases

    @requires_kube("coordination.k8s.io", "leases", "get", "create", "update", namespaced=True)
    def acquire_lease(self, name: str, *, holder: str, duration_s: int, namespace: str | None = None) -> bool:
        """Take or renew the lease (in the app's namespace unless told); False when someone else holds
        it or won the race."""
        namespace = namespace or self.namespace
        now = self._now()
        spec = {"holderIdentity": holder, "leaseDurationSeconds": int(duration_s),
                "renewTime": iso(now, micro=True)}
        what = f"lease {namespace}/{name}"
        try:
            current = json.loads(self._run(lambda: self._body(self._custom.get_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, _preload_content=False, _request_timeout=TIMEOUT)), what=what))
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {**spec, "acquireTime": iso(now, micro=True), "leaseTransitions": 0}}
            try:
                call_kube(lambda: self._body(self._custom.create_namespaced_custom_object(
                    *_LEASES[:2], namespace, _LEASES[2], body, _preload_content=False, _request_timeout=TIMEOUT)), what=what)
            except Conflict:
                return False
            return True
        held = current.get("spec") or {}
        other = held.get("holderIdentity") or ""
        renewed = parse_time(held.get("renewTime")) or parse_time(held.get("acquireTime")) or 0.0
        expired = renewed + float(held.get("leaseDurationSeconds") or 0) <= now
        if other and other != holder and not expired:
            return False
        new_spec = dict(held)
        new_spec.update(spec)
        if other != holder:
            new_spec["acquireTime"] = iso(now, micro=True)
            new_spec["leaseTransitions"] = int(held.get("leaseTransitions") or 0) + 1
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace,
                             "resourceVersion": (current.get("metadata") or {}).get("resourceVersion", "")},
                "spec": new_spec}
        try:
            call_kube(lambda: self._body(self._custom.replace_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, body, _preload_content=False, _request_timeout=TIMEOUT)), what=what)
        except (Conflict, NotFound):
            return False
        return True

    @requires_kube("coordination.k8s.io", "leases", "get", "update", namespaced=True)
    def release_lease(self, name: str, *, holder: str, namespace: str | None = None) -> None:
        """Give the lease up if we hold it (clears the holder; the object stays for the next taker)."""
        namespace = namespace or self.namespace
        what = f"lease {namespace}/{name}"
        try:
            current = json.loads(self._run(lambda: self._body(self._custom.get_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, _preload_content=False, _request_timeout=TIMEOUT)), what=what))
        except NotFound:
            return
        held = dict(current.get("spec") or {})
        if held.get("holderIdentity") != holder:
            return
        held["holderIdentity"] = None
        held["renewTime"] = None
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace,
                             "resourceVersion": (current.get("metadata") or {}).get("resourceVersion", "")},
                "spec": held}
        try:
            call_kube(lambda: self._body(self._custom.replace_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, body, _preload_content=False, _request_timeout=TIMEOUT)), what=what)
        except (Conflict, NotFound):
            return  # someone took it over meanwhile: it is not ours to release any more

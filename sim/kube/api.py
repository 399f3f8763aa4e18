"""The Kubernetes API servers of the simulated clusters, all behind one path-prefixed handler.

``https://127.0.0.1:PORT/k8s/<sub>/<rg>/<cluster>/...`` is the API server of that cluster. It speaks
enough of the real protocol (discovery, JSON objects, Status errors with the real codes, label and
field selectors parsed as the real parsers parse them, limit/continue pagination whose tokens expire
with etcd compaction, merge / strategic-merge / JSON patches, ``dryRun=All``, the eviction subresource,
optimistic concurrency, watch streams, server-side tables for ``kubectl get``) that the kubernetes
Python client and ``kubectl`` work against it unchanged, and as strictly as a real server. Not served: server-side apply,
protobuf, logs/exec/port-forward, OpenAPI documents (kubectl falls back without them). The
behaviour behind the objects lives in :mod:`sim.model`.

Listing is the hot path (the app lists thousands of nodes every sweep): every object keeps its
serialised bytes until it changes, and a list body is those bytes joined, so the server's share of
a large list stays small next to the client's decoding.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from sim.core.http import Request, Response
from sim.core.oracles import kube_route
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube import openapi, rbac
from sim.kube.errors import ApiError, not_found
from sim.kube.eviction import Evictions
from sim.kube.reads import DEFAULT_COMPACTION_S, Reads, StreamResponse
from sim.kube.writes import Writes

if TYPE_CHECKING:
    from sim.model import Cluster, Fleet

# the names other modules import from here (their homes are the modules above)
__all__ = ["DEFAULT_COMPACTION_S", "ApiError", "KubeApi", "StreamResponse"]

log = logging.getLogger("sim.kube.api")
_SHORT = {"pods": ["po"], "nodes": ["no"], "namespaces": ["ns"], "events": ["ev"], "services": ["svc"],
          "configmaps": ["cm"], "serviceaccounts": ["sa"], "poddisruptionbudgets": ["pdb"], "deployments": ["deploy"],
          "replicasets": ["rs"], "statefulsets": ["sts"], "daemonsets": ["ds"], "nodepools": [], "leases": []}
_ALL = {"pods", "deployments", "replicasets", "statefulsets", "daemonsets", "jobs", "services"}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class KubeApi(Reads, Writes, Evictions):
    """``handle(request)`` for every path under ``/k8s/``: authentication, authorization, routing and
    discovery here; the verbs in its parts (:mod:`sim.kube.reads`, :mod:`sim.kube.writes`,
    :mod:`sim.kube.eviction`)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._snapshot_ids = itertools.count(1)
        self._dry_ids = itertools.count(1)
        self._forced_compactions: dict[str, int] = {}  # cluster id -> compactions forced by the hook

    # ---- entry
    def route(self, request: Request) -> str:
        return kube_route(request.path)

    def handle(self, request: Request) -> Response:
        fleet = self.fleet
        with contextlib.suppress(Exception):  # the pump logs its own failures; never fail a request for them
            fleet.pump()
        parts = [unquote(p) for p in request.path.split("/") if p]
        if len(parts) < 4 or parts[0] != "k8s":
            return ApiError(404, "NotFound", "the server could not find the requested resource").response()
        cluster = fleet.cluster(parts[1], parts[2], parts[3])
        if cluster is None:
            return ApiError(404, "NotFound", f"no API server for cluster {parts[1]}/{parts[2]}/{parts[3]}").response()
        delay = 0.0
        expire_tokens = False
        faults = getattr(fleet, "faults", None)
        if faults is not None:
            hit = faults.match(target="kube", method=request.method, path=request.path, cluster=cluster.name)
            if hit is not None:
                if hit.status == 410 and request.arg("continue"):
                    # the on-demand hook for expired list tokens ({target: kube, status: 410, path: ...}): compact
                    # etcd now and let the real code answer, with the real body and the inconsistent-continue token
                    expire_tokens = True
                elif getattr(hit, "replaces_answer", True):
                    return hit
                delay = float(getattr(hit, "delay_s", 0.0) or 0.0)
        verdict = fleet.tokens.verify(request.bearer, AKS_AUDIENCES)
        rest = parts[4:]
        if verdict.status != 200:
            # Authentication failed (no token, a bad or expired one, or one for another audience): every
            # authenticator rejected it, so kube-apiserver answers 401 before any authorization
            # (staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go Unauthorized).
            resp = ApiError(401, "Unauthorized", "Unauthorized").response()
        else:
            try:
                with fleet.lock:
                    refused = self._authorize(cluster, request, rest, verdict)
                    if refused is not None:
                        resp = refused
                    else:
                        if expire_tokens:
                            self.compact(cluster)
                        resp = self._dispatch(cluster, request, rest)
                        fleet.settle()
            except ApiError as e:
                resp = e.response()
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                resp = ApiError(400, "BadRequest", f"the request could not be processed: {e}").response()
            except Exception as e:  # a simulator bug: answer like the API server does, keep serving
                log.exception("kube request failed: %s %s", request.method, request.path)
                resp = ApiError(500, "InternalError", f"Internal error occurred: {e!r}").response()
        resp.delay_s += delay
        return resp

    # ---- authorization (sim/kube/rbac.py)
    def _authorize(self, c: Cluster, req: Request, rest: list[str], verdict: Any) -> Response | None:
        """None when the caller may make this request; else the API server's answer: 403 Forbidden, or a
        SelfSubjectAccessReview's result (which is answered here, for the user the request runs as)."""
        requester = rbac.User(verdict.principal, verdict.groups)
        user, refused = rbac.impersonate(c, requester, req.headers)
        if refused is not None:
            message, details = rbac.forbidden_status(refused)
            return ApiError(403, "Forbidden", message, details).response()
        query = {k: (v[0] if v else "") for k, v in req.query.items()}
        attrs = rbac.request_attributes(user, req.method, rest, query)
        decision = rbac.authorize(c, attrs)
        if not decision.allowed:
            message, details = rbac.forbidden_status(attrs, decision.reason)
            return ApiError(403, "Forbidden", message, details).response()
        if attrs.resource_request and attrs.api_group == "authorization.k8s.io" and attrs.verb == "create" \
                and attrs.resource == "selfsubjectaccessreviews" and not attrs.name:
            ctype = (req.headers.get("content-type") or "application/json").split(";")[0].strip().lower()
            raw = req.body
            if ctype == "application/vnd.kubernetes.protobuf":
                raw = rbac.decode_review_protobuf(req.body)  # what `kubectl auth can-i` sends
            elif ctype not in ("application/json", ""):
                raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                               "accepted media types include: application/json, application/yaml, "
                               "application/vnd.kubernetes.protobuf")
            status, body = rbac.self_subject_access_review(c, user, raw)
            if status != 201:
                raise ApiError(status, str(body["reason"]), str(body["message"]))
            return Response.json(201, body)
        if attrs.resource_request and attrs.api_group == "authorization.k8s.io" and attrs.verb == "create" \
                and attrs.resource == "selfsubjectrulesreviews" and not attrs.name:
            ctype = (req.headers.get("content-type") or "application/json").split(";")[0].strip().lower()
            raw = rbac.decode_rules_review_protobuf(req.body) if ctype == "application/vnd.kubernetes.protobuf" \
                else req.body
            status, body = rbac.self_subject_rules_review(c, user, raw)
            if status != 201:
                raise ApiError(status, str(body["reason"]), str(body["message"]))
            return Response.json(201, body)
        return None

    # ---- dispatch
    def _dispatch(self, c: Cluster, req: Request, p: list[str]) -> Response:
        if not p:
            return Response.json(200, {"paths": ["/api", "/api/v1", "/apis", "/version", "/healthz"]})
        head = p[0]
        if head == "version" and len(p) == 1:
            return self._only_get(req, lambda: _version(c))
        if head == "openapi" and len(p) >= 2 and p[1] == "v3":
            # kubectl reads these to learn that the server validates fields itself (sim/kube/openapi.py)
            if len(p) == 2:
                return self._only_get(req, lambda: openapi.index(c.resources()))
            doc = openapi.document(c.resources(), "/".join(p[2:]))
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._only_get(req, lambda: doc)
        if head in ("healthz", "livez", "readyz") and len(p) == 1:
            return Response(status=200, body=b"ok", headers={"Content-Type": "text/plain"})
        if head == "api":
            if len(p) == 1:
                return self._only_get(req, lambda: {"kind": "APIVersions", "versions": ["v1"],
                                                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                                                    "serverAddress": "127.0.0.1:443"}]})
            if p[1] != "v1":
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if len(p) == 2:
                return self._only_get(req, lambda: _resource_list(c, "", "v1"))
            return self._resource(c, req, "", "v1", p[2:])
        if head == "apis":
            groups = _groups(c)
            if len(p) == 1:
                return self._only_get(req, lambda: {"kind": "APIGroupList", "apiVersion": "v1",
                                                    "groups": [_group_doc(g, vs) for g, vs in sorted(groups.items())]})
            if p[1] not in groups:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if len(p) == 2:
                return self._only_get(req, lambda: {"kind": "APIGroup", "apiVersion": "v1",
                                                    **_group_doc(p[1], groups[p[1]])})
            if p[2] not in groups[p[1]]:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if len(p) == 3:
                return self._only_get(req, lambda: _resource_list(c, p[1], p[2]))
            return self._resource(c, req, p[1], p[2], p[3:])
        raise ApiError(404, "NotFound", "the server could not find the requested resource",
                       {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]})

    @staticmethod
    def _only_get(req: Request, fn: Callable[[], Any]) -> Response:
        if req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        return Response.json(200, fn())

    def _resource(self, c: Cluster, req: Request, group: str, version: str, p: list[str]) -> Response:
        ns: str | None = None
        if p[0] == "namespaces" and len(p) >= 3:
            ns = p[1]
            p = p[2:]
        resource, name, sub = p[0], (p[1] if len(p) > 1 else None), (p[2] if len(p) > 2 else None)
        if len(p) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        key = f"{resource}.{group}" if group else resource
        spec = c.resources().get(key)
        if spec is None or spec[1] != version:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespaced = spec[3]
        if ns is not None and not namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if ns is not None and ("", ns) not in c.store["namespaces"] and req.method in ("POST", "PUT", "PATCH"):
            raise not_found("namespaces", ns)
        m = req.method
        if name is None:
            if m == "GET":
                return self._list(c, req, key, ns)
            if m == "POST":
                if namespaced and ns is None:
                    raise ApiError(405, "MethodNotAllowed",
                                   "the server does not allow this method on the requested resource")
                return self._create(c, req, key, ns)
            if m == "DELETE":
                return self._delete_collection(c, req, key, ns)
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if namespaced and ns is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = ns or ""
        if sub is None:
            if m == "GET":
                return self._get(c, req, key, ns, name)
            if m == "PUT":
                return self._update(c, req, key, ns, name, status=False)
            if m == "PATCH":
                return self._patch(c, req, key, ns, name, status=False)
            if m == "DELETE":
                return self._delete(c, req, key, ns, name)
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if sub == "status":
            if m == "GET":
                return self._get(c, req, key, ns, name)
            if m == "PATCH":
                return self._patch(c, req, key, ns, name, status=True)
            if m == "PUT":
                return self._update(c, req, key, ns, name, status=True)
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if sub == "eviction" and key == "pods":
            if m != "POST":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
            return self._evict(c, req, ns, name)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")


# --------------------------------------------------------------------------- discovery


def _version(c: Cluster) -> dict[str, Any]:
    major, minor, *_ = [*c.kubernetes_version.split("."), "0", "0"]
    return {"major": major, "minor": minor, "gitVersion": f"v{c.kubernetes_version}", "gitCommit": "0" * 40,
            "gitTreeState": "clean", "buildDate": "2026-11-05T00:00:00Z", "goVersion": "go1.23.8",
            "compiler": "gc", "platform": "linux/amd64"}


def _groups(c: Cluster) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for group, version, _k, _n in c.resources().values():
        if group and version not in out.setdefault(group, []):
            out[group].append(version)
    return out


def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": vs, "preferredVersion": vs[0]}


def _resource_list(c: Cluster, group: str, version: str) -> dict[str, Any]:
    resources = []
    for key, (g, v, kind, namespaced) in sorted(c.resources().items()):
        if g != group or v != version:
            continue
        plural = key.split(".", 1)[0]
        doc: dict[str, Any] = {"name": plural, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                               "verbs": list(_VERBS), "shortNames": _SHORT.get(plural, [])}
        if plural in _ALL:
            doc["categories"] = ["all"]
        resources.append(doc)
        if plural in ("pods", "nodes", "deployments", "statefulsets", "daemonsets", "replicasets", "jobs",
                      "poddisruptionbudgets", "namespaces"):
            resources.append({"name": f"{plural}/status", "singularName": "", "namespaced": namespaced, "kind": kind,
                              "verbs": ["get", "patch", "update"]})
        if plural == "pods":
            resources.append({"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                              "version": "v1", "kind": "Eviction", "verbs": ["create"]})
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


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

import base64
import contextlib
import copy
import hashlib
import itertools
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import msgspec

from sim import psa, rbac
from sim.http import Request, Response
from sim.model import (
    Cluster,
    Fleet,
    KObj,
    Node,
    Pod,
    SelectorError,
    iso,
    match_requirements,
    parse_iso,
    parse_label_selector,
    parse_quantity,
    selector_requirements,
)
from sim.oracles import kube_route
from sim.tokens import AKS_AUDIENCES

log = logging.getLogger("sim.kube_api")
_ENC = msgspec.json.Encoder()
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_SHORT = {"pods": ["po"], "nodes": ["no"], "namespaces": ["ns"], "events": ["ev"], "services": ["svc"],
          "configmaps": ["cm"], "serviceaccounts": ["sa"], "poddisruptionbudgets": ["pdb"], "deployments": ["deploy"],
          "replicasets": ["rs"], "statefulsets": ["sts"], "daemonsets": ["ds"], "nodepools": [], "leases": []}
_ALL = {"pods", "deployments", "replicasets", "statefulsets", "daemonsets", "jobs", "services"}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
# patchMergeKey of the lists a strategic merge patch merges element-wise (kubernetes/kubernetes
# staging/src/k8s.io/api/core/v1/types.go struct tags). NodeSpec.Taints and PodSpec.Tolerations carry no
# patchStrategy, so a patch REPLACES those lists whole (None here); ObjectMeta.Finalizers is a list of
# strings with patchStrategy "merge": the patch's entries are added to the current ones.
_STRATEGIC_KEYS = {"taints": None, "conditions": ("type",), "containers": ("name",),
                   "initContainers": ("name",), "env": ("name",), "volumes": ("name",), "volumeMounts": ("mountPath",),
                   "ports": ("containerPort",), "ownerReferences": ("uid",), "addresses": ("type",),
                   "tolerations": None, "imagePullSecrets": ("name",)}
_STRATEGIC_PRIMITIVE_MERGE = {"finalizers"}
_MAX_SNAPSHOTS = 16  # per cluster; a snapshot holds the bytes of the objects as they were
# kube-apiserver --etcd-compaction-interval (default 5m). At every tick the apiserver's compactor
# (staging/src/k8s.io/apiserver/pkg/storage/etcd3/compact.go) writes its own key, which moves the revision
# on, and compacts etcd to the revision that write produced at the previous tick. A continue token reads
# at its list's revision, so it works until the second tick after the list began (one to two intervals)
# and then gets 410 Expired, however quiet the cluster. Sim time; a scenario may set
# ``timings: {etcd_compaction_s: ...}`` (0 switches compaction off).
DEFAULT_COMPACTION_S = 300.0
# staging/src/k8s.io/apiserver/pkg/storage/etcd3/errors.go
_CONTINUE_EXPIRED = ("The provided continue parameter is too old to display a consistent list result. You can start "
                     "a new list without the continue parameter.")
_INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list.")


class ApiError(Exception):
    """An error the API server answers with a Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None, list_meta: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details, self.headers = code, reason, message, details, headers
        self.list_meta = list_meta

    def response(self) -> Response:
        r = Response.kube_status(self.code, self.reason, self.message, self.details)
        if self.list_meta:  # Status.metadata is a ListMeta (e.g. the continue token of an expired list)
            payload = json.loads(r.body)
            payload["metadata"] = self.list_meta
            r = Response.json(self.code, payload)
        r.headers.update(self.headers or {})
        return r


@dataclass
class StreamResponse(Response):
    """A response whose body is written as it is produced (chunked): watch streams."""

    stream: Iterator[bytes] | None = None


def _event(kind: str, raw: bytes) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"


def _not_found(resource: str, name: str, group: str = "") -> ApiError:
    qual = f"{resource}.{group}" if group else resource
    return ApiError(404, "NotFound", f'{qual} "{name}" not found',
                    {"name": name, "group": group, "kind": resource})


def _invalid(kind: str, name: str, causes: list[tuple[str, str, str]], group: str = "") -> ApiError:
    msg = "; ".join(f"{f}: {m}" for f, m, _r in causes)
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {msg}',
                    {"name": name, "group": group, "kind": kind,
                     "causes": [{"reason": r, "message": m, "field": f} for f, m, r in causes]})


class KubeApi:
    """``handle(request)`` for every path under ``/k8s/``."""

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

    # ---- authorization (sim/rbac.py)
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
            raise _not_found("namespaces", ns)
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

    # ---- reads
    def _get(self, c: Cluster, req: Request, key: str, ns: str, name: str) -> Response:
        obj = c.get(key, ns, name)
        if obj is None:
            raise _not_found(key.split(".", 1)[0], name, c.resources()[key][0])
        if _wants_table(req):
            return Response.json(200, _table(c, key, [obj]))
        return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})

    def _list(self, c: Cluster, req: Request, key: str, ns: str | None) -> Response:
        group, version, kind, _namespaced = c.resources()[key]
        if (req.arg("watch") or "").lower() in ("1", "true"):
            return self._watch(c, req, key, ns)
        limit_s = req.arg("limit")
        cont = req.arg("continue")
        try:
            limit = int(limit_s) if limit_s not in (None, "") else 0
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid limit {limit_s!r}") from None
        api_version = f"{group}/{version}" if group else version
        if cont:
            raws, rv, offset = self._continue(c, req, key, ns, cont)
        else:
            objs = self._select(c, req, key, ns)
            if _wants_table(req):
                return Response.json(200, _table(c, key, objs))
            raws = [o.raw() for o in objs]
            rv, offset = str(c.rv), 0
        end = offset + limit if limit > 0 else len(raws)
        meta: dict[str, Any] = {"resourceVersion": rv}
        if end < len(raws):
            token = self._snapshot_token(c, cont, raws, rv, end)
            meta["continue"] = token
            meta["remainingItemCount"] = len(raws) - end
        elif cont:
            c.list_snapshots.pop(str(_decode_continue(cont).get("s")), None)  # last page served: free it
        body = b"".join([b'{"kind":"', kind.encode(), b'List","apiVersion":"', api_version.encode(),
                         b'","metadata":', _ENC.encode(meta), b',"items":[', b",".join(raws[offset:end]), b"]}"])
        return Response(status=200, body=body, headers={"Content-Type": "application/json"})

    # ---- watch
    def _watch(self, c: Cluster, req: Request, key: str, ns: str | None) -> Response:
        """A watch stream: initial ADDED events (no resourceVersion) or the changes since one, then live
        changes until ``timeoutSeconds``. Changes are logged only while someone watches; a watch from
        an older resourceVersion catches up with the current state of every object changed since (and
        the deletions remembered), the way a relisting informer would see them."""
        try:
            label_reqs = parse_label_selector(req.arg("labelSelector") or "")
        except SelectorError as e:
            raise ApiError(400, "BadRequest", str(e)) from None
        fields = _parse_field_selector(req.arg("fieldSelector") or "", key)
        try:
            timeout = min(max(float(req.arg("timeoutSeconds") or 1800), 0.0), 3600.0)
        except ValueError:
            raise ApiError(400, "BadRequest", "timeoutSeconds must be a number") from None
        rv_arg = req.arg("resourceVersion") or ""
        if rv_arg not in ("", "0") and not rv_arg.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_arg!r}")

        def wanted(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if ns is not None and meta.get("namespace") != ns:
                return False
            if label_reqs and not match_requirements(meta.get("labels") or {}, label_reqs):
                return False
            return not fields or all(_field_ok(KObj(obj), f, op, v) for f, op, v in fields)

        initial: list[tuple[str, bytes]] = []
        if rv_arg in ("", "0"):
            initial = [("ADDED", o.raw()) for o in self._select(c, req, key, ns)]
        else:
            since = int(rv_arg)
            initial = [("MODIFIED", o.raw()) for o in self._select(c, req, key, ns)
                       if int(o.meta.get("resourceVersion") or 0) > since]
            initial += [("DELETED", raw) for rv, res, raw in c.tombstones
                        if rv > since and res == key and wanted(msgspec.json.decode(raw))]
        c.watchers += 1
        start = c.rv
        fleet = self.fleet

        def stream() -> Iterator[bytes]:
            try:
                for kind, raw in initial:
                    yield _event(kind, raw)
                deadline = time.monotonic() + timeout
                last = start
                while True:
                    with c.changed:
                        batch = [e for e in c.changes if e[0] > last]
                        if not batch:
                            remaining = deadline - time.monotonic()
                            if remaining <= 0:
                                return
                            c.changed.wait(min(remaining, 1.0))
                            continue
                        last = batch[-1][0]
                    for _rv, res, kind, raw in batch:
                        if res == key and wanted(msgspec.json.decode(raw)):
                            yield _event(kind, raw)
            finally:
                with fleet.lock:
                    c.watchers -= 1

        return StreamResponse(status=200, headers={"Content-Type": "application/json"}, stream=stream())

    def _snapshot_token(self, c: Cluster, cont: str | None, raws: list[bytes], rv: str, end: int) -> str:
        sid = None
        if cont:
            sid = _decode_continue(cont).get("s")
        if sid is None or sid not in c.list_snapshots:
            sid = f"{rv}-{next(self._snapshot_ids)}"  # not from fleet.rng: listing must not change the run
            c.list_snapshots[sid] = (rv, raws)
            while len(c.list_snapshots) > _MAX_SNAPSHOTS:
                c.list_snapshots.pop(next(iter(c.list_snapshots)))
        # like the real token (storage.EncodeContinue), it carries the key to continue after; and when the
        # list began ("t", sim time) and the forced compactions then ("g"), to judge its expiry
        last = msgspec.json.decode(raws[end - 1], type=_MetaOnly).metadata
        prev = _decode_continue(cont) if cont else {}
        began = prev.get("t", self.fleet.now())
        forced = prev.get("g", self._forced_compactions.get(c.id, 0))
        return _encode_continue({"s": sid, "o": end, "rv": rv, "k": [last.namespace, last.name], "t": began,
                                 "g": forced})

    def _continue(self, c: Cluster, req: Request, key: str, ns: str | None,
                  token: str) -> tuple[list[bytes], str, int]:
        """The rest of a paginated list: from its snapshot while etcd still holds its revision; a
        snapshot older than the last compaction is gone and the answer is 410 Expired, carrying a token
        that continues after the same key at the current revision (etcd3/store.go
        handleCompactedErrorForPaging: ``ResourceVersion -1``); such a token lists what is there now."""
        data = _decode_continue(token)
        after = data.get("k")
        if data.get("rv") == -1:  # an inconsistent continuation: the objects after the key, as they are now
            if not (isinstance(after, list) and len(after) == 2):
                raise ApiError(400, "BadRequest", "continue key is not valid: no key to continue after")
            start = (str(after[0]), str(after[1]))
            return [o.raw() for o in self._select(c, req, key, ns) if (o.namespace, o.name) > start], str(c.rv), 0
        sid = str(data.get("s"))
        snap = c.list_snapshots.get(sid)
        if snap is not None and self._compacted(c, data):
            c.list_snapshots.pop(sid, None)  # the history it stands for is gone
            snap = None
        if snap is None:
            if isinstance(after, list) and len(after) == 2:
                raise ApiError(410, "Expired", _INCONSISTENT_CONTINUE,
                               list_meta={"continue": _encode_continue({"rv": -1, "k": after})})
            raise ApiError(410, "Expired", _CONTINUE_EXPIRED)
        return snap[1], snap[0], int(data.get("o", 0))

    # ---- etcd compaction
    def _compacted(self, c: Cluster, token: dict[str, Any]) -> bool:
        """Whether etcd was compacted past the revision of the list ``token`` continues: two compaction
        ticks since the list began (see DEFAULT_COMPACTION_S), or a compaction forced since."""
        if int(token.get("g", 0)) < self._forced_compactions.get(c.id, 0):
            return True
        interval = float(self.fleet.timings.get("etcd_compaction_s", DEFAULT_COMPACTION_S))
        began = token.get("t")
        if interval <= 0 or not isinstance(began, int | float):
            return False
        epoch = self.fleet.clock.epoch_sim
        return (self.fleet.now() - epoch) // interval - (float(began) - epoch) // interval >= 2

    def compact(self, c: Cluster) -> None:
        """Compact the cluster's etcd now: every continue token handed out so far is expired (the hook for
        tests and fault rules)."""
        self._forced_compactions[c.id] = self._forced_compactions.get(c.id, 0) + 1
        c.list_snapshots.clear()

    def _select(self, c: Cluster, req: Request, key: str, ns: str | None) -> list[KObj]:
        try:
            label_reqs = parse_label_selector(req.arg("labelSelector") or "")
        except SelectorError as e:
            raise ApiError(400, "BadRequest", str(e)) from None
        fields = _parse_field_selector(req.arg("fieldSelector") or "", key)
        objs: list[KObj]
        node_filter = [v for f, op, v in fields if f == "spec.nodeName" and op == "="]
        if key == "pods" and node_filter:
            keys = sorted(c.pods_by_node.get(node_filter[0], set()))
            objs = [c.pods[k] for k in keys if k in c.pods and (ns is None or k[0] == ns)]
        else:
            objs = c.items(key, ns)
        out = []
        for o in objs:
            if label_reqs and not match_requirements(o.meta.get("labels") or {}, label_reqs):
                continue
            if fields and not all(_field_ok(o, f, op, v) for f, op, v in fields):
                continue
            out.append(o)
        return out

    # ---- writes
    def _body(self, req: Request) -> dict[str, Any]:
        try:
            body = json.loads(req.body or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"couldn't get version/kind; json parse error: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format: expected an object")
        return body

    def _check_kind(self, c: Cluster, key: str, body: dict[str, Any]) -> None:
        group, version, kind, _ = c.resources()[key]
        want = f"{group}/{version}" if group else version
        if body.get("kind") not in (None, kind):
            raise ApiError(400, "BadRequest", f"the object provided is unrecognized (must be of type {kind}): "
                           f"kind {body.get('kind')!r}")
        av = body.get("apiVersion")
        if av not in (None, want) and not (kind == "Event" and av in ("v1", "events.k8s.io/v1")):
            raise ApiError(400, "BadRequest", f"the API version in the data ({av}) does not match the expected "
                           f"API version ({want})")

    def _create(self, c: Cluster, req: Request, key: str, ns: str | None) -> Response:
        dry = _dry_run(req, "CreateOptions")
        body = self._body(req)
        self._check_kind(c, key, body)
        group, _v, kind, namespaced = c.resources()[key]
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                               "sent on the request")
            meta["namespace"] = ns
        if not meta.get("name") and meta.get("generateName"):
            # a dry run must not draw from the fleet's seeded rng (it would change the rest of the run)
            suffix = self._dry_suffix() if dry else self.fleet.rand_suffix(5)
            meta["name"] = f"{meta['generateName']}{suffix}"
        name = meta.get("name") or ""
        causes = []
        if not name:
            causes.append(("metadata.name", "Required value: name or generateName is required", "FieldValueRequired"))
        elif not _NAME_RE.match(name) or len(name) > 253:
            causes.append(("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                           "of lower case alphanumeric characters, '-' or '.'", "FieldValueInvalid"))
        causes += _validate(key, body)
        if causes:
            raise _invalid(kind, name, causes, group)
        if c.get(key, ns or "", name) is not None:
            raise ApiError(409, "AlreadyExists", f'{key.split(".", 1)[0]}{"." + group if group else ""} "{name}" '
                           "already exists", {"name": name, "group": group, "kind": key.split(".", 1)[0]})
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            meta.pop(k, None)
        if dry:
            # admission runs on dry runs too: a create in a terminating namespace is refused
            c.admit_create(key, ns or "", str((body.get("metadata") or {}).get("name") or ""))
            if key == "pods":
                # ...and so does Pod Security admission: a dry run answers the 403 the real create would
                # (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go runs the admission chain whatever
                # dryRun says; staging/src/k8s.io/pod-security-admission/admission/admission.go has no dry-run case)
                psa.admit_pod(c, body, ns or "default")
            return Response.json(201, self._preview_create(c, key, body))
        if key == "pods":
            kobj: KObj = c.create_pod(body)
        elif key == "nodes":
            # a kubelet registering, or a cluster admin: stored as posted, status included, backed by no VM
            # (kubernetes/kubernetes pkg/registry/core/node/strategy.go PrepareForCreate)
            kobj = c.register_node(body)
        else:
            kobj = c.put(key, body)
        return Response(status=201, body=kobj.raw(), headers={"Content-Type": "application/json"})

    def _update(self, c: Cluster, req: Request, key: str, ns: str, name: str, *, status: bool) -> Response:
        dry = _dry_run(req, "UpdateOptions")
        body = self._body(req)
        self._check_kind(c, key, body)
        obj = c.get(key, ns, name)
        group, _v, kind, _ = c.resources()[key]
        if obj is None:
            if key.startswith("leases."):  # leases allow create-on-update, as on the real server
                req2 = Request(method="POST", target=req.target, headers=req.headers, body=req.body)
                resp = self._create(c, req2, key, ns or None)
                return resp
            raise _not_found(key.split(".", 1)[0], name, group)
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        rv = meta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != obj.meta.get("resourceVersion"):
            raise _conflict(key, name, group)
        causes = _validate(key, body) if not status else []
        if causes:
            raise _invalid(kind, name, causes, group)
        new = copy.deepcopy(body)
        if dry:
            return Response.json(200, self._preview_update(key, obj, new, status=status))
        self._commit(c, key, obj, new, status=status)
        return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})

    def _patch(self, c: Cluster, req: Request, key: str, ns: str, name: str, *, status: bool) -> Response:
        dry = _dry_run(req, "PatchOptions")
        obj = c.get(key, ns, name)
        group, _v, kind, _ = c.resources()[key]
        if obj is None:
            raise _not_found(key.split(".", 1)[0], name, group)
        ctype = (req.headers.get("content-type") or "").split(";")[0].strip().lower()
        try:
            patch = json.loads(req.body or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"error decoding patch: {e}") from None
        current = msgspec.json.decode(obj.raw())
        if ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
            new = _json_patch(current, patch)
        elif ctype == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "patch body must be a JSON object")
            new = _merge_patch(current, patch)
        elif ctype == "application/strategic-merge-patch+json":
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "patch body must be a JSON object")
            new = _strategic_patch(current, patch, "")
        elif ctype == "application/apply-patch+yaml":
            raise ApiError(415, "UnsupportedMediaType", "server-side apply is not supported by this simulator")
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                           f"accepted media types include: application/json-patch+json, application/merge-patch+json, "
                           f"application/apply-patch+yaml, application/strategic-merge-patch+json (got {ctype!r})")
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the patch produced something that is not an object")
        meta = new.get("metadata") or {}
        if meta.get("name") != name:
            raise _invalid(kind, name, [("metadata.name", "Invalid value: field is immutable", "FieldValueInvalid")],
                           group)
        rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
        if rv not in (None, "") and str(rv) != obj.meta.get("resourceVersion"):
            raise _conflict(key, name, group)
        causes = _validate(key, new)
        if causes:
            raise _invalid(kind, name, causes, group)
        if dry:
            return Response.json(200, self._preview_update(key, obj, new, status=status))
        self._commit(c, key, obj, new, status=status)
        return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})

    def _commit(self, c: Cluster, key: str, obj: KObj, new: dict[str, Any], *, status: bool) -> None:
        """Apply an updated object: which parts may change depends on the endpoint (main or status)."""
        if not status and key == "pods":
            _check_pod_update(obj, new)
        obj.obj.update(_update_fields(key, obj.obj, new, status=status))
        if status and isinstance(obj, Node):
            obj.obj["status"].setdefault("conditions", [])
        if isinstance(obj, Node):
            c.sync_node(obj)
            if status:
                obj.ready = any(x.get("type") == "Ready" and x.get("status") == "True"
                                for x in obj.obj["status"].get("conditions") or [])
                c.touch(obj)
        else:
            c.touch(obj)
        if isinstance(obj, Pod):
            from sim.model import pod_requests

            obj.requests = pod_requests(obj.obj.get("spec") or {})

    # ---- dry runs (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/registry/generic/registry/dryrun.go)
    # A dry-run request runs defaulting, admission and validation and answers with the object as it
    # would be, but DryRunnableStorage never writes: nothing is stored, no resourceVersion is taken, no
    # watch event is sent, and nothing the write would set off (scheduling, grace-period timers,
    # controllers) happens.
    def _dry_suffix(self) -> str:
        n = next(self._dry_ids)
        return hashlib.sha256(f"dry-run-{n}".encode()).hexdigest()[:5]

    def _preview_create(self, c: Cluster, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """The object a create would store (store.go Create: BeforeCreate fills uid and
        creationTimestamp; DryRunnableStorage.Create returns it without a resourceVersion)."""
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        group, version, kind, _namespaced = c.resources()[key]
        obj["apiVersion"] = f"{group}/{version}" if group else version
        obj["kind"] = kind
        meta["uid"] = str(uuid.UUID(hashlib.sha256(f"{c.id}|{key}|{meta.get('namespace', '')}|{meta['name']}|"
                                                   f"{self._dry_suffix()}".encode()).hexdigest()[:32]))
        meta["creationTimestamp"] = iso(self.fleet.now())
        if key == "pods":  # the defaults sim.model.Cluster.create_pod gives a stored pod
            spec = obj.setdefault("spec", {})
            for k, v in (("restartPolicy", "Always"), ("terminationGracePeriodSeconds", 30),
                         ("schedulerName", "default-scheduler"), ("dnsPolicy", "ClusterFirst"),
                         ("serviceAccountName", "default")):
                spec.setdefault(k, v)
            tolerations = spec.setdefault("tolerations", [])
            for tkey in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(t.get("key") == tkey for t in tolerations):
                    tolerations.append({"key": tkey, "operator": "Exists", "effect": "NoExecute",
                                        "tolerationSeconds": 300})
            for ctr in spec.get("containers") or []:
                ctr.setdefault("imagePullPolicy", "IfNotPresent")
                ctr.setdefault("terminationMessagePath", "/dev/termination-log")
                ctr.setdefault("terminationMessagePolicy", "File")
                ctr.setdefault("resources", {})
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif key == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {"phase": "Active"})
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        else:
            meta.setdefault("generation", 1)
        return obj

    @staticmethod
    def _preview_update(key: str, obj: KObj, new: dict[str, Any], *, status: bool) -> dict[str, Any]:
        """The object an update or patch would leave (DryRunnableStorage.GuaranteedUpdate runs the update
        function on the current object and returns the result unsaved: same resourceVersion)."""
        if not status and key == "pods":
            _check_pod_update(obj, new)
        current = msgspec.json.decode(obj.raw())
        current.update(copy.deepcopy(_update_fields(key, current, new, status=status)))
        current["metadata"]["resourceVersion"] = obj.meta.get("resourceVersion", "")
        return current

    def _preview_delete(self, c: Cluster, key: str, obj: KObj, opts: dict[str, Any]) -> Response:
        """What a delete would answer (store.go Delete with a dry run): a pod comes back marked for
        graceful deletion (deletionTimestamp = now + grace, the pod strategy's CheckGracefulDelete picks
        the grace); a namespace comes back Terminating (pkg/registry/core/namespace/storage); an object
        with finalizers or a Foreground deletion comes back with its deletionTimestamp set; anything else
        is deleted at once, and the answer is the Success Status (finalizeDelete)."""
        now = self.fleet.now()
        current = msgspec.json.decode(obj.raw())
        meta = current["metadata"]
        group = c.resources()[key][0]
        if isinstance(obj, Pod):
            if not meta.get("deletionTimestamp"):
                grace = opts.get("gracePeriodSeconds")
                grace = int((current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                            if grace is None else grace)
                if not obj.node_name or obj.phase in ("Succeeded", "Failed"):
                    grace = 0
                grace = 1 if grace < 0 else grace
                meta["deletionTimestamp"] = iso(now + grace)
                meta["deletionGracePeriodSeconds"] = grace
            return Response.json(200, current)
        if key == "namespaces":
            meta.setdefault("deletionTimestamp", iso(now))
            current.setdefault("status", {})["phase"] = "Terminating"
            return Response.json(200, current)
        policy = opts.get("propagationPolicy") or "Background"
        if key != "nodes" and (meta.get("finalizers") or policy == "Foreground"):
            if policy == "Foreground" and "foregroundDeletion" not in (meta.get("finalizers") or []):
                meta["finalizers"] = [*(meta.get("finalizers") or []), "foregroundDeletion"]
            meta.setdefault("deletionTimestamp", iso(now))
            meta.setdefault("deletionGracePeriodSeconds", 0)
            return Response.json(200, current)
        return _status_success(obj.name, group, key.split(".", 1)[0], obj.meta.get("uid", ""))

    def _delete(self, c: Cluster, req: Request, key: str, ns: str, name: str) -> Response:
        obj = c.get(key, ns, name)
        group = c.resources()[key][0]
        if obj is None:
            raise _not_found(key.split(".", 1)[0], name, group)
        opts = self._delete_options(req)
        dry = _dry_run(req, "DeleteOptions", opts)
        pre = (opts.get("preconditions") or {})
        if pre.get("uid") and pre["uid"] != obj.meta.get("uid"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {key} "{name}": Precondition failed: '
                           f"UID in precondition: {pre['uid']}, UID in object meta: {obj.meta.get('uid')}")
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != obj.meta.get("resourceVersion"):
            raise _conflict(key, name, group)
        if dry:
            return self._preview_delete(c, key, obj, opts)
        if isinstance(obj, Pod):
            grace = opts.get("gracePeriodSeconds")
            c.delete_pod(obj, grace=None if grace is None else int(grace), cause="delete")
            return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})
        if isinstance(obj, Node):
            c.delete_node(name, cause="node_object_deleted")
            return _status_success(name, group, "nodes", obj.meta.get("uid", ""))
        if key == "namespaces":
            # Terminating until the namespace controller has emptied it; 403 for the immortal ones,
            # 409 when termination is under way (Cluster.delete_namespace cites the sources).
            ns_obj = c.delete_namespace(name)
            return Response(status=200, body=ns_obj.raw(), headers={"Content-Type": "application/json"})
        policy = opts.get("propagationPolicy") or "Background"
        if policy == "Orphan":
            c.store[key].pop((ns, name), None)
            for pod in c.items("pods", ns):
                refs = pod.meta.get("ownerReferences") or []
                if any(r.get("uid") == obj.meta.get("uid") for r in refs):
                    pod.meta["ownerReferences"] = [r for r in refs if r.get("uid") != obj.meta.get("uid")]
                    c.touch(pod)
        else:
            c.remove(key, ns, name)
        return _status_success(name, group, key.split(".", 1)[0], obj.meta.get("uid", ""))

    def _delete_collection(self, c: Cluster, req: Request, key: str, ns: str | None) -> Response:
        if key in ("nodes", "namespaces"):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        opts = self._delete_options(req)
        dry = _dry_run(req, "DeleteOptions", opts)
        objs = self._select(c, req, key, ns)
        if dry:  # the list of what would go, each as its own dry-run delete would answer
            items = []
            for o in objs:
                answer = self._preview_delete(c, key, o, opts)
                items.append(json.loads(answer.body) if isinstance(o, Pod) else msgspec.json.decode(o.raw()))
            group, version, kind, _ = c.resources()[key]
            return Response.json(200, {"kind": f"{kind}List", "apiVersion": f"{group}/{version}" if group else version,
                                       "metadata": {"resourceVersion": str(c.rv)}, "items": items})
        for o in objs:
            if isinstance(o, Pod):
                c.delete_pod(o, cause="delete")
            else:
                c.remove(key, o.namespace, o.name)
        group, version, kind, _ = c.resources()[key]
        api_version = f"{group}/{version}" if group else version
        return Response.json(200, {"kind": f"{kind}List", "apiVersion": api_version,
                                   "metadata": {"resourceVersion": str(c.rv)},
                                   "items": [msgspec.json.decode(o.raw()) for o in objs]})

    def _delete_options(self, req: Request) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if req.body:
            try:
                raw = json.loads(req.body)
            except ValueError as e:
                raise ApiError(400, "BadRequest", f"couldn't decode DeleteOptions: {e}") from None
            if not isinstance(raw, dict):
                raise ApiError(400, "BadRequest", "DeleteOptions must be an object")
            opts.update(raw)
        if req.arg("gracePeriodSeconds") is not None:
            try:
                opts["gracePeriodSeconds"] = int(req.arg("gracePeriodSeconds") or "0")
            except ValueError:
                raise ApiError(400, "BadRequest", "gracePeriodSeconds must be an integer") from None
        if req.arg("propagationPolicy"):
            opts["propagationPolicy"] = req.arg("propagationPolicy")
        g = opts.get("gracePeriodSeconds")
        if g is not None and (not isinstance(g, int) or isinstance(g, bool)):
            raise ApiError(400, "BadRequest", "gracePeriodSeconds must be an integer")
        return opts

    # ---- eviction
    def _evict(self, c: Cluster, req: Request, ns: str, name: str) -> Response:
        """``POST pods/<name>/eviction``, answered as kubernetes/kubernetes
        pkg/registry/core/pod/storage/eviction.go (EvictionREST.Create, checkAndDecrement) does:

        - NamespaceLifecycle admission first: 403 Forbidden with cause ``NamespaceTerminating`` in a
          terminating namespace (an Eviction is a create), whatever the pod's state;
        - a pod that is Pending, Succeeded, Failed or already terminating is deleted without a PDB check;
        - more than one matching PDB: 500 (a Status with no reason);
        - an unready pod: deleted without using the budget when the PDB says
          ``unhealthyPodEvictionPolicy: AlwaysAllow``, or (IfHealthyBudget, the default) when
          ``currentHealthy >= desiredHealthy > 0``; otherwise it goes through checkAndDecrement;
        - checkAndDecrement, on the PDB's *stored* status, in this order: observedGeneration < generation
          -> 429 with Retry-After 10; disruptionsAllowed < 0 -> 403; more than 2000 disruptedPods -> 403;
          disruptionsAllowed == 0 -> 429 (no Retry-After); else one disruption is used and the pod is
          recorded in disruptedPods;
        - ``dryRun=All`` (query or deleteOptions) checks all of that and changes nothing.
        Deleting marks the pod ``DisruptionTarget`` (reason EvictionByEvictionAPI), then deletes it with
        the eviction's deleteOptions.
        """
        from sim.model import MAX_DISRUPTED_POD_SIZE

        body = self._body(req)
        if body.get("kind") not in (None, "Eviction") or body.get("apiVersion") not in (
                None, "policy/v1", "policy/v1beta1"):
            raise ApiError(400, "BadRequest", "the object provided is unrecognized (must be of type Eviction)")
        meta = body.get("metadata") or {}
        # admission (staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go)
        # runs before the eviction storage sees the request
        c.admit_create("pods", ns, str(meta.get("name") or name))
        if meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        opts = body.get("deleteOptions") or {}
        if not isinstance(opts, dict):
            raise ApiError(400, "BadRequest", "deleteOptions must be an object")
        _dry_run(req, "CreateOptions")  # the query's CreateOptions are validated first (422 for a bad value)
        if opts.get("dryRun") is not None and not isinstance(opts.get("dryRun"), list):
            raise ApiError(400, "BadRequest", "couldn't decode DeleteOptions: dryRun must be a list of strings")
        query_dry = [v for v in req.query.get("dryRun") or [] if v]
        body_dry = [str(v) for v in opts.get("dryRun") or []]
        if query_dry and body_dry and query_dry != body_dry:  # propagateDryRun: a plain error, so a 500
            return Response.json(500, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": f"Non-matching dry-run options in request and content: "
                                                  f"[{' '.join(query_dry)}] and [{' '.join(body_dry)}]",
                                       "code": 500})
        # dryrun.IsDryRun is len(dryRun) > 0: a bad value in deleteOptions makes the budget check and the
        # DisruptionTarget update dry runs too, and the delete then refuses it (below, in delete())
        dry = bool(query_dry or body_dry)
        pod = c.pods.get((ns, name))
        if pod is None:
            raise _not_found("pods", name)
        pre = opts.get("preconditions") or {}
        grace = opts.get("gracePeriodSeconds")
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
            raise ApiError(400, "BadRequest", "deleteOptions.gracePeriodSeconds must be an integer")
        ok = Response.json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                 "code": 201})

        def delete() -> None:
            # the store's Delete validates the (propagated) deleteOptions first: a dryRun other than "All" is a
            # 422 and nothing changes (staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete ->
            # staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go ValidateDeleteOptions)
            _dry_run(req, "DeleteOptions", opts)
            # the delete checks the caller's preconditions (after the budget checks, as on the server)
            for field_name, have in (("uid", pod.meta.get("uid")),
                                     ("resourceVersion", pod.meta.get("resourceVersion"))):
                want = pre.get(field_name)
                if not want or str(want) == str(have):
                    continue
                label = "UID" if field_name == "uid" else "ResourceVersion"
                if dry:  # the store's Preconditions.Check, through InterpretDeleteError
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": Precondition '
                                   f"failed: {label} in precondition: {want}, {label} in object meta: {have}",
                                   {"name": name, "kind": "pods"})
                # addConditionAndDeletePod: the pod update that adds DisruptionTarget checks them first
                tail = ("The object might have been deleted and then recreated" if field_name == "uid"
                        else "The object might have been modified")
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on Pod "{name}": the {label} in the '
                               f"precondition ({want}) does not match the {label} in record ({have}). {tail}",
                               {"name": name, "kind": "Pod"})
            if dry:
                return
            now = iso(self.fleet.now())
            conds = [x for x in pod.obj["status"].get("conditions") or [] if x.get("type") != "DisruptionTarget"]
            conds.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now, "reason": "EvictionByEvictionAPI",
                          "message": "Eviction API: evicting"})
            pod.obj["status"]["conditions"] = conds
            pod.invalidate()
            c.delete_pod(pod, grace=grace, cause="eviction")

        # canIgnorePDB: the pod has already stopped or never started, or is already being deleted
        if pod.terminating or pod.phase in ("Pending", "Succeeded", "Failed"):
            delete()
            return ok
        pdbs = c.pdbs_for(pod)
        if len(pdbs) > 1:
            return Response.json(500, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": "This pod has more than one PodDisruptionBudget, which the "
                                                  "eviction subresource does not support.", "code": 500})
        if not pdbs:
            delete()
            return ok
        pdb = pdbs[0]
        st = pdb.obj.get("status") or {}
        ready = any(x.get("type") == "Ready" and x.get("status") == "True"
                    for x in pod.obj["status"].get("conditions") or [])
        if not ready:
            policy = (pdb.obj.get("spec") or {}).get("unhealthyPodEvictionPolicy")
            current, desired = int(st.get("currentHealthy") or 0), int(st.get("desiredHealthy") or 0)
            if policy == "AlwaysAllow" or (current >= desired and desired > 0):
                delete()  # an unready pod does not count as healthy: the budget is not used
                return ok
        budget_cause = "DisruptionBudget"  # policyv1.DisruptionBudgetCause
        if int(st.get("observedGeneration") or 0) < int(pdb.meta.get("generation") or 1):
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": budget_cause, "message": f"The disruption budget {pdb.name} is "
                                                                           "still being processed by the server."}],
                            "retryAfterSeconds": 10}, headers={"Retry-After": "10"})
        allowed = int(st.get("disruptionsAllowed") or 0)
        forbidden = ("pdb disruptions allowed is negative" if allowed < 0 else
                     "DisruptedPods map too big - too many evictions not confirmed by PDB controller"
                     if len(st.get("disruptedPods") or {}) > MAX_DISRUPTED_POD_SIZE else "")
        if forbidden:
            raise ApiError(403, "Forbidden", f'poddisruptionbudget.policy "{pdb.name}" is forbidden: {forbidden}',
                           {"name": pdb.name, "group": "policy", "kind": "poddisruptionbudget"})
        if allowed == 0:
            # retryAfterSeconds 0: no Retry-After, clients retry on their own schedule
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": budget_cause,
                                        "message": f"The disruption budget {pdb.name} needs "
                                                   f"{int(st.get('desiredHealthy') or 0)} healthy pods and has "
                                                   f"{int(st.get('currentHealthy') or 0)} currently"}]})
        if not dry:
            c.record_pdb_eviction(pdb, pod.name)
        delete()
        return ok


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


# --------------------------------------------------------------------------- tables (kubectl get)


def _wants_table(req: Request) -> bool:
    accept = req.headers.get("accept") or ""
    return "as=Table" in accept


def _age(c: Cluster, obj: KObj) -> str:
    try:
        secs = max(0, int(c.fleet.now() - parse_iso(obj.meta.get("creationTimestamp", ""))))
    except ValueError:
        return "<unknown>"
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def _table(c: Cluster, key: str, objs: list[KObj]) -> dict[str, Any]:
    def col(name: str, typ: str = "string") -> dict[str, Any]:
        return {"name": name, "type": typ, "format": "name" if name == "Name" else "", "description": name,
                "priority": 0}

    if key == "nodes":
        cols = [col("Name"), col("Status"), col("Roles"), col("Age"), col("Version")]

        def cells(o: KObj) -> list[Any]:
            assert isinstance(o, Node)
            status = "Ready" if o.ready else "NotReady"
            if o.unschedulable:
                status += ",SchedulingDisabled"
            return [o.name, status, "<none>", _age(c, o), o.obj["status"]["nodeInfo"]["kubeletVersion"]]
    elif key == "pods":
        cols = [col("Name"), col("Ready"), col("Status"), col("Restarts", "string"), col("Age"), col("Node")]

        def cells(o: KObj) -> list[Any]:
            st = o.obj.get("status") or {}
            cs = st.get("containerStatuses") or []
            total = len((o.obj.get("spec") or {}).get("containers") or [])
            ready = sum(1 for x in cs if x.get("ready"))
            phase = "Terminating" if o.meta.get("deletionTimestamp") else st.get("phase", "Pending")
            if phase == "Succeeded":
                phase = "Completed"
            return [o.name, f"{ready}/{total}", phase, "0", _age(c, o), (o.obj.get("spec") or {}).get("nodeName") or
                    "<none>"]
    elif key == "deployments.apps":
        cols = [col("Name"), col("Ready"), col("Up-to-date", "integer"), col("Available", "integer"), col("Age")]

        def cells(o: KObj) -> list[Any]:
            st, want = o.obj.get("status") or {}, (o.obj.get("spec") or {}).get("replicas", 1)
            return [o.name, f"{st.get('readyReplicas', 0)}/{want}", st.get("updatedReplicas", 0),
                    st.get("availableReplicas", 0), _age(c, o)]
    elif key == "poddisruptionbudgets.policy":
        cols = [col("Name"), col("Min Available"), col("Max Unavailable"), col("Allowed Disruptions", "integer"),
                col("Age")]

        def cells(o: KObj) -> list[Any]:
            spec, st = o.obj.get("spec") or {}, o.obj.get("status") or {}
            return [o.name, str(spec.get("minAvailable", "N/A")), str(spec.get("maxUnavailable", "N/A")),
                    st.get("disruptionsAllowed", 0), _age(c, o)]
    elif key == "namespaces":  # pkg/printers/internalversion/printers.go printNamespace: NAME STATUS AGE
        cols = [col("Name"), col("Status"), col("Age")]

        def cells(o: KObj) -> list[Any]:
            return [o.name, str((o.obj.get("status") or {}).get("phase") or "Active"), _age(c, o)]
    else:
        cols = [col("Name"), col("Age")]

        def cells(o: KObj) -> list[Any]:
            return [o.name, _age(c, o)]

    rows = []
    for o in objs:
        meta = {k: v for k, v in o.meta.items() if k != "managedFields"}
        rows.append({"cells": cells(o), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                                   "metadata": meta}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(c.rv)},
            "columnDefinitions": cols, "rows": rows}


# --------------------------------------------------------------------------- selectors


# The field labels each kind accepts and how an unknown one is refused: kubernetes/kubernetes
# pkg/apis/core/v1/conversion.go (AddFieldLabelConversionFunc for Pod, Node, Event, Namespace) and
# staging/src/k8s.io/apimachinery/pkg/runtime/conversion.go (DefaultMetaV1FieldSelectorConversion).
_FIELD_OK = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.restartPolicy",
             "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.podIP", "status.podIPs",
             "status.nominatedNodeName"},
    # Node's conversion func accepts exactly these two; even metadata.namespace is "field label not supported"
    "nodes": {"metadata.name", "spec.unschedulable"},
    "namespaces": {"metadata.name", "status.phase"},
    "events": {"metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
               "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent",
               "source", "type"},
}
_FIELD_NOT_SUPPORTED = {"pods", "nodes", "namespaces", "events"}  # "field label not supported: X"; others: the default text


def _field_terms(text: str) -> list[str]:
    """fields.splitTerms: split at commas that are not backslash-escaped."""
    terms, start, escaped = [], 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _unescape_field_value(value: str) -> str:
    """fields.UnescapeValue: ``\\``, ``\\,`` and ``\\=`` are escapes; a bare ``,`` or ``=`` is an error."""
    if not any(ch in value for ch in "\\,="):
        return value
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise ApiError(400, "BadRequest", f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise ApiError(400, "BadRequest", f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if escaped:
        raise ApiError(400, "BadRequest", "invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def _parse_field_selector(text: str, key: str) -> list[tuple[str, str, str]]:
    """A port of staging/src/k8s.io/apimachinery/pkg/fields/selector.go parseSelector (terms split at
    unescaped commas, split at the first ``!=``, ``==`` or ``=``, no trimming, values unescaped), then the
    kind's field label conversion; every failure is a 400 BadRequest with the real text."""
    out = []
    if not text:
        return out
    for part in sorted(_field_terms(text)):
        if part == "":
            continue
        split = None
        for i in range(len(part)):
            for op in ("!=", "==", "="):
                if part.startswith(op, i):
                    split = (part[:i], op, part[i + len(op):])
                    break
            if split:
                break
        if split is None:
            raise ApiError(400, "BadRequest", f"invalid selector: '{text}'; can't understand '{part}'")
        f, op, raw = split
        value = _unescape_field_value(raw)
        allowed = _FIELD_OK.get(key, {"metadata.name", "metadata.namespace"})
        if f == "spec.host" and key == "pods":  # old v1 clients; the conversion maps it
            f = "spec.nodeName"
        if f not in allowed:
            if key in _FIELD_NOT_SUPPORTED:
                raise ApiError(400, "BadRequest", f"field label not supported: {f}")
            raise ApiError(400, "BadRequest", f'"{f}" is not a known field selector: only "metadata.name", '
                           '"metadata.namespace"')
        out.append((f, "!=" if op == "!=" else "=", value))
    return out


def _field_ok(o: KObj, f: str, op: str, v: str) -> bool:
    cur: Any = o.obj
    for part in f.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if isinstance(cur, bool):
        cur = "true" if cur else "false"
    if cur is None:
        cur = "false" if f == "spec.unschedulable" else ""
    return (str(cur) == v) if op == "=" else (str(cur) != v)


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""


class _MetaOnly(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


def _encode_continue(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _decode_continue(token: str) -> dict[str, Any]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return data
    except (ValueError, TypeError):
        raise ApiError(400, "BadRequest", "continue key is not valid: illegal base64 data") from None


# --------------------------------------------------------------------------- validation


def _conflict(key: str, name: str, group: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {key} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": group, "kind": key.split(".", 1)[0]})


def _validate_pod_spec(spec: Any, path: str) -> list[tuple[str, str, str]]:
    causes: list[tuple[str, str, str]] = []
    if not isinstance(spec, dict):
        return [(path, "Required value", "FieldValueRequired")]
    containers = spec.get("containers")
    if not containers or not isinstance(containers, list):
        return [(f"{path}.containers", "Required value", "FieldValueRequired")]
    for i, ctr in enumerate(containers):
        if not isinstance(ctr, dict) or not ctr.get("name"):
            causes.append((f"{path}.containers[{i}].name", "Required value", "FieldValueRequired"))
            continue
        if not ctr.get("image"):
            causes.append((f"{path}.containers[{i}].image", "Required value", "FieldValueRequired"))
        res = ctr.get("resources") or {}
        for kind in ("requests", "limits"):
            for rname, qty in (res.get(kind) or {}).items():
                try:
                    parse_quantity(qty)
                except ValueError:
                    causes.append((f"{path}.containers[{i}].resources.{kind}[{rname}]",
                                   f'Invalid value: "{qty}": quantities must match the regular expression',
                                   "FieldValueInvalid"))
    return causes


def _validate(key: str, obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    spec = obj.get("spec")
    labels = (obj.get("metadata") or {}).get("labels") or {}
    causes: list[tuple[str, str, str]] = []
    if not isinstance(labels, dict):
        return [("metadata.labels", "Invalid value: must be a map", "FieldValueInvalid")]
    for v in labels.values():
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE_RE.match(v):
            causes.append(("metadata.labels", f'Invalid value: "{v}": a valid label must be an empty string or '
                           "consist of alphanumeric characters, '-', '_' or '.'", "FieldValueInvalid"))
    if key == "pods":
        causes += _validate_pod_spec(spec, "spec")
    elif key in ("deployments.apps", "replicasets.apps", "statefulsets.apps", "daemonsets.apps", "jobs.batch"):
        if not isinstance(spec, dict):
            return [("spec", "Required value", "FieldValueRequired")]
        tmpl = spec.get("template") or {}
        causes += _validate_pod_spec(tmpl.get("spec"), "spec.template.spec")
        sel = spec.get("selector")
        tlabels = (tmpl.get("metadata") or {}).get("labels") or {}
        if key != "jobs.batch" or sel:
            if not sel:
                causes.append(("spec.selector", "Required value", "FieldValueRequired"))
            elif not match_requirements(tlabels, selector_requirements(sel)):
                causes.append(("spec.template.metadata.labels", f"Invalid value: {tlabels!r}: `selector` does not "
                               "match template `labels`", "FieldValueInvalid"))
        replicas = spec.get("replicas")
        if replicas is not None and (not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0):
            causes.append(("spec.replicas", f"Invalid value: {replicas}: must be greater than or equal to 0",
                           "FieldValueInvalid"))
    elif key == "poddisruptionbudgets.policy":
        if not isinstance(spec, dict):
            return [("spec", "Required value", "FieldValueRequired")]
        if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
            causes.append(("spec", "Invalid value: minAvailable and maxUnavailable cannot be both set",
                           "FieldValueInvalid"))
        for f in ("minAvailable", "maxUnavailable"):
            v = spec.get(f)
            if v is None:
                continue
            if isinstance(v, str):
                if not re.fullmatch(r"\d+%", v) or int(v[:-1]) > 100:
                    causes.append((f"spec.{f}", f'Invalid value: "{v}": must be an integer or percentage',
                                   "FieldValueInvalid"))
            elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
                causes.append((f"spec.{f}", f"Invalid value: {v}: must be greater than or equal to 0",
                               "FieldValueInvalid"))
    elif key == "nodes":
        if isinstance(spec, dict):
            u = spec.get("unschedulable")
            if u is not None and not isinstance(u, bool):
                causes.append(("spec.unschedulable", "Invalid value: must be a boolean", "FieldValueInvalid"))
            taints = spec.get("taints") or []
            if not isinstance(taints, list):
                causes.append(("spec.taints", "Invalid value: must be a list", "FieldValueInvalid"))
            else:
                seen = set()
                for i, t in enumerate(taints):
                    if not isinstance(t, dict) or not t.get("key"):
                        causes.append((f"spec.taints[{i}].key", "Required value", "FieldValueRequired"))
                        continue
                    if t.get("effect") not in _TAINT_EFFECTS:
                        causes.append((f"spec.taints[{i}].effect", f'Unsupported value: "{t.get("effect")}": '
                                       'supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"',
                                       "FieldValueNotSupported"))
                    if (t.get("key"), t.get("effect")) in seen:
                        causes.append((f"spec.taints[{i}]", "Duplicate value: taints must be unique by key and effect",
                                       "FieldValueDuplicate"))
                    seen.add((t.get("key"), t.get("effect")))
        conds = ((obj.get("status") or {}).get("conditions")) or []
        for i, cond in enumerate(conds if isinstance(conds, list) else []):
            if not isinstance(cond, dict) or not cond.get("type"):
                causes.append((f"status.conditions[{i}].type", "Required value", "FieldValueRequired"))
            elif cond.get("status") not in ("True", "False", "Unknown"):
                causes.append((f"status.conditions[{i}].status", f'Unsupported value: "{cond.get("status")}"',
                               "FieldValueNotSupported"))
    elif key == "leases.coordination.k8s.io":
        if spec is not None and not isinstance(spec, dict):
            causes.append(("spec", "Invalid value: must be an object", "FieldValueInvalid"))
        elif isinstance(spec, dict):
            d = spec.get("leaseDurationSeconds")
            if d is not None and (not isinstance(d, int) or d <= 0):
                causes.append(("spec.leaseDurationSeconds", f"Invalid value: {d}: must be greater than 0",
                               "FieldValueInvalid"))
    elif key in ("events", "events.events.k8s.io"):
        if key == "events" and not obj.get("involvedObject"):
            causes.append(("involvedObject", "Required value", "FieldValueRequired"))
        if key == "events.events.k8s.io" and not obj.get("reportingController"):
            causes.append(("reportingController", "Required value", "FieldValueRequired"))
    return causes


def _check_pod_update(pod: KObj, new: dict[str, Any]) -> None:
    old_spec = pod.obj.get("spec") or {}
    new_spec = new.get("spec") or {}
    allowed = {"activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"}
    for k in set(old_spec) | set(new_spec):
        if k in allowed or k == "containers":
            continue
        if old_spec.get(k) != new_spec.get(k):
            raise _invalid("Pod", pod.name, [("spec", "Forbidden: pod updates may not change fields other than "
                                              "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, "
                                              "`spec.tolerations` (only additions to existing tolerations), "
                                              "`spec.terminationGracePeriodSeconds`", "FieldValueForbidden")])
    oc, nc = old_spec.get("containers") or [], new_spec.get("containers") or []
    strip = [{k: v for k, v in c.items() if k != "image"} for c in oc]
    if len(oc) != len(nc) or strip != [{k: v for k, v in c.items() if k != "image"} for c in nc]:
        raise _invalid("Pod", pod.name, [("spec", "Forbidden: pod updates may not change fields other than "
                                          "`spec.containers[*].image`", "FieldValueForbidden")])


def _update_fields(key: str, old: dict[str, Any], new: dict[str, Any], *, status: bool) -> dict[str, Any]:
    """The top-level fields an update through the main or the status endpoint sets on ``old`` (pure):
    the status endpoint changes only the status; the main one the spec (and the other top-level
    fields), the user-settable metadata, and the generation when a non-pod, non-node spec changes."""
    old_meta = old.get("metadata") or {}
    if status:
        out: dict[str, Any] = {"metadata": dict(old_meta)}
        if "status" in new:
            out["status"] = new["status"]
        return out
    new_meta = new.get("metadata") or {}
    keep = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
            "ownerReferences", "generation")
    merged_meta = {k: v for k, v in new_meta.items() if k not in keep and k != "resourceVersion"}
    for k in keep:
        if k == "ownerReferences" and "ownerReferences" in new_meta:
            merged_meta[k] = new_meta[k]
        elif k in old_meta:
            merged_meta[k] = old_meta[k]
    out = {}
    if "spec" in new:
        out["spec"] = new["spec"]
    if key in ("events", "events.events.k8s.io", "configmaps") and "status" in new:
        out["status"] = new["status"]
    for extra in set(new) - {"metadata", "spec", "status", "kind", "apiVersion"}:
        out[extra] = new[extra]
    if "spec" in new and new.get("spec") != old.get("spec") and key not in ("nodes", "pods"):
        merged_meta["generation"] = int(old_meta.get("generation", 1)) + 1
    out["metadata"] = merged_meta
    return out


def _dry_run(req: Request, options_kind: str, body_options: dict[str, Any] | None = None) -> bool:
    """Whether the request is a dry run (``?dryRun=All``, or ``dryRun: [All]`` in DeleteOptions); any other
    value is refused as the apiserver's ValidateDryRun refuses it
    (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go), with a 422."""
    values = list(req.query.get("dryRun") or [])
    extra = (body_options or {}).get("dryRun")
    if isinstance(extra, list):
        values += [str(v) for v in extra]
    elif extra is not None:
        raise ApiError(400, "BadRequest", f"couldn't decode {options_kind}: dryRun must be a list of strings")
    if not values:
        return False
    if any(v != "All" for v in values):
        shown = "[]string{" + ", ".join(json.dumps(v) for v in values) + "}"
        message = f'Unsupported value: {shown}: supported values: "All"'
        raise ApiError(422, "Invalid", f'{options_kind}.meta.k8s.io "" is invalid: dryRun: {message}',
                       {"group": "meta.k8s.io", "kind": options_kind,
                        "causes": [{"reason": "FieldValueNotSupported", "message": message, "field": "dryRun"}]})
    return True


def _status_success(name: str, group: str, kind: str, uid: str) -> Response:
    return Response.json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "details": {"name": name, "group": group, "kind": kind, "uid": uid}})


# --------------------------------------------------------------------------- patches


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v)
    return out


def _strategic_patch(target: Any, patch: Any, field_name: str) -> Any:
    """Strategic merge patch: lists with a merge key (taints by key+effect, conditions by type, ...)
    are merged element-wise; ``$patch: delete``/``replace``, ``$retainKeys``, ``$setElementOrder`` and
    ``$deleteFromPrimitiveList`` directives are honoured."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k in ("$retainKeys", "$patch"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            out[name] = [x for x in out.get(name) or [] if x not in (v or [])]
            continue
        if v is None:
            out.pop(k, None)
            continue
        merge_key = _STRATEGIC_KEYS.get(k)
        if isinstance(v, list) and merge_key:
            out[k] = _merge_list(out[k] if isinstance(out.get(k), list) else [], v, merge_key)
        elif isinstance(v, list) and k in _STRATEGIC_PRIMITIVE_MERGE:
            current = out[k] if isinstance(out.get(k), list) else []
            out[k] = [*current, *[x for x in v if x not in current]]
        elif isinstance(v, list):
            # replaced whole; a "$patch" directive inside such a list means nothing to the server, and the
            # unknown field is dropped when the object is decoded
            out[k] = [{ik: iv for ik, iv in x.items() if ik != "$patch"} if isinstance(x, dict) else x
                      for x in copy.deepcopy(v)]
        elif isinstance(v, dict):
            merged = _strategic_patch(out.get(k), v, k)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = copy.deepcopy(v)
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(current: list[Any], patch: list[Any], keys: tuple[str, ...]) -> list[Any]:
    out = [copy.deepcopy(x) for x in current]

    def ident(x: Any) -> tuple[Any, ...] | None:
        if not isinstance(x, dict):
            return None
        present = [k for k in keys if k in x]
        if not present:
            return None
        return tuple(x.get(k) for k in keys) if len(present) == len(keys) else tuple(x.get(k) for k in present)

    for item in patch:
        if isinstance(item, dict) and item.get("$patch") == "replace":
            return [x for x in patch if not (isinstance(x, dict) and x.get("$patch"))]
        iid = ident(item)
        idx = None
        if iid is not None:
            for i, x in enumerate(out):
                xid = ident(x)
                if xid is not None and xid[: len(iid)] == iid:
                    idx = i
                    break
        if isinstance(item, dict) and item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(copy.deepcopy(item))
        else:
            out[idx] = _strategic_patch(out[idx], item, "")
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    doc = copy.deepcopy(doc)

    def parent(d: Any, parts: list[str]) -> tuple[Any, str]:
        cur = d
        for p in parts[:-1]:
            if isinstance(cur, list):
                try:
                    cur = cur[int(p)]
                except (ValueError, IndexError):
                    raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our "
                                   f"request: path segment {p!r} not found") from None
            elif isinstance(cur, dict) and p in cur:
                cur = cur[p]
            else:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                               f"doc is missing path: {'/' + '/'.join(parts)}")
        return cur, parts[-1]

    def get(d: Any, parts: list[str]) -> Any:
        if not parts:
            return d
        par, last = parent(d, parts)
        try:
            return par[int(last)] if isinstance(par, list) else par[last]
        except (KeyError, IndexError, ValueError):
            raise ApiError(422, "Invalid", f"doc is missing path: /{'/'.join(parts)}") from None

    def add(d: Any, parts: list[str], value: Any) -> Any:
        if not parts:
            return value
        par, last = parent(d, parts)
        if isinstance(par, list):
            if last == "-":
                par.append(value)
            else:
                try:
                    i = int(last)
                except ValueError:
                    raise ApiError(422, "Invalid", f"invalid array index {last!r}") from None
                if i > len(par):
                    raise ApiError(422, "Invalid", f"array index {i} out of bounds")
                par.insert(i, value)
        elif isinstance(par, dict):
            par[last] = value
        else:
            raise ApiError(422, "Invalid", "cannot add to a scalar")
        return d

    def remove(d: Any, parts: list[str]) -> Any:
        par, last = parent(d, parts)
        try:
            if isinstance(par, list):
                par.pop(int(last))
            else:
                del par[last]
        except (KeyError, IndexError, ValueError):
            raise ApiError(422, "Invalid", f"doc is missing path: /{'/'.join(parts)}") from None
        return d

    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, "BadRequest", "json patch operations need 'op' and 'path'")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = remove(doc, parts)
        elif kind == "replace":
            get(doc, parts)
            doc = add(remove(doc, parts), parts, copy.deepcopy(op.get("value"))) if parts else op.get("value")
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = copy.deepcopy(get(doc, src))
            if kind == "move":
                doc = remove(doc, src)
            doc = add(doc, parts, value)
        elif kind == "test":
            if get(doc, parts) != op.get("value"):
                raise ApiError(422, "Invalid", f"testing value /{'/'.join(parts)} failed")
        else:
            raise ApiError(400, "BadRequest", f"unexpected json patch operation {kind!r}")
    return doc

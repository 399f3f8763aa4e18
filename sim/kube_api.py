"""The Kubernetes API servers of the simulated clusters, all behind one path-prefixed handler.

``https://127.0.0.1:PORT/k8s/<sub>/<rg>/<cluster>/...`` is the API server of that cluster. It speaks
enough of the real protocol (discovery, JSON objects, Status errors with the real codes, label and
field selectors, limit/continue pagination, merge / strategic-merge / JSON patches, the eviction
subresource, optimistic concurrency, watch streams, server-side tables for ``kubectl get``) that the
kubernetes Python client and ``kubectl`` work against it unchanged. Not served: server-side apply,
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
import itertools
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import msgspec

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
_STRATEGIC_KEYS = {"taints": ("key", "effect"), "conditions": ("type",), "containers": ("name",),
                   "initContainers": ("name",), "env": ("name",), "volumes": ("name",), "volumeMounts": ("mountPath",),
                   "ports": ("containerPort",), "ownerReferences": ("uid",), "addresses": ("type",),
                   "tolerations": None, "imagePullSecrets": ("name",)}
_MAX_SNAPSHOTS = 16  # per cluster; a snapshot holds the bytes of the objects as they were


class ApiError(Exception):
    """An error the API server answers with a Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details, self.headers = code, reason, message, details, headers

    def response(self) -> Response:
        r = Response.kube_status(self.code, self.reason, self.message, self.details)
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
        faults = getattr(fleet, "faults", None)
        if faults is not None:
            hit = faults.match(target="kube", method=request.method, path=request.path, cluster=cluster.name)
            if hit is not None:
                if getattr(hit, "replaces_answer", True):
                    return hit
                delay = float(getattr(hit, "delay_s", 0.0) or 0.0)
        verdict = fleet.tokens.verify(request.bearer, AKS_AUDIENCES)
        rest = parts[4:]
        if verdict.status == 401:
            resp = ApiError(401, "Unauthorized", "Unauthorized").response()
        elif verdict.status == 403:
            resp = ApiError(403, "Forbidden", f'forbidden: User "{verdict.principal or "unknown"}" cannot '
                            f'{request.method.lower()} path "/{"/".join(rest)}": {verdict.reason}',
                            {"kind": rest[-1] if rest else ""}).response()
        else:
            try:
                with fleet.lock:
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
            raws, rv, offset = self._continue(c, cont)
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
        return base64.urlsafe_b64encode(json.dumps({"s": sid, "o": end, "rv": rv}).encode()).decode().rstrip("=")

    @staticmethod
    def _continue(c: Cluster, token: str) -> tuple[list[bytes], str, int]:
        data = _decode_continue(token)
        snap = c.list_snapshots.get(str(data.get("s")))
        if snap is None:
            raise ApiError(410, "Expired", "The provided continue parameter is too old to display a consistent list "
                           "result. You can start a new list without the continue parameter.")
        return snap[1], snap[0], int(data.get("o", 0))

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
            meta["name"] = f"{meta['generateName']}{self.fleet.rand_suffix(5)}"
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
        if req.arg("dryRun") == "All":
            return Response.json(201, body)
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            meta.pop(k, None)
        if key == "pods":
            kobj: KObj = c.create_pod(body)
        elif key == "nodes":
            raise ApiError(403, "Forbidden", "nodes are created by the cloud provider in this simulator")
        else:
            kobj = c.put(key, body)
        return Response(status=201, body=kobj.raw(), headers={"Content-Type": "application/json"})

    def _update(self, c: Cluster, req: Request, key: str, ns: str, name: str, *, status: bool) -> Response:
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
        self._commit(c, key, obj, new, status=status)
        return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})

    def _patch(self, c: Cluster, req: Request, key: str, ns: str, name: str, *, status: bool) -> Response:
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
        self._commit(c, key, obj, new, status=status)
        return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})

    def _commit(self, c: Cluster, key: str, obj: KObj, new: dict[str, Any], *, status: bool) -> None:
        """Apply an updated object: which parts may change depends on the endpoint (main or status)."""
        old_meta = obj.meta
        new_meta = new.get("metadata") or {}
        keep = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                "ownerReferences", "generation")
        merged_meta = {k: v for k, v in new_meta.items() if k not in keep and k != "resourceVersion"}
        for k in keep:
            if k == "ownerReferences" and "ownerReferences" in new_meta:
                merged_meta[k] = new_meta[k]
            elif k in old_meta:
                merged_meta[k] = old_meta[k]
        if status:
            merged_meta = dict(old_meta)
            if "status" in new:
                obj.obj["status"] = new["status"]
            if isinstance(obj, Node):
                obj.obj["status"].setdefault("conditions", [])
        else:
            if key == "pods":
                _check_pod_update(obj, new)
            spec_changed = "spec" in new and new.get("spec") != obj.obj.get("spec")
            if "spec" in new:
                obj.obj["spec"] = new["spec"]
            if key not in ("nodes", "pods") and "status" in new and key in ("events", "events.events.k8s.io",
                                                                          "configmaps"):
                obj.obj["status"] = new["status"]
            for extra in set(new) - {"metadata", "spec", "status", "kind", "apiVersion"}:
                obj.obj[extra] = new[extra]
            if spec_changed and key not in ("nodes", "pods"):
                merged_meta["generation"] = int(old_meta.get("generation", 1)) + 1
        obj.obj["metadata"] = merged_meta
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

    def _delete(self, c: Cluster, req: Request, key: str, ns: str, name: str) -> Response:
        obj = c.get(key, ns, name)
        group = c.resources()[key][0]
        if obj is None:
            raise _not_found(key.split(".", 1)[0], name, group)
        opts = self._delete_options(req)
        pre = (opts.get("preconditions") or {})
        if pre.get("uid") and pre["uid"] != obj.meta.get("uid"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {key} "{name}": Precondition failed: '
                           f"UID in precondition: {pre['uid']}, UID in object meta: {obj.meta.get('uid')}")
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != obj.meta.get("resourceVersion"):
            raise _conflict(key, name, group)
        if req.arg("dryRun") == "All":
            return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})
        if isinstance(obj, Pod):
            grace = opts.get("gracePeriodSeconds")
            c.delete_pod(obj, grace=None if grace is None else int(grace), cause="delete")
            return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})
        if isinstance(obj, Node):
            c.delete_node(name, cause="node_object_deleted")
            return _status_success(name, group, "nodes", obj.meta.get("uid", ""))
        if key == "namespaces":
            for pod in c.items("pods", name):
                c.delete_pod(pod, cause="owner_deleted")
            for res in list(c.store):
                if res != "namespaces":
                    for o in c.items(res, name):
                        c.remove(res, name, o.name)
            c.remove("namespaces", "", name)
            obj.obj.setdefault("status", {})["phase"] = "Terminating"
            obj.meta["deletionTimestamp"] = iso(self.fleet.now())
            obj.invalidate()
            return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json"})
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
        objs = self._select(c, req, key, ns)
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
        body = self._body(req)
        if body.get("kind") not in (None, "Eviction") or body.get("apiVersion") not in (
                None, "policy/v1", "policy/v1beta1"):
            raise ApiError(400, "BadRequest", "the object provided is unrecognized (must be of type Eviction)")
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = c.pods.get((ns, name))
        if pod is None:
            raise _not_found("pods", name)
        opts = body.get("deleteOptions") or {}
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != pod.meta.get("uid"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": Precondition failed')
        ok = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        if pod.terminating or pod.phase in ("Succeeded", "Failed"):
            if not pod.terminating:
                c.delete_pod(pod, grace=0, cause="eviction")
            return Response.json(201, ok)
        pdbs = c.pdbs_for(pod)
        if len(pdbs) > 1:
            raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction "
                           "subresource does not support.")
        blockers = c.disruption_blockers(pod)
        if blockers:
            pdb, st = blockers[0]
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": "DisruptionBudget",
                                        "message": f"The disruption budget {pdb.name} needs {st['desiredHealthy']} "
                                                   f"healthy pods and has {st['currentHealthy']} currently"}]})
            # as the real server: no Retry-After (retryAfterSeconds 0), so clients retry on their own schedule
        grace = opts.get("gracePeriodSeconds")
        c.delete_pod(pod, grace=None if grace is None else int(grace), cause="eviction")
        return Response.json(201, ok)


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


_FIELD_OK = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.restartPolicy",
             "spec.schedulerName", "spec.serviceAccountName", "status.podIP", "status.nominatedNodeName"},
    "nodes": {"metadata.name", "spec.unschedulable"},
}


def _parse_field_selector(text: str, key: str) -> list[tuple[str, str, str]]:
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        if "!=" in part:
            f, v = part.split("!=", 1)
            op = "!="
        elif "==" in part:
            f, v = part.split("==", 1)
            op = "="
        elif "=" in part:
            f, v = part.split("=", 1)
            op = "="
        else:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part!r}")
        f = f.strip()
        allowed = _FIELD_OK.get(key, {"metadata.name", "metadata.namespace"})
        if f not in allowed:
            raise ApiError(400, "BadRequest", f'"{f}" is not a known field selector: only "'
                           + '", "'.join(sorted(allowed)) + '"')
        out.append((f, op, v.strip()))
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
        if isinstance(v, list) and merge_key and isinstance(out.get(k), list):
            out[k] = _merge_list(out[k], v, merge_key)
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

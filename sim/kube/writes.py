"""Writes on the simulated API servers: create, update, patch, delete and deletecollection, with
optimistic concurrency and ``dryRun=All`` (which runs every check and changes nothing).
"""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from typing import TYPE_CHECKING, Any

import msgspec

from sim.core.http import Request, Response
from sim.kube import openapi, psa
from sim.kube.errors import ApiError, conflict, invalid, not_found
from sim.kube.objects import KObj, Node, Pod, iso, pod_requests
from sim.kube.patch import json_patch, merge_patch, strategic_patch
from sim.kube.validation import NAME_RE, check_pod_update, update_fields, validate

if TYPE_CHECKING:
    from sim.model import Cluster


def dry_run(req: Request, options_kind: str, body_options: dict[str, Any] | None = None) -> bool:
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


def field_validation(req: Request, options_kind: str) -> str:
    """The request's ``fieldValidation`` directive ("" means the server's default, Warn); any other
    value is 422 on the options (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go
    ``ValidateFieldValidation``)."""
    values = list(req.query.get("fieldValidation") or [])
    value = values[-1] if values else ""
    if value not in openapi.DIRECTIVES:
        message = f'Unsupported value: "{value}": supported values: "", "Ignore", "Strict", "Warn"'
        raise ApiError(422, "Invalid", f'{options_kind}.meta.k8s.io "" is invalid: fieldValidation: {message}',
                       {"group": "meta.k8s.io", "kind": options_kind,
                        "causes": [{"reason": "FieldValueNotSupported", "message": message, "field": "fieldValidation"}]})
    return value or "Warn"


def _decoded(c: Cluster, key: str, req: Request, body: dict[str, Any], directive: str) -> dict[str, str]:
    """Strict decoding of a create or update body: under Strict an unknown or duplicate field is 400
    BadRequest; under Warn each becomes a ``Warning`` header (joined into one, as RFC 9110 allows)."""
    group, version, kind, _ = c.resources()[key]
    errors = openapi.check(directive, group, version, kind, body, req.body)
    if directive == "Strict" and errors:
        raise ApiError(400, "BadRequest", openapi.decoding_message(group, version, kind, errors))
    openapi.prune_unknown(group, version, kind, body)  # the decoder drops what the kind does not have
    return {"Warning": ", ".join(openapi.warning_headers(errors))} if errors else {}


def _status_success(name: str, group: str, kind: str, uid: str) -> Response:
    return Response.json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "details": {"name": name, "group": group, "kind": kind, "uid": uid}})


class Writes:
    """Part of :class:`sim.kube.api.KubeApi`: the write verbs. State: ``_dry_ids``.
    """

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
        dry = dry_run(req, "CreateOptions")
        directive = field_validation(req, "CreateOptions")
        body = self._body(req)
        self._check_kind(c, key, body)
        warnings = _decoded(c, key, req, body, directive)
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
        elif not NAME_RE.match(name) or len(name) > 253:
            causes.append(("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                           "of lower case alphanumeric characters, '-' or '.'", "FieldValueInvalid"))
        causes += validate(key, body)
        if causes:
            raise invalid(kind, name, causes, group)
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
            return Response.json(201, self._preview_create(c, key, body), headers=warnings)
        if key == "pods":
            kobj: KObj = c.create_pod(body)
        elif key == "nodes":
            # a kubelet registering, or a cluster admin: stored as posted, status included, backed by no VM
            # (kubernetes/kubernetes pkg/registry/core/node/strategy.go PrepareForCreate)
            kobj = c.register_node(body)
        else:
            kobj = c.put(key, body)
        return Response(status=201, body=kobj.raw(), headers={"Content-Type": "application/json", **warnings})

    def _update(self, c: Cluster, req: Request, key: str, ns: str, name: str, *, status: bool) -> Response:
        dry = dry_run(req, "UpdateOptions")
        directive = field_validation(req, "UpdateOptions")
        body = self._body(req)
        self._check_kind(c, key, body)
        warnings = _decoded(c, key, req, body, directive)
        obj = c.get(key, ns, name)
        group, _v, kind, _ = c.resources()[key]
        if obj is None:
            if key.startswith("leases."):  # leases allow create-on-update, as on the real server
                req2 = Request(method="POST", target=req.target, headers=req.headers, body=req.body)
                resp = self._create(c, req2, key, ns or None)
                return resp
            raise not_found(key.split(".", 1)[0], name, group)
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        rv = meta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != obj.meta.get("resourceVersion"):
            raise conflict(key, name, group)
        causes = validate(key, body) if not status else []
        if causes:
            raise invalid(kind, name, causes, group)
        new = copy.deepcopy(body)
        if dry:
            return Response.json(200, self._preview_update(key, obj, new, status=status), headers=warnings)
        self._commit(c, key, obj, new, status=status)
        return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json", **warnings})

    def _patch(self, c: Cluster, req: Request, key: str, ns: str, name: str, *, status: bool) -> Response:
        dry = dry_run(req, "PatchOptions")
        directive = field_validation(req, "PatchOptions")
        obj = c.get(key, ns, name)
        group, _v, kind, _ = c.resources()[key]
        if obj is None:
            raise not_found(key.split(".", 1)[0], name, group)
        ctype = (req.headers.get("content-type") or "").split(";")[0].strip().lower()
        try:
            patch = json.loads(req.body or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"error decoding patch: {e}") from None
        current = msgspec.json.decode(obj.raw())
        if ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
            new = json_patch(current, patch)
        elif ctype == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "patch body must be a JSON object")
            new = merge_patch(current, patch)
        elif ctype == "application/strategic-merge-patch+json":
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "patch body must be a JSON object")
            new = strategic_patch(current, patch, "")
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
            raise invalid(kind, name, [("metadata.name", "Invalid value: field is immutable", "FieldValueInvalid")],
                           group)
        rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
        if rv not in (None, "") and str(rv) != obj.meta.get("resourceVersion"):
            raise conflict(key, name, group)
        warnings = self._patched_fields(c, key, new, directive)
        causes = validate(key, new)
        if causes:
            raise invalid(kind, name, causes, group)
        if dry:
            return Response.json(200, self._preview_update(key, obj, new, status=status), headers=warnings)
        self._commit(c, key, obj, new, status=status)
        return Response(status=200, body=obj.raw(), headers={"Content-Type": "application/json", **warnings})

    @staticmethod
    def _patched_fields(c: Cluster, key: str, new: dict[str, Any], directive: str) -> dict[str, str]:
        """A patch whose result has a field the kind does not have: under Strict 422 Invalid with the
        cause ``patch`` (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go wraps the strict
        decoding error as ``field.Invalid(field.NewPath("patch"), ...)``); under Warn a Warning header."""
        group, version, kind, _ = c.resources()[key]
        errors = openapi.check(directive, group, version, kind, new)
        if not errors:
            return {}
        if directive != "Strict":
            openapi.prune_unknown(group, version, kind, new)
        if directive == "Strict":
            message = f"Invalid value: {json.dumps(json.dumps(new, separators=(',', ':')))}: strict decoding error: " \
                      + ", ".join(errors)
            raise ApiError(422, "Invalid", f' "" is invalid: patch: {message}',
                           {"causes": [{"reason": "FieldValueInvalid", "message": message, "field": "patch"}]})
        return {"Warning": ", ".join(openapi.warning_headers(errors))}

    def _commit(self, c: Cluster, key: str, obj: KObj, new: dict[str, Any], *, status: bool) -> None:
        """Apply an updated object: which parts may change depends on the endpoint (main or status)."""
        if not status and key == "pods":
            check_pod_update(obj, new)
        obj.obj.update(update_fields(key, obj.obj, new, status=status))
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
            check_pod_update(obj, new)
        current = msgspec.json.decode(obj.raw())
        current.update(copy.deepcopy(update_fields(key, current, new, status=status)))
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
            raise not_found(key.split(".", 1)[0], name, group)
        opts = self._delete_options(req)
        dry = dry_run(req, "DeleteOptions", opts)
        pre = (opts.get("preconditions") or {})
        if pre.get("uid") and pre["uid"] != obj.meta.get("uid"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {key} "{name}": Precondition failed: '
                           f"UID in precondition: {pre['uid']}, UID in object meta: {obj.meta.get('uid')}")
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != obj.meta.get("resourceVersion"):
            raise conflict(key, name, group)
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
        dry = dry_run(req, "DeleteOptions", opts)
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

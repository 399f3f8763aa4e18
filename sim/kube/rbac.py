"""Kubernetes authorization in the simulated API servers: RBAC over the project's own manifests.

A real AKS cluster only lets the steward do what ``infra/kubernetes/*.yaml`` grants its managed
identity, so the simulated ones do the same, with kube-apiserver's own pieces:

- the request's attributes (verb, API group, resource, subresource, name, namespace) as the request-info
  resolver derives them from the path, method and query
  (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go);
- the authorizer chain: the privileged group ``system:masters`` is allowed everything
  (staging/src/k8s.io/apiserver/pkg/authorization/authorizerfactory/builtin.go privilegedGroupAuthorizer,
  first in the union), then RBAC over the stored ClusterRoles, ClusterRoleBindings, Roles and
  RoleBindings (plugin/pkg/auth/authorizer/rbac/rbac.go, rule matching in
  pkg/apis/rbac/v1/evaluation_helpers.go), plus the bootstrap roles every authenticated user holds
  (system:discovery, system:basic-user, system:public-info-viewer:
  plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go), and on a cluster with Azure RBAC for
  Kubernetes the AKS webhook after RBAC: the app's data actions from infra/app/kubernetes-role.bicep
  (sim/arm/rbac.py), which hold no pod write, so there the evictions too come from the ClusterRole;
- the 403 it answers (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go
  forbiddenMessage + apierrors.NewForbidden);
- SelfSubjectAccessReview (pkg/registry/authorization/selfsubjectaccessreview/rest.go) and user
  impersonation (staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go), so that
  ``kubectl auth can-i --as <principal>`` answers what the app may do.

A simulated cluster is created *deployed*: :func:`deploy_app_manifests` applies the same files
``scripts/apply-kube-rbac.sh`` applies, every document of each (namespace, ClusterRole, the Roles in the
app's namespace and in ``default``, and their bindings to the app's object id), so the app runs with
exactly the grants a real deployment gives it. Harness tokens carry
``system:masters`` (sim/identity/tokens.py); the app's tokens carry its object id and no group.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.identity.tokens import ADMIN_GROUP

RBAC_GROUP = "rbac.authorization.k8s.io"
AUTHENTICATED = "system:authenticated"
MANIFESTS = Path(__file__).resolve().parents[2] / "infra" / "kubernetes"
# apply order: the namespace before what lives in it (scripts/apply-kube-rbac.sh applies them so too)
MANIFEST_ORDER = ("namespace.yaml", "clusterrole.yaml", "role.yaml", "clusterrolebinding.yaml", "rolebinding.yaml")
PRINCIPAL_PLACEHOLDER = "${STEWARD_PRINCIPAL_ID}"
RBAC_KEYS = {"ClusterRole": "clusterroles." + RBAC_GROUP, "ClusterRoleBinding": "clusterrolebindings." + RBAC_GROUP,
             "Role": "roles." + RBAC_GROUP, "RoleBinding": "rolebindings." + RBAC_GROUP}
KIND_KEYS = {"Namespace": "namespaces", **RBAC_KEYS}

# requestinfo.go: verbs spelled in the path, subresources of namespaces, list options
_SPECIAL_VERBS = {"proxy", "watch"}
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}

# bootstrappolicy/policy.go: system:discovery, system:public-info-viewer and system:basic-user, bound to
# system:authenticated (ClusterRoleBindings of the same names).
_BOOTSTRAP_RULES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("system:discovery", {"verbs": ["get"], "nonResourceURLs": [
        "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
        "/version", "/version/"]}),
    ("system:basic-user", {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
                           "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]}),
    ("system:basic-user", {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"],
                           "resources": ["selfsubjectreviews"]}),
)


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Attributes:
    """authorizer.Attributes of one request."""

    user: User
    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    namespace: str = ""


@dataclass
class Decision:
    allowed: bool
    reason: str = ""
    errors: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- request info


def request_attributes(user: User, method: str, parts: list[str], query: Mapping[str, str | None]) -> Attributes:
    """The attributes kube-apiserver's RequestInfoFactory derives from a request (requestinfo.go
    NewRequestInfo). ``parts`` is the path below the API server's root, already unescaped."""
    path = "/" + "/".join(parts)
    plain = Attributes(user=user, verb=method.lower(), resource_request=False, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return plain
    current = parts[1:]
    group = ""
    if parts[0] == "apis":
        if len(current) < 3:
            return plain
        group, current = current[0], current[1:]
    version, current = current[0], current[1:]
    verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}.get(method.upper(), "")
    if current and current[0] in _SPECIAL_VERBS:  # /api/v1/watch/..., /api/v1/proxy/...
        if len(current) < 2:
            return plain
        verb, current = current[0], current[1:]
    namespace = ""
    if current and current[0] == "namespaces" and len(current) > 1:
        namespace = current[1]
        if len(current) > 2 and current[2] not in _NAMESPACE_SUBRESOURCES:
            current = current[2:]
    resource = current[0] if current else ""
    name = current[1] if len(current) >= 2 else ""
    subresource = current[2] if len(current) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if str(query.get("watch") or "") in _TRUE else "list"
        selector = str(query.get("fieldSelector") or "")
        if selector.startswith("metadata.name=") and "," not in selector:
            name = selector.split("=", 1)[1]
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user=user, verb=verb, resource_request=True, path=path, api_group=group, api_version=version,
                      resource=resource, subresource=subresource, name=name, namespace=namespace)


# --------------------------------------------------------------------------- RBAC


def _has(values: Iterable[str], wanted: str) -> bool:
    values = list(values or ())
    return "*" in values or wanted in values


def _resource_matches(rule: Mapping[str, Any], resource: str, subresource: str) -> bool:
    """evaluation_helpers.go ResourceMatches: ``*``, the combined ``resource/subresource``, or ``*/sub``."""
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule.get("resources") or ():
        if r in ("*", combined):
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def _non_resource_matches(rule: Mapping[str, Any], path: str) -> bool:
    return any(url in ("*", path) or (url.endswith("*") and path.startswith(url[:-1]))
               for url in rule.get("nonResourceURLs") or ())


def rule_allows(rule: Mapping[str, Any], a: Attributes) -> bool:
    """evaluation_helpers.go RuleAllows."""
    if not _has(rule.get("verbs") or (), a.verb):
        return False
    if not a.resource_request:
        return _non_resource_matches(rule, a.path)
    if not _has(rule.get("apiGroups") or (), a.api_group) or not _resource_matches(rule, a.resource, a.subresource):
        return False
    names = rule.get("resourceNames") or ()
    return not names or a.name in names


def _applies(subject: Mapping[str, Any], user: User, namespace: str) -> bool:
    """rbac/validation/rule.go appliesToUser."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return bool(user.name == name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        return user.name == f"system:serviceaccount:{subject.get('namespace') or namespace}:{name}"
    return False


def _describe(subject: Mapping[str, Any]) -> str:
    return f'{subject.get("kind")} "{subject.get("name")}"'


def authorize(cluster: Any, a: Attributes) -> Decision:
    """The authorizer union: system:masters, then RBAC (rbac.go RBACAuthorizer.Authorize)."""
    if ADMIN_GROUP in a.user.groups:
        return Decision(True)
    groups = a.user.groups if AUTHENTICATED in a.user.groups else (*a.user.groups, AUTHENTICATED)
    user = User(a.user.name, tuple(groups))
    for role, rule in _BOOTSTRAP_RULES:
        if rule_allows(rule, a):
            return Decision(True, f'RBAC: allowed by ClusterRoleBinding "{role}" of ClusterRole "{role}" '
                                  f'to Group "{AUTHENTICATED}"')
    errors: list[str] = []
    store = cluster.store
    for binding in (o.obj for o in cluster.items(RBAC_KEYS["ClusterRoleBinding"])):
        subject = next((s for s in binding.get("subjects") or () if _applies(s, user, "")), None)
        if subject is None:
            continue
        ref = binding.get("roleRef") or {}
        role = store[RBAC_KEYS["ClusterRole"]].get(("", str(ref.get("name"))))
        if role is None:
            errors.append(f'clusterrole.rbac.authorization.k8s.io "{ref.get("name")}" not found')
            continue
        if any(rule_allows(r, a) for r in role.obj.get("rules") or ()):
            return Decision(True, f'RBAC: allowed by ClusterRoleBinding "{binding["metadata"]["name"]}" of '
                                  f'ClusterRole "{ref.get("name")}" to {_describe(subject)}')
    if a.namespace:
        for binding in (o.obj for o in cluster.items(RBAC_KEYS["RoleBinding"], a.namespace)):
            subject = next((s for s in binding.get("subjects") or () if _applies(s, user, a.namespace)), None)
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            kind = str(ref.get("kind") or "")
            key = (a.namespace if kind == "Role" else "", str(ref.get("name")))
            role = store[RBAC_KEYS.get(kind, RBAC_KEYS["Role"])].get(key)
            if role is None:
                errors.append(f'{kind.lower()}.rbac.authorization.k8s.io "{ref.get("name")}" not found')
                continue
            if any(rule_allows(r, a) for r in role.obj.get("rules") or ()):
                return Decision(True, f'RBAC: allowed by RoleBinding "{binding["metadata"]["name"]}/{a.namespace}" '
                                      f'of {kind} "{ref.get("name")}" to {_describe(subject)}')
    reason = f"RBAC: [{', '.join(errors)}]" if len(errors) > 1 else (f"RBAC: {errors[0]}" if errors else "")
    if getattr(cluster, "azure_rbac", False) and a.resource_request:
        # Azure RBAC for Kubernetes: the AKS webhook, after RBAC in the union (either allowing is enough;
        # each denial's reason is kept, joined by newlines: k8s.io/apiserver/pkg/authorization/union)
        from sim.arm import rbac as armrbac
        from sim.identity import app_principal_id

        action = armrbac.kubernetes_data_action(a.api_group, a.resource, a.subresource, a.verb)
        if a.user.name == app_principal_id(cluster.fleet) and \
                armrbac.app_may_in_cluster(cluster.fleet, cluster, action, a.namespace):
            return Decision(True, f"Azure RBAC: allowed by {action}")
        reason = "\n".join(r for r in (reason, armrbac.GUARD_DENIED) if r)
    return Decision(False, reason, errors)


def forbidden_message(a: Attributes) -> str:
    """responsewriters/errors.go forbiddenMessage."""
    if not a.resource_request:
        return f'User "{a.user.name}" cannot {a.verb} path "{a.path}"'
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    if a.namespace:
        return (f'User "{a.user.name}" cannot {a.verb} resource "{resource}" in API group "{a.api_group}" '
                f'in the namespace "{a.namespace}"')
    return f'User "{a.user.name}" cannot {a.verb} resource "{resource}" in API group "{a.api_group}" at the cluster scope'


def forbidden_status(a: Attributes, reason: str = "") -> tuple[str, dict[str, Any]]:
    """The message and details of apierrors.NewForbidden(GroupResource{group, resource}, name, err)."""
    msg = forbidden_message(a)
    if reason:
        msg = f"{msg}: {reason}"
    qualified = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
    if not a.resource_request or not a.resource:
        return f"forbidden: {msg}", {}
    details: dict[str, Any] = {"group": a.api_group, "kind": a.resource}
    if a.name:
        details = {"name": a.name, **details}
        return f'{qualified} "{a.name}" is forbidden: {msg}', details
    return f"{qualified} is forbidden: {msg}", details


# --------------------------------------------------------------------------- impersonation, reviews


def impersonate(cluster: Any, requester: User, headers: Mapping[str, Any]) -> tuple[User, Attributes | None]:
    """``Impersonate-User`` / ``Impersonate-Group`` (impersonation.go WithImpersonation): the requester
    must be allowed the ``impersonate`` verb on the user (and each group); returns the user the request
    then runs as, or the attributes that were refused."""
    target = headers.get("impersonate-user")
    if not target:
        return requester, None
    wanted_groups = _header_values(headers, "impersonate-group")
    checks = [("users", str(target))] + [("groups", g) for g in wanted_groups]
    for resource, name in checks:
        a = Attributes(user=requester, verb="impersonate", resource_request=True, resource=resource, name=name,
                       api_version="v1", path="")
        if not authorize(cluster, a).allowed:
            return requester, a
    groups = list(wanted_groups)
    if str(target) != "system:anonymous" and AUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return User(str(target), tuple(groups)), None


def _header_values(headers: Mapping[str, Any], name: str) -> list[str]:
    getter = getattr(headers, "get_all", None) or getattr(headers, "getall", None)
    if callable(getter):
        values = getter(name) or []
    else:
        one = headers.get(name)
        values = [] if one is None else [one]
    out: list[str] = []
    for value in values:
        out += [v.strip() for v in str(value).split(",") if v.strip()]
    return out


def self_subject_access_review(cluster: Any, user: User, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST .../selfsubjectaccessreviews: whether ``user`` may do what the spec names (rest.go Create)."""
    try:
        review = json.loads(body or b"{}")
    except ValueError as exc:
        return 400, {"reason": "BadRequest", "message": f"the body could not be decoded: {exc}"}
    spec = review.get("spec") if isinstance(review, dict) else None
    if not isinstance(spec, dict):
        return 422, {"reason": "Invalid", "message": "SelfSubjectAccessReview.authorization.k8s.io is invalid: spec: "
                                                     "Required value"}
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if bool(res) == bool(non):
        return 422, {"reason": "Invalid",
                     "message": 'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: '
                                "Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes "
                                "must be specified"}
    if res:
        a = Attributes(user=user, verb=str(res.get("verb") or ""), resource_request=True,
                       api_group=str(res.get("group") or ""), api_version=str(res.get("version") or ""),
                       resource=str(res.get("resource") or ""), subresource=str(res.get("subresource") or ""),
                       name=str(res.get("name") or ""), namespace=str(res.get("namespace") or ""))
    else:
        a = Attributes(user=user, verb=str(non.get("verb") or ""), resource_request=False, path=str(non.get("path") or ""))
    decision = authorize(cluster, a)
    status: dict[str, Any] = {"allowed": decision.allowed}
    if decision.reason:
        status["reason"] = decision.reason
    if decision.errors and not decision.allowed:
        status["evaluationError"] = "; ".join(decision.errors)
    return 201, {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                 "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}


def _proto_fields(data: bytes) -> dict[int, list[bytes | int]]:
    """The fields of one protobuf message (varints and length-delimited values only: all a review has)."""
    out: dict[int, list[bytes | int]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.setdefault(number, []).append(varint())
        elif wire == 2:
            size = varint()
            out.setdefault(number, []).append(data[i:i + size])
            i += size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def decode_review_protobuf(body: bytes) -> bytes:
    """A SelfSubjectAccessReview sent as ``application/vnd.kubernetes.protobuf`` (as kubectl sends it), as
    JSON: the ``k8s\\x00`` envelope around a runtime.Unknown whose ``raw`` is the review
    (k8s.io/apimachinery/pkg/runtime/serializer/protobuf/protobuf.go; field numbers from
    k8s.io/api/authorization/v1/generated.proto)."""
    if not body.startswith(b"k8s\x00"):
        return b"{not protobuf"
    unknown = _proto_fields(body[4:])
    review = _proto_fields(bytes(unknown.get(2, [b""])[0]))  # type: ignore[arg-type]
    spec = _proto_fields(bytes(review.get(2, [b""])[0]))  # type: ignore[arg-type]

    def strings(msg: bytes, names: tuple[str, ...]) -> dict[str, str]:
        fields = _proto_fields(msg)
        return {name: bytes(fields[n][0]).decode() for n, name in enumerate(names, start=1)  # type: ignore[arg-type]
                if n in fields and isinstance(fields[n][0], bytes)}

    doc: dict[str, Any] = {}
    if 1 in spec:
        doc["resourceAttributes"] = strings(bytes(spec[1][0]), ("namespace", "verb", "group", "version",  # type: ignore[arg-type]
                                                                  "resource", "subresource", "name"))
    if 2 in spec:
        doc["nonResourceAttributes"] = strings(bytes(spec[2][0]), ("path", "verb"))  # type: ignore[arg-type]
    return json.dumps({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                       "spec": doc}).encode()


def rules_for(cluster: Any, user: User, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(resource rules, non-resource rules) that apply to ``user`` in ``namespace`` (rbac/validation/rule.go
    RulesFor, as SelfSubjectRulesReview answers them)."""
    if ADMIN_GROUP in user.groups:  # cluster-admin, bound to system:masters
        return ([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                [{"verbs": ["*"], "nonResourceURLs": ["*"]}])
    groups = user.groups if AUTHENTICATED in user.groups else (*user.groups, AUTHENTICATED)
    user = User(user.name, tuple(groups))
    rules: list[dict[str, Any]] = [dict(r) for _, r in _BOOTSTRAP_RULES]
    store = cluster.store
    for binding in (o.obj for o in cluster.items(RBAC_KEYS["ClusterRoleBinding"])):
        if any(_applies(s, user, "") for s in binding.get("subjects") or ()):
            role = store[RBAC_KEYS["ClusterRole"]].get(("", str((binding.get("roleRef") or {}).get("name"))))
            rules += [dict(r) for r in (role.obj.get("rules") or ())] if role else []
    for binding in (o.obj for o in cluster.items(RBAC_KEYS["RoleBinding"], namespace)) if namespace else ():
        if any(_applies(s, user, namespace) for s in binding.get("subjects") or ()):
            ref = binding.get("roleRef") or {}
            kind = str(ref.get("kind") or "")
            key = (namespace if kind == "Role" else "", str(ref.get("name")))
            role = store[RBAC_KEYS.get(kind, RBAC_KEYS["Role"])].get(key)
            rules += [dict(r) for r in (role.obj.get("rules") or ())] if role else []
    resource = [{k: list(r.get(k) or []) for k in ("verbs", "apiGroups", "resources", "resourceNames")
                 if r.get(k) or k != "resourceNames"} for r in rules if not r.get("nonResourceURLs")]
    non_resource = [{"verbs": list(r.get("verbs") or []), "nonResourceURLs": list(r["nonResourceURLs"])}
                    for r in rules if r.get("nonResourceURLs")]
    return resource, non_resource


def self_subject_rules_review(cluster: Any, user: User, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST .../selfsubjectrulesreviews (pkg/registry/authorization/selfsubjectrulesreview/rest.go): what
    ``user`` may do in ``spec.namespace``; what ``kubectl auth can-i --list`` prints."""
    try:
        review = json.loads(body or b"{}")
    except ValueError as exc:
        return 400, {"reason": "BadRequest", "message": f"the body could not be decoded: {exc}"}
    spec = (review.get("spec") if isinstance(review, dict) else None) or {}
    namespace = str(spec.get("namespace") or "")
    resource, non_resource = rules_for(cluster, user, namespace)
    return 201, {"kind": "SelfSubjectRulesReview", "apiVersion": "authorization.k8s.io/v1",
                 "metadata": {"creationTimestamp": None}, "spec": spec,
                 "status": {"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": False}}


def decode_rules_review_protobuf(body: bytes) -> bytes:
    """A SelfSubjectRulesReview sent as protobuf (spec field 2, its namespace field 1), as JSON."""
    if not body.startswith(b"k8s\x00"):
        return b"{not protobuf"
    unknown = _proto_fields(body[4:])
    review = _proto_fields(bytes(unknown.get(2, [b""])[0]))  # type: ignore[arg-type]
    spec = _proto_fields(bytes(review.get(2, [b""])[0]))  # type: ignore[arg-type]
    namespace = bytes(spec[1][0]).decode() if 1 in spec else ""  # type: ignore[arg-type]
    return json.dumps({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                       "spec": {"namespace": namespace}}).encode()


# --------------------------------------------------------------------------- deployment


_DOCS: list[tuple[str, dict[str, Any]]] | None = None


def app_manifests(principal_id: str) -> list[dict[str, Any]]:
    """The documents of infra/kubernetes/*.yaml, in apply order, for the app's object id."""
    global _DOCS
    if _DOCS is None:
        docs: list[tuple[str, dict[str, Any]]] = []
        names = [n for n in MANIFEST_ORDER if (MANIFESTS / n).is_file()]
        names += sorted(p.name for p in MANIFESTS.glob("*.yaml") if p.name not in names)
        for name in names:
            text = (MANIFESTS / name).read_text(encoding="utf-8")
            docs += [(name, d) for d in yaml.safe_load_all(text.replace(PRINCIPAL_PLACEHOLDER, "__STEWARD_PRINCIPAL__"))
                     if isinstance(d, dict)]
        _DOCS = docs
    raw = json.dumps([d for _, d in _DOCS]).replace("__STEWARD_PRINCIPAL__", principal_id)
    return list(json.loads(raw))


def namespaced_grants() -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every Role and RoleBinding the manifests deploy (infra/kubernetes/role.yaml
    and rolebinding.yaml: the app's namespace and ``default``)."""
    return [(str(d["kind"]), str(d["metadata"].get("namespace") or ""), str(d["metadata"]["name"]))
            for d in app_manifests("") if d.get("kind") in ("Role", "RoleBinding")]


def deploy_app_manifests(cluster: Any, principal_id: str, *, rbac: bool = True) -> None:
    """Apply the project's manifests to ``cluster`` as scripts/apply-kube-rbac.sh does (``rbac=False``:
    the namespace only, as on a cluster that relies on Azure RBAC for Kubernetes). uids are derived
    from the cluster and the object (never drawn from the fleet's random stream, so scenarios replay
    as before)."""
    rng_state = cluster.fleet.rng.getstate()  # Cluster.put draws a uid it then does not use
    try:
        for doc in app_manifests(principal_id):
            key = KIND_KEYS.get(str(doc.get("kind")))
            if key is None or (not rbac and key != "namespaces"):
                continue
            meta = doc.setdefault("metadata", {})
            ns = str(meta.get("namespace") or "")
            if cluster.get(key, ns, str(meta.get("name"))) is not None:
                continue
            meta["uid"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{cluster.id}/{key}/{ns}/{meta.get('name')}"))
            cluster.put(key, doc)
    finally:
        cluster.fleet.rng.setstate(rng_state)


def revoke(cluster: Any, *, kind: str, name: str, namespace: str = "", group: str, resource: str, verb: str) -> None:
    """Take one verb off one resource of a stored (Cluster)Role, as an admin editing it would (tests)."""
    obj = cluster.get(RBAC_KEYS[kind], namespace, name)
    if obj is None:
        raise KeyError(f"{kind} {namespace}/{name} not found")
    rules: list[dict[str, Any]] = []
    for rule in obj.obj.get("rules") or ():
        if group in (rule.get("apiGroups") or ()) and resource in (rule.get("resources") or ()) \
                and verb in (rule.get("verbs") or ()):
            others = [r for r in rule["resources"] if r != resource]
            if others:
                rules.append({**rule, "resources": others})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                rules.append({**rule, "resources": [resource], "verbs": verbs})
            continue
        rules.append(rule)
    obj.obj["rules"] = rules
    cluster.touch(obj)


def use_azure_rbac(cluster: Any, *, with_cluster_role: bool = False, as_deployed: bool = False) -> None:
    """Make ``cluster`` one with Azure RBAC for Kubernetes authorization (the Azure data roles of
    sim/arm/rbac.py decide next to Kubernetes RBAC).

    By default the Azure roles alone (only the namespace applied), so that each data action can be shown
    to be needed; that cluster refuses the app's evictions, which the Azure role does not grant
    (infra/app/kubernetes-role.bicep: their data action, pods/write, would also cover pod creates).
    ``with_cluster_role``: the ClusterRole and its binding kept as well (the evictions, and the Karpenter
    kinds of node auto-provisioning clusters), the namespaced Roles still removed. ``as_deployed``: every
    manifest kept, as docs/deploy.md step 3 deploys every cluster, Azure RBAC ones included
    (scripts/apply-kube-rbac.sh applies them all)."""
    cluster.azure_rbac = True
    if as_deployed:
        return
    for kind, ns, name in namespaced_grants():
        cluster.remove(RBAC_KEYS[kind], ns, name)
    if not with_cluster_role:
        for kind in ("ClusterRoleBinding", "ClusterRole"):
            cluster.remove(RBAC_KEYS[kind], "", "gpu-fleet-steward")

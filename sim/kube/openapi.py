"""Field validation and the OpenAPI v3 discovery a real API server offers, derived from the API's own
definition: the kubernetes Python client's models (generated from the Kubernetes OpenAPI document of
the same release, 37.x for v1.37), never a list written here.

Two behaviours, both checked against kube-apiserver v1.37.2 (tests/realkube, story
``field_validation``):

- **Server-side field validation** (``?fieldValidation=Strict|Warn|Ignore``; unset means Warn): a
  create or update naming a field the kind does not have is 400 BadRequest ``<Kind> in version "<v>"
  cannot be handled as a <Kind>: strict decoding error: unknown field "spec.foo", ...`` under Strict,
  a ``Warning: 299 - "unknown field \\"spec.foo\\""`` header under Warn; a field given twice is a
  ``duplicate field``; a patch whose result has an unknown field is 422 Invalid with the cause
  ``patch``; any other directive is 422 on ``<Verb>Options.meta.k8s.io``.
  (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go ``fieldValidation``;
  staging/src/k8s.io/apimachinery/pkg/runtime/serializer/json/json.go strict decoding;
  staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go ``ValidateFieldValidation``.)
- **``/openapi/v3``**: the index of group-version documents and, per group-version, a document whose
  PATCH operations carry ``x-kubernetes-group-version-kind`` and the ``fieldValidation`` parameter.
  That is what kubectl reads to decide that the server validates fields itself
  (staging/src/k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go ``supportsQueryParamV3``);
  without it ``kubectl create`` fails with "failed to download openapi" before sending anything.
  The documents carry no schemas: kubectl needs none once the server validates.

Kinds without a model (the Karpenter CRDs) are not checked: a CRD's structural schema would be, which
the simulator does not carry.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from typing import Any

DIRECTIVES = ("", "Ignore", "Strict", "Warn")
_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")


@cache
def _models() -> Any:
    from kubernetes.client import models

    return models


def model_name(group: str, version: str, kind: str) -> str | None:
    """The client's model class for a kind: ``<Group><Version><Kind>`` where two groups share a kind
    name (``CoreV1Event``, ``EventsV1Event``), else ``<Version><Kind>`` (``V1Node``)."""
    models = _models()
    prefix = (group.split(".", 1)[0] or "core").capitalize()
    for name in (f"{prefix}{version.capitalize()}{kind}", f"{version.capitalize()}{kind}"):
        if isinstance(getattr(models, name, None), type):
            return name
    return None


def _walk(type_name: str, value: Any, path: str, out: list[str], prune: bool = False) -> None:
    if value is None:
        return
    m = _LIST.match(type_name)
    if m:
        if isinstance(value, list):
            for i, item in enumerate(value):
                _walk(m.group(1), item, f"{path}[{i}]", out, prune)
        return
    m = _DICT.match(type_name)
    if m:
        if isinstance(value, dict):
            for key, item in value.items():
                _walk(m.group(1), item, f"{path}[{key}]" if path else str(key), out, prune)
        return
    cls = getattr(_models(), type_name, None)
    if not isinstance(cls, type) or not isinstance(value, dict):
        return  # a primitive, a quantity, an int-or-string ("object"), or a shape the type check judges
    json_to_attr = {j: a for a, j in cls.attribute_map.items()}
    for key, item in list(value.items()):
        field = f"{path}.{key}" if path else str(key)
        attr = json_to_attr.get(key)
        if attr is None:
            out.append(f'unknown field "{field}"')
            if prune:
                del value[key]
        else:
            _walk(cls.openapi_types[attr], item, field, out, prune)


def unknown_fields(group: str, version: str, kind: str, obj: Any) -> list[str]:
    """``unknown field "<path>"`` for every field of ``obj`` its kind does not have (paths as the
    strict decoder writes them: ``spec.taints[0].zz``); empty for kinds without a model."""
    name = model_name(group, version, kind)
    if name is None:
        return []
    out: list[str] = []
    _walk(name, obj, "", out)
    return out


def prune_unknown(group: str, version: str, kind: str, obj: Any) -> None:
    """Drop the fields the kind does not have, in place: what the decoder does under Warn and Ignore,
    so an unknown field is never stored (a later strict patch would otherwise trip over it)."""
    name = model_name(group, version, kind)
    if name is not None:
        _walk(name, obj, "", [], prune=True)


def duplicate_fields(raw: bytes | str | None) -> list[str]:
    """``duplicate field "<path>"`` for every key given twice in one JSON object of the body."""
    if not raw:
        return []
    out: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, _Pairs):
            seen: set[str] = set()
            for key, item in value.pairs:
                field = f"{path}.{key}" if path else key
                if key in seen:
                    out.append(f'duplicate field "{field}"')
                seen.add(key)
                walk(item, field)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")

    try:
        walk(json.loads(raw, object_pairs_hook=_Pairs), "")
    except ValueError:
        return []
    return out


class _Pairs:
    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def check(directive: str, group: str, version: str, kind: str, obj: Any, raw: bytes | str | None = None) -> list[str]:
    """The strict decoding errors of a body (duplicates first, as the decoder meets them, then unknown
    fields); the caller answers them according to ``directive``."""
    if directive == "Ignore":
        return []
    return duplicate_fields(raw) + unknown_fields(group, version, kind, obj)


def decoding_message(group: str, version: str, kind: str, errors: list[str]) -> str:
    gv = f"{group}/{version}" if group else version
    return f'{kind} in version "{gv}" cannot be handled as a {kind}: strict decoding error: {", ".join(errors)}'


def warning_headers(errors: list[str]) -> list[str]:
    """One ``Warning`` value per error (RFC 7234 warn-code 299, as the API server writes them)."""
    return ["299 - " + json.dumps(e) for e in errors]


def _doc_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def group_version_doc(resources: dict[str, tuple[str, str, str, bool]], group: str, version: str) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version: a PATCH operation per kind, with its
    ``x-kubernetes-group-version-kind`` and the ``fieldValidation`` query parameter."""
    paths: dict[str, Any] = {}
    base = "/api/" + version if not group else f"/apis/{group}/{version}"
    for key, (g, v, kind, namespaced) in sorted(resources.items()):
        if (g, v) != (group, version):
            continue
        plural = key.split(".", 1)[0]
        path = f"{base}/namespaces/{{namespace}}/{plural}/{{name}}" if namespaced else f"{base}/{plural}/{{name}}"
        params = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                  for n in ("dryRun", "fieldManager", "fieldValidation", "force")]
        paths[path] = {"patch": {"operationId": f"patch{kind}", "parameters": params,
                                 "x-kubernetes-action": "patch",
                                 "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.37.2"}, "paths": paths}


def index(resources: dict[str, tuple[str, str, str, bool]]) -> dict[str, Any]:
    """``GET /openapi/v3``: each group-version's document path with a content hash, as the server
    lists them (``serverRelativeURL`` with ``?hash=``)."""
    out: dict[str, Any] = {}
    for group, version in sorted({(g, v) for g, v, _k, _n in resources.values()}):
        body = json.dumps(group_version_doc(resources, group, version), sort_keys=True).encode()
        digest = hashlib.sha512(body).hexdigest().upper()
        out[_doc_path(group, version)] = {"serverRelativeURL": f"/openapi/v3/{_doc_path(group, version)}?hash={digest}"}
    return {"paths": out}


def document(resources: dict[str, tuple[str, str, str, bool]], path: str) -> dict[str, Any] | None:
    """``GET /openapi/v3/<api/v1 | apis/<group>/<version>>``; None for a group-version not served."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"] and len(parts) == 2:
        group, version = "", parts[1]
    elif parts[:1] == ["apis"] and len(parts) == 3:
        group, version = parts[1], parts[2]
    else:
        return None
    if not any((g, v) == (group, version) for g, v, _k, _n in resources.values()):
        return None
    return group_version_doc(resources, group, version)

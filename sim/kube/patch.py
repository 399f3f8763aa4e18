"""The three patch types the API server accepts: JSON merge patch (RFC 7386), strategic merge patch
and JSON patch (RFC 6902).
"""

from __future__ import annotations

import copy
from typing import Any

from sim.kube.errors import ApiError

# patchMergeKey of the lists a strategic merge patch merges element-wise (kubernetes/kubernetes
# staging/src/k8s.io/api/core/v1/types.go struct tags). NodeSpec.Taints and PodSpec.Tolerations carry no
# patchStrategy, so a patch REPLACES those lists whole (None here); ObjectMeta.Finalizers is a list of
# strings with patchStrategy "merge": the patch's entries are added to the current ones.
_STRATEGIC_KEYS = {"taints": None, "conditions": ("type",), "containers": ("name",),
                   "initContainers": ("name",), "env": ("name",), "volumes": ("name",), "volumeMounts": ("mountPath",),
                   "ports": ("containerPort",), "ownerReferences": ("uid",), "addresses": ("type",),
                   "tolerations": None, "imagePullSecrets": ("name",)}


_STRATEGIC_PRIMITIVE_MERGE = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_patch(target: Any, patch: Any, field_name: str) -> Any:
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
            merged = strategic_patch(out.get(k), v, k)
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
            out[idx] = strategic_patch(out[idx], item, "")
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: list[Any]) -> Any:
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

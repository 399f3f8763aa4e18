"""Reads on the simulated API servers: get, list with limit/continue pagination whose tokens expire
with etcd compaction, watch streams, label and field selectors, server-side tables for kubectl.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from sim.core.http import Request, Response
from sim.kube.errors import ApiError, not_found
from sim.kube.objects import KObj, Node, parse_iso
from sim.kube.selectors import SelectorError, match_requirements, parse_label_selector

if TYPE_CHECKING:
    from sim.model import Cluster

_ENC = msgspec.json.Encoder()

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


@dataclass
class StreamResponse(Response):
    """A response whose body is written as it is produced (chunked): watch streams."""

    stream: Iterator[bytes] | None = None


def _event(kind: str, raw: bytes) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"


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


class Reads:
    """Part of :class:`sim.kube.api.KubeApi`: GET (one object, a list, a watch) and the list snapshots
    behind continue tokens. State: ``_snapshot_ids``, ``_forced_compactions``.
    """

    def _get(self, c: Cluster, req: Request, key: str, ns: str, name: str) -> Response:
        obj = c.get(key, ns, name)
        if obj is None:
            raise not_found(key.split(".", 1)[0], name, c.resources()[key][0])
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
            # Only for a list without selectors: the server cannot count what a selector would keep
            # (staging/src/k8s.io/apiserver/pkg/storage/continue.go PrepareContinueToken,
            # "We only set remainingItemCount if the predicate is empty").
            if not req.arg("labelSelector") and not req.arg("fieldSelector"):
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

"""Validation of written objects as the API server's validation and update strategies do it.
"""

from __future__ import annotations

import re
from typing import Any

from sim.kube.errors import invalid
from sim.kube.objects import KObj, parse_quantity
from sim.kube.selectors import match_requirements, selector_requirements

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


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


def _legacy_event_namespace(event: dict[str, Any]) -> list[tuple[str, str, str]]:
    """A core/v1 Event lives in its involved object's namespace; one about a cluster-scoped object (a
    Node) in ``default`` (or, with ``eventTime`` set, ``default`` or ``kube-system``), never in any
    other: 422 ``involvedObject.namespace: Invalid value: "": does not match event.namespace``.

    kubernetes/kubernetes pkg/apis/core/validation/events.go ``legacyValidateEvent`` (checked against
    kube-apiserver v1.37.2 in tests/realkube, story events).
    """
    ns = str((event.get("metadata") or {}).get("namespace") or "")
    involved = event.get("involvedObject") or {}
    involved_ns = str(involved.get("namespace") or "") if isinstance(involved, dict) else ""
    if event.get("eventTime"):
        ok = bool(involved_ns) or ns in ("default", "kube-system")
    elif not involved_ns:
        ok = ns in ("", "default")
    else:
        ok = ns == involved_ns
    if ok:
        return []
    return [("involvedObject.namespace", f'Invalid value: "{involved_ns}": does not match event.namespace',
             "FieldValueInvalid")]


def validate(key: str, obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The (field, message, reason) causes that make a written object invalid; empty when it is valid."""
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
        elif key == "events":
            causes += _legacy_event_namespace(obj)
        if key == "events.events.k8s.io" and not obj.get("reportingController"):
            causes.append(("reportingController", "Required value", "FieldValueRequired"))
    return causes


def check_pod_update(pod: KObj, new: dict[str, Any]) -> None:
    """Refuse a pod update that changes more than the API server lets a pod's spec change (422)."""
    old_spec = pod.obj.get("spec") or {}
    new_spec = new.get("spec") or {}
    allowed = {"activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"}
    for k in set(old_spec) | set(new_spec):
        if k in allowed or k == "containers":
            continue
        if old_spec.get(k) != new_spec.get(k):
            raise invalid("Pod", pod.name, [("spec", "Forbidden: pod updates may not change fields other than "
                                              "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, "
                                              "`spec.tolerations` (only additions to existing tolerations), "
                                              "`spec.terminationGracePeriodSeconds`", "FieldValueForbidden")])
    oc, nc = old_spec.get("containers") or [], new_spec.get("containers") or []
    strip = [{k: v for k, v in c.items() if k != "image"} for c in oc]
    if len(oc) != len(nc) or strip != [{k: v for k, v in c.items() if k != "image"} for c in nc]:
        raise invalid("Pod", pod.name, [("spec", "Forbidden: pod updates may not change fields other than "
                                          "`spec.containers[*].image`", "FieldValueForbidden")])


def update_fields(key: str, old: dict[str, Any], new: dict[str, Any], *, status: bool) -> dict[str, Any]:
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

"""Differential conformance: each story below is told to the simulator's API server and to a real
kube-apiserver v1.37 (with etcd, the controller manager, the scheduler and kwok), and every answer
(status code, Status reason, details and causes, and the fields of the resulting object the story is
about) must be the same. A difference fails naming both answers.

The stories are the Kubernetes behaviours docs/fidelity.md lists and those the app relies on:
create/patch/update of Nodes with partial bodies, strategic merge, JSON merge and JSON patches,
resourceVersion conflicts, pagination with ``continue``, field and label selectors, evictions under
the PDB shapes, dry runs, SelfSubjectAccessReview and the app's RBAC, Events, and terminating
namespaces.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sim.identity import APP_PRINCIPAL_ID
from tests.realkube.conftest import World
from tests.realkube.servers import Server, is_ready, pick, status_of
from tests.waiting import wait_until

Obs = dict[str, Any]
Story = Callable[[Server, str], list[Obs]]
STEWARD_NS = "gpu-fleet-steward"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"


def seen(answer: tuple[int, Any], *paths: str) -> Obs:
    """What a client can observe of one answer: its code, its Status, and the given fields of its object."""
    code, body = answer
    out: Obs = {"code": code}
    status = status_of(body)
    if status:
        out["status"] = status
    elif paths:
        out["object"] = pick(body, list(paths))
    return out


def node(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, **meta}}


def pod(name: str, node_name: str, **extra: Any) -> dict[str, Any]:
    spec = {"nodeName": node_name, "terminationGracePeriodSeconds": extra.pop("grace", 5),
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": extra.pop("labels", {"app": name}), **extra}, "spec": spec}


def namespace(s: Server, name: str) -> None:
    code, body = s.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    assert code == 201, (s.name, body)
    # The real ServiceAccount admission refuses pods until the namespace's default account exists.
    wait_until(lambda: s.call("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200 or s.name == "simulator",
               timeout=30, what=f"{s.name}: the default service account of {name}")


def running_pod(s: Server, ns: str, name: str, node_name: str = "", **extra: Any) -> None:
    code, body = s.call("POST", f"/api/v1/namespaces/{ns}/pods", pod(name, node_name or s.pod_node, **extra))
    assert code == 201, (s.name, body)

    wait_until(lambda: is_ready(s.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}")[1]), timeout=60,
               what=f"{s.name}: pod {ns}/{name} Ready")


def pdb(s: Server, ns: str, name: str, selector: dict[str, str], **spec: Any) -> None:
    code, body = s.call("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": selector}, **spec}})
    assert code == 201, (s.name, body)

    def observed() -> bool:
        got = s.call("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")[1]
        return (got.get("status") or {}).get("observedGeneration") == got["metadata"].get("generation")
    wait_until(observed, timeout=60, what=f"{s.name}: the disruption controller observing {ns}/{name}")


def evict(s: Server, ns: str, name: str, **extra: Any) -> tuple[int, Any]:
    return s.call("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction",
                  {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}, **extra})


# ---- stories: each returns what a client saw, step by step -------------------------------------

def bare_node_create(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("POST", "/api/v1/nodes", node(n)), "metadata.name", "metadata.labels", "spec"),
            # not the taints: the node lifecycle controller's taint pass may already have removed the
            # admission's not-ready taint (a Node with no conditions wants none), a race on both servers
            seen(s.call("GET", f"/api/v1/nodes/{n}"), "metadata.name", "spec.unschedulable")]


def node_without_a_name(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {}}))]


def node_twice(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("POST", "/api/v1/nodes", node(n))), seen(s.call("POST", "/api/v1/nodes", node(n)))]


def missing_node(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("GET", f"/api/v1/nodes/{n}")), seen(s.call("DELETE", f"/api/v1/nodes/{n}")),
            seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"unschedulable": True}}, content_type=MERGE))]


def has_taint(answer: tuple[int, Any], key: str) -> bool:
    return any(t.get("key") == key for t in ((answer[1].get("spec") or {}).get("taints") or []))


def node_patches(s: Server, n: str) -> list[Obs]:
    """Patches of a Node. Controllers write to it too (the TTL controller's annotation at once; the node
    lifecycle controller's taints a moment after each write), so the story waits for the TTL annotation
    first and compares taints only where the answer cannot race a controller: the cordon's own answer
    (computed before any controller saw the cordon), the eventual taint, and whole-list replacements."""
    s.call("POST", "/api/v1/nodes", node(n, labels={"a": "1", "b": "2"}))
    wait_until(lambda: "node.alpha.kubernetes.io/ttl" in (s.call("GET", f"/api/v1/nodes/{n}")[1]["metadata"]
                                                           .get("annotations") or {}),
               timeout=30, what=f"{s.name}: the TTL controller annotating node {n}")
    paths = ("metadata.labels", "metadata.annotations", "spec.unschedulable")
    out = [
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"metadata": {"labels": {"c": "3"}}}, content_type=STRATEGIC), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"metadata": {"labels": {"a": None}}}, content_type=MERGE), *paths)]
    cordon = s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"unschedulable": True}}, content_type=MERGE)
    out += [seen(cordon, *paths), {"cordon answer has the unschedulable taint": has_taint(cordon, UNSCHEDULABLE)}]
    wait_until(lambda: has_taint(s.call("GET", f"/api/v1/nodes/{n}"), UNSCHEDULABLE), timeout=30,
               what=f"{s.name}: the node lifecycle controller tainting cordoned node {n}")
    out += [
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", json.dumps([{"op": "add", "path": "/metadata/annotations/x",
                                                                  "value": "y"}]), content_type=JSON_PATCH), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", json.dumps([{"op": "test", "path": "/metadata/labels/b",
                                                                  "value": "nope"}]), content_type=JSON_PATCH), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
                    content_type=STRATEGIC), *paths, "spec.taints"),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"taints": [{"key": "j", "effect": "NoExecute"}]}},
                    content_type=MERGE), *paths, "spec.taints"),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", "{not json", content_type=MERGE)),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"unschedulable": False}}, content_type="text/plain")),
    ]
    return out


def node_update_conflicts(s: Server, n: str) -> list[Obs]:
    _, created = s.call("POST", "/api/v1/nodes", node(n))
    stale = dict(created)
    s.call("PATCH", f"/api/v1/nodes/{n}", {"metadata": {"labels": {"moved": "on"}}}, content_type=MERGE)
    stale["metadata"] = {**stale["metadata"], "labels": {"from": "stale"}}
    out = [seen(s.call("PUT", f"/api/v1/nodes/{n}", stale))]
    unconditional = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"put": "yes"}}, "spec": {}}
    out.append(seen(s.call("PUT", f"/api/v1/nodes/{n}", unconditional), "metadata.labels"))
    other = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n + "-other"}}
    out.append(seen(s.call("PUT", f"/api/v1/nodes/{n}", other)))
    guarded = {"metadata": {"resourceVersion": "1", "labels": {"x": "1"}}}
    out.append(seen(s.call("PATCH", f"/api/v1/nodes/{n}", guarded, content_type=MERGE)))
    return out


def node_lists(s: Server, n: str) -> list[Obs]:
    for i in range(3):
        s.call("POST", "/api/v1/nodes", node(f"{n}-{i}", labels={"story": n, "i": str(i)}))
    s.call("PATCH", f"/api/v1/nodes/{n}-1", {"spec": {"unschedulable": True}}, content_type=MERGE)

    def names(answer: tuple[int, Any]) -> Obs:
        code, body = answer
        if code != 200:
            return seen(answer)
        return {"code": code, "names": sorted(i["metadata"]["name"] for i in body["items"]),
                "continues": bool(body["metadata"].get("continue"))}
    out = [names(s.call("GET", f"/api/v1/nodes?labelSelector=story%3D{n}")),
           names(s.call("GET", f"/api/v1/nodes?labelSelector=story%3D{n},i+in+(0,2)")),
           names(s.call("GET", f"/api/v1/nodes?labelSelector=story%3D{n}&fieldSelector=spec.unschedulable%3Dtrue")),
           names(s.call("GET", f"/api/v1/nodes?fieldSelector=metadata.name%3D{n}-2")),
           seen(s.call("GET", "/api/v1/nodes?fieldSelector=status.phase%3DReady")),
           seen(s.call("GET", "/api/v1/nodes?labelSelector=a%3Db%3Dc"))]
    pages, token = [], ""
    while True:
        code, body = s.call("GET", f"/api/v1/nodes?labelSelector=story%3D{n}&limit=2" + (f"&continue={token}" if token else ""))
        pages.append({"code": code, "count": len(body["items"]), "remaining": body["metadata"].get("remainingItemCount")})
        token = body["metadata"].get("continue", "")
        if not token:
            break
    out.append({"pages": pages})
    out.append(seen(s.call("GET", "/api/v1/nodes?limit=1&continue=not-a-token")))
    return out


def dry_runs(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("POST", "/api/v1/nodes?dryRun=All", node(n)), "metadata.name"),
            seen(s.call("GET", f"/api/v1/nodes/{n}")),
            seen(s.call("POST", "/api/v1/nodes?dryRun=Maybe", node(n)))]


def evictions(s: Server, n: str) -> list[Obs]:
    ns = f"ev-{n}"
    namespace(s, ns)
    running_pod(s, ns, "free")
    running_pod(s, ns, "guarded", labels={"app": "guarded"})
    running_pod(s, ns, "double", labels={"app": "double", "tier": "x"})
    pdb(s, ns, "guard", {"app": "guarded"}, minAvailable=1)
    pdb(s, ns, "d1", {"app": "double"}, maxUnavailable=1)
    pdb(s, ns, "d2", {"tier": "x"}, maxUnavailable=1)
    out = [seen(evict(s, ns, "guarded")),
           seen(evict(s, ns, "double")),
           seen(evict(s, ns, "nobody")),
           seen(evict(s, ns, "free", deleteOptions={"dryRun": ["All"]})),
           seen(evict(s, ns, "free", deleteOptions={"dryRun": ["Other"]})),
           seen(evict(s, ns, "free")),
           seen(s.call("GET", f"/api/v1/namespaces/{ns}/pods/free"), "metadata.name")]
    got = s.call("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/guard")[1]
    out.append(pick(got, ["status.disruptionsAllowed", "status.currentHealthy", "status.desiredHealthy",
                          "status.expectedPods"]))
    return out


def terminating_namespace(s: Server, n: str) -> list[Obs]:
    ns = f"tn-{n}"
    namespace(s, ns)
    running_pod(s, ns, "held", finalizers=["example.com/hold"])
    out = [seen(s.call("DELETE", f"/api/v1/namespaces/{ns}"), "status.phase")]
    wait_until(lambda: s.call("GET", f"/api/v1/namespaces/{ns}/pods/held")[1]["metadata"].get("deletionTimestamp"),
               timeout=60, what=f"{s.name}: the namespace controller deleting the held pod")
    out += [seen(s.call("GET", f"/api/v1/namespaces/{ns}"), "status.phase"),
            seen(evict(s, ns, "held")),
            seen(s.call("POST", f"/api/v1/namespaces/{ns}/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                                                          "metadata": {"name": "late"}})),
            seen(s.call("DELETE", f"/api/v1/namespaces/{ns}"))]
    s.call("PATCH", f"/api/v1/namespaces/{ns}/pods/held", {"metadata": {"finalizers": None}}, content_type=MERGE)
    wait_until(lambda: s.call("GET", f"/api/v1/namespaces/{ns}")[0] == 404, timeout=60,
               what=f"{s.name}: namespace {ns} gone once its last pod is")
    return out


def grace_periods(s: Server, n: str) -> list[Obs]:
    ns = f"gp-{n}"
    namespace(s, ns)
    running_pod(s, ns, "slow", grace=600, finalizers=["example.com/hold"])
    first = s.call("DELETE", f"/api/v1/namespaces/{ns}/pods/slow", {"gracePeriodSeconds": 60})
    longer = s.call("DELETE", f"/api/v1/namespaces/{ns}/pods/slow", {"gracePeriodSeconds": 300})
    shorter = s.call("DELETE", f"/api/v1/namespaces/{ns}/pods/slow", {"gracePeriodSeconds": 30})
    out = [seen(first, "metadata.deletionGracePeriodSeconds"), seen(longer, "metadata.deletionGracePeriodSeconds"),
           seen(shorter, "metadata.deletionGracePeriodSeconds")]
    s.call("PATCH", f"/api/v1/namespaces/{ns}/pods/slow", {"metadata": {"finalizers": None}}, content_type=MERGE)
    return out


def the_apps_grants(s: Server, n: str) -> list[Obs]:
    def review(verb: str, resource: str, sub: str = "", ns: str = "default", group: str = "") -> Obs:
        code, body = s.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "subresource": sub,
                                            "namespace": ns, "group": group}}}, as_app=True)
        return {"code": code, "allowed": (body.get("status") or {}).get("allowed") if isinstance(body, dict) else body}
    return [review("create", "pods", "eviction"), review("delete", "pods"), review("patch", "nodes", ns=""),
            review("list", "pods"), review("create", "pods"), review("get", "secrets"),
            review("create", "events", ns=STEWARD_NS),
            seen(s.call("DELETE", "/api/v1/namespaces/default/pods/whatever", as_app=True)),
            seen(s.call("GET", "/api/v1/namespaces/kube-system/secrets", as_app=True)),
            seen(s.call("POST", "/api/v1/nodes", node(n), as_app=True))]


def events(s: Server, n: str) -> list[Obs]:
    """Node Events: the app records them in ``default`` (the only namespace a core/v1 Event about a
    cluster-scoped object may live in without eventTime); elsewhere the server refuses them (422)."""
    def event(ns: str, name: str, **extra: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
                "involvedObject": {"kind": "Node", "name": n, "apiVersion": "v1"}, "reason": "Cordoned",
                "message": "by the steward", "type": "Normal", "source": {"component": "gpu-fleet-steward"}, **extra}
    paths = ("reason", "involvedObject.name", "type", "metadata.namespace")
    return [seen(s.call("POST", "/api/v1/namespaces/default/events", event("default", f"a-{n}"), as_app=True), *paths),
            seen(s.call("POST", f"/api/v1/namespaces/{STEWARD_NS}/events", event(STEWARD_NS, f"b-{n}"), as_app=True)),
            seen(s.call("POST", f"/api/v1/namespaces/{STEWARD_NS}/events", event(STEWARD_NS, f"c-{n}"))),
            seen(s.call("POST", "/api/v1/namespaces/kube-system/events", event("kube-system", f"d-{n}"))),
            seen(s.call("POST", "/api/v1/namespaces/default/events", event("default", f"e-{n}", type="Sideways")),
                 *paths)]


def ready_condition(obj: dict[str, Any]) -> dict[str, Any]:
    cond = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    return {"status": cond.get("status"), "reason": cond.get("reason")}


def daemonset_pods(s: Server, n: str) -> list[Obs]:
    """A DaemonSet's pod: owned by it (controller), given the DaemonSet controller's tolerations, and
    recreated on its node after a delete; deleting the DaemonSet deletes its pods (garbage collector)."""
    ns = f"ds-{n}"
    namespace(s, ns)
    s.call("PATCH", f"/api/v1/nodes/{s.pod_node}", {"metadata": {"labels": {"story-ds": n}}}, content_type=MERGE)
    code, body = s.call("POST", f"/apis/apps/v1/namespaces/{ns}/daemonsets", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"nodeSelector": {"story-ds": n}, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}})
    assert code == 201, (s.name, body)

    def live() -> list[dict[str, Any]]:
        items = s.call("GET", f"/api/v1/namespaces/{ns}/pods")[1]["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")
                and ready_condition(p)["status"] == "True"]
    first = wait_until(live, timeout=60, what=f"{s.name}: the DaemonSet's pod Ready")[0]
    owner = (first["metadata"].get("ownerReferences") or [{}])[0]
    tolerations = sorted((t.get("key", ""), t.get("operator", ""), t.get("effect", ""))
                         for t in first["spec"].get("tolerations") or [])
    out: list[Obs] = [{"pods": len(live()), "owner": [owner.get("kind"), owner.get("controller")],
                       "on the labelled node": first["spec"].get("nodeName") == s.pod_node,
                       "tolerations": tolerations}]
    s.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{first['metadata']['name']}")
    again = wait_until(lambda: [p for p in live() if p["metadata"]["uid"] != first["metadata"]["uid"]], timeout=60,
                       what=f"{s.name}: the DaemonSet recreating its pod")[0]
    out.append({"recreated on the same node": again["spec"].get("nodeName") == s.pod_node,
                "same name": again["metadata"]["name"] == first["metadata"]["name"]})
    out.append(seen(s.call("DELETE", f"/apis/apps/v1/namespaces/{ns}/daemonsets/agent")))
    wait_until(lambda: not s.call("GET", f"/api/v1/namespaces/{ns}/pods")[1]["items"], timeout=60,
               what=f"{s.name}: the garbage collector deleting the DaemonSet's pods")
    s.call("PATCH", f"/api/v1/nodes/{s.pod_node}", {"metadata": {"labels": {"story-ds": None}}}, content_type=MERGE)
    return out


def kubelet_stopped(s: Server, n: str) -> list[Obs]:
    """A node whose kubelet stopped: Ready goes Unknown with the unreachable taints, its pods are marked
    not Ready, and a deleted pod there stays Terminating past its grace period (nothing confirms it
    stopped) until it is force-deleted."""
    ns = f"ks-{n}"
    namespace(s, ns)
    running_pod(s, ns, "stuck", node_name=s.spare_node, grace=1)
    s.stop_kubelet(s.spare_node)

    def node_taints() -> list[tuple[str, str]]:
        node = s.call("GET", f"/api/v1/nodes/{s.spare_node}")[1]
        return sorted((t["key"], t["effect"]) for t in node["spec"].get("taints") or [])
    wait_until(lambda: ("node.kubernetes.io/unreachable", "NoExecute") in node_taints(), timeout=90,
               what=f"{s.name}: node {s.spare_node} unreachable")
    node = s.call("GET", f"/api/v1/nodes/{s.spare_node}")[1]
    out: list[Obs] = [{"ready": ready_condition(node), "taints": node_taints()}]
    wait_until(lambda: ready_condition(s.call("GET", f"/api/v1/namespaces/{ns}/pods/stuck")[1])["status"] == "False",
               timeout=60, what=f"{s.name}: the pods of the unreachable node marked not Ready")
    deleted = s.call("DELETE", f"/api/v1/namespaces/{ns}/pods/stuck")
    out.append(seen(deleted, "metadata.deletionGracePeriodSeconds"))
    past = time.time() + 4  # well past the 1 s grace period
    wait_until(lambda: time.time() > past, timeout=10, what="the grace period to pass")
    out.append(seen(s.call("GET", f"/api/v1/namespaces/{ns}/pods/stuck"), "metadata.name",
                    "metadata.deletionGracePeriodSeconds"))
    out.append(seen(s.call("DELETE", f"/api/v1/namespaces/{ns}/pods/stuck", {"gracePeriodSeconds": 0})))
    out.append(seen(s.call("GET", f"/api/v1/namespaces/{ns}/pods/stuck")))
    return out


def field_validation(s: Server, n: str) -> list[Obs]:
    """Server-side field validation: Strict refuses unknown and duplicate fields, Warn (the default)
    answers with a Warning header, a patch whose result has an unknown field is 422."""
    bad = {**node(f"{n}-a"), "spec": {"foo": 1, "taints": [{"key": "a", "effect": "NoSchedule", "zz": 2}]}}
    out = [seen(s.call("POST", "/api/v1/nodes?fieldValidation=Strict", bad))]
    out.append(seen(s.call("POST", "/api/v1/nodes", {**node(f"{n}-b"), "spec": {"foo": 1}}), "metadata.name"))
    out.append({"warnings": s.warnings})
    out.append(seen(s.call("POST", "/api/v1/nodes?fieldValidation=Ignore", {**node(f"{n}-c"), "spec": {"foo": 1}}),
                    "metadata.name"))
    out.append({"warnings": s.warnings})
    out.append(seen(s.call("POST", "/api/v1/nodes?fieldValidation=Bogus", node(f"{n}-d"))))
    out.append(seen(s.call("POST", "/api/v1/nodes?fieldValidation=Strict",
                           '{"apiVersion":"v1","kind":"Node","metadata":{"name":"' + n + '-e"},'
                           '"spec":{"unschedulable":true,"unschedulable":false}}')))
    out.append(seen(s.call("PATCH", f"/api/v1/nodes/{n}-b?fieldValidation=Strict", {"spec": {"bar": 1}},
                           content_type=MERGE)))
    out.append(seen(s.call("PATCH", f"/api/v1/nodes/{n}-b?fieldValidation=Strict",
                           {"metadata": {"labels": {"ok": "yes"}}}, content_type=MERGE), "metadata.labels"))
    return out


def kubectl(s: Server, *args: str, stdin: str | None = None) -> Obs:
    """kubectl's exit code and what it printed, with the server's name taken out."""
    proc = subprocess.run(["kubectl", "--kubeconfig", s.kubeconfig, *args], input=stdin, capture_output=True,
                          text=True, timeout=60)
    return {"rc": proc.returncode, "stdout": proc.stdout.strip(), "stderr": proc.stderr.strip()}


def kubectl_as_a_user(s: Server, n: str) -> list[Obs]:
    """What a new user types: a bare Node from a file (kubectl's default, strict, validation), one with
    a field Nodes do not have, label, annotate, cordon, a server-side dry-run drain, uncordon, delete,
    and `auth can-i` as the app."""
    bare = f"apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n"
    typo = f"apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}-typo\nspec:\n  unschedulabel: true\n"
    return [
        kubectl(s, "create", "-f", "-", stdin=bare),
        kubectl(s, "create", "-f", "-", stdin=typo),
        kubectl(s, "label", "node", n, "team=ml"),
        kubectl(s, "annotate", "node", n, "gpu-fleet-steward/cordoned-for=r-1"),
        kubectl(s, "cordon", n),
        kubectl(s, "cordon", n),
        kubectl(s, "drain", n, "--ignore-daemonsets", "--dry-run=server"),
        kubectl(s, "uncordon", n),
        kubectl(s, "auth", "can-i", "create", "pods", "--subresource=eviction", f"--as={APP_PRINCIPAL_ID}", "-A"),
        kubectl(s, "auth", "can-i", "delete", "pods", f"--as={APP_PRINCIPAL_ID}", "-A"),
        kubectl(s, "delete", "node", n),
        kubectl(s, "get", "node", n),
    ]


def budget_shapes(s: Server, n: str) -> list[Obs]:
    """Evictions under each PDB shape: maxUnavailable 0, minAvailable 100%, a percentage that rounds,
    and unready pods under a budget short of healthy pods (IfHealthyBudget refuses, AlwaysAllow lets
    them go)."""
    ns = f"bs-{n}"
    namespace(s, ns)
    for name, app in (("zero", "zero"), ("full", "full"), ("half-1", "half"), ("half-2", "half"), ("half-3", "half"),
                      ("sick-1", "sick"), ("sick-2", "sick"), ("loose-1", "loose"), ("loose-2", "loose")):
        running_pod(s, ns, name, labels={"app": app})
    pdb(s, ns, "zero", {"app": "zero"}, maxUnavailable=0)
    pdb(s, ns, "full", {"app": "full"}, minAvailable="100%")
    pdb(s, ns, "half", {"app": "half"}, maxUnavailable="50%")
    for name in ("sick-1", "loose-1"):  # a readiness probe failing: the kubelet writes Ready False
        got = s.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}")[1]
        conditions = [{**c, "status": "False", "reason": "ContainersNotReady"} if c["type"] in ("Ready", "ContainersReady")
                      else c for c in got["status"]["conditions"]]
        code, body = s.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                            {"status": {"conditions": conditions}}, content_type=STRATEGIC)
        assert code == 200, (s.name, body)
    pdb(s, ns, "sick", {"app": "sick"}, minAvailable=2)
    pdb(s, ns, "loose", {"app": "loose"}, minAvailable=2, unhealthyPodEvictionPolicy="AlwaysAllow")

    def budget(name: str) -> dict[str, Any]:
        got = s.call("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")[1]
        return pick(got, ["status.disruptionsAllowed", "status.currentHealthy", "status.desiredHealthy",
                          "status.expectedPods"])
    wait_until(lambda: budget("sick")["status.currentHealthy"] == 1 and budget("loose")["status.currentHealthy"] == 1,
               timeout=60, what=f"{s.name}: the disruption controller counting the unready pods")
    out: list[Obs] = [budget(b) for b in ("zero", "full", "half", "sick", "loose")]
    out += [seen(evict(s, ns, "zero")), seen(evict(s, ns, "full")), seen(evict(s, ns, "half-1")),
            seen(evict(s, ns, "half-2")), seen(evict(s, ns, "sick-1")), seen(evict(s, ns, "sick-2")),
            seen(evict(s, ns, "loose-1")), seen(evict(s, ns, "loose-2"))]
    return out


def the_apps_selectors(s: Server, n: str) -> list[Obs]:
    """Every selector the app builds (the sweep's GPU selectors, pool selectors from pool labels, the pod
    list's escaped ``spec.nodeName``) is accepted by both servers and selects the same objects."""
    from urllib.parse import quote

    from shared.adapters.kube.client import _escape_field_value
    from shared.migration import reads as migration
    from shared.pools import nap
    from shared.pools import spec as pool_spec
    from shared.remediation import health
    from shared.remediation.policy import GPU_NODE_SELECTOR, RemediationPolicy

    selectors = [GPU_NODE_SELECTOR, health.NAP_GPU_SELECTOR, RemediationPolicy().node_selector]
    selectors += [f"{label}=gpu{n[-6:]}" for label in (migration.POOL_LABEL, pool_spec.AGENTPOOL_LABEL,
                                                       nap.NODEPOOL_LABEL)]
    for i, selector in enumerate(selectors):
        key, _, value = selector.partition("=")
        s.call("POST", "/api/v1/nodes", node(f"{n}-{i}", labels={key: value, "story": n}))
    out: list[Obs] = []
    for selector in selectors:
        code, body = s.call("GET", f"/api/v1/nodes?labelSelector={quote(selector + ',story=' + n)}")
        out.append({"selector": selector, "code": code,
                    "names": sorted(i["metadata"]["name"] for i in body["items"]) if code == 200 else body})
    ns = f"sel-{n}"
    namespace(s, ns)
    running_pod(s, ns, "here")
    field = f"spec.nodeName={_escape_field_value(s.pod_node)}"
    code, body = s.call("GET", f"/api/v1/namespaces/{ns}/pods?fieldSelector={quote(field)}&limit=500")
    out.append({"pods on the node": sorted(i["metadata"]["name"] for i in body["items"]) if code == 200 else body})
    odd = "a,b=c\\d"
    code, body = s.call("GET", f"/api/v1/pods?fieldSelector={quote('spec.nodeName=' + _escape_field_value(odd))}")
    out.append({"an escaped odd node name": code, "items": len(body.get("items") or []) if code == 200 else body})
    return out


def eviction_marks(s: Server, n: str) -> list[Obs]:
    """An allowed eviction marks the pod DisruptionTarget (EvictionByEvictionAPI) and records it in the
    PDB's disruptedPods; a pod that never got scheduled is evicted without a budget check."""
    ns = f"em-{n}"
    namespace(s, ns)
    running_pod(s, ns, "web-1", grace=30, labels={"app": "web"}, finalizers=["example.com/hold"])
    running_pod(s, ns, "web-2", labels={"app": "web"})
    code, body = s.call("POST", f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nowhere", "labels": {"app": "tight"}},
        "spec": {"nodeSelector": {"no-such-label": "x"}, "containers": [{"name": "c", "image": "pause"}]}})
    assert code == 201, (s.name, body)
    pdb(s, ns, "web", {"app": "web"}, maxUnavailable=1)
    pdb(s, ns, "tight", {"app": "tight"}, minAvailable=1)
    out = [seen(evict(s, ns, "web-1"))]
    got = s.call("GET", f"/api/v1/namespaces/{ns}/pods/web-1")[1]
    target = next((c for c in got["status"].get("conditions") or [] if c.get("type") == "DisruptionTarget"), {})
    out.append({"condition": {k: target.get(k) for k in ("type", "status", "reason")}})
    budget = s.call("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/web")[1]
    out.append({"disruptedPods": sorted((budget.get("status") or {}).get("disruptedPods") or {})})
    out.append(seen(evict(s, ns, "web-2")))
    out.append(seen(evict(s, ns, "nowhere")))
    s.call("PATCH", f"/api/v1/namespaces/{ns}/pods/web-1", {"metadata": {"finalizers": None}}, content_type=MERGE)
    return out


def dry_run_pod_security(s: Server, n: str) -> list[Obs]:
    """A dry-run pod create goes through Pod Security admission as the real create does."""
    ns = f"ps-{n}"
    code, body = s.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    assert code == 201, (s.name, body)
    wait_until(lambda: s.call("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200
               or s.name == "simulator", timeout=30, what=f"{s.name}: the default service account of {ns}")
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
                  "spec": {"containers": [{"name": "c", "image": "pause", "securityContext": {"privileged": True}}]}}
    restricted = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fine"}, "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "pause", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}
    return [seen(s.call("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", privileged)),
            seen(s.call("POST", f"/api/v1/namespaces/{ns}/pods", privileged)),
            seen(s.call("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", restricted), "metadata.name"),
            seen(s.call("GET", f"/api/v1/namespaces/{ns}/pods/fine"))]


STORIES: dict[str, Story] = {f.__name__: f for f in (
    bare_node_create, node_without_a_name, node_twice, missing_node, node_patches, node_update_conflicts,
    node_lists, dry_runs, evictions, terminating_namespace, grace_periods, the_apps_grants, events,
    daemonset_pods, kubelet_stopped, field_validation, kubectl_as_a_user, budget_shapes, the_apps_selectors,
    eviction_marks, dry_run_pod_security)}


@pytest.mark.parametrize("story", list(STORIES))
def test_the_simulator_answers_as_kube_apiserver_does(world: World, story: str) -> None:
    name = f"{story.replace('_', '-')[:40]}-{uuid.uuid4().hex[:6]}"
    answers = {s.name: STORIES[story](s, name) for s in world.servers}
    sim, real = answers["simulator"], answers["kube-apiserver"]
    if sim != real:
        diffs = [f"step {i}:\n  simulator:      {a}\n  kube-apiserver: {b}"
                 for i, (a, b) in enumerate(zip(sim, real, strict=False)) if a != b]
        pytest.fail(f"{story}: the simulator differs from kube-apiserver {len(diffs)} time(s)\n" + "\n".join(diffs))

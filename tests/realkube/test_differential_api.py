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
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.realkube.conftest import World
from tests.realkube.servers import Server, pick, status_of
from tests.waiting import wait_until

Obs = dict[str, Any]
Story = Callable[[Server, str], list[Obs]]
STEWARD_NS = "gpu-fleet-steward"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


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


def running_pod(s: Server, ns: str, name: str, **extra: Any) -> None:
    code, body = s.call("POST", f"/api/v1/namespaces/{ns}/pods", pod(name, s.pod_node, **extra))
    assert code == 201, (s.name, body)

    def ready() -> bool:
        got = s.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}")[1]
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (got.get("status") or {}).get("conditions") or [])
    wait_until(ready, timeout=60, what=f"{s.name}: pod {ns}/{name} Ready")


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
            seen(s.call("GET", f"/api/v1/nodes/{n}"), "metadata.name", "spec")]


def node_without_a_name(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {}}))]


def node_twice(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("POST", "/api/v1/nodes", node(n))), seen(s.call("POST", "/api/v1/nodes", node(n)))]


def missing_node(s: Server, n: str) -> list[Obs]:
    return [seen(s.call("GET", f"/api/v1/nodes/{n}")), seen(s.call("DELETE", f"/api/v1/nodes/{n}")),
            seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"unschedulable": True}}, content_type=MERGE))]


def node_patches(s: Server, n: str) -> list[Obs]:
    s.call("POST", "/api/v1/nodes", node(n, labels={"a": "1", "b": "2"}))
    paths = ("metadata.labels", "metadata.annotations", "spec.unschedulable", "spec.taints")
    return [
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"metadata": {"labels": {"c": "3"}}}, content_type=STRATEGIC), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"metadata": {"labels": {"a": None}}}, content_type=MERGE), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"unschedulable": True}}, content_type=MERGE), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", json.dumps([{"op": "add", "path": "/metadata/annotations",
                                                                  "value": {"x": "y"}}]), content_type=JSON_PATCH), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", json.dumps([{"op": "test", "path": "/metadata/labels/b",
                                                                  "value": "nope"}]), content_type=JSON_PATCH), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
                    content_type=STRATEGIC), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"taints": [{"key": "j", "effect": "NoExecute"}]}},
                    content_type=STRATEGIC), *paths),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", "{not json", content_type=MERGE)),
        seen(s.call("PATCH", f"/api/v1/nodes/{n}", {"spec": {"unschedulable": False}}, content_type="text/plain")),
    ]


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
    body = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"ev-{n}", "namespace": STEWARD_NS},
            "involvedObject": {"kind": "Node", "name": n, "apiVersion": "v1"}, "reason": "Cordoned",
            "message": "by the steward", "type": "Normal", "source": {"component": "gpu-fleet-steward"}}
    return [seen(s.call("POST", f"/api/v1/namespaces/{STEWARD_NS}/events", body, as_app=True),
                 "reason", "involvedObject.name", "type"),
            seen(s.call("POST", f"/api/v1/namespaces/{STEWARD_NS}/events", {**body, "type": "Sideways",
                                                                               "metadata": {"name": f"bad-{n}"}}))]


STORIES: dict[str, Story] = {f.__name__: f for f in (
    bare_node_create, node_without_a_name, node_twice, missing_node, node_patches, node_update_conflicts,
    node_lists, dry_runs, evictions, terminating_namespace, grace_periods, the_apps_grants, events)}


@pytest.mark.parametrize("story", list(STORIES))
def test_the_simulator_answers_as_kube_apiserver_does(world: World, story: str) -> None:
    name = f"{story.replace('_', '-')[:40]}-{uuid.uuid4().hex[:6]}"
    answers = {s.name: STORIES[story](s, name) for s in world.servers}
    sim, real = answers["simulator"], answers["kube-apiserver"]
    if sim != real:
        diffs = [f"step {i}:\n  simulator:      {a}\n  kube-apiserver: {b}"
                 for i, (a, b) in enumerate(zip(sim, real, strict=False)) if a != b]
        pytest.fail(f"{story}: the simulator differs from kube-apiserver {len(diffs)} time(s)\n" + "\n".join(diffs))

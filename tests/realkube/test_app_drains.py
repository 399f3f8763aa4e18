"""The app's drains on a real control plane: the app's own Kubernetes adapter (shared.adapters.kube)
and drain (shared.drain.runner ``advance_drain``) against kube-apiserver v1.37, with the real
disruption, ReplicaSet, DaemonSet and namespace controllers, the scheduler, and kwok as the kubelet.

The app authenticates with its managed-identity token (reviewed by the simulator's token webhook)
and is authorized by the project's RBAC (infra/kubernetes) through the real authorizer. The oracles
are the real server's: its audit log (no pod deleted by the app except through the Eviction API) and
the pods' readiness sampled through the drain (no budget broken). The drain's timeouts are shrunk to
real seconds.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from realkube.cluster import audit_events
from shared.drain.runner import advance_drain
from shared.drain.settings import DrainSettings
from shared.drain.state import DRAINED, REFUSED, STOPPED, DrainState
from shared.kernel.clock import SystemClock
from sim.identity import APP_PRINCIPAL_ID
from tests.realkube.conftest import AKS_AUDIENCE, World, kwok_node
from tests.realkube.servers import Server, is_ready
from tests.waiting import wait_until

APP_NAMESPACE = "gpu-fleet-steward"
SETTINGS = DrainSettings(skip_wait_for_delete_timeout_s=8, pdb_blocked_timeout_s=60, drain_timeout_s=180,
                         eviction_retry_s=1.0, poll_s=1)


class StaticToken:
    """The app's credential: the token the simulated managed-identity endpoint issued for the AKS server."""

    def __init__(self, token: str) -> None:
        self.token = token

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken(self.token, int(time.time()) + 3600)


@pytest.fixture(scope="module")
def app(world: World) -> Any:
    """The app's KubeClient for the real cluster, as built from the kubeconfig ARM hands out."""
    from shared.adapters.kube.client import KubeClient

    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                  "clusters": [{"name": "c", "cluster": {
                      "server": world.real.server,
                      "certificate-authority-data": base64.b64encode(world.real.pki.ca.read_bytes()).decode()}}],
                  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                  "users": [{"name": "u", "user": {}}]}
    return KubeClient(yaml.safe_dump(kubeconfig).encode(), StaticToken(world.app_token), server_app_id=AKS_AUDIENCE,
                      clock=SystemClock(), cluster_id="realkube")


@dataclass
class Scene:
    """One story's namespace and nodes on the real cluster, set up by an administrator."""

    admin: Server
    ns: str
    pool: str
    nodes: list[str] = field(default_factory=list)

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        code, answer = self.admin.call(method, path, body, **kw)
        assert code < 300, (method, path, code, answer)
        return answer

    def node(self, suffix: str, kubelet: str = "fake") -> str:
        name = kwok_node(self.admin, f"{self.pool}-{suffix}", kubelet, labels={"pool": self.pool})
        self.nodes.append(name)
        return name

    def pods(self) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/api/v1/namespaces/{self.ns}/pods")["items"])

    def on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods() if p["spec"].get("nodeName") == node]

    def deployment(self, name: str, replicas: int, **template: Any) -> None:
        meta = {"labels": {"app": name}, **template.pop("meta", {})}
        self.call("POST", f"/apis/apps/v1/namespaces/{self.ns}/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": meta, "spec": _pod_spec(self.pool, **template)}}})
        wait_until(lambda: sum(1 for p in self.pods() if p["metadata"]["labels"].get("app") == name and is_ready(p))
                   >= replicas, timeout=60, what=f"{replicas} Ready pods of deployment {name}")

    def daemonset(self, name: str) -> None:
        self.call("POST", f"/apis/apps/v1/namespaces/{self.ns}/daemonsets", {
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": _pod_spec(self.pool)}}})
        wait_until(lambda: sum(1 for p in self.pods() if p["metadata"]["labels"].get("app") == name and is_ready(p))
                   >= len(self.nodes), timeout=60, what=f"daemonset {name} Ready on every node")

    def pdb(self, name: str, selector: dict[str, str], **spec: Any) -> None:
        self.call("POST", f"/apis/policy/v1/namespaces/{self.ns}/poddisruptionbudgets", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": selector}, **spec}})

        def observed() -> bool:
            got = self.call("GET", f"/apis/policy/v1/namespaces/{self.ns}/poddisruptionbudgets/{name}")
            return (got.get("status") or {}).get("observedGeneration") == got["metadata"].get("generation")
        wait_until(observed, timeout=60, what=f"the disruption controller observing {name}")


def _pod_spec(pool: str, **extra: Any) -> dict[str, Any]:
    return {"nodeSelector": {"pool": pool}, "terminationGracePeriodSeconds": extra.pop("grace", 2),
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}], **extra}


@pytest.fixture
def scene(world: World) -> Iterator[Scene]:
    tag = uuid.uuid4().hex[:6]
    s = Scene(world.real_server, ns=f"drain-{tag}", pool=f"p{tag}")
    s.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.ns}})
    wait_until(lambda: world.real_server.call("GET", f"/api/v1/namespaces/{s.ns}/serviceaccounts/default")[0] == 200,
               timeout=30, what="the namespace's default service account")
    yield s
    for pod in s.pods():
        if pod["metadata"].get("finalizers"):
            world.real_server.call("PATCH", f"/api/v1/namespaces/{s.ns}/pods/{pod['metadata']['name']}",
                                   {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json")


def app_requests(world: World, ns: str) -> dict[str, int]:
    """What the app's identity did to pods in ``ns``, from the API server's audit log."""
    counts: dict[str, int] = {}
    for event in audit_events(world.real.run_dir):
        ref = event.get("objectRef") or {}
        if (event.get("user") or {}).get("username") != APP_PRINCIPAL_ID or ref.get("namespace") != ns:
            continue
        key = f"{event['verb']} {ref.get('resource')}{'/' + ref['subresource'] if ref.get('subresource') else ''}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def run_drain(app: Any, node: str, *, sample: Any = None, timeout: float = 150) -> Any:
    """Cordon ``node`` as the app does, then run drain rounds until the drain ends (drained or stopped)."""
    app.patch_node(node, {"spec": {"unschedulable": True}})
    state: dict[str, DrainState] = {}
    last: dict[str, Any] = {}

    def one_round() -> Any:
        rnd = advance_drain(app, [node], previous=state, now=time.time(), settings=SETTINGS)
        state.clear()
        state.update({n: d.state for n, d in rnd.nodes.items()})
        last["round"] = rnd
        if sample is not None:
            sample()
        return rnd if (rnd.outcome == DRAINED or rnd.outcome in STOPPED) else None

    return wait_until(one_round, timeout=timeout, interval=0.5, what=f"the app's drain of {node} to end",
                      detail=lambda: last.get("round"))


def test_a_pdb_guarded_deployment_is_drained_through_the_eviction_api_within_its_budget(world: World, app: Any,
                                                                                         scene: Scene) -> None:
    first = scene.node("a")
    scene.deployment("trainer", 3)
    scene.pdb("trainer", {"app": "trainer"}, minAvailable=2)
    scene.node("b")
    scene.daemonset("agent")
    healthy: list[int] = []

    def sample() -> None:
        pods = [p for p in scene.pods() if p["metadata"]["labels"].get("app") == "trainer"]
        healthy.append(sum(1 for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")))

    rnd = run_drain(app, first, sample=sample)
    assert rnd.outcome == DRAINED, rnd.messages
    left = scene.on(first)
    assert [p["metadata"]["labels"].get("app") for p in left] == ["agent"]  # the DaemonSet's pod stays
    assert min(healthy) >= 2, f"the budget (minAvailable 2) was broken: healthy pods over the drain {healthy}"
    requests = app_requests(world, scene.ns)
    assert requests.get("create pods/eviction", 0) >= 3 and requests.get("delete pods", 0) == 0, requests


def test_a_pod_under_two_pdbs_refuses_the_node_before_any_eviction(world: World, app: Any, scene: Scene) -> None:
    node = scene.node("a")
    scene.deployment("double", 1, meta={"labels": {"app": "double", "tier": "x"}})
    scene.pdb("one", {"app": "double"}, maxUnavailable=1)
    scene.pdb("two", {"tier": "x"}, maxUnavailable=1)
    rnd = run_drain(app, node)
    assert rnd.outcome == REFUSED, rnd.messages
    assert app_requests(world, scene.ns) == {}, "no eviction (nor anything else) may be sent for a refused node"


def test_a_pod_held_by_a_finalizer_is_skipped_after_the_skip_wait_timeout(world: World, app: Any,
                                                                          scene: Scene) -> None:
    node = scene.node("a")
    scene.deployment("held", 1, meta={"labels": {"app": "held"}, "finalizers": ["example.com/hold"]})
    scene.node("b")
    started = time.monotonic()
    rnd = run_drain(app, node)
    assert rnd.outcome == DRAINED, rnd.messages
    assert time.monotonic() - started >= SETTINGS.skip_wait_for_delete_timeout_s
    held = scene.on(node)
    assert len(held) == 1 and held[0]["metadata"].get("deletionTimestamp"), "the held pod stays, terminating"
    assert app_requests(world, scene.ns).get("delete pods", 0) == 0


def test_an_eviction_in_a_terminating_namespace_is_waited_out(world: World, app: Any, scene: Scene) -> None:
    node = scene.node("a")
    scene.deployment("web", 1, meta={"labels": {"app": "web"}, "finalizers": ["example.com/hold"]})
    scene.call("DELETE", f"/api/v1/namespaces/{scene.ns}")
    pod = scene.on(node)[0]["metadata"]["name"]

    def release() -> None:
        # the namespace controller has asked the pod to go: its owner lets it
        got = world.real_server.call("GET", f"/api/v1/namespaces/{scene.ns}/pods/{pod}")[1]
        if isinstance(got, dict) and got.get("metadata", {}).get("deletionTimestamp") and got["metadata"].get("finalizers"):
            world.real_server.call("PATCH", f"/api/v1/namespaces/{scene.ns}/pods/{pod}", {"metadata": {"finalizers": None}},
                                   content_type="application/merge-patch+json")

    rnd = run_drain(app, node, sample=release)
    assert rnd.outcome == DRAINED, rnd.messages
    assert app_requests(world, scene.ns).get("delete pods", 0) == 0


def test_a_node_whose_kubelet_stopped_is_drained_past_the_pods_it_cannot_confirm(world: World, app: Any,
                                                                                  scene: Scene) -> None:
    """A GPU fault can take the kubelet down with it: evicted pods there stay Terminating (nothing
    confirms they stopped), the app waits the skip-wait timeout for each and finishes the drain,
    never deleting a pod itself."""
    world.real.start_kubelet(scene.pool)
    node = scene.node("a", kubelet=scene.pool)
    scene.deployment("trainer", 2)
    scene.node("b")
    world.real.stop_kubelet(scene.pool)

    def unreachable() -> bool:
        got = world.real_server.call("GET", f"/api/v1/nodes/{node}")[1]
        return any(t.get("key") == "node.kubernetes.io/unreachable" for t in got["spec"].get("taints") or [])
    wait_until(unreachable, timeout=90, what=f"node {node} unreachable once its kubelet stopped")
    rnd = run_drain(app, node)
    assert rnd.outcome == DRAINED, rnd.messages
    stuck = [p for p in scene.on(node) if p["metadata"].get("deletionTimestamp")]
    assert len(stuck) == 2, "both evicted pods stay Terminating: no kubelet confirms them"
    requests = app_requests(world, scene.ns)
    assert requests.get("create pods/eviction", 0) >= 2 and requests.get("delete pods", 0) == 0, requests


def test_cordon_uncordon_annotation_and_event_as_the_app(world: World, app: Any, scene: Scene) -> None:
    node = scene.node("a")
    assert app.patch_node(node, {"spec": {"unschedulable": True}}).unschedulable
    annotated = app.patch_node(node, {"metadata": {"annotations": {"gpu-fleet-steward/cordoned-for": "r-1"}}})
    assert annotated.annotations["gpu-fleet-steward/cordoned-for"] == "r-1"
    assert not app.patch_node(node, {"spec": {"unschedulable": False}}).unschedulable
    app.create_event(node=node, reason="Cordoned", message="realkube lane")

    def recorded() -> list[Any]:
        items = world.real_server.call("GET", "/api/v1/events?fieldSelector=involvedObject.name%3D" + node)[1]["items"]
        return [e for e in items if e.get("reason") == "Cordoned"]
    events = wait_until(recorded, timeout=10, what=f"the app's Cordoned event about {node}")
    assert events[0]["metadata"]["namespace"] == "default"


def self_review(world: World, verb: str, group: str, resource: str, subresource: str, namespace: str) -> bool:
    code, body = world.real_server.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                        "subresource": subresource, "namespace": namespace}}}, as_app=True)
    return code == 201 and bool((body.get("status") or {}).get("allowed"))


def test_kubectl_auth_can_i_as_the_app_allows_exactly_what_the_app_declares(world: World) -> None:
    """The real RBAC authorizer is the referee of least privilege: every rule the app's code declares
    is allowed to its identity, and the verbs it must never have are refused."""
    from shared.adapters import permissions
    from shared.adapters.kube import client as kube_client

    kubectl = shutil.which("kubectl")
    assert kubectl is not None

    def can_i(verb: str, resource: str, namespace: str | None, subresource: str = "") -> tuple[bool, str]:
        args = [kubectl, "--kubeconfig", str(world.real.admin_kubeconfig), "auth", "can-i", verb, resource,
                f"--as={APP_PRINCIPAL_ID}"]
        args += [f"--subresource={subresource}"] if subresource else []
        args += ["-n", namespace] if namespace else ["--all-namespaces"]
        out = subprocess.run(args, capture_output=True, text=True)
        return out.stdout.strip() == "yes", out.stderr.strip()

    declared = permissions.collect_scoped_kube_rules(kube_client)
    assert declared
    refused = []
    for scope, group, resource, verb in sorted(declared):
        kind, _, sub = resource.partition("/")
        namespace = {permissions.CLUSTER: None, permissions.APP_NAMESPACE: APP_NAMESPACE}.get(
            scope, permissions.namespace_of(scope))
        ok, why = can_i(verb, f"{kind}.{group}" if group else kind, namespace, sub)
        if not ok and "doesn't have a resource type" in why:
            # kubectl answers "no" for a kind the server does not serve (AKSNodeClass: its CRD is in
            # github.com/Azure/karpenter-provider-azure, not served by the module proxy); the real
            # authorizer is asked directly, as the app
            ok = self_review(world, verb, group, kind, sub, namespace or "")
        if not ok:
            refused.append((scope, group, resource, verb, why))
    # AKSNodeClass's CRD (github.com/Azure/karpenter-provider-azure) is not served by the module proxy:
    # kubectl still asks the authorizer, warning that the server does not know the kind.
    assert refused == [], f"the real authorizer refuses rules the app declares: {refused}"
    never = [("delete", "pods", "default"), ("create", "pods", "default"), ("get", "secrets", "kube-system"),
             ("update", "nodes", None), ("delete", "nodes", None), ("create", "events", "kube-system")]
    allowed = [n for n in never if can_i(*n)[0]]
    assert allowed == [], f"the app's identity may do more than it needs: {allowed}"


@pytest.mark.parametrize("overrides", [
    pytest.param({}, id="on-demand"),
    pytest.param({"spot": {}}, id="spot"),
    pytest.param({"zones": ["1", "2"]}, id="zonal"),
])
def test_the_apps_karpenter_node_pool_is_accepted_by_karpenters_own_crd(world: World, app: Any,
                                                                        overrides: dict[str, Any]) -> None:
    """The NodePool the app writes for a NAP pool request, judged by Karpenter's own CRD (its structural
    schema and CEL rules, sigs.k8s.io/karpenter pkg/apis/crds) on the real API server, then read back
    and deleted as the app does."""
    from shared.fleet import gpu_sizes
    from shared.pools import nap
    from shared.pools.policy import PoolRequestPolicy
    from shared.pools.validation import ValidatedRequest, parse_and_validate
    from tests.unit.fakes_pool import NAP_CLUSTER, message

    name = f"rk{uuid.uuid4().hex[:6]}"
    result = parse_and_validate(message(cluster=NAP_CLUSTER, poolName=name, **overrides), policy=PoolRequestPolicy(),
                                in_scope=lambda _: True)
    assert isinstance(result, ValidatedRequest), result
    size = gpu_sizes.lookup(result.request.vm_size)
    assert size is not None
    pool = nap.node_pool(result.request, size=size, location="westeurope")
    created = app.apply_object(pool)
    assert created["metadata"]["name"] == pool["metadata"]["name"]
    got = app.get_object(nap.NODEPOOL_API, "NodePool", pool["metadata"]["name"])
    assert got is not None and got["spec"]["limits"] == pool["spec"]["limits"]
    app.delete_object(nap.NODEPOOL_API, "NodePool", pool["metadata"]["name"])

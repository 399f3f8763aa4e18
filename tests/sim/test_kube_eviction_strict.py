"""The eviction subresource answers as kube-apiserver does (pkg/registry/core/pod/storage/eviction.go).

In-process, manual clock: the API handler (`sim.kube.api.KubeApi.handle`) over a small cluster. Each test
pins one refusal or one permission of the real server, with its exact status, reason, message, causes and
Retry-After, because the app is coded against these answers.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.core.http import Headers, Request, Response
from sim.identity.tokens import AKS_AUDIENCES
from sim.kube.api import KubeApi
from sim.model import Cluster, Fleet, SimClock
from sim.scenario import add_pool, add_workload

BASE = "/k8s/s/rg/c"
PDB_PATH = f"{BASE}/apis/policy/v1/namespaces/shop/poddisruptionbudgets"


class Sim:
    def __init__(self, **timings: float) -> None:
        self.fleet = Fleet(seed=11, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                           timings={"node_ready_s": 10, "pod_start_s": 2, **timings})
        self.c: Cluster = self.fleet.add_cluster(subscription="s", resource_group="rg", name="c")
        self.api = KubeApi(self.fleet)
        self.token = self.fleet.tokens.issue(AKS_AUDIENCES[0])[0]
        with self.fleet.lock:
            add_pool(self.c, {"name": "cpu", "vmSize": "Standard_D8s_v5", "count": 2})
        self.fleet.advance(11)

    def workload(self, **spec: Any) -> None:
        with self.fleet.lock:
            add_workload(self.c, {"namespace": "shop", **spec})
            self.fleet.settle()
        self.fleet.advance(3)

    def call(self, method: str, path: str, body: Any = None, *,
             ctype: str = "application/json") -> tuple[int, dict[str, Any], dict[str, str]]:
        raw = b"" if body is None else json.dumps(body).encode()
        resp: Response = self.api.handle(Request(method, path, Headers({
            "Authorization": f"Bearer {self.token}", "Content-Type": ctype}), raw))
        return resp.status, (json.loads(resp.body) if resp.body else {}), dict(resp.headers)

    def evict(self, pod: str, *, query: str = "", delete_options: dict[str, Any] | None = None,
              ns: str = "shop") -> tuple[int, dict[str, Any], dict[str, str]]:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": pod, "namespace": ns}}
        if delete_options is not None:
            body["deleteOptions"] = delete_options
        return self.call("POST", f"{BASE}/api/v1/namespaces/{ns}/pods/{pod}/eviction{query}", body)

    def pods(self, app: str, ns: str = "shop") -> list[Any]:
        return [p for p in self.c.items("pods", ns) if (p.meta.get("labels") or {}).get("app") == app]

    def live(self, app: str) -> list[Any]:
        return [p for p in self.pods(app) if not p.terminating]

    def pdb_status(self, name: str) -> dict[str, Any]:
        pdb = self.c.get("poddisruptionbudgets.policy", "shop", name)
        assert pdb is not None
        return dict(pdb.obj.get("status") or {})

    def write_pdb_status(self, name: str, **changes: Any) -> None:
        status, obj, _ = self.call("GET", f"{PDB_PATH}/{name}")
        assert status == 200
        obj["status"].update(changes)
        status, _, _ = self.call("PUT", f"{PDB_PATH}/{name}/status", obj)
        assert status == 200


@pytest.fixture
def sim() -> Sim:
    return Sim()


# --------------------------------------------------------------------------- budgets (checkAndDecrement)


def test_a_healthy_pod_with_no_disruption_left_gets_429_without_retry_after(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=2, pdb={"minAvailable": 2})
    status, body, headers = sim.evict(sim.live("web")[0].name)
    assert status == 429
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"] == {"causes": [{"reason": "DisruptionBudget",
                                           "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}
    assert "Retry-After" not in headers


def test_an_allowed_eviction_uses_one_disruption_records_the_pod_and_marks_it_a_disruption_target(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    assert sim.pdb_status("web")["disruptionsAllowed"] == 2
    victim = sim.live("web")[0]
    pdb = sim.c.get("poddisruptionbudgets.policy", "shop", "web")
    assert pdb is not None
    written: list[dict[str, Any]] = []
    original = sim.c.record_pdb_eviction

    def spy(p: Any, name: str) -> None:
        original(p, name)
        written.append(json.loads(json.dumps(p.obj["status"])))

    sim.c.record_pdb_eviction = spy  # type: ignore[method-assign]
    status, body, _ = sim.evict(victim.name)
    assert (status, body["status"]) == (201, "Success")
    assert written[0]["disruptionsAllowed"] == 1 and victim.name in written[0]["disruptedPods"]
    assert victim.terminating
    target = next(c for c in victim.obj["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (target["status"], target["reason"], target["message"]) == ("True", "EvictionByEvictionAPI",
                                                                       "Eviction API: evicting")
    # the controller sees the pod deleting: it leaves disruptedPods and stops counting as healthy
    assert "disruptedPods" not in sim.pdb_status("web")
    assert sim.pdb_status("web")["currentHealthy"] == 2


def test_disruptions_allowed_below_zero_is_a_403_naming_the_budget(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    sim.write_pdb_status("web", disruptionsAllowed=-1)
    victim = sim.live("web")[0]
    status, body, _ = sim.evict(victim.name)
    assert status == 403
    assert body["reason"] == "Forbidden"
    assert body["message"] == 'poddisruptionbudget.policy "web" is forbidden: pdb disruptions allowed is negative'
    assert body["details"] == {"name": "web", "group": "policy", "kind": "poddisruptionbudget"}
    assert not victim.terminating


def test_a_disrupted_pods_map_over_2000_is_a_403(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    sim.write_pdb_status("web", disruptedPods={f"gone-{i}": "2025-12-02T14:00:00Z" for i in range(2001)})
    status, body, _ = sim.evict(sim.live("web")[0].name)
    assert status == 403
    assert body["message"] == ('poddisruptionbudget.policy "web" is forbidden: DisruptedPods map too big - '
                               "too many evictions not confirmed by PDB controller")


def test_exactly_2000_disrupted_pods_is_still_allowed(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    sim.write_pdb_status("web", disruptedPods={f"gone-{i}": "2025-12-02T14:00:00Z" for i in range(2000)})
    assert sim.evict(sim.live("web")[0].name)[0] == 201


def test_a_status_written_by_a_client_lasts_until_the_disruption_controller_observes_it(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    sim.write_pdb_status("web", disruptionsAllowed=-1)
    sim.fleet.advance(0.5)
    assert sim.pdb_status("web")["disruptionsAllowed"] == -1
    sim.fleet.advance(0.5)
    assert sim.pdb_status("web")["disruptionsAllowed"] == 2
    assert sim.evict(sim.live("web")[0].name)[0] == 201


def test_a_new_pdb_answers_429_with_retry_after_until_its_status_is_observed() -> None:
    sim = Sim(pdb_observe_s=3)
    sim.workload(kind="Deployment", name="web", replicas=3)
    status, _, _ = sim.call("POST", PDB_PATH, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                               "metadata": {"name": "web"},
                                               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    assert status == 201
    assert sim.pdb_status("web") == {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0,
                                     "expectedPods": 0}
    status, body, headers = sim.evict(sim.live("web")[0].name)
    assert status == 429
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"] == {"causes": [{"reason": "DisruptionBudget", "message":
                                           "The disruption budget web is still being processed by the server."}],
                               "retryAfterSeconds": 10}
    assert headers["Retry-After"] == "10"
    sim.fleet.advance(3)
    assert sim.pdb_status("web")["observedGeneration"] == 1
    assert sim.evict(sim.live("web")[0].name)[0] == 201


def test_a_changed_pdb_spec_is_not_observed_at_once() -> None:
    sim = Sim(pdb_observe_s=2)
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    status, obj, _ = sim.call("PATCH", f"{PDB_PATH}/web", {"spec": {"minAvailable": 2}},
                              ctype="application/merge-patch+json")
    assert status == 200 and obj["metadata"]["generation"] == 2 and obj["status"]["observedGeneration"] == 1
    status, _body, headers = sim.evict(sim.live("web")[0].name)
    assert (status, headers.get("Retry-After")) == (429, "10")
    sim.fleet.advance(2)
    assert sim.pdb_status("web")["observedGeneration"] == 2
    assert sim.pdb_status("web")["disruptionsAllowed"] == 1


def test_more_than_one_pdb_is_a_500_status_without_a_reason(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=2, pdb={"minAvailable": 1})
    with sim.fleet.lock:
        sim.c.put("poddisruptionbudgets.policy", {"metadata": {"name": "also", "namespace": "shop"},
                                                  "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    status, body, _ = sim.evict(sim.live("web")[0].name)
    assert status == 500
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                               "does not support.", "code": 500}


# --------------------------------------------------------------------------- unready pods


def _mixed(sim: Sim, *, min_available: int, policy: str | None = None) -> str:
    """Three Ready `web` pods and one never-Ready `sick` pod under one PDB; returns the sick pod."""
    sim.workload(kind="Deployment", name="web", replicas=3, labels={"tier": "front"})
    sim.workload(kind="Deployment", name="sick", replicas=1, labels={"tier": "front"}, ready=False)
    spec: dict[str, Any] = {"minAvailable": min_available, "selector": {"matchLabels": {"tier": "front"}}}
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    with sim.fleet.lock:
        sim.c.put("poddisruptionbudgets.policy", {"metadata": {"name": "front", "namespace": "shop"}, "spec": spec})
    sim.fleet.advance(2)
    sick = sim.live("sick")[0]
    assert sick.phase == "Running"
    assert not any(c["type"] == "Ready" and c["status"] == "True" for c in sick.obj["status"]["conditions"])
    return sick.name


def test_an_unready_pod_is_evicted_without_using_the_budget_when_the_budget_is_healthy(sim: Sim) -> None:
    sick = _mixed(sim, min_available=3)
    assert sim.pdb_status("front")["disruptionsAllowed"] == 0
    status, _, _ = sim.evict(sick)
    assert status == 201
    assert sim.c.pods[("shop", sick)].terminating


@pytest.mark.parametrize(("policy", "expected"), [(None, 429), ("IfHealthyBudget", 429), ("AlwaysAllow", 201)],
                         ids=["default-policy", "if-healthy-budget", "always-allow"])
def test_an_unready_pod_under_a_budget_short_of_healthy_pods_follows_the_unhealthy_pod_eviction_policy(
        sim: Sim, policy: str | None, expected: int) -> None:
    sick = _mixed(sim, min_available=4, policy=policy)
    st = sim.pdb_status("front")
    assert (st["currentHealthy"], st["desiredHealthy"]) == (3, 4)
    status, body, _ = sim.evict(sick)
    assert status == expected
    if expected == 429:
        assert body["details"]["causes"] == [{"reason": "DisruptionBudget", "message":
                                              "The disruption budget front needs 4 healthy pods and has 3 currently"}]
        assert not sim.c.pods[("shop", sick)].terminating


def test_unready_pods_of_a_budget_that_wants_none_still_need_a_disruption(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="sick", replicas=2, ready=False, pdb={"maxUnavailable": "100%"})
    st = sim.pdb_status("sick")
    assert (st["currentHealthy"], st["desiredHealthy"], st["disruptionsAllowed"]) == (0, 0, 0)
    assert sim.evict(sim.live("sick")[0].name)[0] == 429  # desiredHealthy > 0 is required to skip the budget


def test_a_pending_pod_is_deleted_without_a_budget_check(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="huge", replicas=1, resources={"cpu": "64"}, pdb={"minAvailable": 1})
    pod = sim.pods("huge")[0]
    assert pod.phase == "Pending"
    assert sim.evict(pod.name)[0] == 201
    assert ("shop", pod.name) not in sim.c.pods


# --------------------------------------------------------------------------- dry run


def test_a_dry_run_eviction_changes_nothing(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    before = sim.pdb_status("web")
    victim = sim.live("web")[0]
    rv = victim.meta["resourceVersion"]
    status, body, _ = sim.evict(victim.name, query="?dryRun=All")
    assert (status, body["status"]) == (201, "Success")
    status, _, _ = sim.evict(victim.name, delete_options={"dryRun": ["All"]})
    assert status == 201
    assert not victim.terminating and victim.meta["resourceVersion"] == rv
    assert not any(c["type"] == "DisruptionTarget" for c in victim.obj["status"]["conditions"])
    assert sim.pdb_status("web") == before


def test_a_dry_run_eviction_is_refused_as_a_real_one_would_be(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=2, pdb={"minAvailable": 2})
    assert sim.evict(sim.live("web")[0].name, query="?dryRun=All")[0] == 429


def test_dry_run_options_that_disagree_are_a_500(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=1)
    status, body, _ = sim.evict(sim.live("web")[0].name, query="?dryRun=All", delete_options={"dryRun": ["Nope"]})
    assert status == 500
    assert body["message"] == "Non-matching dry-run options in request and content: [All] and [Nope]"


# --------------------------------------------------------------------------- preconditions


def test_a_uid_precondition_that_does_not_match_is_a_409(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=1)
    pod = sim.live("web")[0]
    status, body, _ = sim.evict(pod.name, delete_options={"preconditions": {"uid": "other"}})
    assert status == 409
    assert body["message"] == (f'Operation cannot be fulfilled on Pod "{pod.name}": the UID in the precondition '
                               f"(other) does not match the UID in record ({pod.meta['uid']}). The object might "
                               "have been deleted and then recreated")


# --------------------------------------------------------------------------- terminating namespaces


def _terminating_shop(sim: Sim) -> str:
    sim.workload(kind="Deployment", name="web", replicas=2, pod_finalizers=["example.com/hold"],
                 pdb={"minAvailable": 1})
    status, obj, _ = sim.call("DELETE", f"{BASE}/api/v1/namespaces/shop")
    assert status == 200 and obj["status"]["phase"] == "Terminating"
    return sim.pods("web")[0].name


def test_evicting_in_a_terminating_namespace_is_a_403_with_the_namespace_terminating_cause(sim: Sim) -> None:
    pod = _terminating_shop(sim)
    status, body, _ = sim.evict(pod)
    assert status == 403
    assert body["reason"] == "Forbidden"
    assert body["message"] == (f'pods "{pod}" is forbidden: unable to create new content in namespace shop '
                               "because it is being terminated")
    assert body["details"] == {"name": pod, "group": "", "kind": "pods", "causes": [
        {"reason": "NamespaceTerminating", "message": "namespace shop is being terminated",
         "field": "metadata.namespace"}]}


def test_creating_anything_in_a_terminating_namespace_is_a_403(sim: Sim) -> None:
    _terminating_shop(sim)
    status, body, _ = sim.call("POST", f"{BASE}/api/v1/namespaces/shop/configmaps",
                               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}})
    assert status == 403
    assert body["message"] == ('configmaps "cfg" is forbidden: unable to create new content in namespace shop '
                               "because it is being terminated")
    status, body, _ = sim.call("POST", f"{BASE}/apis/apps/v1/namespaces/shop/deployments",
                               {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                                "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                                    "metadata": {"labels": {"a": "b"}},
                                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
    assert status == 403
    assert body["message"].startswith('deployments.apps "d" is forbidden: unable to create new content')
    assert body["details"]["causes"][0]["reason"] == "NamespaceTerminating"


def test_a_namespace_stays_terminating_while_finalizers_hold_its_pods_then_goes(sim: Sim) -> None:
    _terminating_shop(sim)
    sim.fleet.advance(60)
    status, ns, _ = sim.call("GET", f"{BASE}/api/v1/namespaces/shop")
    assert status == 200 and ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
    assert ns["spec"]["finalizers"] == ["kubernetes"]
    conds = {c["type"]: c for c in ns["status"]["conditions"]}
    assert conds["NamespaceContentRemaining"]["message"] == "Some resources are remaining: pods. has 2 resource instances"
    assert conds["NamespaceFinalizersRemaining"]["message"] == \
        "Some finalizers are remaining: example.com/hold in 2 resource instances"
    assert conds["NamespaceDeletionDiscoveryFailure"]["status"] == "False"
    assert sim.c.get("deployments.apps", "shop", "web") is None
    for pod in sim.pods("web"):
        status, _, _ = sim.call("PATCH", f"{BASE}/api/v1/namespaces/shop/pods/{pod.name}",
                                [{"op": "remove", "path": "/metadata/finalizers"}], ctype="application/json-patch+json")
        assert status == 200
    assert sim.pods("web") == []
    sim.fleet.advance(9)  # the namespace controller re-checks estimate/2 + 1 s later (15 s with finalizers)
    assert sim.call("GET", f"{BASE}/api/v1/namespaces/shop")[0] == 404


def test_an_empty_namespace_goes_at_once(sim: Sim) -> None:
    with sim.fleet.lock:
        sim.c.ensure_namespace("scratch")
    status, obj, _ = sim.call("DELETE", f"{BASE}/api/v1/namespaces/scratch")
    assert status == 200 and obj["status"]["phase"] == "Terminating"
    assert sim.call("GET", f"{BASE}/api/v1/namespaces/scratch")[0] == 404


def test_a_namespace_with_running_pods_goes_after_their_grace_period(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=2, terminationGracePeriodSeconds=10)
    assert sim.call("DELETE", f"{BASE}/api/v1/namespaces/shop")[0] == 200
    assert all(p.terminating for p in sim.pods("web"))
    assert sim.c.namespace_terminating("shop")
    sim.fleet.advance(11)
    assert sim.pods("web") == []
    sim.fleet.advance(6)  # requeued after 10/2 + 1 s
    assert sim.call("GET", f"{BASE}/api/v1/namespaces/shop")[0] == 404


@pytest.mark.parametrize("name", ["default", "kube-system", "kube-public"])
def test_the_immortal_namespaces_may_not_be_deleted(sim: Sim, name: str) -> None:
    from sim.kube.api import ApiError

    with pytest.raises(ApiError) as e, sim.fleet.lock:
        sim.c.delete_namespace(name)
    assert (e.value.code, e.value.message) == (403, f'namespaces "{name}" is forbidden: this namespace may not be deleted')


def test_deleting_a_terminating_namespace_again_answers_it_as_it_is(sim: Sim) -> None:
    """kube-apiserver v1.37 answers 200 with the namespace (tests/realkube found the 409 we believed)."""
    _terminating_shop(sim)
    with sim.fleet.lock:
        ns = sim.c.delete_namespace("shop")
    assert ns.meta.get("deletionTimestamp") and ns.obj["status"]["phase"] == "Terminating"


def test_a_dry_run_with_a_stale_uid_gets_the_stores_precondition_conflict(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=1)
    pod = sim.live("web")[0]
    status, body, _ = sim.evict(pod.name, query="?dryRun=All", delete_options={"preconditions": {"uid": "other"}})
    assert status == 409
    assert body["message"] == (f'Operation cannot be fulfilled on pods "{pod.name}": Precondition failed: UID in '
                               f"precondition: other, UID in object meta: {pod.meta['uid']}")


def test_the_budget_is_checked_before_the_preconditions(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=2, pdb={"minAvailable": 2})
    assert sim.evict(sim.live("web")[0].name, delete_options={"preconditions": {"uid": "other"}})[0] == 429

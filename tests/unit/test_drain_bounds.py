"""The bounded drain (issue 10, "Kubernetes: the app" 1-5), as tables over the pure decision.

- how a refused eviction is classified (status + reason + causes, as a real API server answers);
- the plan is decided before anything is disrupted (kubectl ``GetPodsForDeletion``);
- pods stuck terminating are waited for until their ``deletionTimestamp`` (grace included) plus
  DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S, never longer;
- a budget that never frees up stops the drain after DRAIN_PDB_BLOCKED_TIMEOUT_S, naming the PDB;
- a pod under two PDBs stops the drain.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from shared.adapters.kube.errors import classify_eviction_error
from shared.drain.filters import pdbs_covering, selector_matches
from shared.drain.settings import DrainSettings
from shared.drain.state import DRAINED, REFUSED, STALLED, TIMED_OUT, DrainState, drain_step, record_eviction, retry_delay
from shared.kernel.ports import EvictionResult, PodView
from tests.unit.fakes_remediation import make_pod

NOW = 1_764_684_000.0
SETTINGS = DrainSettings()


def status(code: int, reason: str, message: str, **details: Any) -> bytes:
    """A ``metav1.Status`` body as kube-apiserver writes it."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return json.dumps(body).encode()


def labelled(pod: PodView, **labels: str) -> PodView:
    return msgspec.structs.replace(pod, labels=labels)


def pdb(name: str, *, namespace: str = "default", selector: dict[str, Any] | None = None, allowed: int = 0,
        current: int = 1, desired: int = 1, expected: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": selector if selector is not None else {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": current, "desiredHealthy": desired,
                       "expectedPods": expected}}


# --------------------------------------------------------------------------- app 1 + 5: what a refusal means

# kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go and the NamespaceLifecycle admission plugin.
ANSWERS = [
    ("429 no disruption allowed is a budget refusal",
     429, status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                 causes=[{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods "
                                                                  "and has 1 currently"}]), {},
     "blocked", None, "The disruption budget web needs 2"),
    ("429 for a PDB not yet observed honours Retry-After",
     429, status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                 retryAfterSeconds=10), {"Retry-After": "10"}, "blocked", 10.0, ""),
    ("403 NamespaceTerminating means wait for the namespace controller",
     403, status(403, "Forbidden", 'pods "web-1" is forbidden: unable to create new content in namespace doomed '
                 "because it is being terminated", name="web-1", kind="pods",
                 causes=[{"reason": "NamespaceTerminating", "message": "namespace doomed is being terminated",
                          "field": "metadata.namespace"}]), {},
     "namespace_terminating", None, "being terminated"),
    ("403 negative disruptionsAllowed is a budget refusal, not RBAC",
     403, status(403, "Forbidden", 'poddisruptionbudget.policy "web" is forbidden: pdb disruptions allowed is negative',
                 group="policy", kind="poddisruptionbudget", name="web"), {},
     "blocked", None, "negative"),
    ("403 DisruptedPods over its cap (newer servers add a DisruptionBudget cause)",
     403, status(403, "Forbidden", 'poddisruptionbudget.policy "web" is forbidden: DisruptedPods map too big - too '
                 "many evictions not confirmed by PDB controller", group="policy", kind="poddisruptionbudget",
                 name="web", causes=[{"reason": "DisruptionBudget", "message": "The disruption budget web does not "
                                      "allow evicting pods currently: too many pending evictions"}]), {},
     "blocked", None, "DisruptedPods"),
    ("404 is gone", 404, status(404, "NotFound", 'pods "web-1" not found', name="web-1", kind="pods"), {},
     "gone", None, "not found"),
    ("500 for a pod under two PDBs stops the drain",
     500, status(500, "InternalError", "Internal error occurred: This pod has more than one PodDisruptionBudget, "
                 "which the eviction subresource does not support.",
                 causes=[{"message": "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                                     "does not support."}]), {},
     "multiple_pdbs", None, "more than one"),
]


@pytest.mark.parametrize(("code", "body", "headers", "outcome", "retry_after", "says"),
                         [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_an_eviction_answer_is_classified_by_status_reason_and_causes(code: int, body: bytes, headers: dict[str, str],
                                                                      outcome: str, retry_after: float | None,
                                                                      says: str) -> None:
    result = classify_eviction_error(code, body, headers)
    assert result is not None
    assert (result.outcome, result.retry_after) == (outcome, retry_after)
    assert says in result.message


PLAIN_ERRORS = [
    ("an RBAC 403 is an error (Forbidden: check RBAC)",
     403, status(403, "Forbidden", 'pods "web-1" is forbidden: User "steward" cannot create resource "pods/eviction"',
                 name="web-1", group="", kind="pods")),
    ("a 500 that is not the two-PDB one is an error (Transient, retried)",
     500, status(500, "InternalError", "Internal error occurred: etcdserver: request timed out")),
    ("a 503 is an error", 503, b"service unavailable"),
]


@pytest.mark.parametrize(("code", "body"), [e[1:] for e in PLAIN_ERRORS], ids=[e[0] for e in PLAIN_ERRORS])
def test_other_refusals_stay_errors_for_the_caller(code: int, body: bytes) -> None:
    assert classify_eviction_error(code, body, {}) is None


def test_the_403_names_the_budget_that_refused() -> None:
    result = classify_eviction_error(403, status(403, "Forbidden", "pdb disruptions allowed is negative",
                                                 group="policy", kind="poddisruptionbudget", name="web"))
    assert result is not None and result.pdb == "web"


def test_a_terminating_namespace_is_waited_for_and_never_counts_as_a_budget_stall() -> None:
    settings = DrainSettings(pdb_blocked_timeout_s=60, drain_timeout_s=3600)
    pod = make_pod("web-1", "n", namespace="doomed")
    state, actions = drain_step(node="n", pods=[pod], previous=DrainState(), now=NOW, settings=settings)
    for t in range(0, 600, 5):
        for action in actions:
            state = record_eviction(state, action, EvictionResult("namespace_terminating", "being terminated"),
                                          now=NOW + t, grace=30, settings=settings)
        state, actions = drain_step(node="n", pods=[pod], previous=state, now=NOW + t + 5, settings=settings)
        assert state.outcome == "", state.reason
    assert "namespace is being deleted" in state.messages["doomed/web-1"]
    # the namespace controller deletes the pod: it is now terminating and waited for until it goes
    gone = msgspec.structs.replace(pod, deletion_timestamp=NOW + 630)
    state, actions = drain_step(node="n", pods=[gone], previous=state, now=NOW + 610, settings=settings)
    assert actions == [] and state.outcome == ""
    state, _ = drain_step(node="n", pods=[], previous=state, now=NOW + 640, settings=settings)
    assert state.outcome == "drained"


# --------------------------------------------------------------------------- app 2: decide before disrupting

REFUSALS = [
    ("a pod without a controller", DrainSettings(), [make_pod("bare", "n", owner=None)], None,
     "default/bare", "REMEDIATION_UNMANAGED_PODS=evict"),
    ("an emptyDir pod under refuse", DrainSettings(empty_dir="refuse"), [make_pod("cache", "n", empty_dir=True)],
     None, "default/cache", "REMEDIATION_EMPTY_DIR=evict"),
    ("a pod under two PodDisruptionBudgets", DrainSettings(), [labelled(make_pod("web-0", "n"), app="web")],
     [pdb("web-a"), pdb("web-b", selector={"matchExpressions": [{"key": "app", "operator": "Exists"}]})],
     "default/web-0", "web-a, web-b"),
]


@pytest.mark.parametrize(("settings", "odd", "pdbs", "pod", "says"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_node_with_a_pod_that_fails_a_filter_is_refused_before_anything_is_evicted(
        settings: DrainSettings, odd: list[PodView], pdbs: list[dict[str, Any]] | None, pod: str, says: str) -> None:
    ordinary = [make_pod(f"train-{i}", "n") for i in range(3)] + [make_pod("dcgm", "n", owner="DaemonSet")]
    state, actions = drain_step(node="n", pods=[*ordinary, *odd], previous=DrainState(), now=NOW,
                                      settings=settings, pdbs=pdbs)
    assert actions == [], "nothing may be evicted from a node that cannot be drained"
    assert state.outcome == REFUSED
    assert pod in state.reason and says in state.reason and "before evicting anything" in state.reason


def test_the_same_pods_allowed_by_the_setting_are_evicted_with_the_rest() -> None:
    settings = DrainSettings(unmanaged_pods="evict")
    pods = [make_pod("train-0", "n"), make_pod("bare", "n", owner=None)]
    state, actions = drain_step(node="n", pods=pods, previous=DrainState(), now=NOW, settings=settings)
    assert sorted(a.name for a in actions) == ["bare", "train-0"] and state.outcome == ""


def test_one_pdb_per_pod_refuses_nothing() -> None:
    pods = [labelled(make_pod("web-0", "n"), app="web"), labelled(make_pod("db-0", "n"), app="db")]
    pdbs = [pdb("web"), pdb("db", selector={"matchLabels": {"app": "db"}})]
    state, actions = drain_step(node="n", pods=pods, previous=DrainState(), now=NOW, settings=SETTINGS,
                                      pdbs=pdbs)
    assert len(actions) == 2 and state.outcome == ""


SELECTORS = [
    ("matchLabels equal", {"matchLabels": {"app": "web"}}, {"app": "web"}, True),
    ("matchLabels differ", {"matchLabels": {"app": "web"}}, {"app": "db"}, False),
    ("In", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}, {"app": "api"}, True),
    ("NotIn on a missing key", {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}, {}, True),
    ("DoesNotExist", {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"app": "web"}, False),
    ("an empty selector matches every pod (policy/v1)", {}, {"anything": "x"}, True),
    ("a null selector matches none", None, {"app": "web"}, False),
]


@pytest.mark.parametrize(("selector", "labels", "matches"), [s[1:] for s in SELECTORS], ids=[s[0] for s in SELECTORS])
def test_pdb_selectors_match_like_the_api_server(selector: dict[str, Any] | None, labels: dict[str, str],
                                                 matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


def test_a_pdb_of_another_namespace_never_covers_the_pod() -> None:
    pod = labelled(make_pod("web-0", "n", namespace="team-a"), app="web")
    assert pdbs_covering(pod, [pdb("web", namespace="team-b")]) == []


# --------------------------------------------------------------------------- app 3: pods stuck terminating


def test_a_terminating_pods_wait_ends_at_its_deletion_timestamp_without_adding_the_grace_period_again() -> None:
    settings = DrainSettings(drain_timeout_s=600)
    # deleted with a 30 s grace period: the API server set deletionTimestamp = delete time + 30 s
    pod = make_pod("web", "n", grace=30, deleting=NOW - 1)
    previous = DrainState(started_at=NOW - 600)
    state, _ = drain_step(node="n", pods=[pod], previous=previous, now=NOW, settings=settings)
    assert state.outcome == TIMED_OUT  # its grace period ended 1 s ago; no second 30 s


STUCK = [
    ("inside its grace period", NOW + 20, 300, "", ["default/web"]),
    ("past its deletion time, under the timeout", NOW - 299, 300, "", ["default/web"]),
    ("past its deletion time by more than the timeout", NOW - 301, 300, DRAINED, []),
    ("the rule off (0): waited for", NOW - 5000, 0, "", ["default/web"]),
]


@pytest.mark.parametrize(("deletion", "timeout", "outcome", "remaining"), [s[1:] for s in STUCK], ids=[s[0] for s in STUCK])
def test_a_pod_stuck_terminating_is_skipped_after_the_skip_wait_timeout(deletion: float, timeout: int, outcome: str,
                                                                        remaining: list[str]) -> None:
    settings = DrainSettings(skip_wait_for_delete_timeout_s=timeout, drain_timeout_s=86400)
    pod = make_pod("web", "n", deleting=deletion)
    state, actions = drain_step(node="n", pods=[pod], previous=DrainState(started_at=NOW - 10),
                                      now=NOW, settings=settings)
    assert actions == [] and state.outcome == outcome and state.remaining == remaining
    if outcome == DRAINED:
        assert "DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S=300" in state.messages["default/web"]


def test_the_drain_wakes_up_when_a_stuck_pod_passes_the_skip_wait_timeout() -> None:
    settings = DrainSettings(skip_wait_for_delete_timeout_s=300, poll_s=3600, drain_timeout_s=86400)
    pod = make_pod("web", "n", deleting=NOW - 100)
    state, _ = drain_step(node="n", pods=[pod], previous=DrainState(started_at=NOW), now=NOW, settings=settings)
    assert state.wake_at == NOW - 100 + 300 + 1


def test_the_skip_wait_setting_defaults_to_cluster_apis_300_seconds_and_reads_from_the_environment() -> None:
    assert DrainSettings().skip_wait_for_delete_timeout_s == 300
    env = {"DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S": "0", "DRAIN_PDB_BLOCKED_TIMEOUT_S": "600"}
    settings = DrainSettings.from_env(env)
    assert (settings.skip_wait_for_delete_timeout_s, settings.pdb_blocked_timeout_s) == (0, 600)


# --------------------------------------------------------------------------- app 4: a budget that never frees up


def _refused_for(seconds: float, *, settings: DrainSettings, pdbs: list[dict[str, Any]] | None
                 ) -> tuple[DrainState, int]:
    """Drive one pod a PDB always refuses (429) for ``seconds``; returns the state and the eviction calls."""
    pod = labelled(make_pod("web-0", "n"), app="web")
    state, actions = drain_step(node="n", pods=[pod], previous=DrainState(), now=NOW, settings=settings,
                                      pdbs=pdbs)
    calls, now = 0, NOW
    while state.outcome == "" and now < NOW + seconds:
        for action in actions:
            calls += 1
            state = record_eviction(state, action, EvictionResult(
                "blocked", "Cannot evict pod as it would violate the pod's disruption budget."),
                now=now, grace=30, settings=settings)
        now = max(now + 1.0, state.wake_at or now + 1.0)
        state, actions = drain_step(node="n", pods=[pod], previous=state, now=now, settings=settings, pdbs=pdbs)
    return state, calls


def test_a_budget_that_never_frees_up_stops_the_drain_after_the_pdb_blocked_timeout_naming_the_pdb() -> None:
    settings = DrainSettings(pdb_blocked_timeout_s=1800, drain_timeout_s=3600, poll_s=20)
    state, calls = _refused_for(3600, settings=settings, pdbs=[pdb("web", current=1, desired=1, expected=1)])
    assert state.outcome == STALLED
    assert "default/web (disruptionsAllowed=0, currentHealthy=1, desiredHealthy=1, expectedPods=1)" in state.reason
    assert "DRAIN_PDB_BLOCKED_TIMEOUT_S=1800" in state.reason and "default/web-0" in state.reason
    assert calls <= 1800 / 20 + 5, f"{calls} eviction calls: the refusals back off to the poll interval"


def test_a_budget_stall_without_a_pdb_list_still_says_what_the_server_answered() -> None:
    settings = DrainSettings(pdb_blocked_timeout_s=120, poll_s=20)
    state, _ = _refused_for(600, settings=settings, pdbs=None)
    assert state.outcome == STALLED and "disruption budget" in state.reason


def test_a_budget_that_frees_up_before_the_timeout_lets_the_drain_finish() -> None:
    settings = DrainSettings(pdb_blocked_timeout_s=1800)
    state, _ = _refused_for(1700, settings=settings, pdbs=None)
    assert state.outcome == ""
    pod = labelled(make_pod("web-0", "n"), app="web")
    state, actions = drain_step(node="n", pods=[pod], previous=state, now=NOW + 1790, settings=settings)
    state = record_eviction(state, actions[0], EvictionResult("evicted"), now=NOW + 1790, grace=30, settings=settings)
    assert "uid-default-web-0" not in state.blocked
    state, _ = drain_step(node="n", pods=[], previous=state, now=NOW + 1820, settings=settings)
    assert state.outcome == DRAINED


RETRIES = [
    ("first refusal: kubectl's 5 s", 1, None, 5.0),
    ("second: doubled", 2, None, 10.0),
    ("third: capped at the poll interval", 3, None, 20.0),
    ("tenth: still the poll interval", 10, None, 20.0),
    ("the server's Retry-After wins", 4, 10.0, 10.0),
]


@pytest.mark.parametrize(("tries", "retry_after", "delay"), [r[1:] for r in RETRIES], ids=[r[0] for r in RETRIES])
def test_refused_evictions_back_off_to_the_poll_interval(tries: int, retry_after: float | None, delay: float) -> None:
    assert retry_delay(DrainSettings(eviction_retry_s=5, poll_s=20), tries, retry_after) == delay


def test_the_pdb_blocked_timeout_of_zero_leaves_only_the_drain_deadline() -> None:
    settings = DrainSettings(pdb_blocked_timeout_s=0, drain_timeout_s=600)
    state, _ = _refused_for(700, settings=settings, pdbs=None)
    assert state.outcome == TIMED_OUT


# --------------------------------------------------------------------------- app 5: the multi-PDB 500


def test_the_multi_pdb_answer_stops_the_drain_at_once() -> None:
    pods = [make_pod("web-0", "n"), make_pod("train-0", "n")]
    state, actions = drain_step(node="n", pods=pods, previous=DrainState(), now=NOW, settings=SETTINGS)
    web = next(a for a in actions if a.name == "web-0")
    state = record_eviction(state, web, EvictionResult(
        "multiple_pdbs", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
                         "support."), now=NOW, grace=30, settings=SETTINGS)
    assert state.outcome == REFUSED
    assert "default/web-0" in state.reason and "more than one PodDisruptionBudget" in state.reason
    assert "uid-default-web-0" not in state.retry_at, "never retried: it is not transient"

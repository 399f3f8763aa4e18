"""The one drain runner (shared.drain.runner.advance_drain), as a table over a scripted Eviction API.

Real: the runner, the drain state and filters. Faked: a cluster's Kubernetes API that lists the
pods of each node and answers each eviction as the test scripts it (an answer, or an error the
adapter raises: NotFound for a 404, Throttled for a 429 with Retry-After).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.drain.runner import DrainRound, advance_drain
from shared.drain.settings import DrainSettings
from shared.drain.state import DRAINED, REFUSED, STALLED, TIMED_OUT, DrainOutcome, DrainState
from shared.kernel.errors import NotFound, Throttled
from shared.kernel.ports import EvictionResult, PodView
from tests.unit.fakes_remediation import make_pod

NOW = 1_764_684_000.0
SETTINGS = DrainSettings(drain_timeout_s=3600, pdb_blocked_timeout_s=1800, eviction_retry_s=5, poll_s=20)
BUDGET = {"metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": {"matchLabels": {}}},
          "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}

Answer = EvictionResult | Exception


@dataclass
class ScriptedKube:
    """Pods per node; each eviction answered from ``answers`` (by pod name; "evicted" by default)."""

    pods: dict[str, list[PodView]]
    answers: Mapping[str, Answer] = field(default_factory=dict)
    evicted: list[str] = field(default_factory=list)
    pod_lists: int = 0
    pdb_lists: int = 0

    def list_pods(self, *, node_name: str | None = None, **_: Any) -> list[PodView]:
        self.pod_lists += 1
        return list(self.pods.get(node_name or "", []))

    def list_pdbs(self, namespace: str | None = None) -> list[Mapping[str, Any]]:
        self.pdb_lists += 1
        return [BUDGET]

    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        self.evicted.append(name)
        answer = self.answers.get(name, EvictionResult("evicted"))
        if isinstance(answer, Exception):
            raise answer
        return answer


def blocked_since(pod: PodView, since: float) -> DrainState:
    """A drain in progress whose budget has refused ``pod`` since ``since``."""
    return DrainState(started_at=since, blocked={pod.uid: {"ns": pod.namespace, "name": pod.name, "since": since,
                                                           "tries": 9}},
                      retry_at={pod.uid: NOW - 1})


WEB_A, WEB_B = make_pod("web-a", "a", grace=30), make_pod("web-b", "b", grace=600)
BARE = make_pod("notebook", "b", owner=None)
DS = make_pod("dcgm", "a", owner="DaemonSet")

Check = Callable[[DrainRound, ScriptedKube], None]


def _gone(r: DrainRound, kube: ScriptedKube) -> None:
    state = r.nodes["a"].state
    assert kube.evicted == ["web-a"] and state.evicted == {} and state.retry_at == {} and state.blocked == {}
    assert r.outcome == DrainOutcome.DRAINING and r.nodes["a"].sent == 1


def _throttled(r: DrainRound, kube: ScriptedKube) -> None:
    state = r.nodes["a"].state
    assert state.retry_at == {WEB_A.uid: NOW + 42} and WEB_A.uid in state.blocked
    assert "slow down" in state.messages["default/web-a"] and r.outcome == DrainOutcome.DRAINING
    early = advance_drain(kube, ["a"], previous={"a": state}, now=NOW + 41, settings=SETTINGS)
    assert kube.evicted == ["web-a"], "not asked again before its Retry-After"
    advance_drain(kube, ["a"], previous={"a": early.nodes["a"].state}, now=NOW + 42, settings=SETTINGS)
    assert kube.evicted == ["web-a", "web-a"]


def _refused(r: DrainRound, kube: ScriptedKube) -> None:
    assert kube.evicted == [], "nothing is evicted on any node of a batch one node of which is refused"
    assert r.outcome == REFUSED and r.stopped == ("b",) and r.started == ()
    assert r.messages[0].startswith("b: drain refused before evicting anything: default/notebook")
    assert r.nodes["a"].state.outcome == DrainOutcome.DRAINING


def _stalled(r: DrainRound, kube: ScriptedKube) -> None:
    assert kube.evicted == [] and r.outcome == STALLED and r.stopped == ("a",)
    assert "PodDisruptionBudget default/web (disruptionsAllowed=0" in r.reason
    assert kube.pdb_lists == 1, "the budgets are read while one refuses a pod, to name it"


def _timed_out(r: DrainRound, kube: ScriptedKube) -> None:
    assert r.outcome == TIMED_OUT and kube.evicted == []
    assert "drain deadline reached" in r.reason and r.wake_at is None


def _drained(r: DrainRound, kube: ScriptedKube) -> None:
    assert r.outcome == DRAINED and kube.evicted == [] and r.wake_at is None and r.stopped == ()


def _longest_grace_first(r: DrainRound, kube: ScriptedKube) -> None:
    assert kube.evicted == ["web-b", "web-a"], "across the batch, the pod with the longest grace period goes first"
    assert r.started == ("a", "b") and r.wake_at == NOW + 5
    assert kube.pdb_lists == 1, "the budgets are read when a drain starts"


CASES: list[tuple[str, dict[str, list[PodView]], dict[str, Answer], dict[str, DrainState], Check]] = [
    ("a 404 means the pod is gone: nothing to wait for but its UID",
     {"a": [WEB_A]}, {"web-a": NotFound("pods web-a not found")}, {}, _gone),
    ("a 429 is a refusal for now, asked again after its Retry-After",
     {"a": [WEB_A]}, {"web-a": Throttled("slow down", retry_after=42)}, {}, _throttled),
    ("one refused node stops the whole batch before anything is evicted",
     {"a": [WEB_A], "b": [WEB_B, BARE]}, {}, {}, _refused),
    ("a budget refusing a pod past pdb_blocked_timeout_s stalls the drain and names the budget",
     {"a": [WEB_A]}, {}, {"a": blocked_since(WEB_A, NOW - 1800)}, _stalled),
    ("past the deadline, with no evicted pod in its grace period, the drain times out",
     {"a": [WEB_A]}, {}, {"a": DrainState(started_at=NOW - 3600)},
     _timed_out),
    ("a node with only DaemonSet pods left is already drained",
     {"a": [DS]}, {}, {"a": DrainState(started_at=NOW - 60)}, _drained),
    ("the batch's evictions go out together, longest grace period first",
     {"a": [WEB_A], "b": [WEB_B]}, {}, {}, _longest_grace_first),
]


@pytest.mark.parametrize(("pods", "answers", "previous", "check"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_round(pods: dict[str, list[PodView]], answers: dict[str, Answer], previous: dict[str, DrainState],
                   check: Check) -> None:
    kube = ScriptedKube(pods, answers)
    result = advance_drain(kube, list(pods), previous=previous, now=NOW, settings=SETTINGS)
    check(result, kube)


def test_pods_already_listed_are_not_listed_again_and_budgets_are_not_read_mid_drain() -> None:
    kube = ScriptedKube({"a": [WEB_A]})
    first = advance_drain(kube, ["a"], previous={}, now=NOW, settings=SETTINGS, pods={"a": [WEB_A]})
    assert kube.pod_lists == 0 and kube.pdb_lists == 1 and first.started == ("a",)
    again = advance_drain(kube, ["a"], previous={"a": first.nodes["a"].state}, now=NOW + 5,
                          settings=SETTINGS)
    assert kube.pod_lists == 1 and kube.pdb_lists == 1, "an evicted pod being waited for needs no budget"
    assert again.started == () and kube.evicted == ["web-a"], "an evicted pod is waited for, not evicted again"
    assert DrainState.from_data(again.states()["a"]).evicted.keys() == {WEB_A.uid}


def test_a_refusal_is_reported_once_not_on_every_round() -> None:
    kube = ScriptedKube({"b": [BARE]})
    first = advance_drain(kube, ["b"], previous={}, now=NOW, settings=SETTINGS)
    again = advance_drain(kube, ["b"], previous={"b": first.nodes["b"].state}, now=NOW + 5,
                          settings=SETTINGS)
    assert first.stopped == ("b",) and again.stopped == () and again.outcome == REFUSED

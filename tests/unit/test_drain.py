"""kubectl-drain semantics: filter tables and the resumable drain step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.drain import core as drain
from shared.kernel.ports import EvictionResult
from shared.remediation.policy import RemediationPolicy
from tests.unit.fakes_remediation import make_pod

NOW = 1_764_684_000.0
POLICY = RemediationPolicy()

FILTERS = [
    ("a ReplicaSet pod is evicted", make_pod("web", "n"), drain.OKAY, True),
    ("a DaemonSet pod is skipped", make_pod("ds", "n", owner="DaemonSet"), drain.SKIP, False),
    ("a mirror pod is skipped", make_pod("static", "n", owner=None, mirror=True), drain.SKIP, False),
    ("a completed pod is skipped", make_pod("job", "n", owner="Job", phase="Succeeded"), drain.SKIP, False),
    ("a failed pod is skipped", make_pod("job", "n", owner="Job", phase="Failed"), drain.SKIP, False),
    ("a terminating pod is skipped (and waited for)", make_pod("old", "n", deleting=NOW - 5), drain.SKIP, False),
    ("an emptyDir pod is evicted with a warning by default", make_pod("cache", "n", empty_dir=True), drain.WARNING, True),
    ("an unmanaged pod is refused by default", make_pod("bare", "n", owner=None), drain.ERROR, False),
]


@pytest.mark.parametrize(("pod", "reason", "delete"), [c[1:] for c in FILTERS], ids=[c[0] for c in FILTERS])
def test_filters(pod, reason: str, delete: bool) -> None:
    status = drain.filter_pod(pod, drain.make_filters(POLICY))
    assert (status.reason, status.delete) == (reason, delete)


@pytest.mark.parametrize(("empty_dir", "unmanaged", "expected"), [
    ("refuse", "refuse", drain.ERROR), ("evict", "evict", drain.WARNING), ("refuse", "evict", drain.ERROR)],
    ids=["both refused", "both allowed", "emptyDir refused even when unmanaged allowed"])
def test_pod_policies_decide_emptydir_and_unmanaged(empty_dir: str, unmanaged: str, expected: str) -> None:
    policy = RemediationPolicy(empty_dir=empty_dir, unmanaged_pods=unmanaged)
    pod = make_pod("bare-cache", "n", owner=None, empty_dir=True)
    assert drain.filter_pod(pod, drain.make_filters(policy)).reason == expected


def test_refused_pods_carry_a_message_that_says_what_to_do() -> None:
    plan = drain.plan_drain([make_pod("bare", "n", owner=None)], POLICY)
    assert plan.blocked and "REMEDIATION_UNMANAGED_PODS=evict" in plan.blocked[0][1]


def test_a_first_step_evicts_what_must_go_and_skips_the_rest() -> None:
    pods = [make_pod("web", "n"), make_pod("ds", "n", owner="DaemonSet"), make_pod("old", "n", deleting=NOW)]
    state, actions = drain.drain_step(node="n", pods=pods, previous=drain.DrainState(), now=NOW, policy=POLICY)
    assert [a.name for a in actions] == ["web"]
    assert state.outcome == "" and state.started_at == NOW
    assert state.remaining == ["default/old", "default/web"]


def test_a_drain_with_only_daemonsets_left_is_done() -> None:
    pods = [make_pod("ds", "n", owner="DaemonSet"), make_pod("static", "n", owner=None, mirror=True)]
    state, actions = drain.drain_step(node="n", pods=pods, previous=drain.DrainState(), now=NOW, policy=POLICY)
    assert state.outcome == "drained" and actions == []


def test_a_pdb_429_is_retried_after_the_delay_not_before() -> None:
    pod = make_pod("web", "n")
    state, actions = drain.drain_step(node="n", pods=[pod], previous=drain.DrainState(), now=NOW, policy=POLICY)
    state = drain.record_eviction(state, actions[0], EvictionResult(outcome="blocked"), now=NOW, grace=30, policy=POLICY)
    assert "PodDisruptionBudget" in state.messages["default/web"]
    state, actions = drain.drain_step(node="n", pods=[pod], previous=state, now=NOW + 2, policy=POLICY)
    assert actions == [] and state.wake_at == NOW + 5
    state, actions = drain.drain_step(node="n", pods=[pod], previous=state, now=NOW + 5, policy=POLICY)
    assert [a.name for a in actions] == ["web"]


def test_deletion_is_awaited_by_uid_so_a_recreated_pod_is_a_new_pod() -> None:
    old = make_pod("web-0", "n", uid="uid-1")
    state, actions = drain.drain_step(node="n", pods=[old], previous=drain.DrainState(), now=NOW, policy=POLICY)
    state = drain.record_eviction(state, actions[0], EvictionResult(outcome="evicted"), now=NOW, grace=30, policy=POLICY)
    state, actions = drain.drain_step(node="n", pods=[old], previous=state, now=NOW + 1, policy=POLICY)
    assert actions == [] and state.outcome == ""  # evicted, still terminating: wait, do not evict again
    new = make_pod("web-0", "n", uid="uid-2")  # a StatefulSet recreated it on this node
    state, actions = drain.drain_step(node="n", pods=[new], previous=state, now=NOW + 2, policy=POLICY)
    assert [(a.name, a.uid) for a in actions] == [("web-0", "uid-2")]
    assert "uid-1" not in state.evicted


def test_the_deadline_gives_up_with_the_pods_still_there() -> None:
    policy = RemediationPolicy(drain_timeout_s=600)
    pod = make_pod("web", "n")
    state, actions = drain.drain_step(node="n", pods=[pod], previous=drain.DrainState(), now=NOW, policy=policy)
    state = drain.record_eviction(state, actions[0], EvictionResult(outcome="blocked"), now=NOW, grace=30, policy=policy)
    state, _ = drain.drain_step(node="n", pods=[pod], previous=state, now=NOW + 600, policy=policy)
    assert state.outcome == "timed_out" and "default/web" in state.messages["_deadline"]


def test_an_evicted_pod_keeps_its_grace_period_past_the_deadline() -> None:
    policy = RemediationPolicy(drain_timeout_s=600)
    pod = make_pod("slow", "n", grace=300)
    state, actions = drain.drain_step(node="n", pods=[pod], previous=drain.DrainState(), now=NOW, policy=policy)
    late = NOW + 500
    state.started_at = NOW
    state = drain.record_eviction(state, actions[0], EvictionResult(outcome="evicted"), now=late, grace=300, policy=policy)
    state, _ = drain.drain_step(node="n", pods=[pod], previous=state, now=NOW + 700, policy=policy)
    assert state.outcome == ""  # still inside its 300 s grace (evicted at +500)
    state, _ = drain.drain_step(node="n", pods=[pod], previous=state, now=NOW + 801, policy=policy)
    assert state.outcome == "timed_out"


def test_the_state_survives_a_round_trip_through_the_record() -> None:
    pod = make_pod("web", "n")
    state, actions = drain.drain_step(node="n", pods=[pod], previous=drain.DrainState(), now=NOW, policy=POLICY)
    state = drain.record_eviction(state, actions[0], EvictionResult(outcome="evicted"), now=NOW, grace=30, policy=POLICY)
    again = drain.DrainState.from_data(state.to_data())
    assert again.evicted == state.evicted and again.started_at == NOW


@given(kinds=st.lists(st.sampled_from(["ReplicaSet", "DaemonSet", "mirror", "bare", "done", "terminating"]),
                      max_size=12))
def test_only_pods_that_must_go_are_ever_evicted(kinds: list[str]) -> None:
    pods = []
    for i, kind in enumerate(kinds):
        if kind == "mirror":
            pods.append(make_pod(f"p{i}", "n", owner=None, mirror=True))
        elif kind == "bare":
            pods.append(make_pod(f"p{i}", "n", owner=None))
        elif kind == "done":
            pods.append(make_pod(f"p{i}", "n", phase="Succeeded"))
        elif kind == "terminating":
            pods.append(make_pod(f"p{i}", "n", deleting=NOW - 1))
        else:
            pods.append(make_pod(f"p{i}", "n", owner=kind))
    state, actions = drain.drain_step(node="n", pods=pods, previous=drain.DrainState(), now=NOW, policy=POLICY)
    evicted = {a.name for a in actions}
    # A pod without a controller refuses the whole node before anything is evicted (issue 10, app 2).
    expected = set() if "bare" in kinds else {f"p{i}" for i, kind in enumerate(kinds) if kind == "ReplicaSet"}
    assert evicted == expected
    assert (state.outcome == drain.REFUSED) == ("bare" in kinds)


def test_the_pods_with_the_longest_grace_period_are_evicted_first() -> None:
    pods = [make_pod("quick", "n", grace=10), make_pod("slow", "n", grace=60), make_pod("default", "n", grace=None),
            make_pod("mid", "n", grace=20)]
    _, actions = drain.drain_step(node="n", pods=pods, previous=drain.DrainState(), now=NOW, policy=POLICY)
    assert [a.name for a in actions] == ["slow", "default", "mid", "quick"]


def test_evictions_go_out_a_few_at_a_time_and_their_answers_keep_the_actions_order() -> None:
    import threading
    import time

    lock, in_flight, peak = threading.Lock(), [0], [0]

    def evict(action: drain.Evict) -> EvictionResult:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.002)
        with lock:
            in_flight[0] -= 1
        return EvictionResult("blocked" if action.name.endswith("7") else "evicted")

    actions = [drain.Evict(namespace="ns", name=f"p{i}", uid=f"u{i}") for i in range(40)]
    answers = drain.evict_all(evict, actions, workers=4)
    assert [a.name for a, _ in answers] == [a.name for a in actions]
    assert [r.outcome for _, r in answers].count("blocked") == 4
    assert 1 < peak[0] <= 4


def test_an_eviction_error_is_raised_only_once_every_other_eviction_has_finished() -> None:
    done: list[str] = []

    def evict(action: drain.Evict) -> EvictionResult:
        if action.name == "p0":
            raise RuntimeError("connection reset")
        done.append(action.name)
        return EvictionResult("evicted")

    actions = [drain.Evict(namespace="ns", name=f"p{i}", uid=f"u{i}") for i in range(10)]
    with pytest.raises(RuntimeError, match="connection reset"):
        drain.evict_all(evict, actions, workers=3)
    assert sorted(done) == sorted(f"p{i}" for i in range(1, 10))

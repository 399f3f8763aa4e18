"""kubectl-drain semantics: filter tables and the resumable drain step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.drain.filters import ERROR, OKAY, SKIP, WARNING, filter_pod, make_filters, plan_drain
from shared.drain.parallel import bounded_map
from shared.drain.settings import DrainSettings
from shared.drain.state import REFUSED, DrainState, Evict, drain_step, record_eviction
from shared.kernel.ports import EvictionResult
from tests.unit.fakes_remediation import make_pod

NOW = 1_764_684_000.0
SETTINGS = DrainSettings()

FILTERS = [
    ("a ReplicaSet pod is evicted", make_pod("web", "n"), OKAY, True),
    ("a DaemonSet pod is skipped", make_pod("ds", "n", owner="DaemonSet"), SKIP, False),
    ("a mirror pod is skipped", make_pod("static", "n", owner=None, mirror=True), SKIP, False),
    ("a completed pod is skipped", make_pod("job", "n", owner="Job", phase="Succeeded"), SKIP, False),
    ("a failed pod is skipped", make_pod("job", "n", owner="Job", phase="Failed"), SKIP, False),
    ("a terminating pod is skipped (and waited for)", make_pod("old", "n", deleting=NOW - 5), SKIP, False),
    ("an emptyDir pod is evicted with a warning by default", make_pod("cache", "n", empty_dir=True), WARNING, True),
    ("an unmanaged pod is refused by default", make_pod("bare", "n", owner=None), ERROR, False),
]


@pytest.mark.parametrize(("pod", "reason", "delete"), [c[1:] for c in FILTERS], ids=[c[0] for c in FILTERS])
def test_filters(pod, reason: str, delete: bool) -> None:
    status = filter_pod(pod, make_filters(SETTINGS))
    assert (status.reason, status.delete) == (reason, delete)


@pytest.mark.parametrize(("empty_dir", "unmanaged", "expected"), [
    ("refuse", "refuse", ERROR), ("evict", "evict", WARNING), ("refuse", "evict", ERROR)],
    ids=["both refused", "both allowed", "emptyDir refused even when unmanaged allowed"])
def test_pod_policies_decide_emptydir_and_unmanaged(empty_dir: str, unmanaged: str, expected: str) -> None:
    settings = DrainSettings(empty_dir=empty_dir, unmanaged_pods=unmanaged)
    pod = make_pod("bare-cache", "n", owner=None, empty_dir=True)
    assert filter_pod(pod, make_filters(settings)).reason == expected


def test_refused_pods_carry_a_message_that_says_what_to_do() -> None:
    plan = plan_drain([make_pod("bare", "n", owner=None)], SETTINGS)
    assert plan.blocked and "REMEDIATION_UNMANAGED_PODS=evict" in plan.blocked[0][1]


def test_a_first_step_evicts_what_must_go_and_skips_the_rest() -> None:
    pods = [make_pod("web", "n"), make_pod("ds", "n", owner="DaemonSet"), make_pod("old", "n", deleting=NOW)]
    state, actions = drain_step(node="n", pods=pods, previous=DrainState(), now=NOW, settings=SETTINGS)
    assert [a.name for a in actions] == ["web"]
    assert state.outcome == "" and state.started_at == NOW
    assert state.remaining == ["default/old", "default/web"]


def test_a_drain_with_only_daemonsets_left_is_done() -> None:
    pods = [make_pod("ds", "n", owner="DaemonSet"), make_pod("static", "n", owner=None, mirror=True)]
    state, actions = drain_step(node="n", pods=pods, previous=DrainState(), now=NOW, settings=SETTINGS)
    assert state.outcome == "drained" and actions == []


def test_a_pdb_429_is_retried_after_the_delay_not_before() -> None:
    pod = make_pod("web", "n")
    state, actions = drain_step(node="n", pods=[pod], previous=DrainState(), now=NOW, settings=SETTINGS)
    state = record_eviction(state, actions[0], EvictionResult(outcome="blocked"), now=NOW, grace=30, settings=SETTINGS)
    assert "PodDisruptionBudget" in state.messages["default/web"]
    state, actions = drain_step(node="n", pods=[pod], previous=state, now=NOW + 2, settings=SETTINGS)
    assert actions == [] and state.wake_at == NOW + 5
    state, actions = drain_step(node="n", pods=[pod], previous=state, now=NOW + 5, settings=SETTINGS)
    assert [a.name for a in actions] == ["web"]


def test_deletion_is_awaited_by_uid_so_a_recreated_pod_is_a_new_pod() -> None:
    old = make_pod("web-0", "n", uid="uid-1")
    state, actions = drain_step(node="n", pods=[old], previous=DrainState(), now=NOW, settings=SETTINGS)
    state = record_eviction(state, actions[0], EvictionResult(outcome="evicted"), now=NOW, grace=30, settings=SETTINGS)
    state, actions = drain_step(node="n", pods=[old], previous=state, now=NOW + 1, settings=SETTINGS)
    assert actions == [] and state.outcome == ""  # evicted, still terminating: wait, do not evict again
    new = make_pod("web-0", "n", uid="uid-2")  # a StatefulSet recreated it on this node
    state, actions = drain_step(node="n", pods=[new], previous=state, now=NOW + 2, settings=SETTINGS)
    assert [(a.name, a.uid) for a in actions] == [("web-0", "uid-2")]
    assert "uid-1" not in state.evicted


def test_the_deadline_gives_up_with_the_pods_still_there() -> None:
    settings = DrainSettings(drain_timeout_s=600)
    pod = make_pod("web", "n")
    state, actions = drain_step(node="n", pods=[pod], previous=DrainState(), now=NOW, settings=settings)
    state = record_eviction(state, actions[0], EvictionResult(outcome="blocked"), now=NOW, grace=30, settings=settings)
    state, _ = drain_step(node="n", pods=[pod], previous=state, now=NOW + 600, settings=settings)
    assert state.outcome == "timed_out" and "default/web" in state.messages["_deadline"]


def test_an_evicted_pod_keeps_its_grace_period_past_the_deadline() -> None:
    settings = DrainSettings(drain_timeout_s=600)
    pod = make_pod("slow", "n", grace=300)
    state, actions = drain_step(node="n", pods=[pod], previous=DrainState(), now=NOW, settings=settings)
    late = NOW + 500
    state.started_at = NOW
    state = record_eviction(state, actions[0], EvictionResult(outcome="evicted"), now=late, grace=300, settings=settings)
    state, _ = drain_step(node="n", pods=[pod], previous=state, now=NOW + 700, settings=settings)
    assert state.outcome == ""  # still inside its 300 s grace (evicted at +500)
    state, _ = drain_step(node="n", pods=[pod], previous=state, now=NOW + 801, settings=settings)
    assert state.outcome == "timed_out"


def test_the_state_survives_a_round_trip_through_the_record() -> None:
    pod = make_pod("web", "n")
    state, actions = drain_step(node="n", pods=[pod], previous=DrainState(), now=NOW, settings=SETTINGS)
    state = record_eviction(state, actions[0], EvictionResult(outcome="evicted"), now=NOW, grace=30, settings=SETTINGS)
    again = DrainState.from_data(state.to_data())
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
    state, actions = drain_step(node="n", pods=pods, previous=DrainState(), now=NOW, settings=SETTINGS)
    evicted = {a.name for a in actions}
    # A pod without a controller refuses the whole node before anything is evicted (issue 10, app 2).
    expected = set() if "bare" in kinds else {f"p{i}" for i, kind in enumerate(kinds) if kind == "ReplicaSet"}
    assert evicted == expected
    assert (state.outcome == REFUSED) == ("bare" in kinds)


def test_the_pods_with_the_longest_grace_period_are_evicted_first() -> None:
    pods = [make_pod("quick", "n", grace=10), make_pod("slow", "n", grace=60), make_pod("default", "n", grace=None),
            make_pod("mid", "n", grace=20)]
    _, actions = drain_step(node="n", pods=pods, previous=DrainState(), now=NOW, settings=SETTINGS)
    assert [a.name for a in actions] == ["slow", "default", "mid", "quick"]


def test_calls_go_out_a_few_at_a_time_and_their_answers_keep_the_items_order() -> None:
    import threading

    lock, in_flight, peak = threading.Lock(), [0], [0]
    first_four = threading.Barrier(4, timeout=30)

    def call(i: int) -> int:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        if i < 4:
            first_four.wait()  # the first four calls meet: four are in flight at once
        with lock:
            in_flight[0] -= 1
        return i * i

    assert bounded_map(call, list(range(40)), workers=4) == [i * i for i in range(40)]
    assert peak[0] == 4


def test_an_error_is_raised_only_once_every_other_call_has_finished() -> None:
    done: list[str] = []

    def evict(action: Evict) -> EvictionResult:
        if action.name == "p0":
            raise RuntimeError("connection reset")
        done.append(action.name)
        return EvictionResult("evicted")

    actions = [Evict(namespace="ns", name=f"p{i}", uid=f"u{i}") for i in range(10)]
    with pytest.raises(RuntimeError, match="connection reset"):
        bounded_map(evict, actions, workers=3)
    assert sorted(done) == sorted(f"p{i}" for i in range(1, 10))

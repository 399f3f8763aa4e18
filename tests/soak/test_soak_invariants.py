"""The soak's own parts, checked fast: scenarios replay from their seed, crashes land where asked,
and each invariant check catches what it is there to catch (a check that cannot fail proves nothing).
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.ports import Record
from soak.crash import CrashingLedger, HostCrashed
from soak.generate import generate
from soak.invariants import (
    Evidence,
    check_budgets,
    check_ledger,
    check_oracles,
    check_outcomes,
    check_repairs,
    pool_budget,
    remediation_deadline,
)
from soak.runner import fault_kind
from tests.fakes.ledger import InMemoryLedger


def _make_evidence(seed: int = 3, **fields: Any) -> Evidence:
    base: dict[str, Any] = {"scenario": generate(seed, short=True), "oracles": {}, "state": {"clusters": []},
                            "nodes": {}, "records": {}, "max_unavailable": {}}
    base.update(fields)
    return Evidence(**base)


def test_the_same_seed_generates_the_same_scenario_and_another_seed_another() -> None:
    assert generate(42).sim == generate(42).sim
    assert generate(42).crashes == generate(42).crashes
    assert generate(42).sim != generate(43).sim


@pytest.mark.parametrize(("size", "count", "percent", "allowed"), [
    (4, 1, 20, 1), (10, 5, 20, 2), (10, 5, 100, 5), (3, 2, 50, 1), (6, 2, 50, 2), (2, 0, 20, 0), (2, 2, 100, 2),
], ids=["small-pool-floor-of-one", "percent-is-stricter", "percent-off", "half-of-three", "count-is-stricter",
        "zero-admits-nothing", "never-more-than-the-pool"])
def test_the_pool_budget_is_the_stricter_of_count_and_percentage(size: int, count: int, percent: int,
                                                                 allowed: int) -> None:
    assert pool_budget(size, count=count, percent=percent) == allowed


def test_a_crashing_ledger_dies_before_the_chosen_write_and_stays_dead() -> None:
    inner = InMemoryLedger()
    ledger = CrashingLedger(inner, crash_at=2, when="before")
    ledger.create(Record(kind="k", id="a", state="s"))
    with pytest.raises(HostCrashed):
        ledger.create(Record(kind="k", id="b", state="s"))
    assert inner.get("k", "b") is None
    with pytest.raises(HostCrashed):
        ledger.get("k", "a")


def test_a_crashing_ledger_can_die_just_after_the_write() -> None:
    inner = InMemoryLedger()
    ledger = CrashingLedger(inner, crash_at=1, when="after")
    with pytest.raises(HostCrashed):
        ledger.create(Record(kind="k", id="a", state="s"))
    assert inner.get("k", "a") is not None


def test_oracle_violations_are_reported_by_invariant() -> None:
    evidence = _make_evidence(oracles={
        "pdb_violations": [{"cluster": "c", "namespace": "n", "pdb": "p", "pod": "x", "cause": "eviction",
                            "currentHealthy": 1, "desiredHealthy": 2}],
        "pods_killed_without_eviction": [{"cluster": "c", "namespace": "n", "pod": "y", "node": "n1", "cause": "delete"}],
        "workload_pods_lost": [{"cluster": "c", "namespace": "n", "pod": "z", "node": "n2"}]})
    assert [v.invariant for v in check_oracles(evidence)] == ["pdb", "eviction-only", "pool-deleted-with-pods"]


def test_more_nodes_down_than_the_budget_is_a_violation_and_exactly_the_budget_is_not() -> None:
    scenario = generate(3, short=True)
    pool = next(p for p in scenario.pools if p.managed)
    label = f"{pool.cluster}/{pool.name}"
    allowed = pool_budget(pool.count, count=int(scenario.profile["BUDGET_POOL_MAX_UNAVAILABLE"]),
                          percent=int(scenario.profile["BUDGET_POOL_MAX_UNAVAILABLE_PERCENT"]))
    assert check_budgets(_make_evidence(scenario=scenario, max_unavailable={label: allowed})) == []
    over = check_budgets(_make_evidence(scenario=scenario, max_unavailable={label: allowed + 1}))
    assert [v.invariant for v in over] == ["budget"]


def test_a_record_active_past_its_deadline_is_stuck_and_a_terminal_one_needs_a_reason() -> None:
    stuck = Record(kind="remediation", id="r1", state="draining", created_at=0.0)
    silent = Record(kind="migration", id="m1", state="blocked", created_at=0.0)
    explained = Record(kind="migration", id="m2", state="blocked", created_at=0.0, data={"reason": "pods do not fit"})
    found = check_outcomes(_make_evidence(records={"remediation": [stuck], "migration": [silent, explained]}, now=1e6))
    assert sorted(v.detail.split(" ")[1] for v in found) == ["m1", "r1"]


def test_a_remediation_granted_time_for_the_stewards_absence_has_a_deadline_that_much_later() -> None:
    evidence = _make_evidence()
    plain = Record(kind="remediation", id="r1", state="repairing", created_at=0.0)
    away = Record(kind="remediation", id="r2", state="repairing", created_at=0.0, data={"away_total_s": 300.0})
    assert remediation_deadline(away, evidence.scenario.profile) == remediation_deadline(plain, evidence.scenario.profile) + 300


def test_a_node_left_cordoned_by_a_finished_remediation_disagrees_with_the_ledger() -> None:
    cluster = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/soak1"
    rec = Record(kind="remediation", id="abc-1", state="done", data={"cluster": cluster, "node": "n1", "pool": "gpu1"})
    node = {"metadata": {"name": "n1", "annotations": {"gpu-fleet-steward/cordoned-for": "abc-1"}},
            "spec": {"unschedulable": True}}
    found = check_ledger(_make_evidence(records={"remediation": [rec]}, nodes={"soak1": [node]}))
    assert {v.invariant for v in found} == {"ledger-vs-cluster"} and len(found) == 2


def test_a_node_given_up_on_must_stay_cordoned_unless_a_later_remediation_repaired_it() -> None:
    cluster = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/soak1"
    gave_up = Record(kind="remediation", id="abc-1", state="gave_up", created_at=10.0,
                     data={"cluster": cluster, "node": "n1", "pool": "gpu1", "cordoned_by_us": True})
    schedulable = {"metadata": {"name": "n1", "annotations": {}}, "spec": {}}
    alone = check_ledger(_make_evidence(records={"remediation": [gave_up]}, nodes={"soak1": [schedulable]}))
    assert [v.invariant for v in alone] == ["ledger-vs-cluster"] and "gave up" in alone[0].detail
    later = Record(kind="remediation", id="abc-2", state="done", created_at=500.0,
                   data={"cluster": cluster, "node": "n1", "pool": "gpu1", "cordoned_by_us": True})
    assert check_ledger(_make_evidence(records={"remediation": [gave_up, later]}, nodes={"soak1": [schedulable]})) == []


def test_two_remediations_of_one_fault_break_the_one_repair_rule() -> None:
    recs = [Record(kind="remediation", id=f"k-{i}", state="done", data={"fault": "f1", "pool": "zz"}) for i in (1, 2)]
    found = check_repairs(_make_evidence(records={"remediation": recs}))
    assert any(v.invariant == "one-repair-per-fault" and "f1" in v.detail for v in found)


@pytest.mark.parametrize(("fired", "kind"), [
    ({"target": "arm", "status": 429}, "arm 429"),
    ({"target": "arm", "status": 400, "code": "QuotaExceeded"}, "arm 400 QuotaExceeded"),
    ({"target": "lro", "code": "AllocationFailed"}, "lro AllocationFailed"),
    ({"target": "kube", "drop": True}, "kube drop (timeout)"),
    ({"target": "eventgrid-delivery", "duplicate": True}, "eventgrid-delivery duplicate"),
], ids=["throttled", "quota", "allocation", "timeout", "duplicate-delivery"])
def test_fired_faults_are_counted_by_a_readable_kind(fired: dict[str, Any], kind: str) -> None:
    assert fault_kind(fired) == kind


class _RecordingSim:
    """A simulator stand-in that notes the order of the auditor's calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.endpoints: dict[str, Any] = {"clusters": []}

    def control(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append(f"{method} {path}")
        return {}

    def oracles(self) -> dict[str, Any]:
        self.calls.append("oracles")
        return {}

    def state(self) -> dict[str, Any]:
        self.calls.append("state")
        return {"clusters": []}

    def published(self) -> list[dict[str, Any]]:
        self.calls.append("published")
        return []


def test_the_auditor_clears_the_scenarios_faults_before_reading_the_fleet() -> None:
    # Found by the soak (seed 420): the auditor's own node listing met an injected Kubernetes 500.
    from soak.audit import Sampler
    from soak.runner import gather_evidence

    sim = _RecordingSim()
    gather_evidence(generate(420), sim=sim, records={}, sampler=Sampler(), app_errors=[], now=0.0)
    assert sim.calls[0] == "DELETE /faults"


def test_the_auditor_counts_a_condition_a_node_already_shows_when_it_first_joins_as_turned_true() -> None:
    """Seed 955084: a flip struck the node AKS had just made for a replace, before the auditor's next sample; the
    first sample that saw the node saw the condition True. That is a condition turned True in between (the
    liveness oracle attributes the flip to that node); a node of the very first sample is the scenario's start."""
    from soak.audit import Sampler

    def state(now: float, nodes: list[dict[str, Any]]) -> dict[str, Any]:
        return {"clock": {"now": now}, "clusters": [{"name": "soak1", "nodes": nodes,
                                                       "pools": [{"name": "gpu1", "nodes": [n["name"] for n in nodes]}]}]}

    def node(name: str, *unhealthy: str) -> dict[str, Any]:
        return {"name": name, "pool": "gpu1", "ready": True, "unschedulable": False, "unhealthy": list(unhealthy)}

    sampler = Sampler()
    sampler.sample(state(10.0, [node("n0", "UnhealthyNvidiaDevicePlugin")]))
    sampler.sample(state(20.0, [node("n0", "UnhealthyNvidiaDevicePlugin"), node("n3", "UnhealthyNvidiaDCGMServices")]))
    sampler.sample(state(30.0, [node("n0", "UnhealthyNvidiaDevicePlugin"), node("n3", "UnhealthyNvidiaDCGMServices"),
                                node("n4")]))
    assert sampler.turned_true == [{"t": 20.0, "prev_t": 10.0, "cluster": "soak1", "node": "n3",
                                    "conditions": ["UnhealthyNvidiaDCGMServices"]}]

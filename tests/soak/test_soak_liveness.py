"""The liveness oracle (issue 24, item 2; soak/liveness.py): every genuine fault the scenario injected ends
repaired, cleared, or handed to an operator for a cause the scenario injected, and the oracle catches each
way of ending nowhere (fed fabricated evidence: a check that cannot fail proves nothing).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from shared.kernel.ports import Record
from soak.generate import CLOCK_START, SUBSCRIPTION, generate
from soak.invariants import Evidence
from soak.liveness import check_fault_liveness, genuine_faults, judge, outcome_table, outcomes

CLUSTER_ID = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-soak1/providers/Microsoft.ContainerService/managedClusters/soak1"
NODES = ["n0", "n1", "n2"]
DEVICE_PLUGIN = "UnhealthyNvidiaDevicePlugin"
ONSET = 100.0


def _scenario(*, flips: list[dict[str, Any]] | None = None, **profile: str) -> Any:
    base = generate(3, short=True, strict=False, signals=False, forged_rows=False)
    flips = [_flip()] if flips is None else flips
    return dataclasses.replace(base, flips=flips, actions=[], strict_faults=[], signal_faults=[], forged_rows=[],
                               profile={**base.profile, **profile})


def _flip(index: int = 1, *, at: float = ONSET, status: str = "True", fixed_by: str = "restart") -> dict[str, Any]:
    return {"at": at, "cluster": "soak1", "pool": "gpu1", "node_index": index, "type": DEVICE_PLUGIN,
            "status": status, "fixed_by": fixed_by}


def _node(name: str, *, faulty: bool = False, cordoned: bool = False) -> dict[str, Any]:
    conditions = [{"type": DEVICE_PLUGIN, "status": "True" if faulty else "False"}]
    return {"metadata": {"name": name}, "spec": {"unschedulable": cordoned}, "status": {"conditions": conditions}}


def _turned(name: str = "n1", at: float = ONSET) -> dict[str, Any]:
    return {"t": CLOCK_START + at + 0.5, "prev_t": CLOCK_START + at - 2, "cluster": "soak1", "node": name,
            "conditions": [DEVICE_PLUGIN]}


def _rem(state: str, *, node: str = "n1", at: float = ONSET + 30, note: str = "", **data: Any) -> Record:
    return Record(kind="remediation", id=f"r-{node}", state=state, created_at=CLOCK_START + at,
                  updated_at=CLOCK_START + at + 200, history=[{"state": state, "note": note}] if note else [],
                  data={"cluster": CLUSTER_ID, "node": node, "pool": "gpu1", **data})


def _refused(code: str, *, node: str = "n1", at: float = ONSET + 25, reason: str = "") -> Record:
    return Record(kind="dedupe", id=f"refused-f{node}-{code}", state="seen", created_at=CLOCK_START + at,
                  updated_at=CLOCK_START + at, data={"cluster": CLUSTER_ID, "node": node, "reason_code": code,
                                                      "reason": reason or code})


def _evidence(*, scenario: Any = None, nodes: list[dict[str, Any]] | None = None, turned: list[dict[str, Any]] | None = None,
              **fields: Any) -> Evidence:
    base: dict[str, Any] = {
        "scenario": scenario or _scenario(), "oracles": {}, "state": {"clusters": []},
        "nodes": {"soak1": nodes if nodes is not None else [_node("n0"), _node("n1", faulty=True), _node("n2")]},
        "records": {}, "max_unavailable": {}, "start": CLOCK_START, "now": CLOCK_START + 2000,
        "initial_nodes": {"soak1/gpu1": NODES}, "node_pools": {("soak1", n): "gpu1" for n in NODES},
        "turned_true": [_turned()] if turned is None else turned}
    base.update(fields)
    return Evidence(**base)


def _kind(evidence: Evidence) -> tuple[str, str]:
    [fault] = genuine_faults(evidence)
    outcome = judge(evidence, fault)
    return outcome.kind, outcome.cause


def test_a_fault_nothing_answered_is_lost_and_the_invariant_names_it() -> None:
    evidence = _evidence()
    assert _kind(evidence) == ("lost", "none")
    [violation] = check_fault_liveness(evidence)
    assert violation.invariant == "fault-liveness" and "soak1/n1" in violation.detail and "lost" in violation.detail


def test_a_fault_repaired_by_a_remediation_after_its_onset_is_repaired() -> None:
    evidence = _evidence(nodes=[_node("n0"), _node("n1"), _node("n2")], records={"remediation": [_rem("done")]})
    assert _kind(evidence) == ("repaired", "")
    assert check_fault_liveness(evidence) == []


def test_a_done_remediation_on_a_node_that_still_shows_the_fault_is_not_a_repair() -> None:
    assert _kind(_evidence(records={"remediation": [_rem("done")]}))[0] == "lost"


def test_a_remediation_that_ended_before_the_onset_says_nothing_about_it() -> None:
    earlier = _rem("done", at=ONSET - 400)  # updated 200 s after it started: before the onset
    assert _kind(_evidence(records={"remediation": [earlier]}))[0] == "lost"


def test_a_release_by_the_drain_fallback_is_a_hand_over_whose_reason_must_name_an_injected_cause() -> None:
    pdb = "drain refused: covered by more than one PodDisruptionBudget; fallback release: uncordoned"
    assert _kind(_evidence(records={"remediation": [_rem("released", reason=pdb)]})) == ("handed-over", "drain obstacle")
    vague = _evidence(records={"remediation": [_rem("released", reason="something went wrong")]})
    assert _kind(vague) == ("handed-over", "none")
    assert [v.invariant for v in check_fault_liveness(vague)] == ["fault-liveness"]


def test_a_release_because_the_fault_cleared_is_cleared() -> None:
    cleared = _rem("released", reason="UnhealthyNvidiaDevicePlugin cleared before we touched the node: released")
    assert _kind(_evidence(records={"remediation": [cleared]})) == ("cleared", "cleared")


@pytest.mark.parametrize(("reason", "cause"), [
    ("every rung failed (last: replace: ...)", "not cured by the ladder"),
    ("restart refused: ScopeLocked: the node resource group is locked", "node resource group locked"),
])
def test_a_remediation_that_gave_up_is_handed_over_for_the_cause_its_reason_names(reason: str, cause: str) -> None:
    scenario = _scenario(flips=[_flip(fixed_by="never")])
    scenario.strict_faults.append("node resource group locked (from the start)")
    assert _kind(_evidence(scenario=scenario, records={"remediation": [_rem("gave_up", reason=reason)]})) == \
        ("handed-over", cause)


def test_a_give_up_for_a_cause_the_scenario_never_injected_fails() -> None:
    scenario = _scenario(flips=[_flip(fixed_by="restart")])  # cured by the first rung; no lock drawn
    lock = _rem("gave_up", reason="restart refused: ScopeLocked: the node resource group is locked")
    assert _kind(_evidence(scenario=scenario, records={"remediation": [lock]})) == ("handed-over", "none")


def test_a_refusal_a_person_must_lift_and_the_breaker_hand_the_fault_over() -> None:
    assert _kind(_evidence(records={"dedupe": [_refused("breaker")]})) == ("handed-over", "breaker")
    assert _kind(_evidence(records={"dedupe": [_refused("opt-out", reason="the node opted out")]}))[0] == "handed-over"


def test_a_budget_refusal_is_a_hand_over_only_while_a_node_of_the_pool_is_still_held() -> None:
    held = [_node("n0", cordoned=True), _node("n1", faulty=True), _node("n2")]
    assert _kind(_evidence(nodes=held, records={"dedupe": [_refused("budget-pool")]})) == ("handed-over", "budget")
    free = _evidence(records={"dedupe": [_refused("budget-pool")]})
    assert _kind(free) == ("lost", "none")
    assert "never admitted" in check_fault_liveness(free)[0].detail


def test_a_later_admission_outranks_an_earlier_refusal() -> None:
    evidence = _evidence(nodes=[_node("n0"), _node("n1"), _node("n2")],
                         records={"dedupe": [_refused("budget-pool")], "remediation": [_rem("done", at=ONSET + 90)]})
    assert _kind(evidence) == ("repaired", "")


def test_a_condition_that_cleared_by_itself_or_a_node_that_left_is_not_lost() -> None:
    scenario = _scenario(flips=[_flip(), _flip(at=ONSET + 40, status="False")])
    assert _kind(_evidence(scenario=scenario, nodes=[_node("n0"), _node("n1"), _node("n2")]))[0] == "cleared"
    assert _kind(_evidence(nodes=[_node("n0"), _node("n2")]))[0] == "cleared"


def test_a_flip_on_a_condition_already_true_is_not_a_new_fault() -> None:
    """Two draws of the same node and condition: the second changed nothing the auditor could see."""
    scenario = _scenario(flips=[_flip(), _flip(at=ONSET + 200)])
    assert len(genuine_faults(_evidence(scenario=scenario))) == 1


def test_kept_and_dropped_pending_faults_are_outcomes() -> None:
    kept = Record(kind="pending-fault", id="f", state="waiting", data={"cluster": CLUSTER_ID, "node": "n1",
                                                                        "code": "budget-pool"})
    assert _kind(_evidence(records={"pending-fault": [kept]}))[0] == "kept"
    dropped = {"type": "Steward.Remediation.PendingDropped",
               "data": {"cluster": CLUSTER_ID, "node": "n1", "reason_code": "cleared", "reason": "source clears"}}
    assert _kind(_evidence(published=[dropped])) == ("cleared", "cleared")


def _with_quota(limit: int) -> Any:
    scenario = _scenario()
    for quota in scenario.sim["subscriptions"][0]["quotas"]:
        if "T4" in quota["family"]:
            quota["limit"] = limit
    return scenario


def test_a_migration_blocked_for_a_cause_the_scenario_injected_passes_and_any_other_fails() -> None:
    healthy = [_node("n0"), _node("n1"), _node("n2")]
    quota = Record(kind="migration", id="m2", state="blocked", data={"pool": "old", "reason": "Insufficient vcpu quota"})
    tight = _with_quota(sum(p.count * 8 for p in _scenario().pools))  # no room for a surge or a replacement pool
    assert check_fault_liveness(_evidence(scenario=tight, nodes=healthy, records={"migration": [quota]})) == []
    plenty = _with_quota(100_000)
    found = check_fault_liveness(_evidence(scenario=plenty, nodes=healthy, records={"migration": [quota]}))
    assert [v.invariant for v in found] == ["migration-liveness"] and "quota" in found[0].detail


def test_the_outcome_table_counts_faults_by_source_cure_outcome_and_cause() -> None:
    table = outcome_table(_evidence(records={"dedupe": [_refused("breaker")]}))
    assert table == {"npd fault, cure restart: handed-over (breaker)": 1}


def test_giving_up_on_a_fault_the_ladder_cures_fails_unless_another_fault_explains_it() -> None:
    scenario = _scenario(flips=[_flip(fixed_by="restart")], REMEDIATION_LADDER="restart,reimage,replace")
    gave_up = _rem("gave_up", reason="every rung failed (last: replace: did not stay healthy)")
    evidence = _evidence(scenario=scenario, records={"remediation": [gave_up]})
    assert _kind(evidence) == ("handed-over", "none")
    assert "cures a fault fixed by restart" in check_fault_liveness(evidence)[0].detail
    dcgm = {"type": "UnhealthyNvidiaDCGMServices", "cluster": "soak1", "pool": "gpu1", "node_index": 1,
            "at": ONSET + 60, "status": "True", "fixed_by": "never"}
    both = _scenario(flips=[_flip(fixed_by="restart"), dcgm])
    second = {**_turned(at=ONSET + 60), "conditions": ["UnhealthyNvidiaDCGMServices"]}
    evidence = _evidence(scenario=both, records={"remediation": [gave_up]}, turned=[_turned(), second])
    assert [o.cause for o in outcomes(evidence)] == ["not cured by the ladder"] * 2


def test_giving_up_because_the_node_made_for_the_broken_one_has_a_fault_of_its_own_is_explained_by_that_fault() -> None:
    """Seed 955084: the broken node was deleted and the pool's count restored; the node AKS made for it came up
    with an injected fault of its own, so the rung gave up naming it (``replace.newcomer``). Without that
    fault, the same give-up is unexplained."""
    scenario = _scenario(flips=[_flip(fixed_by="restart"), _flip(2, at=ONSET + 90)])
    gave_up = _rem("gave_up", replace={"mode": "delete-first", "newcomer": "n3"},
                   reason="replace: n1 is deleted and pool gpu1 is back to 3, but the node that came for it, n3, is "
                          "not healthy (UnhealthyNvidiaDevicePlugin True): every rung failed")
    pools = {("soak1", n): "gpu1" for n in [*NODES, "n3"]}
    nodes = [_node("n0"), _node("n2"), _node("n3", faulty=True)]
    evidence = _evidence(scenario=scenario, records={"remediation": [gave_up]}, node_pools=pools, nodes=nodes,
                         turned=[_turned(), _turned("n3", at=ONSET + 90)])
    judged = {o.fault.node: o for o in outcomes(evidence)}
    assert (judged["n1"].kind, judged["n1"].cause) == ("handed-over", "not cured by the ladder")
    alone = _evidence(scenario=_scenario(flips=[_flip(fixed_by="restart")]), records={"remediation": [gave_up]},
                      node_pools=pools, nodes=nodes)
    assert _kind(alone) == ("handed-over", "none")


def test_a_flip_after_a_replacement_is_judged_on_the_node_it_struck() -> None:
    """The simulator resolves node_index among the pool's nodes when the flip fires: after a replacement the
    index names the new node, which is where the auditor saw the condition turn True."""
    evidence = _evidence(turned=[_turned("n3")], node_pools={("soak1", n): "gpu1" for n in [*NODES, "n3"]},
                         nodes=[_node("n0"), _node("n2"), _node("n3", faulty=True)])
    [fault] = genuine_faults(evidence)
    assert fault.node == "n3"


def test_a_flip_is_put_down_to_the_node_the_simulator_says_it_struck() -> None:
    """Seed 959008: after a replacement shifted the pool's order, two flips fired at once; the guess from the start's
    order gave each the other's node. The simulator's ``flips`` oracle names the node each one struck."""
    scenario = _scenario(flips=[_flip(1), _flip(2, fixed_by="never")])
    turned = [_turned("n1"), _turned("n2")]
    guessed = _evidence(scenario=scenario, turned=turned)
    assert {(f.node, f.cure) for f in genuine_faults(guessed)} == {("n1", "restart"), ("n2", "never")}
    struck = {"flips": [{"cluster": "soak1", "pool": "gpu1", "type": DEVICE_PLUGIN, "node_index": 1, "at": ONSET,
                         "node": "n2"},
                        {"cluster": "soak1", "pool": "gpu1", "type": DEVICE_PLUGIN, "node_index": 2, "at": ONSET,
                         "node": "n1"}]}
    told = _evidence(scenario=scenario, turned=turned, oracles=struck)
    assert {(f.node, f.cure) for f in genuine_faults(told)} == {("n2", "restart"), ("n1", "never")}
    already = _evidence(scenario=scenario, turned=[_turned("n1")], oracles=struck)  # n2 was True before it
    assert {(f.node, f.cure) for f in genuine_faults(already)} == {("n1", "never")}


def test_a_clear_is_put_down_to_the_node_the_simulator_says_it_struck_not_to_its_index() -> None:
    """Seed 962068: after replacements shifted the pool's order, the clear drawn for index 1 struck the node whose
    fault came from index 2; the remediation found the condition False before its restart and was released."""
    scenario = _scenario(flips=[_flip(2, fixed_by="never"), _flip(1, at=ONSET + 60, status="False")])
    released = _rem("released", node="n2", reason="re-read before the restart: UnhealthyNvidiaDevicePlugin is False "
                                                   "on n2; released, uncordoned if we cordoned it, nothing repaired")
    nodes = [_node("n0"), _node("n1"), _node("n2")]
    struck = {"flips": [{"cluster": "soak1", "pool": "gpu1", "type": DEVICE_PLUGIN, "node_index": 2, "at": ONSET,
                         "status": "True", "node": "n2"},
                        {"cluster": "soak1", "pool": "gpu1", "type": DEVICE_PLUGIN, "node_index": 1, "at": ONSET + 60,
                         "status": "False", "node": "n2"}]}
    told = _evidence(scenario=scenario, nodes=nodes, turned=[_turned("n2")], oracles=struck,
                     records={"remediation": [released]})
    assert _kind(told) == ("cleared", "cleared")
    elsewhere = {"flips": [struck["flips"][0], {**struck["flips"][1], "node": "n1"}]}  # the clear struck another node
    assert _kind(_evidence(scenario=scenario, nodes=nodes, turned=[_turned("n2")], oracles=elsewhere,
                           records={"remediation": [released]}))[1] == "none"


@pytest.mark.parametrize(("second", "explained"), [(None, False), ("restart", True), ("replace", True)])
def test_a_flip_on_a_condition_already_true_draws_the_cure_again_and_explains_a_give_up(second: str | None,
                                                                                     explained: bool) -> None:
    """Seed 960143: a second flip struck n1's condition while it was True and the remediation worked: no new fault
    shows, but the simulator drew n1's cure again, so the ladder's give-up is the scenario's doing."""
    gave_up = _rem("gave_up", reason="every rung failed (last: reimage: did not stay healthy)")
    flips = [_flip(1, fixed_by="reimage")] + ([_flip(1, at=ONSET + 80, fixed_by=second)] if second else [])
    struck = {"flips": [{"cluster": "soak1", "pool": "gpu1", "type": DEVICE_PLUGIN, "node_index": 1,
                         "at": f["at"], "t": CLOCK_START + f["at"], "status": "True", "node": "n1",
                         "fixed_by": f["fixed_by"]} for f in flips]}
    evidence = _evidence(scenario=_scenario(flips=flips, REMEDIATION_LADDER="restart,reimage"), oracles=struck,
                         records={"remediation": [gave_up]}, nodes=[_node("n0"), _node("n1", faulty=True), _node("n2")])
    [fault] = genuine_faults(evidence)
    assert (fault.node, fault.cure) == ("n1", "reimage")
    assert (judge(evidence, fault).cause != "none") is explained


def _degraded_host(node: str = "n2", at: float = ONSET) -> dict[str, Any]:
    return {"kind": "resource-health", "cluster": "soak1", "pool": "gpu1", "node": node, "scenario": "degraded-host",
            "t": CLOCK_START + at, "ok": True}


@pytest.mark.parametrize(("outcome", "kind"), [("nothing", "lost"), ("a budget refusal nothing holds", "lost"),
                                               ("remediated", "repaired"), ("dropped", "cleared"),
                                               ("kept", "kept"), ("gone", "cleared")])
def test_a_pushed_health_fault_ends_somewhere_or_is_lost(outcome: str, kind: str) -> None:
    """Seed 931005's shape: a degraded host refused while its neighbour held the pool's budget, then never
    looked at again, is lost; remediated, dropped by its source, still kept, or gone, it is not."""
    records: dict[str, list[Any]] = {}
    published: list[dict[str, Any]] = []
    if outcome == "a budget refusal nothing holds":
        records["dedupe"] = [_refused("budget-pool", node="n2")]
    if outcome == "remediated":
        records["remediation"] = [_rem("done", node="n2")]
    if outcome == "dropped":
        published.append({"type": "Steward.Remediation.PendingDropped",
                          "data": {"cluster": CLUSTER_ID, "node": "n2", "reason_code": "cleared"}})
    if outcome == "kept":
        records["pending-fault"] = [Record(kind="pending-fault", id="f", state="waiting",
                                           data={"cluster": CLUSTER_ID, "node": "n2", "code": "budget-pool"})]
    nodes = [_node("n0"), _node("n1")] + ([] if outcome == "gone" else [_node("n2")])
    evidence = _evidence(scenario=_scenario(flips=[]), actions=[_degraded_host()], nodes=nodes, turned=[],
                         records=records, published=published)
    [fault] = genuine_faults(evidence)
    assert (fault.source, judge(evidence, fault).kind) == ("resource-health", kind)
    assert bool(check_fault_liveness(evidence)) is (kind == "lost")


@pytest.mark.parametrize(("then", "gap", "performed", "kind"), [
    (None, 7.5, "after", "lost"), ("planned-maintenance", 7.5, "after", "cleared"),
    ("planned-maintenance", 0.0, "after", "cleared"), ("planned-maintenance", 0.0, "before", "lost"),
])
def test_a_health_fault_a_later_injection_on_the_same_vm_replaced_is_cleared_by_its_source(
        then: str | None, gap: float, performed: str, kind: str) -> None:
    """Seed 961022: a host failure, then a planned maintenance on the same VM 7.5 s later: ARM said Planned when the
    crash's event arrived, and the reboot ended Available. Nothing the app did or skipped lost that fault. Seed
    963818: both at the same instant, performed in that order, the same: "later" is the driver's order."""
    actions = [{**_degraded_host(), "scenario": "host-failure"}]
    if then:
        other = {**_degraded_host(at=ONSET + gap), "scenario": then}
        actions = [*actions, other] if performed == "after" else [other, *actions]
    evidence = _evidence(scenario=_scenario(flips=[]), actions=actions, turned=[],
                         nodes=[_node("n0"), _node("n1"), _node("n2")])
    [fault] = genuine_faults(evidence)
    assert judge(evidence, fault).kind == kind


def test_a_later_fault_on_a_node_an_earlier_remediation_handed_to_an_operator_is_theirs() -> None:
    """Soak seed 2: a second XID on a node left cordoned by a remediation that gave up (the PDBs refused its
    drain) is not admitted again; the node is the operator's already."""
    pdb = "drain refused: covered by more than one PodDisruptionBudget; fallback hold: the node stays cordoned"
    earlier = _rem("gave_up", at=ONSET - 500, reason=pdb)  # ended before this fault's onset
    held = [_node("n0"), _node("n1", faulty=True, cordoned=True), _node("n2")]
    assert _kind(_evidence(nodes=held, records={"remediation": [earlier]})) == ("handed-over", "drain obstacle")
    assert _kind(_evidence(records={"remediation": [earlier]}))[0] == "lost", "uncordoned since: not held"


def test_a_flapping_condition_in_the_pool_while_the_repair_ran_explains_a_give_up() -> None:
    """Seed 950062: the flapping condition's node_index named the replacement once the broken node was gone, and
    the replacement never stayed healthy long enough to be trusted."""
    gave_up = _rem("gave_up", reason="every rung failed (last: replace: did not stay healthy)")
    flap = {"start": ONSET + 60, "cluster": "soak1", "pool": "gpu1", "node_index": 2, "type": DEVICE_PLUGIN,
            "period_s": 8.0, "flips": 6}
    scenario = _scenario(flips=[_flip(fixed_by="restart")])
    assert _kind(_evidence(scenario=scenario, records={"remediation": [gave_up]}))[1] == "none"
    scenario.flapping.append(flap)
    assert _kind(_evidence(scenario=scenario, records={"remediation": [gave_up]})) == \
        ("handed-over", "not cured by the ladder")


def test_an_xid_a_later_xid_overwrote_before_its_window_confirmed_it_is_shown_as_overwritten() -> None:
    """Seed 950079: XID 79, then XID 31 on the same GPU 62 s later; the exporter's gauge holds the last XID only and
    the window re-check never saw 79 in every sample. A limit of the design, shown as such, not a loss."""
    def xid(value: int, at: float) -> dict[str, Any]:
        return {"kind": "dcgm-xid", "cluster": "soak1", "pool": "gpu1", "node": "n2", "xid": value,
                "t": CLOCK_START + at, "ok": True}

    nodes = [_node("n0"), _node("n1"), _node("n2")]
    alone = _evidence(scenario=_scenario(flips=[]), actions=[xid(79, ONSET)], nodes=nodes, turned=[])
    assert _kind(alone) == ("lost", "none")
    overwritten = _evidence(scenario=_scenario(flips=[]), actions=[xid(79, ONSET), xid(31, ONSET + 62)], nodes=nodes,
                            turned=[])
    assert _kind(overwritten) == ("cleared", "overwritten")
    assert outcome_table(overwritten) == {"dcgm fault, cure as simulated: cleared (overwritten)": 1}


def test_an_ecc_storm_a_later_xid_overwrote_before_its_window_confirmed_it_is_shown_as_overwritten() -> None:
    """Seed 961562: an ECC storm, then XID 43 on the node 55 s later. Under the managed exporter's default CSV the
    storm's only exported trace is the XID gauge's 48, which the later XID replaced before the window re-check."""
    storm = {"kind": "dcgm-ecc-storm", "cluster": "soak1", "pool": "gpu1", "node": "n2", "persist": False,
             "t": CLOCK_START + ONSET, "ok": True}
    app_xid = {"kind": "dcgm-xid", "cluster": "soak1", "pool": "gpu1", "node": "n2", "xid": 43,
               "t": CLOCK_START + ONSET + 55, "ok": True}
    nodes = [_node("n0"), _node("n1"), _node("n2")]
    assert _kind(_evidence(scenario=_scenario(flips=[]), actions=[storm], nodes=nodes, turned=[])) == ("lost", "none")
    both = _evidence(scenario=_scenario(flips=[]), actions=[storm, app_xid], nodes=nodes, turned=[])
    assert _kind(both) == ("cleared", "overwritten")


def test_the_same_xid_again_on_a_node_whose_gauge_still_shows_it_is_no_new_fault() -> None:
    """Seed 961764: XID 48 on a node (refused by the open breaker), then XID 48 again 244 s later: the last-XID gauge
    showed 48 all along, so nothing new happened; after a reboot (the gauge reset) it is a new fault."""
    def xid(value: int, at: float) -> dict[str, Any]:
        return {"kind": "dcgm-xid", "cluster": "soak1", "pool": "gpu1", "node": "n2", "xid": value,
                "t": CLOCK_START + at, "ok": True}

    nodes = [_node("n0"), _node("n1"), _node("n2")]
    again = _evidence(scenario=_scenario(flips=[]), actions=[xid(48, ONSET), xid(48, ONSET + 244)], nodes=nodes,
                      turned=[])
    assert [f.at for f in genuine_faults(again)] == [CLOCK_START + ONSET]
    rebooted = _evidence(scenario=_scenario(flips=[]), actions=[xid(48, ONSET), xid(48, ONSET + 244)], nodes=nodes,
                         turned=[], oracles={"repairs": [{"cluster": "soak1", "node": "n2", "rung": "restart",
                                                          "t": CLOCK_START + ONSET + 100}]})
    assert [f.at for f in genuine_faults(rebooted)] == [CLOCK_START + ONSET, CLOCK_START + ONSET + 244]
    other = _evidence(scenario=_scenario(flips=[]), actions=[xid(79, ONSET), xid(48, ONSET + 244)], nodes=nodes,
                      turned=[])
    assert len(genuine_faults(other)) == 2


@pytest.mark.parametrize(("fault", "repair", "at", "kind"), [
    ({"kind": "dcgm-xid", "xid": 79}, "restart", ONSET + 60, ("repaired", "")),
    ({"kind": "dcgm-xid", "xid": 79}, "reimage", ONSET + 60, ("repaired", "")),
    ({"kind": "dcgm-ecc-storm", "persist": False}, "restart", ONSET + 60, ("repaired", "")),
    ({"kind": "dcgm-ecc-storm", "persist": True}, "restart", ONSET + 60, ("handed-over", "none")),  # failing memory
    ({"kind": "dcgm-xid", "xid": 79}, "restart", ONSET - 60, ("handed-over", "none")),  # a reboot before the onset
    ({"kind": "dcgm-xid", "xid": 79}, "restart", ONSET + 400, ("handed-over", "none")),  # after the release
    ({"kind": "dcgm-xid", "xid": 79}, None, None, ("handed-over", "none")),
])
def test_a_dcgm_fault_released_after_a_reboot_of_its_node_counts_as_repaired_by_it(
        fault: dict[str, Any], repair: str | None, at: float | None, kind: tuple[str, str]) -> None:
    """Seed 966699: a restart for XID 79; an NPD fault that struck during its verification sent the remediation on to
    the replace, and the re-read before the replace found the XID gone and the node healthy: released. The reboot
    reset the last-XID gauge (sim/prometheus/api.py ``reboot``): the restart repaired the XID, whatever the release's
    note says; a failing memory errs again after every reboot, so its release is not a repair."""
    action = {"cluster": "soak1", "pool": "gpu1", "node": "n2", "t": CLOCK_START + ONSET, "ok": True, **fault}
    released = _rem("released", node="n2", reason="re-read before the replace: Xid79 no longer shows on n2 in every "
                                                  "sample and copy of the last 90s, and the node is healthy; released, "
                                                  "uncordoned if we cordoned it, no replace needed after the restart it did")
    repairs = {"repairs": [{"t": CLOCK_START + at, "cluster": "soak1", "node": "n2", "rung": repair}] if repair else []}
    nodes = [_node("n0"), _node("n1"), _node("n2")]
    evidence = _evidence(scenario=_scenario(flips=[]), actions=[action], nodes=nodes, turned=[], oracles=repairs,
                         records={"remediation": [released]})
    assert _kind(evidence) == kind


def test_a_repair_is_not_blamed_for_the_same_condition_failing_again_later() -> None:
    """Seed 950120: repaired at t+54, the same condition flipped True again at t+427 (a new fault, refused by the
    open breaker): the end state belongs to the later fault, not to the done repair."""
    later = _flip(at=ONSET + 400, fixed_by="replace")
    scenario = _scenario(flips=[_flip(fixed_by="reimage"), later])
    evidence = _evidence(scenario=scenario, turned=[_turned(), _turned(at=ONSET + 400)],
                         records={"remediation": [_rem("done")],
                                  "dedupe": [_refused("breaker", at=ONSET + 410)]})
    assert [(o.kind, o.cause) for o in outcomes(evidence)] == [("repaired", ""), ("handed-over", "breaker")]


def test_a_dcgm_fault_a_forged_series_contests_is_handed_over_for_the_forgery() -> None:
    """Seed 950133: an ECC storm on a node a tenant's PodMonitor series also named; the copies disagree, the window
    re-check never confirms it, and the steward reports ``contested`` (SeriesRefused)."""
    storm = {"kind": "dcgm-ecc-storm", "cluster": "soak1", "pool": "gpu1", "node": "n2", "t": CLOCK_START + ONSET,
             "ok": True, "persist": False}
    forged = {"kind": "dcgm-forge-series", "cluster": "soak1", "pool": "gpu1", "node": "n2",
              "t": CLOCK_START + ONSET - 50, "ok": True}
    contested = {"type": "Steward.Signal.SeriesRefused", "data": {"code": "contested", "count": 1}}
    nodes = [_node("n0"), _node("n1"), _node("n2")]
    base = {"scenario": _scenario(flips=[]), "nodes": nodes, "turned": []}
    assert _kind(_evidence(actions=[storm, forged], **base)) == ("lost", "none"), "not reported: lost"
    assert _kind(_evidence(actions=[storm], published=[contested], **base)) == ("lost", "none"), "no forgery named it"
    assert _kind(_evidence(actions=[storm, forged], published=[contested], **base)) == ("handed-over", "forged series")


def test_a_second_nap_flip_of_a_condition_already_true_on_the_node_is_no_new_fault() -> None:
    """Seed 951101: two draws put UnhealthyNvidiaDevicePlugin on the same NAP node 48 s apart; the second changed
    nothing, and the first was handed over (the breaker)."""
    def flip(at: float) -> dict[str, Any]:
        return {"kind": "nap-flip", "cluster": "nap1", "nodepool": "gpu", "node": "k1", "pool": "gpu",
                "type": DEVICE_PLUGIN, "t": CLOCK_START + at, "ok": True}

    evidence = _evidence(scenario=_scenario(flips=[]), actions=[flip(ONSET), flip(ONSET + 48)], turned=[])
    assert [f.at - CLOCK_START for f in genuine_faults(evidence)] == [ONSET]


def test_a_node_at_its_attempts_cap_is_handed_over_for_that_cap() -> None:
    """Seed 951271: a node's third remediation in a day is cordoned and left to an operator (BUDGET_NODE attempts)."""
    capped = _rem("gave_up", reason="3 attempts in the last 86400s, at most 3: leaving the node to an operator: "
                                    "cordoned and not drained or repaired again")
    assert _kind(_evidence(records={"remediation": [capped]})) == ("handed-over", "attempts cap")


def test_a_second_ecc_storm_on_a_gpu_already_storming_is_no_new_fault() -> None:
    """Seed 951270: two draws put ECC storms on one node 139 s apart; the first was handed over (a budget)."""
    def storm(at: float) -> dict[str, Any]:
        return {"kind": "dcgm-ecc-storm", "cluster": "soak1", "pool": "gpu1", "node": "n2", "t": CLOCK_START + at,
                "ok": True, "persist": at == ONSET}

    evidence = _evidence(scenario=_scenario(flips=[]), actions=[storm(ONSET), storm(ONSET + 139)], turned=[])
    assert [f.what for f in genuine_faults(evidence)] == ["ECC storm (failing memory)"]


@pytest.mark.parametrize(("verifying_at", "repairing_after", "kind"), [
    (ONSET - 30, None, ("handed-over", "not cured by the ladder")),  # struck while the repair was verified
    (ONSET - 30, ONSET + 10, ("handed-over", "none")),  # a rung acted after it struck: the ladder ran for it
    (ONSET + 20, None, ("handed-over", "none")),  # struck before verification: the ladder could have cured it
])
def test_a_fault_that_struck_while_another_repair_was_verified_explains_its_give_up(
        verifying_at: float, repairing_after: float | None, kind: tuple[str, str]) -> None:
    """Seed 952067: a device-plugin repair (ladder: reimage) was being verified when a DCGM-services fault struck
    the node; the verification failed on it and the remediation gave up. No rung ran after that fault struck,
    so the ladder never had its chance: explained. Had a rung acted after it, the give-up stays unexplained."""
    scenario = _scenario(flips=[_flip(fixed_by="restart")], REMEDIATION_LADDER="reimage")
    history = [{"at": CLOCK_START + ONSET - 60, "state": "repairing", "note": "reimage of vm started"},
               {"at": CLOCK_START + verifying_at, "state": "verifying", "note": "reimage repaired the node"}]
    if repairing_after is not None:
        history.append({"at": CLOCK_START + repairing_after, "state": "repairing", "note": "reimage of vm started"})
    gave_up = Record(kind="remediation", id="r-n1", state="gave_up", created_at=CLOCK_START + ONSET - 80,
                     updated_at=CLOCK_START + ONSET + 150, history=history,
                     data={"cluster": CLUSTER_ID, "node": "n1", "pool": "gpu1", "condition": "UnhealthyNvidiaDCGMServices",
                           "reason": "every rung failed (last: reimage: did not stay healthy: "
                                     "UnhealthyNvidiaDevicePlugin is True)"})
    evidence = _evidence(scenario=scenario, records={"remediation": [gave_up]})
    assert _kind(evidence) == kind


@pytest.mark.parametrize(("state", "kind"), [("blocked", ("handed-over", "drain obstacle")), ("draining", ("lost", "none"))])
def test_a_fault_on_a_node_a_blocked_migration_holds_cordoned_is_the_operators(state: str, kind: tuple[str, str]) -> None:
    """Seed 952125: the migration of an unmanaged pool cordoned its nodes to drain them; a fault struck one of
    them, and the sweep left the node alone (cordoned by someone else). The migration's drain stalled and
    it was blocked, the node still cordoned: the operator's, for the migration's cause."""
    scenario = _scenario(REMEDIATION_LADDER="restart,reimage,replace")
    scenario = dataclasses.replace(scenario, strict_faults=["unready pods under a PDB (AlwaysAllow)"])
    mig = Record(kind="migration", id="m-1", state=state, created_at=CLOCK_START, updated_at=CLOCK_START + 300,
                 data={"cluster_name": "soak1", "pool": "gpu1", "cordoned": ["n0", "n1"],
                       "reason": "drain stalled past MIGRATION_DRAIN_TIMEOUT_S: n0: drain deadline reached with pods "
                                 "still on the node: web/api-1"})
    nodes = [_node("n0", cordoned=True), _node("n1", faulty=True, cordoned=True), _node("n2")]
    evidence = _evidence(scenario=scenario, nodes=nodes, records={"migration": [mig]})
    assert _kind(evidence) == kind


def test_a_fault_is_judged_by_the_remediation_of_its_own_condition_not_a_later_one_of_another() -> None:
    """Seed 953189: the device-plugin fault was repaired (done); a later DCGM-services fault on the same node
    was admitted and released because it cleared. The later release says nothing of the first fault."""
    repaired = _rem("done", condition=DEVICE_PLUGIN)
    later = Record(kind="remediation", id="r-n1-2", state="released", created_at=CLOCK_START + ONSET + 300,
                   updated_at=CLOCK_START + ONSET + 320,
                   data={"cluster": CLUSTER_ID, "node": "n1", "pool": "gpu1", "condition": "UnhealthyNvidiaDCGMServices",
                         "reason": "re-read before the reimage: UnhealthyNvidiaDCGMServices is False; released"})
    healthy = [_node("n0"), _node("n1"), _node("n2")]
    evidence = _evidence(nodes=healthy, records={"remediation": [repaired, later]})
    assert _kind(evidence) == ("repaired", "")


@pytest.mark.parametrize(("cure", "repair", "at", "kind"), [
    ("restart", "restart", ONSET + 60, ("repaired", "")),
    ("restart", "reimage", ONSET + 60, ("repaired", "")),
    ("reimage", "restart", ONSET + 60, ("handed-over", "none")),  # a restart does not cure what needs a reimage
    ("restart", "restart", ONSET - 60, ("handed-over", "none")),  # a repair before the onset cured nothing of it
    ("restart", None, None, ("handed-over", "none")),
])
def test_a_release_after_an_earlier_rung_cured_the_fault_counts_it_repaired(
        cure: str, repair: str | None, at: float | None, kind: tuple[str, str]) -> None:
    """Seed 963316: the restart cured the device plugin, another condition failed the verification and cleared by
    itself before the reimage, and the remediation was released: the fault was repaired by the restart, which
    only the simulator's ``repairs`` oracle can say (the release's reason is the app's word)."""
    scenario = _scenario(flips=[_flip(1, fixed_by=cure)])
    released = _rem("released", reason="re-read before the reimage: UnhealthyNvidiaDCGMServices is False on n1, and "
                                       "the node is healthy; released, uncordoned if we cordoned it, no reimage "
                                       "needed after the restart it did")
    repairs = {"repairs": [{"t": CLOCK_START + at, "cluster": "soak1", "node": "n1", "rung": repair}] if repair else []}
    healthy = [_node("n0"), _node("n1"), _node("n2")]
    assert _kind(_evidence(scenario=scenario, nodes=healthy, oracles=repairs, records={"remediation": [released]})) \
        == kind
    if kind[0] == "repaired":  # and not while the condition is True on the node at the end
        still = [_node("n0"), _node("n1", faulty=True), _node("n2")]
        assert _kind(_evidence(scenario=scenario, nodes=still, oracles=repairs,
                               records={"remediation": [released]}))[0] == "handed-over"


def _uncordoned(at: float, *, node: str = "n1", step: float = 20.0) -> dict[str, Any]:
    return {"t": CLOCK_START + at, "prev_t": CLOCK_START + at - step, "cluster": "soak1", "node": node, "unhealthy": []}


@pytest.mark.parametrize(("uncordoned", "kind"), [
    ([_uncordoned(ONSET - 87)], ("handed-over", "breaker")),  # its repair ended before the fault: a new fault
    ([_uncordoned(ONSET + 20)], ("lost", "none")),  # uncordoned after the fault struck: the record answers for it
    ([_uncordoned(ONSET - 125, step=10)], ("lost", "none")),  # seen in a step begun before it: not its uncordon
    ([_uncordoned(ONSET - 87, node="n2")], ("lost", "none")),  # another node's
    ([], ("lost", "none")),
])
def test_a_remediation_that_handed_the_node_back_before_the_fault_struck_does_not_answer_for_it(
        uncordoned: list[dict[str, Any]], kind: tuple[str, str]) -> None:
    """Seed 964530: a reimage verified and uncordoned the node at t+153 s, its host died before the save, a
    DCGM-services fault struck at t+240 s and the recovering run saved the record ``done`` at t+269 s. The sweep met
    the new fault, and the fleet breaker refused it: that refusal is its answer, not the earlier record."""
    earlier = Record(kind="remediation", id="r-n1", state="done", created_at=CLOCK_START + ONSET - 127,
                     updated_at=CLOCK_START + ONSET + 29,
                     data={"cluster": CLUSTER_ID, "node": "n1", "pool": "gpu1",
                           "condition": "UnhealthyNvidiaDCGMServices",
                           "reason": "recovered: an earlier run of this step verified the repair and uncordoned the "
                                     "node, and its save was lost; anything the node shows since is a new fault"})
    evidence = _evidence(uncordons=uncordoned, records={"remediation": [earlier],
                                                        "dedupe": [_refused("breaker", at=ONSET + 51)]})
    assert _kind(evidence) == kind

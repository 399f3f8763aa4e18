"""Issue 18's forged DCGM series in the soak: drawn without disturbing any earlier draw, played by the driver
through the simulator's control API in the shapes AKS lets a tenant or a cluster admin write, and every
new invariant catches what it is there to catch (fed fabricated evidence: a check that cannot fail proves
nothing).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from shared.kernel.ports import Record
from shared.remediation import dcgm_provenance as prov
from shared.remediation.records import node_key
from soak.forgeries import (
    ALIAS_REVERT,
    FORGE_ALIAS,
    FORGE_SERIES,
    KINDS,
    PHANTOMS,
    add_dcgm_forgeries,
    phantom_names,
)
from soak.forgery_invariants import (
    check_breaker_forged,
    check_forged_series,
    check_phantom_nodes,
    forgery_tally,
    ground_truth,
    truth_note,
)
from soak.generate import CLOCK_START, SUBSCRIPTION, PoolPlan, generate
from soak.invariants import Evidence, check_all

CLUSTER_ID = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-soak1/providers/Microsoft.ContainerService/managedClusters/soak1"
OTHER_ID = CLUSTER_ID[:-1] + "2"
STATE = {"clusters": [{"name": "soak1", "id": CLUSTER_ID}, {"name": "soak2", "id": OTHER_ID}]}
T = CLOCK_START + 100


def _evidence(**fields: Any) -> Evidence:
    base: dict[str, Any] = {"scenario": generate(3, short=True), "oracles": {}, "state": STATE, "nodes": {},
                            "records": {}, "max_unavailable": {}, "start": CLOCK_START, "now": CLOCK_START + 900}
    base.update(fields)
    return Evidence(**base)


def _forged(node: str, cluster: str = "soak1", scrape: str = "podmonitor") -> dict[str, Any]:
    return {"kind": FORGE_SERIES, "cluster": cluster, "node_cluster": cluster, "node": node, "scrape": scrape,
            "t": T, "ok": True}


def _phantoms(count: int = 3, cluster: str = "soak1") -> dict[str, Any]:
    return {"kind": PHANTOMS, "cluster": cluster, "count": count, "tag": 12345678, "sent": count, "t": T, "ok": True}


def _rem(rid: str, node: str, *, signal: str = "dcgm", state: str = "done", cluster: str = CLUSTER_ID) -> Record:
    return Record(kind="remediation", id=rid, state=state, created_at=T, updated_at=T + 50,
                  data={"cluster": cluster, "node": node, "pool": "gpu1", "signal": signal, "condition": "Xid79",
                        "policy_row": "xid:79", "ladder": ["restart"], "rung_index": 0})


def _breaker(state: str, window: list[str], *, fleet: int = 6) -> Record:
    history = [{"at": T, "state": "closed", "note": "sweep"}] + ([{"at": T + 5, "state": "open", "note": "x"}]
                                                                 if state == "open" else [])
    return Record(kind="breaker", id="fleet", state=state, created_at=T, updated_at=T + 5, history=history,
                  data={"window": {k: T for k in window}, "fleet_nodes": fleet, "reason": "3 of 6 GPU nodes"})


# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("seed", [0, 2, 11, 13, 1040], ids=lambda s: f"seed-{s}")
def test_the_forgery_layer_only_adds_to_what_a_seed_drew_before(seed: int) -> None:
    before, after = generate(seed, forgeries=False), generate(seed)
    assert after.sim == before.sim
    assert (after.flips, after.flapping, after.faults, after.crashes, after.hosts, after.pools, after.profile,
            after.strict_faults, after.signal_faults, after.dcgm_clusters) == (
        before.flips, before.flapping, before.faults, before.crashes, before.hosts, before.pools, before.profile,
        before.strict_faults, before.signal_faults, before.dcgm_clusters)
    assert [a for a in after.actions if a["kind"] not in KINDS] == before.actions
    assert not before.forgeries


def test_forgeries_are_drawn_only_where_dcgm_is_and_not_for_the_pinned_seeds() -> None:
    for seed in range(120):
        scenario = generate(seed)
        if scenario.forgeries:
            assert scenario.dcgm_clusters, seed
    assert not generate(1040, strict=False).forgeries
    assert generate(13, strict=False, signals=True).forgeries == generate(13).forgeries
    assert not generate(13, signals=False, forgeries=True).forgeries  # no workspace, nothing to forge


def test_every_forgery_kind_appears_many_times_in_200_seeds() -> None:
    kinds: Counter[str] = Counter()
    for seed in range(200):
        scenario = generate(seed)
        kinds.update(k.split(" ", 1)[1] if k[0].isdigit() else k for k in scenario.forgeries)
        kinds.update(a["kind"] for a in scenario.actions if a["kind"] in KINDS)
        aliases = [a for a in scenario.actions if a["kind"] in (FORGE_ALIAS, ALIAS_REVERT)]
        if aliases:
            forge, revert = aliases
            assert (forge["kind"], revert["kind"]) == (FORGE_ALIAS, ALIAS_REVERT) and forge["at"] < revert["at"]
            assert forge["cluster"] == revert["cluster"] != forge["alias"]
            assert scenario.quiet_after_s > revert["at"]
        for burst in (a for a in scenario.actions if a["kind"] == PHANTOMS):
            assert 150 <= burst["count"] <= 400 and burst["cluster"] in scenario.dcgm_clusters
    for kind in ("forged dcgm series (annotations)", "forged dcgm series (podmonitor)", "phantom node names burst",
                 "cluster_alias set to another cluster's name"):
        assert kinds[kind] >= 10, (kind, kinds)


def test_one_cluster_draws_no_cluster_alias_forgery() -> None:
    pools = [PoolPlan(cluster="soak1", name="gpu1", vm_size="Standard_NC4as_T4_v3", count=3, managed=True)]
    for seed in range(60):
        layer = add_dcgm_forgeries(seed, pools=pools, dcgm_clusters=["soak1"], grace=30, span=180)
        assert not [a for a in layer.actions if a["kind"] in (FORGE_ALIAS, ALIAS_REVERT)]


def test_phantom_names_are_distinct_and_no_fleet_pool_has_them() -> None:
    names = phantom_names({"tag": 4242, "count": 300})
    assert len(set(names)) == 300
    assert all(n.startswith("aks-ghost") for n in names)  # soak pools: system, gpu1, gpu2, old, NAP's gpu


# --------------------------------------------------------------------------- execution


def test_the_driver_plays_each_forgery_in_the_shape_aks_lets_it_be_written() -> None:
    from sim.testing import start_sim
    from soak.actions import ActionRunner
    from soak.control import SimClient

    managed = {"gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}}
    clusters = [{"name": name, "resource_group": f"rg-{name}", "pools": [
        {"name": "system", "mode": "System", "count": 1},
        {"name": "gpu1", "vmSize": "Standard_NC4as_T4_v3", "count": 2, **managed}]} for name in ("soak1", "soak2")]
    scenario = {"clock": {"manual": True, "start": CLOCK_START}, "timings": {"pod_start_s": 1},
                "subscriptions": [{"id": SUBSCRIPTION, "clusters": clusters}]}
    fault = {"metric": "DCGM_FI_DEV_XID_ERRORS", "value": 79, "gpu": 0}
    actions = [{"at": 5, "kind": FORGE_SERIES, "cluster": "soak1", "pool": "gpu1", "node_index": 0,
                "scrape": "annotations", **fault},
               {"at": 5, "kind": FORGE_SERIES, "cluster": "soak1", "pool": "gpu1", "node_index": 1,
                "scrape": "podmonitor", **fault},
               {"at": 10, "kind": FORGE_ALIAS, "cluster": "soak2", "alias": "soak1", "pool": "gpu1", "node_index": 0,
                "own_pool": "gpu1", "own_index": 1, **fault},
               {"at": 10, "kind": PHANTOMS, "cluster": "soak2", "count": 20, "tag": 77, **fault},
               {"at": 20, "kind": ALIAS_REVERT, "cluster": "soak2"}]
    with start_sim(scenario=scenario, seed=1) as sim:
        client = SimClient(sim.endpoints)
        try:
            start = float(client.control("GET", "/clock")["now"])
            runner = ActionRunner(actions, sim=client, start=start)
            for t in (5, 10):
                client.control("POST", "/advance", {"seconds": start + t - float(client.control("GET", "/clock")["now"])})
                runner.run_due(start + t)
            assert all(a["ok"] for a in runner.log), runner.log
            annotated, monitored, alias, burst = runner.log
            nodes = {c["name"]: next(p["nodes"] for p in c["pools"] if p["name"] == "gpu1")
                     for c in client.state()["clusters"]}
            assert (annotated["node"], monitored["node"]) == (nodes["soak1"][0], nodes["soak1"][1])
            assert "kubernetes_namespace" in annotated["labels"]  # the pod-annotations job's own labels
            assert set(monitored["labels"]) == prov.MANAGED_LABELS  # exactly the managed exporter's shape
            assert (alias["node"], alias["phantom"]) == (nodes["soak1"][0], nodes["soak2"][1])
            client.control("POST", "/advance", {"seconds": 30})  # a scrape of every new series
            faulty = client.control("GET", "/dcgm")["faulty"]
            named = {(f["cluster"], f["node"]) for f in faulty if f["job"] == "dcgm-exporter"}
            assert alias["label_cluster"] == "soak1"  # soak2's series, under soak1's name
            # the burst came from soak2 while it was aliased: its phantoms are soak1's
            assert burst["label_cluster"] == "soak1" and burst["sent"] == 20
            assert {("soak1", n) for n in phantom_names(burst)} <= named
            runner.run_due(start + 40)
            assert runner.log[-1]["result"] == "soak2's cluster_alias lifted" and runner.pending == []
            truth = ground_truth(_evidence(actions=runner.log))
            assert truth.forged_only == {("soak1", nodes["soak1"][0]), ("soak1", nodes["soak1"][1]),
                                         ("soak2", nodes["soak2"][1])}
            assert ("soak1", nodes["soak2"][1]) in truth.phantoms and ("soak1", phantom_names(burst)[0]) in truth.phantoms
            assert len({n for _, n in truth.phantoms}) == 21 and truth.forged_series == 4
        finally:
            client.close()


def test_a_short_soak_run_with_forgeries_keeps_every_invariant_and_repairs_its_genuine_xid() -> None:
    from soak.report import failure_text
    from soak.runner import run_scenario

    # a genuine XID 48, three forged series, 152 phantom names (without issue 19's forged rows, which short seed 13
    # also draws: tests/soak/test_soak_regressions.py pins what they found there)
    scenario = generate(13, short=True, forged_rows=False)
    kinds = Counter(a["kind"] for a in scenario.actions)
    assert kinds[FORGE_SERIES] == 3 and kinds[PHANTOMS] == 1 and kinds["dcgm-xid"] == 2, kinds
    result = run_scenario(scenario, wall_budget_s=150.0)
    assert not result.failed, failure_text(result)
    assert result.faults["forgeries: phantom node names"] >= 150, result.faults
    assert result.faults["forgeries: forged series naming a fleet node"] == 3, result.faults
    assert any("[dcgm xid:48]" in note and " done " in note for note in result.notes), result.notes


def test_a_short_soak_run_whose_forged_series_name_a_node_nothing_else_struck_keeps_every_invariant() -> None:
    """The ``forged-series`` invariant needs a victim: a node only forged series named. Short seed 13 had one
    until the steward acted sooner (a sweep at each threshold, issue 24) and every node its forgeries named
    had a genuine fault of its own by then; short seed 108 has one."""
    from soak.report import failure_text
    from soak.runner import run_scenario

    scenario = generate(108, short=True, forged_rows=False)
    assert Counter(a["kind"] for a in scenario.actions)[FORGE_SERIES] >= 2
    result = run_scenario(scenario, wall_budget_s=150.0)
    assert not result.failed, failure_text(result)
    assert result.outcomes["forgeries: nodes named only by forged series"] >= 1, result.outcomes


# --------------------------------------------------------------------------- the new invariants


def test_the_ground_truth_leaves_out_nodes_a_genuine_fault_struck() -> None:
    actions = [_forged("n1"), _forged("n2"), _forged("n3"),
               {"kind": "dcgm-xid", "cluster": "soak1", "node": "n2", "t": T, "ok": True},
               {"kind": FORGE_SERIES, "cluster": "soak1", "scrape": "podmonitor", "t": T, "ok": False}]
    truth = ground_truth(_evidence(actions=actions, turned_true=[{"cluster": "soak1", "node": "n3", "t": T}]))
    assert truth.forged_only == {("soak1", "n1")} and truth.forged_series == 3


def test_a_node_named_only_by_forgeries_must_not_be_touched() -> None:
    forged = [_forged("n1"), _forged("n2")]
    assert check_forged_series(_evidence(actions=forged, records={"remediation": [_rem("r-0", "n9")]})) == []
    oracles = {"repairs": [{"cluster": "soak1", "node": "n1", "rung": "restart", "t": T}],
               "nodes_removed": [{"cluster": "soak1", "node": "n2", "cause": "deleteMachines", "t": T}],
               "terminations": [{"cluster": "soak1", "node": "n1", "cause": "eviction", "t": T}]}
    nodes = {"soak1": [{"metadata": {"name": "n2"}, "spec": {"unschedulable": True}}]}
    found = check_forged_series(_evidence(actions=forged, oracles=oracles, nodes=nodes,
                                          records={"remediation": [_rem("r-1", "n1")]}))
    assert {v.invariant for v in found} == {"forged-series"}
    assert all("named only by forged DCGM series" in v.detail for v in found)
    assert len(found) == 5  # the dcgm remediation, the restart, the removal, the drain, the cordon


def test_a_disruption_another_signal_explains_is_not_charged_to_the_forgery() -> None:
    oracles = {"repairs": [{"cluster": "soak1", "node": "n1", "rung": "restart", "t": T}]}
    capacity = _rem("r-1", "n1", signal="gpu-capacity")
    assert check_forged_series(_evidence(actions=[_forged("n1")], oracles=oracles,
                                         records={"remediation": [capacity]})) == []
    genuine = [_forged("n1"), {"kind": "resource-health", "cluster": "soak1", "node": "n1", "t": T, "ok": True}]
    assert check_forged_series(_evidence(actions=genuine, oracles=oracles,
                                         records={"remediation": [_rem("r-2", "n1")]})) == []


def test_the_breaker_must_not_open_because_of_forged_series() -> None:
    scenario = generate(3, short=True)
    scenario.profile.update(BREAKER_MIN_NODES="3", BREAKER_PERCENT="30")

    def _evidence(**fields: Any) -> Evidence:
        return globals()["_evidence"](scenario=scenario, **fields)

    forged = [_forged("n1"), _forged("n2"), _phantoms(2)]
    keys = [node_key(CLUSTER_ID, n) for n in ("n1", "n2", *phantom_names(_phantoms(2)))]
    genuine = [node_key(CLUSTER_ID, n) for n in ("g1", "g2", "g3", "g4")]
    flip = [{"cluster": "soak1", "node": n, "t": T} for n in ("g1", "g2", "g3", "g4")]
    opened_by_forgeries = _breaker("open", [keys[0], keys[1], keys[2], genuine[0]])
    found = check_breaker_forged(_evidence(actions=forged, turned_true=flip, records={"breaker": [opened_by_forgeries]}))
    assert [v.invariant for v in found] == ["breaker-forged"] and "3 node(s)" in found[0].detail
    tripped_anyway = _breaker("open", [keys[0], *genuine])  # 4 of 6 genuine trip it without the forged one
    assert check_breaker_forged(_evidence(actions=forged, turned_true=flip,
                                          records={"breaker": [tripped_anyway]})) == []
    closed = _breaker("closed", keys)
    assert check_breaker_forged(_evidence(actions=forged, records={"breaker": [closed]})) == []
    only_forged = _breaker("open", [node_key(CLUSTER_ID, "unknown")])
    assert [v.invariant for v in check_breaker_forged(_evidence(actions=forged, records={"breaker": [only_forged]}))] \
        == ["breaker-forged"]


def test_no_ledger_row_may_name_a_phantom_node() -> None:
    burst = _phantoms(3)
    ghost = phantom_names(burst)[1]
    alias = {"kind": FORGE_ALIAS, "cluster": "soak2", "alias": "soak1", "node_cluster": "soak1", "node": "n1",
             "phantom": "m7", "t": T, "ok": True}

    def row(cluster: str, node: str) -> Record:
        return Record(kind="dcgm-node", id=node_key(cluster, node), state="known", created_at=T, updated_at=T,
                      data={"cluster": cluster, "node": node, "seen": {}})

    nodes = {"soak1": [{"metadata": {"name": "n1"}}], "soak2": [{"metadata": {"name": "m7"}}]}
    fine = [row(CLUSTER_ID, "n1"), row(OTHER_ID, "m7")]
    assert check_phantom_nodes(_evidence(actions=[burst, alias], nodes=nodes, records={"dcgm-node": fine})) == []
    bad = [row(CLUSTER_ID, ghost), row(CLUSTER_ID, "m7"), row(CLUSTER_ID, "never-existed")]
    found = check_phantom_nodes(_evidence(actions=[burst, alias], nodes=nodes,
                                          records={"dcgm-node": bad, "remediation": [_rem("r-1", ghost)]}))
    assert [v.invariant for v in found] == ["phantom-node"] * 4
    assert "never had" in found[2].detail


def test_check_all_runs_the_forgery_invariants_and_the_tally_counts_what_was_injected() -> None:
    evidence = _evidence(actions=[_forged("n1"), _phantoms(5)], records={"remediation": [_rem("r-1", "n1")]})
    assert "forged-series" in {v.invariant for v in check_all(evidence)}
    injected, seen = forgery_tally(evidence)
    assert injected["forgeries: forged series naming a fleet node"] == 1
    assert injected["forgeries: phantom node names"] == 5
    assert seen["forgeries: nodes named only by forged series"] == 1
    assert truth_note(evidence).startswith("forgeries: named only by forged series: soak1/n1; also struck by a "
                                           "genuine fault: none; 5 phantom name(s)")
    assert forgery_tally(_evidence()) == (Counter(), Counter()) and truth_note(_evidence()) == ""

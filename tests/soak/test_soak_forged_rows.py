"""Issue 19's forged ledger rows in the soak: drawn without disturbing any earlier draw, written by the driver
straight into the ledger the hosts share for healthy nodes, with the node's real uid and providerID, and
every new invariant catches what it is there to catch (fed fabricated evidence: a check that cannot fail
proves nothing).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from shared.kernel.ports import Record
from shared.remediation.records import KIND, RemediationData, decode, node_key
from soak.forged_row_invariants import (
    check_disruptions_have_a_genuine_remediation,
    check_forged_migration_rows,
    check_forged_row_nodes,
    check_forged_row_outcomes,
    forged_row_tally,
    row_truth,
    rows_note,
    without_forged_rows,
)
from soak.forged_rows import (
    FORGE_MIGRATION,
    FORGE_ROWS,
    KINDS,
    MIGRATION_STATES,
    STATES,
    add_forged_rows,
    forged_migration,
    forged_record,
)
from soak.generate import CLOCK_START, SUBSCRIPTION, PoolPlan, generate
from soak.invariants import Evidence, check_all

CLUSTER_ID = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-soak1/providers/Microsoft.ContainerService/managedClusters/soak1"
T = CLOCK_START + 100
FORGED, GENUINE = f"{node_key(CLUSTER_ID, 'n1')}-7", f"{node_key(CLUSTER_ID, 'n2')}-1"


def _evidence(**fields: Any) -> Evidence:
    base: dict[str, Any] = {"scenario": generate(3, short=True), "oracles": {}, "state": {}, "nodes": {},
                            "records": {}, "max_unavailable": {}, "start": CLOCK_START, "now": CLOCK_START + 900}
    base.update(fields)
    return Evidence(**base)


def _write(node: str = "n1", rid: str = FORGED, case: str = "repairing/reimage/start") -> dict[str, Any]:
    return {"kind": FORGE_ROWS, "cluster": "soak1", "pool": "gpu1", "node": node, "records": [rid],
            "states": {rid: case}, "rows": [case], "t": T, "ok": True}


def _rem(rid: str, node: str, state: str = "blocked", **data: Any) -> Record:
    return Record(kind=KIND, id=rid, state=state, created_at=T, updated_at=T + 50,
                  data={"cluster": CLUSTER_ID, "node": node, "pool": "gpu1", "condition": "UnhealthyNvidiaDevicePlugin",
                        "ladder": ["restart"], "rung_index": 0, **data})


def _node_row(node: str, *ids: str) -> Record:
    return Record(kind="remediation-node", id=node_key(CLUSTER_ID, node), state="known", created_at=T, updated_at=T,
                  data={"cluster": CLUSTER_ID, "node": node, "attempts": [{"id": i, "at": T} for i in ids]})


def _event(kind: str, rid: str) -> dict[str, Any]:
    return {"type": f"Steward.Remediation.{kind}", "data": {"remediation": rid}}


BLOCKED = _rem(FORGED, "n1", refusal={"code": "NotOurCordon", "reason": "no marker"}, last_note="blocked")


# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("seed", [0, 2, 11, 13, 1040], ids=lambda s: f"seed-{s}")
def test_the_forged_rows_layer_only_adds_to_what_a_seed_drew_before(seed: int) -> None:
    before, after = generate(seed, forged_rows=False), generate(seed)
    assert after.sim == before.sim
    assert (after.flips, after.flapping, after.faults, after.crashes, after.hosts, after.pools, after.profile,
            after.strict_faults, after.signal_faults, after.dcgm_clusters, after.forgeries) == (
        before.flips, before.flapping, before.faults, before.crashes, before.hosts, before.pools, before.profile,
        before.strict_faults, before.signal_faults, before.dcgm_clusters, before.forgeries)
    assert [a for a in after.actions if a["kind"] not in KINDS] == before.actions
    assert not before.forged_rows


def test_the_pinned_seeds_draw_no_forged_rows_and_the_flag_turns_them_on() -> None:
    assert not generate(1040, strict=False).forged_rows
    drawn = [s for s in range(40) if generate(s).forged_rows]
    assert drawn and all(generate(s, strict=False, forged_rows=True).forged_rows for s in drawn)


def test_every_forged_state_is_written_many_times_in_200_seeds_and_never_for_a_drawn_fault() -> None:
    states: Counter[str] = Counter()
    scenarios = 0
    for seed in range(200):
        scenario = generate(seed)
        writes = [a for a in scenario.actions if a["kind"] == FORGE_ROWS]
        scenarios += bool(writes)
        struck = {(f["cluster"], f["pool"], f["node_index"]) for f in [*scenario.flips, *scenario.flapping]}
        for write in writes:
            assert (write["cluster"], write["pool"], write["node_index"]) not in struck
            assert write["at"] < scenario.quiet_after_s
            states.update(write["rows"])
    assert 60 <= scenarios <= 140, scenarios
    assert set(states) == set(STATES) and min(states.values()) >= 15, states


def test_a_pool_whose_every_node_has_a_drawn_fault_gets_no_forged_remediation_row() -> None:
    pools = [PoolPlan(cluster="soak1", name="gpu1", vm_size="Standard_NC4as_T4_v3", count=2, managed=True)]
    flips = [{"cluster": "soak1", "pool": "gpu1", "node_index": i} for i in (0, 1)]
    layers = [add_forged_rows(s, pools=pools, flips=flips, flapping=[], grace=30, span=180) for s in range(40)]
    assert not [a for layer in layers for a in layer.actions if a["kind"] == FORGE_ROWS]
    assert [a for layer in layers for a in layer.actions if a["kind"] == FORGE_MIGRATION]  # a pool row needs no node


def test_a_forged_row_carries_the_nodes_real_identity_and_loads_as_the_app_reads_it() -> None:
    node = {"metadata": {"name": "aks-gpu1-1-vmss000002", "uid": "u-42"},
            "spec": {"providerID": "azure:///subscriptions/s/resourceGroups/mc/providers/Microsoft.Compute/"
                                   "virtualMachineScaleSets/aks-gpu1-1-vmss/virtualMachines/2"}}
    for case, spec in STATES.items():
        rec = forged_record(case=case, cid=CLUSTER_ID, pool="gpu1", node=node, attempt=5, tag=1, serial=0, now=T)
        d = decode(rec.data, RemediationData)
        assert rec.state == spec["state"] and rec.id == f"{node_key(CLUSTER_ID, 'aks-gpu1-1-vmss000002')}-5"
        assert (d.node_uid, d.provider_id) == ("u-42", node["spec"]["providerID"])
        assert d.arm_vm_id == node["spec"]["providerID"].removeprefix("azure://") and d.arm_vm_id.startswith("/sub")
        assert d.rung_index == spec.get("rung_index", 0) and rec.next_at == T
    delete = decode(forged_record(case="repairing/replace/delete", cid=CLUSTER_ID, pool="gpu1", node=node, attempt=5,
                                  tag=1, serial=0, now=T).data, RemediationData)
    assert delete.rung_phase == "delete" and delete.replace.mode == "delete-first"


# --------------------------------------------------------------------------- the new invariants


def test_the_ground_truth_leaves_out_nodes_a_genuine_fault_struck_but_not_record_only_events() -> None:
    actions = [_write("n1"), _write("n2", rid="x-8"), _write("n3", rid="x-9"),
               {"kind": "dcgm-xid", "cluster": "soak1", "node": "n2", "xid": 79, "t": T, "ok": True},
               {"kind": "resource-health", "cluster": "soak1", "node": "n1", "scenario": "planned-maintenance",
                "t": T, "ok": True}]
    truth = row_truth(_evidence(actions=actions, turned_true=[{"cluster": "soak1", "node": "n3", "t": T}]))
    assert truth.forged_only == {("soak1", "n1")} and set(truth.rows) == {FORGED, "x-8", "x-9"}


def test_a_node_named_only_by_forged_rows_must_not_be_touched() -> None:
    assert check_forged_row_nodes(_evidence(actions=[_write()], records={"remediation": [BLOCKED]})) == []
    oracles = {"repairs": [{"cluster": "soak1", "node": "n1", "rung": "reimage", "t": T}],
               "nodes_removed": [{"cluster": "soak1", "node": "n1", "cause": "machine_deleted", "t": T}],
               "terminations": [{"cluster": "soak1", "node": "n1", "cause": "eviction", "pod": "a", "t": T},
                                {"cluster": "soak1", "node": "n1", "cause": "delete", "pod": "b", "t": T},
                                {"cluster": "soak1", "node": "n1", "cause": "completion", "pod": "c", "t": T}]}
    nodes = {"soak1": [{"metadata": {"name": "n1", "annotations": {"gpu-fleet-steward/cordoned-for": FORGED}},
                        "spec": {}}]}
    found = check_forged_row_nodes(_evidence(actions=[_write()], oracles=oracles, nodes=nodes))
    assert {v.invariant for v in found} == {"forged-row"} and len(found) == 5, found
    assert all(f"named only by forged rows {FORGED} (repairing/reimage/start)" in v.detail for v in found)
    uncordoned = [{"cluster": "soak1", "node": "n1", "t": T}]
    assert [v.detail.rsplit(" ", 1)[-1] for v in check_forged_row_nodes(
        _evidence(actions=[_write()], uncordons=uncordoned))] == ["cordoned"]


def test_every_disrupted_node_needs_a_genuine_remediation_that_cordoned_it_and_evicted_its_pods() -> None:
    repaired = {"repairs": [{"cluster": "soak1", "node": "n2", "rung": "restart", "t": T}]}
    genuine = _rem(GENUINE, "n2", state="done")

    def found(**fields: Any) -> list[str]:
        return [v.detail for v in check_disruptions_have_a_genuine_remediation(_evidence(oracles=repaired, **fields))]

    admitted = {"remediation": [genuine], "remediation-node": [_node_row("n2", GENUINE)]}
    assert found(records=admitted, published=[_event("Cordoned", GENUINE)]) == []
    marker = {"soak1": [{"metadata": {"name": "n2", "annotations": {"gpu-fleet-steward/cordoned-for": GENUINE}}}]}
    assert found(records=admitted, nodes=marker) == []  # its marker on the node, the event lost
    [nothing] = found(records={"remediation": [genuine]}, published=[_event("Cordoned", GENUINE)])
    assert "no remediation that admission created" in nothing
    # the attempt's note lost to a crash: the Admitted event admission published before the record still shows it
    assert found(records={"remediation": [genuine]}, published=[_event("Admitted", GENUINE),
                                                                _event("Cordoned", GENUINE)]) == []
    forged_only = {"remediation": [genuine], "remediation-node": [_node_row("n2", GENUINE)]}
    [forged] = found(records=forged_only, actions=[_write("n2", rid=GENUINE)], published=[_event("Cordoned", GENUINE)])
    assert "no remediation that admission created" in forged  # a forged row is no genuine remediation
    [uncordoned] = found(records=admitted)
    assert "announced a cordon of its own" in uncordoned
    # seed 956017: the Cordoned event lost to Event Grid, the marker lifted by the repair's uncordon; the simulator
    # saw the node cordoned under this record's marker when it restarted the VM
    under = {"cluster": "soak1", "node": "n2", "rung": "restart", "t": T, "unschedulable": True,
             "annotations": {"gpu-fleet-steward/cordoned-for": GENUINE}}
    assert [v.detail for v in check_disruptions_have_a_genuine_remediation(
        _evidence(oracles={"repairs": [under]}, records=admitted))] == []
    [not_cordoned] = [v.detail for v in check_disruptions_have_a_genuine_remediation(
        _evidence(oracles={"repairs": [{**under, "unschedulable": False}]}, records=admitted))]
    assert "announced a cordon of its own" in not_cordoned
    # seed 961714: a NodeClaim deleted with its Cordoned event lost; the simulator saw the node cordoned under this
    # record's marker as it removed it
    gone = {"cluster": "soak1", "node": "n2", "pool": "gpu1", "cause": "nodeclaim_deleted", "t": T,
            "unschedulable": True, "annotations": {"gpu-fleet-steward/cordoned-for": GENUINE}}
    assert [v.detail for v in check_disruptions_have_a_genuine_remediation(
        _evidence(oracles={"nodes_removed": [gone]}, records=admitted))] == []
    [not_cordoned] = [v.detail for v in check_disruptions_have_a_genuine_remediation(
        _evidence(oracles={"nodes_removed": [{**gone, "unschedulable": False}]}, records=admitted))]
    assert "announced a cordon of its own" in not_cordoned
    killed = {**repaired, "pods_killed_without_eviction": [{"cluster": "soak1", "node": "n2", "pod": "p",
                                                             "cause": "delete"}]}
    [bare] = [v.detail for v in check_disruptions_have_a_genuine_remediation(
        _evidence(oracles=killed, records=admitted, published=[_event("Cordoned", GENUINE)]))]
    assert "not through the Eviction API" in bare
    scaled = {"nodes_removed": [{"cluster": "soak1", "node": "n5", "cause": "pool_deleted", "t": T}]}
    assert check_disruptions_have_a_genuine_remediation(_evidence(oracles=scaled)) == []  # a migration's, not a repair


@pytest.mark.parametrize(("state", "data", "events", "words"), [
    ("blocked", {"refusal": {"code": "NotAdmitted", "reason": "x"}}, [], ""),
    ("done", {}, ["Recovered"], ""),
    ("released", {"last_note": "nothing to do"}, [], ""),
    ("repairing", {}, [], "ended repairing"),
    ("gave_up", {"last_note": "every rung failed"}, [], "ended gave_up"),
    ("blocked", {}, [], "without a reason code"),
    ("done", {}, ["Cordoned", "Restarted"], "acted: Cordoned, Restarted"),
], ids=["blocked", "done-untouched", "released", "still-active", "gave-up", "blocked-without-code", "done-acting"])
def test_every_forged_row_ends_without_acting(state: str, data: dict[str, Any], events: list[str], words: str) -> None:
    evidence = _evidence(actions=[_write()], records={"remediation": [_rem(FORGED, "n1", state=state, **data)]},
                         published=[_event(e, FORGED) for e in events])
    found = [v.detail for v in check_forged_row_outcomes(evidence)]
    assert (found == []) if not words else (len(found) == 1 and words in found[0]), found


def test_a_forged_row_gone_from_the_ledger_is_reported() -> None:
    [gone] = check_forged_row_outcomes(_evidence(actions=[_write()]))
    assert gone.invariant == "forged-row-outcome" and "gone from the ledger" in gone.detail


def test_the_older_invariants_judge_only_the_apps_own_records_and_the_tally_counts_the_rows() -> None:
    stuck = _rem(FORGED, "n1", state="admitted")
    evidence = _evidence(actions=[_write()], records={"remediation": [stuck, _rem(GENUINE, "n2", state="done")]},
                         now=T + 100_000)
    assert [r.id for r in without_forged_rows(evidence).records["remediation"]] == [GENUINE]
    invariants = Counter(v.invariant for v in check_all(evidence))
    assert invariants["forged-row-outcome"] == 1 and invariants["outcome"] == 0, invariants
    injected, seen = forged_row_tally(_evidence(actions=[_write()], records={"remediation": [BLOCKED]}))
    assert injected == Counter({"forged rows: remediation repairing/reimage/start": 1})
    assert seen["forged rows: ended blocked NotOurCordon"] == 1 and seen["forged rows: nodes named only by forged rows"] == 1
    assert rows_note(_evidence(actions=[_write()])).startswith("forged rows: 1 row(s); nodes named only by them: soak1/n1")
    assert forged_row_tally(_evidence()) == (Counter(), Counter()) and rows_note(_evidence()) == ""


def test_a_forged_migration_row_names_a_managed_pool_and_a_replacement_no_soak_pool_has() -> None:
    from shared.migration.plan import migration_id
    from shared.migration.records import MigrationData

    drawn = Counter(a["state"] for s in range(200) for a in generate(s).actions if a["kind"] == FORGE_MIGRATION)
    assert set(drawn) == set(MIGRATION_STATES) and min(drawn.values()) >= 4, drawn
    pool = {"name": "gpu1", "vmSize": "Standard_NC4as_T4_v3", "count": 3, "nodes": ["n1", "n2", "n3"]}
    for state in MIGRATION_STATES:
        rec = forged_migration(state=state, cid=CLUSTER_ID, pool=pool, now=T)
        d = decode(rec.data, MigrationData)
        assert (rec.id, rec.state, d.pool, d.replacement) == (migration_id(CLUSTER_ID, "gpu1"), state, "gpu1", "gpu1fx")
        assert rec.data["body"]["tags"]["gpu-fleet-steward-migrated-from"] == "gpu1"
        assert (d.batch, d.drained) == ((["n1"] if state == "draining" else []), (["n1"] if state == "deleting" else []))


def _migration_write(state: str = "deleting") -> dict[str, Any]:
    return {"kind": FORGE_MIGRATION, "cluster": "soak1", "pool": "gpu1", "state": state, "record": "m-1",
            "replacement": "gpu1fx", "t": T, "ok": True}


def test_a_forged_migration_row_must_end_blocked_and_touch_neither_its_pool_nor_its_replacement() -> None:
    def mig(state: str) -> Record:
        return Record(kind="migration", id="m-1", state=state, created_at=T, updated_at=T,
                      data={"cluster_id": CLUSTER_ID, "pool": "gpu1", "replacement": "gpu1fx", "reason": "x"})

    kept = {"clusters": [{"name": "soak1", "id": CLUSTER_ID, "pools": [{"name": "gpu1", "nodes": []}]}]}
    fine = _evidence(actions=[_migration_write()], state=kept, records={"migration": [mig("blocked")]})
    assert check_forged_migration_rows(fine) == []
    assert without_forged_rows(fine).records["migration"] == []
    gone = {"clusters": [{"name": "soak1", "id": CLUSTER_ID, "pools": []}]}
    cordoned = {"soak1": [{"metadata": {"name": "n1", "annotations": {"gpu-fleet-steward/migration": "m-1"}}}]}
    found = check_forged_migration_rows(_evidence(actions=[_migration_write()], state=gone, nodes=cordoned,
                                                  node_pools={("soak1", "x9"): "gpu1fx"},
                                                  records={"migration": [mig("deleting")]}))
    assert sorted(v.invariant for v in found) == ["forged-pool-row"] * 3 + ["forged-row-outcome"], found
    assert {v.detail.rsplit(": ", 1)[-1] for v in found} >= {"soak1/gpu1 was deleted", "n1 was cordoned for it",
                                                            "its replacement soak1/gpu1fx was created"}
    injected, seen = forged_row_tally(fine)
    assert injected["forged rows: migration deleting"] == 1 and seen["forged rows: migration ended blocked"] == 1


# --------------------------------------------------------------------------- execution


def test_the_driver_writes_forged_rows_with_the_nodes_real_identity_and_avoids_struck_nodes() -> None:
    from sim.testing import start_sim
    from soak.actions import ActionRunner
    from soak.audit import kube_nodes
    from soak.control import SimClient
    from tests.fakes.ledger import InMemoryLedger

    managed = {"gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}}
    clusters = [{"name": "soak1", "resource_group": "rg-soak1", "pools": [
        {"name": "system", "mode": "System", "count": 1},
        {"name": "gpu1", "vmSize": "Standard_NC4as_T4_v3", "count": 3, **managed}]}]
    scenario = {"clock": {"manual": True, "start": CLOCK_START}, "timings": {"pod_start_s": 1},
                "subscriptions": [{"id": SUBSCRIPTION, "clusters": clusters}]}
    actions = [{"at": 5, "kind": "dcgm-xid", "cluster": "soak1", "pool": "gpu1", "node_index": 0, "xid": 79},
               {"at": 10, "kind": FORGE_ROWS, "cluster": "soak1", "pool": "gpu1", "node_index": 0,
                "rows": ["repairing/replace/delete", "verifying"], "attempt": 4, "tag": 9}]
    with start_sim(scenario=scenario, seed=1) as sim:
        client = SimClient(sim.endpoints)
        try:
            start = float(client.control("GET", "/clock")["now"])
            runner = ActionRunner(actions, sim=client, start=start)
            runner.ledger = InMemoryLedger()
            for t in (5, 10):
                client.control("POST", "/advance", {"seconds": start + t - float(client.control("GET", "/clock")["now"])})
                runner.run_due(start + t)
            xid, write = runner.log
            assert write["ok"] and write["node"] != xid["node"], runner.log  # the struck node is not named
            [node] = [n for n in kube_nodes(client, client.endpoints["clusters"][0])
                      if n["metadata"]["name"] == write["node"]]
            rows = {r.id: r for r in runner.ledger.list(KIND)}
            assert sorted(rows) == sorted(write["records"]) and len(rows) == 2
            assert {rows[rid].state for rid in rows} == {"repairing", "verifying"}
            for rec in rows.values():
                d = decode(rec.data, RemediationData)
                assert (d.node, d.node_uid, d.provider_id) == (node["metadata"]["name"], node["metadata"]["uid"],
                                                               node["spec"]["providerID"])
                assert d.arm_vm_id == node["spec"]["providerID"].removeprefix("azure://")
                assert d.cluster == client.state()["clusters"][0]["id"] and rec.next_at == start + 10
        finally:
            client.close()


def test_a_run_on_the_azurite_ledger_refuses_every_forged_row_and_touches_no_node_they_name(azurite: Any) -> None:
    from soak.report import failure_text
    from soak.runner import run_scenario

    scenario = generate(4, short=True)  # five rows in four writes; one node named only by them
    assert sum(len(a["rows"]) for a in scenario.actions if a["kind"] == FORGE_ROWS) == 7
    result = run_scenario(scenario, azurite=azurite, use_table=True, wall_budget_s=150.0)
    assert result.mode == "in-process+table"
    assert not result.failed, failure_text(result)
    written = sum(n for k, n in result.faults.items() if k.startswith("forged rows: remediation "))
    blocked = sum(n for k, n in result.outcomes.items() if k.startswith("forged rows: ended blocked "))
    assert written >= 4 and blocked >= written - 1, (result.faults, result.outcomes)
    assert result.outcomes["forged rows: nodes named only by forged rows"] >= 1, result.outcomes

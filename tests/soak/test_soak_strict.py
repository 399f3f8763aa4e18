"""Issue 10's stricter faults in the soak: drawn without disturbing any earlier draw, loadable by the
simulator, performed by the driver at their sim second, and every new invariant catches what it is
there to catch (fed fabricated evidence: a check that cannot fail proves nothing).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

from shared.kernel.ports import Record
from soak.generate import CLOCK_START, generate
from soak.invariants import Evidence
from soak.strict import FINALIZER, NAP_CLUSTER, NAP_POOL
from soak.strict_invariants import (
    check_drain_refusals,
    check_forbidden_handled,
    check_locked_node_rg,
    check_namespace_deletion,
    check_nap_repairs,
    check_uncordons,
)

CLUSTER_ID = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/soak1"
NAP_ID = f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/{NAP_CLUSTER}"


def _evidence(seed: int = 3, **fields: Any) -> Evidence:
    base: dict[str, Any] = {"scenario": generate(seed, short=True), "oracles": {}, "state": {"clusters": []},
                            "nodes": {}, "records": {}, "max_unavailable": {}, "start": CLOCK_START, "now": CLOCK_START + 900}
    base.update(fields)
    return Evidence(**base)


def _rem(rid: str, state: str, *, cluster: str = CLUSTER_ID, node: str = "n1", created: float = CLOCK_START + 50,
         **data: Any) -> Record:
    return Record(kind="remediation", id=rid, state=state, created_at=created, updated_at=created + 100,
                  data={"cluster": cluster, "node": node, "pool": "gpu1", "ladder": ["restart", "reimage", "replace"],
                        "rung_index": 0, **data})


# --------------------------------------------------------------------------- generation


def _without_strict_workloads(sim: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(sim)
    for sub in out["subscriptions"]:
        sub["clusters"] = [c for c in sub["clusters"] if c["name"] != NAP_CLUSTER]
        for c in sub["clusters"]:
            c.pop("node_resource_group_lockdown", None)
            c["workloads"] = [w for w in c["workloads"] if "manifest" not in w
                              and w.get("namespace") not in ("batch", "hold", "serve")]
    out["timings"].pop("nap_provision_s", None)
    return out


@pytest.mark.parametrize("seed", [0, 7, 21, 1040, 3024], ids=lambda s: f"seed-{s}")
def test_the_strict_layer_only_adds_to_what_a_seed_drew_before(seed: int) -> None:
    before, after = generate(seed, strict=False), generate(seed)
    assert _without_strict_workloads(after.sim) == before.sim
    assert (after.flips, after.flapping, after.faults, after.crashes, after.hosts, after.pools) == \
        (before.flips, before.flapping, before.faults, before.crashes, before.hosts, before.pools)
    assert all(after.profile[k] == v for k, v in before.profile.items() if k != "REMEDIATION_EMPTY_DIR")
    assert not before.actions and not before.strict_faults


def test_every_strict_fault_kind_appears_many_times_in_200_seeds() -> None:
    kinds: Counter[str] = Counter()
    for seed in range(200):
        scenario = generate(seed)
        kinds.update(k.split(" (")[0] for k in scenario.strict_faults)
        kinds.update(f"action {a['kind']}" for a in scenario.actions)
        kinds.update(f"policy {p['pdb'].get('unhealthyPodEvictionPolicy', 'default')}"
                     for c in scenario.sim["subscriptions"][0]["clusters"] for p in c["workloads"]
                     if p.get("namespace") == "serve")
        kinds.update("finalizers never removed" for k in scenario.strict_faults if "removed: never" in k)
    for kind in ("namespace deleted", "pods with finalizers", "unready pods under a PDB", "node resource group locked",
                 "NAP cluster", "a pod under two PDBs", "action delete-namespace", "action remove-finalizers",
                 "action lock-node-rg", "action nap-flip", "policy IfHealthyBudget", "policy AlwaysAllow",
                 "finalizers never removed"):
        assert kinds[kind] >= 10, (kind, kinds)


def test_every_kind_of_strict_scenario_is_accepted_by_the_simulator() -> None:
    from sim.scenario import build_fleet

    seen: set[str] = set()
    for seed in range(40):
        scenario = generate(seed, short=True)
        new = {k.split(" (")[0] for k in scenario.strict_faults} - seen
        if not new:
            continue
        fleet = build_fleet(scenario.sim, seed=seed)  # raises ScenarioError on a field it does not know
        assert fleet.cluster_by_name("soak1") is not None
        if NAP_CLUSTER in {c["name"] for c in scenario.sim["subscriptions"][0]["clusters"]}:
            assert fleet.cluster_by_name(NAP_CLUSTER).nap
        seen |= new
    assert len(seen) >= 6, seen


# --------------------------------------------------------------------------- execution


def test_the_driver_performs_each_timed_action_through_the_real_apis() -> None:
    from sim.testing import start_sim
    from soak.actions import ActionRunner
    from soak.control import SimClient

    gpu = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    scenario = {"clock": {"manual": True, "start": CLOCK_START}, "timings": {"nap_provision_s": 2, "pod_start_s": 1},
                "subscriptions": [{"id": "5eed0000-0000-0000-0000-000000000001", "clusters": [
                    {"name": "soak1", "resource_group": "rg-soak1", "pools": [
                        {"name": "system", "mode": "System", "count": 1}],
                     "workloads": [{"kind": "Deployment", "name": "etl", "namespace": "batch", "replicas": 1,
                                    "resources": {"cpu": "100m"}},
                                   {"kind": "Deployment", "name": "cache", "namespace": "hold", "replicas": 1,
                                    "resources": {"cpu": "100m"}, "pod_finalizers": [FINALIZER],
                                    "terminationGracePeriodSeconds": 2}]},
                    {"name": NAP_CLUSTER, "resource_group": "rg-nap1", "node_provisioning_mode": "Auto",
                     "pools": [{"name": "system", "mode": "System", "count": 1}],
                     "karpenter": {"nodeclasses": [{"name": "managed", "tags": {"EnableManagedGPUExperience": "true"}}],
                                   "nodepools": [{"name": NAP_POOL, "node_class": "managed", "requirements": [
                                       {"key": "node.kubernetes.io/instance-type", "operator": "In",
                                        "values": ["Standard_NC4as_T4_v3"]}],
                                       "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]}]},
                     "workloads": [{"kind": "Deployment", "name": "infer", "namespace": "ml", "replicas": 1,
                                    "resources": {"cpu": "500m", "nvidia.com/gpu": "1"}, "tolerations": [gpu]}]}]}]}
    actions = [{"at": 5, "kind": "delete-namespace", "cluster": "soak1", "namespace": "batch"},
               {"at": 5, "kind": "lock-node-rg", "cluster": "soak1", "locked": True},
               {"at": 10, "kind": "nap-flip", "cluster": NAP_CLUSTER, "nodepool": NAP_POOL, "node_index": 0,
                "type": "UnhealthyNvidiaDevicePlugin"},
               {"at": 20, "kind": "remove-finalizers", "cluster": "soak1", "namespace": "hold"}]
    with start_sim(scenario=scenario, seed=1) as sim:
        client = SimClient(sim.endpoints)
        try:
            start = float(client.control("GET", "/clock")["now"])
            runner = ActionRunner(actions, sim=client, start=start)
            api = sim.kube_client("soak1")
            from kubernetes import client as k8s

            core = k8s.CoreV1Api(api)
            held = core.list_namespaced_pod("hold").items[0].metadata.name
            core.delete_namespaced_pod(held, "hold")  # evicted or deleted: the finalizer keeps it Terminating
            runner.run_due(start + 1)
            assert runner.log == [] and runner.next_due() == start + 5
            for t in (5, 10, 20):
                client.control("POST", "/advance", {"seconds": start + t - float(client.control("GET", "/clock")["now"])})
                runner.run_due(start + t)
            assert [a["kind"] for a in runner.log] == ["delete-namespace", "lock-node-rg", "nap-flip",
                                                       "remove-finalizers"], runner.log
            assert all(a["ok"] for a in runner.log), runner.log
            assert core.read_namespace("batch").status.phase == "Terminating"
            assert runner.log[3]["result"] == "finalizers removed from 1 terminating pod(s)"
            assert held not in {p.metadata.name for p in core.list_namespaced_pod("hold").items}
            flipped = runner.log[2]["node"]
            nap_core = k8s.CoreV1Api(sim.kube_client(NAP_CLUSTER))
            conditions = {c.type: c.status for c in nap_core.read_node(flipped).status.conditions}
            assert conditions["UnhealthyNvidiaDevicePlugin"] == "True"
            assert runner.pending == []
        finally:
            client.close()


def test_a_short_soak_run_executes_its_strict_actions_and_keeps_every_invariant() -> None:
    from soak.report import failure_text
    from soak.runner import run_scenario

    # a namespace deleted, finalizers removed by a patch, a locked node RG (and no signals: soak/signals.py, nor
    # issue 19's forged rows: soak/forged_rows.py)
    scenario = generate(21, short=True, signals=False, forged_rows=False)
    assert {a["kind"] for a in scenario.actions} == {"delete-namespace", "remove-finalizers", "lock-node-rg"}
    result = run_scenario(scenario, wall_budget_s=150.0)
    assert not result.failed, failure_text(result)
    assert result.faults["  action delete-namespace"] == 1
    assert result.faults["  action lock-node-rg"] == 1
    assert result.faults["  action remove-finalizers"] == 2


# --------------------------------------------------------------------------- the new invariants


def test_a_remediation_that_fails_blaming_permissions_is_a_violation() -> None:
    rbac = _rem("r-1", "failed", last_note="not allowed: evictions is forbidden (check the app's Azure role and "
                                           "Kubernetes RBAC); node left as is")
    other = _rem("r-2", "gave_up", last_note="drain stalled")
    assert [v.invariant for v in check_forbidden_handled(_evidence(records={"remediation": [rbac, other]}))] == \
        ["no-rbac-failure"]
    assert check_forbidden_handled(_evidence(records={"remediation": [other]})) == []


def test_namespace_deletions_are_only_ours_and_nothing_is_evicted_from_a_terminating_namespace() -> None:
    deleted = [{"kind": "delete-namespace", "cluster": "soak1", "namespace": "batch", "t": 1000.0, "ok": True}]
    fine = {"terminations": [{"t": 1000.0, "cluster": "soak1", "namespace": "batch", "pod": "a", "node": "n1",
                              "cause": "namespace_deleted"},
                             {"t": 990.0, "cluster": "soak1", "namespace": "batch", "pod": "b", "node": "n1",
                              "cause": "eviction"}]}
    assert check_namespace_deletion(_evidence(oracles=fine, actions=deleted)) == []
    late_eviction = {"terminations": [{"t": 1010.0, "cluster": "soak1", "namespace": "batch", "pod": "c", "node": "n1",
                                       "cause": "eviction"}]}
    assert [v.invariant for v in check_namespace_deletion(_evidence(oracles=late_eviction, actions=deleted))] == \
        ["namespace-deletion"]
    nobody = {"terminations": [{"t": 1000.0, "cluster": "soak1", "namespace": "web", "pod": "d", "node": "n1",
                                "cause": "namespace_deleted"}]}
    assert [v.invariant for v in check_namespace_deletion(_evidence(oracles=nobody, actions=deleted))] == \
        ["namespace-deletion"]


def test_a_drain_refused_up_front_must_not_have_evicted_anything() -> None:
    refused = _rem("r-1", "gave_up", drain={"outcome": "refused", "started_at": 1000.0,
                                            "reason": "drain refused before evicting anything: lab/nb: no controller"},
                   finished_at=1010.0)
    before = {"terminations": [{"t": 990.0, "cluster": "soak1", "node": "n1", "pod": "x", "cause": "eviction"}]}
    during = {"terminations": [{"t": 1005.0, "cluster": "soak1", "node": "n1", "pod": "y", "cause": "eviction"}]}
    assert check_drain_refusals(_evidence(records={"remediation": [refused]}, oracles=before)) == []
    found = check_drain_refusals(_evidence(records={"remediation": [refused]}, oracles=during))
    assert [v.invariant for v in found] == ["drain-refused-up-front"] and "y" in found[0].detail
    on_answer = _rem("r-2", "gave_up", drain={"outcome": "refused", "started_at": 1000.0,
                                              "reason": "drain refused before evicting anything: web/a: the Eviction "
                                                        "API answered 500 (...)"}, finished_at=1010.0)
    assert check_drain_refusals(_evidence(records={"remediation": [on_answer]}, oracles=during)) == []


def _locked_seed() -> int:
    return next(s for s in range(200) if any("from the start" in k for k in generate(s, short=True).strict_faults))


def test_a_locked_node_rg_remediation_is_never_done_by_a_denied_rung_nor_re_issued() -> None:
    seed = _locked_seed()
    scenario = generate(seed, short=True)
    locked = next(c["name"] for c in scenario.sim["subscriptions"][0]["clusters"]
                  if c.get("node_resource_group_lockdown") == "ReadOnly")
    cid = CLUSTER_ID.rsplit("/", 1)[0] + f"/{locked}"
    escalated = _rem("r-1", "done", cluster=cid, rung_index=2, escalation={"from": "restart", "code": "Deny"})
    by_restart = _rem("r-2", "done", cluster=cid, rung_index=0)
    failed = _rem("r-3", "failed", cluster=cid, last_note="not allowed")
    arm = {"requests_by_service": {"arm": {"status_403": 2}}}
    assert check_locked_node_rg(_evidence(seed, records={"remediation": [escalated]}, oracles=arm)) == []
    found = check_locked_node_rg(_evidence(seed, records={"remediation": [escalated, by_restart, failed]}, oracles=arm))
    assert sorted(v.detail.split(" ")[1] for v in found) == ["r-2", "r-3"]
    storm = {"requests_by_service": {"arm": {"status_403": 7}}}
    found = check_locked_node_rg(_evidence(seed, records={"remediation": [escalated]}, oracles=storm))
    assert [v.invariant for v in found] == ["locked-rg"] and "re-issued" in found[0].detail


def test_a_lock_taken_mid_run_counts_from_when_it_was_performed() -> None:
    cid = CLUSTER_ID
    scenario = generate(0, short=True, strict=False)
    by_restart = _rem("r-2", "done", cluster=cid, rung_index=0, created=CLOCK_START + 50)
    lock = [{"kind": "lock-node-rg", "cluster": "soak1", "locked": True, "t": CLOCK_START + 10, "ok": True}]
    assert check_locked_node_rg(_evidence(scenario=scenario, records={"remediation": [by_restart]})) == []
    found = check_locked_node_rg(_evidence(scenario=scenario, records={"remediation": [by_restart]}, actions=lock))
    assert [v.invariant for v in found] == ["locked-rg"]


def _nap_seed() -> int:
    return next(s for s in range(200) if generate(s, short=True).nap_pools)


def test_a_karpenter_node_is_repaired_through_its_nodeclaim_never_as_a_vmss_instance() -> None:
    seed = _nap_seed()
    pools = {(NAP_CLUSTER, "aks-gpu-abcde"): NAP_POOL}
    done = _rem("r-1", "done", cluster=NAP_ID, node="aks-gpu-abcde", nap=True, rung_index=2)
    through_claim = {"nodes_removed": [{"cluster": NAP_CLUSTER, "node": "aks-gpu-abcde", "cause": "nodeclaim_deleted"}]}
    assert check_nap_repairs(_evidence(seed, records={"remediation": [done]}, oracles=through_claim,
                                       node_pools=pools)) == []
    vmss = {"repairs": [{"cluster": NAP_CLUSTER, "node": "aks-gpu-abcde", "rung": "restart"}],
            "nodes_removed": [{"cluster": NAP_CLUSTER, "node": "aks-gpu-abcde", "cause": "machine_deleted"}]}
    found = check_nap_repairs(_evidence(seed, records={"remediation": [done]}, oracles=vmss, node_pools=pools))
    assert [v.invariant for v in found] == ["nap-repair"] * 3


def test_a_gpu_fault_on_a_karpenter_node_that_the_app_never_reported_is_a_violation() -> None:
    seed = _nap_seed()
    flip = [{"kind": "nap-flip", "cluster": NAP_CLUSTER, "node": "aks-gpu-abcde", "t": CLOCK_START + 100, "ok": True}]
    pools = {(NAP_CLUSTER, "aks-gpu-abcde"): NAP_POOL}
    found = check_nap_repairs(_evidence(seed, actions=flip, node_pools=pools))
    assert [v.invariant for v in found] == ["nap-repair"] and "reported none" in found[0].detail
    seen = [{"type": "Steward.GpuNode.Unhealthy", "subject": f"{NAP_ID}/agentPools/gpu/nodes/aks-gpu-abcde"}]
    assert check_nap_repairs(_evidence(seed, actions=flip, node_pools=pools, published=seen)) == []


def test_a_repair_that_uncordons_on_npds_start_up_false_is_caught() -> None:
    scenario = generate(0, short=True, strict=False)
    t = CLOCK_START + 400  # well away from the scenario's own flips
    done = _rem("r-1", "done", finished_at=t - 2)
    uncordon = [{"t": t, "prev_t": t - 4, "cluster": "soak1", "node": "n1", "unhealthy": []}]
    back = [{"t": t + 30, "prev_t": t + 26, "cluster": "soak1", "node": "n1", "conditions": ["UnhealthyNvidiaDevicePlugin"]}]
    assert check_uncordons(_evidence(scenario=scenario, records={"remediation": [done]}, uncordons=uncordon)) == []
    found = check_uncordons(_evidence(scenario=scenario, records={"remediation": [done]}, uncordons=uncordon,
                                      turned_true=back))
    assert [v.invariant for v in found] == ["uncordon-while-faulty"] and "start-up False" in found[0].detail
    while_true = [{**uncordon[0], "unhealthy": ["UnhealthyNvidiaDCGMServices"]}]
    found = check_uncordons(_evidence(scenario=scenario, records={"remediation": [done]}, uncordons=while_true))
    assert [v.invariant for v in found] == ["uncordon-while-faulty"] and "while" in found[0].detail
    much_later = [{**back[0], "t": t + 200, "prev_t": t + 196}]
    assert check_uncordons(_evidence(scenario=scenario, records={"remediation": [done]}, uncordons=uncordon,
                                     turned_true=much_later)) == []


def test_a_flip_the_simulator_fired_later_than_the_scenario_says_still_explains_the_true_after_an_uncordon() -> None:
    """Seed 961479 (process mode): the simulator loaded the scenario a scaled second after the clock's start, so
    a flip fired later than the start plus its ``at``; the condition True 16 s after a repair's uncordon was that
    flip, as the simulator's ``flips`` oracle says, not node-problem-detector's start-up False."""
    scenario = generate(0, short=True, strict=False)
    t = CLOCK_START + 400
    scenario.flips.append({"at": 415.0, "cluster": "soak1", "pool": "gpu1", "node_index": 1,
                           "type": "UnhealthyNvidiaDevicePlugin", "status": "True", "fixed_by": "restart"})
    done = _rem("r-1", "done", finished_at=t - 2)
    uncordon = [{"t": t, "prev_t": t - 4, "cluster": "soak1", "node": "n1", "unhealthy": []}]
    back = [{"t": t + 18, "prev_t": t + 16.5, "cluster": "soak1", "node": "n1", "conditions": ["UnhealthyNvidiaDevicePlugin"]}]
    guessed = check_uncordons(_evidence(scenario=scenario, records={"remediation": [done]}, uncordons=uncordon,
                                        turned_true=back))
    assert [v.invariant for v in guessed] == ["uncordon-while-faulty"]
    fired = {"flips": [{"t": t + 17.2, "cluster": "soak1", "pool": "gpu1", "node": "n1", "at": 415.0, "node_index": 1,
                        "type": "UnhealthyNvidiaDevicePlugin", "status": "True", "fixed_by": "restart"}]}
    assert check_uncordons(_evidence(scenario=scenario, records={"remediation": [done]}, uncordons=uncordon,
                                     turned_true=back, oracles=fired)) == []


def test_an_uncordon_that_no_repair_finished_is_not_judged_as_a_repair() -> None:
    scenario = generate(0, short=True, strict=False)
    t = CLOCK_START + 400
    released = _rem("r-1", "released", finished_at=t - 2)
    uncordon = [{"t": t, "prev_t": t - 4, "cluster": "soak1", "node": "n1", "unhealthy": ["UnhealthyNvidiaDevicePlugin"]}]
    assert check_uncordons(_evidence(scenario=scenario, records={"remediation": [released]}, uncordons=uncordon)) == []


def _one_fault_that_survives_a_restart() -> Any:
    """A small fleet with one GPU fault that only a reimage fixes, no injected faults, one host, no crash."""
    import dataclasses

    scenario = generate(3, short=True, strict=False)
    pool = next(p for p in scenario.pools if p.managed)
    flip = {"at": 40.0, "cluster": pool.cluster, "pool": pool.name, "node_index": 0, "type": "UnhealthyNvidiaDevicePlugin",
            "status": "True", "fixed_by": "reimage"}
    sim = copy.deepcopy(scenario.sim)
    sim.update(conditions=[flip], flapping=[], faults=[])
    profile = {**scenario.profile, "REMEDIATION_LADDER": "restart,reimage,replace", "REMEDIATION_SETTLE_S": "5",
               "MIGRATION_ENABLED": "false", "BREAKER_MIN_NODES": "5", "REMEDIATION_UNMANAGED_PODS": "evict",
               "REMEDIATION_EMPTY_DIR": "evict"}
    return dataclasses.replace(scenario, sim=sim, profile=profile, flips=[flip], flapping=[], faults=[], crashes=[],
                               hosts=1, quiet_after_s=250.0, horizon_s=900.0)


def test_the_soak_catches_an_app_that_uncordons_on_npds_start_up_false(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: with no verification window (the start-up False trusted at once), the restart's NPD
    start-up False is taken for a repair and the node uncordoned; the fault comes back at NPD's boot run
    (6 s after its start) and ``uncordon-while-faulty`` says so. With the app as it is, the same run is clean."""
    from shared.remediation import steps as remediation
    from soak.report import failure_text
    from soak.runner import run_scenario

    scenario = _one_fault_that_survives_a_restart()
    clean = run_scenario(scenario, wall_budget_s=150.0)
    assert not clean.failed, failure_text(clean)
    assert clean.outcomes["remediation done"] == 1, failure_text(clean)
    monkeypatch.setattr(remediation, "verify_window_s", lambda policy: 0.0)
    fooled = run_scenario(scenario, wall_budget_s=150.0)
    assert "uncordon-while-faulty" in {v.invariant for v in fooled.violations}, failure_text(fooled)

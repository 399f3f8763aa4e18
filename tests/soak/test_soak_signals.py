"""Issue 13's fault signals in the soak: drawn without disturbing any earlier draw, played by the driver
through the simulator's control API, and every new invariant catches what it is there to catch (fed
fabricated evidence: a check that cannot fail proves nothing).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from shared.kernel.ports import Record
from shared.kernel.timefmt import iso
from soak.generate import CLOCK_START, SUBSCRIPTION, generate
from soak.invariants import Evidence, check_all, check_false_positives
from soak.signal_invariants import (
    check_forged_events,
    check_one_remediation_per_node,
    check_prometheus_outage,
    check_signal_false_positives,
    outage_windows,
)
from soak.signals import DCGM_CONFIRM_S, FOREIGN_SUBSCRIPTION, foreign_vm, prometheus_setting

CLUSTER_ID = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-soak1/providers/Microsoft.ContainerService/managedClusters/soak1"
FORGED_VM = (f"/subscriptions/{FOREIGN_SUBSCRIPTION}/resourceGroups/MC_rg-elsewhere_aks-1_eastus/providers/"
             "Microsoft.Compute/virtualMachineScaleSets/aks-gpu-12345678-vmss/virtualMachines/3")


def _evidence(seed: int = 3, **fields: Any) -> Evidence:
    base: dict[str, Any] = {"scenario": generate(seed, short=True), "oracles": {}, "state": {"clusters": []},
                            "nodes": {}, "records": {}, "max_unavailable": {}, "start": CLOCK_START, "now": CLOCK_START + 900}
    base.update(fields)
    return Evidence(**base)


def _rem(rid: str, state: str, *, node: str = "n1", created: float = CLOCK_START + 50, **data: Any) -> Record:
    return Record(kind="remediation", id=rid, state=state, created_at=created, updated_at=created + 100,
                  data={"cluster": CLUSTER_ID, "node": node, "pool": "gpu1", "ladder": ["restart", "replace"],
                        "rung_index": 0, **data})


def _unhealthy(node: str, at: float, *, signal: str = "dcgm", condition: str = "Xid79") -> dict[str, Any]:
    data = {"cluster": CLUSTER_ID, "node": node, "condition": condition, "observed_at": iso(at)}
    if signal:
        data["signal"] = signal
    return {"type": "Steward.GpuNode.Unhealthy", "subject": f"soak1/gpu1/{node}", "data": data}


# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("seed", [0, 2, 11, 13, 1040], ids=lambda s: f"seed-{s}")
def test_the_signal_layer_only_adds_to_what_a_seed_drew_before(seed: int) -> None:
    before, after = generate(seed, signals=False), generate(seed, forgeries=False)  # forgeries: test_soak_forgeries.py
    assert after.sim == before.sim
    assert (after.flips, after.flapping, after.faults, after.crashes, after.hosts, after.pools, after.profile,
            after.strict_faults) == (before.flips, before.flapping, before.faults, before.crashes, before.hosts,
                                     before.pools, before.profile, before.strict_faults)
    signal_kinds = {"resource-health", "resource-health-forged", "dcgm-xid", "dcgm-ecc-storm", "dcgm-outage"}
    assert [a for a in after.actions if a["kind"] not in signal_kinds] == before.actions
    assert not before.signal_faults and not before.dcgm_clusters


def test_pinned_seeds_without_the_strict_layer_draw_no_signals_unless_asked() -> None:
    assert not generate(1040, strict=False).signal_faults  # the regression seeds run as they were found
    assert generate(2, strict=False, signals=True).signal_faults == generate(2).signal_faults


def test_every_signal_kind_appears_many_times_in_200_seeds() -> None:
    kinds: Counter[str] = Counter()
    for seed in range(200):
        scenario = generate(seed)
        kinds.update(k.split(" (")[0] for k in scenario.signal_faults)
        kinds.update(f"action {a['kind']}" for a in scenario.actions)
        kinds.update(f"xid {a['xid']}" for a in scenario.actions if a["kind"] == "dcgm-xid")
        if scenario.dcgm_clusters:
            kinds["dcgm configured"] += 1
            assert set(scenario.dcgm_clusters) == {p.cluster for p in scenario.pools}
        outages = [a for a in scenario.actions if a["kind"] == "dcgm-outage"]
        if outages:
            assert [a["down"] for a in outages] == [True, False] and outages[0]["at"] < outages[1]["at"]
            assert scenario.quiet_after_s > outages[1]["at"]  # the run outlasts the outage
            genuine = [a["at"] for a in scenario.actions if a["kind"] in ("dcgm-xid", "dcgm-ecc-storm")]
            if genuine and min(genuine) < outages[1]["at"]:
                # a fault drawn before the workspace came back is first seen after it (seed 952019): the run lasts
                # until it can be confirmed from then
                kinds["dcgm fault hidden by an outage"] += 1
                assert scenario.quiet_after_s >= outages[1]["at"] + DCGM_CONFIRM_S, (seed, outages, genuine)
    for kind in ("resource health degraded-host", "resource health host-failure", "resource health planned-maintenance",
                 "forged health event for a VM outside the fleet", "dcgm XID 79", "dcgm application XID",
                 "dcgm ECC storm", "prometheus outage", "action resource-health", "action resource-health-forged",
                 "action dcgm-xid", "action dcgm-ecc-storm", "action dcgm-outage", "xid 79", "dcgm configured",
                 "dcgm fault hidden by an outage"):
        assert kinds[kind] >= 10, (kind, kinds)
    assert sum(kinds[f"xid {x}"] for x in (13, 31, 43)) >= 10, kinds


def test_a_forged_vm_is_never_one_of_the_fleet() -> None:
    import random

    rng = random.Random(5)
    for _ in range(50):
        vm = foreign_vm(rng, SUBSCRIPTION)
        sub, group = vm.split("/")[2], vm.split("/")[4]
        assert sub == FOREIGN_SUBSCRIPTION or not group.lower().startswith("mc_"), vm  # no node resource group


def test_the_dcgm_setting_points_every_drawn_cluster_at_the_simulators_workspace() -> None:
    from shared.remediation.dcgm_config import parse_targets

    endpoints = {"arm_endpoint": "https://127.0.0.1:4443/",
                 "clusters": [{"name": "soak1", "id": CLUSTER_ID}, {"name": "soak2", "id": CLUSTER_ID[:-1] + "2"}]}
    setting = prometheus_setting(endpoints, ["soak1"])
    targets = parse_targets(setting["SIGNALS_PROMETHEUS"], subscriptions=(SUBSCRIPTION,))
    assert [t.endpoint for t in targets.values()] == ["https://127.0.0.1:4443/prometheus/soak-workspace"]
    assert list(json.loads(setting["SIGNALS_PROMETHEUS"])) == [CLUSTER_ID]
    assert prometheus_setting(endpoints, []) == {}


# --------------------------------------------------------------------------- execution


def test_the_driver_plays_each_signal_through_the_simulators_control_api() -> None:
    from sim.testing import start_sim
    from soak.actions import ActionRunner
    from soak.control import SimClient

    scenario = {"clock": {"manual": True, "start": CLOCK_START}, "timings": {"pod_start_s": 1},
                "subscriptions": [{"id": SUBSCRIPTION, "clusters": [
                    {"name": "soak1", "resource_group": "rg-soak1", "pools": [
                        {"name": "system", "mode": "System", "count": 1},
                        {"name": "gpu1", "vmSize": "Standard_NC4as_T4_v3", "count": 2,
                         "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}}]}]}]}
    target = {"cluster": "soak1", "pool": "gpu1", "gpu": 0}
    actions = [{"at": 5, "kind": "resource-health", **target, "node_index": 1, "scenario": "degraded-host"},
               {"at": 5, "kind": "resource-health-forged", "vm": FORGED_VM, "scenario": "host-failure"},
               {"at": 10, "kind": "dcgm-xid", **target, "node_index": 0, "xid": 79},
               {"at": 10, "kind": "dcgm-ecc-storm", **target, "node_index": 1, "persist": True},
               {"at": 20, "kind": "dcgm-outage", "down": True}]
    with start_sim(scenario=scenario, seed=1) as sim:
        client = SimClient(sim.endpoints)
        try:
            start = float(client.control("GET", "/clock")["now"])
            runner = ActionRunner(actions, sim=client, start=start)
            for t in (5, 10, 20):
                client.control("POST", "/advance", {"seconds": start + t - float(client.control("GET", "/clock")["now"])})
                runner.run_due(start + t)
            assert all(a["ok"] for a in runner.log), runner.log
            health, forged, xid, storm, outage = runner.log
            nodes = next(p["nodes"] for c in client.state()["clusters"] for p in c["pools"] if p["name"] == "gpu1")
            assert (health["node"], xid["node"], storm["node"]) == (nodes[1], nodes[0], nodes[1])
            assert len(health["events"]) == 2 and len(forged["events"]) == 2
            current = client.control("POST", "/resource-health", {"cluster": "soak1", "node": nodes[1]})
            assert current["state"] == "Degraded"
            client.control("POST", "/advance", {"seconds": 30})  # the exporters' next scrape (every 30 s)
            dcgm = client.control("GET", "/dcgm")
            faulty = {(f["node"], f["metric"], f["value"]) for f in dcgm["faulty"]}
            assert (nodes[0], "DCGM_FI_DEV_XID_ERRORS", 79) in faulty
            # AKS's managed exporter exports no ECC counter (default-counters.csv): a storm shows as its XID 48
            assert (nodes[1], "DCGM_FI_DEV_XID_ERRORS", 48) in faulty, faulty
            assert not [f for f in faulty if "ECC" in f[1]], faulty
            assert dcgm["outage"] is True and outage["result"] == "workspace down"
            assert runner.pending == []
        finally:
            client.close()


def test_a_short_soak_run_plays_its_signals_and_keeps_every_invariant() -> None:
    from soak.report import failure_text
    from soak.runner import run_scenario

    # a degraded host, a reboot for repair, XIDs 48 and 13, an outage (without issue 19's forged rows, which short
    # seed 13 also draws: tests/soak/test_soak_regressions.py pins what they found there)
    scenario = generate(13, short=True, forgeries=False, forged_rows=False)
    kinds = Counter(a["kind"] for a in scenario.actions)
    assert kinds["resource-health"] == 2 and kinds["dcgm-xid"] == 2 and kinds["dcgm-outage"] == 2, kinds
    result = run_scenario(scenario, wall_budget_s=150.0)
    assert not result.failed, failure_text(result)
    assert result.faults["  action resource-health"] == 2 and result.faults["  action dcgm-outage"] == 2, result.faults
    # the genuine XID 48 waits for the budget (the pool's other fault comes first), then is repaired: the run
    # lasts until a late DCGM fault can be confirmed (soak.signals.DCGM_CONFIRM_S)
    assert any("[dcgm xid:48]" in note and " done " in note for note in result.notes), result.notes


# --------------------------------------------------------------------------- the new invariants


def test_a_forged_event_must_touch_nothing() -> None:
    forged = [{"kind": "resource-health-forged", "vm": FORGED_VM, "scenario": "host-failure", "events": ["ev-1"],
               "t": CLOCK_START + 100, "ok": True}]
    clean = _rem("r-1", "done", event_id="ev-0")
    assert check_forged_events(_evidence(actions=forged, records={"remediation": [clean]})) == []
    by_event = _rem("r-2", "done", event_id="ev-1")
    about = Record(kind="remediation-node", id="x", state="seen", created_at=0, updated_at=0,
                   data={"vm": FORGED_VM.upper()})
    published = [{"type": "Steward.Remediation.Refused", "data": {"note": f"VM {FORGED_VM.lower()}"}}]
    found = check_forged_events(_evidence(actions=forged, records={"remediation": [by_event], "remediation-node": [about]},
                                          published=published))
    assert sorted(v.invariant for v in found) == ["forged-event"] * 3


def test_a_prometheus_outage_must_publish_no_dcgm_fault() -> None:
    down, up = CLOCK_START + 100, CLOCK_START + 200.5
    outage = [{"kind": "dcgm-outage", "down": True, "t": down, "ok": True},
              {"kind": "dcgm-outage", "down": False, "t": up, "ok": True}]
    assert outage_windows(_evidence(actions=outage)) == [(down, up)]
    fine = [_unhealthy("n1", down - 1), _unhealthy("n1", up), _unhealthy("n2", down + 50, signal="",
                                                                         condition="UnhealthyNvidiaDevicePlugin"),
            _unhealthy("n4", up + 0.2)]  # observed_at says 200 s (whole seconds): this sweep ran after the outage
    assert check_prometheus_outage(_evidence(actions=outage, published=fine)) == []
    during = check_prometheus_outage(_evidence(actions=outage, published=[_unhealthy("n3", down + 10),
                                                                          _unhealthy("n3", up - 1.5)]))
    assert [v.invariant for v in during] == ["prometheus-outage"] * 2 and "n3" in during[0].detail
    never_back = outage[:1]
    assert [v.invariant for v in check_prometheus_outage(_evidence(actions=never_back,
                                                                   published=[_unhealthy("n3", up + 500)]))] == \
        ["prometheus-outage"]


def test_a_node_has_one_remediation_at_a_time_whatever_the_signal() -> None:
    npd = _rem("r-1", "done", finished_at=CLOCK_START + 140)
    after = _rem("r-2", "done", created=CLOCK_START + 140, signal="resource-health")
    elsewhere = _rem("r-3", "done", node="n2", created=CLOCK_START + 60, signal="dcgm")
    assert check_one_remediation_per_node(_evidence(records={"remediation": [npd, after, elsewhere]})) == []
    overlapping = _rem("r-4", "done", created=CLOCK_START + 120, signal="dcgm", finished_at=CLOCK_START + 130)
    found = check_one_remediation_per_node(_evidence(records={"remediation": [npd, overlapping]}))
    assert [v.invariant for v in found] == ["one-remediation-per-node"] and "r-4" in found[0].detail
    still_active = _rem("r-5", "draining", created=CLOCK_START + 10)
    late = _rem("r-6", "done", created=CLOCK_START + 800, signal="resource-health")
    assert len(check_one_remediation_per_node(_evidence(records={"remediation": [still_active, late]}))) == 1


def test_application_xids_and_record_only_health_events_start_no_remediation() -> None:
    planned = [{"kind": "resource-health", "cluster": "soak1", "pool": "gpu1", "node": "n1",
                "scenario": "planned-maintenance", "t": CLOCK_START + 10, "ok": True}]
    app_xid = _rem("r-1", "done", node="n2", signal="dcgm", condition="Xid13", policy_row="xid:13")
    xid79 = _rem("r-2", "done", node="n2", signal="dcgm", condition="Xid79", policy_row="xid:79")
    from_planned = _rem("r-3", "done", signal="resource-health", condition="ResourceHealth/Unavailable",
                        policy_row="health:availability:Unavailable")
    npd_on_planned = _rem("r-4", "done", signal="npd", condition="UnhealthyNvidiaDevicePlugin")
    found = check_signal_false_positives(_evidence(actions=planned,
                                                   records={"remediation": [app_xid, xid79, from_planned, npd_on_planned]}))
    assert sorted(v.detail.split(" ")[1] for v in found) == ["r-1", "r-3"]
    degraded_too = [*planned, {**planned[0], "scenario": "degraded-host"}]
    assert check_signal_false_positives(_evidence(actions=degraded_too, records={"remediation": [from_planned]})) == []


def test_a_signal_remediation_is_not_an_unconfigured_condition() -> None:
    xid79 = _rem("r-1", "done", signal="dcgm", condition="Xid79")
    degraded = _rem("r-2", "done", node="n2", signal="resource-health", condition="ResourceHealth/Degraded")
    assert check_false_positives(_evidence(records={"remediation": [xid79, degraded]})) == []
    npd = _rem("r-3", "done", node="n3", condition="XIDErrors")
    assert [v.invariant for v in check_false_positives(_evidence(records={"remediation": [npd]}))] == ["no-false-positive"]


def test_check_all_runs_the_signal_invariants() -> None:
    outage = [{"kind": "dcgm-outage", "down": True, "t": CLOCK_START + 100, "ok": True}]
    found = check_all(_evidence(actions=outage, published=[_unhealthy("n1", CLOCK_START + 150)]))
    assert "prometheus-outage" in {v.invariant for v in found}


def test_a_remediation_on_a_node_that_flapped_is_false_only_for_the_flapping_episode() -> None:
    """Seed 954044: a condition flapped on a node (never a fault); three minutes later a genuine flip, its
    node_index resolved after two replacements, struck that same node and was repaired. That repair is no
    false positive; one whose condition turned True while the node flapped is."""
    import dataclasses

    scenario = generate(3, short=True)
    flap = {"start": 100.0, "cluster": "soak1", "pool": "gpu1", "node_index": 1, "type": "UnhealthyNvidiaDevicePlugin",
            "period_s": 8.0, "flips": 8}
    scenario = dataclasses.replace(scenario, flapping=[flap])
    nodes = {"soak1/gpu1": ["n0", "n1", "n2"]}
    during = _rem("r-1", "done", condition="UnhealthyNvidiaDevicePlugin", since=iso(CLOCK_START + 148))
    after = _rem("r-2", "done", condition="UnhealthyNvidiaDevicePlugin", since=iso(CLOCK_START + 367))
    found = check_false_positives(_evidence(scenario=scenario, initial_nodes=nodes, records={"remediation": [during, after]}))
    assert [v.detail.split(" ")[1] for v in found] == ["r-1"]

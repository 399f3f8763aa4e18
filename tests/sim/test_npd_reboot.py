"""Node Problem Detector after a reboot, as the simulator models it.

kubernetes/node-problem-detector pkg/custompluginmonitor/custom_plugin_monitor.go: on start the custom
plugin monitor publishes every condition of its config ``False`` with a fresh transition time
(``initialConditions``) before any check has run; a fault that survived the reboot turns ``True`` again
at the first check, which is the run of every rule NPD makes on boot (pkg/custompluginmonitor/plugin/plugin.go
``Run``), not one ``invoke_interval`` later: the rule's run (``timeout``, 5 s by default) and the condition
manager's sync (1 s), ``npd_first_check_s`` = 6 s by default.
"""

from __future__ import annotations

import pytest

from sim.model import Cluster, Fleet, SimClock, parse_iso
from sim.scenario import add_pool

T4 = "Standard_NC8as_T4_v3"
COND = "UnhealthyNvidiaDevicePlugin"


def managed_node(**timings: float) -> tuple[Fleet, Cluster, str]:
    fleet = Fleet(seed=3, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 10, "restart_s": 30, "reimage_s": 60, **timings})
    cluster = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    with fleet.lock:
        pool = add_pool(cluster, {"name": "gpu", "vmSize": T4, "count": 1,
                                  "gpuProfile": {"nvidia": {"managementMode": "Managed"}}})
    fleet.advance(11)
    return fleet, cluster, cluster.pool_nodes(pool)[0].name


def test_npds_first_check_after_a_boot_is_its_boot_run_not_one_interval_later() -> None:
    fleet, _c, _name = managed_node()
    assert fleet.timings["npd_first_check_s"] == 6.0  # the rule's default timeout (5 s) + the 1 s sync


def test_a_fault_that_survives_a_restart_reads_false_with_a_fresh_transition_until_npds_first_check() -> None:
    fleet, c, name = managed_node()
    with fleet.lock:
        c.set_condition(name, COND, "True", fixed_by="reimage")
        before = parse_iso(c.nodes[name].condition(COND)["lastTransitionTime"])
        c.restart_node(name)
    fleet.advance(31)  # rebooted and Ready; NPD has started but its boot run has not reported yet
    node = c.nodes[name]
    cond = node.condition(COND)
    assert node.ready
    assert cond["status"] == "False"
    assert parse_iso(cond["lastTransitionTime"]) > before  # fresh, at NPD's start
    fleet.advance(4)
    assert node.condition(COND)["status"] == "False"
    fleet.advance(2)  # NPD's boot run reported: the fault is still there
    cond = node.condition(COND)
    assert cond["status"] == "True"
    assert cond["reason"] == "NvidiaDevicePluginUnhealthy"


def test_a_fault_the_restart_fixed_stays_false_after_npds_first_check() -> None:
    fleet, c, name = managed_node()
    with fleet.lock:
        c.set_condition(name, COND, "True", fixed_by="restart")
        c.restart_node(name)
    fleet.advance(31 + 7)
    assert c.nodes[name].ready
    assert c.nodes[name].condition(COND)["status"] == "False"


def test_a_second_reboot_before_the_first_check_restarts_npd_again() -> None:
    fleet, c, name = managed_node(npd_first_check_s=20)
    with fleet.lock:
        c.set_condition(name, COND, "True", fixed_by="never")
        c.restart_node(name)
    fleet.advance(31)
    with fleet.lock:
        c.restart_node(name)  # the first boot's NPD check must not fire on the second boot
    fleet.advance(19)  # the first boot's check would have reported by now (its NPD started 20 s ago)
    assert c.nodes[name].condition(COND)["status"] == "False"
    fleet.advance(19)  # second boot Ready 30 s after the second restart: its NPD has not reported yet
    assert c.nodes[name].condition(COND)["status"] == "False"
    fleet.advance(13)  # ... and reports 20 s after it started
    assert c.nodes[name].condition(COND)["status"] == "True"


# --------------------------------------------------------------------------- the app against it

SUB = "00000000-0000-0000-0000-0000000000b3"


def npd_scenario(first_check_s: float) -> dict[str, object]:
    return {
        "seed": 5, "clock": {"manual": True},
        "timings": {"node_ready_s": 10, "restart_s": 30, "reimage_s": 60, "npd_first_check_s": first_check_s,
                    "pool_scale_s": 20, "delete_machines_s": 20},
        "subscriptions": [{"id": SUB, "clusters": [{
            "name": "npd", "resource_group": "rg-npd", "tags": {"gpu-fleet-steward": "enabled"},
            "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                      {"name": "gpu", "vmSize": T4, "count": 3,
                       "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}]}]}],
    }


APP_SETTINGS = {"REMEDIATION_DEFAULT_THRESHOLD_S": "0", "REMEDIATION_STARTUP_GRACE_S": "0"}


@pytest.mark.parametrize(("first_check_s", "settings"), [
    (45.0, {}),
    (6.0, {"REMEDIATION_SETTLE_S": "5"}),
], ids=["long-rules-default-settle", "npd-default-boot-run-short-settle"])
def test_the_app_does_not_declare_a_fault_that_survived_the_restart_recovered(
        first_check_s: float, settings: dict[str, str]) -> None:
    """NPD's run on boot reports 45 s after its start (rules with a long timeout: AKS does not document its
    GPU plugins') under the default REMEDIATION_SETTLE_S, or 6 s after it (NPD's default timeout) under a
    settle window shorter than that: the app must not uncordon the node on the start-up False, and must go
    on to the reimage that really fixes it."""
    from tests.sim.steward_on_sim import run_remediations, steward_on, sweep_and_admit

    with steward_on(npd_scenario(first_check_s), **APP_SETTINGS, **settings) as (sim, ctx):
        sim.control("POST", "/advance", {"seconds": 15})
        kube = ctx.access.kube(sim.cluster("npd")["id"])
        name = sorted(n.name for n in kube.list_nodes(label_selector="kubernetes.azure.com/agentpool=gpu"))[0]
        sim.control("POST", "/conditions", {"cluster": "npd", "node": name, "type": COND, "status": "True",
                                            "fixed_by": "reimage"})
        sim.control("POST", "/advance", {"seconds": 1})
        assert any(r.startswith("admitted") for r in sweep_and_admit(ctx))
        uncordoned_while_faulty: list[str] = []

        def watch(c: object) -> None:
            node = kube.get_node(name)
            cond = node.condition(COND) if node is not None else None
            if node is not None and not node.unschedulable and not sim_repaired_by_reimage(sim):
                uncordoned_while_faulty.append(f"{cond.status if cond else None}")

        (record,) = run_remediations(ctx, watch=watch)
        assert record.state == "done", record.data.get("last_note")
        rungs = [r["rung"] for r in sim.oracles()["repairs"] if r["node"] == name]
        assert rungs == ["restart", "reimage"], "the restart was taken as the cure"
        assert uncordoned_while_faulty == []
        assert kube.get_node(name).condition(COND).status == "False"


def sim_repaired_by_reimage(sim: object) -> bool:
    return any(r["rung"] == "reimage" for r in sim.oracles()["repairs"])  # type: ignore[attr-defined]


def test_the_repair_oracle_keeps_what_the_node_showed_when_its_vm_went_down() -> None:
    """Soak seed 956017: whose cordon a restarted node was under is a fact of the moment the VM went down; the
    published events can lose it (Event Grid 503s) and the repair's uncordon lifts the marker afterwards."""
    fleet, c, name = managed_node()
    with fleet.lock:
        node = c.nodes[name]
        node.obj["spec"]["unschedulable"] = True
        node.meta.setdefault("annotations", {})["example.com/cordoned-for"] = "r-1"
        c.restart_node(name)
        node.obj["spec"]["unschedulable"] = False
        node.meta["annotations"].pop("example.com/cordoned-for")
    [repair] = [r for r in fleet.oracles.report()["repairs"] if r["node"] == name]
    assert repair["rung"] == "restart" and repair["unschedulable"] is True
    assert repair["annotations"]["example.com/cordoned-for"] == "r-1"


def test_the_removal_oracle_keeps_what_the_node_showed_as_it_went() -> None:
    """Soak seed 961714: a NodeClaim deleted while its Cordoned event was lost; whose cordon the node was under is a
    fact of the moment it went."""
    fleet, c, name = managed_node()
    with fleet.lock:
        node = c.nodes[name]
        node.obj["spec"]["unschedulable"] = True
        node.meta.setdefault("annotations", {})["example.com/cordoned-for"] = "r-1"
        c.delete_node(name, cause="machine_deleted")
    [gone] = [r for r in fleet.oracles.report()["nodes_removed"] if r["node"] == name]
    assert gone["unschedulable"] is True and gone["annotations"]["example.com/cordoned-for"] == "r-1"
    assert gone["cause"] == "machine_deleted"


def test_the_flip_oracle_names_the_node_a_scenario_flip_struck_among_the_pools_nodes_then() -> None:
    """The liveness oracle puts each flip down to the node it struck (soak seed 959008); ``node_index`` is resolved
    among the pool's nodes when it fires."""
    from sim.scenario import _schedule_flip

    fleet, c, name = managed_node()
    flip = {"cluster": "c", "pool": "gpu", "node_index": 0, "type": COND, "status": "True", "fixed_by": "restart",
            "at": 5}
    with fleet.lock:
        _schedule_flip(fleet, flip, "flips[0]", fleet.now())
    fleet.advance(6)
    [fired] = fleet.oracles.report()["flips"]
    assert (fired["node"], fired["type"], fired["node_index"], fired["at"]) == (name, COND, 0, 5)
    assert fired["fixed_by"] == "restart"  # the cure it drew (seed 960143)
    assert c.nodes[name].condition(COND)["status"] == "True"

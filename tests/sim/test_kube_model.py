"""The live cluster in-process (manual clock): node join, scheduling rules, controllers, repairs, MIG."""

from __future__ import annotations

from typing import Any

import pytest

from sim.model import Cluster, Fleet, Pool, SimClock
from sim.scenario import add_pool, add_workload

T4 = "Standard_NC8as_T4_v3"


def new_fleet(**timings: float) -> tuple[Fleet, Cluster]:
    fleet = Fleet(seed=3, clock=SimClock(manual=True, epoch_sim=1_764_684_000.0),
                  timings={"node_ready_s": 10, "pod_start_s": 2, "restart_s": 30, "reimage_s": 60, **timings})
    cluster = fleet.add_cluster(subscription="s", resource_group="rg", name="c")
    return fleet, cluster


def pool(cluster: Cluster, name: str, **props: Any) -> Pool:
    with cluster.fleet.lock:
        p = add_pool(cluster, {"name": name, **props})
    return p


def workload(cluster: Cluster, **spec: Any) -> None:
    with cluster.fleet.lock:
        add_workload(cluster, spec)
        cluster.fleet.settle()


def running(cluster: Cluster, app: str) -> list[str]:
    return sorted(p.node_name for p in cluster.items("pods") if (p.meta.get("labels") or {}).get("app") == app
                  and p.phase == "Running" and not p.terminating)


def test_new_nodes_join_not_ready_and_turn_ready_after_node_ready_s() -> None:
    fleet, c = new_fleet()
    p = pool(c, "gpu", vmSize=T4, count=2)
    nodes = c.pool_nodes(p)
    assert [n.ready for n in nodes] == [False, False]
    assert all(any(t["key"] == "node.kubernetes.io/not-ready" for t in n.obj["spec"]["taints"]) for n in nodes)
    fleet.advance(9)
    assert not any(n.ready for n in c.pool_nodes(p))
    fleet.advance(2)
    assert all(n.ready for n in c.pool_nodes(p))
    assert all(not any(t["key"].startswith("node.kubernetes.io/") for t in n.obj["spec"]["taints"])
               for n in c.pool_nodes(p))


@pytest.mark.parametrize(("spec", "expected_pool"), [
    ({"tolerations": [{"key": "sku", "operator": "Exists"}], "resources": {"nvidia.com/gpu": "1"}}, "gpu"),
    ({"resources": {"nvidia.com/gpu": "1"}}, None),
    ({"nodeSelector": {"agentpool": "cpu"}}, "cpu"),
    ({"nodeSelector": {"agentpool": "nowhere"}}, None),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["vision"]}]}]}}},
      "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}, "gpu"),
    ({"resources": {"cpu": "64"}}, None),
    ({"resources": {"nvidia.com/mig-1g.10gb": "1"}, "tolerations": [{"operator": "Exists"}]}, None),
], ids=["tolerated-gpu", "untolerated-taint", "node-selector", "selector-matches-nothing", "required-affinity",
        "too-much-cpu", "mig-resource-absent"])
def test_the_scheduler_honours_taints_selectors_affinity_and_resources(spec: dict[str, Any],
                                                                        expected_pool: str | None) -> None:
    fleet, c = new_fleet()
    pool(c, "cpu", vmSize="Standard_D4s_v5", count=1)
    pool(c, "gpu", vmSize=T4, count=1, nodeTaints=["sku=gpu:NoSchedule"], nodeLabels={"team": "vision"},
         gpuProfile={"nvidia": {"managementMode": "Managed"}})
    fleet.advance(11)
    workload(c, kind="Pod", name="p", **spec)
    fleet.advance(3)
    pod = c.pods[("default", "p")]
    if expected_pool is None:
        assert pod.node_name == "" and pod.phase == "Pending"
    else:
        assert c.nodes[pod.node_name].pool == expected_pool and pod.phase == "Running"


def test_gpu_requests_never_overcommit_a_node() -> None:
    fleet, c = new_fleet()
    pool(c, "gpu", vmSize=T4, count=2, gpuProfile={"nvidia": {"managementMode": "Managed"}})
    fleet.advance(11)
    workload(c, kind="Deployment", name="train", replicas=3, resources={"nvidia.com/gpu": "1"})
    fleet.advance(3)
    assert len(running(c, "train")) == 2
    assert len(set(running(c, "train"))) == 2
    assert sum(1 for p in c.items("pods") if p.phase == "Pending") == 1


def test_daemonset_pods_run_on_every_matching_node_including_new_ones() -> None:
    fleet, c = new_fleet()
    p = pool(c, "gpu", vmSize=T4, count=2, nodeTaints=["sku=gpu:NoSchedule"])
    pool(c, "cpu", vmSize="Standard_D4s_v5", count=1)
    workload(c, kind="DaemonSet", name="agent", tolerations=[{"operator": "Exists"}],
             nodeSelector={"kubernetes.azure.com/accelerator": "nvidia"})
    fleet.advance(15)
    assert len(running(c, "agent")) == 2
    with fleet.lock:
        c.scale_nodes(p, 3)
    fleet.advance(15)
    assert len(running(c, "agent")) == 3


def test_a_job_completes_after_its_run_time_and_is_not_restarted() -> None:
    fleet, c = new_fleet()
    pool(c, "cpu", vmSize="Standard_D4s_v5", count=1)
    fleet.advance(11)
    workload(c, kind="Job", name="once", run_s=100)
    fleet.advance(50)
    (pod,) = [p for p in c.items("pods")]
    assert pod.phase == "Running"
    fleet.advance(60)
    assert pod.phase == "Succeeded"
    job = c.get("jobs.batch", "default", "once")
    assert job is not None and job.obj["status"]["succeeded"] == 1
    fleet.advance(60)
    assert len(c.items("pods")) == 1


def test_a_deleted_controller_pod_is_recreated_after_termination_begins() -> None:
    fleet, c = new_fleet()
    pool(c, "cpu", vmSize="Standard_D4s_v5", count=2)
    fleet.advance(11)
    workload(c, kind="Deployment", name="web", replicas=2, terminationGracePeriodSeconds=30)
    fleet.advance(3)
    victim = c.items("pods")[0]
    with fleet.lock:
        c.delete_pod(victim, cause="delete")
        fleet.settle()
    assert victim.terminating
    assert len([p for p in c.items("pods") if not p.terminating]) == 2  # replacement already created
    fleet.advance(31)
    assert ("default", victim.name) not in c.pods


def test_scaling_down_removes_cordoned_nodes_first_then_the_newest() -> None:
    fleet, c = new_fleet()
    p = pool(c, "gpu", vmSize=T4, count=4)
    fleet.advance(11)
    names = [n.name for n in c.pool_nodes(p)]
    with fleet.lock:
        c.nodes[names[1]].obj["spec"]["unschedulable"] = True
        c.sync_node(c.nodes[names[1]])
        c.scale_nodes(p, 2)
    assert [n.name for n in c.pool_nodes(p)] == [names[0], names[2]]


def test_removing_a_pool_loses_its_workload_pods_in_the_oracles() -> None:
    fleet, c = new_fleet()
    p = pool(c, "gpu", vmSize="Standard_D4s_v5", count=2)
    workload(c, kind="Deployment", name="web", replicas=2)
    workload(c, kind="DaemonSet", name="agent")
    fleet.advance(15)
    with fleet.lock:
        c.remove_pool_nodes(p)
    lost = fleet.oracles.report()["workload_pods_lost"]
    assert sorted(x["pod"].split("-")[0] for x in lost) == ["web", "web"]
    assert c.pool_nodes(p) == []


@pytest.mark.parametrize(("fixed_by", "rung", "clears"), [
    ("restart", "restart", True), ("reimage", "restart", False), ("reimage", "reimage", True),
    ("restart", "reimage", True), ("replace", "reimage", False), ("never", "reimage", False),
], ids=["restart-fixes-restart", "restart-does-not-fix-reimage", "reimage-fixes-reimage",
        "reimage-fixes-restart", "reimage-does-not-fix-replace", "nothing-fixes-never"])
def test_repairs_clear_a_condition_only_when_the_plan_says_that_rung_fixes_it(fixed_by: str, rung: str,
                                                                                clears: bool) -> None:
    fleet, c = new_fleet()
    p = pool(c, "gpu", vmSize=T4, count=1, gpuProfile={"nvidia": {"managementMode": "Managed"}})
    fleet.advance(11)
    name = c.pool_nodes(p)[0].name
    with fleet.lock:
        c.set_condition(name, "UnhealthyNvidiaDevicePlugin", "True", fixed_by=fixed_by)
        getattr(c, f"{rung}_node")(name)
    node = c.nodes[name]
    assert not node.ready
    fleet.advance(fleet.timings[f"{rung}_s"] + 1)
    assert node.ready
    # NPD publishes False at start-up and its boot run re-checks soon after (tests/sim/test_npd_reboot.py)
    fleet.advance(fleet.timings["npd_first_check_s"])
    assert (node.condition("UnhealthyNvidiaDevicePlugin")["status"] == "False") is clears


@pytest.mark.parametrize(("props", "resources"), [
    ({"vmSize": "Standard_NC24ads_A100_v4", "gpuProfile": {"nvidia": {"managementMode": "Managed",
                                                                       "migStrategy": "Single",
                                                                       "migProfiles": ["MIG1g"]}}},
     {"nvidia.com/gpu": "7"}),
    ({"vmSize": "Standard_NC24ads_A100_v4", "gpuProfile": {"nvidia": {"managementMode": "Managed",
                                                                       "migStrategy": "Mixed",
                                                                       "migProfiles": ["MIG2g"]}}},
     {"nvidia.com/mig-2g.20gb": "3"}),
    ({"vmSize": "Standard_ND96asr_v4", "gpuInstanceProfile": "MIG3g", "device_plugin": True},
     {"nvidia.com/mig-3g.20gb": "16"}),
    ({"vmSize": T4, "gpuProfile": {"driver": "None"}, "device_plugin": True}, {}),
    ({"vmSize": T4, "device_plugin": False}, {}),
    ({"vmSize": T4, "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}, {"nvidia.com/gpu": "1"}),
], ids=["managed-mig-single", "managed-mig-mixed", "classic-mig", "driver-none", "unmanaged-no-plugin", "managed"])
def test_gpu_resources_follow_the_pool_gpu_profile(props: dict[str, Any], resources: dict[str, str]) -> None:
    _fleet, c = new_fleet()
    p = pool(c, "g", count=1, **props)
    alloc = c.pool_nodes(p)[0].obj["status"]["allocatable"]
    assert {k: v for k, v in alloc.items() if k.startswith("nvidia.com/")} == resources


def test_an_unmanaged_pool_gets_gpus_once_a_device_plugin_daemonset_covers_it() -> None:
    fleet, c = new_fleet()
    p = pool(c, "old", vmSize=T4, count=1)
    fleet.advance(11)
    assert "nvidia.com/gpu" not in c.pool_nodes(p)[0].obj["status"]["allocatable"]
    workload(c, kind="DaemonSet", name="nvidia-device-plugin-daemonset", namespace="kube-system",
             tolerations=[{"operator": "Exists"}])
    assert c.pool_nodes(p)[0].obj["status"]["allocatable"]["nvidia.com/gpu"] == "1"


def test_machines_and_vmss_instances_map_to_node_names() -> None:
    _fleet, c = new_fleet()
    p = pool(c, "gpu", vmSize=T4, count=2, availabilityZones=["1", "3"])
    machines = c.machines(p)
    assert [m["name"] for m in machines] == [n.name for n in c.pool_nodes(p)]
    assert [m["zones"] for m in machines] == [["1"], ["3"]]
    assert c.node_by_vmss_instance(c.vmss_name(p), "1") == machines[1]["name"]
    assert machines[1]["resourceId"].endswith(f"/virtualMachineScaleSets/{c.vmss_name(p)}/virtualMachines/1")


def test_pods_on_a_restarting_node_turn_unready_and_back() -> None:
    fleet, c = new_fleet()
    p = pool(c, "cpu", vmSize="Standard_D4s_v5", count=1)
    fleet.advance(11)
    workload(c, kind="Deployment", name="web", replicas=1, pdb={"minAvailable": 1})
    fleet.advance(3)
    pdb = c.get("poddisruptionbudgets.policy", "default", "web")
    assert pdb is not None and c.pdb_status(pdb)["currentHealthy"] == 1
    with fleet.lock:
        c.restart_node(c.pool_nodes(p)[0].name)
    assert c.pdb_status(pdb)["currentHealthy"] == 0
    fleet.advance(31)
    assert c.pdb_status(pdb)["currentHealthy"] == 1


def test_evicting_a_pod_under_two_pdbs_is_a_500_as_on_a_real_server() -> None:
    from sim.core.http import Headers, Request
    from sim.identity.tokens import AKS_AUDIENCES
    from sim.kube.api import KubeApi

    fleet, c = new_fleet()
    pool(c, "cpu", vmSize="Standard_D4s_v5", count=1)
    fleet.advance(11)
    workload(c, kind="Deployment", name="web", replicas=2, pdb={"minAvailable": 1})
    with fleet.lock:
        c.put("poddisruptionbudgets.policy", {"metadata": {"name": "also", "namespace": "default"},
                                              "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    fleet.advance(3)
    pod = c.items("pods")[0]
    token = fleet.tokens.issue(AKS_AUDIENCES[0])[0]
    resp = KubeApi(fleet).handle(Request("POST", f"/k8s/s/rg/c/api/v1/namespaces/default/pods/{pod.name}/eviction",
                                         Headers({"Authorization": f"Bearer {token}"}), b"{}"))
    assert resp.status == 500
    assert b"more than one PodDisruptionBudget" in resp.body
    assert not pod.terminating

"""Scenario loading: the default fleet shows every job of the app, errors name the field, and the
same scenario with the same seed gives the same run."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.generate import large_fleet
from sim.scenario import DEFAULT_SCENARIO, SCENARIO_DIR, ScenarioError, build_fleet, load
from sim.testing import start_sim


def manual(source: Any = None, **clock: Any) -> dict[str, Any]:
    sc = load(source)
    sc["clock"] = {"manual": True, "start": 1_764_684_000, **clock}
    return sc


def run(sc: dict[str, Any], seed: int, seconds: float = 400, step: float = 7) -> tuple[dict[str, Any], dict[str, Any]]:
    fleet = build_fleet(copy.deepcopy(sc), seed=seed)
    t = 0.0
    while t < seconds:
        fleet.advance(step)
        t += step
        with fleet.lock:
            cluster = fleet.cluster_by_name("ml-train")
            assert cluster is not None
            victims = [n.name for n in cluster.pool_nodes("gput4") if any(
                c["type"] == "UnhealthyNvidiaDevicePlugin" and c["status"] == "True"
                for c in n.obj["status"]["conditions"])]
            for name in victims:
                if cluster.nodes[name].ready:
                    cluster.restart_node(name)
    state = fleet.state()
    state["clock"].pop("epoch_real")  # wall time aside
    return state, fleet.oracles.report()


def test_the_same_scenario_and_seed_give_the_same_run() -> None:
    sc = manual()
    assert run(sc, seed=42) == run(sc, seed=42)


def test_another_seed_gives_other_names() -> None:
    sc = manual()
    a, _ = run(sc, seed=1, seconds=10)
    b, _ = run(sc, seed=2, seconds=10)
    assert [n["name"] for c in a["clusters"] for n in c["nodes"]] != [n["name"] for c in b["clusters"] for n in c["nodes"]]


def test_two_simulator_processes_with_the_same_seed_serve_the_same_fleet() -> None:
    sc = load("drain")
    states = []
    for _ in range(2):
        with start_sim(scenario=sc, seed=9) as sim:
            state = sim.state()
            state.pop("clock")
            states.append(state)
    assert states[0] == states[1]


def test_the_default_scenario_covers_every_job_of_the_app() -> None:
    fleet = build_fleet(None)
    clusters = {c.name: c for c in fleet.clusters.values()}
    in_scope = {n for n, c in clusters.items() if c.tags.get("gpu-fleet-steward") == "enabled"}
    assert in_scope == {"ml-platform", "ml-train", "ml-legacy", "ml-nap"}
    assert set(clusters) - in_scope == {"research-lab"}
    assert clusters["ml-train"].pools["gput4"].managed_gpu
    flips = fleet.scenario["conditions"]
    assert {f["fixed_by"] for f in flips if f["cluster"] == "ml-train"} == {"restart", "replace"}
    legacy = clusters["ml-legacy"].pools
    assert not legacy["t4old"].managed_gpu and not legacy["a100old"].managed_gpu
    assert legacy["mig"].properties["gpuInstanceProfile"] == "MIG3g"
    assert legacy["system"].properties["mode"] == "System"
    assert clusters["ml-nap"].nap and any(n.nap for n in clusters["ml-nap"].nodes.values())
    assert all(p.phase == "Running" for c in clusters.values() for p in c.items("pods"))


def test_every_scenario_in_the_directory_loads() -> None:
    files = sorted(SCENARIO_DIR.glob("*.yaml"))
    assert DEFAULT_SCENARIO in files and len(files) >= 4
    for path in files:
        assert build_fleet(path).clusters, path


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda sc: sc["subscriptions"][0]["clusters"][0].pop("resource_group"),
     "subscriptions[0].clusters[0].resource_group is required"),
    (lambda sc: sc["subscriptions"][0]["clusters"][0].__setitem__("node_provisioning_mode", "Sometimes"),
     "node_provisioning_mode must be Manual or Auto"),
    (lambda sc: sc.__setitem__("timings", {"pool_create_seconds": 3}), "timings: unknown keys"),
    (lambda sc: sc["subscriptions"][0]["clusters"][0]["workloads"].append({"kind": "CronJob", "name": "x"}),
     "kind must be one of"),
    (lambda sc: sc["subscriptions"][0]["clusters"][0]["workloads"].append(
        {"kind": "Deployment", "name": "y", "pdb": {"foo": 1}}), "pdb needs minAvailable or maxUnavailable"),
    (lambda sc: sc.__setitem__("conditions", [{"at": 1, "cluster": "drill", "pool": "work", "type": "Sad"}]),
     "conditions[0].type must be one of"),
    (lambda sc: sc.__setitem__("conditions", [{"at": 1, "cluster": "nope", "pool": "work",
                                               "type": "XIDErrors"}]), "conditions[0].cluster 'nope'"),
    (lambda sc: sc.__setitem__("conditions", [{"at": 1, "cluster": "drill", "pool": "work", "type": "XIDErrors",
                                               "fixed_by": "prayer"}]), "fixed_by must be one of"),
    (lambda sc: sc["subscriptions"][0]["clusters"][0].__setitem__("pool", []), "unknown keys \\['pool'\\]"),
    (lambda sc: sc["subscriptions"][0]["clusters"][0]["workloads"][0].__setitem__("replica", 2),
     "workloads\\[0\\]: unknown keys"),
    (lambda sc: sc.__setitem__("faults", [{"target": "nowhere"}]), "faults: fault rule target must be one of"),
], ids=["missing-resource-group", "bad-provisioning-mode", "unknown-timing", "unknown-workload-kind", "bad-pdb",
        "unknown-condition", "unknown-cluster", "unknown-repair-rung", "misspelt-cluster-key",
        "misspelt-workload-key", "bad-fault-rule"])
def test_a_bad_scenario_is_refused_with_the_path_of_the_field(mutate: Any, message: str) -> None:
    sc = load("drain")
    mutate(sc)
    pattern = message if "\\" in message else message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
    with pytest.raises(ScenarioError, match=pattern):
        build_fleet(sc)


def test_json_scenarios_load_like_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(yaml.safe_load((SCENARIO_DIR / "drain.yaml").read_text())))
    assert build_fleet(path).state()["clusters"][0]["name"] == "drill"


def test_condition_flips_happen_at_their_time_and_flapping_alternates() -> None:
    sc = manual("drain")
    sc["subscriptions"][0]["clusters"][0]["pools"].append(
        {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 1,
         "gpuProfile": {"nvidia": {"managementMode": "Managed"}}})
    sc["conditions"] = [{"at": 30, "cluster": "drill", "pool": "gpu", "node_index": 0, "type": "GPUMissing",
                         "status": "True", "fixed_by": "replace"}]
    sc["flapping"] = [{"cluster": "drill", "pool": "gpu", "node_index": 0, "type": "XIDErrors", "start": 10,
                       "period_s": 10, "flips": 4}]
    fleet = build_fleet(sc)
    node = fleet.cluster_by_name("drill").pool_nodes("gpu")[0]  # type: ignore[union-attr]

    def status(t: str) -> str:
        return str(node.condition(t)["status"])  # type: ignore[index]

    seen = []
    for _ in range(5):
        fleet.advance(10)
        seen.append((status("XIDErrors"), status("GPUMissing")))
    assert seen == [("True", "False"), ("False", "False"), ("True", "True"), ("False", "True"), ("False", "True")]
    assert node.repair_plan == {"GPUMissing": "replace"}


def test_a_flapping_condition_stays_on_its_node_when_the_pool_changes_under_it() -> None:
    """Soak seed 954044: a replacement in the pool while a condition flapped moved its later flips to another
    node (``node_index`` resolved at each flip), which was left True for good. The flapping is one node's."""
    sc = manual("drain")
    sc["subscriptions"][0]["clusters"][0]["pools"].append(
        {"name": "gpu", "vmSize": "Standard_NC4as_T4_v3", "count": 3,
         "gpuProfile": {"nvidia": {"managementMode": "Managed"}}})
    sc["flapping"] = [{"cluster": "drill", "pool": "gpu", "node_index": 1, "type": "UnhealthyNvidiaDevicePlugin",
                       "start": 10, "period_s": 10, "flips": 4}]
    fleet = build_fleet(sc)
    cluster = fleet.cluster_by_name("drill")
    assert cluster is not None
    first, flapping, third = (n.name for n in cluster.pool_nodes("gpu"))
    fleet.advance(11)  # the first flip: True on the pool's second node
    with fleet.lock:
        cluster.remove_machines(cluster.pools["gpu"], [first])  # the pool's first node leaves
    fleet.advance(40)  # the other three flips
    assert [n.name for n in cluster.pool_nodes("gpu")][:2] == [flapping, third]
    assert cluster.nodes[flapping].condition("UnhealthyNvidiaDevicePlugin")["status"] == "False"
    assert cluster.nodes[third].condition("UnhealthyNvidiaDevicePlugin")["status"] == "False"


def test_the_generator_makes_a_fleet_of_the_requested_size() -> None:
    sc = large_fleet(clusters=3, nodes_per_cluster=40, pools_per_cluster=4, seed=1, unhealthy_fraction=0.1)
    assert sc == large_fleet(clusters=3, nodes_per_cluster=40, pools_per_cluster=4, seed=1, unhealthy_fraction=0.1)
    fleet = build_fleet(sc)
    assert len(fleet.clusters) == 3
    for c in fleet.clusters.values():
        assert sum(1 for n in c.nodes.values() if n.pool != "system") == 40
    assert sc["conditions"]


def test_a_manual_clock_moves_only_when_advanced_through_the_control_api() -> None:
    sc = manual("drain")
    sc["conditions"] = [{"at": 100, "cluster": "drill", "pool": "work", "node_index": 0, "type": "XIDErrors",
                         "status": "True", "fixed_by": "never"}]
    with start_sim(scenario=sc, seed=7) as sim:
        before = sim.control("GET", "/clock")["now"]
        assert sim.control("GET", "/clock")["now"] == before == 1_764_684_000
        assert not any(n["unhealthy"] for c in sim.state()["clusters"] for n in c["nodes"])
        assert sim.control("POST", "/advance", {"seconds": 150})["now"] == before + 150
        unhealthy = [n["name"] for c in sim.state()["clusters"] for n in c["nodes"] if n["unhealthy"]]
        assert len(unhealthy) == 1 and "-work-" in unhealthy[0]

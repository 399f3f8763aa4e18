"""The fleet migration job end to end: unmanaged GPU pools become managed ones, and nothing breaks.

Azurite, the simulator and local Functions host processes (``python -m devhost run``) run the real
app with its real adapters; the job is switched on with ``MIGRATION_ENABLED=true`` and runs from its
own timer, as in Azure. Two stacks:

- the *fleet* (``scenarios/migration.yaml``): the plan is printed with the CLI first (no host
  running, so every write the simulator counts during it would be the CLI's), each pool's ARM
  spec is saved, then one host migrates everything at once. Each test then reads one aspect of
  the same run: field-by-field clones, PDB safety, the rolling strategy under quota, rollbacks,
  skips, the blocked pinned pool.
- the *crash drill* (``scenarios/migration_crash.yaml``): two hosts run; at chosen points of a surge
  and a rolling migration (states watched in the ledger; writes caught in flight by a simulator
  fault that answers them late, after they took effect) the host stepping the migration (the
  record's owner) is SIGKILLed and a fresh one started; the migration must resume to the same end.

What is checked is what an operator and an auditor can see: the ledger table, ARM, the clusters'
nodes and pods, the CloudEvents on the topic, and the simulator's oracles.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import devstack
from shared.kernel.errors import NotFound
from shared.kernel.ports import Record
from sim.testing import SimError
from tests.waiting import wait_until

HERE = Path(__file__).resolve().parent
FLEET_SCENARIO = HERE / "scenarios" / "migration.yaml"
CRASH_SCENARIO = HERE / "scenarios" / "migration_crash.yaml"
PREVIEW_API = "2026-08-02-preview"  # shows every gpuProfile field
MANAGED_PROFILE = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
TAG_MIGRATED_FROM = "gpu-fleet-steward-migrated-from"
TAG_AUTOSCALER = "gpu-fleet-steward-autoscaler-was"
AGENTPOOL = "kubernetes.azure.com/agentpool"
TERMINAL = ("done", "rolled_back", "blocked")
#: Properties ARM owns; they may differ between any two pools.
READ_ONLY = frozenset({"eTag", "provisioningState", "powerState", "currentOrchestratorVersion", "nodeImageVersion"})
#: Properties the replacement sets on purpose (docs/migration.md, "The replacement").
CHANGED_ON_PURPOSE = frozenset({"gpuProfile", "tags"})
AUTOSCALER_FIELDS = frozenset({"enableAutoScaling", "minCount", "maxCount"})

#: Timings of the job in simulated seconds; schedules are NCRONTAB on the host's clock, which runs
#: as fast as the simulator's (20x for the fleet, 40x for the crash drill). A lease left by a killed
#: host lasts 120 sim s.
MIGRATION_PROFILE: dict[str, str] = {
    "MIGRATION_ENABLED": "true",
    "MIGRATION_SCHEDULE": "0 * * * * *",
    "SWEEP_SCHEDULE": "0 */10 * * * *",
    "MIGRATION_MAX_CONCURRENT": "20",
    "MIGRATION_POLL_INTERVAL_S": "10",
    "MIGRATION_VALIDATE_TIMEOUT_S": "120",
    "MIGRATION_CREATE_TIMEOUT_S": "600",
    "MIGRATION_DRAIN_TIMEOUT_S": "900",
    # eastus has quota to spare; westus can hold one A100 node next to the old pool (as the
    # scenarios' quotas say), so the plan chooses rolling there.
    "MIGRATION_GPU_VCPU_HEADROOM": "eastus:*=100000,westus:StandardNCADSA100v4Family=24",
}
#: The reconciler looks every half second of wall time at either speed.
FLEET_PROFILE = {**MIGRATION_PROFILE, "RECONCILE_SCHEDULE": "*/10 * * * * *"}
CRASH_PROFILE = {**MIGRATION_PROFILE, "RECONCILE_SCHEDULE": "*/20 * * * * *"}

SICK_POOL = ("ml-fail", "t4sickm1")  # the test makes this replacement's nodes unhealthy


# --------------------------------------------------------------------------- observing a stack


class Observer:
    """A running stack seen from outside: ledger, ARM, oracles, published events."""

    def __init__(self, stack: devstack.Stack) -> None:
        self.stack = stack
        self.ledger = stack.ledger()
        self.clusters = {c["name"]: c["id"] for c in stack.endpoints["clusters"]}
        self.names = {v.lower(): k for k, v in self.clusters.items()}

    def records(self) -> list[Record]:
        try:
            return list(self.ledger.list("migration"))
        except NotFound:  # the table does not exist before the first host wrote to it
            return []

    def record(self, cluster: str, pool: str) -> Record:
        for r in self.records():
            if str(r.data.get("cluster_id", "")).lower() == self.clusters[cluster].lower() and r.data.get("pool") == pool:
                return r
        raise AssertionError(f"no migration record for {cluster}/{pool}: {self.describe_all()}")

    def pools(self, cluster: str) -> dict[str, dict[str, Any]]:
        answer = self.stack.arm("GET", f"{self.clusters[cluster]}/agentPools", api_version=PREVIEW_API)
        return {str(p["name"]): dict(p["properties"]) for p in answer.get("value") or []}

    def all_pools(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(c, name): props for c in self.clusters for name, props in self.pools(c).items()}

    def state(self, cluster: str) -> dict[str, Any]:
        for c in self.stack.sim.state()["clusters"]:
            if c["name"] == cluster:
                return dict(c)
        raise KeyError(cluster)

    def oracles(self) -> dict[str, Any]:
        return self.stack.oracles()

    def writes(self) -> dict[str, int]:
        """Write requests (POST/PUT/PATCH/DELETE) the simulated services have answered, by service."""
        by_service = self.oracles()["requests_by_service"]
        return {service: int(counts.get("writes", 0)) for service, counts in by_service.items()}

    def migration_events(self) -> list[dict[str, Any]]:
        return [e for e in self.stack.published_events() if str(e.get("type", "")).startswith("Steward.Migration.")]

    def describe_all(self) -> str:
        return json.dumps([{"pool": r.data.get("pool"), "state": r.state, "waiting": r.data.get("waiting"),
                            "reason": r.data.get("reason"), "error": r.data.get("_last_error"),
                            "history": [h.get("note") for h in r.history[-4:]]} for r in self.records()],
                          default=str)[:6000]

    def host_log_tail(self, lines: int = 30) -> str:
        text = "\n".join(p.read_text(errors="replace") for p in sorted(self.stack.state_dir.glob("host-*.log")))
        kept = [line for line in text.splitlines() if " ERROR " in line or "Traceback" in line or "WARNING" in line]
        return "\n".join(kept[-lines:])

    def wait_all_terminal(self, expected: int, *, timeout: float, tick: Callable[[], None] | None = None) -> list[Record]:
        def finished() -> list[Record]:
            if tick is not None:
                tick()
            records = self.records()
            return records if len(records) >= expected and all(r.state in TERMINAL for r in records) else []

        return wait_until(finished, timeout=timeout, interval=0.2, what="the migrations to finish",
                          detail=lambda: f"{self.describe_all()}\n--- host log (errors, warnings) ---\n{self.host_log_tail()}")




# --------------------------------------------------------------------------- comparing pools


def clone_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Every property (read-only ones aside) whose value differs between the old pool and its replacement."""
    keys = (set(old) | set(new)) - READ_ONLY
    return {k: (old.get(k), new.get(k)) for k in sorted(keys) if old.get(k) != new.get(k)}


def assert_is_managed_twin(old_name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """``new`` is ``old`` field by field, except the GPU profile and what docs/migration.md changes on purpose."""
    differences = clone_differences(old, new)
    autoscaled = bool(old.get("enableAutoScaling"))
    allowed = CHANGED_ON_PURPOSE | (AUTOSCALER_FIELDS if autoscaled else frozenset())
    assert set(differences) <= allowed, f"fields differ beyond the GPU profile: {differences}"
    assert new.get("gpuProfile") == MANAGED_PROFILE
    assert (old.get("gpuProfile") or {}).get("nvidia", {}).get("managementMode") != "Managed"
    wanted_tags = {**(old.get("tags") or {}), TAG_MIGRATED_FROM: old_name}
    if autoscaled:
        wanted_tags[TAG_AUTOSCALER] = f"{old['minCount']}-{old['maxCount']}"
        assert new.get("enableAutoScaling") is False and "minCount" not in new and "maxCount" not in new
        assert old["minCount"] <= new["count"] <= old["maxCount"]
    assert new.get("tags") == wanted_tags
    assert new.get("provisioningState") == "Succeeded"


# --------------------------------------------------------------------------- stacks


@contextlib.contextmanager
def migration_stack(request: pytest.FixtureRequest, scenario: Path, name: str, *,
                    profile: Mapping[str, str]) -> Iterator[devstack.Stack]:
    """A stack with no host yet; its logs are kept (and their path printed) when a test of the module failed."""
    state_dir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    failed_before = request.session.testsfailed
    with devstack.running(scenario=scenario, profile=profile, hosts=0, host_json=devstack.FAST_HOST_JSON,
                          state_dir=state_dir) as stack:
        yield stack
    if request.session.testsfailed == failed_before:
        shutil.rmtree(state_dir, ignore_errors=True)
    else:
        print(f"\n{name}: the stack's logs are in {state_dir}")


def fleetctl(stack: devstack.Stack, *args: str) -> str:
    """Run the CLI as an operator would, against this stack's settings and simulator endpoints."""
    command = [sys.executable, "-m", "fleetctl", "--settings", str(stack.settings_path),
               "--endpoints", str(stack.endpoints_path), *args]
    done = subprocess.run(command, cwd=devstack.ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"fleetctl {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}"
    return done.stdout


class SickWatcher:
    """Makes every node of one replacement pool report a broken DCGM as soon as it joins (never fixed)."""

    def __init__(self, observer: Observer, *, cluster: str, pool: str) -> None:
        self.observer, self.cluster, self.pool = observer, cluster, pool
        self.flipped: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sick-watcher", daemon=True)

    def __enter__(self) -> SickWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            pools = {p["name"]: p for p in self.observer.state(self.cluster)["pools"]}
            for node in (pools.get(self.pool) or {}).get("nodes") or []:
                if node in self.flipped:
                    continue
                try:
                    self.observer.stack.control("POST", "/conditions", {
                        "cluster": self.cluster, "node": node, "type": "UnhealthyNvidiaDCGMServices",
                        "status": "True", "fixed_by": "never"})
                except SimError:  # the node went away between the listing and the flip
                    continue
                self.flipped.append(node)


# --------------------------------------------------------------------------- the fleet run


@dataclass
class FleetRun:
    observer: Observer
    plan: dict[str, Any]
    plan_table: str
    plan_writes: dict[str, int]
    records_after_plan: int
    before: dict[tuple[str, str], dict[str, Any]]
    after: dict[tuple[str, str], dict[str, Any]]
    records: dict[tuple[str, str], Record]
    oracles: dict[str, Any]
    events: list[dict[str, Any]]
    states: dict[str, dict[str, Any]]
    sick_nodes: list[str]
    wall_s: float

    def record(self, cluster: str, pool: str) -> Record:
        assert (cluster, pool) in self.records, f"no record for {cluster}/{pool}: {sorted(self.records)}"
        return self.records[(cluster, pool)]

    def pools(self, cluster: str, *, when: str = "after") -> dict[str, dict[str, Any]]:
        source = self.after if when == "after" else self.before
        return {pool: props for (c, pool), props in source.items() if c == cluster}


def _writes_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}


@pytest.fixture(scope="module")
def fleet_run(request: pytest.FixtureRequest) -> Iterator[FleetRun]:
    """Print the plan, save every pool's spec, then let one host migrate the whole fleet."""
    with migration_stack(request, FLEET_SCENARIO, "migration-fleet", profile=FLEET_PROFILE) as stack:
        observer = Observer(stack)
        before = observer.all_pools()
        writes_before = observer.writes()
        plan = json.loads(fleetctl(stack, "plan", "--json"))
        table = fleetctl(stack, "plan")
        plan_writes = _writes_delta(writes_before, observer.writes())
        records_after_plan = len(observer.records())
        started = time.monotonic()
        stack.start_host("host-1")
        with SickWatcher(observer, cluster=SICK_POOL[0], pool=SICK_POOL[1]) as watcher:
            records = observer.wait_all_terminal(len(plan["items"]), timeout=150)
        wall = time.monotonic() - started
        stack.stop_hosts()  # nothing moves while the tests read
        names = observer.names
        yield FleetRun(
            observer=observer, plan=plan, plan_table=table, plan_writes=plan_writes,
            records_after_plan=records_after_plan, before=before,
            after=observer.all_pools(),
            records={(names[str(r.data["cluster_id"]).lower()], str(r.data["pool"])): r for r in records},
            oracles=observer.oracles(), events=observer.migration_events(),
            states={c: observer.state(c) for c in observer.clusters}, sick_nodes=list(watcher.flipped), wall_s=wall)


MIGRATED = [  # (cluster, pool, what it shows)
    ("ml-east", "t4", "T4, Ubuntu, two zones, taint, labels, tags, autoscaler on"),
    ("ml-east", "a100", "A100, Ubuntu, spot, autoscaler off"),
    ("ml-azl", "h100", "H100, Azure Linux, three zones, taint, autoscaler on"),
    ("ml-azl", "t4al", "T4, Azure Linux, no taint; kubelet reserved resources, eviction thresholds, seccomp, "
                       "initialisation taints, a prepared image: settings only the preview api-version carries"),
    ("ml-quota", "a100q", "A100 where quota holds one extra node: rolling"),
    ("ml-other", "gput4", "T4 in a second subscription, StatefulSet"),
]
ROLLED_BACK = [  # (cluster, pool, words of the reason)
    ("ml-fail", "t4bad", "Failed"),
    ("ml-fail", "t4sick", "did not become healthy"),
]
SKIPPED = [  # (cluster, pool, code)
    ("ml-east", "migpool", "mig"),
    ("ml-east", "gpusys", "system"),
]
#: Workloads of the fleet scenario and their replicas (all must be Running at the end).
WORKLOADS = {("ml-east", "serving", "api"): 2, ("ml-east", "ml", "vision"): 2, ("ml-east", "ml", "trainer"): 2,
             ("ml-azl", "llm", "llm"): 2, ("ml-azl", "batch", "batch"): 1, ("ml-quota", "serving", "serve"): 2,
             ("ml-fail", "ml", "bad"): 1, ("ml-fail", "ml", "sick"): 2, ("ml-pinned", "ml", "pinned"): 1,
             ("ml-other", "research", "notebook"): 2}


def _running_pods(state: Mapping[str, Any], namespace: str, workload: str) -> list[dict[str, Any]]:
    return [p for p in state["pods"] if p["namespace"] == namespace and p["name"].startswith(f"{workload}-")
            and p["phase"] == "Running" and not p["terminating"]]


def _pool_of(state: Mapping[str, Any], node: str) -> str:
    return next(str(n["pool"]) for n in state["nodes"] if n["name"] == node)


@pytest.mark.parametrize(("cluster", "pool"), [(c, p) for c, p, _ in MIGRATED], ids=[f"{c}/{p}" for c, p, _ in MIGRATED])
def test_every_unmanaged_gpu_pool_of_the_fleet_migrates_to_a_managed_pool_identical_but_for_the_gpu_profile(
        fleet_run: FleetRun, cluster: str, pool: str) -> None:
    record = fleet_run.record(cluster, pool)
    assert record.state == "done", fleet_run.observer.describe_all()
    replacement = str(record.data["replacement"])
    after = fleet_run.pools(cluster)
    assert pool not in after, f"the old pool {pool} still exists"
    assert replacement in after, f"the replacement {replacement} is missing from {sorted(after)}"
    assert_is_managed_twin(pool, fleet_run.before[(cluster, pool)], after[replacement])
    state = fleet_run.states[cluster]
    nodes = [n for n in state["nodes"] if n["pool"] == replacement]
    assert len(nodes) == after[replacement]["count"]
    assert all(n["ready"] and not n["unschedulable"] and not n["unhealthy"] and int(n["gpu"]) >= 1 for n in nodes), nodes
    assert not [n for n in state["nodes"] if n["pool"] == pool], "old nodes are left"


def test_workloads_with_pdbs_keep_running_no_pdb_violated_no_pod_killed_without_eviction_none_lost(
        fleet_run: FleetRun) -> None:
    oracles = fleet_run.oracles
    assert oracles["pdb_violations"] == []
    assert oracles["pods_killed_without_eviction"] == []
    assert oracles["workload_pods_lost"] == []
    workload_causes = {t["cause"] for t in oracles["terminations"] if t["workload"]}
    assert workload_causes <= {"eviction"}, workload_causes
    assert any(t["workload"] for t in oracles["terminations"]), "no pod was ever moved: the test proves nothing"
    for (cluster, namespace, workload), replicas in WORKLOADS.items():
        running = _running_pods(fleet_run.states[cluster], namespace, workload)
        assert len(running) == replicas, f"{cluster} {namespace}/{workload}: {len(running)} of {replicas} Running"
    for cluster, pool, _ in MIGRATED:  # the GPU workloads now run on the replacements
        replacement = fleet_run.record(cluster, pool).data["replacement"]
        assert any(_pool_of(fleet_run.states[cluster], p["node"]) == replacement for p in fleet_run.states[cluster]["pods"]), \
            f"no pod of {cluster} runs on {replacement}"


def test_a_cluster_whose_quota_cannot_hold_two_pools_migrates_with_the_rolling_strategy_and_finishes(
        fleet_run: FleetRun) -> None:
    record = fleet_run.record("ml-quota", "a100q")
    assert record.state == "done"
    assert record.data["strategy"] == "rolling" and "headroom 24" in record.data["strategy_reason"]
    notes = [str(h.get("note")) for h in record.history]
    # one batch first (validated at 1 node), then grown to 2 once an old machine was removed
    assert any("is healthy (1 nodes" in n for n in notes), "\n".join(notes)
    assert any("healthy at 2 nodes" in n for n in notes), "\n".join(notes)
    assert any(n.startswith("removed ") for n in notes), notes  # an old machine went before the replacement grew
    # The simulator refuses any PUT beyond the quota (72 vCPUs = 3 A100 nodes): reaching done proves it held.
    removed = [n for n in fleet_run.oracles["nodes_removed"] if n["cluster"] == "ml-quota"]
    assert {n["pool"] for n in removed} == {"a100q"} and len(removed) == 2


@pytest.mark.parametrize(("cluster", "pool", "why"), ROLLED_BACK, ids=["replacement-put-fails", "replacement-stays-unhealthy"])
def test_a_replacement_that_never_becomes_healthy_is_rolled_back_and_the_old_pool_serves_again(
        fleet_run: FleetRun, cluster: str, pool: str, why: str) -> None:
    record = fleet_run.record(cluster, pool)
    assert record.state == "rolled_back", fleet_run.observer.describe_all()
    assert why in str(record.data.get("reason")), record.data.get("reason")
    if pool == SICK_POOL[1].removesuffix("m1"):
        assert fleet_run.sick_nodes, "the replacement's nodes were never made unhealthy"
    after = fleet_run.pools(cluster)
    assert record.data["replacement"] not in after, "the replacement was not deleted"
    assert not clone_differences(fleet_run.before[(cluster, pool)], after[pool]), "the old pool was changed"
    state = fleet_run.states[cluster]
    old_nodes = [n for n in state["nodes"] if n["pool"] == pool]
    assert len(old_nodes) == after[pool]["count"]
    assert all(n["ready"] and not n["unschedulable"] for n in old_nodes), old_nodes
    workload = "bad" if pool == "t4bad" else "sick"
    running = _running_pods(state, "ml", workload)
    assert running and all(_pool_of(state, p["node"]) == pool for p in running)
    types = {e["type"] for e in fleet_run.events if e["data"].get("migration") == record.id}
    assert "Steward.Migration.RolledBack" in types and "Steward.Migration.Completed" not in types


def test_mig_and_system_pools_are_skipped_with_their_reason_and_left_untouched(fleet_run: FleetRun) -> None:
    skipped = {(s["cluster_name"], s["pool"]): s for s in fleet_run.plan["skipped"]}
    for cluster, pool, code in SKIPPED:
        assert skipped[(cluster, pool)]["code"] == code and skipped[(cluster, pool)]["reason"]
        assert (cluster, pool) not in fleet_run.records
        assert not clone_differences(fleet_run.before[(cluster, pool)], fleet_run.after[(cluster, pool)])
        assert f"{pool}" in fleet_run.plan_table and code in fleet_run.plan_table


def test_the_plan_printed_beforehand_wrote_nothing_and_is_what_was_done(fleet_run: FleetRun) -> None:
    assert fleet_run.plan_writes.get("arm", 0) == 0 and fleet_run.plan_writes.get("kube", 0) == 0, fleet_run.plan_writes
    assert not any(fleet_run.plan_writes.values()), fleet_run.plan_writes  # no event published either
    assert fleet_run.records_after_plan == 0
    items = {(i["cluster_name"], i["pool"]): i for i in fleet_run.plan["items"]}
    assert set(items) == set(fleet_run.records)
    assert set(items) == {(c, p) for c, p, _ in MIGRATED} | {(c, p) for c, p, _ in ROLLED_BACK} | {("ml-pinned", "t4pin")}
    for key, item in items.items():
        record = fleet_run.records[key]
        assert item["order"] == record.data["order"] and item["record_id"] == record.id
        for field_name in ("replacement", "strategy", "batch_size", "body", "vm_size", "node_count"):
            assert record.data[field_name] == item[field_name], f"{key}: {field_name} differs from the plan"
        assert item["replacement"] in fleet_run.plan_table
        if record.state == "done":  # the replacement in ARM is the planned body (ARM adds read-only fields)
            new = fleet_run.after[(key[0], item["replacement"])]
            wrong = {k: (v, new.get(k)) for k, v in item["body"].items() if new.get(k) != v}
            assert not wrong, f"{key}: the replacement differs from the plan: {wrong}"
    strategies = {key: item["strategy"] for key, item in items.items()}
    assert strategies[("ml-quota", "a100q")] == "rolling"
    assert {s for k, s in strategies.items() if k[0] != "ml-quota"} == {"surge"}


def test_a_pool_whose_workloads_are_pinned_to_its_name_ends_blocked_with_the_reason_and_nothing_is_deleted(
        fleet_run: FleetRun) -> None:
    record = fleet_run.record("ml-pinned", "t4pin")
    assert record.state == "blocked"
    reason = str(record.data.get("reason"))
    assert f"{AGENTPOOL}=t4pin" in reason and "ml/pinned-" in reason, reason
    assert fleet_run.pools("ml-pinned") == fleet_run.pools("ml-pinned", when="before")
    assert not [n for n in fleet_run.oracles["nodes_removed"] if n["cluster"] == "ml-pinned"]
    assert not [t for t in fleet_run.oracles["terminations"] if t["cluster"] == "ml-pinned"]
    state = fleet_run.states["ml-pinned"]
    assert all(not n["unschedulable"] for n in state["nodes"])
    assert len(_running_pods(state, "ml", "pinned")) == 1
    blocked = [e for e in fleet_run.events if e["type"] == "Steward.Migration.Blocked" and e["data"]["migration"] == record.id]
    assert blocked and "t4pin" in str(blocked[0]["data"].get("reason"))


def test_each_migration_tells_its_story_as_cloud_events(fleet_run: FleetRun) -> None:
    for (cluster, pool), record in fleet_run.records.items():
        delivered = [e for e in fleet_run.events if e["data"].get("migration") == record.id]
        first: dict[str, dict[str, Any]] = {}
        for event in delivered:  # at-least-once: a repeat carries its id, and consumers keep the first
            seen = first.setdefault(event["id"], event)
            assert (seen["type"], seen["data"]) == (event["type"], event["data"]), "an id was reused for another step"
        mine = list(first.values())
        types = [e["type"].removeprefix("Steward.Migration.") for e in mine]
        assert types[0] == "Planned", (cluster, pool, types)
        final = {"done": "Completed", "rolled_back": "RolledBack", "blocked": "Blocked"}[record.state]
        assert types.count(final) == 1, (cluster, pool, types)
        assert all(e["subject"] == f"{fleet_run.observer.clusters[cluster]}/agentPools/{pool}" for e in mine)
        if record.state != "blocked":
            assert "Started" in types


def test_gpu_capacity_of_a_cluster_migrating_with_surge_never_drops_below_what_it_started_with(
        fleet_run: FleetRun) -> None:
    surge_clusters = {c for (c, _), r in fleet_run.records.items() if r.data.get("strategy") == "surge"}
    surge_clusters -= {c for (c, _), r in fleet_run.records.items() if r.data.get("strategy") == "rolling"}
    assert surge_clusters >= {"ml-east", "ml-azl", "ml-other", "ml-fail"}
    for cluster in sorted(surge_clusters):
        series = fleet_run.oracles["gpu_capacity"][cluster]
        start = series[0]["allocatable"]
        low = min(sample["allocatable"] for sample in series)
        assert low >= start, f"{cluster}: GPUs dropped to {low} of {start}"


ARM_CREDENTIALS = "listClusterUserCredential"


def _arm_writes(oracles: Mapping[str, Any]) -> dict[str, int]:
    """ARM write requests by route, leaving out credential listing (a POST that reads)."""
    arm = oracles["requests_by_service"].get("arm", {})
    return {route: int(n) for route, n in arm.items()
            if route.split(" ")[0] in ("PUT", "POST", "PATCH", "DELETE") and ARM_CREDENTIALS not in route}


def expected_arm_writes(record: Record, before: Mapping[str, Any]) -> int:
    """The ARM writes docs/migration.md describes for one record's path, with nothing repeated."""
    if record.state == "blocked" and not record.data.get("replacement_count"):
        return 0
    if record.state == "rolled_back":
        return 2  # PUT the replacement, DELETE it
    freeze = 1 if before.get("enableAutoScaling") else 0
    if record.data["strategy"] == "surge":
        return 2 + freeze  # PUT the replacement, DELETE the old pool
    nodes, batch = int(record.data["nodes_total"]), int(record.data["batch_size"])
    steps = -(-nodes // batch)
    return 1 + (steps - 1) * 2 + 1 + freeze  # PUT one batch; per further batch deleteMachines + grow PUT; DELETE


def test_arm_writes_per_migrated_pool_are_exactly_the_documented_steps(fleet_run: FleetRun) -> None:
    expected = {key: expected_arm_writes(r, fleet_run.before[key]) for key, r in fleet_run.records.items()}
    actual = sum(_arm_writes(fleet_run.oracles).values())
    report = migration_numbers(fleet_run)
    print("\nmigration numbers:", json.dumps(report, indent=1))
    assert actual == sum(expected.values()), (actual, expected, _arm_writes(fleet_run.oracles))


TIMINGS: dict[str, float] = {**yaml.safe_load(FLEET_SCENARIO.read_text(encoding="utf-8"))["timings"],
                             "grace_s": 5}  # the workloads' terminationGracePeriodSeconds


def critical_path_s(record: Record, before: Mapping[str, Any]) -> float:
    """Simulated seconds the migration needs at the least: the LROs, node boot and the drains the PDBs allow."""
    t = TIMINGS
    nodes, batch = int(record.data["nodes_total"]), int(record.data["batch_size"])
    batches = -(-nodes // batch)
    drain = batches * (t["grace_s"] + t["pod_start_s"])
    freeze = t["pool_scale_s"] if before.get("enableAutoScaling") else 0
    create = t["pool_create_s"] + t["node_ready_s"]
    if record.data["strategy"] == "surge":
        return create + freeze + drain + t["pool_delete_s"]
    grow = (batches - 1) * (t["delete_machines_s"] + t["pool_scale_s"] + t["node_ready_s"])
    return create + freeze + drain + grow + t["pool_delete_s"]


def _per_state(record: Record) -> dict[str, int]:
    """Simulated seconds spent in each state, from the record's history."""
    out: dict[str, int] = {}
    for here, there in zip(record.history, record.history[1:], strict=False):
        out[here["state"]] = out.get(here["state"], 0) + round(there["at"] - here["at"])
    return out


def migration_numbers(run: FleetRun) -> dict[str, Any]:
    out: dict[str, Any] = {"wall_s": round(run.wall_s, 1), "arm_writes": _arm_writes(run.oracles), "pools": {}}
    for key, record in sorted(run.records.items()):
        row: dict[str, Any] = {"state": record.state, "strategy": record.data.get("strategy")}
        if record.state == "done":
            took = record.updated_at - record.created_at
            row.update(sim_s=round(took), critical_path_s=critical_path_s(record, run.before[key]),
                       ratio=round(took / critical_path_s(record, run.before[key]), 2), per_state_s=_per_state(record))
        out["pools"]["/".join(key)] = row
    kube = run.oracles["requests_by_service"].get("kube", {})
    out["kube_writes"] = {r: n for r, n in kube.items() if r.split(" ")[0] in ("PUT", "POST", "PATCH", "DELETE")}
    return out


# --------------------------------------------------------------------------- the crash drill


#: The states of a migration that goes well, in order.
ORDER = ["planned", "creating", "validating", "cordoning", "draining", "deleting", "done", "rolled_back",
         "rolling_back", "blocked"]


@dataclass
class KillPoint:
    """When to SIGKILL the host: a write caught in flight (fault rule) or a record seen in some state."""

    label: str
    fault: dict[str, Any] | None = None
    cluster: str = ""
    state: str = ""  # kill when the record is in this state or a later one (a state may pass between two looks)
    arm_when: Callable[[Record], bool] | None = None  # add the fault only once the record looks like this
    rule_id: str = ""
    hit: bool = False


def kill_points() -> list[KillPoint]:
    """Kill points of both migrations (they run at the same time, so each kill also lands somewhere in the other)."""
    late = {"delay_s": 2, "count": 1}
    points = [
        KillPoint("surge: while the replacement is created", cluster="crash-surge", state="creating"),
        KillPoint("surge: while the replacement is validated", cluster="crash-surge", state="validating"),
        KillPoint("surge: after the old pool's autoscaler was turned off",
                  {"target": "arm", "method": "PUT", "cluster": "crash-surge", "path": r"agentPools/t4c(\?|$)", **late}),
        KillPoint("surge: after cordoning an old node",
                  {"target": "kube", "method": "PATCH", "cluster": "crash-surge", "path": "/nodes/aks-t4c-", **late}),
        KillPoint("surge: after an eviction",
                  {"target": "kube", "method": "POST", "cluster": "crash-surge", "path": "/eviction$", **late}),
        KillPoint("surge: after the old pool's DELETE",
                  {"target": "arm", "method": "DELETE", "cluster": "crash-surge", "path": r"agentPools/t4c(\?|$)", **late}),
        KillPoint("rolling: after the replacement's PUT, before the record saved it",
                  {"target": "arm", "method": "PUT", "cluster": "crash-roll", "path": r"agentPools/a100rm1(\?|$)", **late}),
        KillPoint("rolling: after an eviction",
                  {"target": "kube", "method": "POST", "cluster": "crash-roll", "path": "/eviction$", **late}),
        KillPoint("rolling: after deleting the drained machines",
                  {"target": "arm", "method": "POST", "cluster": "crash-roll", "path": "deleteMachines", **late}),
        KillPoint("rolling: while the old pool is deleted", cluster="crash-roll", state="deleting"),
        KillPoint("rolling: after the grow PUT",
                  {"target": "arm", "method": "PUT", "cluster": "crash-roll", "path": r"agentPools/a100rm1(\?|$)", **late},
                  cluster="crash-roll", arm_when=lambda r: r.data.get("phase") == "shrink"),
    ]
    for point in points:
        point.cluster = point.cluster or str((point.fault or {}).get("cluster", ""))
    return points


@dataclass
class CrashRun:
    observer: Observer
    before: dict[tuple[str, str], dict[str, Any]]
    after: dict[tuple[str, str], dict[str, Any]]
    records: dict[str, Record]  # by cluster
    oracles: dict[str, Any]
    points: list[KillPoint]
    kills: list[str] = field(default_factory=list)
    wall_s: float = 0.0


@pytest.fixture(scope="module")
def crash_run(request: pytest.FixtureRequest) -> Iterator[CrashRun]:
    """Migrate a surge and a rolling pool while killing the host at every point of :func:`kill_points`."""
    with migration_stack(request, CRASH_SCENARIO, "migration-crash", profile=CRASH_PROFILE) as stack:
        observer = Observer(stack)
        before = observer.all_pools()
        points = kill_points()
        for point in points:
            if point.fault is not None and point.arm_when is None:
                point.rule_id = str(stack.control("POST", "/faults", [point.fault])["added"][0]["id"])
        run = CrashRun(observer=observer, before=before, after={}, records={}, oracles={}, points=points)
        # Two hosts, as a scaled-out app runs: the one stepping the record (its owner) is killed and a
        # fresh one is started in its place, so the survivor resumes once the dead one's lease expires.
        hosts = {name: stack.start_host(name) for name in ("host-1", "host-2")}
        started = time.monotonic()

        def kill_owner(record: Record | None, why: list[str]) -> None:
            victim = record.owner if record is not None and record.owner in hosts else sorted(hosts)[0]
            stack.stop_host(hosts.pop(victim), crash=True)
            run.kills.append(f"{time.monotonic() - started:5.1f}s {victim} " + " + ".join(why))
            name = f"host-{len(run.kills) + 2}"
            hosts[name] = stack.start_host(name)

        def tick() -> None:
            fired = {str(f.get("rule")) for f in stack.control("GET", "/faults").get("fired") or []}
            records = {observer.names[str(r.data["cluster_id"]).lower()]: r for r in observer.records()}
            due: dict[str, list[str]] = {}
            for point in points:
                record = records.get(point.cluster)
                if point.arm_when is not None and not point.rule_id and record is not None and point.arm_when(record):
                    point.rule_id = str(stack.control("POST", "/faults", [point.fault])["added"][0]["id"])
                if point.hit:
                    continue
                if point.rule_id and point.rule_id in fired:
                    point.hit = True
                    due.setdefault(point.cluster, []).append(point.label)
                elif point.state and record is not None and ORDER.index(record.state) >= ORDER.index(point.state):
                    point.hit = True
                    late = "" if record.state == point.state else f" (reached in {record.state})"
                    due.setdefault(point.cluster, []).append(point.label + late)
            for cluster, why in due.items():
                kill_owner(records.get(cluster), why)

        records = observer.wait_all_terminal(2, timeout=150, tick=tick)
        run.wall_s = time.monotonic() - started
        stack.stop_hosts()
        run.records = {observer.names[str(r.data["cluster_id"]).lower()]: r for r in records}
        run.after = observer.all_pools()
        run.oracles = observer.oracles()
        yield run


CRASHED = [("crash-surge", "t4c", "surge"), ("crash-roll", "a100r", "rolling")]


@pytest.mark.parametrize(("cluster", "pool", "strategy"), CRASHED, ids=["surge", "rolling"])
def test_a_host_killed_before_and_after_every_step_resumes_the_migration_to_the_same_end(
        crash_run: CrashRun, cluster: str, pool: str, strategy: str) -> None:
    record = crash_run.records[cluster]
    assert record.state == "done", crash_run.observer.describe_all()
    assert record.data["strategy"] == strategy
    pools = {name: props for (c, name), props in crash_run.after.items() if c == cluster}
    assert sorted(pools) == sorted(["system", f"{pool}m1"]), "a replacement was created twice or the old pool is left"
    assert_is_managed_twin(pool, crash_run.before[(cluster, pool)], pools[f"{pool}m1"])
    visited = [h["state"] for h in record.history]
    assert "rolling_back" not in visited
    ranks = [ORDER.index(s) for s in visited]
    assert ranks == sorted(ranks), f"the migration went backwards after a crash: {visited}"


def test_the_crash_drill_killed_the_host_at_every_chosen_point_and_no_workload_was_disrupted(crash_run: CrashRun) -> None:
    print(f"\ncrash drill: {len(crash_run.kills)} kills in {crash_run.wall_s:.0f}s:", *crash_run.kills, sep="\n  ")
    for cluster, record in crash_run.records.items():
        start = record.created_at
        print(cluster, *[f"{h['at'] - start:6.0f} {h['state']:<12} {h['note']}" for h in record.history], sep="\n  ")
    print("ARM writes (uninterrupted: 3 surge with the autoscaler frozen + 4 rolling = 7):",
          json.dumps(_arm_writes(crash_run.oracles), indent=1))
    missed = [p.label for p in crash_run.points if not p.hit]
    assert not missed, f"kill points never reached: {missed}"
    oracles = crash_run.oracles
    assert oracles["pdb_violations"] == []
    assert oracles["pods_killed_without_eviction"] == []
    assert oracles["workload_pods_lost"] == []

"""A migration moves every workload to a managed replacement safely, resumably, and only when allowed.

Real: shared.migration, shared.migration.plan, shared.kernel.reconciler, shared.fleet.stack, shared.drain, the
InMemoryLedger and RecordingEvents. Faked (tests/unit/fakes_migration.py): ARM and Kubernetes, over
one small fleet model whose clock is a ManualClock.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.fleet.pool_clone import MANAGED_GPU_PROFILE
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import Transient
from shared.kernel.ports import PodView, Record, Taint
from shared.kernel.reconciler import reconcile_once
from shared.migration import planner
from shared.migration import steps as migration
from shared.migration.draining import MIGRATION_ANNOTATION
from shared.migration.fit import NodeShape, fit_problems
from shared.migration.plan import migration_id
from shared.migration.planner import run_planner
from shared.migration.policy import MigrationPolicy
from shared.migration.records import TERMINAL_STATES
from shared.migration.steps import advance
from shared.settings import Settings
from tests.fakes.events import RecordingEvents
from tests.fakes.ledger import InMemoryLedger
from tests.unit.fakes_migration import SUB, FakeAccess, FakeFleet

NOW = 1_764_684_000.0  # 2025-12-02T14:00Z, a Tuesday
GPU_TOLERATION = ({"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},)


def t4_pool(**props: Any) -> dict[str, Any]:
    base = {"vmSize": "Standard_NC4as_T4_v3", "count": 3, "osType": "Linux", "osSKU": "Ubuntu", "mode": "User",
            "type": "VirtualMachineScaleSets", "orchestratorVersion": "1.33", "availabilityZones": ["1", "2"],
            "nodeTaints": ["sku=gpu:NoSchedule"], "nodeLabels": {"team": "vision"}, "gpuProfile": {"driver": "Install"},
            "enableAutoScaling": False}
    base.update(props)
    return base


class World:
    """One fleet, one ledger, one clock; contexts made on demand (several hosts share the ledger)."""

    def __init__(self, *, policy: MigrationPolicy | None = None, replicas: int = 3, min_available: int = 2,
                 pool_props: dict[str, Any] | None = None) -> None:
        self.clock = ManualClock(NOW)
        self.fleet = FakeFleet(self.clock)
        self.ledger = InMemoryLedger()
        self.policy = policy or MigrationPolicy(enabled=True, strategy="surge")
        self.cid = self.fleet.add_cluster("c1")
        self.fleet.add_pool(self.cid, "system", {"vmSize": "Standard_D4s_v5", "count": 1, "mode": "System"})
        self.fleet.add_pool(self.cid, "gpu", t4_pool(**(pool_props or {})))
        self.fleet.add_pool(self.cid, "mig", t4_pool(vmSize="Standard_ND96asr_v4", gpuInstanceProfile="MIG3g", count=1))
        self.fleet.add_pool(self.cid, "sysgpu", t4_pool(mode="System", count=1))
        if replicas:
            self.fleet.add_workload(self.cid, "train", replicas, min_available=min_available, pool="gpu")
        self.events = RecordingEvents()

    def ctx(self, *, instance: str = "host-a", paused: bool = False, policy: MigrationPolicy | None = None) -> Context:
        settings = Settings(subscriptions=(SUB,), eventgrid_topic_endpoint="https://eg.example/api/events",
                            migration=policy or self.policy, paused=paused)
        return Context(settings=settings, clock=self.clock, ledger=self.ledger, access=FakeAccess(self.fleet),
                       events=self.events, telemetry=None, instance=instance)  # type: ignore[arg-type]

    def record(self) -> Record:
        rec = self.ledger.get("migration", migration_id(self.cid, "gpu"))
        assert rec is not None
        return rec

    def drive(self, ctx: Context | None = None, *, limit: int = 600) -> Record:
        """Run the reconciler and the clock until the migration is terminal."""
        ctx = ctx or self.ctx()
        for _ in range(limit):
            reconcile_once(ctx, modules={"migration": migration})
            rec = self.record()
            if rec.state in TERMINAL_STATES:
                return rec
            self.clock.advance(max(1.0, rec.next_at - self.clock.now()))
        raise AssertionError(f"migration did not finish: {self.record().state} {self.record().data.get('waiting')}")

    def drive_direct(self, record: Record, *, crash_each_step: bool, limit: int = 600, until: str = "") -> Record:
        """Call advance directly; with crashes, every step's result is lost once and the step runs again."""
        ctx = self.ctx()
        for _ in range(limit):
            if record.state in TERMINAL_STATES or record.state == until:
                return record
            if record.next_at > self.clock.now():
                self.clock.advance(record.next_at - self.clock.now())
            after = advance(record, ctx)
            if crash_each_step:
                after = advance(record, ctx)  # crashed before saving: the pre-step copy is advanced again
            record = after
        raise AssertionError(f"migration did not finish: {record.state} {record.data.get('waiting')}")

    def pool(self, name: str) -> dict[str, Any] | None:
        self.fleet.settle()
        return self.fleet.pools.get((self.cid, name))

    def pods_on(self, pool: str) -> int:
        self.fleet.settle()
        return len(self.fleet.pods_on_pool(self.cid, pool))


def assert_safe(world: World) -> None:
    assert world.fleet.killed == [], "pods removed with their node instead of evicted"
    assert world.fleet.pdb_violations == []


# --------------------------------------------------------------------------- planner


def test_the_planner_records_exactly_what_the_plan_printed_and_skips_mig_and_system_pools() -> None:
    world = World()
    ctx = world.ctx()
    printed = planner.observe_plan(ctx)
    assert world.ledger.list("migration") == []  # planning alone changes nothing
    run_planner(ctx, start=False)
    records = world.ledger.list("migration")
    assert [(i.cluster_id, i.pool, i.replacement, i.strategy, i.batch_size) for i in printed.items] == \
        [(r["cluster_id"], r["pool"], r["replacement"], r["strategy"], r["batch_size"]) for r in (r.data for r in records)]
    assert [i.body for i in printed.items] == [r.data["body"] for r in records]
    assert {(s.pool, s.code) for s in printed.skipped} == {("mig", "mig"), ("sysgpu", "system")}
    assert world.events.types() == ["Steward.Migration.Planned"]


def test_the_planner_starts_the_migration_it_recorded_without_waiting_for_the_reconciler() -> None:
    world = World()
    run_planner(world.ctx())
    rec = world.record()
    assert rec.state == "creating" and rec.lease_until == 0.0  # stepped through the claim, then released
    assert world.events.types() == ["Steward.Migration.Planned", "Steward.Migration.Step", "Steward.Migration.Started"]
    assert world.fleet.arm_writes == [("PUT", world.cid, "gpum1")]
    run_planner(world.ctx(instance="host-b"))  # a second planner finds the record and starts nothing again
    assert world.fleet.arm_writes == [("PUT", world.cid, "gpum1")]


def test_planned_is_published_before_the_record_exists_so_no_reconciler_step_can_precede_it() -> None:
    world = World()
    records_at_publish: list[int] = []
    publish = world.events.publish

    def spying(**kwargs: Any) -> None:
        if kwargs["type_"].endswith(".Planned"):
            records_at_publish.append(len(world.ledger.list("migration")))
        publish(**kwargs)

    world.events.publish = spying  # type: ignore[method-assign]
    run_planner(world.ctx())
    assert records_at_publish == [0]
    run_planner(world.ctx(instance="host-b"))  # the record exists: nothing is announced again
    assert records_at_publish == [0] and world.events.types().count("Steward.Migration.Planned") == 1


def test_a_disabled_or_paused_planner_reports_the_plan_but_records_nothing() -> None:
    world = World()
    plan = run_planner(world.ctx(policy=MigrationPolicy(enabled=False)))
    assert [i.pool for i in plan.items] == ["gpu"]
    run_planner(world.ctx(paused=True))
    assert world.ledger.list("migration") == []


def test_two_hosts_planning_and_reconciling_at_once_never_run_two_migrations_on_one_pool() -> None:
    world = World()
    a, b = world.ctx(instance="host-a"), world.ctx(instance="host-b")
    run_planner(a)
    run_planner(b)
    assert len(world.ledger.list("migration")) == 1
    assert world.events.types().count("Steward.Migration.Planned") == 1
    for _ in range(600):
        reconcile_once(a, modules={"migration": migration})
        reconcile_once(b, modules={"migration": migration})
        if world.record().state in TERMINAL_STATES:
            break
        world.clock.advance(max(1.0, world.record().next_at - world.clock.now()))
    assert world.record().state == "done"
    assert [w for w in world.fleet.arm_writes if w[0] == "PUT" and w[2] == "gpum1"] == [("PUT", world.cid, "gpum1")]
    assert_safe(world)


# --------------------------------------------------------------------------- strategies


def test_a_surge_migration_moves_every_pod_with_pdbs_respected_and_deletes_the_old_pool() -> None:
    world = World()
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "done", rec.history
    assert world.pool("gpu") is None
    new = world.pool("gpum1")
    assert new is not None and new["gpuProfile"] == MANAGED_GPU_PROFILE and new["count"] == 3
    assert new["nodeTaints"] == ["sku=gpu:NoSchedule"] and new["nodeLabels"] == {"team": "vision"}
    assert world.fleet.running(world.cid, "train") == 3 and world.pods_on("gpum1") == 3
    assert_safe(world)
    assert rec.data["progress"]["nodes_drained"] == 3 and rec.data["progress"]["nodes_total"] == 3
    types = world.events.types()
    assert types[:2] == ["Steward.Migration.Planned", "Steward.Migration.Step"] and "Steward.Migration.Started" in types
    assert types[-1] == "Steward.Migration.Completed"
    reasons = {reason for _, reason, _ in world.fleet.events}
    assert {"MigrationCordoned", "MigrationDraining", "MigrationDrained"} <= reasons
    writes = [w[0] for w in world.fleet.arm_writes]
    assert writes == ["PUT", "DELETE"]  # the replacement, then the old pool


def test_a_rolling_migration_grows_the_new_pool_and_shrinks_the_old_one_a_batch_at_a_time() -> None:
    world = World(policy=MigrationPolicy(enabled=True))  # headroom unknown: rolling
    world.fleet.quota_vcpus[world.cid] = 4 * (3 + 1) + 4 * 1 + 96  # old pool + one batch (+ the other GPU pools)
    run_planner(world.ctx())
    assert world.record().data["strategy"] == "rolling"
    rec = world.drive()
    assert rec.state == "done", rec.history
    assert world.pool("gpu") is None and world.pool("gpum1")["count"] == 3  # type: ignore[index]
    assert world.fleet.running(world.cid, "train") == 3
    assert_safe(world)
    writes = [w[0] for w in world.fleet.arm_writes]
    assert writes.count("deleteMachines") == 2 and writes[-1] == "DELETE"


def test_a_surge_refused_by_quota_switches_to_rolling_records_the_switch_and_finishes() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge"))
    world.fleet.quota_vcpus[world.cid] = 4 * (3 + 1) + 4 * 1 + 96
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "done"
    assert rec.data["strategy"] == "rolling" and "quota" in rec.data["strategy_switched"]
    assert_safe(world)


def test_a_replacement_that_never_becomes_healthy_is_rolled_back_and_the_old_pool_serves_again() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", validate_timeout_s=600))
    world.fleet.broken_pools.add("gpum1")
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "rolled_back" and "did not become healthy" in rec.data["reason"]
    assert world.pool("gpum1") is None and world.pool("gpu") is not None
    old_nodes = [n for n in world.fleet.nodes[world.cid].values() if n.pool == "gpu"]
    assert old_nodes and not any(n.unschedulable or MIGRATION_ANNOTATION in n.annotations for n in old_nodes)
    assert world.fleet.running(world.cid, "train") == 3 and world.pods_on("gpu") == 3
    assert world.events.types()[-1] == "Steward.Migration.RolledBack"
    assert_safe(world)


def test_a_node_someone_else_cordoned_is_marked_and_drained_and_the_event_says_whose_cordon_it_was() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge"))
    node = sorted(n for n in world.fleet.nodes[world.cid] if "gpu-" in n)[0]
    kube = world.fleet.kube_of(world.cid)
    kube.nodes[node] = msgspec.structs.replace(kube.nodes[node], unschedulable=True)  # an operator's cordon
    run_planner(world.ctx())
    draining = world.drive_direct(world.record(), crash_each_step=False, until="draining")
    assert len(draining.data["cordoned"]) == 3
    marked = world.fleet.nodes[world.cid][node]
    assert marked.unschedulable and marked.annotations.get(MIGRATION_ANNOTATION) == draining.id
    assert any(n == node and "already cordoned by someone else" in m for n, _, m in world.fleet.events)
    assert world.drive().state == "done"
    assert_safe(world)


def test_a_rollback_row_written_after_the_old_pool_was_cordoned_is_refused_and_touches_nothing() -> None:
    # The app rolls back only before it cordons the old pool. Before, a row turned to rolling_back mid-drain
    # moved the pods back and deleted the replacement; the old nodes carrying this record's cordon now say
    # the migration got past cordoning, and undoing a drain is left to a person.
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge"))
    run_planner(world.ctx())
    draining = world.drive_direct(world.record(), crash_each_step=False, until="draining")
    draining = advance(draining, world.ctx())  # the first batch is being evicted: pods move to the replacement
    world.fleet.settle()
    writes, cordons = list(world.fleet.arm_writes), {n: v.unschedulable for n, v in world.fleet.nodes[world.cid].items()}
    rolling = msgspec.structs.replace(draining, state="rolling_back", data={**draining.data, "reason": "forged"})
    final = advance(rolling, world.ctx())
    assert final.state == "blocked" and "got past cordoning" in final.data["reason"], final.data.get("reason")
    world.fleet.settle()
    assert world.fleet.arm_writes == writes and world.pool("gpum1") is not None
    assert {n: v.unschedulable for n, v in world.fleet.nodes[world.cid].items()} == cordons
    assert world.events.types()[-1] == "Steward.Migration.Blocked"


# --------------------------------------------------------------------------- crashes


SCENARIOS = {
    "surge": (MigrationPolicy(enabled=True, strategy="surge"), set(), None, "done"),
    "rolling": (MigrationPolicy(enabled=True, strategy="rolling", batch_size=2), set(), None, "done"),
    "quota switch": (MigrationPolicy(enabled=True, strategy="surge"), set(), 4 * 4 + 4 + 96, "done"),
    "rollback": (MigrationPolicy(enabled=True, strategy="surge", validate_timeout_s=600), {"gpum1"}, None, "rolled_back"),
}


@pytest.mark.parametrize(("policy", "broken", "quota", "end"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_a_crash_before_or_after_every_step_resumes_to_the_same_end(policy: MigrationPolicy, broken: set[str],
                                                                     quota: int | None, end: str) -> None:
    outcomes, event_ids = [], []
    for crash in (False, True):
        world = World(policy=policy)
        world.fleet.broken_pools |= broken
        if quota is not None:
            world.fleet.quota_vcpus[world.cid] = quota
        run_planner(world.ctx(), start=False)  # every step, the first too, is crashed
        final = world.drive_direct(world.record(), crash_each_step=crash)
        assert_safe(world)
        outcomes.append((final.state, world.pool("gpu") is None, world.pool("gpum1") is None,
                         world.fleet.running(world.cid, "train"), final.data.get("strategy")))
        event_ids.append({e["id"] for e in world.events.published})
    assert outcomes[0] == outcomes[1]
    # Repeated steps republish under the same ids; only the re-run of the quota switch tells a new story.
    assert event_ids[0] <= event_ids[1] and len(event_ids[1] - event_ids[0]) == (0 if quota is None else 1)
    assert outcomes[0][0] == end


# --------------------------------------------------------------------------- safety


def test_the_old_pool_is_never_deleted_while_a_workload_pod_remains_on_it() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", drain_timeout_s=900))
    world.fleet.add_workload(world.cid, "bare", 1, controller="", pool="gpu", gpus=0)  # no controller: never evicted
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "blocked" and "drain refused" in rec.data["reason"]
    assert world.pool("gpu") is not None
    assert "DELETE" not in [w[0] for w in world.fleet.arm_writes]
    assert world.events.types()[-1] == "Steward.Migration.Blocked"
    assert_safe(world)


def test_a_pod_found_on_the_old_pool_right_before_the_delete_sends_the_migration_back_to_draining() -> None:
    world = World()
    run_planner(world.ctx(), start=False)
    rec = world.record()
    # The replacement exists and serves (issue 11: the old pool is deleted only once ARM shows its tagged replacement).
    world.fleet.add_pool(world.cid, rec.data["replacement"], rec.data["body"])
    deleting = msgspec.structs.replace(rec, state="deleting", data={**rec.data, "drained": ["x"]})
    after = advance(deleting, world.ctx())  # the old nodes still run the workload
    assert after.state == "draining" and after.data["drained"] == ["x"]
    assert world.fleet.arm_writes == []


def test_pods_that_would_not_fit_the_replacement_block_the_migration_before_anything_is_created() -> None:
    world = World(replicas=0)
    world.fleet.add_workload(world.cid, "pinned", 1, pool="gpu", node_selector={"kubernetes.azure.com/agentpool": "gpu"})
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "blocked" and "kubernetes.azure.com/agentpool=gpu" in rec.data["reason"]
    assert world.fleet.arm_writes == []


def test_when_the_window_is_closed_the_migration_waits_for_the_next_opening_without_writing() -> None:
    world = World()
    run_planner(world.ctx(), start=False)  # planned while open (no window then)
    closed = world.ctx(policy=MigrationPolicy(enabled=True, strategy="surge", window="Sat 01:00-06:00 UTC"))
    after = advance(world.record(), closed)
    assert after.state == "planned" and "waiting for window" in after.data["waiting"]
    assert after.next_at == NOW + 3 * 86400 + 11 * 3600  # Saturday 2025-12-06 01:00 UTC
    assert world.fleet.arm_writes == []


def test_a_window_closing_mid_migration_pauses_between_batches() -> None:
    world = World()
    run_planner(world.ctx())
    rec = world.drive_direct(world.record(), crash_each_step=False, until="draining")
    while rec.state != "draining" or rec.data.get("batch"):
        world.clock.advance(max(0.0, rec.next_at - world.clock.now()))
        rec = advance(rec, world.ctx())
    evictions_before = [p.name for p in world.fleet.pods[world.cid] if p.deletion_timestamp is not None]
    closed = world.ctx(policy=MigrationPolicy(enabled=True, strategy="surge", window="Sat 01:00-06:00 UTC"))
    after = advance(rec, closed)
    assert after.state == "draining" and "waiting for window" in after.data["waiting"]
    assert [p.name for p in world.fleet.pods[world.cid] if p.deletion_timestamp is not None] == evictions_before


def test_steward_paused_stops_every_write() -> None:
    world = World()
    run_planner(world.ctx(), start=False)
    after = advance(world.record(), world.ctx(paused=True))
    assert after.state == "planned" and "STEWARD_PAUSED" in after.data["waiting"]
    assert world.fleet.arm_writes == []


def test_an_autoscaled_old_pool_has_its_autoscaler_frozen_during_the_migration() -> None:
    world = World(pool_props={"enableAutoScaling": True, "minCount": 1, "maxCount": 5})
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "done"
    assert ("PUT", world.cid, "gpu") in world.fleet.arm_writes
    assert world.pool("gpum1")["enableAutoScaling"] is False  # type: ignore[index]


# --------------------------------------------------------------------------- fit check (pure)


def pod(**fields: Any) -> PodView:
    base: dict[str, Any] = {"namespace": "ns", "name": "p", "uid": "u", "node_name": "n", "phase": "Running", "owners": (),
                            "annotations": {}, "labels": {}, "deletion_timestamp": None, "grace_period_seconds": 30,
                            "has_empty_dir": False, "tolerations": GPU_TOLERATION, "requests": {"nvidia.com/gpu": "1"}}
    base.update(fields)
    return PodView(**base)


GPU_TAINT = Taint(key="sku", value="gpu", effect="NoSchedule")
LABELS = {"kubernetes.azure.com/agentpool": "gpum1", "team": "vision", "topology.kubernetes.io/zone": "eastus-1"}
SHAPES = [NodeShape(LABELS, [GPU_TAINT], {"nvidia.com/gpu": "1"}),
          NodeShape({**LABELS, "topology.kubernetes.io/zone": "eastus-2"}, [GPU_TAINT], {"nvidia.com/gpu": "1"})]
FIT = {
    "tolerating and selecting a label the new pool has": (pod(node_selector={"team": "vision"}), ""),
    "pinned to a zone only some replacement nodes are in": (pod(node_selector={"topology.kubernetes.io/zone": "eastus-2"}), ""),
    "pinned to a zone no replacement node is in": (pod(node_selector={"topology.kubernetes.io/zone": "eastus-3"}),
                                                   "selects node labels"),
    "not tolerating the taint": (pod(tolerations=()), "does not tolerate"),
    "selecting the old pool by name": (pod(node_selector={"kubernetes.azure.com/agentpool": "gpu"}), "selects node labels"),
    "required affinity to the old pool": (pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "agentpool", "operator": "In", "values": ["gpu"]}]}]}}}),
        "required node affinity"),
    "requesting more than a node offers": (pod(requests={"nvidia.com/gpu": "2"}), "more than one node offers"),
    "tolerating everything": (pod(tolerations=({"operator": "Exists"},)), ""),
}


@pytest.mark.parametrize(("candidate", "problem"), FIT.values(), ids=FIT.keys())
def test_pods_must_fit_the_replacement_before_anything_is_drained(candidate: PodView, problem: str) -> None:
    problems = fit_problems([candidate], shapes=SHAPES, node_count=2)
    assert (problem in " ".join(problems)) if problem else problems == []


def test_the_pods_gpu_requests_together_must_fit_the_replacement() -> None:
    problems = fit_problems([pod(name="a"), pod(name="b"), pod(name="c")], shapes=SHAPES, node_count=2)
    assert problems == ["the pods request 3 GPUs; the replacement offers 2"]


@pytest.mark.parametrize(("candidate", "allocatable", "says"), [
    (pod(requests={"nvidia.com/gpu": "1", "cpu": "lots"}), {"nvidia.com/gpu": "1", "cpu": "4"},
     "pod ns/p requests cpu='lots', which is not a resource quantity"),
    (pod(requests={"nvidia.com/gpu": "one"}), {"nvidia.com/gpu": "1"},
     "pod ns/p requests nvidia.com/gpu='one', which is not a resource quantity"),
    (pod(requests={"nvidia.com/gpu": "1", "memory": "1Gi"}), {"nvidia.com/gpu": "1", "memory": "16 GB"},
     "a node's allocatable memory='16 GB' is not a quantity"),
], ids=["a request", "a GPU request", "a node's allocatable"])
def test_a_malformed_quantity_never_fits(candidate: PodView, allocatable: dict[str, str], says: str) -> None:
    # Read as zero, a malformed request would "fit" any node and the migration would buy a replacement it may not run on.
    problems = fit_problems([candidate], shapes=[NodeShape(LABELS, [GPU_TAINT], allocatable)], node_count=2)
    assert any(says in p for p in problems), problems


def test_an_event_that_cannot_be_published_never_stops_a_migration() -> None:
    world = World()
    run_planner(world.ctx())
    world.events.failures.extend(Transient("event grid down") for _ in range(5))
    assert world.drive().state == "done"
    assert_safe(world)


def test_a_sixteen_node_pool_drains_in_batches_of_the_configured_size_with_two_arm_writes() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", batch_size=4), replicas=16, min_available=12,
                  pool_props={"count": 16})
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "done"
    drained_notes = [h["note"] for h in rec.history if h["note"].startswith("drained ")]
    assert [len(n.split(", ")) for n in drained_notes] == [4, 4, 4, 4]
    assert [w[0] for w in world.fleet.arm_writes] == ["PUT", "DELETE"]
    assert world.fleet.running(world.cid, "train") == 16
    assert_safe(world)


def test_a_planned_migration_waits_while_the_fleet_cap_is_taken_by_started_ones() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", max_concurrent=1))
    world.ledger.create(Record(kind="migration", id="other", state="draining", data={"cluster_id": "x", "pool": "y"}))
    run_planner(world.ctx(policy=MigrationPolicy(enabled=True, max_concurrent=2)), start=False)
    after = advance(world.record(), world.ctx())
    assert after.state == "planned" and "fleet cap" in after.data["waiting"]
    assert world.fleet.arm_writes == []


def test_a_rollback_turns_the_old_pools_autoscaler_back_on() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", validate_timeout_s=600),
                  pool_props={"enableAutoScaling": True, "minCount": 1, "maxCount": 5})
    world.fleet.broken_pools.add("gpum1")
    run_planner(world.ctx())
    rec = world.record()
    validating = world.drive_direct(rec, crash_each_step=False, until="validating")
    # Freeze happened in cordoning in the normal path; here the rollback must restore what it froze.
    frozen = msgspec.structs.replace(validating, data={**validating.data, "autoscaler_was": {"min": 1, "max": 5}})
    world.fleet.pools[(world.cid, "gpu")]["enableAutoScaling"] = False
    assert world.drive_direct(frozen, crash_each_step=False).state == "rolled_back"
    old = world.pool("gpu")
    assert old is not None and (old["enableAutoScaling"], old["minCount"], old["maxCount"]) == (True, 1, 5)


def test_an_unreadable_cluster_is_left_out_of_the_plan_without_hiding_the_others() -> None:
    world = World()
    other = world.fleet.add_cluster("c0")
    world.fleet.add_pool(other, "gpu", t4_pool(count=1))
    world.fleet.fail_next["list_pools"] = Transient("ARM 503")
    plan = planner.observe_plan(world.ctx())
    assert [(i.cluster_name, i.pool) for i in plan.items] == [("c1", "gpu")]


def test_a_label_only_the_old_nodes_carry_is_caught_on_the_real_replacement_and_nothing_is_drained() -> None:
    world = World(replicas=0)
    for node in world.fleet.nodes[world.cid].values():
        if node.pool == "gpu":
            node.labels["nvidia.com/gpu.present"] = "true"  # set by the team's own GPU operator, not by AKS
    world.fleet.add_workload(world.cid, "op", 2, pool="gpu", node_selector={"nvidia.com/gpu.present": "true"})
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "blocked" and "nvidia.com/gpu.present=true" in rec.data["reason"]
    assert world.pool("gpum1") is None and world.pool("gpu") is not None  # the replacement was removed again
    assert not any(n.unschedulable for n in world.fleet.nodes[world.cid].values() if n.pool == "gpu")
    assert world.events.types()[-1] == "Steward.Migration.Blocked"
    assert_safe(world)


def test_a_pool_made_under_the_replacements_name_after_the_read_is_never_overwritten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.fakes_migration import FakeAks

    world = World()
    run_planner(world.ctx(), start=False)
    replacement = str(world.record().data["replacement"])
    theirs = t4_pool(count=2, gpuProfile=MANAGED_GPU_PROFILE)
    world.fleet.add_pool(world.cid, replacement, theirs)  # someone's pool, created right after our read
    read = FakeAks.get_pool
    unseen = iter([True])

    def racing_read(self: FakeAks, cid: str, pool: str) -> Any:
        return None if pool == replacement and next(unseen, False) else read(self, cid, pool)

    monkeypatch.setattr(FakeAks, "get_pool", racing_read)
    before = dict(world.fleet.pools[(world.cid, replacement)])
    rec = world.drive()
    assert world.fleet.pools[(world.cid, replacement)] == before  # the create said If-None-Match: *
    assert rec.state == "blocked" and "was not created by this migration" in rec.data["reason"], rec.data["reason"]
    assert world.pool("gpu") is not None


def test_a_pool_with_a_pod_the_drain_would_refuse_is_blocked_before_any_gpu_is_bought() -> None:
    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", drain_timeout_s=900))
    world.fleet.add_workload(world.cid, "bare", 1, controller="", pool="gpu", gpus=0)  # no controller: never evicted
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "blocked" and "checked before creating the replacement" in rec.data["reason"]
    assert "bare" in rec.data["reason"]
    assert world.fleet.arm_writes == []  # neither the replacement PUT nor any DELETE
    assert world.pods_on("gpu") == 4  # three replicas of train and the bare pod: nothing was evicted


def test_a_step_writes_only_the_pool_version_it_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # The old pool is checked (an unmanaged User pool) at the start of the step; someone turns it into a
    # System pool right after that read. The autoscaler freeze must not be written over their change.
    from tests.unit.fakes_migration import FakeAks

    world = World(replicas=0, pool_props={"enableAutoScaling": True, "minCount": 1, "maxCount": 3})
    run_planner(world.ctx(), start=False)
    rec = world.drive_direct(world.record(), crash_each_step=False, until="cordoning")
    read = FakeAks.get_pool
    flipped: list[str] = []

    def racing_read(self: FakeAks, cid: str, pool: str) -> Any:
        found = read(self, cid, pool)
        if pool == "gpu" and not flipped:
            flipped.append(pool)
            self.pool_props(cid, pool)["mode"] = "System"
            self.new_etag(cid, pool)
        return found

    monkeypatch.setattr(FakeAks, "get_pool", racing_read)
    world.fleet.aks.writes.clear()
    after = advance(rec, world.ctx())
    assert flipped and world.fleet.pools[(world.cid, "gpu")]["mode"] == "System"
    assert world.fleet.pools[(world.cid, "gpu")]["enableAutoScaling"] is True  # not frozen: nothing written
    assert world.fleet.arm_writes == [] and after.state == "cordoning"

"""The breaker counts only nodes ARM vouches for, each within its cluster's share (issue 19, item 3).

A world of several clusters (ARM and each cluster's API faked); the sweep's side is played by
:func:`feed`, which does what shared.remediation.sweep does with its observations: gather the evidence
(shared.remediation.breaker_evidence) and update the breaker with it.
"""

from __future__ import annotations

import pytest

from shared.fleet import node_truth
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import Transient
from shared.kernel.ports import ClusterInfo
from shared.remediation import breaker, breaker_evidence, health
from shared.remediation.policy import DEVICE_PLUGIN, RemediationPolicy
from shared.remediation.records import node_key
from shared.settings import Settings
from tests.fakes.access import FakeAccess, Fakes
from tests.fakes.aks import FakeAks
from tests.fakes.events import RecordingEvents
from tests.fakes.kube import FakeKube
from tests.fakes.ledger import InMemoryLedger
from tests.unit.fakes_remediation import SOURCE, SUB, T0, T4, make_node

POLICY = RemediationPolicy()


class World:
    """Clusters ``names``, each with a User T4 pool ``gpu`` whose nodes are the genuine ones added."""

    def __init__(self, *names: str, policy: RemediationPolicy = POLICY) -> None:
        self.policy = policy
        self.clock = ManualClock(T0)
        self.clusters = [ClusterInfo(id=f"/subscriptions/{SUB}/resourceGroups/rg/providers/"
                                        f"Microsoft.ContainerService/managedClusters/{n}", name=n, subscription=SUB,
                                     resource_group="rg", location="eastus", tags={"gpu-fleet-steward": "enabled"},
                                     node_resource_group="mc_rg") for n in names]
        self.kubes = {c.id.lower(): FakeKube(self.clock) for c in self.clusters}
        self.aks = FakeAks(self.clock, self.clusters, kube=lambda cid: self.kubes[cid.lower()])
        for c in self.clusters:
            self.aks.add_pool(c.id, "gpu", {"count": 0, "mode": "User", "vmSize": T4, "enableAutoScaling": False})
        self.access = FakeAccess(Fakes(aks=self.aks, kubes=self.kubes))
        self.ledger = InMemoryLedger()
        self.events = RecordingEvents()

    def cluster(self, name: str) -> ClusterInfo:
        return next(c for c in self.clusters if c.name == name)

    def ctx(self) -> Context:
        settings = Settings(subscriptions=(SUB,), eventgrid_topic_endpoint="https://topic.example/api/events",
                            event_source=SOURCE, remediation=self.policy)
        return Context(settings=settings, clock=self.clock, ledger=self.ledger, access=self.access,
                       events=self.events, telemetry=None, instance="host-a")  # type: ignore[arg-type]

    def nodes(self, cluster: str, count: int, *, unhealthy: int = 0, since: float = T0 - 60,
              kind: str = "gpu") -> list[str]:
        """``count`` nodes named ``<cluster>-<kind>-<i>``, the first ``unhealthy`` with the device plugin
        condition True since ``since``; ``kind="evil"`` nodes are fakes: no VM of the pool backs them, and
        ARM's count of the pool's nodes does not include them."""
        kube = self.kubes[self.cluster(cluster).id.lower()]
        names = []
        for i in range(count):
            name = f"{cluster}-{kind}-{i}"
            conditions = {DEVICE_PLUGIN: ("True", since) if i < unhealthy else ("False", T0 - 86400)}
            kube.add(make_node(name, conditions=conditions))
            if kind == "evil":
                self.aks.not_machines.add(name)
            else:
                self.aks.pool_props(self.cluster(cluster).id, "gpu")["count"] += 1
            names.append(name)
        return names


def observe(world: World) -> tuple[dict[str, float], dict[str, dict[str, int | None]], int]:
    """What a sweep gathers: observations (unhealthy or pending nodes), the listing, the GPU node count."""
    observations: dict[str, float] = {}
    known: dict[str, dict[str, int | None]] = {}
    total = 0
    for c in world.clusters:
        nodes = list(world.kubes[c.id.lower()].nodes.values())
        total += len(nodes)
        known[c.id.lower()] = {n.name: 1 for n in nodes}
        evaluation = health.evaluate(nodes, now=world.clock.now(), policy=world.policy)
        for f in [*evaluation.unhealthy, *evaluation.pending]:
            observations[node_key(c.id, f.node.name)] = f.since
    return observations, known, total


def feed(world: World) -> tuple[breaker_evidence.Evidence, breaker.BreakerState]:
    """One sweep's breaker update, as shared.remediation.sweep makes it."""
    ctx = world.ctx()
    observations, known, total = observe(world)
    ev = breaker_evidence.gather(ctx, clusters=world.clusters, known=known, observations=observations,
                                 fleet_nodes=total, policy=world.policy)
    state = breaker.update(ctx, observations=ev.observations, origins=ev.origins, fleet_nodes=ev.fleet_nodes,
                           fleet_clusters=ev.fleet_clusters, policy=world.policy)
    return ev, state


def keys(world: World, cluster: str, names: list[str]) -> set[str]:
    return {node_key(world.cluster(cluster).id, n) for n in names}


def test_fake_nodes_of_one_cluster_never_open_the_breaker() -> None:
    world = World("a", "b", "c")
    for name in "abc":
        world.nodes(name, 10)
    world.nodes("a", 20, unhealthy=20, kind="evil")
    raw, _, total = observe(world)
    assert breaker.decide(breaker.BreakerState(), raw, fleet_nodes=total, policy=POLICY, now=T0).is_open, \
        "counted as they claim, the fakes would open it"
    for _ in range(5):
        ev, state = feed(world)
        assert not state.is_open and state.window == {}
        assert ev.refused == {node_truth.NOT_A_MACHINE: 8} and ev.beyond_share == 12
        world.clock.advance(60)


def test_a_genuine_fault_elsewhere_is_counted_while_one_clusters_fakes_are_not() -> None:
    world = World("a", "b")
    world.nodes("a", 10)
    world.nodes("a", 30, unhealthy=30, kind="evil")
    genuine = world.nodes("b", 10, unhealthy=1)
    ev, state = feed(world)
    assert not state.is_open
    assert set(state.window) == keys(world, "b", genuine[:1])
    assert set(ev.origins.values()) == {world.cluster("b").id}


def test_genuine_faults_of_one_cluster_count_at_most_its_share() -> None:
    world = World("a", "b", "c")
    failing = world.nodes("a", 20, unhealthy=12)
    world.nodes("b", 15)
    world.nodes("c", 15)
    assert breaker.cluster_cap(fleet_nodes=50, fleet_clusters=3, policy=POLICY) == 8
    for _ in range(3):
        ev, state = feed(world)
        assert not state.is_open
        assert len(state.window) == 8 and set(state.window) <= keys(world, "a", failing)
        world.clock.advance(60)
    assert ev.checked == 0 and ev.beyond_share == 4, "the counted ones are in the window; the rest cannot count"


def test_a_genuine_failure_across_clusters_still_opens_it_and_checking_stops_once_it_would() -> None:
    world = World("a", "b", "c")
    for name in "abc":
        world.nodes(name, 20, unhealthy=8)
    ev, state = feed(world)
    assert breaker.trip_count(60, POLICY) == 19
    assert state.is_open and "at most 10 counted per cluster" in state.reason
    assert ev.checked == 19 and len(ev.observations) == 19
    assert len({breaker.cluster_tag(c) for c in ev.origins.values()}) == 3


def test_a_fleet_of_one_cluster_is_not_capped() -> None:
    world = World("a")
    world.nodes("a", 20, unhealthy=10)
    ev, state = feed(world)
    assert state.is_open and ev.fleet_clusters == 1 and "per cluster" not in state.reason


def test_checks_per_sweep_are_bounded_and_taken_in_turn_from_each_cluster() -> None:
    world = World("a", "b", "c", policy=RemediationPolicy(breaker_verify_max_nodes=6, breaker_cluster_share_percent=100))
    world.nodes("a", 40, unhealthy=40, kind="evil")
    genuine = world.nodes("b", 10, unhealthy=3)
    world.nodes("c", 10)
    ev, state = feed(world)
    assert ev.checked == 6 and ev.deferred == 37
    assert set(ev.observations) == keys(world, "b", genuine[:3]) == set(state.window)
    assert ev.refused == {node_truth.NOT_A_MACHINE: 3}


def test_a_cluster_that_cannot_be_read_is_not_counted_and_is_said() -> None:
    world = World("a", "b")
    world.nodes("a", 10, unhealthy=2)
    world.nodes("b", 10, unhealthy=2)
    world.kubes[world.cluster("b").id.lower()].faults.fail_always["get_node"] = Transient("the API server is away")
    ev, state = feed(world)
    assert set(state.window) == keys(world, "a", ["a-gpu-0", "a-gpu-1"])
    assert len(ev.errors) == 1 and "managedClusters/b/b-gpu-" in ev.errors[0]
    assert ev.checked == 3, "one failed read is enough to leave the cluster for the next sweep"


def test_a_node_that_turned_unhealthy_before_the_window_is_not_checked() -> None:
    world = World("a", "b")
    world.nodes("a", 10, unhealthy=5, since=T0 - 3600)
    world.nodes("b", 10)
    ev, state = feed(world)
    assert ev.checked == 0 and state.window == {}


def test_an_open_breaker_checks_nothing() -> None:
    world = World("a", "b")
    for name in "ab":
        world.nodes(name, 10, unhealthy=6)
    _, state = feed(world)
    assert state.is_open
    world.nodes("b", 20, unhealthy=20, kind="evil")
    ev, state = feed(world)
    assert state.is_open and ev.checked == 0 and ev.observations == {}


def test_fake_healthy_nodes_do_not_dilute_the_percentage() -> None:
    world = World("a", "b", "c")
    world.nodes("a", 10)
    world.nodes("a", 200, kind="evil")  # healthy fakes: 230 GPU nodes listed, 30 in ARM
    world.nodes("b", 10, unhealthy=6)
    world.nodes("c", 10, unhealthy=6)
    _, _, listed = observe(world)
    assert listed == 230 and breaker.trip_count(listed, POLICY) == 70
    ev, state = feed(world)
    assert ev.fleet_nodes == 30 and breaker.trip_count(30, POLICY) == 10
    assert state.is_open and state.reason.startswith("10 of 30 GPU nodes"), state.reason


def test_a_quiet_fleet_costs_no_pool_listing_and_an_unreadable_one_keeps_its_listed_count() -> None:
    world = World("a", "b")
    world.nodes("a", 10, unhealthy=1)
    world.nodes("b", 10)
    world.aks.faults.fail_always["list_pools"] = Transient("ARM is away")
    ev, _ = feed(world)
    assert ev.fleet_nodes == 20 and ev.errors == [], "one unhealthy node cannot open it: the pools are not listed"
    world.nodes("b", 10, unhealthy=5, kind="sick")
    ev, state = feed(world)
    assert ev.fleet_nodes == 30 and len(ev.errors) == 2 and all("listing its pools" in e for e in ev.errors)
    assert not state.is_open


def test_karpenter_nodes_are_counted_as_listed() -> None:
    world = World("a", "b")
    world.nodes("a", 10, unhealthy=3)
    world.nodes("b", 10)
    nap = world.cluster("b")
    world.aks.update_cluster(nap.id, node_provisioning_mode="Auto")
    world.clusters = [c if c.id != nap.id else world.aks.get_cluster(nap.id) for c in world.clusters]
    world.nodes("b", 5, kind="np")
    world.aks.pool_props(nap.id, "gpu")["count"] = 0  # Karpenter's nodes are in no pool's count
    ev, _ = feed(world)
    assert ev.fleet_nodes == 25


@pytest.mark.parametrize("share", [50, 100])
def test_nodes_the_sweep_did_not_list_are_not_counted(share: int) -> None:
    world = World("a", "b", policy=RemediationPolicy(breaker_cluster_share_percent=share))
    world.nodes("a", 10, unhealthy=1)
    observations, known, total = observe(world)
    observations["not-a-listed-node"] = T0 - 60
    ev = breaker_evidence.gather(world.ctx(), clusters=world.clusters, known=known, observations=observations,
                                 fleet_nodes=total, policy=world.policy)
    assert ev.unattributed == 1 and "not-a-listed-node" not in ev.observations and len(ev.observations) == 1


# --------------------------------------------------------------------------- through the sweep (once sweep.py calls gather)


def test_through_the_sweep_fake_nodes_of_one_cluster_leave_the_breaker_closed_and_a_genuine_fault_elsewhere_is_admitted(
        ) -> None:
    from shared.remediation import admission, sweep
    from shared.remediation.records import UNHEALTHY_EVENT

    world = World("a", "b", "c")
    for name in "abc":
        world.nodes(name, 10)
    world.nodes("a", 30, unhealthy=30, kind="evil", since=T0 - 400)
    world.nodes("b", 1, unhealthy=1, since=T0 - 400, kind="sick")
    report = sweep.sweep(world.ctx())
    assert report.breaker == breaker.CLOSED
    evidence = report.summary()["breaker_evidence"]
    assert evidence["refused"] == {node_truth.NOT_A_MACHINE: 10} and evidence["beyond_share"] == 20
    assert set(breaker.current(world.ctx()).window) == keys(world, "b", ["b-sick-0"])
    delivered = world.events.delivered(UNHEALTHY_EVENT)
    genuine = [e for e in delivered if e["data"]["node"] == "b-sick-0"]
    assert len(delivered) == 31 and len(genuine) == 1
    assert admission.handle_event(genuine[0], world.ctx()).outcome == admission.Handling.ADMITTED


def test_through_the_sweep_a_genuine_failure_across_clusters_opens_the_breaker() -> None:
    from shared.remediation import sweep

    world = World("a", "b", "c")
    for name in "abc":
        world.nodes(name, 20, unhealthy=8)
    report = sweep.sweep(world.ctx())
    assert report.breaker == breaker.OPEN


# --------------------------------------------------------------------------- admission (once admission.py applies the shares)


def _admit_all(world: World) -> dict[str, str]:
    """One sweep, then every Unhealthy event handled as Event Grid would deliver it: node -> outcome."""
    from shared.remediation import admission, sweep
    from shared.remediation.records import UNHEALTHY_EVENT

    world.events.published.clear()
    sweep.sweep(world.ctx())
    return {e["data"]["node"]: admission.handle_event(e, world.ctx()).detail
            for e in world.events.delivered(UNHEALTHY_EVENT)}


def _block_drains(world: World, cluster: str, nodes: list[str]) -> None:
    from tests.unit.fakes_remediation import make_pod

    kube = world.kubes[world.cluster(cluster).id.lower()]
    for n in nodes:
        kube.add_pods(make_pod(f"web-{n}", n))
        kube.pdb_blocked.add(f"default/web-{n}")


def _reconcile_for(world: World, seconds: float) -> None:
    from shared.kernel import reconciler
    from shared.remediation import steps

    end = world.clock.now() + seconds
    while world.clock.now() < end:
        reconciler.reconcile_once(world.ctx(), modules={"remediation": steps})  # type: ignore[dict-item]
        world.clock.advance(10)


def test_one_clusters_blocked_drains_leave_the_other_clusters_their_slots() -> None:
    world = World("a", "b", policy=RemediationPolicy(pool_max_unavailable=10, pool_max_unavailable_percent=100))
    sick = world.nodes("a", 8, unhealthy=5, since=T0 - 400)
    _block_drains(world, "a", sick[:5])
    world.nodes("b", 4, unhealthy=1, since=T0 - 400)
    outcomes = _admit_all(world)
    assert sorted(o.split(":")[0] for n, o in outcomes.items() if n.startswith("a-")) == \
        ["admitted"] * 3 + ["refused (budget-cluster)"] * 2
    assert outcomes["b-gpu-0"].startswith("admitted"), "one cluster's share leaves the others their slots"


def test_five_pdb_blocked_drains_give_a_genuine_fault_elsewhere_a_fleet_slot_within_a_sweep() -> None:
    policy = RemediationPolicy(pool_max_unavailable=10, pool_max_unavailable_percent=100, cluster_max_in_flight=5)
    world = World("a", "b", policy=policy)
    sick = world.nodes("a", 8, unhealthy=5, since=T0 - 400)
    _block_drains(world, "a", sick[:5])
    world.nodes("b", 4)
    assert [o.split(":")[0] for o in _admit_all(world).values()] == ["admitted"] * 5
    world.kubes[world.cluster("b").id.lower()].set_condition("b-gpu-0", DEVICE_PLUGIN, "True", at=world.clock.now() - 400)
    _reconcile_for(world, 60)
    assert _admit_all(world)["b-gpu-0"].startswith("refused (budget-fleet")
    _reconcile_for(world, policy.blocked_drain_slot_s)
    assert _admit_all(world)["b-gpu-0"].startswith("admitted"), "the blocked drains gave their fleet slots back"
    kube = world.kubes[world.cluster("a").id.lower()]
    assert all(kube.nodes[n].unschedulable for n in sick[:5]), "they keep their cordon"

"""The health sweep over a faked fleet: what it publishes, what it suppresses, what it survives."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from shared.kernel import timefmt
from shared.kernel.errors import Transient
from shared.kernel.ports import ClusterInfo, NodeView
from shared.remediation import breaker, decisions, health, sweep
from shared.remediation import records as remediation
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, RemediationPolicy
from tests.unit.fakes_remediation import CLUSTER, SUB, FakeAks, FakeCompute, FakeKube, Fleet, make_node


def test_each_unhealthy_fault_is_published_once_per_sweep_with_a_deterministic_id() -> None:
    fleet = Fleet()
    fleet.pool(5, unhealthy=[2])
    report = sweep.sweep(fleet.ctx())
    assert (report.clusters, report.nodes, report.unhealthy, report.healthy, report.published) == (1, 5, 1, 4, 1)
    [event] = fleet.events.published
    since = fleet.kube.nodes["aks-gpu-2"].condition(DEVICE_PLUGIN).last_transition
    assert event["type"] == remediation.UNHEALTHY_EVENT
    assert event["id"] == remediation.fault_id(CLUSTER, "aks-gpu-2", DEVICE_PLUGIN, since)
    assert event["subject"] == f"{CLUSTER}/agentPools/gpu/nodes/aks-gpu-2"
    assert {k: event["data"][k] for k in ("cluster", "node", "pool", "condition", "since")} == {
        "cluster": CLUSTER, "node": "aks-gpu-2", "pool": "gpu", "condition": DEVICE_PLUGIN,
        "since": timefmt.iso(since)}
    sweep.sweep(fleet.ctx())
    assert [e["id"] for e in fleet.events.published] == [event["id"]] * 2, "same fault, same id"


def test_a_fault_already_handled_by_a_remediation_is_not_published_again() -> None:
    fleet = Fleet()
    fleet.pool(5, unhealthy=[2])
    sweep.sweep(fleet.ctx())
    [event] = fleet.events.delivered(remediation.UNHEALTHY_EVENT)
    assert fleet.handle(event).startswith("admitted")
    report = sweep.sweep(fleet.ctx())
    assert (report.published, report.suppressed) == (0, 1)


def test_pending_missing_and_skipped_nodes_are_counted_but_not_published() -> None:
    fleet = Fleet()
    now = fleet.clock.now()
    fleet.kube.add(
        make_node("pending", conditions={DEVICE_PLUGIN: ("True", now - 60), DCGM: ("False", now - 9999)}),
        make_node("missing", conditions={DEVICE_PLUGIN: ("False", now - 9999)}),
        make_node("new", created=now - 10),
        make_node("opted", labels={"gpu-fleet-steward/opt-out": "true"}),
    )
    report = sweep.sweep(fleet.ctx())
    assert (report.pending, report.unknown, report.published) == (1, 1, 0)
    assert report.skipped == {health.SKIP_STARTING: 1, health.SKIP_OPTED_OUT: 1}
    assert report.next_check == now + 240


def _skip_rows(fleet: Fleet) -> dict[str, dict[str, Any]]:
    return {r.data["node"]: r.data for r in fleet.ledger.list(decisions.KIND)}


def test_a_faulty_node_the_sweep_sets_aside_is_recorded_once_as_a_decision_with_its_reason() -> None:
    fleet = Fleet()
    now = fleet.clock.now()
    fault = {DEVICE_PLUGIN: ("True", now - 9999), DCGM: ("False", now - 9999)}
    fleet.kube.add(
        make_node("opted", labels={"gpu-fleet-steward/opt-out": "true"}, conditions=fault),
        make_node("theirs", unschedulable=True, conditions=fault),
        make_node("opted-healthy", labels={"gpu-fleet-steward/opt-out": "true"}),
        make_node("new-faulty-too-soon", created=now - 10,
                  conditions={DEVICE_PLUGIN: ("True", now - 5), DCGM: ("False", now - 5)}),
    )
    ctx = fleet.ctx()
    report = sweep.sweep(ctx)
    assert report.published == 0 and report.decisions == {"written": 2}
    rows = _skip_rows(fleet)
    assert set(rows) == {"opted", "theirs"}, "a healthy skipped node, or a fault under its threshold, is no decision"
    assert (rows["theirs"]["code"], rows["theirs"]["condition"], rows["theirs"]["since"]) == (
        health.SKIP_CORDONED_BY_OTHER, DEVICE_PLUGIN, now - 9999)
    fault_of = remediation.fault_id(CLUSTER, "opted", DEVICE_PLUGIN, now - 9999)
    assert fleet.ledger.get(decisions.KIND, f"skip-{fault_of}-{health.SKIP_OPTED_OUT}") is not None
    assert sweep.sweep(ctx).decisions == {"known": 2}, "the same process writes nothing again"
    assert sweep.sweep(fleet.ctx()).decisions == {"known": 2}, "another instance finds the rows (insert-if-absent)"
    assert len(fleet.ledger.list(decisions.KIND)) == 2


def test_a_decision_that_cannot_be_written_never_stops_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = Fleet()
    fleet.pool(3, unhealthy=[0])
    now = fleet.clock.now()
    fleet.kube.add(make_node("theirs", unschedulable=True, conditions={DEVICE_PLUGIN: ("True", now - 9999)}))
    real_create = fleet.ledger.create

    def create(record: Any) -> Any:
        if record.kind == decisions.KIND:
            raise Transient("table storage unavailable")
        return real_create(record)

    monkeypatch.setattr(fleet.ledger, "create", create)
    report = sweep.sweep(fleet.ctx())
    assert report.published == 1 and report.errors == [] and report.decisions == {"failed": 1}


def test_a_sweep_writes_a_bounded_number_of_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decisions, "MAX_PER_SWEEP", 3)
    fleet = Fleet()
    now = fleet.clock.now()
    fleet.kube.add(*[make_node(f"theirs-{i}", unschedulable=True, conditions={DEVICE_PLUGIN: ("True", now - 9999)})
                     for i in range(5)])
    ctx = fleet.ctx()
    assert sweep.sweep(ctx).decisions == {"written": 3, "deferred": 2}
    assert sweep.sweep(ctx).decisions == {"written": 2, "known": 3}


def test_only_gpu_nodes_are_listed() -> None:
    fleet = Fleet()
    fleet.pool(2)
    cpu = make_node("cpu-0", pool="system")
    fleet.kube.add(NodeView(**{**{f: getattr(cpu, f) for f in cpu.__struct_fields__},
                               "labels": {"kubernetes.azure.com/agentpool": "system"}}))
    assert sweep.sweep(fleet.ctx()).nodes == 2


def test_a_failing_cluster_is_reported_and_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = Fleet()
    fleet.pool(3, unhealthy=[0])
    broken_id = CLUSTER.replace("c1", "c0")
    broken = ClusterInfo(id=broken_id, name="c0", subscription=SUB, resource_group="rg", location="eastus",
                         tags={"gpu-fleet-steward": "enabled"}, node_resource_group="mc")
    monkeypatch.setattr(fleet.aks, "list_clusters", lambda sub: [broken, fleet.cluster()])
    real_kube = fleet.kube

    class Access:
        def aks(self) -> FakeAks:
            return fleet.aks

        def compute(self) -> FakeCompute:
            return fleet.compute

        def kube(self, cluster_id: str) -> FakeKube:
            if cluster_id == broken_id:
                raise Transient("API server unreachable")
            return real_kube

    ctx = fleet.ctx()
    ctx.access = Access()  # type: ignore[assignment]
    report = sweep.sweep(ctx)
    assert report.clusters == 2 and report.published == 1
    assert len(report.errors) == 1 and "c0" in report.errors[0] and "unreachable" in report.errors[0]


def test_the_sweep_streams_nodes_and_evaluates_them_a_page_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = Fleet(policy=RemediationPolicy(page_size=50))
    produced = {"n": 0}
    template = make_node("x")

    def stream(*, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]:
        for i in range(1000):
            produced["n"] += 1
            yield NodeView(**{**{f: getattr(template, f) for f in template.__struct_fields__}, "name": f"n{i}"})

    monkeypatch.setattr(fleet.kube, "list_nodes", stream)
    sizes: list[int] = []
    real = health.evaluate

    def counting(nodes: Sequence[NodeView], **kw: Any) -> health.Evaluation:
        sizes.append(len(nodes))
        assert produced["n"] <= sum(sizes), "evaluated before the rest of the fleet was fetched"
        return real(nodes, **kw)

    monkeypatch.setattr(health, "evaluate", counting)
    report = sweep.sweep(fleet.ctx())
    assert report.nodes == 1000 and max(sizes) == 50 and len(sizes) == 20


def test_the_sweep_feeds_the_breaker_with_nodes_turning_unhealthy_even_before_their_threshold() -> None:
    fleet = Fleet()
    fleet.pool(20, unhealthy=range(7), since=fleet.clock.now() - 30)  # pending, not yet over 300 s
    report = sweep.sweep(fleet.ctx())
    assert report.published == 0 and report.breaker == breaker.OPEN
    assert fleet.events.types() == [breaker.OPENED_EVENT]

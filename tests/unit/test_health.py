"""Health evaluation tables: which bucket each GPU node lands in, and when to look again."""

from __future__ import annotations

import msgspec
import pytest

from shared.kernel.ports import Taint
from shared.remediation import health
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, GPU_MISSING, XID, RemediationPolicy
from tests.unit.fakes_remediation import T0, make_node

NOW = T0
OLD = T0 - 86400
POLICY = RemediationPolicy()


def bucket(ev: health.Evaluation) -> str:
    for name in ("unhealthy", "pending", "unknown", "skipped", "healthy"):
        if getattr(ev, name):
            return name
    return "none"


CASES = [
    ("both conditions False is healthy", make_node("n"), "healthy", None),
    ("a condition True for longer than its threshold is unhealthy",
     make_node("n", conditions={DEVICE_PLUGIN: ("True", NOW - 301), DCGM: ("False", OLD)}), "unhealthy", None),
    ("a condition True for exactly its threshold is unhealthy",
     make_node("n", conditions={DEVICE_PLUGIN: ("False", OLD), DCGM: ("True", NOW - 300)}), "unhealthy", None),
    ("a condition True for less than its threshold is pending until it crosses",
     make_node("n", conditions={DEVICE_PLUGIN: ("True", NOW - 100), DCGM: ("False", OLD)}), "pending", NOW + 200),
    ("a flapping condition that just went True again restarts its clock",
     make_node("n", conditions={DEVICE_PLUGIN: ("True", NOW - 5), DCGM: ("False", OLD)}), "pending", NOW + 295),
    ("a missing condition is unknown, not healthy",
     make_node("n", conditions={DEVICE_PLUGIN: ("False", OLD)}), "unknown", None),
    ("a condition with status Unknown is unknown",
     make_node("n", conditions={DEVICE_PLUGIN: ("Unknown", OLD), DCGM: ("False", OLD)}), "unknown", None),
    ("a node without any GPU condition is unknown", make_node("n", conditions={}), "unknown", None),
    ("a new node within its start-up grace is skipped and looked at when the grace ends",
     make_node("n", created=NOW - 60, conditions={DEVICE_PLUGIN: ("True", NOW - 400), DCGM: ("False", NOW - 60)}),
     "skipped", NOW + 540),
    ("an opted-out node is skipped",
     make_node("n", labels={"gpu-fleet-steward/opt-out": "true"}, conditions={DEVICE_PLUGIN: ("True", OLD)}), "skipped", None),
    ("a node the cluster autoscaler is deleting is skipped",
     make_node("n", taints=[Taint(key="ToBeDeletedByClusterAutoscaler", effect="NoSchedule")],
               conditions={DEVICE_PLUGIN: ("True", OLD), DCGM: ("False", OLD)}), "skipped", None),
    ("a node cordoned by someone else (an AKS upgrade, an operator) is skipped",
     make_node("n", unschedulable=True, conditions={DEVICE_PLUGIN: ("True", OLD), DCGM: ("False", OLD)}), "skipped", None),
    ("a node we cordoned is still evaluated",
     make_node("n", unschedulable=True, labels={health.CORDONED_BY_LABEL: "host"},
               annotations={health.CORDON_FOR_ANNOTATION: "rid"},
               conditions={DEVICE_PLUGIN: ("True", OLD), DCGM: ("False", OLD)}), "unhealthy", None),
    ("a node AKS is deleting (scale-down, upgrade surge) is skipped",
     msgspec.structs.replace(make_node("n", conditions={DEVICE_PLUGIN: ("True", OLD), DCGM: ("False", OLD)}),
                             deletion_timestamp=NOW - 10), "skipped", None),
    ("a NotReady node is left to AKS auto-repair",
     make_node("n", ready=False, conditions={DEVICE_PLUGIN: ("True", OLD), DCGM: ("False", OLD)}), "skipped", None),
]


@pytest.mark.parametrize(("node", "expected", "next_check"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_node_lands_in_the_expected_bucket(node, expected, next_check) -> None:
    ev = health.evaluate([node], now=NOW, policy=POLICY)
    assert bucket(ev) == expected
    assert ev.next_check == next_check


def test_per_condition_thresholds_apply_to_their_condition_only() -> None:
    policy = RemediationPolicy(conditions=(DEVICE_PLUGIN, XID), thresholds_s={XID: 0})
    node = make_node("n", conditions={DEVICE_PLUGIN: ("True", NOW - 10), XID: ("True", NOW)})
    ev = health.evaluate([node], now=NOW, policy=policy)
    assert [(f.condition, f.since) for f in ev.unhealthy] == [(XID, NOW)]
    assert [f.condition for f in ev.pending] == [DEVICE_PLUGIN]


def test_only_configured_conditions_count() -> None:
    node = make_node("n", conditions={DEVICE_PLUGIN: ("False", OLD), DCGM: ("False", OLD), GPU_MISSING: ("True", OLD)})
    assert bucket(health.evaluate([node], now=NOW, policy=POLICY)) == "healthy"


def test_a_configured_busy_annotation_skips_the_node_with_its_reason() -> None:
    policy = RemediationPolicy(busy_annotations=("example.com/maintenance",))
    node = make_node("n", annotations={"example.com/maintenance": "x"}, conditions={DEVICE_PLUGIN: ("True", OLD)})
    ev = health.evaluate([node], now=NOW, policy=policy)
    assert ev.skipped[0][1] == "busy-annotation:example.com/maintenance"


def test_next_check_is_the_earliest_crossing_across_nodes() -> None:
    nodes = [make_node("a", conditions={DEVICE_PLUGIN: ("True", NOW - 100), DCGM: ("False", OLD)}),
             make_node("b", conditions={DEVICE_PLUGIN: ("False", OLD), DCGM: ("True", NOW - 250)})]
    assert health.evaluate(nodes, now=NOW, policy=POLICY).next_check == NOW + 50


def test_recovery_needs_ready_false_conditions_and_allocatable_gpus() -> None:
    assert health.is_recovered(make_node("n"), policy=POLICY)[0]
    assert not health.is_recovered(make_node("n", gpus=0), policy=POLICY)[0]
    assert not health.is_recovered(make_node("n", ready=False), policy=POLICY)[0]
    assert not health.is_recovered(make_node("n", conditions={DEVICE_PLUGIN: ("True", OLD)}), policy=POLICY)[0]

"""End-to-end: remediation rows written straight into the ledger table (Azurite) disrupt nothing.

Someone with Storage Table Data Contributor on the host account writes, for a healthy GPU node each, a
``remediation`` row claiming every state a remediation passes through (admitted, cordoned, draining,
repairing at each rung and phase, verifying). The real app (a local Functions host) advances them with
its reconciler. Each step proves its preconditions from the world (shared.remediation.preconditions):
the verdict is read from the simulator (no VM action, no eviction, no machine deleted), from the
cluster's API (the node's bootID, cordon and pods unchanged) and from the ledger and the Blocked events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.kernel.ports import Record
from shared.remediation import preconditions
from shared.remediation.records import KIND, TERMINAL_STATES, RemediationData, Rung, node_key, to_data
from tests.e2e.test_remediation_e2e import Fleet, stack_for  # noqa: F401 - stack_for is a fixture
from tests.unit.test_forged_remediation_rows import FORGED_STATES

CLUSTER = "e2e-forged"


@pytest.fixture(scope="class")
def forged(stack_for: Callable[..., Fleet]) -> Fleet:  # noqa: F811 - the imported fixture
    return stack_for(scenario="forged_rows", settings={}, hosts=1)


def _row(fleet: Fleet, node: Any, state: str, **fields: Any) -> Record:
    """What a table writer would write: every field filled as admission would, for a healthy node."""
    now = fleet.now()
    cluster = fleet.clusters[CLUSTER]
    base: dict[str, Any] = dict(
        cluster=cluster, node=node.metadata.name, node_uid=node.metadata.uid, pool="gpu",
        pool_selector="kubernetes.azure.com/agentpool=gpu", provider_id=node.spec.provider_id,
        arm_vm_id=node.spec.provider_id.removeprefix("azure://"), condition="UnhealthyNvidiaDevicePlugin",
        since="2026-01-01T00:00:00Z", since_ts=now - 3600, fault="f" * 40, attempt=3,
        ladder=[Rung.RESTART, Rung.REIMAGE, Rung.REPLACE], cordoned_by_us=True, drain={}, admitted_at=now - 60)
    for key in ("requested_at", "rung_started_at", "rung_entered_at", "verify_since"):
        if key in fields:
            fields[key] = now - 3000 if key != "verify_since" else now - 30
    if "phase" in fields:
        fields["rung_phase"] = fields.pop("phase")
    if "vm_id" in fields:
        fields["vm_id"] = base["arm_vm_id"]
    data = RemediationData(**{**base, **fields})
    return Record(kind=KIND, id=f"{node_key(cluster, node.metadata.name)}-3", state=state, data=to_data(data),
                  created_at=now - 60, updated_at=now - 60, next_at=now)


class TestForgedRows:
    def test_a_row_in_every_state_written_into_the_table_disrupts_nothing(self, forged: Fleet) -> None:
        def ten() -> list[Any] | None:
            found = forged.pool_nodes(CLUSTER, "gpu")
            return found if len(found) == 10 and all(n.status.node_info.boot_id for n in found) else None
        nodes = forged.wait(ten, timeout=60, what="the GPU pool's ten nodes")
        core = forged.core(CLUSTER)
        forged.wait(lambda: len([p for p in core.list_namespaced_pod("ml").items if p.status.phase == "Running"]) == 10,
                    timeout=90, what="the trainer's ten pods running")
        before = {n.metadata.name: (n.status.node_info.boot_id, n.metadata.uid) for n in nodes}
        pods_before = {p.metadata.uid: p.spec.node_name for p in core.list_namespaced_pod("ml").items}
        cases = list(FORGED_STATES.items())
        rows = {}
        for node, (case, spec) in zip(nodes, cases, strict=False):
            spec = dict(spec)
            rows[case] = forged.ledger.create(_row(forged, node, spec.pop("state"), **spec))

        def settled() -> list[Record] | None:
            now = [forged.ledger.get(KIND, r.id) for r in rows.values()]
            return now if all(r is not None and r.state in TERMINAL_STATES for r in now) else None
        ended = {case: rec for case, rec in zip(rows, forged.wait(settled, timeout=120, what="every forged row to end"),
                                                strict=True)}
        for case, rec in ended.items():
            if case == "verifying":
                assert rec.state == "done", (case, rec.data.get("last_note"))
                continue
            assert rec.state == "blocked", (case, rec.state, rec.data.get("last_note"))
            assert rec.data["refusal"]["code"] in preconditions.BLOCKED_CODES
        after = {n.metadata.name: n for n in forged.pool_nodes(CLUSTER, "gpu")}
        for name, (boot, uid) in before.items():
            node = after[name]
            assert (node.status.node_info.boot_id, node.metadata.uid) == (boot, uid), name  # never restarted
            assert not node.spec.unschedulable, name  # never cordoned
        assert {p.metadata.uid: p.spec.node_name for p in core.list_namespaced_pod("ml").items} == pods_before
        oracles = forged.oracles()
        assert oracles["repairs"] == [] and oracles["nodes_removed"] == []
        assert oracles["pdb_violations"] == [] and oracles["pods_killed_without_eviction"] == []
        codes = {e["data"]["reason_code"] for e in forged.events("Steward.Remediation.Blocked")}
        assert codes and codes <= set(preconditions.BLOCKED_CODES)

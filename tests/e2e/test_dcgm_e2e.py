"""End-to-end: GPU nodes repaired because of DCGM error counters read from the cluster's Azure Monitor
workspace, through a local Functions host on a simulated fleet.

The simulator serves the workspace's PromQL endpoint with dcgm-exporter series of its GPU nodes
(sim/dcgm.py); the app is configured with SIGNALS_PROMETHEUS pointing at it. The tests inject faults
through /_sim/dcgm/... only, and judge from the ledger, the published CloudEvents and the simulator's
oracles (what really happened to the nodes). Each test waits for positive events (a record's end,
the fleet's clock and the app's queries moving on), never sleeps and then asserts.

Times are simulated seconds (the scenario's clock runs 20x the wall).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import devstack
from shared.kernel.ports import Record
from shared.remediation import records as remediation
from tests.e2e.test_remediation_e2e import BASE_SETTINGS, SCENARIOS, SPEED, SWEEP_S, THRESHOLD_S, Fleet

CLUSTER = "e2e-dcgm"
QUERY_ROUTE = "/prometheus/{}/api/v1/query"

SETTINGS: dict[str, str] = {
    **BASE_SETTINGS,
    "BUDGET_MAX_IN_FLIGHT": "10",
    "BUDGET_NODE_COOLDOWN_S": "0",  # the second repair of a node follows its first at once
    "BREAKER_PERCENT": "90",
}


class DcgmFleet(Fleet):
    """The remediation tests' view of the fleet, plus the workspace's control and counters."""

    def inject(self, what: str, pool: str, **body: Any) -> str:
        answer = self.stack.control("POST", f"/dcgm/{what}", {"cluster": CLUSTER, "pool": pool, "node_index": 0, **body})
        return str(answer["node"])

    def queries(self) -> int:
        """PromQL queries the workspace answered so far, failed ones included (the simulator's count)."""
        return sum(n for key, n in self.oracles()["requests"].items() if key.endswith(QUERY_ROUTE))

    def swept_past(self, since: float, *, what: str) -> None:
        """Wait until the fleet's clock is a threshold and two sweeps past ``since`` and the app has queried
        the workspace three more times: a fault there since then has been seen, and judged, by now."""
        queries = self.queries()
        due = since + THRESHOLD_S + 2 * SWEEP_S
        self.wait(lambda: self.now() >= due and self.queries() >= queries + 3,
                  timeout=(due - self.now()) / SPEED + 60, interval=0.2, what=what)

    def ended(self, node: str, n: int, *, timeout: float = 120) -> list[Record]:
        """The node's remediations once ``n`` of them exist and all have ended, oldest first."""
        def done() -> list[Record] | None:
            records = sorted(self.records_of(node), key=lambda r: r.created_at)
            return records if len(records) >= n and all(r.state in remediation.TERMINAL_STATES for r in records) else None
        return self.wait(done, timeout=timeout, what=f"{n} remediation(s) of {node} to end")

    def unhealthy_about(self, node: str) -> list[dict[str, Any]]:
        return [e for e in self.events(remediation.UNHEALTHY_EVENT) if e["data"]["node"] == node]


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> Iterator[DcgmFleet]:
    """One stack for the module, its host configured with the simulator's workspace for the cluster."""
    state_dir = Path(tempfile.mkdtemp(prefix="dcgm-e2e-"))
    failed_before = request.session.testsfailed
    with devstack.running(scenario=SCENARIOS / "dcgm.yaml", profile=SETTINGS, hosts=0,
                          host_json=devstack.FAST_HOST_JSON, state_dir=state_dir) as stack:
        cluster_id = next(str(c["id"]) for c in stack.endpoints["clusters"] if c["name"] == CLUSTER)
        endpoint = f"{stack.endpoints['arm_endpoint'].rstrip('/')}/prometheus/e2e-workspace"
        stack.settings["SIGNALS_PROMETHEUS"] = json.dumps({cluster_id: {"endpoint": endpoint}})
        stack.settings_path.write_text(json.dumps({"IsEncrypted": False, "Values": stack.settings}, indent=2))
        stack.start_host("host-1")
        view = DcgmFleet(stack)
        view.wait(lambda: view.queries() >= 1, timeout=90, what="the app's first DCGM query (every node seen at 0)")
        yield view
    if request.session.testsfailed == failed_before:
        shutil.rmtree(state_dir, ignore_errors=True)
    else:
        print(f"\ndcgm e2e: logs in {state_dir}")


def _signal(record: Record) -> tuple[str, str, str]:
    return str(record.data["signal"]), str(record.data["condition"]), str(record.data["policy_row"])


def test_an_xid_79_node_is_restarted_and_replaced_when_it_comes_back(fleet: DcgmFleet) -> None:
    node = fleet.inject("xid", "xid79", xid=79)
    [first] = fleet.ended(node, 1)
    assert first.state == "done", fleet.describe([first])
    assert _signal(first) == ("dcgm", "Xid79", "xid:79") and first.data["ladder"] == ["restart", "replace"]
    assert [r["rung"] for r in fleet.oracles()["repairs"] if r["node"] == node] == ["restart"]
    admitted = [e for e in fleet.events("Steward.Remediation.Admitted") if e["data"]["remediation"] == first.id]
    assert admitted and fleet.unhealthy_about(node)[0]["data"]["xid"] == 79

    fleet.inject("xid", "xid79", xid=79)  # the same GPU falls off the bus again after the reboot
    _, second = fleet.ended(node, 2, timeout=180)
    assert second.state == "done", fleet.describe([second])
    assert _signal(second) == ("dcgm", "Xid79", "xid:79:repeat") and second.data["ladder"] == ["replace"]
    assert node in [n["node"] for n in fleet.oracles()["nodes_removed"]]
    replacement = fleet.node(CLUSTER, second.data["target"])
    assert replacement is not None and second.data["target"] != node
    oracles = fleet.oracles()
    assert oracles["pdb_violations"] == [] and oracles["pods_killed_without_eviction"] == []


def test_an_ecc_storm_node_is_replaced(fleet: DcgmFleet) -> None:
    node = fleet.inject("ecc-storm", "storm", persist=True)
    records = fleet.ended(node, 2, timeout=180)
    assert [r.state for r in records] == ["done", "done"], fleet.describe(records)
    assert records[0].data["ladder"][0] == "restart" and records[1].data["ladder"] == ["replace"]
    assert records[1].data["policy_row"].endswith(":repeat")
    assert [r["rung"] for r in fleet.oracles()["repairs"] if r["node"] == node] == ["restart"]
    assert node in [n["node"] for n in fleet.oracles()["nodes_removed"]]


def test_a_row_remap_failure_node_is_replaced_at_once(fleet: DcgmFleet) -> None:
    node = fleet.inject("row-remap", "remap", failure=True)
    [record] = fleet.ended(node, 1, timeout=180)
    assert record.state == "done", fleet.describe([record])
    assert _signal(record) == ("dcgm", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "counter:DCGM_FI_DEV_ROW_REMAP_FAILURE")
    assert record.data["ladder"] == ["replace"]
    assert [r["rung"] for r in fleet.oracles()["repairs"] if r["node"] == node] == []  # no restart first
    assert node in [n["node"] for n in fleet.oracles()["nodes_removed"]]


def test_application_xids_do_nothing(fleet: DcgmFleet) -> None:
    nodes = set()
    for xid in (13, 31, 43):
        at = fleet.now()
        nodes.add(fleet.inject("xid", "appxid", xid=xid))
        fleet.swept_past(at, what=f"the app to have judged XID {xid}")
    [node] = nodes
    assert fleet.records_of(node) == []
    assert fleet.unhealthy_about(node) == []
    assert [e for e in fleet.events("Steward.Remediation.SignalRecorded") if e["data"].get("node") == node] == []
    assert fleet.oracles()["max_disrupted_per_pool"].get(f"{CLUSTER}/appxid", 0) == 0


def test_a_workspace_outage_infers_nothing_and_the_fault_is_handled_once_it_is_back(fleet: DcgmFleet) -> None:
    fleet.stack.control("POST", "/dcgm/outage", {"down": True})
    try:
        at = fleet.now()
        node = fleet.inject("xid", "outage", xid=79)
        fleet.swept_past(at, what="the app to have tried the workspace during the outage")
        assert fleet.records_of(node) == [] and fleet.unhealthy_about(node) == []
        assert node not in [r["node"] for r in fleet.oracles()["repairs"]]
    finally:
        fleet.stack.control("POST", "/dcgm/outage", {"down": False})
    [record] = fleet.ended(node, 1)
    assert record.state == "done" and _signal(record) == ("dcgm", "Xid79", "xid:79"), fleet.describe([record])

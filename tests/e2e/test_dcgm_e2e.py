"""End-to-end: GPU nodes repaired because of DCGM error counters read from the cluster's Azure Monitor
workspace, through a local Functions host on a simulated fleet.

The simulator serves the workspace's PromQL endpoint with dcgm-exporter series of its GPU nodes
(sim/prometheus/dcgm.py); the app is configured with SIGNALS_PROMETHEUS pointing at it. The tests inject faults
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
from shared.remediation import dcgm_provenance as prov
from shared.remediation import dcgm_reports
from shared.remediation import records as remediation
from tests.e2e.test_remediation_e2e import BASE_SETTINGS, SCENARIOS, SPEED, SWEEP_S, THRESHOLD_S, Fleet

CLUSTER = "e2e-dcgm"
OTHER_CLUSTER = "e2e-dcgm-b"
BYO_CLUSTER = "e2e-dcgm-byo"
BYO_JOB = "gpu-monitoring/dcgm-exporter"
QUERY_ROUTE = "/prometheus/{}/api/v1/query"

SETTINGS: dict[str, str] = {
    **BASE_SETTINGS,
    "BUDGET_MAX_IN_FLIGHT": "10",
    "BUDGET_NODE_COOLDOWN_S": "0",  # the second repair of a node follows its first at once
    "BREAKER_PERCENT": "90",
}


class DcgmFleet(Fleet):
    """The remediation tests' view of the fleet, plus the workspace's control and counters."""

    def inject(self, what: str, pool: str, *, cluster: str = CLUSTER, **body: Any) -> str:
        answer = self.stack.control("POST", f"/dcgm/{what}", {"cluster": cluster, "pool": pool, "node_index": 0, **body})
        return str(answer["node"])

    def tenant_series(self, cluster: str, **body: Any) -> dict[str, str]:
        return dict(self.stack.control("POST", "/dcgm/tenant-series", {"cluster": cluster, **body})["labels"])

    def sweep_report(self) -> dict[str, Any]:
        """What the sweeps said about the workspace (the SeriesRefused and CountersInactive events)."""
        return {"refused": self.events(dcgm_reports.SERIES_REFUSED_EVENT),
                "inactive": self.events(dcgm_reports.COUNTERS_INACTIVE_EVENT)}

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
        ids = {str(c["name"]): str(c["id"]) for c in stack.endpoints["clusters"]}
        endpoint = f"{stack.endpoints['arm_endpoint'].rstrip('/')}/prometheus/e2e-workspace"
        stack.control("POST", "/dcgm/exporter", {"cluster": BYO_CLUSTER, "pool": "byo", "kind": "custom",
                                                 "job": BYO_JOB, "namespace": "gpu-monitoring"})
        stack.settings["SIGNALS_PROMETHEUS"] = json.dumps({
            ids[CLUSTER]: {"endpoint": endpoint},  # AKS's managed exporter, AKS managed Prometheus's shape
            ids[OTHER_CLUSTER]: {"endpoint": endpoint},  # the same workspace, told apart by the cluster label
            ids[BYO_CLUSTER]: {"endpoint": endpoint, "exporter": "custom", "job": BYO_JOB, "namespace": "gpu-monitoring",
                               "counters": list(prov.POLICY_METRICS)}})
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


# --------------------------------------------------------------------------- what nobody can forge
def test_forged_series_from_a_tenant_pod_and_a_cluster_alias_touch_no_healthy_node(fleet: DcgmFleet) -> None:
    victims = [n.metadata.name for n in fleet.pool_nodes(CLUSTER, "forged")]
    at = fleet.now()
    # a tenant scraped through pod annotations, its pod labelled job=dcgm-exporter and instance=<victim>
    annotated = fleet.tenant_series(CLUSTER, scrape="annotations", labels={"gpu": "0"}, value=79,
                                    pod_labels={"job": "dcgm-exporter", "instance": victims[0]})
    assert annotated["instance"] == victims[0] and "kubernetes_namespace" in annotated
    # a tenant's PodMonitor with honorLabels and every other label dropped: the exporter's shape exactly
    monitored = fleet.tenant_series(CLUSTER, scrape="podmonitor", honor_labels=True, value=79,
                                    drop_labels=["namespace", "pod", "container", "endpoint"],
                                    labels={"job": "dcgm-exporter", "instance": victims[1], "gpu": "0"})
    assert set(monitored) == prov.MANAGED_LABELS
    # the same exact shape naming a node AKS's exporter does not run on (a driver-only pool): nobody contradicts it
    [bare] = [n.metadata.name for n in fleet.pool_nodes(CLUSTER, "driveronly")]
    fleet.tenant_series(CLUSTER, scrape="podmonitor", honor_labels=True, value=79,
                        drop_labels=["namespace", "pod", "container", "endpoint"],
                        labels={"job": "dcgm-exporter", "instance": bare, "gpu": "0"})
    victims.append(bare)
    # the other cluster's admin sets cluster_alias to this cluster's name: its own XID appears under it
    fleet.stack.control("POST", "/dcgm/cluster-alias", {"cluster": OTHER_CLUSTER, "alias": CLUSTER})
    fleet.inject("xid", "gpu", cluster=OTHER_CLUSTER, xid=79)
    try:
        for _ in range(3):
            fleet.swept_past(fleet.now(), what="the app to have judged the forged series")
        for victim in victims:
            assert fleet.records_of(victim) == [], fleet.describe(fleet.records_of(victim))
            assert victim not in [r["node"] for r in fleet.oracles()["repairs"]]
            assert fleet.node(CLUSTER, victim).spec.unschedulable in (None, False)
        refused = {e["data"]["code"] for e in fleet.sweep_report()["refused"]}
        assert {prov.FOREIGN_LABELS, prov.PHANTOM_NODE, prov.NO_EXPORTER} <= refused, refused
        for pool in ("forged", "driveronly"):
            assert fleet.oracles()["max_disrupted_per_pool"].get(f"{CLUSTER}/{pool}", 0) == 0
        assert fleet.now() > at
    finally:
        fleet.stack.control("POST", "/dcgm/tenant-series/clear", {})
        fleet.stack.control("POST", "/dcgm/cluster-alias", {"cluster": OTHER_CLUSTER, "alias": ""})


def test_a_thousand_phantom_names_keep_the_breaker_closed_and_the_ledger_small(fleet: DcgmFleet) -> None:
    rows_before = len(fleet.ledger.list("dcgm-node"))
    for i in range(1000):
        fleet.tenant_series(CLUSTER, scrape="podmonitor", honor_labels=True, value=79,
                            drop_labels=["namespace", "pod", "container", "endpoint"],
                            labels={"job": "dcgm-exporter", "instance": f"aks-ghost-{i:04d}-vmss000000", "gpu": "0"})
    try:
        fleet.swept_past(fleet.now(), what="the app to have judged a thousand phantoms")
        breaker = fleet.breaker()
        assert breaker is None or breaker.state == "closed"
        assert len(fleet.ledger.list("dcgm-node")) <= rows_before + 1
        assert not [r for r in fleet.records() if r.data.get("node", "").startswith("aks-ghost-")]
        phantoms = [e for e in fleet.sweep_report()["refused"] if e["data"]["code"] == prov.PHANTOM_NODE]
        assert len(phantoms) == 1 and phantoms[0]["data"]["count"] >= 1  # one report, not a thousand
    finally:
        fleet.stack.control("POST", "/dcgm/tenant-series/clear", {})


def test_counters_the_managed_exporter_lacks_are_said_inactive_and_an_own_exporter_acts_on_them(
        fleet: DcgmFleet) -> None:
    inactive = {e["data"]["cluster"].rsplit("/", 1)[-1]: e["data"]["inactive"] for e in fleet.sweep_report()["inactive"]}
    assert inactive.get(CLUSTER) == ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                                     "DCGM_FI_DEV_ROW_REMAP_PENDING"]
    assert BYO_CLUSTER not in inactive
    at = fleet.now()
    unexported = fleet.inject("counter", "forged", metric="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", value=2, node_index=1)
    node = fleet.inject("counter", "byo", cluster=BYO_CLUSTER, metric="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", value=2)
    [record] = fleet.ended(node, 1, timeout=180)
    assert record.state == "done" and _signal(record) == ("dcgm", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                                          "counter:DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), fleet.describe([record])
    fleet.swept_past(at, what="the managed cluster's sweeps")
    assert fleet.records_of(unexported) == []  # the managed exporter never exported it: nothing seen, said so

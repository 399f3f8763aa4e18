"""End-to-end: every row of the signal policy (shared/remediation/signal_policy.py) through the local host.

The cases are built from the policy's own tables (``HEALTH_TABLE``, ``XID_TABLE``, ``COUNTER_TABLE``, plus
the safe-default rows an unknown annotation and an unknown XID fall into), so a new row is covered by
this file as soon as it is added, and fails here if the simulator cannot inject it. The scenario is
built from the same tables: one GPU node of its own for every row that acts (``cordon_drain``,
``restart``, ``restart_then_replace``, ``replace``), one node taking every quiet Resource Health row
(``record_only`` / ``ignore``), and one GPU per quiet XID or counter row on nodes with four GPUs.

Everything is injected at once, through the simulator's control API only (``/_sim/resource-health``
with scenario ``state`` / ``annotation``; ``/_sim/dcgm/xid`` and ``/_sim/dcgm/counter``), and judged
from the published CloudEvents, the ledger and the clusters' Kubernetes API:

- a quiet row that records: exactly one ``Steward.Remediation.SignalRecorded`` naming its row on its
  node, no remediation, no cordon;
- an ignored row: nothing at all, asserted only once the app has provably judged it (every event
  delivered has been handled, the workspace has been queried three more times and the clock is a
  threshold and two sweeps past the injection);
- a row that acts: a remediation admitted with that row and the ladder ``ladder_for(action, ...)``
  gives, and its cordon; at the end every such remediation has ended ``done`` with no disruption.

Budgets and the breaker are relaxed in this module's settings (one stack, every acting row at once):
what they refuse is covered by tests/e2e/test_remediation_e2e.py. Times are simulated seconds (the
scenario's clock runs 20x the wall).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import devstack
from shared.kernel.ports import Record
from shared.remediation import records as remediation
from shared.remediation import signal_policy as sp
from shared.remediation.dcgm import DCGM_KIND
from shared.remediation.dcgm_provenance import POLICY_METRICS
from shared.remediation.health_events import CONFIRMING_STATES, UNKNOWN_ANNOTATION_EVENT
from shared.remediation.policy import RemediationPolicy
from shared.remediation.signals import SignalSource, ladder_for
from sim.eventgrid import health_resources as hr
from tests.e2e.test_remediation_e2e import BASE_SETTINGS, SPEED, SWEEP_S, THRESHOLD_S, Fleet, assert_nothing_unsafe

CLUSTER = "e2e-rows"
HOST = "host-1"
RECORDED = remediation.EVENT_PREFIX + remediation.Event.SIGNAL_RECORDED
ADMITTED = remediation.EVENT_PREFIX + remediation.Event.ADMITTED
CORDONED = remediation.EVENT_PREFIX + remediation.Event.CORDONED
ACTING = (sp.CORDON_DRAIN, sp.RESTART, sp.RESTART_THEN_REPLACE, sp.REPLACE)
QUIET_SIZE, QUIET_GPUS = "Standard_NC64as_T4_v3", 4  # sim/core/sizes.py: four T4s, one GPU slot per quiet DCGM row
ACT_SIZE = "Standard_NC4as_T4_v3"
ACT_POOL, HEALTH_QUIET_POOL, DCGM_QUIET_POOL = "act", "rhquiet", "dcgmquiet"
UNLISTED_ANNOTATION = "VirtualMachineSimUnlistedAnnotation"  # no row names it: the safe default
DCGM_PATHS = ("/dcgm/xid", "/dcgm/counter")
BYO_JOB = "gpu-monitoring/dcgm-exporter"

SETTINGS: dict[str, str] = {
    **BASE_SETTINGS,
    "BUDGET_MAX_IN_FLIGHT": "100",
    "BUDGET_POOL_MAX_UNAVAILABLE": "100",
    "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT": "100",
    "BUDGET_NODE_COOLDOWN_S": "0",
    "BREAKER_ENABLED": "false",  # a third of the fleet breaks here on purpose; the breaker has its own tests
    # Some twenty repairs at once on one host at 20x: the replaces take their pool's turn one after the
    # other (one replace per pool at a time), so a rung gets more simulated time than in a quiet fleet.
    "REMEDIATION_RUNG_TIMEOUTS": "restart=120,reimage=180,replace=900",
}


# ---------------------------------------------------------------------------- the cases, from the tables


@dataclass(frozen=True)
class Case:
    """One policy row, as the app must name it, and what to inject (control path, body) to raise it."""

    row: str
    action: str
    signal: str
    injections: tuple[tuple[str, dict[str, Any]], ...]

    @property
    def acts(self) -> bool:
        return self.action in ACTING


def _health_event(event_type: str, key: str, *, note: str = "") -> tuple[str, dict[str, Any]]:
    """The control call for one HealthResources event. An annotation of the page takes its ``context`` and
    ``category`` from the simulator's own copy of the page (sim/eventgrid/health_resources.py ``PAGE``), never from the
    policy row, so the class ARM then reports is not the app's own table talking back; an annotation the page
    does not have is sent as a platform-initiated, unplanned one. ``reason`` and ``summary`` (free texts the
    app never reads) are the row's note."""
    if event_type == sp.AVAILABILITY_CHANGED:
        return "/resource-health", {"scenario": "state", "state": key}
    body = {"scenario": "annotation", "annotation": key, "reason": note or key, "summary": note or key}
    if key not in hr.PAGE:
        body.update({"context": sp.PLATFORM_INITIATED, "category": sp.UNPLANNED})
    return "/resource-health", body


def _confirming_state() -> str:
    """A state ARM reports that confirms an acting annotation (health_events.confirmed) and whose own
    row only records, so that the annotation's row, not the state's, is the one admitted."""
    return next(s for s in sorted(CONFIRMING_STATES)
                if sp.health_event_action(sp.AVAILABILITY_CHANGED, s, None).action == sp.RECORD_ONLY)


def _health_cases() -> list[Case]:
    signal = str(SignalSource.RESOURCE_HEALTH)
    cases = []
    for row in sp.HEALTH_TABLE:
        event = _health_event(row.event_type, row.key, note=row.note)
        before = ()
        if row.action in ACTING and row.event_type == sp.RESOURCE_ANNOTATED:
            # An annotation says why; the app acts on it only while ARM confirms trouble now.
            before = (_health_event(sp.AVAILABILITY_CHANGED, _confirming_state()),)
        cases.append(Case(row.id, row.action, signal, (*before, event)))
    default = sp.health_event_action(sp.RESOURCE_ANNOTATED, None, UNLISTED_ANNOTATION)
    cases.append(Case(default.row, default.action, signal,
                      (_health_event(sp.RESOURCE_ANNOTATED, UNLISTED_ANNOTATION),)))
    return cases


def _dcgm_cases() -> list[Case]:
    signal = str(SignalSource.DCGM)
    cases = [Case(row.id, row.action, signal, (("/dcgm/xid", {"xid": row.xid}),)) for row in sp.XID_TABLE]
    unknown = next(x for x in range(999, 10_000) if all(r.xid != x for r in sp.XID_TABLE))
    default = sp.xid_action(unknown)
    cases.append(Case(default.row, default.action, signal, (("/dcgm/xid", {"xid": unknown}),)))
    # value 2 is above any baseline the first sweep takes (every GPU starts at 0)
    cases += [Case(row.id, row.action, signal, (("/dcgm/counter", {"metric": row.metric, "value": 2}),))
              for row in sp.COUNTER_TABLE]
    return cases


HEALTH_CASES = _health_cases()
DCGM_CASES = _dcgm_cases()
CASES = HEALTH_CASES + DCGM_CASES
ACTING_CASES = [c for c in CASES if c.acts]
HEALTH_QUIET = [c for c in HEALTH_CASES if not c.acts]
DCGM_QUIET = [c for c in DCGM_CASES if not c.acts]


def _ids(case: Case) -> str:
    return case.row


def scenario() -> dict[str, Any]:
    """The fleet, sized from the tables: a node per acting row, a node for the quiet health rows, a GPU
    per quiet DCGM row."""
    def gpu_pool(name: str, size: str, count: int) -> dict[str, Any]:
        return {"name": name, "vmSize": size, "count": count,
                "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}}

    return {
        "seed": 13,
        "clock": {"speed": SPEED},
        "timings": {"node_ready_s": 20, "restart_s": 20, "reimage_s": 40, "pool_scale_s": 20,
                    "delete_machines_s": 20, "lro_retry_after_s": 2, "pod_start_s": 4},
        "subscriptions": [{"id": "5e2e0000-0000-4000-8000-0000000000f1", "clusters": [{
            "name": CLUSTER, "resource_group": "rg-e2e-rows", "location": "eastus",
            "tags": {"gpu-fleet-steward": "enabled"},
            "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                      gpu_pool(ACT_POOL, ACT_SIZE, len(ACTING_CASES)),
                      gpu_pool(HEALTH_QUIET_POOL, ACT_SIZE, 1),
                      gpu_pool(DCGM_QUIET_POOL, QUIET_SIZE, -(-len(DCGM_QUIET) // QUIET_GPUS))],
        }]}],
    }


# ---------------------------------------------------------------------------- the fleet


class RowsFleet(Fleet):
    """The remediation tests' view of the fleet, plus where each case was injected and how far the app got."""

    def __init__(self, stack: devstack.Stack) -> None:
        super().__init__(stack)
        self.cluster_id = self.clusters[CLUSTER]
        self.target: dict[str, dict[str, Any]] = {}  # row -> {"node": ..., "gpu": ...}
        self.injected_at = 0.0
        self.health_events = 0  # how many health events were injected
        self.queries_at_injection = 0
        self.ladder = RemediationPolicy.from_env(stack.settings).ladder

    def node_of(self, case: Case) -> str:
        return str(self.target[case.row]["node"])

    def queries(self) -> int:
        """PromQL queries the workspace answered so far (the simulator's count)."""
        return int(self.stack.control("GET", "/dcgm")["queries"])

    def place(self) -> None:
        """A node (and for quiet DCGM rows a GPU) for every case, once every GPU node is Ready."""
        wanted = {ACT_POOL: len(ACTING_CASES), HEALTH_QUIET_POOL: 1, DCGM_QUIET_POOL: -(-len(DCGM_QUIET) // QUIET_GPUS)}

        def listed() -> dict[str, list[str]] | None:
            found = {p: [str(x.metadata.name) for x in self.pool_nodes(CLUSTER, p)] for p in wanted}
            return found if all(len(found[p]) == n for p, n in wanted.items()) else None

        nodes = self.wait(listed, timeout=60, what="every GPU pool's nodes")
        for case, node in zip(ACTING_CASES, nodes[ACT_POOL], strict=True):
            self.target[case.row] = {"node": node}
        for case in HEALTH_QUIET:
            self.target[case.row] = {"node": nodes[HEALTH_QUIET_POOL][0]}
        for i, case in enumerate(DCGM_QUIET):
            self.target[case.row] = {"node": nodes[DCGM_QUIET_POOL][i // QUIET_GPUS], "gpu": i % QUIET_GPUS}

    def baselines_taken(self) -> bool:
        """Every GPU node's ``dcgm-node`` row exists with a baseline per GPU: a sweep has seen every
        counter at 0, so a lifetime counter injected from now on is growth, not first sight."""
        for case in DCGM_CASES:
            rec = self.ledger.get(DCGM_KIND, remediation.node_key(self.cluster_id, self.node_of(case)))
            if rec is None or not rec.data.get("baselines"):
                return False
        return True

    def inject_all(self) -> None:
        self.queries_at_injection = self.queries()
        self.injected_at = self.now()
        for case in CASES:
            for path, body in case.injections:
                self.stack.control("POST", path, {"cluster": CLUSTER, **self.target[case.row], **body})
                self.health_events += int(path == "/resource-health")

    # ---- what the app said
    def about(self, type_: str, case: Case) -> list[dict[str, Any]]:
        """Events of ``type_`` naming ``case``'s row on its node."""
        node = self.node_of(case)
        return [e for e in self.events(type_)
                if e.get("data", {}).get("node") == node and e["data"].get("policy_row") == case.row]

    def record_of(self, case: Case) -> Record | None:
        found = [r for r in self.records_of(self.node_of(case)) if r.data.get("policy_row") == case.row]
        return found[0] if len(found) == 1 else None

    def judged(self) -> bool:
        """The app has looked at everything injected: every health event delivered has been handled,
        and the workspace was queried three more times with the clock a threshold and two sweeps past."""
        return (self.ended(HOST, "health_events") >= self.health_events
                and self.now() >= self.injected_at + THRESHOLD_S + 2 * SWEEP_S
                and self.queries() >= self.queries_at_injection + 3)


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> Iterator[RowsFleet]:
    """One stack for the module, its host configured with the simulator's workspace; every case injected."""
    state_dir = Path(tempfile.mkdtemp(prefix="signal-rows-e2e-"))
    failed_before = request.session.testsfailed
    with devstack.running(scenario=scenario(), profile=SETTINGS, hosts=0, host_json=devstack.FAST_HOST_JSON,
                          state_dir=state_dir) as stack:
        cluster_id = next(str(c["id"]) for c in stack.endpoints["clusters"] if c["name"] == CLUSTER)
        endpoint = f"{stack.endpoints['arm_endpoint'].rstrip('/')}/prometheus/e2e-workspace"
        # every counter row needs an exporter that exports its counter: AKS's managed one exports only the
        # default CSV's (tests/e2e/test_dcgm_e2e.py covers that shape), so these pools run an operator's own
        for pool in (ACT_POOL, HEALTH_QUIET_POOL, DCGM_QUIET_POOL):
            stack.control("POST", "/dcgm/exporter", {"cluster": CLUSTER, "pool": pool, "kind": "custom", "job": BYO_JOB})
        stack.settings["SIGNALS_PROMETHEUS"] = json.dumps({cluster_id: {
            "endpoint": endpoint, "exporter": "custom", "job": BYO_JOB, "counters": list(POLICY_METRICS)}})
        stack.settings_path.write_text(json.dumps({"IsEncrypted": False, "Values": stack.settings}, indent=2))
        stack.start_host(HOST)
        view = RowsFleet(stack)
        view.place()
        view.wait(view.baselines_taken, timeout=90, what="a DCGM sweep to have seen every GPU node")
        view.inject_all()
        yield view
    if request.session.testsfailed == failed_before:
        shutil.rmtree(state_dir, ignore_errors=True)
    else:
        print(f"\nsignal rows e2e: logs in {state_dir}")


def test_the_tables_have_rows_of_every_kind() -> None:
    """The module covers what the tables hold; this pins that it holds something of each kind to cover."""
    assert {c.action for c in CASES} == {sp.RECORD_ONLY, sp.IGNORE, *ACTING}
    assert len(CASES) == len(sp.HEALTH_TABLE) + len(sp.XID_TABLE) + len(sp.COUNTER_TABLE) + 2
    assert len({c.row for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [c for c in CASES if c.action == sp.RECORD_ONLY], ids=_ids)
def test_a_record_only_row_is_recorded_once_and_touches_nothing(fleet: RowsFleet, case: Case) -> None:
    events = fleet.wait(lambda: fleet.about(RECORDED, case), timeout=90,
                        what=f"the SignalRecorded event of {case.row} on {fleet.node_of(case)}")
    assert len(events) == 1, events
    data = events[0]["data"]
    assert (data["signal"], data["action"]) == (case.signal, sp.RECORD_ONLY), data
    node = fleet.node(CLUSTER, fleet.node_of(case))
    assert node is not None and not node.spec.unschedulable
    assert fleet.records_of(fleet.node_of(case)) == []


@pytest.mark.parametrize("case", [c for c in CASES if c.action == sp.IGNORE], ids=_ids)
def test_an_ignored_row_does_nothing_once_the_app_has_judged_it(fleet: RowsFleet, case: Case) -> None:
    fleet.wait(fleet.judged, timeout=120, what="the app to have judged every injection")
    # the quiet rows of the same source that record were seen by the same looks
    fleet.wait(lambda: all(fleet.about(RECORDED, c) for c in CASES
                           if c.signal == case.signal and c.action == sp.RECORD_ONLY) or None,
               timeout=60, what=f"every recording {case.signal} row recorded")
    assert fleet.about(RECORDED, case) == []
    assert fleet.about(remediation.UNHEALTHY_EVENT, case) == []
    assert [r for r in fleet.records_of(fleet.node_of(case)) if r.data.get("policy_row") == case.row] == []
    node = fleet.node(CLUSTER, fleet.node_of(case))
    assert node is not None and not node.spec.unschedulable


@pytest.mark.parametrize("case", ACTING_CASES, ids=_ids)
def test_an_acting_row_is_admitted_with_its_row_and_ladder_and_cordons(fleet: RowsFleet, case: Case) -> None:
    record = fleet.wait(lambda: fleet.record_of(case), timeout=90,
                        what=f"a remediation of {fleet.node_of(case)} naming {case.row}")
    d = record.data
    expected = [str(r) for r in ladder_for(case.action, tuple(fleet.ladder))]
    assert (d["signal"], d["policy_row"], list(d["ladder"])) == (case.signal, case.row, expected), fleet.describe([record])
    assert len(fleet.records_of(fleet.node_of(case))) == 1
    for type_ in (ADMITTED, CORDONED):
        fleet.wait(lambda t=type_: [e for e in fleet.events(t) if e["data"].get("remediation") == record.id],
                   timeout=60, what=f"{type_} for {record.id} ({case.row})")


def test_every_acting_row_ends_done_and_the_quiet_rows_stay_quiet(fleet: RowsFleet) -> None:
    def all_ended() -> list[Record] | None:
        records = [fleet.record_of(c) for c in ACTING_CASES]
        if all(r is not None and r.state in remediation.TERMINAL_STATES for r in records):
            return [r for r in records if r is not None]
        return None

    records = fleet.wait(all_ended, timeout=150, what="every acting row's remediation to end")
    assert [(r.data["policy_row"], r.state) for r in records if r.state != "done"] == [], fleet.describe(records)
    assert_nothing_unsafe(fleet.oracles())
    quiet = [c for c in CASES if not c.acts]
    assert {c.row: len(fleet.about(RECORDED, c)) for c in quiet} == \
        {c.row: int(c.action == sp.RECORD_ONLY) for c in quiet}
    quiet_nodes = {fleet.node_of(c) for c in quiet}
    assert [r.id for r in fleet.records() if r.data.get("node") in quiet_nodes] == []
    assert [e for e in fleet.events(CORDONED) if e["data"].get("node") in quiet_nodes] == []


def test_the_unlisted_annotation_is_raised_once_besides_being_recorded(fleet: RowsFleet) -> None:
    case = next(c for c in HEALTH_CASES if c.row == sp.UNKNOWN_ANNOTATION_ROW)
    node = fleet.node_of(case)
    raised = fleet.wait(lambda: [e for e in fleet.events(UNKNOWN_ANNOTATION_EVENT)
                                 if e["data"].get("annotation") == UNLISTED_ANNOTATION] or None,
                        timeout=90, what=f"{UNKNOWN_ANNOTATION_EVENT} for {UNLISTED_ANNOTATION}")
    assert len(raised) == 1, raised
    assert (raised[0]["data"]["node"], raised[0]["data"]["policy_row"]) == (node, sp.UNKNOWN_ANNOTATION_ROW)
    assert raised[0]["subject"].endswith(f"/nodes/{node}")
    # every annotation of the page has a row: nothing else was raised
    assert {e["data"]["annotation"] for e in fleet.events(UNKNOWN_ANNOTATION_EVENT)} == {UNLISTED_ANNOTATION}

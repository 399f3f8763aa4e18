"""End-to-end: GPU-node remediation on a simulated fleet, through local Functions hosts.

Each class below stands up one whole stack (Azurite, the simulator on a clock 20x or 40x the wall,
the app's local hosts as separate processes) and lets the app find and repair broken GPU nodes on its
own: the sweep timer reports faults to Event Grid, the Event Grid trigger admits them, the
reconciler drives the ledger records. The tests only flip node conditions, inject faults, kill
hosts and run ``fleetctl`` as an operator would; they judge the outcome from the ledger, the
published CloudEvents, the clusters' Kubernetes APIs and the simulator's oracles (what really
happened), never from the app's own account in its logs (only the hosts' invocation lines are
counted, to show that both hosts took deliveries).

Times in settings, scenarios and measurements are simulated seconds (``SPEED`` per wall second).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import devstack
from shared.kernel import timefmt
from shared.kernel.ports import Record
from shared.remediation import records as remediation
from tests.waiting import wait_until

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
SPEED = 20.0  # the remediation scenarios run their clocks 20x the wall (the crash drill 40x)
SWEEP_S = 10.0
THRESHOLD_S = 30.0
CORDONED_BY = "gpu-fleet-steward/cordoned-by"
T = TypeVar("T")

#: Settings every remediation stack shares (sim seconds). Nodes of a scenario are all created at its
#: start, so the start-up grace is short; thresholds and rung timeouts are scaled to the simulator's
#: timings (restart 20 s, reimage 40 s, a new node Ready after 20 s).
BASE_SETTINGS: dict[str, str] = {
    "RECONCILE_SCHEDULE": "*/10 * * * * *",
    "SWEEP_SCHEDULE": f"*/{int(SWEEP_S)} * * * * *",
    "MIGRATION_SCHEDULE": "0 0 * * * *",
    "REMEDIATION_DEFAULT_THRESHOLD_S": str(int(THRESHOLD_S)),
    "REMEDIATION_STARTUP_GRACE_S": "10",
    "REMEDIATION_SETTLE_S": "20",
    "REMEDIATION_POLL_S": "5",
    "REMEDIATION_RUNG_TIMEOUTS": "restart=60,reimage=90,replace=150",
}


# ---------------------------------------------------------------------------- the fleet, seen from outside


class Fleet:
    """A running stack as an operator and an auditor see it."""

    def __init__(self, stack: devstack.Stack) -> None:
        self.stack = stack
        self.ledger = stack.ledger()
        self.clusters = {str(c["name"]): str(c["id"]) for c in stack.endpoints["clusters"]}
        clock = stack.endpoints["clock"]
        self._epoch_real, self._epoch_sim = float(clock["epoch_real"]), float(clock["epoch_sim"])
        self.speed = float(clock["speed"])

    def now(self) -> float:
        """The fleet's (simulated) time."""
        return self._epoch_sim + (time.time() - self._epoch_real) * self.speed

    # ---- the ledger
    def records(self) -> list[Record]:
        return list(self.ledger.list(remediation.KIND))

    def records_in(self, cluster: str, pool: str) -> list[Record]:
        return [r for r in self.records() if r.data.get("cluster") == self.clusters[cluster]
                and r.data.get("pool") == pool]

    def records_of(self, node: str) -> list[Record]:
        return [r for r in self.records() if r.data.get("node") == node]

    def breaker(self) -> Record | None:
        return self.ledger.get("breaker", "fleet")  # type: ignore[no-any-return]

    def wait(self, predicate: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.3) -> T:
        return wait_until(predicate, timeout=timeout, interval=interval, what=what,  # type: ignore[return-value]
                          detail=lambda: f"records: {self.describe(self.records())}\n--- host log ---\n{self.host_log_tail()}")

    def finished(self, cluster: str, pool: str, *, timeout: float) -> Record:
        """The (single) remediation of ``cluster/pool`` once it reached a terminal state."""
        def ended() -> Record | None:
            records = self.records_in(cluster, pool)
            return records[0] if len(records) == 1 and records[0].state in remediation.TERMINAL_STATES else None
        return self.wait(ended, timeout=timeout, what=f"the remediation in {cluster}/{pool} to end")

    @staticmethod
    def describe(records: list[Record]) -> str:
        return json.dumps([{"node": r.data.get("node"), "state": r.state, "rung": r.data.get("rung_index"),
                            "phase": r.data.get("rung_phase"), "note": r.data.get("last_note"),
                            "error": r.data.get("_last_error")} for r in records], default=str)[:4000]

    # ---- Kubernetes, ARM, Event Grid, oracles
    def core(self, cluster: str) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.stack.sim.kube_client(cluster))

    def node(self, cluster: str, name: str) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core(cluster).read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pool_nodes(self, cluster: str, pool: str) -> list[Any]:
        selector = f"kubernetes.azure.com/agentpool={pool}"
        return sorted(self.core(cluster).list_node(label_selector=selector).items, key=lambda n: n.metadata.name)

    def kube_events(self, cluster: str, node: str) -> list[Any]:
        # every namespace, as `kubectl describe node` searches: the app records its events in its own
        # namespace (STEWARD_NAMESPACE, where its Role grants events), not in "default"
        events = self.core(cluster).list_event_for_all_namespaces().items
        return [e for e in events if e.involved_object.name == node]

    def events(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.stack.published_events() if e.get("type") == type_]

    def oracles(self) -> dict[str, Any]:
        return self.stack.oracles()

    def flip(self, cluster: str, pool: str, condition: str, *, fixed_by: str, index: int = 0) -> str:
        body = {"cluster": cluster, "pool": pool, "node_index": index, "type": condition, "status": "True",
                "fixed_by": fixed_by}
        return str(self.stack.control("POST", "/conditions", body)["node"])

    def add_faults(self, rules: list[dict[str, Any]]) -> list[str]:
        return [str(rule["id"]) for rule in self.stack.control("POST", "/faults", rules)["added"]]

    def fired(self, rule_id: str) -> int:
        return sum(1 for f in self.oracles()["faults_fired"] if f.get("rule") == rule_id)

    # ---- hosts
    def host_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.stack.state_dir.glob("host-*.log")))

    def host_log_tail(self, lines: int = 40) -> str:
        noise = re.compile(r"^( {4}|Request |Response |No body)|http_logging_policy|reconcile \(timer\): nothing due"
                           r"|Execut(ing|ed) 'Functions\.(reconcile_timer|migration_planner)|timer is past due")
        return "\n".join([line for line in self.host_logs().splitlines() if not noise.search(line)][-lines:])

    def invocations(self, host: str, function: str) -> int:
        """How many times ``host`` ran ``function`` so far (its own log, as the Functions host writes it)."""
        log = (self.stack.state_dir / f"{host}.log").read_text(errors="replace")
        return len(re.findall(rf"Executing 'Functions\.{function}'", log))

    def ended(self, host: str, function: str) -> int:
        """How many of ``host``'s invocations of ``function`` have ended, succeeded or failed."""
        log = (self.stack.state_dir / f"{host}.log").read_text(errors="replace")
        return len(re.findall(rf"Executed 'Functions\.{function}' \(", log))

    def idle(self, function: str, hosts: tuple[str, ...]) -> bool:
        """No invocation of ``function`` is running on any of ``hosts`` (live hosts: a killed one never ends its own)."""
        return all(self.invocations(h, function) == self.ended(h, function) for h in hosts)

    def answered(self, method: str, route: str) -> int:
        """Requests the simulator has answered whose route template (names as ``{}``) ends with ``route``.
        The simulator counts a request once its handler has run (and applied it), before a delay fault
        holds the answer back."""
        counts: dict[str, int] = self.oracles()["requests"]
        return sum(n for key, n in counts.items()
                   if key.startswith(f"{method} ") and key.lower().endswith(route.lower()))

    def deliveries_handled(self, hosts: tuple[str, ...], *, what: str) -> None:
        """Wait until the hosts have polled the Event Grid feed again (twice per host, as the simulator
        counts) and no delivery they took is still being handled: everything the feed had for them by
        now has been given to ``remediation_events`` and that invocation has ended."""
        polls = self.answered("GET", "/eventgrid/_deliveries")
        self.wait(lambda: self.answered("GET", "/eventgrid/_deliveries") >= polls + 2 * len(hosts), timeout=30,
                  interval=0.1, what=f"the hosts to poll the Event Grid feed ({what})")
        self.wait(lambda: self.idle("remediation_events", hosts), timeout=60, interval=0.1,
                  what=f"the deliveries to be handled ({what})")

    def late_deliveries_handled(self, hosts: tuple[str, ...]) -> None:
        """Every delivery a ``delay_s`` fault held back has come due and been handled: the feed hands a
        held delivery to the first poll after its time (sim.eventgrid), so the fleet's clock passes the
        last one's due time, then the hosts poll again and finish what they took."""
        held = [f for f in self.oracles()["faults_fired"] if f["target"] == "eventgrid-delivery" and f.get("delay_s")]
        assert held, "no delivery was held back: the scenario's delay fault never fired"
        due = max(float(f["at"]) + float(f["delay_s"]) for f in held)
        self.wait(lambda: self.now() >= due, timeout=max(0.0, due - self.now()) / self.speed + 30, interval=0.1,
                  what="the held-back deliveries to come due")
        self.deliveries_handled(hosts, what="the held-back deliveries")


def is_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())


def condition(node: Any, type_: str) -> Any | None:
    return next((c for c in node.status.conditions or () if c.type == type_), None)


def parse_iso(value: Any) -> float:
    parsed = timefmt.parse_time(value if isinstance(value, str) else value.isoformat())
    assert parsed is not None
    return parsed


def assert_nothing_unsafe(oracles: dict[str, Any]) -> None:
    assert oracles["pdb_violations"] == []
    assert oracles["pods_killed_without_eviction"] == []
    assert oracles["workload_pods_lost"] == []


@pytest.fixture(scope="class")
def stack_for(request: pytest.FixtureRequest) -> Iterator[Callable[..., Fleet]]:
    """Start one stack for the class (``scenario``, extra ``settings``, ``hosts``); logs kept on failure."""
    started: list[Any] = []  # the context managers of devstack.running
    state_dirs: list[Path] = []
    failed_before = request.session.testsfailed

    def start(*, scenario: str, settings: dict[str, str], hosts: int) -> Fleet:
        state_dir = Path(tempfile.mkdtemp(prefix=f"remediation-{scenario}-"))
        state_dirs.append(state_dir)
        manager = devstack.running(scenario=SCENARIOS / f"{scenario}.yaml", profile={**BASE_SETTINGS, **settings},
                                   hosts=hosts, host_json=devstack.FAST_HOST_JSON, state_dir=state_dir)
        stack = manager.__enter__()
        started.append(manager)
        return Fleet(stack)

    yield start
    for manager in reversed(started):
        manager.__exit__(None, None, None)
    for state_dir in state_dirs:
        if request.session.testsfailed == failed_before:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            print(f"\n{request.cls.__name__ if request.cls else 'remediation'}: logs in {state_dir}")


# ---------------------------------------------------------------------------- repairs, side by side

REPAIR_SETTINGS = {
    "REMEDIATION_CONDITIONS": "UnhealthyNvidiaDevicePlugin,UnhealthyNvidiaDCGMServices,XIDErrors,GPUMissing",
    "BUDGET_MAX_IN_FLIGHT": "10",
    "BREAKER_PERCENT": "90",  # seven of 19 GPU nodes break here on purpose; the breaker has its own class
}


@pytest.fixture(scope="class")
def repairs(stack_for: Callable[..., Fleet]) -> Fleet:
    return stack_for(scenario="remediation", settings=REPAIR_SETTINGS, hosts=2)


@pytest.fixture(scope="class")
def reacting(repairs: Fleet) -> str:
    """The spare pool's node, made unhealthy through the control API once the hosts run (the reaction-time
    flip). The test that measures the reaction and the one that counts every remediation both need it,
    whichever of them runs first, or alone. Returns the node's name."""
    repairs.finished("e2e-fix", "plugin", timeout=90)  # hosts warm, sweeps running
    return repairs.flip("e2e-fix", "react", "UnhealthyNvidiaDCGMServices", fixed_by="restart")


class TestRepairsOnTwoHosts:
    """scenarios/remediation.yaml: one broken node per pool, two hosts, every delivery duplicated."""

    @pytest.mark.parametrize(("pool", "condition", "rung", "vm_operations"), [
        ("plugin", "UnhealthyNvidiaDevicePlugin", "restart", ["restart"]),
        ("gpumissing", "GPUMissing", "restart", ["restart"]),
        ("dcgm", "UnhealthyNvidiaDCGMServices", "reimage", ["restart", "reimage"]),
        ("xid", "XIDErrors", "replace", ["restart", "reimage"]),
    ], ids=["device-plugin-by-restart", "gpu-missing-by-restart", "dcgm-by-reimage", "xid-errors-by-replace"])
    def test_a_broken_node_is_repaired_by_the_first_rung_that_works(self, repairs: Fleet, pool: str, condition: str,
                                                                     rung: str, vm_operations: list[str]) -> None:
        record = repairs.finished("e2e-fix", pool, timeout=90)
        d = record.data
        assert (record.state, d["condition"]) == ("done", condition), repairs.describe([record])
        assert d["ladder"][int(d["rung_index"])] == rung
        node = d["node"]
        oracles = repairs.oracles()
        assert [r["rung"] for r in oracles["repairs"] if r["node"] == node] == vm_operations
        events = {e["type"].rsplit(".", 1)[-1] for e in repairs.stack.published_events()
                  if e.get("data", {}).get("remediation") == record.id}
        assert {"Admitted", "Cordoned", "Drained", remediation.RUNG_EVENTS[rung], "Recovered"} <= events
        if rung == "replace":
            assert [n["node"] for n in oracles["nodes_removed"]] == [node]
            replacement = repairs.node("e2e-fix", d["target"])
            assert d["target"] != node and replacement is not None and is_ready(replacement)
            assert len([n for n in repairs.pool_nodes("e2e-fix", pool) if is_ready(n)]) == 2  # capacity is back
        else:
            healed = repairs.node("e2e-fix", node)
            assert healed is not None and is_ready(healed) and not healed.spec.unschedulable
            assert condition_status(healed, condition) == "False"
            assert CORDONED_BY not in (healed.metadata.labels or {})  # we lifted our own cordon
        assert_nothing_unsafe(oracles)

    def test_a_node_no_rung_repairs_ends_cordoned_with_a_gave_up_event(self, repairs: Fleet) -> None:
        record = repairs.finished("e2e-broken", "hopeless", timeout=90)
        assert record.state == "gave_up", repairs.describe([record])
        assert "every rung failed" in record.data["last_note"]
        node = repairs.node("e2e-broken", record.data["node"])
        assert node is not None, "a node nobody could repair must not be deleted"
        assert node.spec.unschedulable and CORDONED_BY in (node.metadata.labels or {})
        assert condition_status(node, "UnhealthyNvidiaDCGMServices") == "True"
        gave_up = [e for e in repairs.events("Steward.Remediation.GaveUp") if e["data"]["remediation"] == record.id]
        assert len(gave_up) == 1 and gave_up[0]["data"]["node"] == node.metadata.name
        assert "StewardGaveUp" in {e.reason for e in repairs.kube_events("e2e-broken", node.metadata.name)}
        tried = [r["rung"] for r in repairs.oracles()["repairs"] if r["node"] == node.metadata.name]
        assert tried == ["restart", "reimage"]  # and replace was attempted but ARM never let it start
        assert len(repairs.pool_nodes("e2e-broken", "hopeless")) == 2

    def test_a_drain_blocked_by_a_pdb_waits_and_finishes_once_the_pdb_allows_it(self, repairs: Fleet) -> None:
        from kubernetes import client

        def waiting() -> Record | None:
            records = repairs.records_in("e2e-fix", "guarded")
            if records and records[0].state == "draining" and records[0].data.get("drain", {}).get("messages"):
                return records[0]
            return None

        record = repairs.wait(waiting, timeout=60, what="the guarded node's drain to be blocked")
        node = record.data["node"]
        blocked_since = repairs.now()

        def refusals() -> int:
            """Evictions of the guarded node's pods that the PDB refused so far (the drain's own count)."""
            blocked = (repairs.records_of(node)[0].data.get("drain") or {}).get("blocked") or {}
            return sum(int(entry.get("tries", 0)) for entry in blocked.values())

        # A minute of fleet time passes; then the drain asks again and is refused again: it kept waiting.
        repairs.wait(lambda: repairs.now() >= blocked_since + 60, timeout=60 / SPEED + 30, interval=0.1,
                     what="a minute of fleet time")
        after_a_minute = refusals()
        repairs.wait(lambda: refusals() > after_a_minute, timeout=30, what="the drain to ask the Eviction API again")
        record = repairs.records_of(node)[0]
        assert record.state == "draining", repairs.describe([record])
        pods = repairs.core("e2e-fix").list_namespaced_pod("guarded").items
        assert [(p.spec.node_name, p.status.phase) for p in pods] == [(node, "Running")]
        assert "StewardDrainWaiting" in {e.reason for e in repairs.kube_events("e2e-fix", node)}
        refused = repairs.oracles()["requests_by_service"]["kube"].get("status_429", 0)
        assert refused >= 2, "the Eviction API must have been asked (and refused) more than once"

        policy = client.PolicyV1Api(repairs.stack.sim.kube_client("e2e-fix"))
        policy.patch_namespaced_pod_disruption_budget("solo", "guarded", {"spec": {"minAvailable": 0}})
        record = repairs.finished("e2e-fix", "guarded", timeout=60)
        assert record.state == "done", repairs.describe([record])
        assert float(record.data["drain_started_at"]) < blocked_since
        evicted = [t for t in repairs.oracles()["terminations"] if t["node"] == node and t["pod"].startswith("solo-")]
        assert [t["cause"] for t in evicted] == ["eviction"]
        assert_nothing_unsafe(repairs.oracles())

    def test_a_flapping_condition_causes_no_remediation(self, repairs: Fleet) -> None:
        repairs.finished("e2e-fix", "plugin", timeout=90)  # the fleet has been swept many times by now
        flapper = repairs.pool_nodes("e2e-fix", "flapping")[0]
        transition = parse_iso(condition(flapper, "UnhealthyNvidiaDevicePlugin").last_transition_time)
        assert transition > repairs.stack.endpoints["clock"]["epoch_sim"] + 40, "the condition never flapped"
        assert repairs.records_in("e2e-fix", "flapping") == []
        reported = [e for e in repairs.events(remediation.UNHEALTHY_EVENT) if e["data"]["pool"] == "flapping"]
        assert reported == []
        assert repairs.oracles()["max_disrupted_per_pool"].get("e2e-fix/flapping", 0) == 0

    def test_a_missing_condition_causes_no_remediation(self, repairs: Fleet) -> None:
        repairs.finished("e2e-fix", "plugin", timeout=90)
        for node in repairs.pool_nodes("e2e-fix", "nonpd"):
            assert condition(node, "UnhealthyNvidiaDevicePlugin") is None  # no NPD: unknown, not healthy
            assert is_ready(node) and not node.spec.unschedulable
        assert repairs.records_in("e2e-fix", "nonpd") == []
        assert [e for e in repairs.events(remediation.UNHEALTHY_EVENT) if e["data"]["pool"] == "nonpd"] == []
        assert repairs.oracles()["max_disrupted_per_pool"].get("e2e-fix/nonpd", 0) == 0

    def test_the_cordon_follows_the_threshold_within_one_sweep_interval(self, repairs: Fleet, reacting: str,
                                                                        record_property: Callable[[str, Any], None],
                                                                        ) -> None:
        name = reacting
        record = repairs.wait(lambda: next((r for r in repairs.records_of(name) if r.data.get("cordoned_at")), None),
                              timeout=30, what=f"{name} to be cordoned")
        node = repairs.node("e2e-fix", name)
        since = parse_iso(condition(node, "UnhealthyNvidiaDCGMServices").last_transition_time)
        due = since + THRESHOLD_S
        cordoned_at = float(record.data["cordoned_at"])
        annotation = parse_iso(node.metadata.annotations["gpu-fleet-steward/cordoned-at"])
        assert abs(annotation - cordoned_at) <= 2.0  # the node says the same as the ledger
        reaction, admission = cordoned_at - due, record.created_at - due
        print(f"\nreaction: threshold met -> admitted {admission:.1f} sim s, -> cordoned {reaction:.1f} sim s "
              f"({reaction / SPEED:.2f} wall s); sweep interval {SWEEP_S:.0f} sim s")
        record_property("reaction_sim_s", round(reaction, 1))
        assert reaction >= -1.0, "cordoned before the condition had been True for its threshold"
        assert reaction <= SWEEP_S + 3 * SPEED, f"cordon {reaction:.1f} sim s after the threshold was met"
        repairs.finished("e2e-fix", "react", timeout=60)

    def test_duplicated_late_and_reordered_events_on_two_hosts_cause_exactly_one_remediation(self, repairs: Fleet,
                                                                                            reacting: str) -> None:
        for pool in ("plugin", "gpumissing", "dcgm", "xid", "guarded", "react"):
            repairs.finished("e2e-fix", pool, timeout=90)
        repairs.finished("e2e-broken", "hopeless", timeout=90)
        repairs.late_deliveries_handled(("host-1", "host-2"))  # the deliveries held 60 s arrived, and were refused
        records = repairs.records()
        per_node = Counter(r.data["node"] for r in records)
        assert len(per_node) == 7 and set(per_node.values()) == {1}, repairs.describe(records)
        # At-least-once: a host that loses the race may repeat the announcement, under the same id.
        admitted = Counter(remediation for remediation, _ in {
            (e["data"]["remediation"], e["id"]) for e in repairs.events("Steward.Remediation.Admitted")})
        assert set(admitted) == {r.id for r in records} and set(admitted.values()) == {1}
        oracles = repairs.oracles()
        restarts = Counter(r["node"] for r in oracles["repairs"] if r["rung"] == "restart")
        assert set(restarts.values()) == {1}, restarts  # each node restarted once, never twice
        fired = Counter(key for f in oracles["faults_fired"] if f["target"] == "eventgrid-delivery"
                        for key in ("duplicate", "delay_s", "reorder") if f.get(key))
        assert fired["duplicate"] >= 7 and fired["delay_s"] >= 1 and fired["reorder"] >= 1, fired
        deliveries = [repairs.invocations(h, "remediation_events") for h in ("host-1", "host-2")]
        assert min(deliveries) >= 1, f"both hosts must have handled deliveries: {deliveries}"
        assert sum(deliveries) > len(records)  # the duplicates and re-reports were delivered, and refused
        assert_nothing_unsafe(oracles)


def condition_status(node: Any, type_: str) -> str | None:
    found = condition(node, type_)
    return None if found is None else str(found.status)


# ---------------------------------------------------------------------------- a wave: breaker and budget

WAVE_BUDGET = 2
WAVE_SETTINGS = {
    "BUDGET_POOL_MAX_UNAVAILABLE": str(WAVE_BUDGET),
    "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT": "20",  # min(2, max(1, floor(20 * 20 %))) = 2
    "BUDGET_MAX_IN_FLIGHT": "5",
    "BREAKER_PERCENT": "30",
    "BREAKER_WINDOW_S": "600",
}


@pytest.fixture(scope="class")
def wave(stack_for: Callable[..., Fleet]) -> Fleet:
    return stack_for(scenario="remediation_wave", settings=WAVE_SETTINGS, hosts=1)


class TestAWaveOfFailures:
    """scenarios/remediation_wave.yaml: 10 of 20 GPU nodes turn unhealthy at the same moment."""

    def test_ten_of_twenty_nodes_failing_at_once_open_the_breaker_and_nothing_is_touched(self, wave: Fleet) -> None:
        opened = wave.wait(lambda: [e for e in wave.stack.published_events() if e.get("type") == "Steward.Breaker.Opened"],
                           timeout=60, what="the breaker to open")
        assert len(opened) == 1
        record = wave.breaker()
        assert record is not None and record.state == "open"
        refused = wave.wait(lambda: [e for e in wave.events("Steward.Remediation.Refused")
                                     if e["data"].get("reason_code") == "breaker"],
                            timeout=30, what="an admission refused by the open breaker")
        assert refused
        sweeps = wave.ended("host-1", "health_sweep")
        wave.wait(lambda: wave.ended("host-1", "health_sweep") >= sweeps + 2, timeout=2 * SWEEP_S / SPEED + 30,
                  interval=0.1, what="two more sweeps")
        wave.deliveries_handled(("host-1",), what="the two sweeps' reports")  # and their reports were looked at
        assert wave.records() == []
        assert [n.metadata.name for n in wave.pool_nodes("e2e-wave", "wave") if n.spec.unschedulable] == []
        assert wave.oracles()["requests_by_service"]["kube"].get("PATCH /k8s/{}/api/v1/nodes/{}", 0) == 0

    def test_fleetctl_breaker_reset_closes_it_and_the_ten_are_repaired_within_the_pool_budget(self,
                                                                                                wave: Fleet) -> None:
        # The scenario opens the breaker on its own (the test above watches it happen); alone, this test waits for it.
        wave.wait(lambda: getattr(wave.breaker(), "state", None) == "open", timeout=60, what="the breaker to open")
        command = [sys.executable, "-m", "fleetctl", "--settings", str(wave.stack.settings_path),
                   "--endpoints", str(wave.stack.endpoints_path), "breaker", "--reset", "--by", "e2e-operator",
                   "--reason", "storm understood"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=devstack.ROOT)
        assert out.returncode == 0, out.stdout + out.stderr
        # Issue 11: fleetctl asks through a validated command record; the app's reconciler applies it.
        wave.wait(lambda: getattr(wave.breaker(), "state", None) == "closed" or None, timeout=60,
                  what="the reconciler to apply the reset command")
        # The Reset event is published right after the breaker row is written: wait for it, then count.
        reset = wave.wait(lambda: wave.events("Steward.Breaker.Reset") or None, timeout=60,
                          what="the breaker's Reset event")
        assert len(reset) == 1 and "e2e-operator" in json.dumps(reset[0]["data"])

        def all_done() -> list[Record] | None:
            records = wave.records()
            return records if len(records) == 10 and all(r.state in remediation.TERMINAL_STATES for r in records) else None

        records = wave.wait(all_done, timeout=90, what="the ten remediations to end")
        assert {r.state for r in records} == {"done"}, wave.describe(records)
        oracles = wave.oracles()
        took = max(r.updated_at for r in records) - min(r.created_at for r in records)
        print(f"\nwave: 10 repairs in {took:.0f} sim s; most nodes down at once {oracles['max_disrupted_per_pool']} "
              f"(counting joining nodes too: {oracles['max_unavailable_per_pool']['e2e-wave/wave']})")
        assert oracles["max_disrupted_per_pool"]["e2e-wave/wave"] == WAVE_BUDGET  # used, never exceeded
        assert Counter(r["rung"] for r in oracles["repairs"]) == {"restart": 10}
        assert wave.breaker().state == "closed"  # type: ignore[union-attr]
        assert [n.metadata.name for n in wave.pool_nodes("e2e-wave", "wave") if n.spec.unschedulable] == []
        assert_nothing_unsafe(oracles)


# ---------------------------------------------------------------------------- crashes

CRASH_SETTINGS = {
    "REMEDIATION_LADDER": "restart,replace",
    "REMEDIATION_RUNG_TIMEOUTS": "restart=80,replace=1200",
}
STALL_S = 60.0  # a slowed call takes this long (1.5 wall s at 40x): the host is killed inside it


@pytest.fixture(scope="class")
def crashes(stack_for: Callable[..., Fleet]) -> Fleet:
    return stack_for(scenario="remediation_crash", settings=CRASH_SETTINGS, hosts=1)


@dataclass
class CrashDrill:
    """What the crash drill did: where it killed the host, the node it broke, the record at the end."""

    planned: int
    kills: list[str]
    node: str
    record: Record


@pytest.fixture(scope="class")
def crash_drill(crashes: Fleet) -> CrashDrill:
    """Break one node that only a replacement fixes, and kill its host inside and between every kind of step.

    A kill "inside" a step: the step's call is slowed by a fault (added before the host gets there)
    and the host is killed while it waits for the answer -- after the simulator applied it (it counts
    a request once its handler ran, before the delay), before the ledger knew. A kill "between" steps:
    the record rests in a waiting state. Every test of the class reads this one run, whichever runs first.
    """
    stack = crashes.stack
    crashes.wait(lambda: re.search(r"Executed 'Functions\.health_sweep' \(Succeeded",
                                   (stack.state_dir / "host-1.log").read_text(errors="replace")),
                 timeout=60, what="the first sweep")
    name = ""

    def phase(state: str, rung_phase: str | None = None) -> Callable[[], bool]:
        def reached() -> bool:
            return any(r.state == state and rung_phase in (None, r.data.get("rung_phase"))
                       for r in crashes.records_of(name))
        return reached

    # (where, the slowed call or the waiting state, the route template the simulator counts the call under)
    plan: list[tuple[str, dict[str, Any] | Callable[[], bool], str]] = [
        ("inside admission (reading the node)", {"target": "kube", "method": "GET", "path": r"/api/v1/nodes/aks-gpu-"},
         "/api/v1/nodes/{}"),
        ("inside the cordon", {"target": "kube", "method": "PATCH", "path": r"/api/v1/nodes/aks-gpu-"}, "/api/v1/nodes/{}"),
        ("inside the drain (an eviction)", {"target": "kube", "method": "POST", "path": r"/eviction$"}, "/eviction"),
        ("inside the restart", {"target": "arm", "method": "POST", "path": r"/restart$"}, "/restart"),
        ("inside the surge", {"target": "arm", "method": "PUT", "path": r"/agentPools/gpu$"}, "/agentPools/{}"),
        # The surge node takes pool_scale_s + node_ready_s (40 s) to be Ready: a rest long enough to be caught.
        # (The restart's wait no longer is: node-problem-detector's run on boot shows the fault 6 s after the
        # node is back, and a host started after the kill inside the restart may find it already failed.)
        ("between steps (waiting for the surge node)", phase("repairing", "surge_wait"), ""),
        ("inside deleteMachines", {"target": "arm", "method": "POST", "path": r"/deleteMachines$"}, "/deleteMachines"),
    ]
    host = stack.hosts[0]
    kills: list[str] = []
    for where, how, route in plan:
        if callable(how):
            crashes.wait(how, timeout=60, interval=0.05, what=f"a kill {where}")
        else:
            method = str(how["method"])
            answered = crashes.answered(method, route)
            [rule_id] = crashes.add_faults([{**how, "cluster": "e2e-crash", "delay_s": STALL_S, "count": 1}])
            if not name:
                name = crashes.flip("e2e-crash", "gpu", "UnhealthyNvidiaDevicePlugin", fixed_by="replace")
            crashes.wait(lambda rid=rule_id: crashes.fired(rid), timeout=60, interval=0.1, what=f"a kill {where}")
            crashes.wait(lambda m=method, r=route, n=answered: crashes.answered(m, r) > n, timeout=30, interval=0.02,
                         what=f"the simulator to apply the slowed call ({where})")
        stack.stop_host(host, crash=True)
        kills.append(where)
        host = stack.start_host(f"host-{len(kills) + 1}")
    record = crashes.finished("e2e-crash", "gpu", timeout=60)
    return CrashDrill(planned=len(plan), kills=kills, node=name, record=record)


class TestCrashes:
    """scenarios/remediation_crash.yaml: one node only a replacement fixes; its host dies again and again."""

    def test_a_host_killed_inside_and_between_steps_resumes_to_the_same_end_state(self, crashes: Fleet,
                                                                                  crash_drill: CrashDrill) -> None:
        stack = crashes.stack
        record, kills, name = crash_drill.record, crash_drill.kills, crash_drill.node

        assert len(kills) == crash_drill.planned
        print(f"\nkilled: {'; '.join(kills)}")
        assert [r.id for r in crashes.records()] == [record.id]  # one remediation, whatever the crashes
        d = record.data
        assert record.state == "done" and d["ladder"][int(d["rung_index"])] == "replace", crashes.describe([record])
        states = [line["state"] for line in record.history]
        assert states[0] == "admitted" and states[-1] == "done"
        oracles = crashes.oracles()
        vm_operations = [r["rung"] for r in oracles["repairs"]]
        print(f"VM operations: {vm_operations}")
        # The host that resumed after the kill inside the restart call found the operation marker and the
        # node's reboot, so it did not restart the VM again (the test below says so on its own).
        assert vm_operations == ["restart"]
        assert [n["node"] for n in oracles["nodes_removed"]] == [name]  # one machine deleted: the broken one
        nodes = crashes.pool_nodes("e2e-crash", "gpu")
        assert len(nodes) == 2 and all(is_ready(n) and not n.spec.unschedulable for n in nodes)
        assert d["target"] in {n.metadata.name for n in nodes} and name not in {n.metadata.name for n in nodes}
        pool = stack.arm("GET", f"{crashes.clusters['e2e-crash']}/agentPools/gpu", api_version="2026-08-02-preview")
        assert pool["properties"]["count"] == 2  # surge undone exactly once
        puts = oracles["requests_by_service"]["arm"].get(
            "PUT /subscriptions/{}/resourceGroups/{}/providers/Microsoft.ContainerService/managedClusters/{}/agentPools/{}", 0)
        # The kills inside the surge PUT and inside deleteMachines came after the simulator applied them:
        # the resuming host saw the count reached (a busy pool is waited for) and the operation marker.
        assert puts == 1, f"the surge PUT was sent {puts} times"
        deletes = sum(n for route, n in oracles["requests_by_service"]["arm"].items()
                      if route.startswith("POST ") and route.lower().endswith("/deletemachines"))
        assert deletes == 1, f"deleteMachines was sent {deletes} times"
        assert_nothing_unsafe(oracles)

    def test_a_host_killed_inside_the_restart_call_does_not_restart_the_vm_twice(self, crashes: Fleet,
                                                                                 crash_drill: CrashDrill) -> None:
        assert "inside the restart" in crash_drill.kills and crash_drill.record.state == "done"
        assert [r["rung"] for r in crashes.oracles()["repairs"]] == ["restart"]


# ---------------------------------------------------------------------------- dry run


@pytest.fixture(scope="class")
def dry_run(stack_for: Callable[..., Fleet]) -> Fleet:
    return stack_for(scenario="remediation_dry_run", settings={"REMEDIATION_DRY_RUN": "true"}, hosts=1)


#: ARM POSTs that read: the cluster's credentials (kubeconfig) are fetched with a POST.
ARM_READS_BY_POST = ("/listClusterUserCredential",)


class TestDryRun:
    """scenarios/remediation_dry_run.yaml: a node a restart would fix; REMEDIATION_DRY_RUN=true."""

    def test_dry_run_records_every_decision_and_writes_nothing_to_the_fleet(self, dry_run: Fleet) -> None:
        record = dry_run.finished("e2e-dry", "gpu", timeout=60)
        assert record.state == "done" and record.data["dry_run"] is True
        assert [line["state"] for line in record.history] == ["admitted", "cordoned", "draining", "repairing", "done"]
        decisions = [e["data"]["note"] for e in dry_run.events("Steward.Remediation.DryRun")]
        assert any("would cordon" in n for n in decisions) and any("would evict" in n for n in decisions)
        assert any("would restart" in n for n in decisions)
        node = dry_run.node("e2e-dry", record.data["node"])
        assert node is not None and not node.spec.unschedulable
        assert condition_status(node, "UnhealthyNvidiaDevicePlugin") == "True"  # untouched: still broken

        oracles = dry_run.oracles()
        kube_writes = {route: n for route, n in oracles["requests_by_service"]["kube"].items()
                       if route.split(" ")[0] in {"POST", "PUT", "PATCH", "DELETE"}}
        assert kube_writes == {}
        arm_writes = {route: n for route, n in oracles["requests_by_service"]["arm"].items()
                      if route.split(" ")[0] in {"POST", "PUT", "PATCH", "DELETE"}
                      and not route.endswith(ARM_READS_BY_POST)}
        assert arm_writes == {}
        assert oracles["repairs"] == [] and oracles["nodes_removed"] == []
        assert oracles["termination_causes"].get("eviction", 0) == 0
        assert_nothing_unsafe(oracles)

"""End-to-end fixtures: a whole local fleet per test module, driven the way a team drives it.

Each module gets one :func:`devstack.running` stack (Azurite, the simulator with
``scenarios/pool_requests.yaml``, local Functions hosts as separate processes, the fast settings
profile) and talks to it only through public surfaces: requests go onto the queue base64-encoded as
the Functions host reads them; results are read from the ledger table in Azurite, from ARM and the
clusters' Kubernetes APIs, from the CloudEvents the simulator's Event Grid topic received, and from
the simulator's oracles (what really happened, never the app's own account).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import devstack
from shared.kernel.ports import Record
from tests.waiting import poll, wait_until

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "pool_requests.yaml"
PREVIEW_API = "2026-08-02-preview"  # shows every gpuProfile field, migStrategy included
TERMINAL = ("succeeded", "failed", "rejected", "blocked")
AGENTPOOL_LABEL = "kubernetes.azure.com/agentpool"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
PUT_POOL = "PUT /subscriptions/{}/resourceGroups/{}/providers/Microsoft.ContainerService/managedClusters/{}/agentPools/{}"
GET_POOL = "GET /subscriptions/{}/resourceGroups/{}/providers/Microsoft.ContainerService/managedClusters/{}/agentPools/{}"

#: App settings for the end-to-end stacks, on top of devstack.FAST_PROFILE: the reconciler wakes
#: every second and a pool being created or validated is looked at every second.
E2E_PROFILE: dict[str, str] = {
    "RECONCILE_SCHEDULE": "* * * * * *",
    "POOL_REQUEST_POLL_INTERVAL_S": "1",
}


class Fleet:
    """A running stack, seen from outside: submit like a team, observe like an auditor."""

    def __init__(self, stack: devstack.Stack) -> None:
        self.stack = stack
        self.ledger = stack.ledger()
        self.clusters = {c["name"]: c["id"] for c in stack.endpoints["clusters"]}
        self.queue_name = stack.team_queue()  # the first team of POOL_REQUEST_TEAMS (devstack.DEV_TEAMS)
        from shared.pools import teams

        #: the queue-trigger function of that team (one per team: functions/pool_requests.py)
        self.pool_request_function = teams.from_env(stack.settings)[0].function_name

    # ------------------------------------------------------------------ submitting

    def request(self, *, request_id: str, pool: str, cluster: str = "e2e-pools", **fields: Any) -> dict[str, Any]:
        """A schema-v1 pool request (camelCase ``fields`` as documented in docs/pool-requests.md)."""
        body: dict[str, Any] = {"schemaVersion": "1", "requestId": request_id, "requester": "team-e2e@contoso.com",
                                "cluster": self.clusters.get(cluster, cluster), "poolName": pool}
        body.update(fields)
        return body

    def submit(self, message: Mapping[str, Any] | str, *, team: str | None = None) -> None:
        """Send on ``team``'s queue (default: the first team of POOL_REQUEST_TEAMS)."""
        self.stack.submit(message if isinstance(message, str) else dict(message), team=team)

    # ------------------------------------------------------------------ the ledger

    def record(self, record_id: str) -> Record | None:
        """The row ``record_id`` (``<team>:<requestId>``), or the one team's row of a bare request id."""
        from shared.pools.records import split_id

        found: Record | None = self.ledger.get("pool-request", record_id)
        if found is not None:
            return found
        matches = [r for r in self.ledger.list("pool-request") if split_id(r.id)[1] == record_id]
        return matches[0] if len(matches) == 1 else None

    def outcome(self, record_id: str, *, timeout: float = 60.0) -> Record:
        """The record once it reached a terminal state (fails with its history and the host log)."""
        def ended() -> Record | None:
            record = self.record(record_id)
            return record if record is not None and record.state in TERMINAL else None

        return wait_until(ended, timeout=timeout, interval=0.25, what=f"pool request {record_id} to finish",
                          detail=lambda: f"{self.describe(self.record(record_id))}\n--- host log ---\n{self.host_log_tail()}")

    def wait_for_state(self, record_id: str, state: str, *, timeout: float = 30.0) -> Record:
        def reached() -> Record | None:
            record = self.record(record_id)
            return record if record is not None and record.state == state else None

        return wait_until(reached, timeout=timeout, what=f"pool request {record_id} to reach {state}",
                          detail=lambda: self.describe(self.record(record_id)))

    def quiesce(self, *, timeout: float = 60.0) -> None:
        """Wait until no pool request is active (so request counts can be attributed to one test)."""
        def active() -> list[str]:
            return [r.id for r in self.ledger.list("pool-request") if r.state not in TERMINAL]

        wait_until(lambda: not active(), timeout=timeout, interval=0.25, what="no pool request to be active",
                   detail=lambda: f"still active: {active()}")

    @staticmethod
    def describe(record: Record | None) -> str:
        if record is None:
            return "no record"
        return json.dumps({"state": record.state, "history": record.history[-6:],
                           "last_error": record.data.get("_last_error"), "error": record.data.get("error"),
                           "stack": record.data.get("stack")}, default=str)[:3000]

    # ------------------------------------------------------------------ queues and hosts

    def queue_length(self, name: str | None = None) -> int:
        return self.stack.queue_length(name or self.queue_name)

    def drained(self, name: str | None = None, *, timeout: float = 30.0) -> int:
        """Wait for the queue to empty: the host deletes a message only once its invocation has
        returned, a moment after the record the invocation wrote. Returns the last length seen."""
        last = [self.queue_length(name)]

        def empty() -> bool:
            last[0] = self.queue_length(name)
            return last[0] == 0

        poll(empty, timeout=timeout)
        return last[0]

    def poison(self) -> list[str]:
        return self.stack.peek_poison()

    def host_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.stack.state_dir.glob("host-*.log")))

    def host_log_tail(self, lines: int = 40) -> str:
        noise = re.compile(r"^( {4}|Request |Response |No body)|http_logging_policy")
        kept = [line for line in self.host_logs().splitlines() if not noise.search(line)]
        return "\n".join(kept[-lines:])

    def start_host(self, name: str, *, timeout: float = 60.0) -> Any:
        """Start another host process and wait until it listens (its log says it started)."""
        proc = self.stack.start_host(name)
        log = self.stack.state_dir / f"{name}.log"
        def started() -> bool:
            assert proc.poll() is None, f"host {name} exited while starting: {self.host_log_tail()}"
            return f"host {name} started" in (log.read_text(errors="replace") if log.exists() else "")

        wait_until(started, timeout=timeout, interval=0.1, what=f"host {name} to start", detail=self.host_log_tail)
        return proc

    def failed_invocations(self, function: str) -> int:
        return len(re.findall(rf"Executed 'Functions\.{function}' \(Failed", self.host_logs()))

    # ------------------------------------------------------------------ Azure, as a user sees it

    def arm_pool(self, cluster: str, pool: str) -> dict[str, Any]:
        path = f"{self.clusters[cluster]}/agentPools/{pool}"
        return dict(self.stack.arm("GET", path, api_version=PREVIEW_API)["properties"])

    def arm_pool_names(self, cluster: str) -> list[str]:
        answer = self.stack.arm("GET", f"{self.clusters[cluster]}/agentPools", api_version=PREVIEW_API)
        return sorted(str(p["name"]) for p in answer.get("value") or [])

    def kube(self, cluster: str) -> Any:
        return self.stack.sim.kube_client(cluster)

    def nodes(self, cluster: str, selector: str) -> list[Any]:
        from kubernetes import client

        return list(client.CoreV1Api(self.kube(cluster)).list_node(label_selector=selector).items)

    def custom_object(self, cluster: str, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        from kubernetes import client

        api = client.CustomObjectsApi(self.kube(cluster))
        return dict(api.get_cluster_custom_object(group, version, plural, name))

    # ------------------------------------------------------------------ events and oracles

    def events(self, record_id: str) -> list[dict[str, Any]]:
        """CloudEvents the topic received about one record (ids are ``pool-request/<team>:<requestId>/<Type>``;
        ``record_id`` is the row id or the bare request id)."""
        from shared.pools.records import split_id

        def ours(event: Mapping[str, Any]) -> bool:
            kind, _, rest = str(event.get("id", "")).partition("/")
            row = rest.rsplit("/", 1)[0]
            return kind == "pool-request" and record_id in (row, split_id(row)[1])

        return [e for e in self.stack.published_events() if ours(e)]

    def events_when(self, record_id: str, *, types: set[str], timeout: float = 15.0) -> list[dict[str, Any]]:
        """The record's events once every one of ``types`` arrived (a record is saved before its event)."""
        last: list[list[dict[str, Any]]] = [[]]

        def arrived() -> bool:
            last[0] = self.events(record_id)
            return types <= {e["type"] for e in last[0]}

        poll(arrived, timeout=timeout, interval=0.2)
        return last[0]

    def oracles(self) -> dict[str, Any]:
        return self.stack.oracles()

    def requests(self) -> Counter[str]:
        return Counter(self.oracles()["requests"])

    def faults(self, rules: list[dict[str, Any]]) -> list[str]:
        added = self.stack.control("POST", "/faults", rules)["added"]
        return [str(rule["id"]) for rule in added]

    def fired(self, rule_ids: list[str]) -> list[dict[str, Any]]:
        return [f for f in self.oracles()["faults_fired"] if f.get("rule") in rule_ids]


def node_is_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())


def stack_problems(nodes: list[Any], *, managed: bool, resource: str) -> list[str]:
    """What is wrong with a GPU pool's stack, read from its nodes (docs/pool-requests.md's table)."""
    problems: list[str] = []
    if not nodes:
        return ["no nodes"]
    for node in nodes:
        name = node.metadata.name
        if not node_is_ready(node):
            problems.append(f"{name} is not Ready")
        conditions = {c.type: c.status for c in node.status.conditions or ()}
        if not managed:
            problems += [f"{name}: {t} is True" for t in ("UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices")
                         if conditions.get(t) == "True"]
            continue
        if int((node.status.allocatable or {}).get(resource, "0")) < 1:
            problems.append(f"{name} has no {resource} allocatable")
        if (node.metadata.labels or {}).get("kubernetes.azure.com/dcgm-exporter") != "enabled":
            problems.append(f"{name} lacks the DCGM exporter label")
        for condition in ("UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices"):
            if conditions.get(condition) != "False":
                problems.append(f"{name}: {condition} is {conditions.get(condition, 'missing')}")
    return problems


def assert_no_disruption(oracles: Mapping[str, Any]) -> None:
    assert oracles["pdb_violations"] == []
    assert oracles["pods_killed_without_eviction"] == []
    assert oracles["workload_pods_lost"] == []


@pytest.fixture(scope="module")
def fleet_stack(request: pytest.FixtureRequest) -> Iterator[devstack.Stack]:
    """One stack for the module; a module may set ``E2E_SETTINGS`` (app settings) of its own and
    ``E2E_HOSTS`` (how many host processes compete for its messages, default 1).

    Its state directory (host logs, Azurite and simulator logs, settings) is kept when a test of
    the module failed, and its path printed; otherwise it is removed.
    """
    profile = {**E2E_PROFILE, **getattr(request.module, "E2E_SETTINGS", {})}
    module = request.module.__name__.rsplit(".", 1)[-1]
    state_dir = Path(tempfile.mkdtemp(prefix=f"{module}-"))
    failed_before = request.session.testsfailed
    hosts = int(getattr(request.module, "E2E_HOSTS", 1))
    with devstack.running(scenario=SCENARIO, profile=profile, hosts=hosts, host_json=devstack.FAST_HOST_JSON,
                          state_dir=state_dir) as stack:
        yield stack
    if request.session.testsfailed == failed_before:
        shutil.rmtree(state_dir, ignore_errors=True)
    else:
        print(f"\n{module}: the stack's logs are in {state_dir}")


@pytest.fixture(scope="module")
def fleet(fleet_stack: devstack.Stack) -> Fleet:
    return Fleet(fleet_stack)

"""fleetctl: every command explains itself, submit speaks the host's encoding, listings read the ledger."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from fleetctl import cli, fleet, submit
from shared.kernel.ports import ClusterInfo, Condition, NodeView, PoolInfo, Record

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["submit", "requests", "status", "remediations", "breaker", "plan", "why", "timeline"]
CLUSTER = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg"
           "/providers/Microsoft.ContainerService/managedClusters/c1")
REQUEST = {"schemaVersion": "1", "requestId": "team-a-001", "requester": "team-a@example.com", "cluster": CLUSTER,
           "poolName": "gpua", "vmSize": "Standard_NC24ads_A100_v4", "count": 2}


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture
def storage(storage_connection_string: str, names: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    # The team's queue sits in the team-requests account (locally the same Azurite) and is provisioned
    # by the operators: fleetctl submit only sends (tests/fleetctl/test_fleetctl_team_queues.py).
    queue = names.queue("requests")
    values = {"AzureWebJobsStorage": storage_connection_string, "TeamRequestsStorage": storage_connection_string,
              "POOL_REQUEST_TEAMS": json.dumps({"team-a": {"clusters": "*", "queue": queue}}),
              "LEDGER_TABLE": names.table("ledger")}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    QueueClient.from_connection_string(storage_connection_string, queue).create_queue()
    return {**values, "POOL_REQUEST_QUEUE": queue}


@pytest.fixture
def ledger(storage: dict[str, str]) -> Any:
    from azure.data.tables import TableClient

    from shared.adapters.ledger import TableLedger

    return TableLedger(TableClient.from_connection_string(storage["AzureWebJobsStorage"],
                                                          table_name=storage["LEDGER_TABLE"]))


def _record(kind: str, id_: str, state: str, *, at: float = 1_764_684_000.0, note: str = "", **data: Any) -> Record:
    return Record(kind=kind, id=id_, state=state, data=data, created_at=at, updated_at=at,
                  history=[{"at": at, "state": state, "note": note}])


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: fleetctl {command}") and "--json" in text


def test_the_module_runs_with_help_listing_every_command() -> None:
    result = subprocess.run([sys.executable, "-m", "fleetctl", "--help"], capture_output=True, text=True, cwd=ROOT,
                            timeout=60, check=True)
    assert all(command in result.stdout for command in COMMANDS)


def test_submit_sends_base64_json_that_a_queue_client_reads_back_unchanged(storage: dict[str, str],
                                                                         tmp_path: Path) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(REQUEST, indent=2))
    code, out = run("submit", str(path))
    assert (code, out.strip()) == (0, "team-a-001")
    client = QueueClient.from_connection_string(storage["AzureWebJobsStorage"], storage["POOL_REQUEST_QUEUE"])
    [message] = list(client.receive_messages(max_messages=5))
    assert json.loads(base64.b64decode(message.content, validate=True)) == REQUEST


def test_submit_reads_standard_input_and_gives_a_request_without_an_id_one(
        storage: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    body = {k: v for k, v in REQUEST.items() if k != "requestId"}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(body)))
    code, out = run("submit", "-", "--json")
    result = json.loads(out)
    assert code == 0 and result["generated_id"] is True and result["request_id"].startswith("req-")
    client = QueueClient.from_connection_string(storage["AzureWebJobsStorage"], storage["POOL_REQUEST_QUEUE"])
    [message] = list(client.receive_messages(max_messages=5))
    assert json.loads(base64.b64decode(message.content)) == {**body, "requestId": result["request_id"]}


def test_submit_refuses_text_that_is_not_a_json_object_unless_raw(storage: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("not json at all")
    assert run("submit", str(path))[0] == 2
    code, _ = run("submit", str(path), "--raw")
    assert code == 0
    client = QueueClient.from_connection_string(storage["AzureWebJobsStorage"], storage["POOL_REQUEST_QUEUE"])
    assert [base64.b64decode(m.content) for m in client.receive_messages(max_messages=5)] == [b"not json at all"]


@pytest.mark.parametrize(("text", "request_id", "expected_id", "generated"), [
    pytest.param('{"requestId": "a1"}', None, "a1", False, id="kept"),
    pytest.param('{"requestId": "a1"}', "b2", "b2", False, id="replaced-by-flag"),
    pytest.param('{"requestId": ""}', None, None, True, id="empty-is-generated"),
])
def test_the_request_id_is_kept_replaced_or_generated(text: str, request_id: str | None, expected_id: str | None,
                                                      generated: bool) -> None:
    message, rid, was_generated = submit.prepare(text, request_id=request_id)
    assert json.loads(message)["requestId"] == rid and was_generated is generated
    if expected_id:
        assert rid == expected_id


def test_a_missing_storage_setting_is_named(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    assert run("requests")[0] == 2
    assert "AzureWebJobsStorage" in capsys.readouterr().err


def test_settings_come_from_a_local_settings_file(storage: dict[str, str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AzureWebJobsStorage")
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": {"AzureWebJobsStorage": storage["AzureWebJobsStorage"]}}))
    assert run("--settings", str(settings), "requests") == (0, "no pool requests\n")


def test_requests_lists_outcomes_from_the_ledger(ledger: Any) -> None:
    ledger.create(_record("pool-request", "team-a-001", "succeeded", note="pool gpua validated", cluster=CLUSTER,
                          pool="gpua", requester="team-a", vmSize="Standard_NC24ads_A100_v4"))
    ledger.create(_record("pool-request", "team-b-002", "rejected", at=1_764_684_100.0, cluster=CLUSTER, pool="x",
                          requester="team-b", reasons=["vmSize: Standard_D4s_v5 is not a GPU size"]))
    code, out = run("requests")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["REQUEST", "STATE", "REQUESTER"]
    assert lines[1].split()[:2] == ["team-b-002", "rejected"] and "not a GPU size" in lines[1]
    assert lines[2].split()[:2] == ["team-a-001", "succeeded"] and "validated" in lines[2]
    code, out = run("requests", "--state", "rejected", "--json")
    assert [r["id"] for r in json.loads(out)] == ["team-b-002"]
    code, out = run("requests", "--id", "team-a-001")
    assert "pool gpua validated" in out and "c1" in out
    assert run("requests", "--id", "nope")[0] == 3  # not found


def test_remediations_in_flight_are_told_apart_from_finished_ones(ledger: Any) -> None:
    ledger.create(_record("remediation", "r1-1", "draining", cluster=CLUSTER, node="aks-gpu-0", pool="gpu",
                          condition="UnhealthyNvidiaDevicePlugin", note="evicting 3 pods"))
    ledger.create(_record("remediation", "r2-1", "done", cluster=CLUSTER, node="aks-gpu-1", pool="gpu",
                          condition="UnhealthyNvidiaDCGMServices"))
    code, out = run("remediations", "--active", "--json")
    assert [r["node"] for r in json.loads(out)] == ["aks-gpu-0"]
    code, out = run("remediations")
    assert code == 0 and "aks-gpu-0" in out and "aks-gpu-1" in out


def test_the_breaker_is_shown_and_a_reset_needs_a_name(ledger: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("breaker") == (0, "breaker: closed\n")
    ledger.create(_record("breaker", "fleet", "open", reason="7 of 20 GPU nodes unhealthy in 10 min",
                          opened_at=1_764_684_000.0, window={"a": 1.0, "b": 2.0}))
    code, out = run("breaker")
    assert code == 0 and "open since 2025-12-02T14:00:00Z: 7 of 20 GPU nodes unhealthy" in out
    assert json.loads(run("breaker", "--json")[1])["unhealthy_in_window"] == 2
    assert run("breaker", "--reset")[0] == 2
    assert "--by" in capsys.readouterr().err


def test_a_breaker_reset_is_asked_as_a_validated_command_and_never_writes_the_breaker_record(ledger: Any) -> None:
    # Issue 11: operator actions go through a validated command path; fleetctl no longer writes the breaker row.
    ledger.create(_record("breaker", "fleet", "open", reason="storm", opened_at=1_764_684_000.0, window={"a": 1.0}))
    before = ledger.get("breaker", "fleet")
    code, out = run("breaker", "--reset", "--by", "alice", "--reason", "driver roll-back done")
    assert code == 0 and "asked by alice" in out
    after = ledger.get("breaker", "fleet")
    assert after is not None and after.state == "open" and after.etag == before.etag  # untouched
    [command] = ledger.list("command")
    assert command.state == "requested"
    assert {k: command.data[k] for k in ("command", "by", "reason")} == {
        "command": "breaker.reset", "by": "alice", "reason": "driver roll-back done"}
    code, out = run("breaker")
    assert f"command {command.id}: breaker.reset by alice (driver roll-back done): requested" in out


def test_a_breaker_reset_wakes_the_reconciler_through_the_nudge_queue(ledger: Any, storage: dict[str, str],
                                                                     names: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    nudge = names.queue("nudge")
    monkeypatch.setenv("NUDGE_QUEUE", nudge)
    queue = QueueClient.from_connection_string(storage["AzureWebJobsStorage"], nudge)
    queue.create_queue()
    ledger.create(_record("breaker", "fleet", "open", reason="storm", opened_at=1_764_684_000.0, window={"a": 1.0}))
    assert run("breaker", "--reset", "--by", "alice", "--reason", "storm over")[0] == 0
    [command] = ledger.list("command")
    [sent] = list(queue.receive_messages())
    assert base64.b64decode(sent.content).decode() == f"command:{command.id}"


def test_a_breaker_reset_with_a_malformed_name_is_refused_before_anything_is_written(
        ledger: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.create(_record("breaker", "fleet", "open", reason="storm", opened_at=1_764_684_000.0, window={"a": 1.0}))
    assert run("breaker", "--reset", "--by", "alice; drop table", "--reason", "x")[0] == 2
    assert "by must name the operator" in capsys.readouterr().err
    assert run("breaker", "--reset", "--by", "alice")[0] == 2  # a reason is required
    assert ledger.list("command") == []


def _node(name: str, pool: str, *, ready: bool = True, cordoned: bool = False) -> NodeView:
    return NodeView(name=name, uid=name, resource_version="1", labels={"kubernetes.azure.com/agentpool": pool},
                    annotations={}, unschedulable=cordoned, taints=(),
                    conditions=(Condition(type="Ready", status="True" if ready else "False"),),
                    allocatable={}, capacity={}, created=0.0)


class _FakeAks:
    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        return [ClusterInfo(id=CLUSTER, name="c1", subscription=subscription, resource_group="rg", location="eastus",
                            tags={"gpu-fleet-steward": "enabled"}, node_resource_group="MC_rg_c1_eastus")]

    def list_pools(self, cluster_id: str) -> list[PoolInfo]:
        return [PoolInfo(cluster_id, "system", {"vmSize": "Standard_D4s_v5", "count": 2}),
                PoolInfo(cluster_id, "gpua", {"vmSize": "Standard_NC24ads_A100_v4", "count": 3,
                                              "provisioningState": "Succeeded",
                                              "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}),
                PoolInfo(cluster_id, "legacy", {"vmSize": "Standard_NC6s_v3", "count": 1,
                                                "provisioningState": "Succeeded"})]


class _FakeKube:
    def list_nodes(self, **_: Any) -> list[NodeView]:
        return [_node("a0", "gpua"), _node("a1", "gpua", cordoned=True), _node("a2", "gpua", ready=False),
                _node("l0", "legacy"), _node("s0", "system")]


def test_status_shows_gpu_pools_managed_or_not_with_node_readiness(ledger: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = types.SimpleNamespace(subscriptions=("00000000-0000-0000-0000-000000000001",),
                                     cluster_tag=("gpu-fleet-steward", "enabled"), cluster_ids=())
    access = types.SimpleNamespace(aks=lambda: _FakeAks(), kube=lambda cluster_id: _FakeKube())
    from shared.kernel.clock import ManualClock

    clock = ManualClock(1_764_684_000.0)
    monkeypatch.setattr(fleet, "build_context",
                        lambda **_: types.SimpleNamespace(settings=settings, access=access, clock=clock))
    ledger.create(_record("pool-request", "team-a-001", "creating"))
    ledger.create(_record("remediation", "r1-1", "cordoned", cluster=CLUSTER, node="a1", condition="XIDErrors"))
    ledger.create(_record("migration", "m1", "draining", cluster_id=CLUSTER, cluster_name="c1", pool="legacy",
                          replacement="legacym", node_count=4, drained=["n1"], note="batch 1"))
    data = json.loads(run("status", "--json")[1])
    [cluster] = data["clusters"]
    pools = {p["name"]: p for p in cluster["pools"]}
    assert set(pools) == {"gpua", "legacy"}  # the system pool is not a GPU pool
    assert (pools["gpua"]["management"], pools["gpua"]["nodes"], pools["gpua"]["ready"],
            pools["gpua"]["cordoned"]) == ("managed", 3, 2, 1)
    assert pools["legacy"]["management"] == "unmanaged"
    assert data["pool_requests"] == {"creating": 1}
    assert [r["node"] for r in data["remediations_in_flight"]] == ["a1"]
    assert data["migrations"][0]["nodes_drained"] == 1 and data["migrations"][0]["nodes_total"] == 4
    text = run("status")[1]
    assert "clusters in scope: 1" in text and "managed" in text and "remediations in flight: 1" in text
    assert "1/4 nodes" in text
    # the sweep's own judgement of the GPU nodes now: a cordon not ours and a NotReady node are skipped, with why
    assert cluster["evaluation"] == {"healthy": 0, "unhealthy": 0, "pending": 0, "unknown": 2,
                                     "skipped": {"cordoned-by-other": 1, "not-ready": 1}}
    assert "GPU nodes now, as the sweep judges them: 0 healthy, 0 unhealthy" in text


def test_status_says_which_dcgm_rows_a_clusters_exporter_leaves_inactive(ledger: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNALS_PROMETHEUS", json.dumps({CLUSTER: {"endpoint": "https://ws.eastus.prometheus.monitor.azure.com"}}))
    code, out = run("status", "--ledger-only")
    [line] = [x for x in out.splitlines() if x.startswith("DCGM rows inactive")]
    assert code == 0 and "c1 (managed exporter" in line and "DCGM_FI_DEV_ROW_REMAP_PENDING" in line
    monkeypatch.setenv("SIGNALS_PROMETHEUS", "{not json")
    assert "DCGM signal off: setting SIGNALS_PROMETHEUS" in run("status", "--ledger-only")[1]


def test_status_still_reports_the_ledger_when_the_fleet_cannot_be_reached(ledger: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(**_: Any) -> Any:
        raise fleet.FleetUnavailable("no ARM here")

    monkeypatch.setattr(fleet, "build_context", unavailable)
    code, out = run("status")
    assert code == 0 and "clusters: not read (no ARM here)" in out and "breaker: closed" in out


def test_plan_prints_the_planners_table_or_json_and_changes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                    storage: dict[str, str]) -> None:
    from shared.migration import plan as migration_plan

    plan = migration_plan.Plan(generated_at=1_764_684_000.0, items=(), skipped=())
    enabled = types.SimpleNamespace(settings=types.SimpleNamespace(migration=types.SimpleNamespace(enabled=True)))
    monkeypatch.setattr(fleet, "build_context", lambda **_: enabled)
    monkeypatch.setattr(fleet, "observe_plan", lambda ctx: plan)
    shown = json.loads(run("plan", "--json")[1])
    assert {k: v for k, v in shown.items() if k not in ("migration_enabled", "note")} == \
        json.loads(json.dumps(migration_plan.to_json(plan)))
    assert shown["migration_enabled"] is True
    assert run("plan")[1].startswith("Migration plan at 2025-12-02 14:00 UTC: 0 to migrate")


def test_the_simulators_endpoints_fill_in_settings_that_are_not_given(tmp_path: Path) -> None:
    from fleetctl import config

    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"arm_endpoint": "https://127.0.0.1:9", "ca_bundle": "/x/ca.pem",
                                     "identity_endpoint": "http://127.0.0.1:8/msi/token", "identity_header": "h",
                                     "subscriptions": ["s1", "s2"]}))
    merged = config.with_endpoints({"ARM_ENDPOINT": "https://mine", "IDENTITY_ENDPOINT": "ignored"}, endpoints)
    assert merged["ARM_ENDPOINT"] == "https://mine"  # a given setting wins
    assert (merged["STEWARD_CA_BUNDLE"], merged["FLEET_SUBSCRIPTIONS"]) == ("/x/ca.pem", "s1,s2")
    assert merged["IDENTITY_ENDPOINT"] == "http://127.0.0.1:8/msi/token"  # the platform's, as on App Service

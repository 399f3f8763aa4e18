"""fleetctl behaves as an operator's tool (issue 22, item 1): kubectl's ``-o``, RFC 3339 times, nothing cut in
``wide``, documented exit codes, one clear line per error, read-only commands that create nothing, a dry run
judged by the app's own intake rules, duplicates and no-ops said as such.

The error cases run the real entry point (``python -m fleetctl``) against Azurite and, where ARM is needed,
the simulator (``--endpoints``), the way an operator runs it.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from azure.data.tables import TableServiceClient

from fleetctl import cli
from shared.kernel.ports import Record
from shared.remediation.refusals import RULES, SKIP_RULES

ROOT = Path(__file__).resolve().parents[2]
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
LONG_NOTE = ("evicting the pods of the node one PDB at a time: ml/trainer allows one disruption and waits for "
             "its replacement to be Ready before the next eviction round starts")


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


def fleetctl(*argv: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line, as an operator types it."""
    return subprocess.run([sys.executable, "-m", "fleetctl", *argv], cwd=ROOT, env={**os.environ, **env},
                          input=stdin, capture_output=True, text=True, timeout=120)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def env(storage_connection_string: str, names: Any) -> dict[str, str]:
    return {"AzureWebJobsStorage": storage_connection_string, "TeamRequestsStorage": storage_connection_string,
            "LEDGER_TABLE": names.table("ledger"),
            "POOL_REQUEST_TEAMS": json.dumps({"team-a": {"clusters": "*", "queue": names.queue("requests")}})}


@pytest.fixture
def ledger(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from azure.data.tables import TableClient

    from shared.adapters.ledger import TableLedger

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return TableLedger(TableClient.from_connection_string(env["AzureWebJobsStorage"], table_name=env["LEDGER_TABLE"]))


def record(kind: str, id_: str, state: str, *, note: str = "", **data: Any) -> Record:
    at = 1_764_684_000.0
    return Record(kind=kind, id=id_, state=state, data=data, created_at=at, updated_at=at + 60,
                  history=[{"at": at, "state": state, "note": note}])


def filled(ledger: Any) -> None:
    ledger.create(record("pool-request", "team-a:req-1", "rejected", requester="team-a", pool="gpua",
                         reasons=["vmSize: Standard_D4s_v5 is not a GPU size; " + LONG_NOTE]))
    ledger.create(record("remediation", "r1", "draining", node="aks-gpu-0", pool="gpu", condition="XID79",
                         note=LONG_NOTE))
    ledger.create(record("breaker", "fleet", "open", reason="7 of 20 GPU nodes unhealthy", opened_at=1_764_684_000.0))


LISTINGS = [("requests",), ("remediations",), ("breaker",), ("status", "--ledger-only")]


@pytest.mark.parametrize("command", LISTINGS, ids=lambda c: c[0])
def test_every_listing_prints_json_and_yaml_with_rfc3339_times_and_the_same_data(ledger: Any,
                                                                                command: tuple[str, ...]) -> None:
    filled(ledger)
    code, as_json = run(*command, "-o", "json")
    assert code == 0
    data = json.loads(as_json)
    assert run(*command, "--json")[1] == as_json  # the old flag is an alias
    code, as_yaml = run(*command, "-o", "yaml")
    assert code == 0 and yaml.safe_load(as_yaml) == data

    def times(value: Any, key: str = "") -> list[Any]:
        if isinstance(value, dict):
            return [t for k, v in value.items() for t in times(v, k)]
        if isinstance(value, list):
            return [t for v in value for t in times(v)]
        return [value] if (key == "at" or key.endswith("_at")) and value is not None else []

    found = times(data)
    assert found and all(isinstance(t, str) and RFC3339.match(t) for t in found), found


@pytest.mark.parametrize("command", [("requests",), ("remediations",)], ids=lambda c: c[0])
def test_wide_cuts_nothing_and_table_cuts_at_a_word(ledger: Any, command: tuple[str, ...]) -> None:
    filled(ledger)
    wide = run(*command, "-o", "wide")[1]
    assert "…" not in wide and LONG_NOTE in wide and "2025-12-02T14:01:00Z" in wide
    table = run(*command)[1]
    cut = next(line for line in table.splitlines()[1:] if "…" in line)
    last_word = cut.split("…")[0].split()[-1]
    whole_words = {w.strip(",;:") for w in (LONG_NOTE + " vmSize: Standard_D4s_v5 is not a GPU size;").split()}
    assert last_word.strip(",;:") in whole_words  # cut between words, never inside one


def test_times_in_tables_are_rfc3339(ledger: Any) -> None:
    filled(ledger)
    assert "open since 2025-12-02T14:00:00Z" in run("breaker")[1]


# --------------------------------------------------------------------------- errors: one line, a documented code


def test_a_missing_request_file_is_named_exit_2(env: dict[str, str]) -> None:
    result = fleetctl("submit", "no-such-request.json", env=env)
    assert result.returncode == 2 and one_line(result) == "fleetctl submit: no such file: no-such-request.json"


def test_an_unknown_state_is_a_usage_error_listing_the_states(env: dict[str, str]) -> None:
    result = fleetctl("requests", "--state", "bogus", env=env)
    assert result.returncode == 2
    assert "invalid choice: 'bogus'" in result.stderr and "rejected" in result.stderr


def test_a_request_that_does_not_exist_is_not_found_exit_3(env: dict[str, str], ledger: Any) -> None:
    filled(ledger)
    result = fleetctl("requests", "--id", "req-404", env=env)
    assert result.returncode == 3 and "no pool request 'req-404'" in one_line(result)


def test_unreachable_storage_is_one_line_naming_the_endpoint_and_the_setting_exit_1(env: dict[str, str]) -> None:
    closed = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
              "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
              "TableEndpoint=http://127.0.0.1:9/devstoreaccount1;QueueEndpoint=http://127.0.0.1:9/devstoreaccount1")
    result = fleetctl("requests", env={**env, "AzureWebJobsStorage": closed})
    assert result.returncode == 1
    line = one_line(result)
    assert line.startswith("fleetctl requests: cannot reach the ledger table")
    assert "http://127.0.0.1:9/devstoreaccount1" in line and "AzureWebJobsStorage" in line


def test_the_ledger_is_asked_once_with_a_five_second_connect_timeout(env: dict[str, str]) -> None:
    from fleetctl import config, records

    ledger = records.open_ledger(config.Storage.from_settings(env), "x")
    assert ledger._read_attempts == 1
    assert config.CLIENT_OPTIONS == {"retry_total": 0, "connection_timeout": 5, "read_timeout": 10}


def test_read_only_commands_create_no_table(env: dict[str, str], storage_connection_string: str) -> None:
    service = TableServiceClient.from_connection_string(storage_connection_string)
    for command in (("requests",), ("remediations",), ("breaker",), ("status", "--ledger-only")):
        result = fleetctl(*command, env=env)
        assert result.returncode == 0, result.stderr
    assert env["LEDGER_TABLE"] not in [t.name for t in service.list_tables()]


# --------------------------------------------------------------------------- saying what did (not) happen


def test_a_breaker_reset_of_a_closed_breaker_says_nothing_changed_and_writes_nothing(env: dict[str, str],
                                                                                     ledger: Any) -> None:
    ledger.create(record("breaker", "fleet", "closed"))
    result = fleetctl("breaker", "--reset", "--by", "alice", "--reason", "just in case", env=env)
    assert result.returncode == 0 and "nothing to reset, no command written" in result.stdout
    assert ledger.list("command") == []


def test_a_request_id_already_in_the_ledger_is_reported_and_not_sent_unless_resent(env: dict[str, str],
                                                                                  ledger: Any) -> None:
    from azure.storage.queue import QueueClient

    queue = QueueClient.from_connection_string(env["AzureWebJobsStorage"],
                                               json.loads(env["POOL_REQUEST_TEAMS"])["team-a"]["queue"])
    queue.create_queue()
    ledger.create(record("pool-request", "team-a:req-1", "succeeded", requester="team-a"))
    request = json.dumps({"schemaVersion": "1", "requestId": "req-1", "cluster": "/subscriptions/x", "poolName": "a",
                          "vmSize": "Standard_NC4as_T4_v3", "count": 1})
    result = fleetctl("submit", "-", env=env, stdin=request)
    assert result.returncode == 2
    assert "request id req-1 is already in the ledger (succeeded since 2025-12-02T14:01:00Z)" in one_line(result)
    assert queue.peek_messages() == []
    resent = fleetctl("submit", "-", "--resend", env=env, stdin=request)
    assert resent.returncode == 0 and resent.stdout.strip() == "req-1"
    assert len(queue.peek_messages()) == 1


# --------------------------------------------------------------------------- why, and the safety state


def refusal(code: str, reason: str, *, node: str = "aks-gpu1-0-vmss000002", fault: str = "f1") -> Record:
    cluster = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/"
               "Microsoft.ContainerService/managedClusters/c1")
    return Record(kind="dedupe", id=f"refused-{fault}-{code}", state="seen", created_at=1_764_684_000.0,
                  updated_at=1_764_684_000.0,
                  data={"reason": reason, "reason_code": code, "cluster": cluster, "node": node})


def test_why_a_node_names_the_refusal_its_rule_its_settings_and_what_would_change(ledger: Any) -> None:
    ledger.create(refusal("budget-pool", "pool gpu1: 1 of 3 nodes already unavailable, the budget allows 1 "
                                         "(BUDGET_POOL_MAX_UNAVAILABLE=1, BUDGET_POOL_MAX_UNAVAILABLE_PERCENT=20%)"))
    ledger.create(record("remediation", "r9", "done", node="aks-gpu1-0-vmss000000", pool="gpu1", condition="Xid79"))
    code, out = run("why", "aks-gpu1-0-vmss000002", "--ledger-only")
    assert code == 0, out
    assert "refused 2025-12-02T14:00:00Z [budget-pool]: pool gpu1: 1 of 3 nodes already unavailable" in out
    assert "rule: the pool's disruption budget" in out and "BUDGET_POOL_MAX_UNAVAILABLE" in out
    assert "passes by itself when another node of the pool comes back into service" in out
    assert "safety: breaker closed" in out and "aks-gpu1-0-vmss000000" not in out  # another node's remediation
    story = json.loads(run("why", "aks-gpu1-0-vmss000002", "--ledger-only", "-o", "json")[1])
    assert story["refusals"][0]["settings"] == ["BUDGET_POOL_MAX_UNAVAILABLE", "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT"]


@pytest.mark.parametrize("code", sorted(RULES))
def test_why_explains_every_kind_of_refusal(ledger: Any, code: str) -> None:
    ledger.create(refusal(code, f"refused for {code}"))
    out = run("why", "aks-gpu1-0-vmss000002", "--ledger-only")[1]
    rule = RULES[code]
    assert f"[{code}]: refused for {code}" in out and rule.rule in out and rule.to_repair in out
    assert all(setting in out for setting in rule.settings)


def skip(code: str, reason: str, *, node: str = "aks-gpu1-0-vmss000002") -> Record:
    """A decision row as the sweep writes it (shared.remediation.decisions.record_skips)."""
    from shared.remediation import decisions

    cluster = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/"
               "Microsoft.ContainerService/managedClusters/c1")
    found = decisions.SkippedFault(cluster=cluster, node=node, pool="gpu1", condition="UnhealthyNvidiaDevicePlugin",
                                   since=1_764_680_400.0, reason=reason)
    data = decisions.SkipDecision(cluster=cluster, node=node, pool="gpu1", condition=found.condition, since=found.since,
                                  code=code, reason=reason, at=1_764_684_000.0)
    return Record(kind=decisions.KIND, id=found.row_id, state=decisions.SKIPPED, created_at=1_764_684_000.0,
                  updated_at=1_764_684_000.0, data=decisions.to_data(data))


@pytest.mark.parametrize("code", sorted(SKIP_RULES))
def test_why_names_each_kind_of_skip_of_a_faulty_node_with_its_rule(ledger: Any, code: str) -> None:
    ledger.create(skip(code, f"{code}:detail"))
    result_code, out = run("why", "aks-gpu1-0-vmss000002", "--ledger-only")
    rule = SKIP_RULES[code]
    assert result_code == 0, out
    assert (f"skipped 2025-12-02T14:00:00Z [{code}]: {code}:detail, while UnhealthyNvidiaDevicePlugin was True "
            "since 2025-12-02T13:00:00Z") in out
    assert rule.rule in out and rule.to_repair in out and all(setting in out for setting in rule.settings)
    story = json.loads(run("why", "aks-gpu1-0-vmss000002", "--ledger-only", "-o", "json")[1])
    assert [k["code"] for k in story["skips"]] == [code] and story["skips"][0]["passes"] is rule.passes


def test_why_ignores_a_decision_row_it_cannot_read(ledger: Any) -> None:
    ledger.create(Record(kind="decision", id="skip-forged", state="skipped", data={"node": "aks-gpu1-0-vmss000002"}))
    ledger.create(refusal("cooldown", "remediated 10 minutes ago"))
    out = run("why", "aks-gpu1-0-vmss000002", "--ledger-only")[1]
    assert "[cooldown]" in out and "skipped" not in out


def test_why_a_node_nothing_is_known_of_is_not_found_exit_3(env: dict[str, str], ledger: Any) -> None:
    filled(ledger)
    result = fleetctl("why", "aks-nobody-0", "--ledger-only", env=env)
    assert result.returncode == 3 and "nothing recorded about node 'aks-nobody-0'" in one_line(result)


def test_why_a_pool_shows_its_migration_and_why_it_stopped(ledger: Any) -> None:
    ledger.create(record("migration", "m1", "blocked", cluster_name="c1", pool="gput4", replacement="gput4m1",
                         strategy="rolling", reason="the old pool's pods would not fit the replacement: ml/vision",
                         note="blocked"))
    code, out = run("why", "gput4", "--pool", "--ledger-only")
    assert code == 0 and "migration m1: blocked to gput4m1 (rolling)" in out
    assert "reason: the old pool's pods would not fit the replacement" in out


def test_status_shows_the_safety_state_and_the_budgets_in_use(ledger: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMEDIATION_DRY_RUN", "true")
    monkeypatch.setenv("BUDGET_MAX_IN_FLIGHT", "4")
    filled(ledger)
    out = run("status", "--ledger-only")[1]
    assert "safety: not paused; REMEDIATION_DRY_RUN: remediation acts on nothing; migration off (MIGRATION_ENABLED)" in out
    assert "remediations in flight: 1 of 4 (BUDGET_MAX_IN_FLIGHT)" in out
    assert "breaker open: 0 unhealthy in the last 600 s, opens at 30%" in out
    data = json.loads(run("status", "--ledger-only", "-o", "json")[1])["safety"]
    assert data["remediation_dry_run"] is True and data["budgets"]["fleet_max_in_flight"] == 4

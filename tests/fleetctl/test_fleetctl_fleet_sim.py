"""fleetctl's commands that read ARM, run as an operator runs them: the real ``python -m fleetctl`` with the
simulator's ``--endpoints`` and Azurite (issue 22, item 1).

- ``submit --dry-run`` gives the verdict of the app's own intake (shared.pools.intake.judge: the seed's rules,
  the cluster's scope read from ARM, the team's limits), sends nothing, and exits 2 on a rejection.
- ``plan`` says when migration is off and why, and creates nothing (no ledger table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueClient

from sim.testing import SimHandle, start_sim

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=yaml.safe_load((ROOT / "sim/scenarios/default.yaml").read_text()), speed=60.0) as handle:
        yield handle


@pytest.fixture
def env(sim: SimHandle, storage_connection_string: str, names: Any) -> dict[str, str]:
    queue = names.queue("requests")
    QueueClient.from_connection_string(storage_connection_string, queue).create_queue()
    return {"AzureWebJobsStorage": storage_connection_string, "TeamRequestsStorage": storage_connection_string,
            "LEDGER_TABLE": names.table("ledger"), "POOL_REQUEST_QUEUE": queue,
            "POOL_REQUEST_TEAMS": json.dumps({"team-a": {"clusters": "*", "queue": queue,
                                                         "maxGpusPerRequest": 4}})}


def fleetctl(sim: SimHandle, env: dict[str, str], *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl", "--endpoints", str(sim.state_dir / "endpoints.json"), *argv],
                          cwd=ROOT, env={**os.environ, **env}, input=stdin, capture_output=True, text=True, timeout=120)


def request(sim: SimHandle, **fields: Any) -> str:
    return json.dumps({"schemaVersion": "1", "requestId": "dry-1", "requester": "team-a@example.com",
                       "cluster": sim.cluster("ml-platform")["id"],
                       "poolName": "gpudry", "vmSize": "Standard_NC4as_T4_v3", "count": 1, **fields})


def queued(env: dict[str, str]) -> int:
    return len(QueueClient.from_connection_string(env["AzureWebJobsStorage"], env["POOL_REQUEST_QUEUE"]).peek_messages())


def test_a_dry_run_of_a_valid_request_says_it_would_be_accepted_and_sends_nothing(sim: SimHandle,
                                                                                  env: dict[str, str]) -> None:
    result = fleetctl(sim, env, "submit", "-", "--dry-run", stdin=request(sim))
    assert result.returncode == 0, result.stderr
    assert "the app would accept this request: dry-1" in result.stdout and "nothing was sent" in result.stdout
    assert queued(env) == 0


def test_a_dry_run_of_a_request_the_app_would_reject_lists_its_problems_and_exits_2(sim: SimHandle,
                                                                                   env: dict[str, str]) -> None:
    result = fleetctl(sim, env, "submit", "-", "--dry-run", "-o", "json",
                      stdin=request(sim, vmSize="Standard_D4s_v5", count=8))
    assert result.returncode == 2, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["would_accept"] is False and {p["field"] for p in verdict["problems"]} >= {"vmSize"}
    assert queued(env) == 0


def test_a_dry_run_applies_the_teams_limits(sim: SimHandle, env: dict[str, str]) -> None:
    result = fleetctl(sim, env, "submit", "-", "--dry-run", stdin=request(sim, count=5))  # 5 T4 GPUs, the team allows 4
    assert result.returncode == 2
    assert "the app would reject this request" in result.stdout and "maxGpusPerRequest" in result.stdout


def test_a_dry_run_of_a_cluster_out_of_scope_is_rejected_as_intake_would(sim: SimHandle, env: dict[str, str]) -> None:
    result = fleetctl(sim, env, "submit", "-", "--dry-run", stdin=request(sim) .replace(
        sim.cluster("ml-platform")["id"], sim.cluster("research-lab")["id"]))
    assert result.returncode == 2 and "cluster" in result.stdout


def test_plan_says_migration_is_off_and_creates_no_table(sim: SimHandle, env: dict[str, str],
                                                         storage_connection_string: str) -> None:
    result = fleetctl(sim, env, "plan")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("migration is off (MIGRATION_ENABLED is not true)")
    assert json.loads(fleetctl(sim, env, "plan", "-o", "json").stdout)["migration_enabled"] is False
    on = fleetctl(sim, {**env, "MIGRATION_ENABLED": "true"}, "plan")
    assert on.returncode == 0 and on.stdout.startswith("Migration plan at")
    tables = [t.name for t in TableServiceClient.from_connection_string(storage_connection_string).list_tables()]
    assert env["LEDGER_TABLE"] not in tables


def test_why_a_node_reads_its_evaluation_now_from_its_cluster(sim: SimHandle, env: dict[str, str]) -> None:
    cluster = next(c for c in sim.state()["clusters"] if c["name"] == "ml-train")
    node = next(n["name"] for n in cluster["nodes"] if n["pool"] == "gput4")
    result = fleetctl(sim, env, "why", node, "--cluster", "ml-train", "-o", "json")
    assert result.returncode == 0, result.stderr
    story = json.loads(result.stdout)
    assert story["cluster"] == "ml-train" and story["now"]["bucket"] in ("healthy", "pending", "unhealthy", "skipped")
    gone = fleetctl(sim, env, "why", "aks-gput4-00000000-vmss00zzzz", "--cluster", "ml-train")
    assert gone.returncode == 3 and "not in the cluster" in gone.stderr

"""The real app, indexed as the worker indexes it, has one pool-request trigger per team.

A queue trigger names one fixed queue, so function_app registers ``pool_requests_<team>`` for each
team of POOL_REQUEST_TEAMS at import time, on the team's queue in the team-facing storage account
(connection TeamRequestsStorage). Indexed in a fresh interpreter (``python -m devhost functions``),
since the registration happens at import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg"
           "/providers/Microsoft.ContainerService/managedClusters/c1")


def _functions(tmp_path: Path, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"Values": {"AzureWebJobsStorage": "UseDevelopmentStorage=true",
                                               "TeamRequestsStorage": "UseDevelopmentStorage=true",
                                               "NUDGE_QUEUE": "steward-nudge", "RECONCILE_SCHEDULE": "*/30 * * * * *",
                                               "SWEEP_SCHEDULE": "0 * * * * *", "MIGRATION_SCHEDULE": "0 */15 * * * *",
                                               **values}}))
    return subprocess.run([sys.executable, "-m", "devhost", "functions", "--settings", str(settings), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)


def test_the_app_registers_one_queue_trigger_per_team_on_its_queue_and_the_team_connection(tmp_path: Path) -> None:
    teams = {"ml-platform": {"clusters": [CLUSTER]}, "research": {"clusters": "*", "queue": "research-inbox"}}
    result = _functions(tmp_path, {"POOL_REQUEST_TEAMS": json.dumps(teams)})
    assert result.returncode == 0, result.stderr[-3000:]
    listed = {f["name"]: f for f in json.loads(result.stdout)}
    pool = {name: f for name, f in listed.items() if name.startswith("pool_requests")}
    assert set(pool) == {"pool_requests_ml_platform", "pool_requests_research"}
    triggers = {name: f["trigger"] for name, f in pool.items()}
    assert triggers["pool_requests_ml_platform"]["queueName"] == "gpu-pool-requests-ml-platform"
    assert triggers["pool_requests_research"]["queueName"] == "research-inbox"
    assert {t["type"] for t in triggers.values()} == {"queueTrigger"}
    assert {t["connection"] for t in triggers.values()} == {"TeamRequestsStorage"}
    # the nudge goes to the host's own storage, not to the team-facing account
    for f in pool.values():
        [nudge] = f["outputs"]
        assert (nudge["queueName"], nudge["connection"]) == ("steward-nudge", "AzureWebJobsStorage")
    assert {"reconcile_timer", "reconcile_nudge", "health_sweep", "remediation_events",
            "migration_planner"} <= set(listed)


def test_without_teams_there_is_no_pool_request_trigger_at_all(tmp_path: Path) -> None:
    result = _functions(tmp_path, {})
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [f for f in json.loads(result.stdout) if f["name"].startswith("pool_requests")]


def test_a_malformed_teams_setting_stops_indexing_naming_the_setting(tmp_path: Path) -> None:
    result = _functions(tmp_path, {"POOL_REQUEST_TEAMS": json.dumps({"ml-platform": {"sizes": "*"}})})
    assert result.returncode != 0
    assert "POOL_REQUEST_TEAMS" in result.stderr and "ml-platform" in result.stderr
    assert "the app could not be indexed" in result.stderr and "Traceback" not in result.stderr


def test_registering_the_team_triggers_keeps_the_cold_start_free_of_heavy_sdks() -> None:
    import os

    heavy = ("azure.mgmt", "kubernetes", "azure.identity", "azure.eventgrid", "azure.data.tables", "msgspec")
    code = ("import json, sys\nimport function_app\n"
            "print(json.dumps([f.get_function_name() for f in function_app.app.get_functions()]))\n"
            f"print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {heavy!r}))))")
    env = {**os.environ, "POOL_REQUEST_TEAMS": json.dumps({"ml-platform": {"clusters": [CLUSTER]}})}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    names, loaded = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
    assert "pool_requests_ml_platform" in names
    assert loaded == []

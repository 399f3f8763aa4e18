"""fleetctl submit sends to the team's queue and needs no right but sending: it never creates a queue."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueServiceClient

from fleetctl import cli, config
from fleetctl.config import ConfigError

REQUEST = {"schemaVersion": "1", "requestId": "team-b-001", "requester": "someone@example.com",
           "cluster": "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/"
                      "Microsoft.ContainerService/managedClusters/c1",
           "poolName": "gpub", "vmSize": "Standard_NC4as_T4_v3", "count": 1}


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


@pytest.fixture
def two_teams(storage_connection_string: str, names: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    queues = {"team-a": names.queue("team-a"), "team-b": names.queue("team-b")}
    monkeypatch.setenv("TeamRequestsStorage", storage_connection_string)
    monkeypatch.delenv("POOL_REQUEST_TEAM", raising=False)
    monkeypatch.setenv("POOL_REQUEST_TEAMS", json.dumps({t: {"clusters": "*", "queue": q} for t, q in queues.items()}))
    return queues


def _exists(connection: str, queue: str) -> bool:
    return any(q.name == queue for q in QueueServiceClient.from_connection_string(connection).list_queues(
        name_starts_with=queue))


def test_submit_against_a_missing_queue_fails_naming_it_and_does_not_create_it(
        two_teams: dict[str, str], storage_connection_string: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(REQUEST))
    code, _ = run("submit", str(path), "--team", "team-b")
    err = capsys.readouterr().err
    assert code == 2
    assert two_teams["team-b"] in err and "does not exist" in err and "infra/" in err
    assert not _exists(storage_connection_string, two_teams["team-b"])


def test_submit_sends_to_the_named_teams_queue_only(two_teams: dict[str, str], storage_connection_string: str,
                                                    tmp_path: Path) -> None:
    for queue in two_teams.values():
        QueueClient.from_connection_string(storage_connection_string, queue).create_queue()
    path = tmp_path / "request.json"
    path.write_text(json.dumps(REQUEST))
    code, out = run("submit", str(path), "--team", "team-b", "--json")
    assert code == 0 and json.loads(out)["queue"] == two_teams["team-b"]
    b = QueueClient.from_connection_string(storage_connection_string, two_teams["team-b"])
    a = QueueClient.from_connection_string(storage_connection_string, two_teams["team-a"])
    assert len(list(b.peek_messages(max_messages=5))) == 1 and list(a.peek_messages(max_messages=5)) == []


def test_with_several_teams_submit_asks_which_one() -> None:
    settings = {"POOL_REQUEST_TEAMS": json.dumps({"team-a": {"clusters": "*"}, "team-b": {"clusters": "*"}})}
    with pytest.raises(ConfigError, match="--team"):
        config.pool_request_queue(settings)
    assert config.pool_request_queue(settings, "team-a") == "gpu-pool-requests-team-a"
    assert config.pool_request_queue({**settings, "POOL_REQUEST_TEAM": "team-b"}) == "gpu-pool-requests-team-b"
    with pytest.raises(ConfigError, match="no team 'team-c'"):
        config.pool_request_queue(settings, "team-c")


def test_a_team_member_without_the_apps_settings_gets_the_default_queue_name_of_the_team() -> None:
    assert config.pool_request_queue({}, "vision") == "gpu-pool-requests-vision"


def test_submit_needs_the_team_requests_storage_not_the_hosts(monkeypatch: pytest.MonkeyPatch,
                                                              storage_connection_string: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TeamRequestsStorage", raising=False)
    monkeypatch.delenv("TeamRequestsStorage__queueServiceUri", raising=False)
    monkeypatch.setenv("AzureWebJobsStorage", storage_connection_string)
    path = tmp_path / "request.json"
    path.write_text(json.dumps(REQUEST))
    assert run("submit", str(path), "--queue", "anything")[0] == 2
    assert "TeamRequestsStorage" in capsys.readouterr().err


def test_the_sdk_reports_a_missing_queue_on_send_which_submit_relies_on(storage_connection_string: str,
                                                                        names: Any) -> None:
    client = QueueClient.from_connection_string(storage_connection_string, names.queue("missing"))
    with pytest.raises(ResourceNotFoundError):
        client.send_message("x")

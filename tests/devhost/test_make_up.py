"""``make up`` (``python -m devstack up``) gives a stack to try fleetctl on, keeps it until stopped, and keeps
its storage across restarts (issue 22, item 3): the README's "Try it" commands run against it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from azure.data.tables import TableClient

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def start(state: Path) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "devstack", "up", "--state", str(state), "--hosts", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def ready() -> bool:
        assert proc.stdout is not None and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())
        return any(line.startswith("(Ctrl-C stops it)") for line in lines)

    wait_until(ready, timeout=120, interval=0, what="make up to say it is up")
    return proc, lines


def stop(proc: subprocess.Popen[str]) -> int:
    os.killpg(proc.pid, signal.SIGINT)
    return proc.wait(timeout=60)


def fleetctl(settings: str, endpoints: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl", "--settings", settings, "--endpoints", endpoints, *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_make_up_prints_what_to_use_serves_fleetctl_until_stopped_and_keeps_its_storage(tmp_path: Path) -> None:
    state = tmp_path / "up"
    proc, lines = start(state)
    try:
        text = "".join(lines)
        settings = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("settings:"))
        endpoints = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("endpoints:"))
        assert "stack up: 5 simulated clusters" in text and Path(settings).is_file() and Path(endpoints).is_file()
        status = fleetctl(settings, endpoints, "status")
        assert status.returncode == 0, status.stderr
        assert "clusters in scope:" in status.stdout and "safety:" in status.stdout
        storage = json.loads(Path(settings).read_text())["Values"]["AzureWebJobsStorage"]
        TableClient.from_connection_string(storage, "persisted").create_table()
        TableClient.from_connection_string(storage, "persisted").create_entity({"PartitionKey": "p", "RowKey": "r"})
        done = fleetctl(settings, endpoints, "breaker", "--reset", "--by", "alice", "--reason", "try it")
        assert done.returncode == 0 and "nothing to reset" in done.stdout
    finally:
        assert stop(proc) == 0
    assert (state / "azurite").is_dir() and any((state / "azurite").iterdir())
    proc, lines = start(state)  # a restart finds the same storage
    try:
        settings = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("settings:"))
        storage = json.loads(Path(settings).read_text())["Values"]["AzureWebJobsStorage"]
        assert TableClient.from_connection_string(storage, "persisted").get_entity("p", "r")["RowKey"] == "r"
    finally:
        assert stop(proc) == 0

"""Azurite (the Azure Storage emulator, from npm), installed and started by the project itself.

Used by ``make demo``, ``make test`` and the end-to-end tests: queue and table services on free
loopback ports, in-memory, with telemetry off (it otherwise tries to reach Application Insights).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools" / "azurite"
VERSION = "3.35.0"
ACCOUNT = "devstoreaccount1"
# The well-known development key that every Azurite instance accepts; it is public and not a secret.
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass(frozen=True)
class Azurite:
    queue_port: int
    table_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={DEV_KEY};"
            f"QueueEndpoint=http://127.0.0.1:{self.queue_port}/{ACCOUNT};"
            f"TableEndpoint=http://127.0.0.1:{self.table_port}/{ACCOUNT};"
        )


def binary() -> Path:
    return TOOLS / "node_modules" / ".bin" / "azurite"


def ensure_installed() -> Path:
    """Install the pinned Azurite into .tools/azurite with npm (once)."""
    if not binary().exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed to install Azurite (Node 20 is on the machine image)")
        TOOLS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(TOOLS), f"azurite@{VERSION}", "--no-audit", "--no-fund", "--silent"],
            check=True,
        )
    return binary()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"Azurite did not listen on port {port} in time")


def start(*, queue_port: int | None = None, table_port: int | None = None, log: Path | None = None,
          timeout_s: float = 30.0, location: Path | None = None) -> Azurite:
    """Start queue + table services on loopback; returns once both ports accept. In memory unless
    ``location`` names a directory to keep the data in (Azurite's ``--location``: ``make up`` keeps its
    ledger and queues across restarts)."""
    ensure_installed()
    queue_port = queue_port or free_port()
    table_port = table_port or free_port()
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    # The blob service is started too (the host keeps its timer and lease state there in Azure),
    # on a free port of its own; we only need queues and tables.
    if location is not None:
        Path(location).mkdir(parents=True, exist_ok=True)
    persistence = ["--location", str(location)] if location is not None else ["--inMemoryPersistence"]
    proc = subprocess.Popen(
        [str(binary()), "--silent", "--skipApiVersionCheck", "--disableTelemetry", *persistence,
         "--loose", "--blobHost", "127.0.0.1", "--blobPort", str(free_port()),
         "--queueHost", "127.0.0.1", "--queuePort", str(queue_port),
         "--tableHost", "127.0.0.1", "--tablePort", str(table_port)],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ},
    )
    deadline = time.monotonic() + timeout_s
    try:
        _wait_for(queue_port, deadline)
        _wait_for(table_port, deadline)
    except TimeoutError:
        proc.kill()
        raise
    return Azurite(queue_port=queue_port, table_port=table_port, process=proc)


def stop(azurite: Azurite) -> None:
    if azurite.process and azurite.process.poll() is None:
        azurite.process.terminate()
        try:
            azurite.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            azurite.process.kill()


@contextlib.contextmanager
def running(**kwargs: object) -> Iterator[Azurite]:
    az = start(**kwargs)  # type: ignore[arg-type]
    try:
        yield az
    finally:
        stop(az)

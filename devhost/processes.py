"""Local hosts as separate processes: scaled-out instances, and crashes, for the e2e tests and the soak.

Two host processes against the same Azurite and simulator behave like two instances of the app in
Azure: they compete for messages and deliveries, and neither knows of the other. ``kill()`` is a
crash (SIGKILL): the messages it held stay hidden until their lease runs out and then come back
to whichever host polls first, with a higher dequeue count, exactly as after a worker crash.
``stop()`` is a graceful shutdown (SIGTERM): running invocations finish first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class HostProcessError(RuntimeError):
    """The host process did not start, or died; the message ends with its log."""


class HostProcess:
    """``python -m devhost run`` in a child process, with its settings, endpoints and stats in files."""

    def __init__(self, settings: Mapping[str, str], *, endpoints: Mapping[str, Any] | str | Path | None = None,
                 app: str = "function_app", app_dir: str | Path | None = None, host_json: str | Path | None = None,
                 subscriptions: str | Path | None = None, name: str | None = None,
                 queue_lease_s: float | None = None, work_dir: str | Path | None = None, verbose: bool = False) -> None:
        self.name = name or f"host-{uuid.uuid4().hex[:6]}"
        self._tmp = None if work_dir else tempfile.TemporaryDirectory(prefix="devhost-")
        self.work_dir = Path(work_dir or self._tmp.name)  # type: ignore[union-attr]
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.settings = dict(settings)
        self.settings_path = self.work_dir / f"{self.name}.settings.json"
        self.stats_path = self.work_dir / f"{self.name}.stats.json"
        self.ready_path = self.work_dir / f"{self.name}.ready"
        self.log_path = self.work_dir / f"{self.name}.log"
        self.settings_path.write_text(json.dumps({"IsEncrypted": False, "Values": self.settings}), encoding="utf-8")
        endpoints_path: Path | None = None
        if isinstance(endpoints, Mapping):
            endpoints_path = self.work_dir / f"{self.name}.endpoints.json"
            endpoints_path.write_text(json.dumps(dict(endpoints)), encoding="utf-8")
        elif endpoints is not None:
            endpoints_path = Path(endpoints)
        self.command = [sys.executable, "-m", "devhost", "run", "--settings", str(self.settings_path), "--app", app,
                        "--name", self.name, "--stats", str(self.stats_path), "--ready-file", str(self.ready_path)]
        for flag, value in (("--endpoints", endpoints_path), ("--app-dir", app_dir), ("--host-json", host_json),
                            ("--subscriptions", subscriptions), ("--queue-lease", queue_lease_s)):
            if value is not None:
                self.command += [flag, str(value)]
        if verbose:
            self.command.append("--verbose")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 60.0) -> HostProcess:
        """Start the process and return once the host has indexed the app and started its listeners."""
        env = {k: v for k, v in os.environ.items() if k not in self.settings}  # the file's values must apply
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ready_path.exists():
            if self.process.poll() is not None:
                raise HostProcessError(f"host {self.name} exited with {self.process.returncode}: {self.log()[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise HostProcessError(f"host {self.name} did not start in {timeout:.0f} s: {self.log()[-4000:]}")
            time.sleep(0.05)
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def stop(self, *, timeout: float = 60.0) -> dict[str, Any]:
        """Graceful stop (SIGTERM, running invocations finish); returns the host's final stats."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise HostProcessError(f"host {self.name} did not stop in {timeout:.0f} s: {self.log()[-4000:]}") from None
        return self.stats()

    def kill(self) -> None:
        """Crash the host (SIGKILL): nothing is handed back, leases run out on their own."""
        if self.running:
            assert self.process is not None
            self.process.kill()
            self.process.wait(10)

    def stats(self) -> dict[str, Any]:
        """The stats the host wrote when it stopped ({} after a crash)."""
        if not self.stats_path.exists():
            return {}
        return dict(json.loads(self.stats_path.read_text(encoding="utf-8")))

    def __enter__(self) -> HostProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

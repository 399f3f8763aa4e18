"""``start_sim``: run the simulator as a subprocess for a test, and talk to its control API.

Everyone's tests use this: it starts ``python -m sim serve`` with a scenario (a path, a name in
sim/scenarios/, or a dict written to a temporary file), waits for ``endpoints.json``, and stops the
process on exit, also when the test fails. A crashed simulator fails loudly with its stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 60.0


class SimError(RuntimeError):
    pass


@dataclass
class SimHandle:
    state_dir: Path
    endpoints: dict[str, Any]
    process: subprocess.Popen[bytes]
    _ctx: ssl.SSLContext = field(repr=False, default_factory=ssl.create_default_context)

    @property
    def ca_bundle(self) -> str:
        return str(self.endpoints["ca_bundle"])

    def cluster(self, name: str) -> dict[str, Any]:
        for c in self.endpoints["clusters"]:
            if c["name"] == name:
                return dict(c)
        raise KeyError(f"no cluster {name!r} in this simulator")

    def kubeconfig(self, name: str) -> str:
        return str(self.cluster(name)["kubeconfig"])

    def app_kubeconfig(self, name: str) -> bytes:
        """The cluster's kubeconfig as ARM's listClusterUserCredential hands it to the app: the CA inlined
        as ``certificate-authority-data`` (the app refuses a CA file path; shared.adapters.kube)."""
        import base64

        import yaml

        doc = yaml.safe_load(Path(self.kubeconfig(name)).read_text())
        for entry in doc.get("clusters") or []:
            cluster = entry["cluster"]
            path = cluster.pop("certificate-authority", None)
            if path:
                cluster["certificate-authority-data"] = base64.b64encode(Path(path).read_bytes()).decode()
        return yaml.safe_dump(doc).encode()

    def control(self, method: str, path: str, body: Any = None) -> Any:
        """Call the control API (``path`` relative to /_sim, e.g. ``/oracles``); returns the JSON answer.

        Raises :class:`SimError` with the status and body on a non-2xx answer.
        """
        url = f"{self.endpoints['control']}/{path.lstrip('/')}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method.upper(),
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=60) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise SimError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}") from None
        return json.loads(raw) if raw else None

    def oracles(self) -> dict[str, Any]:
        return dict(self.control("GET", "/oracles"))

    def state(self) -> dict[str, Any]:
        return dict(self.control("GET", "/state"))

    def token(self, audience: str) -> str:
        return str(self.control("POST", "/token", {"audience": audience})["access_token"])

    def kube_client(self, cluster: str) -> Any:
        """A ``kubernetes.client.ApiClient`` built from the cluster's kubeconfig (as a user would)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig(cluster))


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the test process dies, so a killed test run leaves no simulator."""
    import ctypes
    import signal

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _scenario_arg(scenario: str | Path | dict[str, Any] | None, state_dir: Path) -> list[str]:
    if scenario is None:
        return []
    if isinstance(scenario, dict):
        path = state_dir / "scenario.json"
        path.write_text(json.dumps(scenario))
        return ["--scenario", str(path)]
    return ["--scenario", str(scenario)]


@contextlib.contextmanager
def start_sim(*, scenario: str | Path | dict[str, Any] | None = None, seed: int = 0, state_dir: Path | None = None,
              speed: float | None = None, extra_args: list[str] | None = None) -> Iterator[SimHandle]:
    """Start ``python -m sim serve``; yield a :class:`SimHandle`; stop it on exit."""
    tmp = None
    if state_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sim-")
        state_dir = Path(tmp.name)
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    endpoints_path = state_dir / "endpoints.json"
    endpoints_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "sim", "serve", "--state-dir", str(state_dir), "--seed", str(seed),
           *_scenario_arg(scenario, state_dir)]
    if speed is not None:
        cmd += ["--speed", str(speed)]
    cmd += list(extra_args or [])
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    stderr_path = state_dir / "sim.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not endpoints_path.exists():
            if proc.poll() is not None:
                raise SimError(f"simulator exited with {proc.returncode}: {stderr_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise SimError(f"simulator did not start in {STARTUP_TIMEOUT_S}s: {stderr_path.read_text()[-4000:]}")
            time.sleep(0.05)
        endpoints = json.loads(endpoints_path.read_text())
        handle = SimHandle(state_dir=state_dir, endpoints=endpoints, process=proc,
                           _ctx=ssl.create_default_context(cafile=endpoints["ca_bundle"]))
        yield handle
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if tmp is not None:
            tmp.cleanup()

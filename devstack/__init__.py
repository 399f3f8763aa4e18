"""A whole local fleet in one call: Azurite, the simulator, app settings and local Functions hosts.

The demo, the end-to-end tests, the benchmarks and the soak all stand on this: it starts Azurite
(npm) and the simulator with a scenario, writes a ``local.settings.json`` that points the app at
them (exactly the settings a real deployment would have, with other endpoints), and starts hosts
(``python -m devhost run``) as separate processes, like scaled-out instances.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devhost import azurite as azurite_mod

ROOT = Path(__file__).resolve().parent.parent

#: Settings that make a simulated fleet move quickly. Thresholds are policy, not physics: a real
#: fleet keeps the defaults of shared/*_policy.py. Everything here is an ordinary app setting.
FAST_PROFILE: dict[str, str] = {
    "FLEET_CLUSTER_TAG": "gpu-fleet-steward=enabled",
    "RECONCILE_SCHEDULE": "*/2 * * * * *",
    "SWEEP_SCHEDULE": "*/3 * * * * *",
    "MIGRATION_SCHEDULE": "*/5 * * * * *",
    "AZURE_CLIENT_ID": "00000000-0000-0000-0000-00000000c11d",
    # pool requests: look at a pool being created or validated every 2 s instead of every 15 s
    "POOL_REQUEST_POLL_INTERVAL_S": "2",
}

#: host.json overrides that make queue retries quick: a failed message is visible again after
#: 1 s (the app's host.json says 30 s) and an idle queue is polled at least every second. The
#: dequeue count and poison queue behave exactly as host.json says (maxDequeueCount is kept).
FAST_HOST_JSON: dict[str, Any] = {
    "extensions": {"queues": {"visibilityTimeout": "00:00:01", "maxPollingInterval": "00:00:01"}},
}


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in, mappings recursively (for host.json overrides)."""
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        out[key] = _merged(current, value) if isinstance(current, Mapping) and isinstance(value, Mapping) else value
    return out


def _write_host_json(path: Path, overrides: Mapping[str, Any]) -> Path:
    """The app's host.json with ``overrides`` merged in, written to ``path``."""
    document = json.loads((ROOT / "host.json").read_text(encoding="utf-8"))
    path.write_text(json.dumps(_merged(document, overrides), indent=2), encoding="utf-8")
    return path


def _app_settings(*, endpoints: Mapping[str, Any], storage: str, profile: Mapping[str, str]) -> dict[str, str]:
    subscriptions: list[str] = []
    for cluster in endpoints.get("clusters") or []:
        parts = str(cluster.get("id", "")).split("/")
        if len(parts) > 2 and parts[2] not in subscriptions:
            subscriptions.append(parts[2])
    values = {
        "FUNCTIONS_WORKER_RUNTIME": "python",
        "AzureWebJobsStorage": storage,
        "FLEET_SUBSCRIPTIONS": ",".join(subscriptions),
        "ARM_ENDPOINT": str(endpoints["arm_endpoint"]),
        "ARM_AUDIENCE": str(endpoints.get("arm_audience") or "https://management.azure.com/"),
        "STEWARD_CA_BUNDLE": str(endpoints["ca_bundle"]),
        "EVENTGRID_TOPIC_ENDPOINT": str(endpoints["eventgrid_topic_endpoint"]),
        "POOL_REQUEST_QUEUE": "gpu-pool-requests",
        "NUDGE_QUEUE": "steward-nudge",
        "LEDGER_TABLE": "stewardledger",
        # The team-facing queues: in Azure a storage account of their own (docs/deploy.md); locally
        # the same Azurite account under the app's second connection name.
        "TeamRequestsStorage": storage,
        "POOL_REQUEST_TEAMS": json.dumps(DEV_TEAMS),
    }
    values.update(FAST_PROFILE)
    values.update(profile)
    return values


#: The local fleet's default team (POOL_REQUEST_TEAMS, shared/pools/teams.py): the platform team, on the
#: queue the end-to-end tests and tools send to, allowed every cluster in scope and every size. A
#: profile may replace POOL_REQUEST_TEAMS with teams of its own (the demo, tests of team limits).
DEV_TEAMS: dict[str, Any] = {"platform": {"clusters": "*", "sizes": "*", "maxGpusPerRequest": 64,
                                          "queue": "gpu-pool-requests"}}


def team_queues(settings: Mapping[str, str]) -> dict[str, str]:
    """Team name -> its pool-request queue, as the app reads them from the settings (in their order)."""
    from shared.pools import teams

    return {t.name: t.queue for t in teams.from_env(settings)}


@dataclass
class Stack:
    state_dir: Path
    azurite: azurite_mod.Azurite
    sim: Any  # sim.testing.SimHandle
    settings: dict[str, str]
    settings_path: Path
    host_json_path: Path | None = None
    hosts: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def endpoints(self) -> dict[str, Any]:
        return dict(self.sim.endpoints)

    @property
    def endpoints_path(self) -> Path:
        return Path(self.sim.state_dir) / "endpoints.json"

    @property
    def app_principal_id(self) -> str:
        """The object id of the app's managed identity in the simulated tenant: what the clusters' RBAC
        bindings and the ARM role assignments name (``kubectl auth can-i --as <it> ...``). The harness
        itself (this Stack, the kubeconfigs, the control API's tokens) acts as an administrator."""
        from sim.identity import APP_PRINCIPAL_ID

        return APP_PRINCIPAL_ID

    # ------------------------------------------------------------------ hosts

    def start_host(self, name: str = "host-1", *, log_name: str | None = None, extra_env: Mapping[str, str] | None = None,
                   ) -> subprocess.Popen[bytes]:
        """Start ``python -m devhost run`` as its own process (one Functions host instance)."""
        log = open(self.state_dir / f"{log_name or name}.log", "ab")  # noqa: SIM115 - owned by the child
        env = {**os.environ, "STEWARD_INSTANCE_NAME": name, **(extra_env or {})}
        command = [sys.executable, "-m", "devhost", "run", "--settings", str(self.settings_path),
                   "--endpoints", str(self.endpoints_path), "--name", name,
                   "--stats", str(self.state_dir / f"{name}.stats.json")]
        if self.host_json_path is not None:
            command += ["--host-json", str(self.host_json_path)]
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        log.close()  # the child has its own descriptor
        self.hosts.append(proc)
        return proc

    def stop_host(self, proc: subprocess.Popen[bytes], *, crash: bool = False, timeout: float = 30.0) -> None:
        """Stop one host: gracefully, or ``crash=True`` to kill it mid-step like a lost instance."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if proc in self.hosts:
            self.hosts.remove(proc)

    def stop_hosts(self) -> None:
        for proc in list(self.hosts):
            self.stop_host(proc)

    # ------------------------------------------------------------------ app-side views

    def context(self) -> Any:
        """An in-process app Context on this stack (for tests and reports; same settings as the hosts)."""
        from shared import settings as settings_mod
        from shared import wiring

        env = {**self.settings, "IDENTITY_ENDPOINT": str(self.endpoints["identity_endpoint"]),
               "IDENTITY_HEADER": str(self.endpoints["identity_header"])}
        for key in ("IDENTITY_ENDPOINT", "IDENTITY_HEADER"):
            os.environ[key] = env[key]
        return wiring.build_context(settings_mod.load(env))

    def ledger(self) -> Any:
        """The ledger table the hosts write (``shared.adapters.ledger.TableLedger``), read straight from Azurite."""
        from azure.data.tables import TableClient

        from shared.adapters.ledger import TableLedger

        client = TableClient.from_connection_string(self.azurite.connection_string,
                                                    table_name=self.settings["LEDGER_TABLE"])
        return TableLedger(client)

    def queue(self, name: str) -> Any:
        from azure.storage.queue import QueueClient, TextBase64EncodePolicy

        client = QueueClient.from_connection_string(self.azurite.connection_string, name,
                                                    message_encode_policy=TextBase64EncodePolicy())
        with contextlib.suppress(Exception):
            client.create_queue()
        return client

    def team_queue(self, team: str | None = None) -> str:
        """The pool-request queue of ``team`` (default: the first team of POOL_REQUEST_TEAMS)."""
        queues = team_queues(self.settings)
        if not queues:
            raise ValueError("POOL_REQUEST_TEAMS names no team, so there is no pool-request queue")
        if team is None:
            return next(iter(queues.values()))
        if team not in queues:
            raise ValueError(f"POOL_REQUEST_TEAMS has no team {team!r}; it has {sorted(queues)}")
        return queues[team]

    def provision_team_queues(self) -> None:
        """Create every team's queue and its poison queue, as infra/ does in Azure (teams cannot)."""
        for queue in team_queues(self.settings).values():
            self.queue(queue)
            self.queue(f"{queue}-poison")

    def submit(self, request: Mapping[str, Any] | str, *, team: str | None = None) -> None:
        """Drop a pool request on ``team``'s queue, base64-encoded as the Functions host reads it."""
        body = request if isinstance(request, str) else json.dumps(request)
        self.queue(self.team_queue(team)).send_message(body)

    def peek_poison(self, team: str | None = None) -> list[str]:
        client = self.queue(self.team_queue(team) + "-poison")
        return [base64.b64decode(m.content).decode() if _is_b64(m.content) else m.content
                for m in client.peek_messages(max_messages=32)]

    def queue_length(self, name: str) -> int:
        """Messages in a queue (visible or not), as the service counts them."""
        return int(self.queue(name).get_queue_properties().approximate_message_count or 0)

    def oracles(self) -> dict[str, Any]:
        return dict(self.sim.oracles())

    def published_events(self) -> list[dict[str, Any]]:
        """Every CloudEvent the simulator's Event Grid topic accepted, oldest first."""
        topic = str(self.endpoints["eventgrid_topic_endpoint"])
        base = topic[: topic.index("/eventgrid/")]
        answer = self._https("GET", f"{base}/eventgrid/_published")
        return [dict(item["event"]) for item in answer.get("events") or []]

    def arm(self, method: str, path: str, *, api_version: str, body: Any = None) -> Any:
        """Call the simulated ARM as a user would (bearer token for ARM); returns the JSON answer."""
        token = self.sim.token(str(self.endpoints.get("arm_audience") or "https://management.azure.com/"))
        url = f"{self.endpoints['arm_endpoint'].rstrip('/')}{path}?api-version={api_version}"
        return self._https(method, url, body=body, headers={"Authorization": f"Bearer {token}"})

    def _https(self, method: str, url: str, *, body: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        import ssl
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={
            **({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})})
        context = ssl.create_default_context(cafile=str(self.endpoints["ca_bundle"]))
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def control(self, method: str, path: str, body: Any = None) -> Any:
        return self.sim.control(method, path, body)


def _is_b64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
        return True
    except (ValueError, TypeError):
        return False


@contextlib.contextmanager
def running(*, scenario: str | Path | Mapping[str, Any] | None = None, seed: int = 0,
            profile: Mapping[str, str] | None = None, state_dir: Path | None = None,
            hosts: int = 0, host_json: Mapping[str, Any] | None = None,
            keep_storage: bool = False) -> Iterator[Stack]:
    """Azurite + simulator (+ ``hosts`` local hosts); everything is stopped on exit.

    ``profile`` adds or overrides app settings (on top of :data:`FAST_PROFILE`); ``host_json`` is
    merged into the app's host.json for the hosts (e.g. :data:`FAST_HOST_JSON`). Without
    ``state_dir`` the state (logs, settings) lives in a temporary directory removed on exit; pass
    one to keep it. ``keep_storage`` keeps Azurite's data under ``state_dir/azurite`` across runs.
    """
    from sim.testing import start_sim

    own_dir = state_dir is None
    base = Path(tempfile.mkdtemp(prefix="steward-")) if own_dir else Path(state_dir)  # type: ignore[arg-type]
    base.mkdir(parents=True, exist_ok=True)
    az = azurite_mod.start(log=base / "azurite.log", location=base / "azurite" if keep_storage else None)
    try:
        with start_sim(scenario=scenario, seed=seed, state_dir=base / "sim") as sim:
            settings = _app_settings(endpoints=sim.endpoints, storage=az.connection_string, profile=profile or {})
            path = base / "local.settings.json"
            path.write_text(json.dumps({"IsEncrypted": False, "Values": settings}, indent=2))
            host_json_path = _write_host_json(base / "host.json", host_json) if host_json else None
            stack = Stack(state_dir=base, azurite=az, sim=sim, settings=settings, settings_path=path,
                          host_json_path=host_json_path)
            stack.provision_team_queues()
            try:
                for i in range(hosts):
                    stack.start_host(f"host-{i + 1}")
                yield stack
            finally:
                stack.stop_hosts()
    finally:
        azurite_mod.stop(az)
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)


def wait_until(predicate: Any, *, timeout: float, interval: float = 0.25, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)

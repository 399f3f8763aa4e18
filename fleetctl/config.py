"""Settings for fleetctl: the app's own settings, from the environment or a local.settings.json.

fleetctl reads the same names as the app (``AzureWebJobsStorage``, ``TeamRequestsStorage``,
``POOL_REQUEST_TEAMS``, ``LEDGER_TABLE``, ...), so one local.settings.json serves the app, the
local host and the tool. ``submit`` needs only the team-requests account and the team's queue.
As with Core Tools, a variable already set in the environment wins over the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_POOL_REQUEST_QUEUE = "gpu-pool-requests"
DEFAULT_LEDGER_TABLE = "stewardledger"
STORAGE = "AzureWebJobsStorage"
TEAM_STORAGE = "TeamRequestsStorage"


class ConfigError(ValueError):
    """Settings fleetctl needs are missing or unreadable; the message says which."""


# An operator's tool answers within seconds: one try, a short connect timeout (storage.TRANSPORT_OPTIONS is the app's).
CLIENT_OPTIONS: dict[str, Any] = {"retry_total": 0, "connection_timeout": 5, "read_timeout": 10}


def load(path: str | Path | None, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment, plus the file's ``Values`` for names the environment does not set."""
    env = dict(os.environ if environ is None else environ)
    if not path:
        return env
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"settings file {path} does not exist") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"settings file {path} is not valid JSON: {error}") from None
    values = document.get("Values") if isinstance(document, dict) else None
    if not isinstance(values, dict):
        raise ConfigError(f"settings file {path} must be an object with a 'Values' object (local.settings.json)")
    merged = {str(k): "" if v is None else str(v) for k, v in values.items()}
    merged.update(env)
    return merged


def with_endpoints(settings: Mapping[str, str], endpoints: str | Path) -> dict[str, str]:
    """Add what the simulator's endpoints.json provides (the identity endpoint, and defaults for ARM,
    the CA bundle, Event Grid and the subscriptions) under the settings already given."""
    from devhost.endpoints import endpoint_settings, read_endpoints

    try:
        document = read_endpoints(endpoints)
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read endpoints file {endpoints}: {error}") from None
    platform, defaults = endpoint_settings(document or {})
    return {**defaults, **settings, **platform}


def use_fleet_clock(endpoints: str | Path) -> None:
    """Run on the simulated fleet's clock (as the local host does) when its endpoints.json has one.

    Times fleetctl writes (the breaker's ``reset_at``) are compared with the fleet's own times (node
    transitions, events' ``observed_at``); on a simulator whose clock runs faster than the wall, the
    system clock would put a reset before faults that happened after it.
    """
    from devhost.endpoints import read_endpoints
    from shared.kernel import clock as clocks

    try:
        c = (read_endpoints(endpoints) or {}).get("clock") or {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read endpoints file {endpoints}: {error}") from None
    if c and not c.get("manual"):
        clocks.use(clocks.ScaledClock(epoch_real=float(c["epoch_real"]), epoch_sim=float(c["epoch_sim"]),
                                      speed=float(c.get("speed", 1.0))))


def export(settings: Mapping[str, str], *, environ: MutableMapping[str, str] | None = None) -> None:
    """Make the settings visible to shared.settings (which reads the environment), file values included."""
    env = os.environ if environ is None else environ
    for name, value in settings.items():
        env.setdefault(name, value)


@dataclass(frozen=True)
class Storage:
    """How to reach the app's storage: a connection string, or service URIs with an Entra identity."""

    connection_string: str = ""
    queue_uri: str = ""
    table_uri: str = ""
    client_id: str = ""
    origin: str = ""  # the setting it came from (AzureWebJobsStorage, TeamRequestsStorage)

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Storage:
        connection = settings.get(STORAGE, "").strip()
        queue_uri = settings.get(f"{STORAGE}__queueServiceUri", "").strip()
        table_uri = settings.get(f"{STORAGE}__tableServiceUri", "").strip()
        account = settings.get(f"{STORAGE}__accountName", "").strip()
        if account and not queue_uri:
            queue_uri = f"https://{account}.queue.core.windows.net"
        if account and not table_uri:
            table_uri = f"https://{account}.table.core.windows.net"
        if not connection and not (queue_uri or table_uri):
            raise ConfigError(f"set {STORAGE} (a connection string) or {STORAGE}__queueServiceUri and "
                              f"{STORAGE}__tableServiceUri, in the environment or with --settings local.settings.json")
        return cls(connection_string=connection, queue_uri=queue_uri, table_uri=table_uri,
                   client_id=settings.get(f"{STORAGE}__clientId", "").strip(), origin=STORAGE)

    @classmethod
    def team_requests(cls, settings: Mapping[str, str]) -> Storage:
        """The team-facing storage account the pool-request queues live in (connection TeamRequestsStorage)."""
        connection = settings.get(TEAM_STORAGE, "").strip()
        queue_uri = settings.get(f"{TEAM_STORAGE}__queueServiceUri", "").strip()
        if not connection and not queue_uri:
            raise ConfigError(f"set {TEAM_STORAGE}__queueServiceUri (the team-requests storage account, e.g. "
                              f"https://<account>.queue.core.windows.net; azd output TEAM_REQUESTS_QUEUE_ENDPOINT) "
                              f"or {TEAM_STORAGE} (a connection string, locally)")
        return cls(connection_string=connection, queue_uri=queue_uri,
                   client_id=settings.get(f"{TEAM_STORAGE}__clientId", "").strip(), origin=TEAM_STORAGE)

    def credential(self) -> object:
        from azure.identity import DefaultAzureCredential

        return DefaultAzureCredential(managed_identity_client_id=self.client_id or None)

    @property
    def setting(self) -> str:
        """The setting this storage came from, for messages."""
        return self.origin or STORAGE

    def queue_client(self, name: str, **options: object) -> object:
        from azure.storage.queue import QueueClient

        options = {**CLIENT_OPTIONS, **options}
        if self.connection_string:
            return QueueClient.from_connection_string(self.connection_string, name, **options)
        if not self.queue_uri:
            raise ConfigError(f"set {STORAGE}__queueServiceUri to reach the queue service")
        return QueueClient(self.queue_uri, name, credential=self.credential(), **options)

    def table_client(self, name: str) -> object:
        from azure.data.tables import TableClient

        if self.connection_string:
            return TableClient.from_connection_string(self.connection_string, table_name=name, **CLIENT_OPTIONS)
        if not self.table_uri:
            raise ConfigError(f"set {STORAGE}__tableServiceUri to reach the table service")
        return TableClient(endpoint=self.table_uri, table_name=name, credential=self.credential(), **CLIENT_OPTIONS)


@dataclass(frozen=True)
class TeamChoice:
    """The team a request is sent for: its name, its queue, and its rules when POOL_REQUEST_TEAMS is known here."""

    name: str | None
    queue: str
    team: object | None = None  # shared.pools.teams.Team


def pool_request_team(settings: Mapping[str, str], team: str | None = None) -> TeamChoice:
    """``team`` (or POOL_REQUEST_TEAM) in POOL_REQUEST_TEAMS; the only team when there is one."""
    from shared.kernel.env import SettingError
    from shared.pools import teams as teams_mod

    try:
        teams = teams_mod.from_env(settings)
    except SettingError as error:
        raise ConfigError(str(error)) from None
    chosen = team or settings.get("POOL_REQUEST_TEAM", "").strip() or None
    if chosen is None:
        if len(teams) == 1:
            return TeamChoice(teams[0].name, teams[0].queue, teams[0])
        raise ConfigError("say which team you send for: --team NAME (or POOL_REQUEST_TEAM), or --queue NAME; "
                          + (f"POOL_REQUEST_TEAMS has {', '.join(t.name for t in teams)}" if teams
                             else "POOL_REQUEST_TEAMS is not set here"))
    found = teams_mod.by_name(teams, chosen)
    if found is None:
        if not teams:  # a team member usually has no copy of the app's settings: the default queue name
            return TeamChoice(chosen, f"{settings.get('POOL_REQUEST_QUEUE', '').strip() or DEFAULT_POOL_REQUEST_QUEUE}-"
                                      f"{chosen}")
        raise ConfigError(f"POOL_REQUEST_TEAMS has no team {chosen!r}; it has {', '.join(t.name for t in teams)}")
    return TeamChoice(found.name, found.queue, found)


def pool_request_queue(settings: Mapping[str, str], team: str | None = None) -> str:
    """The queue of ``team`` (:func:`pool_request_team`)."""
    return pool_request_team(settings, team).queue


def ledger_table(settings: Mapping[str, str]) -> str:
    return settings.get("LEDGER_TABLE", "").strip() or DEFAULT_LEDGER_TABLE

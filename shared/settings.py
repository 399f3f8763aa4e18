"""Every app setting, read once, validated at start, with errors that name the setting.

This is the only module that reads the environment (through the ``shared.kernel.env`` readers, always with
a literal setting name, so that the infrastructure tests can list the settings by scanning the
code). A bad value stops the app at its first invocation with a message naming the setting, rather
than failing later in the middle of a remediation.

The three policies (pool requests, remediation, migration) live with the code that uses them
(``shared.pools.policy``, ``shared.remediation.policy``, ``shared.migration.policy``); :func:`load`
composes them here so that one object describes the whole configuration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from shared.drain.settings import DrainSettings
from shared.kernel.env import SettingError, env_bool, env_int, env_list, env_str
from shared.kernel.retention import RetentionPolicy

if TYPE_CHECKING:
    from shared.migration.policy import MigrationPolicy
    from shared.pools.policy import PoolRequestPolicy
    from shared.pools.teams import Team
    from shared.remediation.dcgm_config import PrometheusTarget
    from shared.remediation.policy import RemediationPolicy

__all__ = ["PLATFORM_SETTINGS", "SettingError", "Settings", "load"]

PLATFORM_SETTINGS: frozenset[str] = frozenset({"IDENTITY_ENDPOINT", "MSI_ENDPOINT"})
"""Read here but set by the platform (App Service / Functions), never as app settings."""

DEFAULT_CLUSTER_TAG = "gpu-fleet-steward=enabled"
DEFAULT_ARM_ENDPOINT = "https://management.azure.com"
DEFAULT_ARM_AUDIENCE = "https://management.azure.com/"
DEFAULT_AKS_SERVER_APP_ID = "6dae42f8-4368-4678-94ff-3960e28e3630"
# The app's own namespace in every cluster (infra/kubernetes/namespace.yaml): leases, sample Jobs (node Events: `default`).
DEFAULT_STEWARD_NAMESPACE = "gpu-fleet-steward"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DEFAULT_EVENTGRID_AUDIENCE = "https://eventgrid.azure.net"
DEFAULT_EVENT_SOURCE = "/gpu-fleet-steward"

_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_CLUSTER_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)"
    r"/providers/microsoft\.containerservice/managedclusters/(?P<name>[^/]+)$",
    re.IGNORECASE,
)
_QUEUE_NAME = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{2,62}$")
_TAG_KEY = re.compile(r"^[^<>%&\\?/]{1,512}$")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,\-?]+$")


def _https_url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme.lower() != "https" or not parts.hostname:
        raise SettingError(f"setting {name} must be an https:// URL, got {value!r}")
    return value


def _guid(name: str, value: str) -> str:
    if not _GUID.match(value):
        raise SettingError(f"setting {name} must be a GUID like 00000000-0000-0000-0000-000000000000, got {value!r}")
    return value.lower()


def _cluster_tag(name: str, value: str) -> tuple[str, str]:
    key, sep, tag_value = value.partition("=")
    key, tag_value = key.strip(), tag_value.strip()
    if not sep or not key or not _TAG_KEY.match(key):
        raise SettingError(f"setting {name} must be key=value (a tag key without < > % & \\ ? /), got {value!r}")
    return key, tag_value


def _cluster_ids(name: str, values: tuple[str, ...], subscriptions: tuple[str, ...]) -> tuple[str, ...]:
    ids = []
    for value in values:
        match = _CLUSTER_ID.match(value)
        if not match:
            raise SettingError(
                f"setting {name} must list managed cluster ARM ids "
                f"(/subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.ContainerService/managedClusters/<name>), "
                f"got {value!r}")
        if match["sub"].lower() not in subscriptions:
            raise SettingError(f"setting {name}: cluster {value!r} is not in FLEET_SUBSCRIPTIONS")
        ids.append(value)
    return tuple(ids)


def _queue(name: str, value: str) -> str:
    if not _QUEUE_NAME.match(value):
        raise SettingError(
            f"setting {name} must be a storage queue name (3-63 lowercase letters, digits and single hyphens, "
            f"starting and ending with a letter or digit), got {value!r}")
    return value


def _table(name: str, value: str) -> str:
    if not _TABLE_NAME.match(value) or value.lower() == "tables":
        raise SettingError(
            f"setting {name} must be a table name (3-63 letters and digits, starting with a letter), got {value!r}")
    return value


def _schedule(name: str, value: str) -> str:
    fields_ = value.split()
    if len(fields_) != 6 or not all(_CRON_FIELD.match(f) for f in fields_):
        raise SettingError(f"setting {name} must be an NCRONTAB expression with 6 fields "
                           f"({{second}} {{minute}} {{hour}} {{day}} {{month}} {{day-of-week}}), got {value!r}")
    return value


def _connection_string(name: str, value: str) -> str:
    if value.strip().lower() == "usedevelopmentstorage=true":
        return value
    pairs = dict(part.split("=", 1) for part in value.split(";") if "=" in part)
    keys = {k.strip().lower() for k in pairs}
    if not keys & {"accountname", "tableendpoint", "queueendpoint", "blobendpoint"}:
        # Never echo the value: a connection string may hold an account key.
        raise SettingError(f"setting {name} must be a storage connection string (AccountName=...;AccountKey=... "
                           f"or UseDevelopmentStorage=true), or be replaced by its identity-based {name}__* settings")
    return value


@dataclass(frozen=True)
class Settings:
    """The validated configuration. Built by :func:`load`; tests may build one directly."""

    subscriptions: tuple[str, ...]
    eventgrid_topic_endpoint: str
    cluster_tag: tuple[str, str] | None = ("gpu-fleet-steward", "enabled")
    cluster_ids: tuple[str, ...] = ()
    arm_endpoint: str = DEFAULT_ARM_ENDPOINT
    arm_audience: str = DEFAULT_ARM_AUDIENCE
    aks_server_app_id: str = DEFAULT_AKS_SERVER_APP_ID
    namespace: str = DEFAULT_STEWARD_NAMESPACE
    azure_client_id: str = ""
    managed_identity_available: bool = False
    ca_bundle: str = ""
    storage_connection_string: str = field(default="", repr=False)
    storage_table_uri: str = ""
    storage_queue_uri: str = ""
    storage_credential: str = ""
    storage_client_id: str = ""
    pool_request_queue: str = "gpu-pool-requests"  # prefix of the teams' default queue names (shared.pools.teams)
    teams: tuple[Team, ...] = ()  # POOL_REQUEST_TEAMS: who may ask for which pools, on which queue
    nudge_queue: str = "steward-nudge"
    ledger_table: str = "stewardledger"
    eventgrid_audience: str = DEFAULT_EVENTGRID_AUDIENCE
    event_source: str = DEFAULT_EVENT_SOURCE
    reconcile_schedule: str = "0 */5 * * * *"  # a safety net: delayed nudges (shared.kernel.nudge) pace the work
    reconcile_max_permanent_tries: int = 5  # permanent step failures in a row before the record gives up
    reconcile_delayed_nudges: bool = True  # wake the reconciler when a record is due (shared.kernel.nudge); false: timer only
    sweep_schedule: str = "0 * * * * *"
    migration_schedule: str = "0 */15 * * * *"
    paused: bool = False
    instance_name: str = ""
    appinsights_connection_string: str = field(default="", repr=False)
    # None only in Settings built by hand for tests that do not need them; load() always sets them.
    pool_requests: PoolRequestPolicy | None = None
    remediation: RemediationPolicy | None = None
    migration: MigrationPolicy | None = None
    drain: DrainSettings = field(default_factory=DrainSettings)  # the pod rules, bounds and default pace of every drain
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)  # LEDGER_*: how long each kind of row is kept
    # SIGNALS_PROMETHEUS: lower-case cluster id -> where its DCGM series are (shared.remediation.dcgm_config)
    signals_prometheus: Mapping[str, PrometheusTarget] = field(default_factory=dict)
    xid_overrides: Mapping[int, str] = field(default_factory=dict)  # SIGNALS_XID_OVERRIDES (signal_policy)

    @property
    def arm_scope(self) -> str:
        return self.arm_audience.rstrip("/") + "/.default"

    @property
    def aks_scope(self) -> str:
        return self.aks_server_app_id + "/.default"

    @property
    def eventgrid_scope(self) -> str:
        return self.eventgrid_audience.rstrip("/") + "/.default"

    def describe(self) -> dict[str, Any]:
        """The settings for a start-up log line: no secrets (connection strings show only whether set)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("storage_connection_string", "appinsights_connection_string"):
                out[f.name] = "(set)" if value else "(not set)"
            elif f.name == "teams":
                out[f.name] = {t.name: t.describe() for t in value}
            elif f.name in ("pool_requests", "remediation", "migration", "drain", "retention"):
                out[f.name] = _describe_policy(value)
            elif f.name == "signals_prometheus":
                out[f.name] = {t.cluster_id: t.endpoint for t in value.values()}
            elif f.name == "xid_overrides":
                out[f.name] = {str(k): v for k, v in value.items()}
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            else:
                out[f.name] = value
        return out


def _describe_policy(policy: Any) -> Any:
    if policy is None:
        return None
    try:
        return {f.name: getattr(policy, f.name) for f in fields(policy)}
    except TypeError:
        return repr(policy)


def load(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every setting from ``env`` (default: the process environment)."""
    subscriptions = tuple(_guid("FLEET_SUBSCRIPTIONS", s) for s in env_list("FLEET_SUBSCRIPTIONS", env=env))
    if not subscriptions:
        raise SettingError("setting FLEET_SUBSCRIPTIONS is required: comma-separated subscription ids in scope")

    tag_text = env_str("FLEET_CLUSTER_TAG", DEFAULT_CLUSTER_TAG, env=env)
    cluster_tag = _cluster_tag("FLEET_CLUSTER_TAG", tag_text)
    cluster_ids = _cluster_ids("FLEET_CLUSTERS", env_list("FLEET_CLUSTERS", env=env), subscriptions)

    arm_endpoint = _https_url("ARM_ENDPOINT", env_str("ARM_ENDPOINT", DEFAULT_ARM_ENDPOINT, env=env)).rstrip("/")
    arm_audience = _https_url("ARM_AUDIENCE", env_str("ARM_AUDIENCE", DEFAULT_ARM_AUDIENCE, env=env))
    aks_server_app_id = _guid("AKS_SERVER_APP_ID", env_str("AKS_SERVER_APP_ID", DEFAULT_AKS_SERVER_APP_ID, env=env))
    namespace = env_str("STEWARD_NAMESPACE", DEFAULT_STEWARD_NAMESPACE, env=env)
    if not _DNS_LABEL.fullmatch(namespace):
        raise SettingError(f"setting STEWARD_NAMESPACE must be a Kubernetes namespace name (a DNS label), got {namespace!r}")
    client_id = env_str("AZURE_CLIENT_ID", env=env)
    azure_client_id = _guid("AZURE_CLIENT_ID", client_id) if client_id else ""
    managed_identity_available = bool(env_str("IDENTITY_ENDPOINT", env=env) or env_str("MSI_ENDPOINT", env=env))

    ca_bundle = env_str("STEWARD_CA_BUNDLE", env=env)
    if ca_bundle and not Path(ca_bundle).is_file():
        raise SettingError(f"setting STEWARD_CA_BUNDLE names a file that does not exist: {ca_bundle!r}")

    connection = env_str("AzureWebJobsStorage", env=env)
    table_uri = env_str("AzureWebJobsStorage__tableServiceUri", env=env)
    queue_uri = env_str("AzureWebJobsStorage__queueServiceUri", env=env)
    account = env_str("AzureWebJobsStorage__accountName", env=env)
    storage_credential = env_str("AzureWebJobsStorage__credential", env=env)
    storage_client_id = env_str("AzureWebJobsStorage__clientId", env=env)
    if connection:
        _connection_string("AzureWebJobsStorage", connection)
    else:
        if account:
            table_uri = table_uri or f"https://{account}.table.core.windows.net"
            queue_uri = queue_uri or f"https://{account}.queue.core.windows.net"
        if not table_uri or not queue_uri:
            raise SettingError(
                "setting AzureWebJobsStorage is required: a connection string locally, or identity-based "
                "AzureWebJobsStorage__tableServiceUri and AzureWebJobsStorage__queueServiceUri "
                "(or AzureWebJobsStorage__accountName) in Azure")
        _https_url("AzureWebJobsStorage__tableServiceUri", table_uri)
        _https_url("AzureWebJobsStorage__queueServiceUri", queue_uri)
        if storage_credential and storage_credential.lower() != "managedidentity":
            raise SettingError(f"setting AzureWebJobsStorage__credential must be managedidentity, got {storage_credential!r}")
    if storage_client_id:
        _guid("AzureWebJobsStorage__clientId", storage_client_id)

    pool_request_queue = _queue("POOL_REQUEST_QUEUE", env_str("POOL_REQUEST_QUEUE", "gpu-pool-requests", env=env))
    nudge_queue = _queue("NUDGE_QUEUE", env_str("NUDGE_QUEUE", "steward-nudge", env=env))
    if pool_request_queue == nudge_queue:
        raise SettingError("settings POOL_REQUEST_QUEUE and NUDGE_QUEUE must name different queues")
    from shared.pools import teams as teams_mod

    teams = teams_mod.parse(env_str("POOL_REQUEST_TEAMS", env=env), queue_prefix=pool_request_queue,
                            subscriptions=subscriptions)
    for team in teams:
        if team.queue == nudge_queue:
            raise SettingError(f"setting {teams_mod.SETTING}: team {team.name!r} uses queue {team.queue!r}, "
                               "which is NUDGE_QUEUE; give the team its own queue")
    if teams and not (env_str("TeamRequestsStorage", env=env)
                      or env_str("TeamRequestsStorage__queueServiceUri", env=env)):
        raise SettingError(f"setting {teams_mod.SETTING} names teams, so setting {teams_mod.CONNECTION} (a connection "
                           f"string locally) or {teams_mod.CONNECTION}__queueServiceUri (identity-based, in Azure) "
                           "must say where their queues are")
    ledger_table = _table("LEDGER_TABLE", env_str("LEDGER_TABLE", "stewardledger", env=env))

    eventgrid_topic_endpoint = _https_url(
        "EVENTGRID_TOPIC_ENDPOINT", env_str("EVENTGRID_TOPIC_ENDPOINT", env=env, required=True))
    eventgrid_audience = _https_url(
        "EVENTGRID_AUDIENCE", env_str("EVENTGRID_AUDIENCE", DEFAULT_EVENTGRID_AUDIENCE, env=env))
    event_source = env_str("STEWARD_EVENT_SOURCE", DEFAULT_EVENT_SOURCE, env=env)
    if any(ch.isspace() for ch in event_source):
        raise SettingError(f"setting STEWARD_EVENT_SOURCE must be a URI reference without spaces, got {event_source!r}")

    reconcile_schedule = _schedule("RECONCILE_SCHEDULE", env_str("RECONCILE_SCHEDULE", "0 */5 * * * *", env=env))
    reconcile_max_permanent_tries = env_int("RECONCILE_MAX_PERMANENT_TRIES", 5, env=env, minimum=1, maximum=100)
    reconcile_delayed_nudges = env_bool("RECONCILE_DELAYED_NUDGES", True, env=env)
    sweep_schedule = _schedule("SWEEP_SCHEDULE", env_str("SWEEP_SCHEDULE", "0 * * * * *", env=env))
    migration_schedule = _schedule("MIGRATION_SCHEDULE", env_str("MIGRATION_SCHEDULE", "0 */15 * * * *", env=env))

    paused = env_bool("STEWARD_PAUSED", False, env=env)
    instance_name = env_str("STEWARD_INSTANCE_NAME", env=env)
    appinsights = env_str("APPLICATIONINSIGHTS_CONNECTION_STRING", env=env)
    if appinsights and "=" not in appinsights:
        raise SettingError("setting APPLICATIONINSIGHTS_CONNECTION_STRING must be a connection string "
                           "(InstrumentationKey=...;IngestionEndpoint=...)")

    # The policies are owned by the modules that apply them; their from_env validates their settings.
    from shared.migration import policy as migration_policy
    from shared.pools import policy as pool_policy
    from shared.remediation import dcgm_config, signal_policy
    from shared.remediation import policy as remediation_policy

    signals_prometheus = dcgm_config.parse_targets(env_str("SIGNALS_PROMETHEUS", "", env=env), subscriptions=subscriptions)
    xid_overrides = signal_policy.parse_xid_overrides(env_str("SIGNALS_XID_OVERRIDES", "", env=env))

    return Settings(
        subscriptions=subscriptions,
        cluster_tag=cluster_tag,
        cluster_ids=cluster_ids,
        arm_endpoint=arm_endpoint,
        arm_audience=arm_audience,
        aks_server_app_id=aks_server_app_id,
        namespace=namespace,
        azure_client_id=azure_client_id,
        managed_identity_available=managed_identity_available,
        ca_bundle=ca_bundle,
        storage_connection_string=connection,
        storage_table_uri=table_uri,
        storage_queue_uri=queue_uri,
        storage_credential=storage_credential,
        storage_client_id=storage_client_id,
        pool_request_queue=pool_request_queue,
        teams=teams,
        nudge_queue=nudge_queue,
        ledger_table=ledger_table,
        eventgrid_topic_endpoint=eventgrid_topic_endpoint,
        eventgrid_audience=eventgrid_audience,
        event_source=event_source,
        reconcile_schedule=reconcile_schedule,
        reconcile_max_permanent_tries=reconcile_max_permanent_tries,
        reconcile_delayed_nudges=reconcile_delayed_nudges,
        sweep_schedule=sweep_schedule,
        migration_schedule=migration_schedule,
        paused=paused,
        instance_name=instance_name,
        appinsights_connection_string=appinsights,
        pool_requests=pool_policy.PoolRequestPolicy.from_env(env),
        remediation=remediation_policy.RemediationPolicy.from_env(env),
        migration=migration_policy.MigrationPolicy.from_env(env),
        drain=DrainSettings.from_env(env),
        retention=RetentionPolicy.from_env(env),
        signals_prometheus=signals_prometheus,
        xid_overrides=xid_overrides,
    )

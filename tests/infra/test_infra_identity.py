"""Everything runs as the app's managed identity: no shared keys, no local auth, identity-based connections.

Flex Consumption specifics are checked here too (FC1, Linux, Python 3.11, the deployment package
pulled with the user-assigned identity), since they are what `azd up` creates.
"""

from __future__ import annotations

from typing import Any

import pytest
from infra_facts import (
    INFRA,
    bicep,
    binding_connections,
    resolve,
    resource,
    resource_body,
    resources_of_type,
    variable,
)

# Built-in role ids (learn.microsoft.com/azure/role-based-access-control/built-in-roles).
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
STORAGE_QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR = "8a0f0c08-91a1-4084-bc3d-661d67233fed"
STORAGE_QUEUE_DATA_MESSAGE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"
STORAGE_TABLE_DATA_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
MONITORING_METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"
EVENTGRID_DATA_SENDER = "d5a91429-5739-47e2-a06b-3470a27159e7"

# The service URI setting each binding kind needs for an identity-based connection.
SERVICE_URI_FOR_BINDING = {"queue": "queueServiceUri", "blob": "blobServiceUri", "table": "tableServiceUri"}

# Settings Flex Consumption rejects (the runtime is set in functionAppConfig instead).
FLEX_REJECTED_SETTINGS = {"FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION", "WEBSITE_RUN_FROM_PACKAGE",
                          "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING", "WEBSITE_CONTENTSHARE", "AzureWebJobsStorage"}


def _host_settings() -> dict[str, Any]:
    value: dict[str, Any] = variable(bicep("app/api.bicep"), "hostSettings")
    return value


def _role_ids_in(doc: dict[str, Any], name: str) -> list[str]:
    return [resolve(doc, r) for r in variable(doc, name)]


def test_the_storage_account_refuses_shared_key_access() -> None:
    storage = resource_body(resource(bicep("core/storage/storage-account.bicep"), "storage"))
    assert storage["properties"]["allowSharedKeyAccess"] is False
    assert storage["properties"]["allowBlobPublicAccess"] is False
    assert storage["properties"]["defaultToOAuthAuthentication"] is True
    assert storage["properties"]["minimumTlsVersion"] == "TLS1_2"


def test_application_insights_and_its_workspace_refuse_local_auth() -> None:
    doc = bicep("core/monitor/monitoring.bicep")
    assert resource_body(resource(doc, "applicationInsights"))["properties"]["DisableLocalAuth"] is True
    assert resource_body(resource(doc, "logAnalytics"))["properties"]["features"]["disableLocalAuth"] is True


def test_telemetry_authenticates_with_the_identity() -> None:
    value = _host_settings()["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]
    assert value == "ClientId=${identityClientId};Authorization=AAD"


def test_the_event_grid_topic_takes_cloudevents_and_refuses_keys() -> None:
    topic = resource_body(resource(bicep("core/eventgrid/topic.bicep"), "topic"))
    assert topic["properties"]["inputSchema"] == "CloudEventSchemaV1_0"
    assert topic["properties"]["disableLocalAuth"] is True
    assert topic["identity"]["type"] == "SystemAssigned"  # its own, for dead-lettering only


def test_the_host_storage_connection_is_identity_based() -> None:
    settings = _host_settings()
    for service in ("blobServiceUri", "queueServiceUri", "tableServiceUri"):
        assert f"AzureWebJobsStorage__{service}" in settings
    assert settings["AzureWebJobsStorage__credential"] == "managedidentity"
    assert settings["AzureWebJobsStorage__clientId"] == "identityClientId"
    assert settings["AZURE_CLIENT_ID"] == "identityClientId"


def test_every_binding_connection_in_the_code_is_identity_based() -> None:
    connections = binding_connections()
    assert connections, "functions/ declares no binding with a connection (expected the queue bindings)"
    settings = _host_settings()
    for prefix, kinds in connections.items():
        assert prefix not in settings, f"connection {prefix} is set as a connection string"
        assert settings.get(f"{prefix}__credential") == "managedidentity", f"{prefix}__credential"
        assert settings.get(f"{prefix}__clientId") == "identityClientId", f"{prefix}__clientId"
        for kind in kinds:
            assert kind in SERVICE_URI_FOR_BINDING, f"connection {prefix}: binding kind {kind} has no known identity form"
            assert f"{prefix}__{SERVICE_URI_FOR_BINDING[kind]}" in settings, f"{prefix} misses its {kind} service URI"


def test_no_setting_flex_consumption_rejects_is_set() -> None:
    settings = set(_host_settings()) | set(variable(bicep("main.bicep"), "stewardSettings"))
    assert not settings & FLEX_REJECTED_SETTINGS


def test_the_function_app_runs_python_3_11_on_flex_consumption() -> None:
    doc = bicep("app/api.bicep")
    plan = resource_body(resource(doc, "plan"))
    assert plan["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    assert plan["properties"]["reserved"] is True
    site = resource_body(resource(doc, "functionApp"))
    assert site["kind"] == "functionapp,linux"
    config = site["properties"]["functionAppConfig"]
    assert config["runtime"]["name"] == "python"
    assert resolve(doc, config["runtime"]["version"]) == "3.11"
    assert resolve(doc, config["scaleAndConcurrency"]["maximumInstanceCount"]) >= 40
    assert resolve(doc, config["scaleAndConcurrency"]["instanceMemoryMB"]) in (512, 2048, 4096)


def test_the_deployment_package_is_pulled_with_the_user_assigned_identity() -> None:
    doc = bicep("app/api.bicep")
    site = resource_body(resource(doc, "functionApp"))
    assert site["identity"]["type"] == "UserAssigned"
    storage = site["properties"]["functionAppConfig"]["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"] == {"type": "UserAssignedIdentity", "userAssignedIdentityResourceId": "identityId"}


def test_the_app_is_the_azd_service_and_allows_no_publishing_credentials() -> None:
    doc = bicep("app/api.bicep")
    site = resource_body(resource(doc, "functionApp"))
    assert "'azd-service-name': 'api'" in (INFRA / "app" / "api.bicep").read_text(encoding="utf-8")
    assert site["properties"]["httpsOnly"] is True
    policies = resources_of_type(doc, "Microsoft.Web/sites/basicPublishingCredentialsPolicies")
    assert {resource_body(p)["name"] for p in policies.values()} == {"ftp", "scm"}
    assert all(resource_body(p)["properties"]["allow"] is False for p in policies.values())


@pytest.mark.parametrize(
    "role",
    [STORAGE_QUEUE_DATA_CONTRIBUTOR, STORAGE_TABLE_DATA_CONTRIBUTOR],
    ids=["queue data contributor", "table data contributor"],
)
def test_the_identity_holds_each_account_wide_storage_data_role(role: str) -> None:
    doc = bicep("app/rbac.bicep")
    assert role in _role_ids_in(doc, "storageRoles")
    assignment = resource_body(resource(doc, "identityStorageRoles"))
    assert assignment["properties"]["principalId"] == "identityPrincipalId"
    assert assignment["properties"]["principalType"] == "ServicePrincipal"


def test_the_identity_may_read_and_write_the_deployment_package_it_runs() -> None:
    """Flex Consumption pulls the package with the identity functionAppConfig names, which needs Storage Blob
    Data Contributor on the deployment container (app/rbac.bicep identityBlobRoles, first of its containers)."""
    doc = bicep("app/rbac.bicep")
    assert variable(doc, "storageBlobDataContributor") == STORAGE_BLOB_DATA_CONTRIBUTOR
    assignment = resource_body(resource(doc, "identityBlobRoles"))
    assert assignment["properties"]["principalId"] == "identityPrincipalId"
    containers = variable(doc, "appBlobContainerNames")
    assert containers["function"]["parameters"] == {"arg_1": ["deploymentContainerName"], "arg_2": "hostContainerNames"}
    params = bicep("main.bicep")["modules"]["rbac"]["config"]["params"]
    assert params["deploymentContainerName"] == "deploymentContainerName"
    api_params = bicep("main.bicep")["modules"]["api"]["config"]["params"]
    assert api_params["deploymentContainerName"] == "deploymentContainerName"


def test_the_identity_may_publish_events_and_metrics() -> None:
    doc = bicep("app/rbac.bicep")
    sender = resource_body(resource(doc, "identityEventSender"))
    assert sender["scope"] == "topic"
    assert resolve(doc, sender["properties"]["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]) \
        == EVENTGRID_DATA_SENDER
    metrics = resource_body(resource(doc, "identityMetrics"))
    assert resolve(doc, metrics["properties"]["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]) \
        == MONITORING_METRICS_PUBLISHER


def test_main_wires_the_identity_into_every_connection() -> None:
    modules = bicep("main.bicep")["modules"]
    api = modules["api"]["config"]["params"]
    for name in ("identityId", "identityClientId"):
        assert api[name]["operator"]["operands"]["operand_1"] == "identity", name
    rbac = modules["rbac"]["config"]["params"]
    assert rbac["identityPrincipalId"]["operator"]["operands"]["operand_1"] == "identity"

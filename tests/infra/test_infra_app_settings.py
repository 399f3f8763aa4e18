"""The app settings deployed are exactly the settings the code reads, with the code's defaults.

The code side is derived by scanning shared/ for ``env_*("NAME", default)`` calls and functions/
for ``%NAME%`` binding expressions; the infrastructure side is the union of main.bicep's
``stewardSettings`` and api.bicep's ``hostSettings``. The only differences allowed are listed
below, each with its reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from infra_facts import (
    AZURITE_ACCOUNT_KEY,
    REPO,
    FactError,
    bicep,
    binding_setting_names,
    code_default,
    code_setting_names,
    is_literal,
    resolve,
    variable,
)

from shared.settings import PLATFORM_SETTINGS

LOCAL_SETTINGS_EXAMPLE = REPO / "local.settings.example.json"

# Read by the code, deliberately not set in Azure.
NOT_SET_IN_AZURE: dict[str, str] = {
    "AzureWebJobsStorage": "a connection string, for local runs; Azure uses the identity-based __ settings",
    "AzureWebJobsStorage__accountName": "the __*ServiceUri form is set instead (it works in every cloud)",
    "TeamRequestsStorage": "a connection string to the team queues, for local runs; Azure uses TeamRequestsStorage__*",
    "STEWARD_CA_BUNDLE": "trusts the simulator's CA locally; Azure's endpoints use public CAs",
    "STEWARD_INSTANCE_NAME": "each instance names itself; one fixed value would give scaled-out instances one lease owner",
    **{name: "set by the platform (shared.settings.PLATFORM_SETTINGS)" for name in PLATFORM_SETTINGS},
}

# Set in Azure for the Functions host or the platform, not read by the code through shared.kernel.env.
HOST_SETTINGS: dict[str, str] = {
    "AzureWebJobsStorage__blobServiceUri": "the host's own blob storage (timer schedules, locks)",
    "TeamRequestsStorage__credential": "the teams' queue triggers authenticate with the identity (host connection)",
    "TeamRequestsStorage__clientId": "the identity the host uses for the teams' queue triggers",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING": "the host's telemetry authenticates with the identity",
    "PYTHON_ISOLATE_WORKER_DEPENDENCIES": "the app's azure-functions (CloudEvent binding type) wins over the worker's copy",
}


def code_reads() -> set[str]:
    return code_setting_names() | binding_setting_names()


def deployed_settings() -> dict[str, Any]:
    """Every app setting infra/ sets: main.bicep's stewardSettings + api.bicep's hostSettings."""
    steward = variable(bicep("main.bicep"), "stewardSettings")
    host = variable(bicep("app/api.bicep"), "hostSettings")
    overlap = set(steward) & set(host)
    assert not overlap, f"set twice: {sorted(overlap)}"
    return {**host, **steward}


def test_the_code_reads_its_settings_through_shared_env() -> None:
    names = code_setting_names()
    assert len(names) >= 40, f"only {len(names)} settings found in shared/; the scan is broken"
    assert binding_setting_names() <= names, "a binding uses a %SETTING% that shared/settings.py does not validate"


def test_every_setting_the_code_reads_is_deployed_and_nothing_else() -> None:
    expected = (code_reads() - set(NOT_SET_IN_AZURE)) | set(HOST_SETTINGS)
    deployed = set(deployed_settings())
    assert deployed == expected, (f"deployed but never read: {sorted(deployed - expected)}; "
                                  f"read but not deployed: {sorted(expected - deployed)}")


def test_every_listed_exception_is_still_needed() -> None:
    read = code_reads()
    stale = set(NOT_SET_IN_AZURE) - read
    assert not stale, f"NOT_SET_IN_AZURE lists settings the code no longer reads: {sorted(stale)}"
    now_read = set(HOST_SETTINGS) & read
    assert not now_read, f"HOST_SETTINGS lists settings the code reads now (check them like the others): {sorted(now_read)}"
    assert not set(NOT_SET_IN_AZURE) & set(deployed_settings())


@pytest.mark.parametrize("name", sorted(code_setting_names() - set(NOT_SET_IN_AZURE)))
def test_each_deployed_setting_has_the_default_the_code_uses(name: str) -> None:
    main = bicep("main.bicep")
    api = bicep("app/api.bicep")
    steward = variable(main, "stewardSettings")
    value = resolve(main, steward[name]) if name in steward else resolve(api, deployed_settings()[name])
    default = code_default(name)
    if default is None:
        assert value not in ("", None), f"{name} has no default in the code, so the deployment must provide it"
        return
    assert is_literal(value), f"{name} should be the code's default {default!r}, got the expression {value!r}"
    assert value == default, f"{name}: deployed {value!r}, the code's default is {default!r}"


def test_the_queues_and_table_the_settings_name_are_created_with_their_poison_queues() -> None:
    main = bicep("main.bicep")
    steward = variable(main, "stewardSettings")
    params = main["modules"]["storage"]["config"]["params"]
    queues = {resolve(main, q) for q in params["queueNames"]}
    # The teams' pool-request queues live in their own account: tests/infra/test_infra_team_queues.py.
    for setting in ("NUDGE_QUEUE",):
        queue = resolve(main, steward[setting])
        assert queue in queues
        poison = [q for q in params["queueNames"] if isinstance(q, str) and q == f"${{{steward[setting]}}}-poison"]
        assert poison, f"no poison queue for {setting}"
    assert {resolve(main, t) for t in params["tableNames"]} == {resolve(main, steward["LEDGER_TABLE"])}


def test_overrides_are_empty_unless_the_operator_sets_them() -> None:
    main = bicep("main.bicep")
    assert main["parameters"]["settingOverrides"]["default"] == {}
    app_settings = main["modules"]["api"]["config"]["params"]["appSettings"]["function"]
    assert app_settings["type"] == "union"
    assert list(app_settings["parameters"].values())[:2] == ["stewardSettings", "settingOverrides"]


def test_the_deployed_settings_pass_the_apps_own_validation(tmp_path: Path) -> None:
    from shared.settings import load

    sample = {
        "FLEET_SUBSCRIPTIONS": "00000000-0000-0000-0000-000000000001",
        "FLEET_CLUSTERS": "",
        "EVENTGRID_TOPIC_ENDPOINT": "https://evgt-abc.eastus-1.eventgrid.azure.net/api/events",
        "AZURE_CLIENT_ID": "00000000-0000-0000-0000-000000000002",
        "AzureWebJobsStorage__clientId": "00000000-0000-0000-0000-000000000002",
        "AzureWebJobsStorage__blobServiceUri": "https://stabc.blob.core.windows.net/",
        "AzureWebJobsStorage__queueServiceUri": "https://stabc.queue.core.windows.net/",
        "AzureWebJobsStorage__tableServiceUri": "https://stabc.table.core.windows.net/",
        "APPLICATIONINSIGHTS_CONNECTION_STRING": "IngestionEndpoint=https://eastus-8.in.applicationinsights.azure.com/",
        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING": "ClientId=00000000-0000-0000-0000-000000000002;Authorization=AAD",
        "POOL_REQUEST_TEAMS": json.dumps({"ml-platform": {"clusters": "*"}}),
        "TeamRequestsStorage__queueServiceUri": "https://stteamsabc.queue.core.windows.net/",
        "TeamRequestsStorage__clientId": "00000000-0000-0000-0000-000000000002",
        "TeamRequestsStorage__credential": "managedidentity",
    }
    main = bicep("main.bicep")
    env: dict[str, str] = {}
    for name, value in deployed_settings().items():
        resolved = resolve(main, value)
        if name in sample:
            env[name] = sample[name]
        elif isinstance(resolved, str) and is_literal(resolved):
            env[name] = resolved
        else:
            raise FactError(f"{name} is an expression; add a realistic sample for it here")
    settings = load(env)
    assert settings.storage_connection_string == ""
    assert settings.storage_credential == "managedidentity"
    assert settings.paused is False


def test_local_settings_example_documents_every_setting_the_code_reads() -> None:
    if not LOCAL_SETTINGS_EXAMPLE.exists():
        raise FactError("local.settings.example.json does not exist yet (the lead writes it)")
    values = json.loads(LOCAL_SETTINGS_EXAMPLE.read_text(encoding="utf-8"))["Values"]
    missing = code_reads() - set(PLATFORM_SETTINGS) - set(values) - {
        # The identity-based forms are the alternative to AzureWebJobsStorage; locally it is a connection string.
        "AzureWebJobsStorage__accountName", "AzureWebJobsStorage__queueServiceUri",
        "AzureWebJobsStorage__tableServiceUri", "AzureWebJobsStorage__credential", "AzureWebJobsStorage__clientId",
    }
    assert not missing, f"local.settings.example.json does not document {sorted(missing)}"
    unknown = set(values) - code_reads() - {"FUNCTIONS_WORKER_RUNTIME", "AzureWebJobsFeatureFlags",
                                            "PYTHON_ISOLATE_WORKER_DEPENDENCIES"}
    assert not unknown, f"local.settings.example.json sets settings nothing reads: {sorted(unknown)}"


def test_the_start_up_log_line_shows_no_connection_string() -> None:
    from shared.settings import load

    connection = f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_ACCOUNT_KEY};"
    insights = "Instrumentation" "Key=00000000-0000-0000-0000-000000000009;IngestionEndpoint=https://x.example/"
    settings = load({"FLEET_SUBSCRIPTIONS": "00000000-0000-0000-0000-000000000001",
                     "EVENTGRID_TOPIC_ENDPOINT": "https://evgt.example/api/events",
                     "AzureWebJobsStorage": connection, "APPLICATIONINSIGHTS_CONNECTION_STRING": insights})
    logged = json.dumps(settings.describe(), default=str)
    assert AZURITE_ACCOUNT_KEY not in logged
    assert "InstrumentationKey" not in logged

"""The Event Grid subscription in Azure is the one the local host stands in for.

devhost/eventgrid_subscriptions.json tells the local host which function receives which events,
with which retry policy; infra/app/eventgrid-subscription.bicep creates the real subscription.
They must agree, or what passes locally would be delivered differently in Azure.
"""

from __future__ import annotations

from typing import Any

import pytest
from infra_facts import REPO, bicep, function_names, read_json, resource, resource_body, resources_of_type, variable

SUBSCRIPTIONS_FILE = REPO / "devhost" / "eventgrid_subscriptions.json"
SUBSCRIPTION_TYPE = "Microsoft.EventGrid/topics/eventSubscriptions"


def local_subscriptions() -> dict[str, dict[str, Any]]:
    data = read_json(SUBSCRIPTIONS_FILE)
    return {name: spec for name, spec in data.items() if not name.startswith("$")}


SYSTEM_SUBSCRIPTION_TYPE = "Microsoft.EventGrid/systemTopics/eventSubscriptions"


def azure_subscriptions() -> dict[str, dict[str, Any]]:
    """Function name -> the subscription body delivering to it (the app's topic, and the HealthResources
    system topic of each fleet subscription)."""
    out = {}
    for file, type_, prefix in (("app/eventgrid-subscription.bicep", SUBSCRIPTION_TYPE, "${functionApp.id}/functions/"),
                                ("app/health-events-subscription.bicep", SYSTEM_SUBSCRIPTION_TYPE,
                                 "${functionAppId}/functions/")):
        for res in resources_of_type(bicep(file), type_).values():
            body = resource_body(res)
            target = body["properties"]["destination"]["properties"]["resourceId"]
            assert target.startswith(prefix), target
            out[target.rsplit("/", 1)[1]] = body
    return out


def test_every_event_grid_function_has_a_local_and_an_azure_subscription() -> None:
    functions = {name for name, trigger in function_names().items() if trigger == "event_grid_trigger"}
    assert functions, "functions/ has no Event Grid trigger (expected remediation_events)"
    assert set(local_subscriptions()) == functions
    assert set(azure_subscriptions()) == functions


@pytest.mark.parametrize("function", sorted(local_subscriptions()))
def test_the_azure_subscription_delivers_cloudevents_to_the_function(function: str) -> None:
    body = azure_subscriptions()[function]
    assert body["properties"]["destination"]["endpointType"] == "AzureFunction"
    assert body["properties"]["eventDeliverySchema"] == local_subscriptions()[function]["eventDeliverySchema"]
    assert body["properties"]["eventDeliverySchema"] == "CloudEventSchemaV1_0"


@pytest.mark.parametrize("function", sorted(local_subscriptions()))
def test_the_azure_subscription_filters_the_same_event_types(function: str) -> None:
    body = azure_subscriptions()[function]
    assert sorted(body["properties"]["filter"]["includedEventTypes"]) == \
        sorted(local_subscriptions()[function]["includedEventTypes"])
    assert set(body["properties"]["filter"]) <= {"includedEventTypes", "enableAdvancedFilteringOnArrays"}, \
        "a filter the local host does not apply"


@pytest.mark.parametrize("function", sorted(local_subscriptions()))
def test_the_azure_subscription_retries_like_the_local_host(function: str) -> None:
    retry = azure_subscriptions()[function]["properties"]["retryPolicy"]
    local = local_subscriptions()[function]
    assert retry == {"maxDeliveryAttempts": local["maxDeliveryAttempts"],
                     "eventTimeToLiveInMinutes": local["eventTtlMinutes"]}


@pytest.mark.parametrize("function", sorted(local_subscriptions()))
def test_undeliverable_events_are_dead_lettered_to_blob_storage_with_the_identity(function: str) -> None:
    properties = azure_subscriptions()[function]["properties"]
    assert "deadLetterDestination" not in properties, "dead-lettering must use the identity, not a key"
    dead_letter = properties["deadLetterWithResourceIdentity"]
    # The topic's own identity (allowed to write only the dead-letter container), not the steward's.
    assert dead_letter["identity"] == {"type": "SystemAssigned"}
    destination = dead_letter["deadLetterDestination"]
    assert destination["endpointType"] == "StorageBlob"
    assert destination["properties"]["blobContainerName"] == "deadLetterContainerName"


def test_the_dead_letter_container_is_created_and_handed_to_the_hook() -> None:
    main = bicep("main.bicep")
    containers = main["modules"]["storage"]["config"]["params"]["containerNames"]
    assert "deadLetterContainerName" in containers
    assert variable(main, "deadLetterContainerName")
    assert main["outputs"]["DEADLETTER_CONTAINER_NAME"]["value"] == "deadLetterContainerName"


def test_the_topic_dead_letters_with_its_own_identity_not_the_stewards() -> None:
    main = bicep("main.bicep")
    params = main["modules"]["topic"]["config"]["params"]
    assert "identityId" not in params, "the topic must not carry the steward's identity"
    topic = resource_body(resource(bicep("core/eventgrid/topic.bicep"), "topic"))
    assert topic["identity"] == {"type": "SystemAssigned"}
    assert "identityName" not in bicep("app/eventgrid-subscription.bicep")["parameters"]

"""Storage and Event Grid identities hold only what they use (issue 11, deployment corrections; issue 19).

- The app's identity holds one data role per storage service. Queue Data Message Processor and
  Message Sender were assigned next to Queue Data Contributor, whose data actions include theirs
  (built-in roles: Contributor = queues read/write/delete + messages read/write/delete/add/process;
  Processor = messages read + process; Sender = messages add), so they added nothing and are gone.
- Blobs: Storage Blob Data Contributor on three containers, not Storage Blob Data Owner on the account
  (issue 19): the Flex Consumption deployment container (the platform assigns exactly that role for it:
  learn.microsoft.com/azure/azure-functions/flex-consumption-how-to#configure-deployment-settings) and the
  Functions host's own containers, azure-webjobs-hosts and azure-webjobs-secrets (Azure/azure-functions-host
  ScriptConstants.AzureWebJobsHostsContainerName, BlobStorageSecretsRepository). The account also holds
  the Event Grid dead letters, which the app must not read or rewrite.
- The Event Grid topic dead-letters with its own system-assigned identity, granted Storage Blob
  Data Contributor on the dead-letter container only: not on the account, which also holds the
  host storage, the queues and the ledger, and not with the steward's identity.
"""

from __future__ import annotations

from typing import Any

from infra_facts import INFRA, bicep, resolve, resource, resource_body, resources_of_type, variable

STORAGE_BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
STORAGE_QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR = "8a0f0c08-91a1-4084-bc3d-661d67233fed"
STORAGE_QUEUE_DATA_MESSAGE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"
STORAGE_TABLE_DATA_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
# The Functions host's blob containers (Azure/azure-functions-host: ScriptConstants.AzureWebJobsHostsContainerName,
# BlobStorageSecretsRepository._secretsContainerName).
HOST_CONTAINERS = ["azure-webjobs-hosts", "azure-webjobs-secrets"]


def _role_id(doc: dict, assignment: dict) -> str:
    value = assignment["properties"]["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]
    return str(resolve(doc, value))


def _index_of(value: Any) -> tuple[str, str]:
    """``appContainers[i]`` as pycep spells it -> ("appContainers", "i")."""
    operands = value["operator"]["operands"]
    assert value["operator"]["type"] == "index_accessor", value
    return str(operands["operand_1"]), str(operands["operand_2"])


def test_the_app_holds_exactly_one_data_role_per_storage_service() -> None:
    doc = bicep("app/rbac.bicep")
    roles = [resolve(doc, r) for r in variable(doc, "storageRoles")]
    assert sorted(roles) == sorted([STORAGE_QUEUE_DATA_CONTRIBUTOR, STORAGE_TABLE_DATA_CONTRIBUTOR])
    [blob] = [resource_body(r) for name, r in resources_of_type(doc, "Microsoft.Authorization/roleAssignments").items()
              if name == "identityBlobRoles"]
    assert _role_id(doc, blob) == STORAGE_BLOB_DATA_CONTRIBUTOR


def test_no_identity_holds_storage_blob_data_owner_anywhere() -> None:
    for path in sorted(INFRA.rglob("*.bicep")):
        assert STORAGE_BLOB_DATA_OWNER not in path.read_text(encoding="utf-8"), path.name


def test_the_apps_blob_role_is_scoped_to_its_deployment_and_host_containers_only() -> None:
    doc = bicep("app/rbac.bicep")
    for name, containers, principal in (("identityBlobRoles", "appContainers", "identityPrincipalId"),
                                        ("developerBlobRoles", "hostContainers", "developerPrincipalId")):
        res = resource(doc, name)
        body = resource_body(res)
        assert _index_of(body["scope"]) == (containers, "i"), f"{name} must be scoped to one container each"
        assert body["properties"]["principalId"] == principal
        loop = res["config"]["loop_type"]["detail"]
        assert loop["index_name"] == "i"
        collection = resource(doc, containers)
        assert collection["existing"] is True
        assert collection["type"] == "Microsoft.Storage/storageAccounts/blobServices/containers"
        assert resource_body(collection)["parent"] == "blobService"
        # the role assignments walk the same list as the container collection they index
        assert collection["config"]["loop_type"]["detail"]["array_name"] == {
            "appContainers": "appBlobContainerNames", "hostContainers": "hostContainerNames"}[containers]
        assert loop["array_name"] == {"appContainers": "appBlobContainerNames",
                                      "hostContainers": "developerBlobContainerNames"}[containers]
    assert variable(doc, "appBlobContainerNames") == {"function": {"type": "concat", "parameters": {
        "arg_1": ["deploymentContainerName"], "arg_2": "hostContainerNames"}}}
    developer = variable(doc, "developerBlobContainerNames")["operator"]["operands"]
    assert developer["true_value"] == [] and developer["false_value"] == "hostContainerNames"


def test_main_creates_the_host_containers_and_grants_the_app_those_and_its_deployment_container() -> None:
    main = bicep("main.bicep")
    host = [resolve(main, n) for n in variable(main, "hostContainerNames")]
    assert host == HOST_CONTAINERS
    created = [resolve(main, n) for n in main["modules"]["storage"]["config"]["params"]["containerNames"]]
    assert set(HOST_CONTAINERS) <= set(created), "the role can only be scoped to containers that exist"
    assert "deploymentContainerName" in main["modules"]["storage"]["config"]["params"]["containerNames"]
    params = main["modules"]["rbac"]["config"]["params"]
    assert params["hostContainerNames"] == "hostContainerNames"
    assert params["deploymentContainerName"] == "deploymentContainerName"
    assert "deadLetterContainerName" not in params.values(), "the app never reads or writes the dead letters"


def test_no_queue_role_contained_in_queue_data_contributor_is_assigned_besides_it() -> None:
    text = (INFRA / "app" / "rbac.bicep").read_text(encoding="utf-8")
    for redundant in (STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR, STORAGE_QUEUE_DATA_MESSAGE_SENDER):
        assert redundant not in text


def test_the_topic_may_write_only_its_dead_letter_container() -> None:
    doc = bicep("app/deadletter-access.bicep")
    [assignment] = [resource_body(r) for r in
                    resources_of_type(doc, "Microsoft.Authorization/roleAssignments").values()]
    assert assignment["scope"] == "container"
    assert _role_id(doc, assignment) == STORAGE_BLOB_DATA_CONTRIBUTOR
    assert assignment["properties"]["principalId"] == "topicPrincipalId"
    assert assignment["properties"]["principalType"] == "ServicePrincipal"
    container = resource(doc, "container")
    assert container["type"] == "Microsoft.Storage/storageAccounts/blobServices/containers"
    assert container["existing"] is True
    assert container["config"]["name"] == "containerName"


def test_main_grants_the_topic_identity_on_the_dead_letter_container_it_creates() -> None:
    main = bicep("main.bicep")
    params = main["modules"]["deadLetterAccess"]["config"]["params"]
    assert params["containerName"] == "deadLetterContainerName"
    assert params["topicPrincipalId"] == {"operator": {"type": "property_accessor", "operands": {
        "operand_1": "topic",
        "operand_2": {"operator": {"type": "property_accessor",
                                   "operands": {"operand_1": "outputs", "operand_2": "principalId"}}}}}}
    assert bicep("core/eventgrid/topic.bicep")["outputs"]["principalId"]["value"] == {"operator": {
        "type": "property_accessor", "operands": {
            "operand_1": "topic",
            "operand_2": {"operator": {"type": "property_accessor",
                                       "operands": {"operand_1": "identity", "operand_2": "principalId"}}}}}}
    assert "deadLetterContainerName" in main["modules"]["storage"]["config"]["params"]["containerNames"]


def test_the_steward_identity_is_not_granted_to_event_grid() -> None:
    topic = resource_body(resource(bicep("core/eventgrid/topic.bicep"), "topic"))
    assert "userAssignedIdentities" not in topic["identity"]
    assert "identityId" not in bicep("core/eventgrid/topic.bicep").get("parameters", {})

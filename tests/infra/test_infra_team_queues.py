"""The teams' pool-request queues: their own storage account, one queue per team, least privilege.

- A team holds *Storage Queue Data Message Sender* on its own queue and nothing else: it cannot
  read, delete or create queues, and cannot write another team's queue.
- The app reads and processes the team queues (*Reader* + *Message Processor*, what a queue
  trigger needs) and may only add to their ``-poison`` queues; it cannot send to a team queue.
- The queues are created by the deployment, named as shared/pools/teams.py names them, in an account
  apart from the host's; the host storage no longer holds a pool-request queue.
"""

from __future__ import annotations

import json

from infra_facts import bicep, resolve, resource, resource_body, resources_of_type, variable

from shared.pools import teams

STORAGE_QUEUE_DATA_READER = "19e7f393-937e-4f77-808e-94535e297925"
STORAGE_QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR = "8a0f0c08-91a1-4084-bc3d-661d67233fed"
STORAGE_QUEUE_DATA_MESSAGE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"


def _access() -> dict:
    return bicep("app/team-queues-access.bicep")


def _assignments() -> dict[str, dict]:
    doc = _access()
    return {name: resource_body(r) for name, r in
            resources_of_type(doc, "Microsoft.Authorization/roleAssignments").items()}


def _role(doc: dict, assignment: dict) -> str:
    return str(resolve(doc, assignment["properties"]["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]))


def _scope(assignment: dict) -> str:
    """The resource an assignment is scoped to (``queues[i]`` -> ``queues``)."""
    scope = assignment["scope"]
    if isinstance(scope, dict):
        return str(scope["operator"]["operands"]["operand_1"])
    return str(scope)


def _loop_array(name: str) -> str:
    return str(resource(_access(), name)["config"]["loop_type"]["detail"]["array_name"])


def test_each_team_gets_message_sender_on_its_own_queue_only() -> None:
    doc = _access()
    team = _assignments()["teamSenders"]
    assert _role(doc, team) == STORAGE_QUEUE_DATA_MESSAGE_SENDER
    assert _scope(team) == "queues"
    principal = team["properties"]["principalId"]["operator"]["operands"]
    assert (principal["operand_1"], principal["operand_2"]) == ("team", "principalId")
    queues = resource(doc, "queues")
    assert queues["type"] == "Microsoft.Storage/storageAccounts/queueServices/queues" and queues["existing"] is True
    assert resource_body(queues)["name"] == {"operator": {"type": "property_accessor",
                                                         "operands": {"operand_1": "team", "operand_2": "queue"}}}
    teams_given_a_role = [name for name, a in _assignments().items()
                          if a["properties"]["principalId"] != "identityPrincipalId"]
    assert teams_given_a_role == ["teamSenders"]


def test_the_app_may_read_and_process_team_queues_and_only_add_to_their_poison_queues() -> None:
    doc = _access()
    app = {name: (_role(doc, a), _scope(a)) for name, a in _assignments().items()
           if a["properties"]["principalId"] == "identityPrincipalId"}
    assert sorted(app.values()) == sorted([
        (STORAGE_QUEUE_DATA_READER, "queues"),
        (STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR, "queues"),
        (STORAGE_QUEUE_DATA_MESSAGE_SENDER, "poisonQueues"),
    ])
    assert resource_body(resource(doc, "poisonQueues"))["name"] == "${team.queue}-poison"
    for name in ("queues", "poisonQueues", "teamSenders", "appReaders", "appProcessors", "appPoisonSenders"):
        assert _loop_array(name) == "teamQueues"


def test_no_assignment_is_at_account_scope_and_none_is_queue_contributor() -> None:
    doc = _access()
    for name, assignment in _assignments().items():
        assert _scope(assignment) in ("queues", "poisonQueues"), name
        assert _role(doc, assignment) != STORAGE_QUEUE_DATA_CONTRIBUTOR, name


def test_the_team_queues_live_in_their_own_storage_account_with_shared_keys_off() -> None:
    main = bicep("main.bicep")
    modules = main["modules"]
    host, team = modules["storage"], modules["teamStorage"]
    assert team["detail"]["path"] == host["detail"]["path"] == "./core/storage/storage-account.bicep"
    assert team["config"]["params"]["name"] != host["config"]["params"]["name"]
    assert "teams" in team["config"]["params"]["name"]
    account = resource_body(resource(bicep("core/storage/storage-account.bicep"), "storage"))
    assert account["properties"]["allowSharedKeyAccess"] is False
    # the host's account keeps only the nudge queue: no pool-request queue anyone could write there
    host_queues = [resolve(main, q) for q in host["config"]["params"]["queueNames"]]
    assert host_queues == [resolve(main, variable(main, "nudgeQueue")), "${nudgeQueue}-poison"]
    queue_names = team["config"]["params"]["queueNames"]["function"]
    assert queue_names["type"] == "concat"
    assert sorted(queue_names["parameters"].values()) == ["teamPoisonQueues", "teamRequestQueues"]
    assert team["config"]["params"]["tableNames"] == [] and team["config"]["params"]["containerNames"] == []


def test_the_deployed_queue_names_are_the_ones_the_app_listens_on() -> None:
    main = bicep("main.bicep")
    requests = variable(main, "teamRequestQueues")
    poison = variable(main, "teamPoisonQueues")
    grants = variable(main, "teamQueueGrants")
    assert requests["loop_type"]["detail"]["array_name"] == "teams"
    assert requests["config"] == grants["config"]["queue"] == "${poolRequestQueue}-${team.name}"
    assert poison["config"] == "${poolRequestQueue}-${team.name}-poison"
    prefix = resolve(main, "poolRequestQueue")
    steward = variable(main, "stewardSettings")
    assert steward["POOL_REQUEST_QUEUE"] == "poolRequestQueue"
    [team] = teams.parse(json.dumps({"ml-platform": {"clusters": "*"}}), queue_prefix=prefix)
    assert team.queue == requests["config"].replace("${poolRequestQueue}", prefix).replace("${team.name}", team.name)


def test_the_teams_parameter_becomes_pool_request_teams_without_the_principals() -> None:
    main = bicep("main.bicep")
    assert main["parameters"]["teams"]["default"] == []
    steward = variable(main, "stewardSettings")
    assert steward["POOL_REQUEST_TEAMS"] == {"function": {"type": "string", "parameters": {
        "value_to_convert": "teamPolicies"}}}
    policies = variable(main, "teamPolicies")["function"]
    assert policies["type"] == "toObject" and policies["parameters"]["arg_1"] == "teams"
    value = policies["parameters"]["arg_3"]["detail"]["expression"]["operator"]["operands"]
    assert value == {"operand_1": "team", "operand_2": "policy"}  # principal ids never reach app settings


def test_main_wires_the_access_module_to_the_team_account_and_the_app_waits_for_it() -> None:
    main = bicep("main.bicep")
    access = main["modules"]["teamQueuesAccess"]
    assert access["detail"]["path"] == "./app/team-queues-access.bicep"
    params = access["config"]["params"]
    assert params["teamQueues"] == "teamQueueGrants"
    assert params["storageAccountName"]["operator"]["operands"]["operand_1"] == "teamStorage"
    api = main["modules"]["api"]
    assert "teamQueuesAccess" in api["config"]["dependsOn"]
    endpoint = api["config"]["params"]["teamRequestsQueueEndpoint"]["operator"]["operands"]
    assert endpoint["operand_1"] == "teamStorage"


def test_the_team_connection_is_identity_based_on_the_team_account() -> None:
    api = bicep("app/api.bicep")
    host = variable(api, "hostSettings")
    prefix = teams.CONNECTION
    assert prefix not in host  # never a connection string
    assert host[f"{prefix}__queueServiceUri"] == "teamRequestsQueueEndpoint"
    assert host[f"{prefix}__credential"] == "managedidentity"
    assert host[f"{prefix}__clientId"] == "identityClientId"

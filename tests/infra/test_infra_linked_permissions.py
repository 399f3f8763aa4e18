"""Pools with custom networking get the linked-resource permissions, only where such pools are.

An agent-pool write naming a subnet, a public IP prefix or a proximity placement group makes ARM check
an action on that resource (403 LinkedAuthorizationFailed without it). The actions are declared once,
in shared.adapters.permissions.LINKED_POOL_ACTIONS; the deployment creates a separate role with exactly those
and grants it on the resource groups listed in ``linkedResourceGroupIds`` (and nowhere when empty).
"""

from __future__ import annotations

from infra_facts import bicep, resource, resource_body, variable

from shared.adapters.permissions import LINKED_POOL_ACTIONS, linked_actions


def test_the_linked_role_holds_exactly_the_linked_actions_the_code_declares() -> None:
    assert set(LINKED_POOL_ACTIONS) == {"vnetSubnetID", "podSubnetID", "nodePublicIPPrefixID",
                                        "proximityPlacementGroupID"}
    granted = variable(bicep("app/steward-role.bicep"), "linkedActions")
    assert len(granted) == len(set(granted))
    assert set(granted) == linked_actions()


def test_the_linked_actions_are_not_in_the_cluster_scoped_role() -> None:
    """They would be useless there (ARM checks them on the linked resource) and wider than needed."""
    assert not linked_actions() & set(variable(bicep("app/steward-role.bicep"), "actions"))


def test_the_linked_role_exists_only_when_linked_resource_groups_are_listed() -> None:
    role = resource(bicep("app/steward-role.bicep"), "linkedRole")
    assert role["config"]["condition"] == "createLinkedRole"
    body = resource_body(role)
    [permissions] = body["properties"]["permissions"]
    assert permissions["actions"] == "linkedActions"
    assert permissions["notActions"] == [] and permissions["dataActions"] == [] and permissions["notDataActions"] == []
    assert body["properties"]["type"] == "CustomRole"
    assert body["properties"]["assignableScopes"] == "assignableScopes"
    given = bicep("main.bicep")["modules"]["stewardRole"]["config"]["params"]["createLinkedRole"]
    assert given == {"operator": {"type": "not", "operands": {"bool_value": {
        "function": {"type": "empty", "parameters": {"item_to_test": "linkedResourceGroupIds"}}}}}}


def test_the_linked_role_is_granted_to_the_apps_identity_on_each_listed_resource_group() -> None:
    main = bicep("main.bicep")
    assert main["parameters"]["linkedResourceGroupIds"]["default"] == []
    module = main["modules"]["linkedAccess"]
    assert module["detail"]["path"] == "./app/linked-access.bicep"
    assert module["config"]["loop_type"]["detail"]["array_name"] == "linkedResourceGroupIds"
    params = module["config"]["config"]["params"]
    assert params["principalId"]["operator"]["operands"]["operand_1"] == "identity"
    assert params["linkedRoleDefinitionGuid"]["operator"]["operands"] == {
        "operand_1": "stewardRole",
        "operand_2": {"operator": {"type": "property_accessor",
                                   "operands": {"operand_1": "outputs", "operand_2": "linkedRoleDefinitionGuid"}}}}
    grant = resource_body(resource(bicep("app/linked-access.bicep"), "linkedOnGroup"))
    assert "scope" not in grant  # the module's own scope: the listed resource group
    assert grant["properties"]["principalType"] == "ServicePrincipal"

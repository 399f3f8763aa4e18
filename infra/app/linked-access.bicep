// Grants the app's identity the linked-resources role (steward-role.bicep linkedRole) on a resource
// group holding the subnets, public IP prefixes or proximity placement groups that GPU pools in scope
// name. ARM checks these actions on the linked resource itself, so the grant must be here, not on
// the cluster (https://learn.microsoft.com/azure/aks/aks-service-permissions).
param principalId string
param linkedRoleDefinitionGuid string

resource linkedOnGroup 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, principalId, linkedRoleDefinitionGuid)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', linkedRoleDefinitionGuid)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

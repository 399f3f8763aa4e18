// Grants the app's identity the steward role on a whole resource group: a cluster's node resource
// group (for the VMSS VM restart / reimage actions), or a resource group whose clusters should all
// be reachable (the role then covers every cluster in it; their node resource groups still need
// their own grant).
param principalId string
param stewardRoleDefinitionGuid string

resource stewardOnGroup 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, principalId, stewardRoleDefinitionGuid)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', stewardRoleDefinitionGuid)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

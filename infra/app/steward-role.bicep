// Least privilege on the Azure side: one custom role holding exactly the ARM actions the app's
// adapters declare (shared/aks.py and shared/compute.py, @requires_arm). tests/infra checks that
// this list equals shared.permissions.collect_arm_actions(shared.aks, shared.compute), so a new
// ARM call without a matching line here fails CI.
//
// Assign it on each cluster (agent pools, machines, maintenance configurations, user credentials)
// and on the cluster's node resource group (the VMSS VM restart / reimage actions), or once on a
// resource group holding both: app/cluster-access.bicep and app/resource-group-access.bicep.
targetScope = 'subscription'

param roleName string
@description('Subscriptions (ids like /subscriptions/<guid>) where the role may be assigned.')
param assignableScopes array

var actions = [
  'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/reimage/action'
  'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/restart/action'
  'Microsoft.ContainerService/managedClusters/agentPools/delete'
  'Microsoft.ContainerService/managedClusters/agentPools/deleteMachines/action'
  'Microsoft.ContainerService/managedClusters/agentPools/machines/read'
  'Microsoft.ContainerService/managedClusters/agentPools/read'
  'Microsoft.ContainerService/managedClusters/agentPools/write'
  'Microsoft.ContainerService/managedClusters/listClusterUserCredential/action'
  'Microsoft.ContainerService/managedClusters/maintenanceConfigurations/read'
  'Microsoft.ContainerService/managedClusters/read'
]

resource role 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(subscription().id, roleName)
  properties: {
    roleName: roleName
    description: 'GPU fleet steward: manage GPU agent pools and repair their nodes (exactly the ARM actions the app calls).'
    type: 'CustomRole'
    permissions: [
      {
        actions: actions
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
    assignableScopes: assignableScopes
  }
}

output roleDefinitionGuid string = role.name
output roleDefinitionId string = role.id

// Least privilege on the Azure side: one custom role holding exactly the ARM actions the app's
// adapters declare (shared/adapters/aks.py and shared/adapters/compute.py, @requires_arm). tests/infra checks that
// this list equals shared.adapters.permissions.collect_arm_actions(shared.adapters.aks, shared.adapters.compute), so a new
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
  'Microsoft.ResourceHealth/availabilityStatuses/read'
]

// Linked resources: an agent-pool write naming a subnet (vnetSubnetID, podSubnetID), a public IP
// prefix (nodePublicIPPrefixID) or a proximity placement group makes ARM check an action on that
// resource too, else 403 LinkedAuthorizationFailed. tests/infra checks this list equals
// shared.adapters.permissions.linked_actions(). A separate role, created only when such pools are in scope
// (main.bicep linkedResourceGroupIds not empty) and assigned only on those resource groups
// (app/linked-access.bicep): the cluster-scoped grant above could not reach them anyway.
@description('Create the linked-resources role (custom VNets, public IP prefixes, proximity placement groups in scope).')
param createLinkedRole bool = false

var linkedActions = [
  'Microsoft.Compute/proximityPlacementGroups/write'
  'Microsoft.Network/publicIPPrefixes/join/action'
  'Microsoft.Network/virtualNetworks/subnets/join/action'
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

resource linkedRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = if (createLinkedRole) {
  name: guid(subscription().id, roleName, 'linked')
  properties: {
    roleName: '${roleName} linked resources'
    description: 'GPU fleet steward: join the subnets, public IP prefixes and proximity placement groups the cloned GPU pools name.'
    type: 'CustomRole'
    permissions: [
      {
        actions: linkedActions
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
output linkedRoleDefinitionGuid string = createLinkedRole ? linkedRole.name : ''

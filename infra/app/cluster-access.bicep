// Grants the app's identity the steward role on one cluster (ARM: agent pools, machines,
// maintenance configurations, user credentials) and, when the cluster uses Azure RBAC for
// Kubernetes, the Kubernetes data role. Deployed into the cluster's resource group.
// The compute actions (VMSS VM restart / reimage) live in the node resource group:
// main.bicep grants the same role there with app/resource-group-access.bicep.
param clusterName string
param principalId string
param stewardRoleDefinitionGuid string
@description('Guid of the Azure RBAC for Kubernetes role; empty when the cluster uses Kubernetes RBAC (apply infra/kubernetes/*.yaml instead).')
param kubernetesRoleDefinitionGuid string = ''

resource cluster 'Microsoft.ContainerService/managedClusters@2025-01-01' existing = {
  name: clusterName
}

resource stewardOnCluster 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(cluster.id, principalId, stewardRoleDefinitionGuid)
  scope: cluster
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', stewardRoleDefinitionGuid)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

resource kubernetesOnCluster 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(kubernetesRoleDefinitionGuid)) {
  name: guid(cluster.id, principalId, kubernetesRoleDefinitionGuid)
  scope: cluster
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', kubernetesRoleDefinitionGuid)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

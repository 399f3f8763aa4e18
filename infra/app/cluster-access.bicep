// Grants the app's identity the steward role on one cluster (ARM: agent pools, machines,
// maintenance configurations, user credentials) and, when the cluster uses Azure RBAC for
// Kubernetes, the Kubernetes data roles: the cluster-wide one on the cluster, the namespaced one
// (leases, sample Jobs) on the app's own namespace only. They hold no pod write and no event write, so the
// evictions come from the ClusterRole and the node Events (namespace `default`) from the node-events Role
// (infra/kubernetes), applied on Azure RBAC clusters too. Deployed into the cluster's
// resource group. The compute actions (VMSS VM restart / reimage) live in the node resource group:
// main.bicep grants the same role there with app/resource-group-access.bicep.
param clusterName string
param principalId string
param stewardRoleDefinitionGuid string
@description('Guid of the cluster-wide Azure RBAC for Kubernetes role; empty when the cluster uses Kubernetes RBAC only. infra/kubernetes/*.yaml is applied on every cluster either way: the ClusterRole alone grants the evictions (app/kubernetes-role.bicep).')
param kubernetesRoleDefinitionGuid string = ''
@description('Guid of the Azure RBAC for Kubernetes role for the app\'s own namespace; empty with kubernetesRoleDefinitionGuid.')
param kubernetesNamespaceRoleDefinitionGuid string = ''
@description('The app\'s own namespace in the cluster (app setting STEWARD_NAMESPACE, infra/kubernetes/namespace.yaml).')
param stewardNamespace string = 'gpu-fleet-steward'

resource cluster 'Microsoft.ContainerService/managedClusters@2025-01-01' existing = {
  name: clusterName
}

// Azure RBAC for Kubernetes accepts role assignments scoped to a namespace of the cluster:
// `<cluster id>/namespaces/<namespace>` (https://learn.microsoft.com/azure/aks/manage-azure-rbac).
// Referenced, never deployed: it only names the assignment's scope. The type is declared at the one
// api-version whose Bicep type definitions have it (bicep-types-az: managedClusters/namespaces exists only at
// 2025-02-02-preview; 2025-01-01 made `bicep build` warn BCP081); an `existing` reference sends no request,
// so the preview version changes nothing but the id it builds.
resource namespace 'Microsoft.ContainerService/managedClusters/namespaces@2025-02-02-preview' existing = {
  parent: cluster
  name: stewardNamespace
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

resource kubernetesOnNamespace 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(kubernetesNamespaceRoleDefinitionGuid)) {
  name: guid(cluster.id, stewardNamespace, principalId, kubernetesNamespaceRoleDefinitionGuid)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', kubernetesNamespaceRoleDefinitionGuid)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

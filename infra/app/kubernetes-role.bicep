// Least privilege inside the clusters, for clusters that use Azure RBAC for Kubernetes
// authorization: the data actions matching infra/kubernetes/clusterrole.yaml and role.yaml (which
// tests/infra checks against shared.adapters.permissions.collect_kube_rules(shared.adapters.kube, scope=...)).
//
// Two roles, as the Kubernetes side has a ClusterRole and a namespaced Role:
// - `role` holds what the app does cluster-wide (nodes, pods, evictions, PodDisruptionBudgets) and is
//   assigned on the cluster (app/cluster-access.bicep kubernetesOnCluster);
// - `namespaceRole` holds what it does only in its own namespace (its leases, events and sample
//   Jobs) and is assigned on `<cluster id>/namespaces/<STEWARD_NAMESPACE>` only
//   (kubernetesOnNamespace; https://learn.microsoft.com/azure/aks/manage-azure-rbac, "namespace scope").
//
// Azure RBAC maps Kubernetes verbs get/list/watch -> read, create/update/patch -> write,
// delete -> delete, and ignores sub-resources (so the Eviction API, pods/eviction create, needs
// pods/write: the narrowest data action that covers it). Custom resources (the Karpenter kinds of
// node auto-provisioning clusters) have no data actions of their own: they are granted by the
// ClusterRole only (apply infra/kubernetes/clusterrole.yaml on NAP clusters; Kubernetes RBAC stays in
// force next to Azure RBAC).
targetScope = 'subscription'

param roleName string
@description('Subscriptions (ids like /subscriptions/<guid>) where the role may be assigned.')
param assignableScopes array

var dataActions = [
  'Microsoft.ContainerService/managedClusters/nodes/read'
  'Microsoft.ContainerService/managedClusters/nodes/write'
  'Microsoft.ContainerService/managedClusters/pods/read'
  'Microsoft.ContainerService/managedClusters/pods/write'
  'Microsoft.ContainerService/managedClusters/policy/poddisruptionbudgets/read'
]

var namespaceDataActions = [
  'Microsoft.ContainerService/managedClusters/batch/jobs/delete'
  'Microsoft.ContainerService/managedClusters/batch/jobs/read'
  'Microsoft.ContainerService/managedClusters/batch/jobs/write'
  'Microsoft.ContainerService/managedClusters/coordination.k8s.io/leases/read'
  'Microsoft.ContainerService/managedClusters/coordination.k8s.io/leases/write'
  'Microsoft.ContainerService/managedClusters/events/write'
]

resource role 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(subscription().id, roleName)
  properties: {
    roleName: roleName
    description: 'GPU fleet steward inside AKS clusters, cluster-wide (Azure RBAC for Kubernetes): read and cordon nodes, find pods, drain by eviction, read disruption budgets.'
    type: 'CustomRole'
    permissions: [
      {
        actions: []
        notActions: []
        dataActions: dataActions
        notDataActions: []
      }
    ]
    assignableScopes: assignableScopes
  }
}

resource namespaceRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(subscription().id, roleName, 'namespace')
  properties: {
    roleName: '${roleName} (own namespace)'
    description: 'GPU fleet steward inside its own namespace of AKS clusters (Azure RBAC for Kubernetes): node leases, events, sample GPU Jobs.'
    type: 'CustomRole'
    permissions: [
      {
        actions: []
        notActions: []
        dataActions: namespaceDataActions
        notDataActions: []
      }
    ]
    assignableScopes: assignableScopes
  }
}

output roleDefinitionGuid string = role.name
output roleDefinitionId string = role.id
output namespaceRoleDefinitionGuid string = namespaceRole.name

// Least privilege inside the clusters, for clusters that use Azure RBAC for Kubernetes
// authorization: the data actions matching infra/kubernetes/clusterrole.yaml and role.yaml (which
// tests/infra checks against shared.adapters.permissions.collect_kube_rules(shared.adapters.kube, scope=...)),
// less what is left to the ClusterRole (below).
//
// Two roles, as the Kubernetes side has a ClusterRole and a namespaced Role:
// - `role` holds what the app does cluster-wide (read and cordon nodes, list pods, read
//   PodDisruptionBudgets) and is assigned on the cluster (app/cluster-access.bicep kubernetesOnCluster);
// - `namespaceRole` holds what it does only in its own namespace (its leases and sample Jobs) and is
//   assigned on `<cluster id>/namespaces/<STEWARD_NAMESPACE>` only
//   (kubernetesOnNamespace; https://learn.microsoft.com/azure/aks/manage-azure-rbac, "namespace scope").
// The app's Events about Nodes live in namespace `default` (an Event about a cluster-scoped object may
// live nowhere else: kubernetes/kubernetes pkg/apis/core/validation/events.go legacyValidateEvent), and
// neither role holds events/write: a data action is not namespaced in a role definition, and the app needs
// no other grant in `default`, so that one create is left to the Kubernetes Role
// `gpu-fleet-steward-node-events` (infra/kubernetes/role.yaml), applied on every cluster like the ClusterRole.
//
// The AKS authorization webhook (kubeguard/guard, authz/providers/azure/rbac/checkaccessreqhelper.go
// getActionName, getResourceAndAction) checks Microsoft.ContainerService/managedClusters/<group>/<resource>/<verb>
// with the verbs folded get/list/watch -> read, create/update/patch -> write, delete -> delete, and the
// sub-resource dropped (pods/exec alone has an action of its own, pods/exec/action). There is no
// eviction data action: the Eviction API (pods/eviction create) is checked as
// `managedClusters/pods/write`, and that data action also lets its holder create, update and patch pods
// in every namespace, privileged pods in kube-system included. No ABAC condition can narrow it to
// evictions either: guard passes the sub-resource as the attribute
// `Microsoft.ContainerService/managedClusters/resources:subresource` only for an allow list
// (subresourceAttributeAllowlist: pods/logs, exec, portforward, proxy, ephemeralcontainers, attach and
// the */scale ones) that has no pods/eviction. So it is NOT granted here: evictions are
// authorised by the ClusterRole (infra/kubernetes/clusterrole.yaml, `pods/eviction create` only), which
// is applied on every cluster, Azure RBAC ones included (scripts/apply-kube-rbac.sh, docs/deploy.md
// step 3). AKS evaluates Kubernetes RBAC next to Azure RBAC for Entra identities, either allowing is
// enough (https://learn.microsoft.com/azure/aks/concepts-identity: "AKS authorizes the request using one
// (or both) of two models", and before its 2026 rewrite "Azure will team with Kubernetes RBAC to
// authorize the request"; https://learn.microsoft.com/azure/aks/concepts-cluster-authorization: "You can
// use both models on the same cluster"). The simulator enforces both (sim/kube/rbac.py authorize, sim/arm/rbac.py), and
// tests/integration/test_grants_sim.py shows the app's own token refused a pod create, and still
// evicting, on such a cluster.
// Custom resources (the Karpenter kinds of node auto-provisioning clusters) have no data actions of
// their own: they too are granted by the ClusterRole only.
targetScope = 'subscription'

param roleName string
@description('Subscriptions (ids like /subscriptions/<guid>) where the role may be assigned.')
param assignableScopes array

var dataActions = [
  'Microsoft.ContainerService/managedClusters/nodes/read'
  'Microsoft.ContainerService/managedClusters/nodes/write'
  'Microsoft.ContainerService/managedClusters/pods/read'
  'Microsoft.ContainerService/managedClusters/policy/poddisruptionbudgets/read'
]

var namespaceDataActions = [
  'Microsoft.ContainerService/managedClusters/batch/jobs/delete'
  'Microsoft.ContainerService/managedClusters/batch/jobs/read'
  'Microsoft.ContainerService/managedClusters/batch/jobs/write'
  'Microsoft.ContainerService/managedClusters/coordination.k8s.io/leases/read'
  'Microsoft.ContainerService/managedClusters/coordination.k8s.io/leases/write'
]

resource role 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(subscription().id, roleName)
  properties: {
    roleName: roleName
    description: 'GPU fleet steward inside AKS clusters, cluster-wide (Azure RBAC for Kubernetes): read and cordon nodes, find pods, read disruption budgets. No pod writes: evictions are granted by the Kubernetes ClusterRole.'
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
    description: 'GPU fleet steward inside its own namespace of AKS clusters (Azure RBAC for Kubernetes): node leases, sample GPU Jobs. Node events are granted by a Kubernetes Role in namespace default.'
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

// The GPU fleet steward, deployed by `azd up`: a Flex Consumption function app running as one
// user-assigned managed identity, with identity-only storage, telemetry and Event Grid, and exactly
// the permissions its code declares (custom roles, granted on the clusters listed below).
// See docs/deploy.md. tests/infra checks this file against the code.
targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('Name of the azd environment; part of every resource name.')
param environmentName string

@minLength(1)
@description('Region of every resource (one where Flex Consumption is available).')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Object id of the person running azd (azd sets it); gets the data roles so that `func start` works against these resources. Empty: nobody.')
param principalId string = ''

@description('Whether principalId is a person or a service principal (azd in CI).')
@allowed([
  'User'
  'ServicePrincipal'
])
param principalType string = 'User'

@description('Subscription ids the steward watches (FLEET_SUBSCRIPTIONS). Empty: the subscription deployed to.')
param fleetSubscriptionIds array = []

@description('Clusters carrying this tag (key=value) are in the fleet (FLEET_CLUSTER_TAG).')
param fleetClusterTag string = 'gpu-fleet-steward=enabled'

@description('When not empty, the fleet is exactly these cluster ARM ids (FLEET_CLUSTERS).')
param fleetClusterIds array = []

@description('Clusters to grant the steward roles on: [{ id: <cluster ARM id>, nodeResourceGroup: <its node resource group> }].')
param accessClusters array = []

@description('Resource group ids (/subscriptions/<id>/resourceGroups/<name>) to grant the steward role on as a whole.')
param accessResourceGroupIds array = []

@description('Resource group ids holding the subnets, public IP prefixes or proximity placement groups that GPU pools in scope name (custom VNets): the linked-resources role is created and granted there. Empty: no such pools, no such role.')
param linkedResourceGroupIds array = []

@description('Also assign the Azure RBAC for Kubernetes role on accessClusters (clusters with Azure RBAC enabled). It holds no pod write: apply infra/kubernetes (scripts/apply-kube-rbac.sh) on those clusters too, the ClusterRole grants the evictions.')
param assignKubernetesRole bool = true

@description('Teams that may request GPU pools (POOL_REQUEST_TEAMS, shared/pools/teams.py): [{ name: <2-24 lowercase letters, digits, hyphens>, principalId: <object id of the team\'s group or identity>, principalType: Group | User | ServicePrincipal, policy: { clusters: [<cluster ARM ids>] or \'*\', sizes: [<VM sizes>] or \'*\' (default: the T4 and A10 sizes), maxGpusPerRequest: <n> (default 8) } }]. Each gets its own queue <POOL_REQUEST_QUEUE>-<name> in the team-requests storage account and Storage Queue Data Message Sender on it alone. Empty: no pool requests.')
param teams array = []

@description('true: the steward observes and reports but changes nothing (STEWARD_PAUSED).')
@allowed([
  'true'
  'false'
])
param stewardPaused string = 'false'

@description('true: the migration timer starts migrations; false: it only plans and reports (MIGRATION_ENABLED).')
@allowed([
  'true'
  'false'
])
param migrationEnabled string = 'false'

@description('DCGM error counters from Azure Monitor managed Prometheus (SIGNALS_PROMETHEUS, docs/signals-dcgm.md): a JSON object {"<cluster ARM id>": {"endpoint": "<workspace query endpoint>"}} for AKS\'s managed exporter, or with "exporter": "custom", "job", "counters" for an exporter of your own. Empty: no DCGM signal.')
param signalsPrometheus string = ''

@description('Azure Monitor workspace ids (/subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.Monitor/accounts/<name>) that signalsPrometheus names: the app\'s identity gets Monitoring Data Reader on each (PromQL queries).')
param prometheusWorkspaceIds array = []

@description('Resource id of an action group the steward\'s alert rules notify (breaker opened, remediation gave up, migration blocked or rolled back, pool request failed); empty: the rules fire with no notification.')
param alertActionGroupId string = ''

@description('HTTPS webhook that receives the steward\'s outcome events (CloudEvents 1.0, infra/monitoring/outcome-events.json); empty: no subscription.')
param outcomeEventsEndpoint string = ''

@description('Any other app settings to override (name: value), e.g. a policy or a schedule.')
param settingOverrides object = {}

// The platform's floor is 1 ("Currently the lowest maximum instance count value is 1",
// https://learn.microsoft.com/azure/azure-functions/event-driven-scaling#limit-scale-out; 40 was the preview's).
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 40

@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

var abbrs = loadJsonContent('./abbreviations.json')
var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
var fleetSubscriptions = empty(fleetSubscriptionIds) ? [
  subscription().subscriptionId
] : fleetSubscriptionIds
var assignableScopes = [for sub in fleetSubscriptions: '/subscriptions/${sub}']

var functionAppName = '${abbrs.functionApps}${resourceToken}'
var deploymentContainerName = 'app-package-${take(functionAppName, 32)}-${take(resourceToken, 7)}'
var deadLetterContainerName = 'eventgrid-deadletter'
// The Functions host's own blob containers in AzureWebJobsStorage (leases, timer status; keys), created
// here so that the app's Storage Blob Data Contributor can be scoped to them (app/rbac.bicep).
var hostsContainerName = 'azure-webjobs-hosts'
var secretsContainerName = 'azure-webjobs-secrets'
var hostContainerNames = [
  hostsContainerName
  secretsContainerName
]

// Queue and table names: the code's defaults (shared/settings.py), set as app settings below and
// created in the storage account; the host adds "-poison" queues for messages that keep failing.
var poolRequestQueue = 'gpu-pool-requests'
var nudgeQueue = 'steward-nudge'
var ledgerTable = 'stewardledger'

// The teams' pool-request queues: one per team, named as the app names them (shared/pools/teams.py:
// <POOL_REQUEST_QUEUE>-<team>), in the team-requests storage account with their poison queues.
var teamRequestQueues = [for team in teams: '${poolRequestQueue}-${team.name}']
var teamPoisonQueues = [for team in teams: '${poolRequestQueue}-${team.name}-poison']
var teamPolicies = toObject(teams, team => team.name, team => team.policy)
var teamQueueGrants = [for team in teams: {
  queue: '${poolRequestQueue}-${team.name}'
  principalId: team.principalId
  principalType: team.?principalType ?? 'Group'
}]

// Every setting the steward's code reads (shared/settings.py and the policy modules), with the
// defaults the code uses; tests/infra derives the list from the code and compares.
var stewardSettings = {
  FLEET_SUBSCRIPTIONS: join(fleetSubscriptions, ',')
  FLEET_CLUSTER_TAG: fleetClusterTag
  FLEET_CLUSTERS: join(fleetClusterIds, ',')
  ARM_ENDPOINT: 'https://management.azure.com'
  ARM_AUDIENCE: 'https://management.azure.com/'
  AKS_SERVER_APP_ID: '6dae42f8-4368-4678-94ff-3960e28e3630'
  STEWARD_NAMESPACE: 'gpu-fleet-steward'
  POOL_REQUEST_QUEUE: poolRequestQueue
  POOL_REQUEST_TEAMS: string(teamPolicies)
  NUDGE_QUEUE: nudgeQueue
  LEDGER_TABLE: ledgerTable
  LEDGER_RETENTION_DAYS: '30'
  LEDGER_REJECTION_RETENTION_DAYS: '7'
  LEDGER_DEDUPE_RETENTION_DAYS: '7'
  LEDGER_SIGNAL_RETENTION_DAYS: '30'
  LEDGER_DECISION_RETENTION_DAYS: '2'
  LEDGER_RETENTION_MAX_DELETES: '200'
  EVENTGRID_TOPIC_ENDPOINT: topic.outputs.endpoint
  EVENTGRID_AUDIENCE: 'https://eventgrid.azure.net'
  STEWARD_EVENT_SOURCE: '/gpu-fleet-steward'
  RECONCILE_SCHEDULE: '0 */5 * * * *' // a safety net: delayed nudges on NUDGE_QUEUE pace the work (docs/deploy.md)
  RECONCILE_MAX_PERMANENT_TRIES: '5'
  RECONCILE_DELAYED_NUDGES: 'true'
  SWEEP_SCHEDULE: '0 * * * * *'
  MIGRATION_SCHEDULE: '0 */15 * * * *'
  STEWARD_PAUSED: stewardPaused
  POOL_REQUEST_MAX_BYTES: '65536'
  POOL_REQUEST_MAX_COUNT: '1000'
  POOL_REQUEST_CREATE_TIMEOUT_S: '3600'
  POOL_REQUEST_VALIDATE_TIMEOUT_S: '1200'
  POOL_REQUEST_SAMPLE_JOB_TIMEOUT_S: '900'
  POOL_REQUEST_SAMPLE_JOB_IMAGE: 'nvcr.io/nvidia/k8s/cuda-sample@sha256:79fa5da2e71ce9169d41b0a67f8575b8f713fd1fb3e6de306774fcfede3a4fe6'
  POOL_REQUEST_SAMPLE_JOB_ARGS: ''
  POOL_REQUEST_DEFAULT_TAINTS: 'sku=gpu:NoSchedule'
  POOL_REQUEST_ALLOWED_SIZES: ''
  POOL_REQUEST_POLL_INTERVAL_S: '15'
  POOL_REQUEST_FAILED_POOL_ACTION: 'delete'
  MIGRATION_ENABLED: migrationEnabled
  MIGRATION_MAX_CONCURRENT: '2'
  MIGRATION_STRATEGY: 'auto'
  MIGRATION_BATCH_SIZE: '1'
  MIGRATION_WINDOW: ''
  MIGRATION_WINDOW_PRECEDENCE: 'cluster'
  MIGRATION_CAPACITY_FLOOR_PCT: '100'
  MIGRATION_VALIDATE_TIMEOUT_S: '1800'
  MIGRATION_CREATE_TIMEOUT_S: '3600'
  MIGRATION_DRAIN_TIMEOUT_S: '3600'
  MIGRATION_POLL_INTERVAL_S: '15'
  MIGRATION_GPU_VCPU_HEADROOM: ''
  REMEDIATION_CONDITIONS: 'UnhealthyNvidiaDevicePlugin,UnhealthyNvidiaDCGMServices'
  REMEDIATION_THRESHOLDS: ''
  REMEDIATION_LADDER: 'restart,reimage,replace'
  REMEDIATION_RUNG_TIMEOUTS: ''
  REMEDIATION_DEFAULT_THRESHOLD_S: '300'
  REMEDIATION_STARTUP_GRACE_S: '600'
  REMEDIATION_GPU_CAPACITY: 'true'
  REMEDIATION_GPU_STARTUP_GRACE_S: '600'
  REMEDIATION_GPU_LOST_THRESHOLD_S: '300'
  REMEDIATION_BUSY_TAINTS: 'ToBeDeletedByClusterAutoscaler,DeletionCandidateOfClusterAutoscaler,node.kubernetes.io/out-of-service,karpenter.sh/disrupted,karpenter.sh/disruption'
  REMEDIATION_BUSY_ANNOTATIONS: 'cluster-autoscaler.kubernetes.io/scale-down-disabled-for-upgrade'
  REMEDIATION_SKIP_NOT_READY: 'true'
  REMEDIATION_SETTLE_S: '120'
  REMEDIATION_SURGE: 'true'
  REMEDIATION_DRAIN_TIMEOUT_S: '3600'
  REMEDIATION_DRAIN_FALLBACK: 'hold'
  REMEDIATION_EMPTY_DIR: 'evict'
  REMEDIATION_UNMANAGED_PODS: 'refuse'
  REMEDIATION_EVICTION_RETRY_S: '5.0'
  DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S: '300'
  DRAIN_PDB_BLOCKED_TIMEOUT_S: '1800'
  BUDGET_POOL_MAX_UNAVAILABLE: '1'
  BUDGET_POOL_MAX_UNAVAILABLE_PERCENT: '20'
  BUDGET_MAX_IN_FLIGHT: '5'
  BUDGET_CLUSTER_MAX_IN_FLIGHT: '3'
  BUDGET_BLOCKED_DRAIN_SLOT_S: '300'
  BUDGET_NODE_COOLDOWN_S: '3600'
  BUDGET_NODE_MAX_ATTEMPTS: '3'
  BUDGET_NODE_ATTEMPT_WINDOW_S: '86400'
  BREAKER_ENABLED: 'true'
  BREAKER_PERCENT: '30'
  BREAKER_MIN_NODES: '3'
  BREAKER_MAX_NODES: '0'
  BREAKER_WINDOW_S: '600'
  BREAKER_CLUSTER_SHARE_PERCENT: '50'
  BREAKER_VERIFY_MAX_NODES: '100'
  REMEDIATION_DRY_RUN: 'false'
  REMEDIATION_POLL_S: '20'
  REMEDIATION_NODE_LEASE_S: '300'
  REMEDIATION_PENDING_FAULT_MAX_AGE_S: '86400'
  REMEDIATION_SWEEP_PAGE_SIZE: '500'
  SIGNALS_PROMETHEUS: signalsPrometheus
  SIGNALS_XID_OVERRIDES: ''
  SIGNALS_DCGM_MAX_NODES: '64'
  SIGNALS_DCGM_ROW_RETENTION_S: '604800'
}

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: '${abbrs.resourceGroups}${environmentName}'
  location: location
  tags: tags
}

module identity './core/identity/user-assigned-identity.bicep' = {
  name: 'identity'
  scope: rg
  params: {
    name: '${abbrs.managedIdentityUserAssignedIdentities}${resourceToken}'
    location: location
    tags: tags
  }
}

module storage './core/storage/storage-account.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    name: '${abbrs.storageAccounts}${resourceToken}'
    location: location
    tags: tags
    queueNames: [
      nudgeQueue
      '${nudgeQueue}-poison'
    ]
    tableNames: [
      ledgerTable
    ]
    containerNames: [
      deploymentContainerName
      deadLetterContainerName
      hostsContainerName
      secretsContainerName
    ]
  }
}

// The team-facing account: only the teams' queues (teams hold Message Sender on their own queue;
// see app/team-queues-access.bicep). Shared-key access off, like the host's.
module teamStorage './core/storage/storage-account.bicep' = {
  name: 'team-requests-storage'
  scope: rg
  params: {
    name: '${abbrs.storageAccounts}teams${resourceToken}'
    location: location
    tags: tags
    queueNames: concat(teamRequestQueues, teamPoisonQueues)
    tableNames: []
    containerNames: []
  }
}

module teamQueuesAccess './app/team-queues-access.bicep' = {
  name: 'team-queues-access'
  scope: rg
  params: {
    storageAccountName: teamStorage.outputs.name
    identityPrincipalId: identity.outputs.principalId
    teamQueues: teamQueueGrants
  }
}

module monitoring './core/monitor/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    logAnalyticsName: '${abbrs.logAnalyticsWorkspaces}${resourceToken}'
    applicationInsightsName: '${abbrs.appInsights}${resourceToken}'
    location: location
    tags: tags
  }
}

module topic './core/eventgrid/topic.bicep' = {
  name: 'eventgrid-topic'
  scope: rg
  params: {
    name: '${abbrs.eventGridTopics}${resourceToken}'
    location: location
    tags: tags
  }
}

// Operators are told: the workbook, the alert rules and the outcome events' subscription (docs/deploy.md).
module operatorMonitoring './app/operator-monitoring.bicep' = {
  name: 'operator-monitoring'
  scope: rg
  params: {
    location: location
    tags: tags
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    topicName: topic.outputs.name
    alertActionGroupId: alertActionGroupId
    outcomeEventsEndpoint: outcomeEventsEndpoint
  }
}

// Azure Resource Health events (docs/signals-resource-health.md): one HealthResources system topic per
// fleet subscription, in a resource group of that subscription; the event subscription to the
// health_events function follows the code (scripts/postdeploy.sh, app/health-events-subscription.bicep).
var healthResourceGroupName = '${abbrs.resourceGroups}${environmentName}-health'
var healthTopicName = '${abbrs.eventGridTopics}health-${resourceToken}'

module healthTopics './app/health-events-topic.bicep' = [for (sub, i) in fleetSubscriptions: {
  name: 'health-events-topic-${i}'
  scope: subscription(sub)
  params: {
    resourceGroupName: healthResourceGroupName
    topicName: healthTopicName
    location: location
    tags: tags
  }
}]

// Each system topic dead-letters with its own identity, into the same container as the app's topic.
module healthDeadLetterAccess './app/deadletter-access.bicep' = [for (sub, i) in fleetSubscriptions: {
  name: 'health-deadletter-access-${i}'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    containerName: deadLetterContainerName
    topicPrincipalId: healthTopics[i].outputs.principalId
  }
}]

// The topic dead-letters with its own identity, which may write only the dead-letter container.
module deadLetterAccess './app/deadletter-access.bicep' = {
  name: 'eventgrid-deadletter-access'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    containerName: deadLetterContainerName
    topicPrincipalId: topic.outputs.principalId
  }
}

module rbac './app/rbac.bicep' = {
  name: 'data-roles'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    topicName: topic.outputs.name
    identityPrincipalId: identity.outputs.principalId
    deploymentContainerName: deploymentContainerName
    hostContainerNames: hostContainerNames
    developerPrincipalId: principalId
    developerPrincipalType: principalType
  }
}

module api './app/api.bicep' = {
  name: 'api'
  scope: rg
  params: {
    name: functionAppName
    planName: '${abbrs.serverFarms}${resourceToken}'
    location: location
    tags: tags
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageBlobEndpoint: storage.outputs.blobEndpoint
    storageQueueEndpoint: storage.outputs.queueEndpoint
    storageTableEndpoint: storage.outputs.tableEndpoint
    teamRequestsQueueEndpoint: teamStorage.outputs.queueEndpoint
    deploymentContainerName: deploymentContainerName
    applicationInsightsConnectionString: monitoring.outputs.connectionString
    appSettings: union(stewardSettings, settingOverrides)
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
  }
  dependsOn: [
    rbac
    teamQueuesAccess
  ]
}

module stewardRole './app/steward-role.bicep' = {
  name: 'steward-role'
  params: {
    roleName: 'GPU Fleet Steward (${environmentName}, ${resourceToken})'
    assignableScopes: assignableScopes
    createLinkedRole: !empty(linkedResourceGroupIds)
  }
}

module kubernetesRole './app/kubernetes-role.bicep' = {
  name: 'steward-kubernetes-role'
  params: {
    roleName: 'GPU Fleet Steward Kubernetes (${environmentName}, ${resourceToken})'
    assignableScopes: assignableScopes
  }
}

// One grant per cluster (in its resource group) and one per node resource group (VMSS actions).
module clusterAccess './app/cluster-access.bicep' = [for (cluster, i) in accessClusters: {
  name: 'steward-cluster-${i}'
  scope: resourceGroup(split(cluster.id, '/')[2], split(cluster.id, '/')[4])
  params: {
    clusterName: last(split(cluster.id, '/'))
    principalId: identity.outputs.principalId
    stewardRoleDefinitionGuid: stewardRole.outputs.roleDefinitionGuid
    kubernetesRoleDefinitionGuid: assignKubernetesRole ? kubernetesRole.outputs.roleDefinitionGuid : ''
    kubernetesNamespaceRoleDefinitionGuid: assignKubernetesRole ? kubernetesRole.outputs.namespaceRoleDefinitionGuid : ''
  }
}]

module nodeResourceGroupAccess './app/resource-group-access.bicep' = [for (cluster, i) in accessClusters: {
  name: 'steward-node-rg-${i}'
  scope: resourceGroup(split(cluster.id, '/')[2], cluster.nodeResourceGroup)
  params: {
    principalId: identity.outputs.principalId
    stewardRoleDefinitionGuid: stewardRole.outputs.roleDefinitionGuid
  }
}]

module resourceGroupAccess './app/resource-group-access.bicep' = [for (groupId, i) in accessResourceGroupIds: {
  name: 'steward-rg-${i}'
  scope: resourceGroup(split(groupId, '/')[2], split(groupId, '/')[4])
  params: {
    principalId: identity.outputs.principalId
    stewardRoleDefinitionGuid: stewardRole.outputs.roleDefinitionGuid
  }
}]

// Pools with custom networking: the linked-resources role on the resource groups of their subnets,
// public IP prefixes and proximity placement groups (else ARM answers LinkedAuthorizationFailed).
module linkedAccess './app/linked-access.bicep' = [for (groupId, i) in linkedResourceGroupIds: {
  name: 'steward-linked-${i}'
  scope: resourceGroup(split(groupId, '/')[2], split(groupId, '/')[4])
  params: {
    principalId: identity.outputs.principalId
    linkedRoleDefinitionGuid: stewardRole.outputs.linkedRoleDefinitionGuid
  }
}]

// DCGM error counters: read access to each Azure Monitor workspace the sweep queries (docs/signals-dcgm.md).
module prometheusAccess './app/prometheus-access.bicep' = [for (workspaceId, i) in prometheusWorkspaceIds: {
  name: 'steward-prometheus-${i}'
  scope: resourceGroup(split(workspaceId, '/')[2], split(workspaceId, '/')[4])
  params: {
    workspaceName: last(split(workspaceId, '/'))
    principalId: identity.outputs.principalId
  }
}]

output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = api.outputs.name
output STEWARD_IDENTITY_NAME string = identity.outputs.name
output STEWARD_IDENTITY_CLIENT_ID string = identity.outputs.clientId
output STEWARD_PRINCIPAL_ID string = identity.outputs.principalId
output STORAGE_ACCOUNT_NAME string = storage.outputs.name
output TEAM_REQUESTS_STORAGE_ACCOUNT_NAME string = teamStorage.outputs.name
output TEAM_REQUESTS_QUEUE_ENDPOINT string = teamStorage.outputs.queueEndpoint
output DEADLETTER_CONTAINER_NAME string = deadLetterContainerName
output EVENTGRID_TOPIC_NAME string = topic.outputs.name
output EVENTGRID_TOPIC_ENDPOINT string = topic.outputs.endpoint
output HEALTH_FLEET_SUBSCRIPTIONS string = join(fleetSubscriptions, ' ')
output HEALTH_RESOURCE_GROUP string = healthResourceGroupName
output HEALTH_TOPIC_NAME string = healthTopicName
output AZURE_FUNCTION_APP_ID string = api.outputs.id
output STORAGE_ACCOUNT_ID string = storage.outputs.id
output STEWARD_ROLE_DEFINITION_GUID string = stewardRole.outputs.roleDefinitionGuid
output STEWARD_KUBERNETES_ROLE_DEFINITION_GUID string = kubernetesRole.outputs.roleDefinitionGuid

// Data-plane roles for the app's identity (and, optionally, the developer who deploys it so that
// `func start` on a laptop can use the same resources). These replace every key: the host storage
// connection, the queue bindings, the ledger table, telemetry and event publishing all
// authenticate with Entra tokens.
param storageAccountName string
param applicationInsightsName string
param topicName string
param identityPrincipalId string
@description('The Flex Consumption deployment container (functionAppConfig.deployment.storage, app/api.bicep): the app\'s identity reads and writes the package there.')
param deploymentContainerName string
@description('The blob containers the Functions host keeps in AzureWebJobsStorage (azure-webjobs-hosts, azure-webjobs-secrets); main.bicep creates them.')
param hostContainerNames array
@description('Object id of a developer to grant the same data roles (empty: none).')
param developerPrincipalId string = ''
param developerPrincipalType string = 'User'

// Built-in role definition ids (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles).
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'
var eventGridDataSender = 'd5a91429-5739-47e2-a06b-3470a27159e7'

// One role per storage service, each what its user needs, on the narrowest scope that user reaches:
// - Blob: Storage Blob Data Contributor (read, write, delete blobs; read, create containers), on three
//   containers only, not on the account (which also holds the Event Grid dead letters):
//   * the deployment container. Flex Consumption reads the package from it with the identity named in
//     functionAppConfig.deployment.storage.authentication, and the platform's own tools assign exactly
//     this role for it: "When you use a user-assigned managed identity, ... The Storage Blob Data
//     Contributor role scoped to the deployment storage account also gets assigned to the identity"
//     (https://learn.microsoft.com/azure/azure-functions/flex-consumption-how-to#configure-deployment-settings);
//     the page also asks that "the container to use for deployments must also exist" (main.bicep
//     creates it), which is what lets the role be scoped to the container.
//   * azure-webjobs-hosts and azure-webjobs-secrets, the host's own containers (host leases, the timer
//     schedule monitor, host id checks; keys): Azure/azure-functions-host
//     src/WebJobs.Script/ScriptConstants.cs AzureWebJobsHostsContainerName,
//     src/WebJobs.Script.WebHost/Security/KeyManagement/BlobStorageSecretsRepository.cs
//     ("azure-webjobs-secrets"); Azure/azure-webjobs-sdk HostContainerNames.Hosts. Functions documents
//     Storage Blob Data Owner as "covering" host storage, and names what the host needs of it: "read and
//     write access to blobs and the ability to create containers"
//     (https://learn.microsoft.com/azure/azure-functions/functions-reference#connecting-to-host-storage-with-an-identity).
//     Contributor holds all of that; what Owner adds (POSIX ACLs and ownership, blob tags, acting as
//     super user on immutable blobs) the host never uses. main.bicep creates both containers, so the
//     host's create-if-missing finds them.
//   A container-scoped assignment "applies to all of the blobs in the container, and to the container
//   properties and metadata" (https://learn.microsoft.com/azure/storage/blobs/authorize-access-azure-active-directory#resource-scope),
//   which is all the host's container clients touch (exists, create-if-missing, blob read/write/list, leases).
//   It was Storage Blob Data Owner on the whole account before (issue 19): that let the app read and
//   rewrite every blob of the account, dead-lettered events included, and change their ACLs.
// - Queue Data Contributor: the queue triggers (pool requests, nudges: read, update, delete
//   messages), the host's poison-queue moves and the nudge output binding (add), which creates its
//   queue when it is missing (queues/write). Functions documents Contributor for queue output
//   bindings (learn.microsoft.com/azure/azure-functions/functions-reference#grant-permission-to-the-identity).
//   Queue Data Message Processor (read + process) and Message Sender (add) were assigned as well;
//   their data actions are a subset of Contributor's, so they granted nothing more and are gone.
// - Table Data Contributor: the ledger (shared/adapters/ledger.py: query, insert, ETag-guarded update).
var storageRoles = [
  storageQueueDataContributor
  storageTableDataContributor
]
var developerStorageRoleIds = empty(developerPrincipalId) ? [] : storageRoles
var appBlobContainerNames = concat([deploymentContainerName], hostContainerNames)
// The developer runs the host (`func start`), never the deployment: the host's containers only.
var developerBlobContainerNames = empty(developerPrincipalId) ? [] : hostContainerNames

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource appContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = [for name in appBlobContainerNames: {
  parent: blobService
  name: name
}]

resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = [for name in hostContainerNames: {
  parent: blobService
  name: name
}]

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource topic 'Microsoft.EventGrid/topics@2025-02-15' existing = {
  name: topicName
}

resource identityStorageRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for roleId in storageRoles: {
  name: guid(storage.id, identityPrincipalId, roleId)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

// One assignment per container, scoped to the i-th container of the existing collection (an extension
// resource in a loop scoped to `collection[i]`: Azure/bicep src/Bicep.Core.Samples/Files/baselines/
// LoopsIndexed_LF/main.bicep, `lockTheLocks`; the Bicep compiler is not available offline).
resource identityBlobRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in appBlobContainerNames: {
  name: guid(appContainers[i].id, identityPrincipalId, storageBlobDataContributor)
  scope: appContainers[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource identityMetrics 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, identityPrincipalId, monitoringMetricsPublisher)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource identityEventSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topic.id, identityPrincipalId, eventGridDataSender)
  scope: topic
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventGridDataSender)
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource developerStorageRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for roleId in developerStorageRoleIds: {
  name: guid(storage.id, developerPrincipalId, roleId)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}]

resource developerBlobRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in developerBlobContainerNames: {
  name: guid(hostContainers[i].id, developerPrincipalId, storageBlobDataContributor)
  scope: hostContainers[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}]

resource developerEventSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(topic.id, developerPrincipalId, eventGridDataSender)
  scope: topic
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventGridDataSender)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

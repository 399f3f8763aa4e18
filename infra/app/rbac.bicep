// Data-plane roles for the app's identity (and, optionally, the developer who deploys it so that
// `func start` on a laptop can use the same resources). These replace every key: the host storage
// connection, the queue bindings, the ledger table, telemetry and event publishing all
// authenticate with Entra tokens.
param storageAccountName string
param applicationInsightsName string
param topicName string
param identityPrincipalId string
@description('Object id of a developer to grant the same data roles (empty: none).')
param developerPrincipalId string = ''
param developerPrincipalType string = 'User'

// Built-in role definition ids (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles).
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'
var eventGridDataSender = 'd5a91429-5739-47e2-a06b-3470a27159e7'

// One role per storage service, each what its user needs:
// - Blob Data Owner: the Functions host (AzureWebJobsStorage: timer schedule monitor, host leases,
//   keys) and the deployment package the app pulls at start-up.
// - Queue Data Contributor: the queue triggers (pool requests, nudges: read, update, delete
//   messages), the host's poison-queue moves and the nudge output binding (add), which creates its
//   queue when it is missing (queues/write). Functions documents Contributor for queue output
//   bindings (learn.microsoft.com/azure/azure-functions/functions-reference#grant-permission-to-the-identity).
//   Queue Data Message Processor (read + process) and Message Sender (add) were assigned as well;
//   their data actions are a subset of Contributor's, so they granted nothing more and are gone.
// - Table Data Contributor: the ledger (shared/adapters/ledger.py: query, insert, ETag-guarded update).
var storageRoles = [
  storageBlobDataOwner
  storageQueueDataContributor
  storageTableDataContributor
]
var developerStorageRoleIds = empty(developerPrincipalId) ? [] : storageRoles

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

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

resource developerEventSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  name: guid(topic.id, developerPrincipalId, eventGridDataSender)
  scope: topic
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventGridDataSender)
    principalId: developerPrincipalId
    principalType: developerPrincipalType
  }
}

// Who may do what with the teams' pool-request queues (docs/pool-requests.md, "Teams and their
// queues"). They live in a storage account of their own, apart from the host's: a team's grant
// there can never reach the host's leases, the nudge queue or the ledger.
//
// - Each team: Storage Queue Data Message Sender (messages/add only) on its own queue, nothing else.
//   It cannot read, delete or create queues, and cannot send to another team's queue, so the queue
//   a message arrives on says which team sent it (shared/pools/teams.py records that team as requester).
// - The app: what its queue triggers need and no more (learn.microsoft.com/azure/azure-functions/
//   functions-bindings-storage-queue-trigger#identity-based-connections: Storage Queue Data Reader +
//   Storage Queue Data Message Processor) on each team queue, and Message Sender on each team's
//   poison queue, where the host moves a message that failed maxDequeueCount times. The queues and
//   their poison queues are created here, so the host never needs to create one: it sends first and
//   creates only when the send answers QueueNotFound (Azure/azure-sdk-for-net,
//   Microsoft.Azure.WebJobs.Extensions.Storage.Common StorageQueueExtensions.
//   AddMessageAndCreateIfNotExistsAsync). The app cannot send to a team queue: it cannot forge a request.
param storageAccountName string
param identityPrincipalId string
@description('One entry per team: { queue: <its queue>, principalId: <object id of the team\'s group or identity>, principalType: Group | User | ServicePrincipal }.')
param teamQueues array

// Built-in role definition ids (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles).
var storageQueueDataReader = '19e7f393-937e-4f77-808e-94535e297925'
var storageQueueDataMessageProcessor = '8a0f0c08-91a1-4084-bc3d-661d67233fed'
var storageQueueDataMessageSender = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for team in teamQueues: {
  parent: queueService
  name: team.queue
}]

resource poisonQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for team in teamQueues: {
  parent: queueService
  name: '${team.queue}-poison'
}]

resource teamSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (team, i) in teamQueues: {
  name: guid(queues[i].id, team.principalId, storageQueueDataMessageSender)
  scope: queues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageSender)
    principalId: team.principalId
    principalType: team.principalType
  }
}]

resource appReaders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (team, i) in teamQueues: {
  name: guid(queues[i].id, identityPrincipalId, storageQueueDataReader)
  scope: queues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataReader)
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource appProcessors 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (team, i) in teamQueues: {
  name: guid(queues[i].id, identityPrincipalId, storageQueueDataMessageProcessor)
  scope: queues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageProcessor)
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource appPoisonSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (team, i) in teamQueues: {
  name: guid(poisonQueues[i].id, identityPrincipalId, storageQueueDataMessageSender)
  scope: poisonQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageSender)
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

// The Event Grid topic's own identity may write dead-lettered events into the dead-letter container
// and nowhere else: Storage Blob Data Contributor (read, write, delete blobs) scoped to that one
// container, not to the account that also holds the app's host storage, queues and ledger.
// Event Grid dead-letters with the identity named in the subscription's deadLetterWithResourceIdentity
// (infra/app/eventgrid-subscription.bicep), here the topic's system-assigned identity.
// Role id: https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/storage
param storageAccountName string
param containerName string
@description('Object id of the topic\'s system-assigned identity.')
param topicPrincipalId string

var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource container 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: containerName
}

resource deadLetterWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(container.id, topicPrincipalId, storageBlobDataContributor)
  scope: container
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: topicPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output roleAssignmentId string = deadLetterWriter.id

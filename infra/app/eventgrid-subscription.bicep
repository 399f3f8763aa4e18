// The CloudEvents 1.0 subscription that delivers the steward's own health events to the
// remediation function. An AzureFunction endpoint must exist when the subscription is created, so
// this file is deployed after the code (azure.yaml postdeploy hook: scripts/postdeploy.sh), into
// the app's resource group. Its filter, retry policy and dead-letter settings are the Azure twin
// of devhost/eventgrid_subscriptions.json (the local host's mirror); tests/infra checks they agree.
// Dead letters are written with the topic's own system-assigned identity, which may write only the
// dead-letter container (infra/app/deadletter-access.bicep), never with the steward's identity.
param topicName string
param functionAppName string
param storageAccountName string
param deadLetterContainerName string

resource topic 'Microsoft.EventGrid/topics@2025-02-15' existing = {
  name: topicName
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource remediationEvents 'Microsoft.EventGrid/topics/eventSubscriptions@2025-02-15' = {
  parent: topic
  name: 'remediation-events'
  properties: {
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionApp.id}/functions/remediation_events'
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    eventDeliverySchema: 'CloudEventSchemaV1_0'
    filter: {
      includedEventTypes: [
        'Steward.GpuNode.Unhealthy'
      ]
      enableAdvancedFilteringOnArrays: true
    }
    retryPolicy: {
      maxDeliveryAttempts: 10
      eventTimeToLiveInMinutes: 1440
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storage.id
          blobContainerName: deadLetterContainerName
        }
      }
    }
  }
}

output id string = remediationEvents.id

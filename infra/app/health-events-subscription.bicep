// The CloudEvents 1.0 subscription that delivers one fleet subscription's Resource Health events to the
// health_events function. Deployed after the code (scripts/postdeploy.sh) into the resource group of that
// subscription's HealthResources system topic (app/health-events-topic.bicep), once per fleet subscription.
// Its filter, retry policy and dead-letter settings are the Azure twin of devhost/eventgrid_subscriptions.json
// ("health_events"); tests/infra checks they agree.
//
// Permission: whoever deploys this (azd's user or CI principal, not the app) needs
// Microsoft.ResourceNotifications/systemTopics/subscribeToHealthResources/action on the fleet subscription,
// besides Microsoft.EventGrid/systemTopics/eventSubscriptions/write
// (https://learn.microsoft.com/azure/event-grid/event-schema-health-resources, "Subscribe to events";
// docs/signals-resource-health.md).
param topicName string
param functionAppId string
param storageAccountId string
param deadLetterContainerName string

resource healthTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' existing = {
  name: topicName
}

resource healthEvents 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  parent: healthTopic
  name: 'health-events'
  properties: {
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionAppId}/functions/health_events'
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    eventDeliverySchema: 'CloudEventSchemaV1_0'
    filter: {
      includedEventTypes: [
        'Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged'
        'Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated'
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
          resourceId: storageAccountId
          blobContainerName: deadLetterContainerName
        }
      }
    }
  }
}

output id string = healthEvents.id

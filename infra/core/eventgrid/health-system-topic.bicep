// The HealthResources system topic of one subscription: Azure Resource Health publishes
// AvailabilityStatusChanged and ResourceAnnotated events for every VM (and VMSS VM) of the subscription
// to it. https://learn.microsoft.com/azure/event-grid/event-schema-health-resources ("Azure Resource
// Notifications - Health Resources events"): topic type Microsoft.ResourceNotifications.HealthResources,
// source /subscriptions/<id>, location global. One per subscription (a second one is refused).
// Its system-assigned identity dead-letters undeliverable events (app/deadletter-access.bicep grants
// it the dead-letter container only), never the steward's identity.
param name string
param subscriptionId string
param tags object = {}

resource healthTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
  name: name
  location: 'global'
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: '/subscriptions/${subscriptionId}'
    topicType: 'Microsoft.ResourceNotifications.HealthResources'
  }
}

output id string = healthTopic.id
output name string = healthTopic.name
output principalId string = healthTopic.identity.principalId

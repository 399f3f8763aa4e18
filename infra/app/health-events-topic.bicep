// One fleet subscription's side of Azure Resource Health events (docs/signals-resource-health.md): a
// resource group in that subscription holding its HealthResources system topic. Deployed by main.bicep
// once per fleet subscription (scope: subscription(<id>)); the event subscription that delivers to the
// health_events function is created after the code is deployed (app/health-events-subscription.bicep,
// scripts/postdeploy.sh), as Event Grid needs the function to exist.
targetScope = 'subscription'

param resourceGroupName string
param topicName string
param location string
param tags object = {}

resource healthGroup 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: resourceGroupName
  location: location
  tags: tags
}

module healthTopic '../core/eventgrid/health-system-topic.bicep' = {
  name: 'health-system-topic'
  scope: healthGroup
  params: {
    name: topicName
    subscriptionId: subscription().subscriptionId
    tags: tags
  }
}

output resourceGroupName string = healthGroup.name
output topicName string = healthTopic.outputs.name
output principalId string = healthTopic.outputs.principalId

// The custom topic the app publishes its CloudEvents to (health, remediation, pool requests,
// migrations). Local (key/SAS) auth is off: publishers need the EventGrid Data Sender role.
// The app's identity is attached so that the topic can dead-letter with it (no storage key).
param name string
param location string
param tags object = {}
param identityId string

resource topic 'Microsoft.EventGrid/topics@2025-02-15' = {
  name: name
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    inputSchema: 'CloudEventSchemaV1_0'
    disableLocalAuth: true
    publicNetworkAccess: 'Enabled'
    minimumTlsVersionAllowed: '1.2'
  }
}

output id string = topic.id
output name string = topic.name
output endpoint string = topic.properties.endpoint

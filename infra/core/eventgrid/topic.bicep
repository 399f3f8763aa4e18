// The custom topic the app publishes its CloudEvents to (health, remediation, pool requests,
// migrations). Local (key/SAS) auth is off: publishers need the EventGrid Data Sender role.
// The topic has its own system-assigned identity, used for one thing: writing undeliverable events
// to the dead-letter container (infra/app/deadletter-access.bicep grants Storage Blob Data
// Contributor on that container only). It does not carry the steward's identity: whatever the
// topic can do with an identity, it must not be able to reboot GPU machines or read the ledger.
// Network: publicNetworkAccess stays Enabled here (the Flex app publishes over the public endpoint
// unless it is VNet-integrated); docs/deploy.md "Network restrictions" shows how to close it.
param name string
param location string
param tags object = {}

resource topic 'Microsoft.EventGrid/topics@2025-02-15' = {
  name: name
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
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
output principalId string = topic.identity.principalId

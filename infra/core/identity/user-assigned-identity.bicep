// The app's one identity. Every connection (storage, Event Grid, ARM, the clusters' API servers,
// Application Insights) authenticates as this user-assigned identity, so nothing holds a key.
param name string
param location string
param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

output id string = identity.id
output name string = identity.name
output clientId string = identity.properties.clientId
output principalId string = identity.properties.principalId

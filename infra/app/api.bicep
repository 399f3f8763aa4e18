// The function app on Flex Consumption (FC1, Linux, Python 3.11). The code package is pulled from a
// blob container with the user-assigned identity; every connection is identity-based (no
// AzureWebJobsStorage connection string, no keys). App settings = the host's identity-based
// settings below + the steward's own settings passed in from main.bicep.
param name string
param planName string
param location string
param tags object = {}
param identityId string
param identityClientId string
param storageBlobEndpoint string
param storageQueueEndpoint string
param storageTableEndpoint string
@description('Queue endpoint of the team-requests storage account (the teams\' pool-request queues).')
param teamRequestsQueueEndpoint string
param deploymentContainerName string
param applicationInsightsConnectionString string
@description('The steward\'s own settings (everything shared/settings.py reads).')
param appSettings object
// The platform's floor is 1 ("Currently the lowest maximum instance count value is 1",
// https://learn.microsoft.com/azure/azure-functions/event-driven-scaling#limit-scale-out; 40 was the preview's).
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 40
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048
param pythonVersion string = '3.11'

// Read by the Functions host and the platform, not by the steward's code through shared.kernel.env:
// identity-based host storage (the queue bindings use connection "AzureWebJobsStorage" too),
// Entra-authenticated telemetry, and the worker isolation the CloudEvent binding type needs.
// Network: the app reaches storage, the topic, ARM and the clusters' API servers over their
// public endpoints unless virtualNetworkSubnetId is set; see docs/deploy.md "Network restrictions".
var hostSettings = {
  AzureWebJobsStorage__blobServiceUri: storageBlobEndpoint
  AzureWebJobsStorage__queueServiceUri: storageQueueEndpoint
  AzureWebJobsStorage__tableServiceUri: storageTableEndpoint
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  // The teams' pool-request triggers (connection "TeamRequestsStorage", functions/pool_requests.py):
  // identity-based, on the team-requests account, never on host storage.
  TeamRequestsStorage__queueServiceUri: teamRequestsQueueEndpoint
  TeamRequestsStorage__credential: 'managedidentity'
  TeamRequestsStorage__clientId: identityClientId
  AZURE_CLIENT_ID: identityClientId
  APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
  // Load-bearing: do not remove. The remediation function takes a `func.CloudEvent` (Event Grid,
  // CloudEvents 1.0 schema). That type exists only in azure-functions >= 1.25 (library PR #314), which
  // requirements.txt pins; the Python worker on the platform bundles an older azure-functions and,
  // for Python <= 3.12, imports its own copy first, so without isolation `func.CloudEvent` is missing
  // and the app fails to index (Azure/azure-functions-python-worker#1642). With this flag the worker
  // loads the app's pinned azure-functions instead. tests/infra/test_infra_worker_isolation.py.
  PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: union(tags, {
    'azd-service-name': 'api'
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    siteConfig: {
      minTlsVersion: '1.2'
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storageBlobEndpoint}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: pythonVersion
      }
    }
  }
}

resource settings 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: functionApp
  name: 'appsettings'
  properties: union(hostSettings, appSettings)
}

// No publishing credentials: deployments go through Entra (azd / the deployment container).
resource ftpCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'scm'
  properties: {
    allow: false
  }
}

output id string = functionApp.id
output name string = functionApp.name
output defaultHostName string = functionApp.properties.defaultHostName

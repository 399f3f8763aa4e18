// Grants the app's identity read access to one Azure Monitor workspace, for the DCGM error counters
// its sweep reads with PromQL (docs/signals-dcgm.md). Monitoring Data Reader is the built-in role
// for querying an Azure Monitor workspace's Prometheus metrics (MicrosoftDocs/azure-monitor-docs
// articles/azure-monitor/metrics/prometheus-api-promql.md; the role's id is listed in
// articles/role-based-access-control/built-in-roles/monitor.md).
@description('Name of the Azure Monitor workspace (Microsoft.Monitor/accounts), in this module\'s resource group.')
param workspaceName string

@description('Object id of the app\'s managed identity.')
param principalId string

var monitoringDataReader = 'b0d8363b-8ddd-447d-831f-62ca05bff136'

resource workspace 'Microsoft.Monitor/accounts@2023-04-03' existing = {
  name: workspaceName
}

resource readerOnWorkspace 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(workspace.id, principalId, monitoringDataReader)
  scope: workspace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringDataReader)
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}

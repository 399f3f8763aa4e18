// What tells the operators (docs/deploy.md, "Operators are told"): an Azure Monitor workbook over the metrics
// the app emits (remediations by outcome and signal, refusals by reason, the budgets and the breaker over
// time, migrations by phase, pool requests by outcome), alert rules on the outcomes that need a person
// (breaker opened, remediation gave up, migration blocked or rolled back, pool request failed) sent to the
// action group the operator names, and an Event Grid subscription delivering the steward's outcome events to
// the endpoint the operator names. The queries and event types live in infra/monitoring/*.json, read here and
// by tests/infra/test_infra_operator_monitoring.py, which checks every metric, dimension and event type they
// name against what the code emits.
param location string
param tags object = {}
param applicationInsightsId string
param topicName string
@description('Resource id of the action group the alerts notify; empty: the alert rules fire with no notification.')
param alertActionGroupId string = ''
@description('HTTPS webhook that receives the steward\'s outcome events (CloudEvents 1.0); empty: no subscription.')
param outcomeEventsEndpoint string = ''

var alerts = loadJsonContent('../monitoring/alerts.json')
var outcomeEvents = loadJsonContent('../monitoring/outcome-events.json')

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, 'gpu-fleet-steward-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'GPU fleet steward'
    category: 'workbook'
    sourceId: applicationInsightsId
    serializedData: loadTextContent('../monitoring/workbook.json')
    version: 'Notebook/1.0'
  }
}

resource alertRules 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [for alert in alerts: {
  name: 'steward-${alert.name}'
  location: location
  tags: tags
  properties: {
    displayName: alert.displayName
    description: alert.description
    severity: alert.severity
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: alert.query
          timeAggregation: 'Total'
          metricMeasureColumn: 'events'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: empty(alertActionGroupId) ? [] : [
        alertActionGroupId
      ]
    }
  }
}]

resource topic 'Microsoft.EventGrid/topics@2025-02-15' existing = {
  name: topicName
}

resource outcomes 'Microsoft.EventGrid/topics/eventSubscriptions@2025-02-15' = if (!empty(outcomeEventsEndpoint)) {
  parent: topic
  name: 'steward-outcomes'
  properties: {
    destination: {
      endpointType: 'WebHook'
      properties: {
        endpointUrl: outcomeEventsEndpoint
        maxEventsPerBatch: 1
      }
    }
    eventDeliverySchema: 'CloudEventSchemaV1_0'
    filter: {
      includedEventTypes: outcomeEvents
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
  }
}

output workbookId string = workbook.id

#!/bin/sh
# azd postdeploy hook: create (or update) the Event Grid subscription that delivers the steward's
# health events to the remediation function. It cannot be part of `azd provision`: Event Grid checks
# that an AzureFunction endpoint exists, and the function exists only once the code is deployed.
# The subscription is infra/app/eventgrid-subscription.bicep (the one definition, tested in
# tests/infra); azd passes main.bicep's outputs to this hook as environment variables.
set -eu

for name in AZURE_RESOURCE_GROUP AZURE_FUNCTION_APP_NAME EVENTGRID_TOPIC_NAME \
            STORAGE_ACCOUNT_NAME DEADLETTER_CONTAINER_NAME; do
  eval "value=\${$name:-}"
  if [ -z "$value" ]; then
    echo "postdeploy: $name is not set; run 'azd provision' first (it is an output of infra/main.bicep)" >&2
    exit 1
  fi
done

command -v az >/dev/null 2>&1 || { echo "postdeploy: the Azure CLI (az) is required: https://aka.ms/azure-cli" >&2; exit 1; }

here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
template="$here/../infra/app/eventgrid-subscription.bicep"

echo "postdeploy: subscribing function remediation_events to topic $EVENTGRID_TOPIC_NAME"
# Event Grid validates the AzureFunction endpoint; right after a deployment the function may not be
# indexed yet, so retry a few times before giving up.
attempts="${POSTDEPLOY_ATTEMPTS:-5}"
delay="${POSTDEPLOY_RETRY_DELAY_S:-30}"
attempt=1
while :; do
  if az deployment group create \
      --name remediation-events-subscription \
      --resource-group "$AZURE_RESOURCE_GROUP" \
      --template-file "$template" \
      --parameters \
        topicName="$EVENTGRID_TOPIC_NAME" \
        functionAppName="$AZURE_FUNCTION_APP_NAME" \
        storageAccountName="$STORAGE_ACCOUNT_NAME" \
        deadLetterContainerName="$DEADLETTER_CONTAINER_NAME" \
      --only-show-errors \
      --output none; then
    break
  fi
  if [ "$attempt" -ge "$attempts" ]; then
    echo "postdeploy: the Event Grid subscription could not be created after $attempts attempts;" \
         "re-run it with 'azd hooks run postdeploy'" >&2
    exit 1
  fi
  echo "postdeploy: attempt $attempt failed (is the function indexed yet?); retrying in ${delay}s" >&2
  attempt=$((attempt + 1))
  sleep "$delay"
done
# Azure Resource Health events: one subscription per fleet subscription, on its HealthResources system
# topic (infra/app/health-events-subscription.bicep). Needs, for whoever runs this hook,
# Microsoft.ResourceNotifications/systemTopics/subscribeToHealthResources/action on each fleet subscription
# (docs/signals-resource-health.md). Skipped when provision predates the health topics.
if [ -n "${HEALTH_TOPIC_NAME:-}" ] && [ -n "${HEALTH_FLEET_SUBSCRIPTIONS:-}" ]; then
  health_template="$here/../infra/app/health-events-subscription.bicep"
  for fleet_sub in $HEALTH_FLEET_SUBSCRIPTIONS; do
    echo "postdeploy: subscribing function health_events to the HealthResources topic of subscription $fleet_sub"
    attempt=1
    while :; do
      if az deployment group create \
          --name health-events-subscription \
          --subscription "$fleet_sub" \
          --resource-group "$HEALTH_RESOURCE_GROUP" \
          --template-file "$health_template" \
          --parameters \
            topicName="$HEALTH_TOPIC_NAME" \
            functionAppId="$AZURE_FUNCTION_APP_ID" \
            storageAccountId="$STORAGE_ACCOUNT_ID" \
            deadLetterContainerName="$DEADLETTER_CONTAINER_NAME" \
          --only-show-errors \
          --output none; then
        break
      fi
      if [ "$attempt" -ge "$attempts" ]; then
        echo "postdeploy: the health events subscription of $fleet_sub could not be created after $attempts attempts;" \
             "re-run it with 'azd hooks run postdeploy'" >&2
        exit 1
      fi
      attempt=$((attempt + 1))
      sleep "$delay"
    done
  done
fi
echo "postdeploy: done"

# azd postdeploy hook (Windows): same as postdeploy.sh. Creates the Event Grid subscription to the
# deployed remediation function from infra/app/eventgrid-subscription.bicep.
$ErrorActionPreference = 'Stop'

$names = 'AZURE_RESOURCE_GROUP', 'AZURE_FUNCTION_APP_NAME', 'EVENTGRID_TOPIC_NAME',
         'STORAGE_ACCOUNT_NAME', 'DEADLETTER_CONTAINER_NAME'
foreach ($name in $names) {
    if (-not [Environment]::GetEnvironmentVariable($name)) {
        throw "postdeploy: $name is not set; run 'azd provision' first (it is an output of infra/main.bicep)"
    }
}
if (-not (Get-Command az -ErrorAction SilentlyContinue)) {
    throw 'postdeploy: the Azure CLI (az) is required: https://aka.ms/azure-cli'
}

$template = Join-Path $PSScriptRoot '..' 'infra' 'app' 'eventgrid-subscription.bicep'
Write-Host "postdeploy: subscribing function remediation_events to topic $env:EVENTGRID_TOPIC_NAME"
# Event Grid validates the AzureFunction endpoint; right after a deployment the function may not be
# indexed yet, so retry a few times before giving up.
$attempts = if ($env:POSTDEPLOY_ATTEMPTS) { [int]$env:POSTDEPLOY_ATTEMPTS } else { 5 }
$delay = if ($env:POSTDEPLOY_RETRY_DELAY_S) { [int]$env:POSTDEPLOY_RETRY_DELAY_S } else { 30 }
for ($attempt = 1; ; $attempt++) {
    az deployment group create `
      --name remediation-events-subscription `
      --resource-group $env:AZURE_RESOURCE_GROUP `
      --template-file $template `
      --parameters `
        topicName=$env:EVENTGRID_TOPIC_NAME `
        functionAppName=$env:AZURE_FUNCTION_APP_NAME `
        storageAccountName=$env:STORAGE_ACCOUNT_NAME `
        deadLetterContainerName=$env:DEADLETTER_CONTAINER_NAME `
      --only-show-errors `
      --output none
    if ($LASTEXITCODE -eq 0) { break }
    if ($attempt -ge $attempts) {
        throw "postdeploy: the Event Grid subscription could not be created after $attempts attempts; re-run it with 'azd hooks run postdeploy'"
    }
    Write-Warning "postdeploy: attempt $attempt failed (is the function indexed yet?); retrying in ${delay}s"
    Start-Sleep -Seconds $delay
}
# Azure Resource Health events: one subscription per fleet subscription on its HealthResources system topic
# (infra/app/health-events-subscription.bicep); needs subscribeToHealthResources/action (docs/signals-resource-health.md).
if ($env:HEALTH_TOPIC_NAME -and $env:HEALTH_FLEET_SUBSCRIPTIONS) {
    $healthTemplate = Join-Path $PSScriptRoot '..' 'infra' 'app' 'health-events-subscription.bicep'
    foreach ($fleetSub in ($env:HEALTH_FLEET_SUBSCRIPTIONS -split ' ' | Where-Object { $_ })) {
        Write-Host "postdeploy: subscribing function health_events to the HealthResources topic of subscription $fleetSub"
        for ($attempt = 1; ; $attempt++) {
            az deployment group create `
              --name health-events-subscription `
              --subscription $fleetSub `
              --resource-group $env:HEALTH_RESOURCE_GROUP `
              --template-file $healthTemplate `
              --parameters `
                topicName=$env:HEALTH_TOPIC_NAME `
                functionAppId=$env:AZURE_FUNCTION_APP_ID `
                storageAccountId=$env:STORAGE_ACCOUNT_ID `
                deadLetterContainerName=$env:DEADLETTER_CONTAINER_NAME `
              --only-show-errors `
              --output none
            if ($LASTEXITCODE -eq 0) { break }
            if ($attempt -ge $attempts) {
                throw "postdeploy: the health events subscription of $fleetSub could not be created after $attempts attempts; re-run it with 'azd hooks run postdeploy'"
            }
            Start-Sleep -Seconds $delay
        }
    }
}
Write-Host 'postdeploy: done'

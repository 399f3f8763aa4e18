#!/bin/sh
# Find the clusters carrying the fleet tag and write them, with their node resource groups, to the
# azd environment as ACCESS_CLUSTERS: the next `azd provision` grants the steward's custom role on
# each cluster and on its node resource group (infra/main.bicep, accessClusters).
#
#   scripts/fleet-access.sh [key=value] [subscription-id ...]
#
# The tag defaults to FLEET_CLUSTER_TAG from the azd environment, else gpu-fleet-steward=enabled;
# the subscriptions default to the current az subscription.
set -eu

tag="${1:-${FLEET_CLUSTER_TAG:-gpu-fleet-steward=enabled}}"
[ $# -gt 0 ] && shift
key="${tag%%=*}"
value="${tag#*=}"
if [ "$key" = "$tag" ]; then
  echo "fleet-access: the tag must be key=value, got '$tag'" >&2
  exit 2
fi

command -v az >/dev/null 2>&1 || { echo "fleet-access: the Azure CLI (az) is required" >&2; exit 1; }
command -v azd >/dev/null 2>&1 || { echo "fleet-access: the Azure Developer CLI (azd) is required" >&2; exit 1; }

if [ $# -eq 0 ]; then
  set -- "$(az account show --query id --output tsv)"
fi

query="[?tags.\"$key\"=='$value'].{id:id, nodeResourceGroup:nodeResourceGroup}"
all="[]"
for subscription in "$@"; do
  found=$(az aks list --subscription "$subscription" --query "$query" --output json --only-show-errors)
  merged=$(python3 - "$all" "$found" <<'PY'
import json
import sys

previous, found = (json.loads(arg or "[]") for arg in sys.argv[1:3])
seen = {c["id"].lower() for c in previous}
print(json.dumps(previous + [c for c in found if c["id"].lower() not in seen]))
PY
)
  all="$merged"
done

count=$(printf '%s' "$all" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
echo "fleet-access: $count cluster(s) tagged $key=$value"
printf '%s\n' "$all"
azd env set ACCESS_CLUSTERS "$all"
echo "fleet-access: saved as ACCESS_CLUSTERS; run 'azd provision' to grant the roles"

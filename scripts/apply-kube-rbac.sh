#!/bin/sh
# Apply the steward's namespace and Kubernetes RBAC (infra/kubernetes/: namespace.yaml, the
# cluster-wide clusterrole.yaml, role.yaml's two namespaced Roles, and clusterrolebinding.yaml and
# rolebinding.yaml, which bind them to the app's identity) to EVERY cluster of the fleet, Azure RBAC
# ones included: evictions are authorised by the ClusterRole only (the Azure role holds no pods/write,
# which would let the app create privileged pods: docs/security.md), the node Events in `default` by
# role.yaml's node-events Role only, the Karpenter kinds have no Azure RBAC data actions, and the app's
# leases and sample Jobs live in namespace.yaml's namespace. role.yaml and rolebinding.yaml hold several
# documents ("---"); kubectl apply -f applies each.
# The simulator deploys the same files into every simulated cluster (sim/kube/rbac.py).
# Run it as a cluster admin:
#
#   scripts/apply-kube-rbac.sh <cluster ARM id> [<cluster ARM id> ...]
#
# STEWARD_PRINCIPAL_ID (the app identity's object id, an output of infra/main.bicep) comes from the
# environment or, when unset, from `azd env get-value`. Needs az, kubectl and kubelogin.
set -eu

if [ $# -eq 0 ]; then
  echo "usage: $0 <cluster ARM id> [...]" >&2
  exit 2
fi

principal="${STEWARD_PRINCIPAL_ID:-}"
if [ -z "$principal" ] && command -v azd >/dev/null 2>&1; then
  principal=$(azd env get-value STEWARD_PRINCIPAL_ID 2>/dev/null || true)
fi
if ! printf '%s' "$principal" | grep -Eq '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'; then
  echo "apply-kube-rbac: STEWARD_PRINCIPAL_ID must be the identity's object id (a GUID), got '$principal'" >&2
  exit 1
fi

here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
manifests="$here/../infra/kubernetes"
kubeconfig=$(mktemp)
trap 'rm -f "$kubeconfig"' EXIT INT TERM

for cluster in "$@"; do
  subscription=$(printf '%s' "$cluster" | cut -d/ -f3)
  group=$(printf '%s' "$cluster" | cut -d/ -f5)
  name=$(printf '%s' "$cluster" | cut -d/ -f9)
  if [ -z "$subscription" ] || [ -z "$group" ] || [ -z "$name" ]; then
    echo "apply-kube-rbac: not a cluster ARM id: $cluster" >&2
    exit 2
  fi
  echo "apply-kube-rbac: $name ($group)"
  az aks get-credentials --subscription "$subscription" --resource-group "$group" --name "$name" \
    --file "$kubeconfig" --overwrite-existing --only-show-errors
  kubelogin convert-kubeconfig --login azurecli --kubeconfig "$kubeconfig"
  kubectl --kubeconfig "$kubeconfig" apply -f "$manifests/namespace.yaml" -f "$manifests/clusterrole.yaml" \
    -f "$manifests/role.yaml"
  # two documents, one stream: "---" between them
  { cat "$manifests/clusterrolebinding.yaml"; printf '%s\n' '---'; cat "$manifests/rolebinding.yaml"; } \
    | sed "s/\${STEWARD_PRINCIPAL_ID}/$principal/g" \
    | kubectl --kubeconfig "$kubeconfig" apply -f -
done

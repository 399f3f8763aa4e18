"""AKS preview features the managed GPU stack needs, and what to tell whoever must register them.

Managed GPU node pools are a preview: until the subscription registers the feature, AKS refuses the
pool with ``PreviewFeatureNotRegistered`` (mapped to :class:`~shared.kernel.errors.FeatureNotRegistered`
by the ARM adapter). Both jobs that create such pools (a team's request, a migration's replacement)
report the same three commands. Source: "Register the preview feature" in
https://learn.microsoft.com/azure/aks/aks-managed-gpu-nodes and
https://learn.microsoft.com/azure/azure-resource-manager/management/preview-features.
"""

from __future__ import annotations

from shared.kernel.errors import FeatureNotRegistered

MANAGED_GPU_FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"


def feature_registration_help(error: FeatureNotRegistered, *, subscription: str) -> str:
    """What the requester must do when AKS refused a pool for an unregistered preview feature."""
    feature = error.feature or MANAGED_GPU_FEATURE
    namespace, _, name = feature.partition("/")
    return (f"subscription {subscription} has not registered the preview feature {feature}, which managed GPU node "
            f"pools need. An owner of the subscription registers it with: az feature register --namespace {namespace} "
            f"--name {name} --subscription {subscription}; waits until az feature show --namespace {namespace} --name "
            f"{name} --subscription {subscription} says Registered; then runs az provider register --namespace "
            f"{namespace} --subscription {subscription}. Then send the request again with a new requestId. "
            f"(Azure said: {error.reason})")

"""Is a node going away by someone else's hand? (pure, over the observed Node)

Azure takes spot VMs back at short notice: the VM gets a ``Preempt`` scheduled event at least 30 s
ahead, AKS node auto-drain cordons the node with ``remediator.kubernetes.azure.com/unschedulable``
and drains it (https://learn.microsoft.com/azure/aks/node-auto-drain), then the VM is deleted or
stopped-deallocated as the pool's ``scaleSetEvictionPolicy`` says
(https://learn.microsoft.com/azure/aks/spot-node-pool). A stopped or deallocated VM's Node carries
``node.cloudprovider.kubernetes.io/shutdown`` (kubernetes/cloud-provider
controllers/nodelifecycle/node_lifecycle_controller.go); the cluster autoscaler marks a node it is
removing with ``ToBeDeletedByClusterAutoscaler`` (kubernetes/autoscaler
cluster-autoscaler/utils/taints/taints.go).

Nothing the app does to such a node helps: a drain races the platform's own, a repair restarts a VM
that is being taken away, and its pods are lost (or moved) whatever happens. The migration leaves
these nodes out of its batches and of its accounting, and the remediation must not start on them.
"""

from __future__ import annotations

from shared.kernel.ports import NodeView

PREEMPT_TAINT = "remediator.kubernetes.azure.com/unschedulable"
SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"
AUTOSCALER_DELETE_TAINT = "ToBeDeletedByClusterAutoscaler"
SPOT_LABEL = "kubernetes.azure.com/scalesetpriority"

_WHY = {  # in order of precedence
    SHUTDOWN_TAINT: "its VM is stopped or deallocated (a spot eviction with the Deallocate policy)",
    PREEMPT_TAINT: "its VM got a Preempt (spot eviction) or Redeploy notice and AKS is draining it",
    AUTOSCALER_DELETE_TAINT: "the cluster autoscaler is removing it",
}


def going_away(node: NodeView) -> str:
    """Why ``node`` is being taken away by the platform ("" = it is not); a stopped VM says so first."""
    keys = {t.key for t in node.taints}
    return next((why for key, why in _WHY.items() if key in keys), "")


def is_shut_down(node: NodeView) -> bool:
    """The node's VM is stopped: its kubelet runs nothing, whatever the API still binds to it."""
    return any(t.key == SHUTDOWN_TAINT for t in node.taints)


def is_spot(node: NodeView) -> bool:
    return node.labels.get(SPOT_LABEL) == "spot"

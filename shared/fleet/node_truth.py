"""Which machine is this node, according to ARM? (the confused-deputy defence of remediation)

A Node object is written by whoever administers its cluster: its labels (pool, GPU) and its
``spec.providerID`` (the VM behind it) are claims, not facts. A cluster admin can create a Node
whose providerID names a VM of *another* cluster's node resource group; if the steward believed it,
it would "drain" the empty fake node and then restart or reimage the other cluster's VM past that
cluster's PodDisruptionBudgets, with its own (fleet-wide) Azure identity. So before anything is
admitted, and again right before a VM action, the node is checked against ARM:

- the cluster (``managedClusters`` GET) gives its own ``nodeResourceGroup``, subscription and
  node provisioning mode;
- the pool the node claims (label ``kubernetes.azure.com/agentpool``) must exist in ARM, be a
  ``User`` pool, and have an NVIDIA GPU ``vmSize`` (shared.fleet.gpu_sizes);
- the node must be one of that pool's machines (``agentPools/{pool}/machines``, matched by name;
  the Machines API, https://learn.microsoft.com/azure/aks/node-pool-machines-api: the machine name is the
  node name on VMSS pools), and the VM is the machine's
  ``properties.resourceId``, never the node's providerID;
- that VM must sit in the cluster's own subscription and node resource group, and the node's
  providerID must name the same VM (ids compare case-insensitively, as ARM does).

Node auto-provisioning (Karpenter) nodes have no agent pool and no machines API. For them the
steward trusts ARM for the cluster's ``nodeProvisioningProfile.mode`` (it must be ``Auto``) and
requires the providerID to name a VM in the cluster's own subscription and node resource group;
their only repair is deleting their NodeClaim through the *same* cluster's Kubernetes API (found by
providerID and node name at the step), never an ARM call on the VM. So a forged NAP node can at most
make the steward delete a NodeClaim in the cluster whose admin forged it, which that admin could do
anyway; it can never reach another cluster.

The checks are pure functions over what ARM returned (tables in tests/unit/test_trust_arm.py);
:func:`resolve` does the reads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shared.fleet import gpu_sizes
from shared.kernel.errors import NotFound
from shared.kernel.ports import AksPort, ClusterInfo, MachineInfo, PoolInfo

# Refusal codes (stable: they are in Refused events, records and docs/remediation.md).
PROVIDER_ID_MISMATCH = "ProviderIdMismatch"  # the node's providerID is not the VM ARM knows for it
NOT_A_MACHINE = "NotAMachine"  # the node is not a machine of the pool it claims (ARM)
FOREIGN_VM = "ForeignVm"  # ARM's VM for it is outside the cluster's subscription / node resource group
NO_SUCH_POOL = "NoSuchPool"  # the pool the node claims does not exist in ARM
NOT_USER_POOL = "NotUserPool"  # a System pool (never remediated: it runs the cluster's own add-ons)
NOT_GPU_POOL = "NotGpuPool"  # the pool's ARM vmSize is not an NVIDIA GPU size
NOT_NAP_CLUSTER = "NotNapCluster"  # a node claims to be Karpenter's on a cluster without NAP
NODE_RECREATED = "NodeRecreated"  # the Node object is not the one admitted (new uid): our cordon is gone
REFUSAL_CODES = frozenset({PROVIDER_ID_MISMATCH, NOT_A_MACHINE, FOREIGN_VM, NO_SUCH_POOL, NOT_USER_POOL, NOT_GPU_POOL,
                           NOT_NAP_CLUSTER, NODE_RECREATED})

_VM_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
    r"(?:virtualMachineScaleSets/[^/]+/virtualMachines/[^/]+|virtualMachines/[^/]+)$",
    re.IGNORECASE,
)
_AZURE_SCHEME = "azure://"


@dataclass(frozen=True)
class Verdict:
    """``ok`` with the VM id ARM gave (empty for NAP nodes), or a refusal ``code`` and ``reason``."""

    ok: bool
    code: str = ""
    reason: str = ""
    vm_id: str = ""

    @classmethod
    def refuse(cls, code: str, reason: str) -> Verdict:
        return cls(False, code, reason)


def vm_of_provider_id(provider_id: str) -> str:
    """The ARM id in ``azure:///subscriptions/...`` ("" when it is not an Azure providerID)."""
    return provider_id[len(_AZURE_SCHEME):] if provider_id.lower().startswith(_AZURE_SCHEME) else ""


def in_node_resource_group(vm_id: str, cluster: ClusterInfo) -> bool:
    """Whether ``vm_id`` is a Compute VM (VMSS instance or standalone) of ``cluster``'s own node
    resource group, in the cluster's own subscription."""
    match = _VM_ID.match(vm_id)
    if match is None or not cluster.node_resource_group:
        return False
    sub = (cluster.subscription or "").lower()
    return match["sub"].lower() == sub and match["rg"].lower() == cluster.node_resource_group.lower()


def check_pool(cluster: ClusterInfo, pool_name: str, pool: PoolInfo | None) -> Verdict:
    """The node's claimed agent pool, as ARM has it: it must exist, be a User pool, and be NVIDIA GPU."""
    if pool is None:
        return Verdict.refuse(NO_SUCH_POOL, f"pool {pool_name or '(none)'} is not an agent pool of {cluster.name} in ARM")
    mode = str(pool.properties.get("mode") or "")
    if mode.lower() != "user":
        return Verdict.refuse(NOT_USER_POOL, f"pool {pool_name} is a {mode or 'mode-less'} pool in ARM, not a User pool")
    size = gpu_sizes.lookup(pool.vm_size)
    if size is None or not size.is_nvidia:
        return Verdict.refuse(NOT_GPU_POOL, f"pool {pool_name} has vmSize {pool.vm_size or '(none)'} in ARM: not an "
                                            f"NVIDIA GPU size")
    return Verdict(True)


def check_machine(cluster: ClusterInfo, *, pool_name: str, node_name: str, provider_id: str,
                  machines: Sequence[MachineInfo]) -> Verdict:
    """The VM of ``node_name`` from the pool's machines (ARM), checked against the cluster and the node."""
    machine = next((m for m in machines if m.name == node_name), None)
    if machine is None:
        return Verdict.refuse(NOT_A_MACHINE, f"node {node_name} is not a machine of pool {pool_name} in ARM "
                                             f"(providerID {provider_id or '(none)'})")
    vm = machine.resource_id
    if not in_node_resource_group(vm, cluster):
        return Verdict.refuse(FOREIGN_VM, f"ARM's VM for {node_name} ({vm or '(none)'}) is not in the cluster's node "
                                          f"resource group {cluster.subscription}/{cluster.node_resource_group}")
    claimed = vm_of_provider_id(provider_id)
    if claimed.lower() != vm.lower():
        return Verdict.refuse(PROVIDER_ID_MISMATCH, f"node {node_name} says its VM is {provider_id or '(none)'}, "
                                                    f"ARM says {vm}")
    return Verdict(True, vm_id=vm)


def check_nap(cluster: ClusterInfo, *, node_name: str, provider_id: str) -> Verdict:
    """A node that claims to be Karpenter's: the cluster must provision nodes automatically (ARM) and the
    providerID must name a VM of the cluster's own node resource group."""
    if cluster.node_provisioning_mode.lower() != "auto":
        return Verdict.refuse(NOT_NAP_CLUSTER, f"node {node_name} claims to be a Karpenter node, but {cluster.name} "
                                               f"has node provisioning mode {cluster.node_provisioning_mode} in ARM")
    vm = vm_of_provider_id(provider_id)
    if not in_node_resource_group(vm, cluster):
        return Verdict.refuse(PROVIDER_ID_MISMATCH, f"node {node_name} says its VM is {provider_id or '(none)'}: not "
                                                    f"in the cluster's node resource group "
                                                    f"{cluster.subscription}/{cluster.node_resource_group}")
    return Verdict(True)


def resolve(aks: AksPort, cluster: ClusterInfo, *, pool_name: str, node_name: str, provider_id: str,
            nap: bool) -> Verdict:
    """Read ARM and judge the node (see the module docstring); raises only transport errors."""
    if nap:
        return check_nap(cluster, node_name=node_name, provider_id=provider_id)
    pool = aks.get_pool(cluster.id, pool_name) if pool_name else None
    verdict = check_pool(cluster, pool_name, pool)
    if not verdict.ok:
        return verdict
    try:
        machines = aks.list_machines(cluster.id, pool_name)
    except NotFound:
        machines = []
    return check_machine(cluster, pool_name=pool_name, node_name=node_name, provider_id=provider_id, machines=machines)

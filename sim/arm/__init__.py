"""Azure Resource Manager as the app meets it: the AKS resource provider (Microsoft.ContainerService),
the VMSS VM actions of Microsoft.Compute, Microsoft.Features, the Resource Health availability of a VM,
Azure RBAC over every route, and long-running operations. The handler is :class:`sim.arm.api.ArmApi`.
"""

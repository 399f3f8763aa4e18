"""The Kubernetes API servers of the simulated AKS clusters (:class:`sim.kube.api.KubeApi`) and the cluster
behaviour behind them: the object store, namespaces, nodes and their VMs, pods, workload controllers,
PodDisruptionBudgets, the scheduler, node auto-provisioning, admission (Pod Security, validation, field
validation) and RBAC. :class:`sim.model.Cluster` is made of this package's parts.
"""

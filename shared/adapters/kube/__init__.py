"""The Kubernetes adapter, one module per concern.

- :mod:`~shared.adapters.kube.client`: ``KubeClient``, the KubePort adapter (nodes, pods, evictions,
  PDBs, events, leases), built on :mod:`~shared.adapters.kube.objects` (Jobs, Karpenter objects) and
  :mod:`~shared.adapters.kube.transport` (connection, token, retries);
- :mod:`~shared.adapters.kube.decoding`: the wire structs and the msgspec decoders into the views;
- :mod:`~shared.adapters.kube.auth`: the kubeconfig from ARM (and its refusals) and the token cache;
- :mod:`~shared.adapters.kube.errors`: API answers as shared.kernel.errors, evictions as outcomes.

Nothing is re-exported here: import from the module that defines a name (and patch it there).
"""

"""The fleet simulator: AKS, Kubernetes, Event Grid and managed identity over real HTTP.

Not deployed with the function app (see .funcignore). ``python -m sim --help``.

One package per server it imitates: :mod:`sim.arm` (Azure Resource Manager and the AKS resource
provider), :mod:`sim.kube` (the clusters' Kubernetes API servers), :mod:`sim.eventgrid`,
:mod:`sim.prometheus` (the Azure Monitor workspace) and :mod:`sim.identity` (managed identity and
tokens); :mod:`sim.core` holds what they share (HTTP, listeners, control API, faults, oracles). The
fleet model and the entry points are here: :mod:`sim.model`, :mod:`sim.scenario`, :mod:`sim.generate`,
:mod:`sim.testing`.
"""

"""The fleet simulator: AKS, Kubernetes, Event Grid and managed identity over real HTTP.

Not deployed with the function app (see .funcignore). ``python -m sim --help``.
"""

"""The local Functions host: runs function_app's functions the way the Azure Functions host does.

Core Tools cannot be installed on our machines, so this package stands in for ``func start`` in the
demo and the end-to-end tests. It is not deployed (see .funcignore).
"""

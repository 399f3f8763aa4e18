"""The local Functions host: runs function_app's functions the way the Azure Functions host does.

Core Tools cannot be installed on our machines, so this package stands in for ``func start`` in the
demo and the end-to-end tests. It is not deployed (see .funcignore). See devhost/README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devhost.host import Host, HostError

__all__ = ["Host", "HostError"]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``devhost.azurite`` (used by make and conftest) does not import azure.functions.
    if name in __all__:
        from devhost import host

        return getattr(host, name)
    raise AttributeError(name)

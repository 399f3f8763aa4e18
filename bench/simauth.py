"""A token credential backed by the simulator's control API, for benchmarks that drive adapters directly.

The benchmarks that time the app's client code (the sweep's listing) build ``shared.adapters.kube.client.KubeClient``
exactly as the app does; only the credential differs, because the bench process is not a Functions
host with a managed identity. Token acquisition is outside every timed section.
"""

from __future__ import annotations

import time
from typing import Any

from azure.core.credentials import AccessToken


class SimTokenCredential:
    """``get_token(scope)`` for the simulator's audiences (scope ``<audience>/.default``)."""

    def __init__(self, sim: Any) -> None:
        self._sim = sim
        self._cache: dict[str, AccessToken] = {}

    def get_token(self, *scopes: str, **_: Any) -> AccessToken:
        audience = scopes[0].removesuffix("/.default") if scopes else ""
        cached = self._cache.get(audience)
        if cached is not None and cached.expires_on - 60 > time.time():
            return cached
        answer = self._sim.control("POST", "/token", {"audience": audience})
        token = AccessToken(str(answer["access_token"]), int(answer["expires_on"]))
        self._cache[audience] = token
        return token

"""The simulator as the app sees it in Azure: its managed identity and its settings.

Integration tests run the app's real adapters (shared.wiring) against a simulator started for the
module. :func:`sim_as_the_app` starts it and points the app's ``ManagedIdentityCredential`` at the
simulator's identity endpoint the way App Service / Functions does (``IDENTITY_ENDPOINT`` and
``IDENTITY_HEADER``); :func:`app_settings` is the settings a deployment would give the app there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shared.settings import Settings, load
from sim.testing import SimHandle, start_sim


@contextmanager
def sim_as_the_app(**start: Any) -> Iterator[SimHandle]:
    """``start_sim(**start)``, with the app's credential reading tokens from the simulator."""
    from shared.adapters import identity

    with start_sim(**start) as handle, pytest.MonkeyPatch.context() as mp:
        mp.setenv("IDENTITY_ENDPOINT", handle.endpoints["identity_endpoint"])
        mp.setenv("IDENTITY_HEADER", handle.endpoints["identity_header"])
        mp.delenv("MSI_ENDPOINT", raising=False)
        identity.reset()
        try:
            yield handle
        finally:
            identity.reset()


def app_settings(sim: SimHandle, **extra: str) -> Settings:
    """The app's settings against ``sim`` (every subscription it serves unless ``extra`` says otherwise)."""
    ep = sim.endpoints
    return load({
        "FLEET_SUBSCRIPTIONS": ",".join(ep["subscriptions"]),
        "ARM_ENDPOINT": ep["arm_endpoint"], "ARM_AUDIENCE": ep["arm_audience"], "STEWARD_CA_BUNDLE": ep["ca_bundle"],
        "AzureWebJobsStorage": "UseDevelopmentStorage=true",
        "EVENTGRID_TOPIC_ENDPOINT": ep["eventgrid_topic_endpoint"], "IDENTITY_ENDPOINT": ep["identity_endpoint"],
        **extra,
    })

"""The simulator's endpoints.json, turned into what a Functions app on App Service would be given.

Used by the local host and by fleetctl (``--endpoints``), so both reach the simulator the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_endpoints(endpoints: Mapping[str, Any] | str | Path | None) -> dict[str, Any] | None:
    if endpoints is None:
        return None
    if isinstance(endpoints, Mapping):
        return dict(endpoints)
    return dict(json.loads(Path(endpoints).read_text(encoding="utf-8")))


def endpoint_settings(endpoints: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(platform variables, app-setting defaults) for running the app against the simulator.

    The platform variables are what App Service sets for a managed identity (the host is the
    platform here); the defaults point the app's own settings at the simulator and are used only
    where the given settings leave them unset.
    """
    platform = {}
    if endpoints.get("identity_endpoint"):
        platform["IDENTITY_ENDPOINT"] = str(endpoints["identity_endpoint"])
        platform["IDENTITY_HEADER"] = str(endpoints.get("identity_header") or "")
    defaults = {}
    for key, setting in (("arm_endpoint", "ARM_ENDPOINT"), ("arm_audience", "ARM_AUDIENCE"),
                         ("ca_bundle", "STEWARD_CA_BUNDLE"), ("eventgrid_topic_endpoint", "EVENTGRID_TOPIC_ENDPOINT")):
        if endpoints.get(key):
            defaults[setting] = str(endpoints[key])
    subscriptions = [str(s) for s in endpoints.get("subscriptions") or []]
    for cluster in endpoints.get("clusters") or []:
        parts = str(cluster.get("id", "")).split("/")
        if len(parts) > 2 and parts[2] not in subscriptions:
            subscriptions.append(parts[2])
    if subscriptions:
        defaults["FLEET_SUBSCRIPTIONS"] = ",".join(subscriptions)
    return platform, defaults

"""Microsoft.Features: a subscription's preview features, their state, register and unregister.
"""

from __future__ import annotations

from typing import Any

from sim.arm.common import DEFAULT_FEATURES
from sim.core.http import Request, Response


class Features:
    """Part of :class:`sim.arm.api.ArmApi`: the Microsoft.Features routes.
    """

    # ---- Microsoft.Features: subscription preview features (az feature show / list / register)
    # azure-rest-api-specs specification/resources/resource-manager/Microsoft.Features/stable/2021-07-01/
    # features.json (Features_Get / Features_List / Features_Register / Features_Unregister): a
    # FeatureResult {"id", "name": "<namespace>/<feature>", "type": "Microsoft.Features/providers/features",
    # "properties": {"state"}}; registering goes through Registering before Registered.
    def _feature_states(self, sub: str) -> dict[str, list[str]]:
        """Features of one subscription: lower-case ``Namespace/Name`` -> [name as written, state] (kept on
        the fleet; the scenario's ``subscriptions[].features`` maps ``Namespace/Name`` to a state)."""
        table = getattr(self.fleet, "feature_states", None)
        if not isinstance(table, dict):
            table = {}
            for spec in (getattr(self.fleet, "scenario", None) or {}).get("subscriptions") or []:
                if isinstance(spec, dict) and spec.get("id"):
                    states = {k.lower(): [k, v] for k, v in DEFAULT_FEATURES.items()}
                    states.update({str(k).lower(): [str(k), str(v)] for k, v in (spec.get("features") or {}).items()})
                    table[str(spec["id"]).lower()] = states
            self.fleet.feature_states = table
        return table.setdefault(sub.lower(), {k.lower(): [k, v] for k, v in DEFAULT_FEATURES.items()})

    def _feature_state(self, sub: str, feature: str) -> str:
        entry = self._feature_states(sub).get(feature.lower())
        return entry[1] if entry else "NotRegistered"

    @staticmethod
    def _feature_body(sub: str, ns: str, name: str, state: str) -> dict[str, Any]:
        return {"id": f"/subscriptions/{sub}/providers/Microsoft.Features/providers/{ns}/features/{name}",
                "name": f"{ns}/{name}", "type": "Microsoft.Features/providers/features", "properties": {"state": state}}

    def _r_features(self, request: Request, *, sub: str, ns: str) -> Response:
        prefix = ns.lower() + "/"
        items = [self._feature_body(sub, ns, name.split("/", 1)[1], state)
                 for key, (name, state) in sorted(self._feature_states(sub).items()) if key.startswith(prefix)]
        return Response.json(200, {"value": items})

    def _r_feature(self, request: Request, *, sub: str, ns: str, feature: str) -> Response:
        return Response.json(200, self._feature_body(sub, ns, feature, self._feature_state(sub, f"{ns}/{feature}")))

    def _r_feature_action(self, request: Request, *, sub: str, ns: str, feature: str, action: str) -> Response:
        states = self._feature_states(sub)
        key = f"{ns}/{feature}".lower()
        register = action.lower() == "register"
        entry = states.setdefault(key, [f"{ns}/{feature}", "NotRegistered"])
        entry[1] = "Registering" if register else "Unregistering"
        final = "Registered" if register else "Unregistered"

        def settle() -> None:
            if entry[1] in ("Registering", "Unregistering"):
                entry[1] = final

        self.fleet.at(self._now() + self._timing("feature_register_s", 120.0), settle)
        return Response.json(200, self._feature_body(sub, ns, feature, entry[1]))

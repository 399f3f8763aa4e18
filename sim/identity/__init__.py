"""Microsoft Entra ID as the app meets it: the App Service managed-identity endpoint
(:class:`sim.identity.api.IdentityApi`) and the bearer tokens it issues and every simulated server
checks (:mod:`sim.identity.tokens`).

The app's principal is exported here (``from sim.identity import APP_PRINCIPAL_ID``), as it was when
this package was one module.
"""

from sim.identity.api import APP_PRINCIPAL_ID, app_principal_id

__all__ = ["APP_PRINCIPAL_ID", "app_principal_id"]

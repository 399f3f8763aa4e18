"""What the deployment grants the app's identity on Azure, as the code declares it (for the simulator tests).

The custom role holds exactly the actions the ARM adapters declare (``requires_arm`` on
shared.adapters.aks and shared.adapters.compute; tests/infra checks it against
infra/app/steward-role.bicep), and the linked-resource role the actions pool writes need on linked
resources (shared.adapters.permissions.LINKED_POOL_ACTIONS). Kept out of the product: only tests read
it, and in the product it would make one adapter module import the others.
"""

from __future__ import annotations

import shared.adapters.aks
import shared.adapters.compute
from shared.adapters.permissions import collect_arm_actions, linked_actions


def steward_role_actions() -> set[str]:
    """The custom role's actions plus the linked-resource role's."""
    return collect_arm_actions(shared.adapters.aks, shared.adapters.compute) | linked_actions()

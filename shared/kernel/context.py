"""Everything a step needs, in one object passed explicitly.

Built once per process by :func:`shared.wiring.build_context` (lazily, on the first invocation);
tests build one from their own parts. Holding the adapters here, rather than importing them in the
state machines, is what keeps the decisions pure and the triggers thin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.kernel.memo import Caches

if TYPE_CHECKING:
    from shared.kernel.clock import Clock
    from shared.kernel.ports import ClusterAccess, EventsPort, LedgerPort, NudgePort
    from shared.kernel.telemetry import Telemetry
    from shared.settings import Settings


@dataclass
class Context:
    settings: Settings
    clock: Clock
    ledger: LedgerPort
    access: ClusterAccess
    events: EventsPort
    telemetry: Telemetry
    instance: str = "local"  # who owns claims and leases: host name + process id in Azure
    nudge: NudgePort | None = None  # delayed wake-ups of the reconciler (shared.kernel.nudge); None: the timer alone
    caches: Caches = field(default_factory=Caches)  # per-process caches, typed and named (shared.kernel.memo)

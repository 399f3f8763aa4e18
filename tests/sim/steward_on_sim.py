"""Drive the app's real remediation (real adapters, real reconciler) against a simulator on a manual clock.

Not a test module: the ladder tests of tests/sim use it to watch what the app does when the
simulator behaves like the real system (NPD after a reboot, a locked node resource group, NAP nodes).
The app's clock *is* the simulator's (read from ``/_sim/clock``), and time moves only when the driver
advances it to the next record that is due, so a long ladder runs in a fraction of a second.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from sim.testing import SimHandle, start_sim


class SimTime:
    """shared.kernel.clock.Clock over the simulator's manual clock."""

    def __init__(self, sim: SimHandle) -> None:
        self.sim = sim

    def now(self) -> float:
        return float(self.sim.control("GET", "/clock")["now"])

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.sim.control("POST", "/advance", {"seconds": seconds})


@dataclass
class Recorded:
    """EventsPort that keeps what was published."""

    published: list[dict[str, Any]] = field(default_factory=list)

    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        self.published.append({"type": type_, "subject": subject, "data": dict(data), "id": id_})

    def types(self) -> list[str]:
        return [e["type"] for e in self.published]


@contextlib.contextmanager
def steward_on(scenario: dict[str, Any], **settings: str) -> Iterator[tuple[SimHandle, Any]]:
    """Start the simulator with ``scenario`` (its clock must be manual) and a Context wired to it."""
    from shared.adapters import identity
    from shared.kernel.context import Context
    from shared.settings import load
    from shared.wiring import FleetAccess
    from tests.fakes.ledger import InMemoryLedger

    with start_sim(scenario=scenario) as sim, pytest.MonkeyPatch.context() as mp:
        mp.setenv("IDENTITY_ENDPOINT", sim.endpoints["identity_endpoint"])
        mp.setenv("IDENTITY_HEADER", sim.endpoints["identity_header"])
        mp.delenv("MSI_ENDPOINT", raising=False)
        identity.reset()
        ep = sim.endpoints
        env = {"FLEET_SUBSCRIPTIONS": ",".join(ep["subscriptions"]), "ARM_ENDPOINT": ep["arm_endpoint"],
               "ARM_AUDIENCE": ep["arm_audience"], "STEWARD_CA_BUNDLE": ep["ca_bundle"],
               "AzureWebJobsStorage": "UseDevelopmentStorage=true",
               "EVENTGRID_TOPIC_ENDPOINT": ep["eventgrid_topic_endpoint"], "IDENTITY_ENDPOINT": ep["identity_endpoint"],
               **settings}
        cfg = load(env)
        clock = SimTime(sim)
        ctx = Context(settings=cfg, clock=clock, ledger=InMemoryLedger(), access=FleetAccess(cfg, clock=clock),
                      events=Recorded(), telemetry=None, instance="sim-driver")  # type: ignore[arg-type]
        try:
            yield sim, ctx
        finally:
            identity.reset()


def sweep_and_admit(ctx: Any) -> list[str]:
    """One sweep; every Unhealthy fault it reports is delivered to the Event Grid handler."""
    from shared.remediation import admission, sweep
    from shared.remediation import records as remediation

    before = len(ctx.events.published)
    sweep.sweep(ctx)
    out = []
    for e in ctx.events.published[before:]:
        if e["type"] == remediation.UNHEALTHY_EVENT:
            event = {"specversion": "1.0", "id": e["id"], "source": ctx.settings.event_source, "type": e["type"],
                     "subject": e["subject"], "data": e["data"]}
            out.append(admission.handle_event(event, ctx).detail)
    return out


def run_remediations(ctx: Any, *, max_rounds: int = 300, watch: Any = None) -> list[Any]:
    """Advance the remediation records until none is active; ``watch(ctx)`` runs after every round."""
    from shared.kernel import reconciler
    from shared.remediation import steps as remediation

    for _ in range(max_rounds):
        reconciler.reconcile_once(ctx, modules={"remediation": remediation})
        if watch is not None:
            watch(ctx)
        active = ctx.ledger.list(remediation.KIND, states=sorted(remediation.ACTIVE_STATES))
        if not active:
            break
        due = min(r.next_at for r in active)
        ctx.clock.sleep(max(1.0, due - ctx.clock.now()))
    return list(ctx.ledger.list(remediation.KIND))

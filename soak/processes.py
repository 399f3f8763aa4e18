"""A soak run through real Functions host processes, killed with SIGKILL at random moments.

The in-process driver (:mod:`soak.inprocess`) crashes a host only at a ledger write and plays the
Functions runtime itself. This mode keeps both honest: the app runs in ``python -m devhost run``
processes (the local host: real timers, queue and Event Grid triggers, settlement of deliveries),
on the simulator's scaled clock, and a host is killed at arbitrary instants (mid-request, mid-step,
holding a delivery lock or a claim) and replaced by a new one, sometimes with two hosts running.
It costs real time (a host takes seconds to start, the clock runs only ten times faster than the
wall), which is why only a fraction of the soak's runs use it.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak.audit import Sampler, active_records, ledger_records
from soak.generate import SoakScenario
from soak.invariants import Evidence
from soak.sweep_watch import QuietGate, SweepWatch

POLL_S = 0.3


@dataclass
class ProcessLog:
    kills: list[str] = field(default_factory=list)
    ended_at: float = 0.0
    end_reason: str = ""


def in_flight_deliveries(client: Any) -> int:
    """Event Grid deliveries still queued (a delay fault holds one up to 300 s) or locked for the hosts'
    subscriptions (devhost/eventgrid_subscriptions.json): a run is not quiet while one is on its way."""
    from devhost.eventgrid import load_subscriptions

    return sum(client.backlog(subscriber=sub.name, types=sub.included_event_types)[0]
               for sub in load_subscriptions().values())


class ProcessRun:
    def __init__(self, scenario: SoakScenario, *, azurite: Any, state_dir: Path, wall_budget_s: float) -> None:
        if azurite is None:
            raise RuntimeError("process mode needs Azurite (the hosts' queues and ledger table)")
        self.scenario = scenario
        self.azurite = azurite
        self.state_dir = state_dir
        self.wall_budget_s = wall_budget_s
        self.rng = random.Random(scenario.seed * 104729 + 3)
        self.sampler = Sampler()
        self.log = ProcessLog()

    def run(self) -> tuple[Evidence, dict[str, Any], ProcessLog]:
        import devstack
        from sim.testing import start_sim
        from soak.control import SimClient
        from soak.inprocess import app_settings

        scenario = self.scenario
        table = f"soakp{scenario.seed}t{int(time.time())}"
        with start_sim(scenario=scenario.sim, seed=scenario.seed, state_dir=self.state_dir / "sim") as sim:
            client = SimClient(sim.endpoints)
            settings = app_settings(sim.endpoints, storage=self.azurite.connection_string, table=table,
                                    profile={**devstack.FAST_PROFILE, "RECONCILE_SCHEDULE": "*/1 * * * * *",
                                             **scenario.profile}, dcgm_clusters=scenario.dcgm_clusters)
            settings["FUNCTIONS_WORKER_RUNTIME"] = "python"
            path = self.state_dir / "local.settings.json"
            path.write_text(json.dumps({"IsEncrypted": False, "Values": settings}, indent=2))
            host_json = devstack._write_host_json(self.state_dir / "host.json", devstack.FAST_HOST_JSON)
            stack = devstack.Stack(state_dir=self.state_dir, azurite=self.azurite, sim=sim, settings=settings,
                                   settings_path=path, host_json_path=host_json)
            ledger = stack.ledger()
            try:
                start = float(client.control("GET", "/clock")["now"])
                from soak.actions import ActionRunner

                actions = ActionRunner(scenario.actions, sim=client, start=start)
                actions.ledger = ledger  # soak.forged_rows writes into the hosts' Azurite table
                seq = 0
                for _ in range(scenario.hosts):
                    seq += 1
                    stack.start_host(f"soak-{seq}")
                kills = list(scenario.kills)
                gate = QuietGate(SweepWatch(self.state_dir))
                wall_end = time.monotonic() + self.wall_budget_s
                self.sampler.sample(client.state())
                while True:
                    time.sleep(POLL_S)
                    now = float(client.control("GET", "/clock")["now"])
                    elapsed = now - start
                    self.sampler.sample(client.state())
                    actions.run_due(now)
                    if kills and elapsed >= kills[0]:
                        kills.pop(0)
                        if stack.hosts:
                            victim = self.rng.choice(stack.hosts)
                            stack.stop_host(victim, crash=True)
                            self.log.kills.append(f"host pid {victim.pid} killed at t+{elapsed:.0f}s")
                            seq += 1
                            stack.start_host(f"soak-{seq}")
                    active = active_records(ledger) + in_flight_deliveries(client)
                    # Quiet only once a sweep begun after idle was seen has finished clean and the ledger and
                    # Event Grid are still idle (soak/sweep_watch.py: seed 962959's hosts had not swept).
                    if gate.quiet(elapsed >= scenario.quiet_after_s and active == 0 and not actions.pending,
                                  lambda: active_records(ledger) + in_flight_deliveries(client) == 0):
                        self.log.end_reason = "quiet: no active record"
                        break
                    if elapsed >= scenario.horizon_s:
                        self.log.end_reason = f"horizon reached with {active} active"
                        break
                    if time.monotonic() > wall_end:
                        self.log.end_reason = f"wall-clock budget ({self.wall_budget_s:.0f} s) spent with {active} active"
                        break
                self.log.ended_at = float(client.control("GET", "/clock")["now"]) - start
            finally:
                stack.stop_hosts()
            from soak.audit import kube_nodes

            client.control("DELETE", "/faults")  # the auditor's own reads must not meet the scenario's faults
            oracles = client.oracles()
            evidence = Evidence(scenario=scenario, oracles=oracles, state=client.state(),
                                nodes={str(c["name"]): kube_nodes(client, c) for c in sim.endpoints["clusters"]},
                                records=ledger_records(ledger), max_unavailable=dict(self.sampler.max_unavailable),
                                worst_at=dict(self.sampler.worst_at), initial_nodes=dict(self.sampler.initial_nodes),
                                app_errors=[], published=client.published(), now=float(client.control("GET", "/clock")["now"]),
                                actions=list(actions.log), start=start, node_pools=dict(self.sampler.node_pools),
                                uncordons=list(self.sampler.uncordons), turned_true=list(self.sampler.turned_true))
            client.close()
        return evidence, oracles, self.log

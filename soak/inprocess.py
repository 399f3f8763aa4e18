"""Run the whole app in this process against one simulated fleet, with one or two hosts at once.

Why in process: a Functions host process costs seconds to start and runs on wall-clock time, so a
soak of a thousand scenarios through real hosts would take many hours. Here every *host* is an app
:class:`~shared.kernel.context.Context` of its own (its own instance name, credential, ARM, Kubernetes and
Event Grid clients, all the real adapters over real HTTPS), sharing only the ledger table in
Azurite, exactly what two scaled-out instances share. The simulator runs on a manual clock and the
driver plays the Functions runtime: it fires the timers (sweep, migration planner, reconciler),
pulls Event Grid deliveries from the simulator's feed (where duplicate, delayed and reordered
deliveries are injected) and settles them as the host would, and jumps the clock over idle time.
Two hosts run their invocations in two threads at the same moment, so claims, ETags and admissions
really race. A crash (``soak.crash``) kills a host between two steps; a new host with a new
instance name takes over after a random delay, as a new instance would.

What this does not cover, and :mod:`soak.processes` does: the host runtime itself (devhost's
triggers, queues, settlement of deliveries by a process that dies) and a kill at an arbitrary
instruction rather than at a ledger write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak.actions import ActionRunner
from soak.audit import Sampler
from soak.control import SimClient
from soak.crash import CrashingLedger, HostCrashed
from soak.generate import Crash, SoakScenario
from soak.simclock import LinkedClock

log = logging.getLogger("soak.inprocess")

SUBSCRIBER = "remediation_events"  # the Event Grid subscription of the remediation trigger (devhost's file)
UNHEALTHY = "Steward.GpuNode.Unhealthy"
HEALTH_SUBSCRIBER = "health_events"  # the HealthResources system topic's subscription (devhost's file)
HEALTH_TYPES = ("Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged",
                "Microsoft.ResourceNotifications.HealthResources.ResourceAnnotated")
SWEEP_EVERY_S = 10.0
PLANNER_EVERY_S = 12.0
MAX_STEP_S = 5.0
MIN_STEP_S = 0.5
DELIVERY_LOCK_S = 30.0


@dataclass
class Host:
    name: str
    ctx: Any
    ledger: CrashingLedger
    next_sweep: float
    next_planner: float
    #: Sweeps the app asked for when a pending finding crosses its threshold (shared.remediation.due_sweep: a
    #: delayed message on the nudge queue, which this host's queue trigger takes when it shows).
    due_sweeps: list[float] = field(default_factory=list)


@dataclass
class RunLog:
    """What the driver saw: crashes, restarts, unexpected exceptions, deliveries, steps."""

    crashes: list[str] = field(default_factory=list)
    app_errors: list[str] = field(default_factory=list)
    deliveries: int = 0
    delivery_retries: int = 0
    steps: int = 0
    sweeps: int = 0
    reconciles: int = 0
    ended_at: float = 0.0
    end_reason: str = ""
    unfinished: int = 0  # records still active when the wall-clock budget ran out
    actions: list[dict[str, Any]] = field(default_factory=list)  # timed actions performed (soak.actions)
    wall_by_phase: dict[str, float] = field(default_factory=dict)

    def timed(self, phase: str, started: float) -> None:
        self.wall_by_phase[phase] = self.wall_by_phase.get(phase, 0.0) + time.monotonic() - started


def app_settings(endpoints: dict[str, Any], *, storage: str, table: str, profile: dict[str, str],
                 dcgm_clusters: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The app settings a deployment would have, pointing at this simulator and Azurite (and, for the
    clusters in ``dcgm_clusters``, at the simulator's Azure Monitor workspace: SIGNALS_PROMETHEUS)."""
    from soak.signals import prometheus_setting

    subscriptions = sorted({str(c["id"]).split("/")[2] for c in endpoints.get("clusters") or []})
    values = {
        "AzureWebJobsStorage": storage,
        "FLEET_SUBSCRIPTIONS": ",".join(subscriptions),
        "FLEET_CLUSTER_TAG": "gpu-fleet-steward=enabled",
        "ARM_ENDPOINT": str(endpoints["arm_endpoint"]),
        "ARM_AUDIENCE": str(endpoints.get("arm_audience") or "https://management.azure.com/"),
        "STEWARD_CA_BUNDLE": str(endpoints["ca_bundle"]),
        "EVENTGRID_TOPIC_ENDPOINT": str(endpoints["eventgrid_topic_endpoint"]),
        "AZURE_CLIENT_ID": "00000000-0000-0000-0000-00000000c11d",
        "LEDGER_TABLE": table,
        "POOL_REQUEST_QUEUE": "gpu-pool-requests",
        "NUDGE_QUEUE": "steward-nudge",
    }
    values.update(profile)
    values.update(prometheus_setting(endpoints, dcgm_clusters))
    return values


def pending_kind() -> str:
    from shared.remediation import pending_faults

    return pending_faults.KIND


class InProcessRun:
    """One scenario, driven step by step; :meth:`run` returns the :class:`RunLog`."""

    def __init__(self, scenario: SoakScenario, *, sim: Any, storage: str, table: str, use_table: bool = False,
                 wall_budget_s: float = 300.0) -> None:
        from tests.fakes.ledger import InMemoryLedger

        self.scenario = scenario
        self.sim = SimClient(sim.endpoints)
        self.use_table = use_table
        self.shared_ledger: Any = None if use_table else InMemoryLedger()
        self.rng = random.Random(scenario.seed * 7919 + 1)
        self.clock = LinkedClock(sim)
        self.start = self.clock.now()
        self.settings_env = app_settings(sim.endpoints, storage=storage, table=table, profile=scenario.profile,
                                         dcgm_clusters=scenario.dcgm_clusters)
        self.log = RunLog()
        self.sampler = Sampler()
        self.wall_budget_s = wall_budget_s
        self._host_seq = 0
        self._crashes: dict[int, list[Crash]] = {}
        for crash in scenario.crashes:
            self._crashes.setdefault(crash.host, []).append(crash)
        self.hosts: list[Host | None] = []
        self.restarts: list[tuple[float, int]] = []  # (when, slot)
        self.raw_ledger: Any = None
        self.migrating = scenario.profile.get("MIGRATION_ENABLED") == "true"
        self.actions = ActionRunner(scenario.actions, sim=self.sim, start=self.start)
        self.last_sweep: Any = None  # the latest sweep's report (shared.remediation.sweep.SweepReport)

    # ------------------------------------------------------------------ hosts

    def _settings(self) -> Any:
        from shared import settings as settings_mod

        return settings_mod.load(self.settings_env)

    def _ledger(self, settings: Any) -> Any:
        """The hosts' shared ledger: the Azurite table, or its in-memory twin (same ETag contract)."""
        from shared.adapters.ledger import TableLedger

        return TableLedger.from_settings(settings, clock=self.clock) if self.use_table else self.shared_ledger

    def _new_host(self, slot: int) -> Host:
        from shared import wiring

        self._host_seq += 1
        name = f"soak-host-{slot + 1}-{self._host_seq}"
        settings = self._settings()
        pending = self._crashes.get(slot) or []
        crash = pending.pop(0) if pending else None
        ledger = CrashingLedger(self._ledger(settings),
                                crash_at=crash.write if crash else None, when=crash.when if crash else "before")
        ctx = wiring.build_context(settings, instance=name, clock=self.clock, ledger=ledger)
        now = self.clock.now()
        return Host(name=name, ctx=ctx, ledger=ledger, next_sweep=now, next_planner=now)

    def _close(self, host: Host) -> None:
        access = host.ctx.access
        for attr in ("_kube",):
            for client in list(getattr(access, attr, {}).values()):
                close = getattr(client, "close", None)
                if callable(close):
                    with contextlib.suppress(Exception):  # closing a dead host's clients is best effort
                        close()

    # ------------------------------------------------------------------ one host's turn

    def _deliveries(self, host: Host, feed: Any) -> None:
        """The two Event Grid triggers: the steward's own Unhealthy events, and Azure Resource Health's."""
        from shared import entrypoints

        self._deliver(host, feed, subscriber=SUBSCRIBER, types=(UNHEALTHY,), where="remediation trigger",
                      handler=entrypoints.handle_gpu_event)
        self._deliver(host, feed, subscriber=HEALTH_SUBSCRIBER, types=HEALTH_TYPES, where="health events trigger",
                      handler=entrypoints.handle_health_event)

    def _deliver(self, host: Host, feed: Any, *, subscriber: str, types: tuple[str, ...], where: str,
                 handler: Callable[..., Any]) -> None:
        deliveries = feed.fetch(subscriber=subscriber, max_n=8, lock_s=DELIVERY_LOCK_S, types=types)
        for delivery in deliveries:
            event = delivery.get("event") or {}
            token = str(delivery.get("lock_token", ""))
            if event.get("type") not in types:
                feed.settle(subscriber=subscriber, lock_token=token, outcome="ok")
                continue
            self.log.deliveries += 1
            try:
                handler(dict(event), ctx=host.ctx)
            except HostCrashed:
                raise  # never settled: the lock runs out and Event Grid redelivers
            except Exception as error:
                self._note_error(where, error)
                self.log.delivery_retries += 1
                feed.settle(subscriber=subscriber, lock_token=token, outcome="retry", reason=str(error)[:300])
                continue
            feed.settle(subscriber=subscriber, lock_token=token, outcome="ok")

    def _note_error(self, where: str, error: BaseException) -> None:
        from shared.kernel.errors import StewardError

        if isinstance(error, StewardError):
            return  # an answer the trigger is allowed to give (the runtime retries it)
        import traceback

        frames = traceback.extract_tb(error.__traceback__)
        ours = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames if "/shared/" in f.filename]
        self.log.app_errors.append(f"{where}: {type(error).__name__}: {str(error)[:300]} "
                                   f"(at {' > '.join(ours[-4:]) or 'outside shared/'})")

    def _turn(self, slot: int, host: Host, feed: Any) -> None:
        """Everything one host's runtime would do at this moment (timers due, deliveries, reconciler)."""
        from shared import entrypoints

        now = self.clock.now()
        try:
            asked = [t for t in host.due_sweeps if t <= now]
            if now >= host.next_sweep or asked:
                if now >= host.next_sweep:
                    host.next_sweep = now + SWEEP_EVERY_S
                host.due_sweeps = [t for t in host.due_sweeps if t > now]
                self.log.sweeps += 1
                self._guard("health sweep", lambda: self._swept(entrypoints.run_health_sweep(ctx=host.ctx), host))
            started = time.monotonic()
            try:
                self._deliveries(host, feed)
            finally:
                self.log.timed("deliveries", started)
            if self.migrating and now >= host.next_planner:
                host.next_planner = now + PLANNER_EVERY_S
                self._guard("migration planner", lambda: entrypoints.run_migration_planner(ctx=host.ctx))
            self.log.reconciles += 1
            self._guard("reconciler", lambda: entrypoints.run_reconcile(reason="timer", ctx=host.ctx))
        except HostCrashed as crash:
            self.log.crashes.append(f"{host.name} at t+{now - self.start:.0f}s: {crash}")
            self.hosts[slot] = None
            self._close(host)
            self.restarts.append((self.clock.now() + self.rng.uniform(0, 90), slot))

    def _swept(self, report: Any, host: Host) -> None:
        self.last_sweep = report
        if getattr(report, "due_sweep", None):
            host.due_sweeps.append(float(report.due_sweep))

    def _waiting_faults(self) -> int:
        """Faults the latest sweep found that a refusal that passes holds back (a budget, a cooldown): the app's
        next sweeps report them again and admit them once the limit allows, so the run is not quiet yet
        (issue 24: a run that stopped here looked like a lost fault)."""
        from shared.remediation import pending_faults
        from shared.remediation.records import NODE_KIND, NodeData, decode, node_key

        faults = list(getattr(self.last_sweep, "faults", None) or ())
        # DCGM candidates waiting for their window re-check (shared.remediation.dcgm_recheck: every sample of the
        # window must show the fault) are faults the next sweeps may admit: not quiet yet either (seed 950133).
        dcgm = getattr(self.last_sweep, "dcgm", None)
        candidates = int(dcgm.get("pending", 0) or 0) if isinstance(dcgm, dict) else 0
        if not faults:
            return candidates
        passing: dict[str, bool] = {}
        for marker in self.raw_ledger.list("dedupe"):
            if marker.id.startswith("refused-") and pending_faults.passes(str(marker.data.get("reason_code") or "")):
                passing[marker.id.removeprefix("refused-")[:64]] = True  # refused-<sha256 fault id>-<code>
        waiting = 0
        for fault in faults:
            if not passing.get(fault.id):
                continue
            node = self.raw_ledger.get(NODE_KIND, node_key(fault.cluster, fault.node))
            if node is None or fault.id not in decode(node.data, NodeData).faults:
                waiting += 1
        return waiting + candidates

    def _guard(self, where: str, fn: Callable[[], Any]) -> None:
        started = time.monotonic()
        try:
            fn()
        except HostCrashed:
            raise
        except Exception as error:
            self._note_error(where, error)
        finally:
            self.log.timed(where, started)

    # ------------------------------------------------------------------ the loop

    def _next_due(self) -> tuple[float | None, int, float]:
        """Earliest ``next_at`` of an active record (or None), how many are active, and their latest deadline."""
        from shared.migration import steps as migration
        from shared.pools import steps as pool_steps
        from shared.remediation import records as remediation
        from soak.invariants import migration_deadline, remediation_deadline

        earliest: float | None = None
        active = 0
        latest_deadline = 0.0
        deadlines = {remediation.KIND: remediation_deadline, migration.KIND: migration_deadline}
        for module in (remediation, migration, pool_steps):
            for record in self.raw_ledger.list(module.KIND, states=sorted(module.ACTIVE_STATES)):
                active += 1
                due = max(record.next_at, record.lease_until if record.owner else 0.0)
                earliest = due if earliest is None else min(earliest, due)
                deadline = deadlines.get(module.KIND)
                if deadline is not None:
                    latest_deadline = max(latest_deadline, deadline(record, self.scenario.profile))
        # A kept refused fault (shared.remediation.pending_faults) is work still to do: judged by every sweep, so
        # the run is not quiet while one waits (issue 24).
        active += len(self.raw_ledger.list(pending_kind())) + self._waiting_faults()
        # An Event Grid delivery still on its way (a delay fault holds one up to 300 s) is work to do too: a run
        # that ended before it arrived lost a Resource Health fault it never saw (short seed 12).
        for subscriber, types in ((SUBSCRIBER, (UNHEALTHY,)), (HEALTH_SUBSCRIBER, HEALTH_TYPES)):
            pending, next_at = self.sim.backlog(subscriber=subscriber, types=types)
            active += pending
            if next_at is not None:
                earliest = next_at if earliest is None else min(earliest, next_at)
        return earliest, active, latest_deadline

    def run(self) -> RunLog:
        from shared.adapters import identity
        from shared.kernel import clock as clocks

        os.environ["IDENTITY_ENDPOINT"] = str(self.sim.endpoints["identity_endpoint"])
        os.environ["IDENTITY_HEADER"] = str(self.sim.endpoints["identity_header"])
        identity.reset()  # a credential cached by an earlier run would hold the previous simulator's tokens
        previous = clocks.use(self.clock)
        settings = self._settings()
        self.raw_ledger = self._ledger(settings)
        self.actions.ledger = self.raw_ledger  # soak.forged_rows writes here, as a table writer would
        feed = self.sim
        self.hosts = [self._new_host(i) for i in range(self.scenario.hosts)]
        wall_end = time.monotonic() + self.wall_budget_s
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="soak-host") if self.scenario.hosts > 1 else None
        try:
            self.sampler.sample(self.sim.state())
            while True:
                now = self.clock.now()
                elapsed = now - self.start
                for when, slot in [r for r in self.restarts if r[0] <= now]:
                    self.restarts.remove((when, slot))
                    self.hosts[slot] = self._new_host(slot)
                started = time.monotonic()
                self.actions.run_due(now)  # what someone else does to the fleet at this moment
                self.log.timed("actions", started)
                live = [(i, h) for i, h in enumerate(self.hosts) if h is not None]
                if pool is not None and len(live) > 1:
                    barrier = threading.Barrier(len(live))

                    def together(slot: int, host: Host, barrier: threading.Barrier = barrier) -> None:
                        barrier.wait(timeout=30)
                        self._turn(slot, host, feed)

                    for future in [pool.submit(together, i, h) for i, h in live]:
                        future.result()
                else:
                    for i, h in live:
                        self._turn(i, h, feed)
                self.log.steps += 1
                started = time.monotonic()
                self.sampler.sample(self.sim.state())
                self.log.timed("sampling", started)
                started = time.monotonic()
                earliest, active, latest_deadline = self._next_due()
                self.log.timed("ledger scan", started)
                now = self.clock.now()
                if elapsed >= self.scenario.quiet_after_s and active == 0 and not self.restarts and \
                        not self.actions.pending and (
                        not self.migrating or elapsed >= self.scenario.quiet_after_s + 2 * PLANNER_EVERY_S):
                    self.log.end_reason = "quiet: no active record"
                    break
                # Past the horizon, a run goes on while an active record is within its deadline: it
                # ends either finished or with a record that is stuck by definition.
                if elapsed >= self.scenario.horizon_s and (now > latest_deadline or elapsed >= 4 * self.scenario.horizon_s):
                    self.log.end_reason = f"horizon ({elapsed:.0f} s) reached with {active} active"
                    break
                if time.monotonic() > wall_end:
                    self.log.end_reason = f"wall-clock budget ({self.wall_budget_s:.0f} s) spent with {active} active"
                    self.log.unfinished = active
                    break
                wake = [now + MAX_STEP_S]
                for h in self.hosts:
                    if h is not None:
                        wake += [h.next_sweep, *h.due_sweeps] + ([h.next_planner] if self.migrating else [])
                wake += [when for when, _ in self.restarts]
                due = self.actions.next_due()
                if due is not None:
                    wake.append(due)
                if earliest is not None:
                    wake.append(earliest)
                started = time.monotonic()
                self.clock.advance(max(MIN_STEP_S, min(wake) - now))
                self.log.timed("advance", started)
        finally:
            self.log.ended_at = self.clock.now() - self.start
            self.log.actions = list(self.actions.log)
            if pool is not None:
                pool.shutdown(wait=True)
            for h in self.hosts:
                if h is not None:
                    self._close(h)
            clocks.use(previous)
            self.sim.close()
        return self.log

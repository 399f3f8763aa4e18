"""One soak run from its seed to its verdict, and many runs in a row.

:func:`run_seed` generates the scenario, starts a simulator for it, drives the app (in process, or
through real host processes for a fraction of the runs), gathers the evidence as an auditor and
checks every invariant. Azurite is started once per soak and shared: each run that uses it gets
its own ledger table. Which runs use host processes or the Azurite table is itself decided by the
seed, so ``--replay SEED`` repeats the run exactly as the soak ran it.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak.generate import SoakScenario, generate
from soak.invariants import Evidence, Violation, check_all

DEV_STORAGE = "UseDevelopmentStorage=true"


@dataclass(frozen=True)
class Mix:
    """Which fraction of the runs use host processes, and which use the Azurite table as the ledger."""

    process_every: int = 20  # every N-th seed runs real host processes (0 = never)
    table_every: int = 5  # every N-th in-process seed uses the Azurite table instead of its in-memory twin
    strict: bool = True  # add the stricter faults of soak.strict (False: the scenarios as before issue 10)
    signals: bool | None = None  # add issue 13's fault signals (soak.signals); None: as ``strict``
    forgeries: bool | None = None  # add issue 18's forged DCGM series (soak.forgeries); None: as ``signals``
    forged_rows: bool | None = None  # add issue 19's forged ledger rows (soak.forged_rows); None: as ``strict``

    def process_mode(self, seed: int) -> bool:
        return self.process_every > 0 and seed % self.process_every == self.process_every - 1

    def use_table(self, seed: int) -> bool:
        return self.table_every > 0 and seed % self.table_every == 1


@dataclass
class RunResult:
    seed: int
    description: str
    mode: str
    violations: list[Violation] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    error: str = ""
    wall_s: float = 0.0
    sim_s: float = 0.0
    end_reason: str = ""
    outcomes: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)  # how each record ended, for --replay
    by_cause: Counter[str] = field(default_factory=Counter)  # soak.liveness.outcome_table

    @property
    def failed(self) -> bool:
        return bool(self.violations or self.error)


def fault_kind(fired: dict[str, Any]) -> str:
    """A readable kind for one fired fault, e.g. ``arm 429``, ``lro AllocationFailed``, ``kube drop``."""
    target = str(fired.get("target", "?"))
    if target == "eventgrid-delivery":
        what = "duplicate" if fired.get("duplicate") else "reorder" if fired.get("reorder") else "delay"
        return f"eventgrid-delivery {what}"
    if target == "lro":
        return f"lro {fired.get('code') or 'failed'}"
    if fired.get("drop"):
        return f"{target} drop (timeout)"
    if fired.get("status"):
        code = fired.get("code")
        named = code and int(fired["status"]) < 429  # a 400's code says what it was (QuotaExceeded ...)
        return f"{target} {fired['status']}{' ' + str(code) if named else ''}"
    if fired.get("delay_s"):
        return f"{target} slow"
    return target


@contextlib.contextmanager
def shared_azurite(needed: bool) -> Iterator[Any]:
    if not needed:
        yield None
        return
    from devhost import azurite

    log_dir = Path(tempfile.mkdtemp(prefix="soak-azurite-"))
    instance = azurite.start(log=log_dir / "azurite.log")
    try:
        yield instance
    finally:
        azurite.stop(instance)


def gather_evidence(scenario: SoakScenario, *, sim: Any, records: dict[str, list[Any]], sampler: Any,
              app_errors: list[str], now: float, actions: list[dict[str, Any]] | None = None,
              start: float | None = None) -> tuple[Evidence, dict[str, Any]]:
    from soak.audit import kube_nodes

    sim.control("DELETE", "/faults")  # the auditor's own reads must not meet the scenario's faults
    oracles = sim.oracles()
    state = sim.state()
    nodes = {str(c["name"]): kube_nodes(sim, c) for c in sim.endpoints["clusters"]}
    evidence = Evidence(scenario=scenario, oracles=oracles, state=state, nodes=nodes, records=records,
                        max_unavailable=dict(sampler.max_unavailable), worst_at=dict(sampler.worst_at),
                        initial_nodes=dict(sampler.initial_nodes), app_errors=list(app_errors),
                        published=sim.published(), now=now, actions=list(actions or []),
                        start=sampler.first_t if start is None else start, node_pools=dict(sampler.node_pools),
                        uncordons=list(sampler.uncordons), turned_true=list(sampler.turned_true))
    return evidence, oracles


def _rung_note(rec: Any) -> str:
    ladder = list(rec.data.get("ladder") or [])
    i = int(rec.data.get("rung_index") or 0)
    rung = ladder[i] if 0 <= i < len(ladder) else "-"
    escalation = rec.data.get("escalation") if isinstance(rec.data.get("escalation"), dict) else None
    return rung + (f" after {escalation.get('from')} {escalation.get('code')}" if escalation else "")


def _paths(rec: Any) -> list[str]:
    """Which of the stricter paths a remediation went through (for the summary: were they exercised?)."""
    out = []
    drain = rec.data.get("drain") if isinstance(rec.data.get("drain"), dict) else {}
    if drain.get("outcome") and drain.get("outcome") != "drained":
        out.append(f"drain {drain['outcome']}")
    messages = " ".join(str(m) for m in (drain.get("messages") or {}).values())
    if "namespace is being deleted" in messages:
        out.append("drain met a terminating namespace")
    if "stuck terminating" in messages:
        out.append("drain stopped waiting for a pod stuck terminating")
    if "PodDisruptionBudget" in messages or drain.get("blocked"):
        out.append("drain refused by a PodDisruptionBudget (429)")
    escalation = rec.data.get("escalation") if isinstance(rec.data.get("escalation"), dict) else None
    if escalation:
        out.append(f"escalated to replace ({escalation.get('code')})")
    replace = rec.data.get("replace") if isinstance(rec.data.get("replace"), dict) else {}
    if replace.get("mode") == "nodeclaim":
        out.append("replaced through the NodeClaim")
    return out


def _why(rec: Any) -> str:
    from soak.invariants import reason

    return reason(rec)[:300]


def run_scenario(scenario: SoakScenario, *, azurite: Any = None, use_table: bool = False,
                 wall_budget_s: float = 300.0, keep_dir: Path | None = None) -> RunResult:
    """Run one generated scenario and check every invariant."""
    from sim.testing import start_sim
    from soak.audit import ledger_records

    mode = "processes" if scenario.process_mode else ("in-process+table" if use_table else "in-process")
    result = RunResult(seed=scenario.seed, description=scenario.describe(), mode=mode)
    started = time.monotonic()
    state_dir = Path(tempfile.mkdtemp(prefix=f"soak-{scenario.seed}-", dir=keep_dir))
    try:
        if scenario.process_mode:
            from soak.processes import ProcessRun

            run = ProcessRun(scenario, azurite=azurite, state_dir=state_dir, wall_budget_s=wall_budget_s)
            evidence, oracles, log = run.run()
            result.end_reason = log.end_reason
            result.sim_s = log.ended_at
            result.faults["host process killed"] += len(log.kills)
        else:
            from soak.control import SimClient
            from soak.inprocess import InProcessRun

            storage = azurite.connection_string if azurite is not None else DEV_STORAGE
            with start_sim(scenario=scenario.sim, seed=scenario.seed, state_dir=state_dir / "sim") as sim:
                run_ = InProcessRun(scenario, sim=sim, storage=storage, table=f"soak{scenario.seed}t{int(time.time())}",
                                    use_table=use_table and azurite is not None, wall_budget_s=wall_budget_s)
                log_ = run_.run()
                client = SimClient(sim.endpoints)
                try:
                    evidence, oracles = gather_evidence(scenario, sim=client, records=ledger_records(run_.raw_ledger),
                                                  sampler=run_.sampler, app_errors=log_.app_errors,
                                                  now=run_.clock.now(), actions=log_.actions, start=run_.start)
                finally:
                    client.close()
            result.end_reason = log_.end_reason
            result.sim_s = log_.ended_at
            result.faults["app crash between steps"] += len(log_.crashes)
            for crash in log_.crashes:  # e.g. "... at t+144s: before save remediation/draining"
                when, _, what = crash.rsplit(": ", 1)[-1].partition(" ")
                result.faults[f"  crash {when} {what.split('/')[0]}"] += 1
            if log_.unfinished:
                result.error = (f"the run's wall-clock budget ran out with {log_.unfinished} record(s) active, "
                                "before their deadlines: rerun with a larger --wall-budget")
            if scenario.hosts > 1:
                result.faults["two hosts at once"] += 1
        for kind in scenario.strict_faults:
            result.faults[f"strict: {kind}"] += 1
        for kind in scenario.signal_faults:
            result.faults[f"signals: {kind}"] += 1
        from soak.forgery_invariants import forgery_tally, truth_note

        injected, seen = forgery_tally(evidence)
        result.faults.update(injected)
        result.outcomes.update(seen)
        if truth_note(evidence):
            result.notes.append(truth_note(evidence))
        from soak.forged_row_invariants import forged_row_tally, rows_note

        injected, seen = forged_row_tally(evidence)
        result.faults.update(injected)
        result.outcomes.update(seen)
        if rows_note(evidence):
            result.notes.append(rows_note(evidence))
        for action in evidence.actions:
            result.faults[f"  action {action['kind']}{'' if action.get('ok') else ' (not done)'}"] += 1
        for fired in oracles.get("faults_fired") or []:
            result.faults[fault_kind(fired)] += 1
        for action in evidence.actions:
            result.notes.append(f"action at t+{float(action['t']) - evidence.start:.0f}s {action['kind']} "
                                f"{action.get('cluster', '')}: {action.get('result', '')}")
        from soak.forged_row_invariants import without_forged_rows

        own = without_forged_rows(evidence)  # the forged rows are tallied above, as "forged rows: ..."
        for kind in ("remediation", "migration"):
            for rec in own.records.get(kind, []):
                result.outcomes[f"{kind} {rec.state}"] += 1
                where = (f" ({rec.data.get('node')}, rung {_rung_note(rec)})" if kind == "remediation"
                         else f" ({rec.data.get('pool')})")
                if kind == "remediation" and rec.data.get("signal") not in (None, "npd"):
                    where += f" [{rec.data.get('signal')} {rec.data.get('policy_row', '')}]"
                    result.outcomes[f"  from a {rec.data.get('signal')} signal: {rec.state}"] += 1
                result.notes.append(f"{kind} {rec.id} {rec.state}{where}: {_why(rec)}")
                if rec.state in ("gave_up", "blocked", "rolled_back"):
                    # a hand-over is judged by its reason; its story makes a failure readable from the log alone
                    for h in (rec.history or [])[-12:]:
                        result.notes.append(f"    t+{float(h.get('at') or 0.0) - evidence.start:.0f}s {h.get('state')}: "
                                            f"{str(h.get('note') or '')[:200]}")
                    if rec.data.get("_last_error"):
                        result.notes.append(f"    last step error: {str(rec.data['_last_error'])[:300]}")
                if kind == "remediation":
                    result.outcomes.update(f"  {path}" for path in _paths(rec))
        for rec in own.records.get("dedupe", []):  # what fleetctl why explains (soak.invariants check_explained)
            if rec.id.startswith("refused-"):
                result.outcomes[f"refusal recorded: {rec.data.get('reason_code')}"] += 1
                result.notes.append(f"refused at t+{rec.created_at - evidence.start:.0f}s {rec.data.get('node')} "
                                    f"({rec.data.get('reason_code')}): {str(rec.data.get('reason') or '')[:200]}")
        for rec in own.records.get("decision", []):
            result.outcomes[f"skip of a faulty node recorded: {rec.data.get('code')}"] += 1
            result.notes.append(f"skipped at t+{rec.created_at - evidence.start:.0f}s {rec.data.get('node')} "
                                f"({rec.data.get('code')})")
        for rec in own.records.get("pending-fault", []):
            result.notes.append(f"kept at the end: {rec.data.get('node')} ({rec.data.get('code')}, "
                                f"{rec.data.get('tries')} tries)")
        result.violations = check_all(evidence)
        from soak.liveness import outcome_table, outcomes

        result.by_cause.update(outcome_table(own))
        for o in outcomes(own):
            result.notes.append(f"fault {o.fault.label} at t+{o.fault.at - evidence.start:.0f}s: {o.kind} "
                                f"({o.how}{'; ' + o.cause if o.cause else ''})")
    except Exception as error:
        result.error = f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=6)}"
    result.wall_s = time.monotonic() - started
    if not result.failed and keep_dir is None:
        import shutil

        shutil.rmtree(state_dir, ignore_errors=True)
    return result


def run_seed(seed: int, *, mix: Mix | None = None, short: bool = False, azurite: Any = None,
             wall_budget_s: float = 300.0) -> RunResult:
    """Generate the scenario of ``seed`` (and its mode from ``mix``) and run it."""
    mix = mix or Mix()
    process = mix.process_mode(seed)
    scenario = generate(seed, short=short, process_mode=process, strict=mix.strict, signals=mix.signals,
                        forgeries=mix.forgeries, forged_rows=mix.forged_rows)
    return run_scenario(scenario, azurite=azurite, use_table=mix.use_table(seed), wall_budget_s=wall_budget_s)


@dataclass(frozen=True)
class AzuriteRef:
    """What a worker process needs of the soak's Azurite (the instance itself is not picklable)."""

    connection_string: str


def _worker(seed: int, mix: Mix, short: bool, connection_string: str | None, wall_budget_s: float) -> RunResult:
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    azurite = AzuriteRef(connection_string) if connection_string else None
    return run_seed(seed, mix=mix, short=short, azurite=azurite, wall_budget_s=wall_budget_s)


def run_seeds(seeds: list[int], *, mix: Mix, short: bool, azurite: Any, jobs: int = 1,
              wall_budget_s: float = 300.0) -> Iterator[RunResult]:
    """Run ``seeds``, ``jobs`` at a time (worker processes; each run has its own simulator)."""
    if jobs <= 1:
        for seed in seeds:
            yield run_seed(seed, mix=mix, short=short, azurite=azurite, wall_budget_s=wall_budget_s)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    conn = str(azurite.connection_string) if azurite is not None else None
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_worker, seed, mix, short, conn, wall_budget_s) for seed in seeds]
        for future in futures:
            yield future.result()

"""Benchmark: time to repair, from the fault's onset to the node back in service, against its physical floor,
per rung of the ladder (issue 24, item 3).

Each rung has its own run (bench.remediation_run.get_rung): ``UnhealthyNvidiaDevicePlugin`` turns True on a
node running pods whose grace periods go up to 60 s, the app's ladder is that one rung and the condition is
cured by it (``fixed_by``), so the first rung is the curing one. The time runs from the condition's
``lastTransitionTime`` to the node back in service: for restart and reimage the remediation ending ``done``
(its last step uncordons the node); for replace the replacement node Ready and the remediation ``done``
(the replacement is named in the record's ``data.replace.replacement`` and ``data.target``). After the run
the node is checked in service from the simulator's state: there, Ready and schedulable (and, for replace,
the broken node gone); a run that fails any of it is "not measured", with why.

The floor is what physics alone takes, as issue 24 defines it: the detection threshold, the longest grace
period of the node's pods (the drain cannot end sooner, and no VM action may start before it ends: it would
kill pods without eviction), the VM action until the node is Ready, and the verification the app must wait
out before it trusts the repair (``max(REMEDIATION_SETTLE_S, 2 x REMEDIATION_POLL_S)``, docs/remediation.md).
The VM action is the simulator's own duration for it, read from the run's scenario timings:

- restart: ``restart_s``, NotReady that long and Ready again (sim/kube/nodes.py ``restart_node``; the
  Compute LRO lasts as long, sim/arm/pools.py ``_r_vm_action``).
- reimage: ``reimage_s``, likewise (``reimage_node``).
- replace, surge-first (shared/remediation/replace.py, ``REMEDIATION_SURGE`` true by default): the PUT of
  count + 1 is an LRO of ``pool_scale_s`` at whose end the new node joins NotReady (sim/arm/pools.py
  ``_update_pool`` -> sim/kube/machines.py ``scale_nodes``), Ready ``node_ready_s`` later
  (``_add_pool_node`` -> ``_schedule_ready``); then ``deleteMachines`` of the broken node, an LRO of
  ``delete_machines_s`` at whose end the node is gone (``_r_delete_machines`` -> ``remove_machines``). The
  app calls the replace done only after that deletion (phase ``delete_wait`` waits for the node to be gone
  and the pool ``Succeeded`` before ``verifying``), so the deletion is in the floor.

What is physics and what is the app's order, for replace: the deletion must follow the drain (the pods must
be evicted first) and, surge-first, the replacement being Ready (the broken VM is given back only once the
new one is held: the pool never has fewer machines than it had; that is the rung's definition, not an
overhead). The surge itself needs nothing from the broken node: physics lets it run while the node drains.
The app starts it only when the drain has ended (``draining`` -> ``repairing`` -> the replace rung's
``start``), so the floor counts the drain and the surge in parallel, ``max(longest grace, pool_scale_s +
node_ready_s)``, and the time the app spends surging after the drain shows as its overhead (the figure's note
gives the floor in the app's order too). The verification stays after the deletion, where the issue's floor
puts it (after the action): overlapping it with the deletion would lower the floor by at most
``min(verification, delete_machines_s)``. A replace that fell back to delete-then-scale (no quota or
capacity for the surge) pays the deletion, then the count's restore and the new node's Ready, all after the
drain: its floor is ``threshold + longest grace + delete_machines_s + pool_scale_s + node_ready_s +
verification``.

Everything else is the app's overhead, which the ratio shows: the wait for the next sweep (up to one
interval), delivery, admission, the poll cadence of each step (a step that moves the record on is followed at
once by the next, shared/kernel/reconciler.py ``advance_record``), the app's own I/O (at clock x10, a tenth of
a second of work is a second of the figure), and a verification window longer than the floor's (the app waits
``max(REMEDIATION_SETTLE_S, 2 x (5 s + 1 s))`` after the node's last transition, to outlast NPD's run of its
rules on boot, shared/remediation/steps.py ``verify_window_s``; a surge node's stability counts from when it
was found healthy, before the deletion). Each figure's note splits the measured time by the record's history.
Target: at most 1.3 x the floor.
"""

from __future__ import annotations

from collections.abc import Mapping

from bench import remediation_run
from bench.figures import Figure, measured, not_measured
from bench.remediation_run import RemediationRun
from bench.scale import Scale

RUNGS = remediation_run.RUNGS
TARGET = 1.3
UNIT = "s (simulated)"
SURGE, DELETE_FIRST = "surge", "delete-first"  # shared.remediation.records.ReplaceMode's values


def name(rung: str) -> str:
    return f"time to repair vs its physical floor, {rung} rung"


def verification_s(*, settle_s: float, poll_s: float) -> float:
    return max(settle_s, 2 * poll_s)


def floor_s(*, threshold_s: float, longest_grace_s: float, action_s: float, settle_s: float, poll_s: float,
            beside_drain_s: float = 0.0) -> float:
    """Detection threshold + the drain (the longest grace period, or what runs beside it when longer) + the VM
    action after the drain until the node is back + the verification's wait."""
    return (threshold_s + max(longest_grace_s, beside_drain_s) + action_s
            + verification_s(settle_s=settle_s, poll_s=poll_s))


def rung_floor(rung: str, *, timings: Mapping[str, float], threshold_s: float, longest_grace_s: float,
               settle_s: float, poll_s: float, mode: str = SURGE) -> tuple[float, str]:
    """``(floor, what it sums)`` of ``rung`` from the scenario's ``timings`` (see the module's docstring)."""
    common = {"threshold_s": threshold_s, "longest_grace_s": longest_grace_s, "settle_s": settle_s, "poll_s": poll_s}
    head = f"threshold {threshold_s:g} + "
    tail = f" + verification {verification_s(settle_s=settle_s, poll_s=poll_s):g}"
    if rung in ("restart", "reimage"):
        key = f"{rung}_s"
        action = float(timings[key])
        return (floor_s(action_s=action, **common),
                f"{head}longest grace {longest_grace_s:g} + {rung} until Ready ({key}) {action:g}{tail}")
    if rung != "replace":
        raise ValueError(f"unknown rung {rung!r}")
    scale_s, ready_s = float(timings["pool_scale_s"]), float(timings["node_ready_s"])
    delete = float(timings["delete_machines_s"])
    if mode == DELETE_FIRST:
        return (floor_s(action_s=delete + scale_s + ready_s, **common),
                f"{head}longest grace {longest_grace_s:g} + delete_machines_s {delete:g} + count restored: "
                f"pool_scale_s {scale_s:g} + node_ready_s {ready_s:g}{tail}")
    return (floor_s(action_s=delete, beside_drain_s=scale_s + ready_s, **common),
            f"{head}max(longest grace {longest_grace_s:g}, surge: pool_scale_s {scale_s:g} + node_ready_s {ready_s:g}) "
            f"+ delete_machines_s {delete:g}{tail}")


def run(scale: Scale) -> list[Figure]:
    return [figure_of(rung, remediation_run.get_rung(scale, rung)) for rung in RUNGS]


def figure_of(rung: str, r: RemediationRun) -> Figure:
    target = f"<= {TARGET} x floor"
    why = _unmeasured(rung, r)
    if why:
        return not_measured(name(rung), UNIT, why, target=target)
    assert r.flip_at is not None and r.done_at is not None
    profile = remediation_run.profile(rung)
    timings = r.timings or remediation_run.timings(rung)
    mode = str(r.replace.get("mode") or SURGE)
    settle_s, poll_s = float(profile["REMEDIATION_SETTLE_S"]), float(profile["REMEDIATION_POLL_S"])
    longest_grace_s = float(max(r.graces or remediation_run.GRACES))
    floor, terms = rung_floor(rung, timings=timings, threshold_s=r.threshold_s, longest_grace_s=longest_grace_s,
                              settle_s=settle_s, poll_s=poll_s, mode=mode)
    back = max(r.done_at, r.target_ready_at or r.done_at)
    value = back - r.flip_at
    notes = [f"clock x{r.speed:g}; sweep every {r.sweep_interval_s:g} s (up to one interval of it is the schedule's "
             f"wait, not the app's work)", f"where the time went: {phases(r)}"]
    if rung == "replace":
        notes.append(f"{mode}; replacement {r.target}"
                     + (f" Ready at +{r.target_ready_at - r.flip_at:.0f} s" if r.target_ready_at else ""))
        if mode == SURGE:
            in_order = floor_s(threshold_s=r.threshold_s, longest_grace_s=longest_grace_s,
                               action_s=float(timings["pool_scale_s"]) + float(timings["node_ready_s"])
                               + float(timings["delete_machines_s"]), settle_s=settle_s, poll_s=poll_s)
            notes.append(f"with the surge after the drain, as the app orders them, the floor would be {in_order:.0f} s "
                         f"(ratio {value / in_order:.2f})")
        elif r.replace.get("surge_error"):
            notes.append(f"surge refused: {str(r.replace['surge_error'])[:120]}")
    return measured(name(rung), value, UNIT, baseline=floor, baseline_name=terms, target=target,
                    check=lambda f: f.value is not None and f.value <= TARGET * floor, note="; ".join(notes))


def _unmeasured(rung: str, r: RemediationRun) -> str:
    """Why the run gives no time to repair for ``rung`` (empty when it does)."""
    if r.error:
        return r.error
    if r.flip_at is None or r.done_at is None or r.record_state != "done":
        return f"the run's remediation ended {r.record_state or 'nowhere'}, not done"
    if r.in_service:
        return f"the remediation ended done but the node is not back in service: {r.in_service}"
    if rung == "replace" and (not r.replace.get("replacement") or r.target != r.replace.get("replacement")):
        return f"the replace ended done without a replacement node (data.replace: {r.replace})"
    if rung == "replace" and str(r.replace.get("mode") or SURGE) not in (SURGE, DELETE_FIRST):
        return f"the replace took the {r.replace.get('mode')} way, which this floor does not describe"
    return ""


def phases(r: RemediationRun) -> str:
    """The measured time split by the record's history: threshold, then each state's first line to the next's."""
    if r.flip_at is None:
        return "no fault flip"
    firsts: dict[str, float] = {}
    surged: list[float] = []  # replace (surge-first): the step that found the new node Ready
    for line in r.history:
        at = remediation_run.when(line)
        state = str(line.get("state") or "")
        if at is None:
            continue
        if state not in firsts:
            firsts[state] = at
        note = str(line.get("note") or "")
        if state == "repairing" and note.startswith("replacement ") and " is Ready" in note:
            surged.append(at)
    steps: list[tuple[str, float | None]] = [("threshold", r.flip_at + r.threshold_s),
                                             ("to the cordon", firsts.get("cordoned")),
                                             ("to the drain's start", firsts.get("draining")),
                                             ("drain", firsts.get("repairing"))]
    if surged:  # replace: the surge until the new node was Ready, then the deletion
        steps += [("surge until Ready", surged[0]), ("deletion", firsts.get("verifying"))]
    else:
        steps.append((f"{r.rung} until healthy", firsts.get("verifying")))
    steps.append(("verification", r.done_at))
    out: list[str] = []
    previous = r.flip_at
    for label, at in steps:
        if at is None:
            continue
        out.append(f"{label} {at - previous:.0f}")
        previous = at
    return " + ".join(out) + " s"


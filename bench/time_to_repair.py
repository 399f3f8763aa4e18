"""Benchmark: time to repair, from the fault's onset to the node back in service, against its physical floor
(issue 24, item 3).

The run is bench.remediation_run's: ``UnhealthyNvidiaDevicePlugin`` turns True on a node running pods whose
grace periods go up to 60 s, the condition is cleared by the restart rung (``fixed_by: restart``), and the
node is back in service when the remediation ends ``done`` (it uncordons the node in that step). The floor
is what physics alone takes, as issue 24 defines it: the detection threshold, the longest grace period of
the node's pods (the drain cannot end sooner), the VM action until the node is Ready (the simulator's
``restart_s``), and the verification the app must wait out before it trusts the repair
(``max(REMEDIATION_SETTLE_S, 2 x REMEDIATION_POLL_S)``, docs/remediation.md). Everything else (the wait
for the next sweep, delivery, admission, the poll cadence of each step) is the app's overhead, which the
ratio shows. Target: at most 1.3 x the floor.

Only the restart rung is measured: the reimage and replace rungs need runs of their own (a fault the
restart does not cure, a pool surge), not built yet; they are reported as not measured.
"""

from __future__ import annotations

from bench import remediation_run
from bench.figures import Figure, measured, not_measured
from bench.scale import Scale

RUNGS = ("restart", "reimage", "replace")
TARGET = 1.3


def name(rung: str) -> str:
    return f"time to repair vs its physical floor, {rung} rung"


def floor_s(*, threshold_s: float, longest_grace_s: float, action_s: float, settle_s: float, poll_s: float) -> float:
    """Detection threshold + longest grace period + the VM action until Ready + the verification's wait."""
    return threshold_s + longest_grace_s + action_s + max(settle_s, 2 * poll_s)


def run(scale: Scale) -> list[Figure]:
    r = remediation_run.get(scale)
    figures: list[Figure] = []
    if r.error or r.flip_at is None or r.done_at is None or r.record_state != "done":
        why = r.error or f"the run's remediation ended {r.record_state or 'nowhere'}, not done"
        figures.append(not_measured(name("restart"), "s (simulated)", why, target=f"<= {TARGET} x floor"))
    else:
        profile = remediation_run.PROFILE
        floor = floor_s(threshold_s=r.threshold_s, longest_grace_s=float(max(r.graces or remediation_run.GRACES)),
                        action_s=float(remediation_run.RESTART_S), settle_s=float(profile["REMEDIATION_SETTLE_S"]),
                        poll_s=float(profile["REMEDIATION_POLL_S"]))
        figures.append(measured(
            name("restart"), r.done_at - r.flip_at, "s (simulated)", baseline=floor,
            baseline_name="threshold + longest grace + restart until Ready + verification",
            target=f"<= {TARGET} x floor", check=lambda f: f.value is not None and f.value <= TARGET * floor,
            note=f"clock x{r.speed:g}; sweep every {r.sweep_interval_s:g} s (up to one interval of it is the schedule's "
                 "wait, not the app's work)"))
    for rung in RUNGS[1:]:
        figures.append(not_measured(name(rung), "s (simulated)", "no benchmark run for this rung yet (a fault the "
                                    "restart does not cure; a pool surge for replace)", target=f"<= {TARGET} x floor"))
    return figures

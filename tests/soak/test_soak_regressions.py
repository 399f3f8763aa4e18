"""Failures the soak found, each pinned by its seed (``python -m soak --replay SEED`` shows it).

A failure that is fixed stays here as a plain regression test. One that is not fixed yet is marked
``xfail(strict=True)`` with what happens: the day the app is fixed the test passes, strict xfail
turns that into a failure, and whoever fixed it removes the marker.
"""

from __future__ import annotations

from soak.report import failure_text
from soak.runner import Mix, run_seed

# The pinned seeds run their scenarios as they were found: without the stricter faults of issue 10,
# which soak.strict adds on top of every seed (they would change what these seeds exercise).
IN_PROCESS = Mix(process_every=0, table_every=0, strict=False)
# Seeds found by a layer on top (issue 18's forged DCGM series) run with every layer, as the soak ran them.
EVERY_LAYER = Mix(process_every=0, table_every=0)


def test_seed_1040_two_replacements_in_one_pool_do_not_share_a_new_node() -> None:
    """Fixed: a delete-first replace dropped the count, a second replace surged from the lowered count and
    both took its one new node (pool 4 -> 3, both done). Replaces now take turns per pool and claim their
    replacement node (shared/remediation/replace.py, docs/remediation.md)."""
    result = run_seed(1040, mix=IN_PROCESS, wall_budget_s=240.0)
    assert not result.failed, failure_text(result)


def test_seed_3024_a_node_given_up_on_and_repaired_by_a_later_remediation_may_be_uncordoned() -> None:
    """Fixed in the soak's audit: remediation -1 gave up (the node stayed cordoned for an operator); a new
    fault on the node was admitted as -2, which repaired and verified it and uncordoned it. The audit took
    the first record's "must stay cordoned" as final; a node's cordon belongs to its latest remediation."""
    result = run_seed(3024, mix=IN_PROCESS, wall_budget_s=240.0)
    assert not result.failed, failure_text(result)


def test_seed_118_a_forged_copy_of_a_healthy_nodes_series_does_not_open_the_breaker() -> None:
    """Fixed: a tenant's PodMonitor (honorLabels, labeldrop) wrote DCGM_FI_DEV_ROW_REMAP_FAILURE=1 in the managed
    exporter's exact shape for soak2/aks-gpu2-09583439-vmss000003, a healthy node. Its samples interleave with
    the exporter's own 0s (scrapes 15 s apart), so about half the sweeps' instant queries saw 1, and the sweep
    put the node in the breaker's window on each such sighting; with a genuine XID 79 and a host failure on two
    other nodes, 3 of 8 GPU nodes (38% > BREAKER_PERCENT=30) opened the breaker. The breaker now counts a DCGM
    fault only once the window re-check confirms it (shared/remediation/dcgm.py)."""
    result = run_seed(118, mix=EVERY_LAYER, wall_budget_s=240.0)
    assert not result.failed, failure_text(result)


def test_short_seed_13_a_forged_row_whose_node_was_replaced_meanwhile_is_refused_and_holds_no_replace_turn() -> None:
    """Fixed (steps.step_repairing blocks a row admission never recorded whose node is not registered).
    Found: at t+31 s a table writer wrote remediation rows -5 (repairing/restart/requested) and -6
    (repairing/replace/start) for soak1/aks-gpu1-12275417-vmss000001, then healthy. -5 ended blocked (NotOurCordon);
    -6 waited on the node lease. A genuine degraded-host remediation (-1) then cordoned, drained and replaced that
    node (deleteMachines at t+129 s). From t+245 s the forged -6 ran the replace rung on the node that no longer
    existed: shared/remediation/steps.py step_repairing proves its preconditions only ``if current is not None``,
    so with the node gone it went straight to step_replace ("replacing ... delete then restore count 3",
    "deleting machine ...", "waiting for the replacement node"). It sent no ARM write (2 deleteMachines and 2
    pool PUTs in the run, all the genuine remediations'), but it held pool gpu1's replace turn for 240 s: the
    genuine remediation of vmss000000 waited from t+250 s to t+489 s ("remediation ...-6 is replacing a node of
    pool gpu1"), and -6 ended gave_up ("an operator must look at it") instead of blocked."""
    result = run_seed(13, mix=EVERY_LAYER, short=True, wall_budget_s=240.0)
    assert not result.failed, failure_text(result)


def test_seed_931005_a_degraded_host_refused_by_the_pool_budget_is_drained_once_the_slot_frees() -> None:
    """Fixed (issue 24): Resource Health said aks-gpu1-...-vmss000002 was on degraded hardware while its neighbour
    vmss000000 was being repaired; the admission was refused three times ("pool gpu1: 1 of 3 nodes already
    unavailable, the budget allows 1"), the neighbour's repair ended, and nothing looked at vmss000002 again: the
    run ended quiet with the degraded host never drained. A pushed fault refused for a reason that passes is now
    kept and judged again every sweep (shared/remediation/pending_faults.py); soak/liveness.py ``fault-liveness``
    fails a run that loses one."""
    result = run_seed(931005, mix=EVERY_LAYER, wall_budget_s=300.0)
    assert not result.failed, failure_text(result)
    remediated = [n for n in result.notes if n.startswith("remediation ") and "vmss000002" in n]
    assert remediated, "\n".join(result.notes)


def test_seed_931382_a_replaced_node_and_its_neighbour_are_never_unavailable_together() -> None:
    """Fixed (issue 24). soak1/gpu1 (3 nodes, BUDGET_POOL_MAX_UNAVAILABLE=2 at 50 %: one node): remediation -1 of
    vmss000000 escalated to replace and surged the pool to four; while vmss000000 was still cordoned, the admission
    of vmss000001 counted four nodes (a budget of two) and let it in: two of the team's three nodes out at once. A
    surge node now stands in for the node it replaces and adds nothing to the pool's budget
    (shared/remediation/pool_view.py; tests/unit/test_pool_view.py)."""
    result = run_seed(931382, wall_budget_s=300.0)
    assert not result.failed, failure_text(result)


def test_seed_940032_a_forged_restart_request_is_never_taken_for_a_restart() -> None:
    """Fixed (issue 24): a forged ``repairing/restart/requested`` row named a surge node that had joined after the
    row's claimed request; judged from the node alone, its fresh Ready looked like the restart taking effect and
    the steward reported Restarted and Recovered for a restart nobody made. A claimed request is now judged only
    under this remediation's own marks: its operation marker and its cordon (shared/remediation/vm_actions.py
    ``_request_proven``)."""
    result = run_seed(940032, wall_budget_s=300.0)
    assert not result.failed, failure_text(result)

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

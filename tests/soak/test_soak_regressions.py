"""Failures the soak found, each pinned by its seed (``python -m soak --replay SEED`` shows it).

A failure that is fixed stays here as a plain regression test. One that is not fixed yet is marked
``xfail(strict=True)`` with what happens: the day the app is fixed the test passes, strict xfail
turns that into a failure, and whoever fixed it removes the marker.
"""

from __future__ import annotations

from soak.report import failure_text
from soak.runner import Mix, run_seed

IN_PROCESS = Mix(process_every=0, table_every=0)


def test_seed_1040_two_replacements_in_one_pool_do_not_share_a_new_node() -> None:
    """Fixed: a delete-first replace dropped the count, a second replace surged from the lowered count and
    both took its one new node (pool 4 -> 3, both done). Replaces now take turns per pool and claim their
    replacement node (shared/remediation.py, docs/remediation.md)."""
    result = run_seed(1040, mix=IN_PROCESS, wall_budget_s=240.0)
    assert not result.failed, failure_text(result)

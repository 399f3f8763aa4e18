"""Failures the soak found, each pinned by its seed (``python -m soak --replay SEED`` shows it).

A failure that is fixed stays here as a plain regression test. One that is not fixed yet is marked
``xfail(strict=True)`` with what happens: the day the app is fixed the test passes, strict xfail
turns that into a failure, and whoever fixed it removes the marker.
"""

from __future__ import annotations

import pytest

from soak.report import failure_text
from soak.runner import Mix, run_seed

IN_PROCESS = Mix(process_every=0, table_every=0)


@pytest.mark.xfail(strict=True, reason=(
    "shared/remediation.py: two replace rungs in one pool at once claim the same new node. Remediation B "
    "(surge refused by QuotaExceeded -> delete-first) deletes its node (count 4 -> 3) and waits for a "
    "replacement; remediation A starts a surge from the *current* count (original_count=3, target 4); B's "
    "scale-back sees count 4 = its original and skips its PUT, then takes A's surge node as its replacement "
    "('a node of the pool created after the rung started'); A deletes its own node too. Two broken nodes "
    "removed, one added: the pool ends with 3 nodes and both records say done with the same replacement."))
def test_seed_1040_two_replacements_in_one_pool_do_not_share_a_new_node() -> None:
    result = run_seed(1040, mix=IN_PROCESS, wall_budget_s=240.0)
    assert not result.failed, failure_text(result)

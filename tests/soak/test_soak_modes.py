"""The soak's other two modes, once each: real host processes killed at random, and the Azurite ledger.

Most soak runs drive the app in process with an in-memory twin of the ledger (fast, see
soak/inprocess.py); these two keep the slower, more literal modes from rotting: a scenario run
through ``python -m devhost run`` processes with SIGKILLs at random instants, and an in-process
scenario whose hosts share the ledger table in Azurite.
"""

from __future__ import annotations

from typing import Any

from soak.generate import generate
from soak.report import failure_text
from soak.runner import run_scenario


def test_a_fleet_run_by_host_processes_killed_at_random_keeps_every_invariant(azurite: Any) -> None:
    scenario = generate(19, short=True, process_mode=True)
    result = run_scenario(scenario, azurite=azurite, wall_budget_s=150.0)
    assert not result.failed, failure_text(result)
    assert result.faults["host process killed"] >= 1
    assert result.end_reason.startswith("quiet"), result.end_reason


def test_a_fleet_whose_hosts_share_the_azurite_ledger_keeps_every_invariant(azurite: Any) -> None:
    scenario = generate(7, short=True)
    result = run_scenario(scenario, azurite=azurite, use_table=True, wall_budget_s=150.0)
    assert result.mode == "in-process+table"
    assert not result.failed, failure_text(result)

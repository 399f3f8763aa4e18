"""The migration's ARM re-checks agree with the planner on the simulator's real pools (issue 11).

Every migration step re-derives, from the pool ARM returns (``get_pool``), what the planner decided
from the pools it listed (``list_pools``): the pool's eligibility, the record's invariants and, before
the replacement is created, that the recorded body is the managed clone of the pool. If the two
reads disagreed on any copied field, every real migration would end ``blocked``; this runs the real
adapter against the simulator's default fleet to show they do not, and that the pools the planner
skips are refused by the step's check with the same rule.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.kernel.clock import ManualClock
from shared.migration.checks import pool_refusal
from shared.migration.plan import body_problems, plan, pool_ineligibility, record_problems
from shared.migration.planner import record_for
from shared.migration.policy import MigrationPolicy
from shared.migration.records import read
from shared.settings import Settings

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app

NOW = 1_764_684_000.0


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    scenario = yaml.safe_load(Path("sim/scenarios/default.yaml").read_text())
    with sim_as_the_app(scenario=scenario, speed=60.0) as handle:
        yield handle


@pytest.fixture(scope="module")
def settings(sim: SimHandle) -> Settings:
    return app_settings(sim)


def test_each_planned_record_passes_the_steps_re_checks_against_the_pool_arm_returns(settings: Settings) -> None:
    from shared.fleet import gpu_sizes, scope
    from shared.wiring import FleetAccess

    aks = FleetAccess(settings, clock=ManualClock()).aks()
    clusters = scope.discover(aks, settings)
    pools = {c.id: aks.list_pools(c.id) for c in clusters}
    policy = MigrationPolicy(enabled=True, strategy="surge", max_concurrent=1000)
    result = plan(clusters, pools, migrations=[], maintenance_by_cluster={}, policy=policy, now=NOW)
    assert result.items, "the default fleet has unmanaged GPU pools to plan"
    for item in result.items:
        record = record_for(item, now=NOW)
        old = aks.get_pool(item.cluster_id, item.pool)
        assert old is not None
        assert record_problems(record) == "", item.pool
        assert pool_refusal(read(record.data), old) == "", item.pool
        assert body_problems(old, record) == "", item.pool
    skipped = {(s.cluster_id, s.pool): s.code for s in result.skipped}
    for (cluster_id, pool), code in skipped.items():
        if code in ("mig", "system", "not-nvidia", "windows"):
            got = aks.get_pool(cluster_id, pool)
            assert got is not None
            found: Any = pool_ineligibility(got, size=gpu_sizes.lookup(got.vm_size))
            assert found is not None and found[0] == code, (pool, found)

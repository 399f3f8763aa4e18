"""Forged pool-request rows written straight into Azurite's table disrupt nothing (issue 19, item 1).

The same forgeries as tests/unit/test_pool_forged_states.py, but the rows are entities a table writer
puts into the table with the Tables SDK (no steward code writes them), and the reconciler reads them
back through the real TableLedger. ARM and the clusters are the unit fakes, so what was written to
them is known exactly: nothing, and each row ends ``blocked`` with its reason.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from shared.adapters.ledger import TableLedger, to_entity
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.pools import steps as pool_steps
from shared.pools.records import KIND
from tests.unit import test_pool_forged_states as forged
from tests.unit.fakes_pool import CLUSTER, NAP_CLUSTER, World


@pytest.fixture
def table(storage_connection_string: str) -> Any:
    from azure.data.tables import TableClient

    client = TableClient.from_connection_string(storage_connection_string,
                                                table_name=f"forged{uuid.uuid4().hex[:16]}", retry_total=0)
    client.create_table()
    return client


def on_azurite(table: Any) -> World:
    """The unit world, its ledger replaced by the real adapter over the Azurite table."""
    world = forged.team_world()
    ledger = TableLedger(table, clock=world.clock)
    world.ctx.ledger = ledger
    return dataclasses.replace(world, ledger=ledger)  # type: ignore[arg-type]


def write_entity(table: Any, record: Record) -> None:
    """As a table writer would: one entity, straight through the Tables SDK."""
    table.create_entity(to_entity(record))


CASES = [
    ("creating-an-old-failed-pool", "creating", CLUSTER, {}, ("failed-pool", forged.OLD),
     "longer than any request can still be working on it"),
    ("validating-an-old-pool-past-its-deadline", "validating", CLUSTER, forged.UNHEALTHY, ("pool", forged.OLD),
     "was made 300 min ago"),
    ("testing-a-pool-that-does-not-exist", "testing", CLUSTER, {}, None, "the pool does not exist"),
    ("creating-someone-elses-nodepool", "creating", NAP_CLUSTER, {"nap": True}, ("nodepool", None),
     "was not made by request 'req-1'"),
    ("a-failure-waiting-to-clean-up-an-old-pool", "accepted", CLUSTER, forged.FAILING, ("pool", forged.OLD),
     "longer than any request"),
]


@pytest.mark.parametrize(("state", "cluster", "data", "setup", "why"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_forged_entity_in_azurites_table_touches_nothing_and_ends_blocked(
        table: Any, state: str, cluster: str, data: dict[str, Any], setup: tuple[str, Any] | None, why: str) -> None:
    world = on_azurite(table)
    if setup is not None:
        what, arg = setup
        if what == "nodepool":
            forged.nodepool(world, annotations=arg)
        else:
            forged.pool(world, age_s=arg, state="Failed" if what == "failed-pool" else "Succeeded")
    scratch = forged.team_world()  # builds the row without touching Azurite; the entity is then written raw
    row = forged.forge(scratch, state, cluster=cluster, **data)
    write_entity(table, row)
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})
    final = world.ledger.get(KIND, forged.ROW)
    assert final is not None
    forged.assert_blocked(world, final, why)
    assert table.get_entity("pool-request", "vision:req-1")["state"] == "blocked"

"""Forged pool-request rows against the local stack: Azurite's table, the simulator's ARM and Kubernetes (issue 19).

The rows are entities written straight into an Azurite table (as a table writer would); the steward
runs its real reconciler, TableLedger and adapters (FleetAccess: azure-mgmt and the kubernetes client)
against the simulator. The victims are a pool the steward made for a finished request hours ago (the
pool a rewritten row would most plausibly aim at) and a pool nobody made through the steward. The
simulator's own request log is the oracle: no DELETE or PUT of an agent pool, no Job created; the pools
are still there, and each row reads back ``blocked``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from shared.adapters.ledger import TableLedger, to_entity
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.pools import spec as pool_spec
from shared.pools import steps as pool_steps
from shared.pools.records import KIND
from shared.pools.request import PoolRequest
from shared.pools.teams import Team
from tests.fakes.events import RecordingEvents

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover - only while the simulator is being written
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app

OLD_S = 5 * 3600.0
T4 = "Standard_NC4as_T4_v3"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario="sim/scenarios/default.yaml") as handle:
        yield handle


@pytest.fixture(scope="module")
def cluster(sim: SimHandle) -> str:
    return str(sim.cluster("ml-train")["id"])


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module")
def access(sim: SimHandle, clock: ManualClock) -> Any:
    from shared.wiring import FleetAccess

    return FleetAccess(app_settings(sim), clock=clock)


@pytest.fixture
def table(storage_connection_string: str) -> Any:
    from azure.data.tables import TableClient

    client = TableClient.from_connection_string(storage_connection_string,
                                                table_name=f"forgedsim{uuid.uuid4().hex[:12]}", retry_total=0)
    client.create_table()
    return client


def _request(cluster: str, pool: str, **fields: Any) -> PoolRequest:
    return PoolRequest(schema_version="1", request_id="req-1", requester="vision", cluster=cluster, pool_name=pool,
                       vm_size=T4, count=1, **fields)


@pytest.fixture(scope="module")
def old_pool(access: Any, cluster: str, clock: ManualClock) -> str:
    """A pool the steward made for request req-1 of vision five hours ago (its request long finished)."""
    body, api_version = pool_spec.agent_pool_body(_request(cluster, "victim"), created_at=clock.now() - OLD_S)
    access.aks().begin_put_pool(cluster, "victim", body, api_version=api_version, create_only=True)
    return "victim"


def _ctx(sim: SimHandle, access: Any, clock: ManualClock, table: Any, cluster: str) -> Context:
    settings = dataclasses.replace(app_settings(sim), teams=(Team(name="vision", queue="q-vision",
                                                                  clusters=(cluster,)),))
    return Context(settings=settings, clock=clock, ledger=TableLedger(table, clock=clock), access=access,
                   events=RecordingEvents(), telemetry=None, instance="forged-sim")  # type: ignore[arg-type]


def _forge(table: Any, req: PoolRequest, state: str, now: float, **data: Any) -> None:
    import msgspec

    body = {"request": msgspec.to_builtins(req), "fingerprint": "forged", "cluster": req.cluster,
            "pool": req.pool_name, "requester": "vision", "vm_size": T4, "team": "vision", "announced": True,
            "puts": 1, **data}
    table.create_entity(to_entity(Record(kind=KIND, id="vision:req-1", state=state, data=body, created_at=now,
                                         updated_at=now, next_at=now)))


def _writes(sim: SimHandle) -> dict[str, int]:
    """How many writes the simulator has served to agent pools, Jobs and Karpenter objects (its request log is
    keyed by route template, ids as ``{}``), and how many reads of agent pools (proof that the steward looked)."""
    return {key: count for key, count in sim.oracles()["requests"].items()
            if (key.startswith(("PUT ", "DELETE ", "PATCH ", "POST ")) and ("/agentPools/" in key or "/jobs" in key
                                                                            or "karpenter" in key))}


def test_the_oracle_sees_the_stewards_writes(sim: SimHandle, old_pool: str) -> None:
    # the setup's own PUT is counted: an empty difference below means no write, not a blind oracle
    assert any(key.startswith("PUT ") and key.endswith("/agentPools/{}") for key in _writes(sim))


CASES = [
    ("validating-a-finished-requests-pool-past-its-deadline", "victim", "validating", {"deadline": 0.0},
     "longer than any request can still be working on it"),
    ("testing-a-finished-requests-pool", "victim", "testing", {"request": "validateWorkload"},
     "longer than any request can still be working on it"),
    ("a-failure-waiting-to-clean-up-a-finished-requests-pool", "victim", "validating",
     {"failing": {"code": "SampleJobFailed", "message": "forged", "since": 0.0}}, "longer than any request"),
    ("validating-a-pool-nobody-made-through-the-steward", "gput4", "validating", {"deadline": 0.0},
     "was not created by request 'req-1' of 'vision'"),
]


@pytest.mark.parametrize(("pool", "state", "data", "why"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_forged_row_in_azurite_disrupts_no_pool_in_the_simulator_and_ends_blocked(
        sim: SimHandle, access: Any, clock: ManualClock, table: Any, cluster: str, old_pool: str, pool: str,
        state: str, data: dict[str, Any], why: str) -> None:
    ctx = _ctx(sim, access, clock, table, cluster)
    data = dict(data)
    req = _request(cluster, pool, validate_workload=data.pop("request", None) == "validateWorkload")
    before = _writes(sim)
    _forge(table, req, state, clock.now(), **data)
    reconcile_once(ctx, modules={"pool-request": pool_steps})
    final = ctx.ledger.get(KIND, "vision:req-1")
    assert final is not None and final.state == "blocked", (final.state if final else None, final and final.data)
    assert why in final.data["reason"] and "nothing was created, changed or deleted" in final.data["reason"]
    assert table.get_entity("pool-request", "vision:req-1")["state"] == "blocked"
    assert _writes(sim) == before
    assert access.aks().get_pool(cluster, pool) is not None
    assert [e["type"] for e in ctx.events.published] == ["Steward.PoolRequest.Blocked"]  # type: ignore[attr-defined]

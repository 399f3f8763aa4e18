"""What real AKS answers, met by the app on the simulator (issue 23): operations aborted to ``Canceled``, pools
without an ``eTag``, and long-running operations with no ``Retry-After``.

An operation ends ``Canceled`` when someone aborts it (``az aks nodepool operation-abort``:
AgentPools_AbortLatestOperation; recorded: tests/replay/recordings/test_aks_abort.json). Here the test plays
that operator through the real ARM route while the app's own code runs: the app in process (its real
adapters, the reconciler, the sweep, the admission), against the simulator on a manual clock. Every wait of
the app treats ``Canceled`` as an operation that is over and did not do its work (shared.kernel.ports
``ENDED_UNDONE``): a replace falls back or moves on instead of holding its rung until the timeout, a
migration rolls back a replacement whose creation was aborted, and an aborted deletion of the old pool is
never sent again (an abort is a person's decision: the migration stops ``blocked`` and says so).

The simulator sends no ``Retry-After`` on AKS operations (as recorded), so every flow here also shows that no
wait of the app depends on one.
"""

from __future__ import annotations

import importlib.util
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import sim_as_the_app

SUB = "8f2d4c1e-5a3b-4c7d-9e0f-0000000000e4"
T4 = "Standard_NC4as_T4_v3"
MANAGED = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}


def scenario(*, pool_etags: bool = True) -> dict[str, Any]:
    return {
        "seed": 2301, "clock": {"manual": True},
        "subscriptions": [{
            "id": SUB,
            "quotas": [{"location": "eastus", "family": f, "limit": 1000}
                       for f in ("standardNCASv3_T4Family", "standardDSv5Family")],
            "clusters": [{
                "name": "c1", "resource_group": "rg1", "location": "eastus", "pool_etags": pool_etags,
                "tags": {"gpu-fleet-steward": "enabled"},
                "pools": [
                    {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
                    {"name": "gpu", "mode": "User", "vmSize": T4, "count": 2, "gpuProfile": MANAGED},
                    {"name": "old", "mode": "User", "vmSize": T4, "count": 1, "npd": True},
                ],
            }],
        }],
    }


class App:
    """The app in this process against the simulator: one host, an in-memory ledger, the simulator's clock."""

    def __init__(self, sim: SimHandle, storage: str, table: str, **profile: str) -> None:
        from shared import settings as settings_mod
        from shared import wiring
        from soak.inprocess import app_settings
        from soak.simclock import LinkedClock
        from tests.fakes.ledger import InMemoryLedger

        self.sim = sim
        self.clock = LinkedClock(sim)
        env = app_settings(sim.endpoints, storage=storage, table=table, profile={
            "REMEDIATION_DEFAULT_THRESHOLD_S": "60", "REMEDIATION_STARTUP_GRACE_S": "0", "BREAKER_ENABLED": "false",
            **profile})
        self.settings = settings_mod.load(env)
        self.ledger = InMemoryLedger()
        self.ctx = wiring.build_context(self.settings, instance="it-host", clock=self.clock, ledger=self.ledger)
        self.cluster_id = next(str(c["id"]) for c in sim.endpoints["clusters"] if c["name"] == "c1")

    def reconcile(self) -> None:
        from shared import entrypoints

        entrypoints.run_reconcile(reason="nudge", ctx=self.ctx)

    def run_until(self, done: Callable[[], Any], *, within_s: float, step_s: float = 5.0) -> Any:
        """Reconcile and let sim time pass until ``done()`` is truthy; fails after ``within_s`` sim seconds."""
        deadline = self.clock.now() + within_s
        while self.clock.now() <= deadline:
            self.reconcile()
            found = done()
            if found:
                return found
            self.clock.advance(step_s)
        raise AssertionError(f"not done within {within_s} sim seconds")

    def arm(self, method: str, path: str, body: Any = None, *, api_version: str = "2026-08-01") -> tuple[int, Any]:
        """ARM as the subscription's owner would call it (the operator of these tests)."""
        url = f"{self.sim.endpoints['arm_endpoint'].rstrip('/')}{self.cluster_id}{path}?api-version={api_version}"
        request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.sim.token('https://management.azure.com/')}",
                                                  "Content-Type": "application/json"})
        context = ssl.create_default_context(cafile=self.sim.ca_bundle)
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw.strip() else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, json.loads(raw) if raw.strip() else None

    def abort(self, pool: str) -> None:
        status, body = self.arm("POST", f"/agentPools/{pool}/abort")
        assert status in (200, 202, 204), (status, body)

    def pool(self, name: str) -> Any:
        return self.ctx.access.aks().get_pool(self.cluster_id, name)

    def records(self, kind: str) -> list[Any]:
        return list(self.ledger.list(kind))


@pytest.fixture
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=scenario()) as handle:
        yield handle


@pytest.fixture
def app(sim: SimHandle, storage_connection_string: str, names: Any) -> App:
    return App(sim, storage_connection_string, names.table("ledger"), REMEDIATION_LADDER="replace",
               REMEDIATION_SURGE="true")


def admit_a_fault(app: App, pool: str = "gpu") -> Any:
    """A GPU fault on the pool's first node, reported by the sweep and admitted as Event Grid would deliver it."""
    from shared import entrypoints
    from shared.remediation.records import UNHEALTHY_EVENT

    app.sim.control("POST", "/conditions", {"cluster": "c1", "pool": pool, "node_index": 0,
                                             "type": "UnhealthyNvidiaDevicePlugin", "status": "True",
                                             "fixed_by": "never"})
    app.clock.advance(120)
    report = entrypoints.run_health_sweep(ctx=app.ctx)
    [fault] = [f for f in report.faults if f.pool == pool]
    event = {"specversion": "1.0", "type": UNHEALTHY_EVENT, "source": app.settings.event_source, "id": fault.id,
             "subject": f"{fault.cluster}/agentPools/{fault.pool}/nodes/{fault.node}",
             "data": {"cluster": fault.cluster, "node": fault.node, "pool": fault.pool, "condition": fault.condition,
                      "since": fault.since}}
    result = entrypoints.handle_gpu_event(event, ctx=app.ctx)
    assert "admitted" in str(result), result
    return fault


def remediation(app: App) -> Any:
    [record] = app.records("remediation")
    return record


def test_a_canceled_surge_falls_back_and_a_canceled_delete_moves_the_ladder_on_without_waiting_out_the_rung(
        app: App) -> None:
    admit_a_fault(app)
    app.run_until(lambda: remediation(app).data.get("rung_phase") == "surge_wait", within_s=600)
    assert app.pool("gpu").provisioning_state == "Scaling"
    aborted_at = app.clock.now()
    app.abort("gpu")  # the operator stops the surge
    app.run_until(lambda: remediation(app).data.get("rung_phase") == "delete_wait"
                  and app.pool("gpu").provisioning_state == "Scaling", within_s=300, step_s=2)
    history = json.dumps(remediation(app).history)
    assert "the surge ended Canceled: falling back to delete-then-scale" in history
    app.abort("gpu")  # and then the deleteMachines
    ended = app.run_until(lambda: remediation(app).state in ("gave_up", "done", "failed") and remediation(app),
                          within_s=300, step_s=2)
    assert ended.state == "gave_up", ended.data
    assert "deleteMachines of" in json.dumps(ended.history) and "ended Canceled with the node still there" in \
        json.dumps(ended.history)
    timeout = app.ctx.settings.remediation.rung_timeout("replace")
    assert app.clock.now() - aborted_at < timeout / 2, "the Canceled operations did not hold the rung to its timeout"


def migration(app: App) -> Any:
    [record] = app.records("migration")
    return record


@pytest.fixture
def migrating(sim: SimHandle, storage_connection_string: str, names: Any) -> App:
    return App(sim, storage_connection_string, names.table("ledger"), MIGRATION_ENABLED="true",
               MIGRATION_STRATEGY="surge", MIGRATION_POOLS="old")


def plan_the_old_pool(app: App) -> Any:
    from shared import entrypoints

    entrypoints.run_migration_planner(ctx=app.ctx)
    record = migration(app)
    assert record.data["pool"] == "old"
    return record


def test_a_replacement_whose_creation_is_aborted_is_rolled_back_at_once(migrating: App) -> None:
    app = migrating
    replacement = plan_the_old_pool(app).data["replacement"]
    app.run_until(lambda: (p := app.pool(replacement)) is not None and p.provisioning_state == "Creating", within_s=300)
    app.abort(replacement)
    ended = app.run_until(lambda: migration(app).state in ("rolled_back", "blocked", "done") and migration(app),
                          within_s=600)
    assert ended.state == "rolled_back", ended.data
    assert "the replacement is Canceled" in json.dumps(ended.data)
    assert app.pool(replacement) is None and app.pool("old") is not None


def test_an_aborted_deletion_of_the_old_pool_is_never_sent_again(migrating: App) -> None:
    app = migrating
    plan_the_old_pool(app)
    app.run_until(lambda: migration(app).state == "deleting" and (p := app.pool("old")) is not None
                  and p.provisioning_state == "Deleting", within_s=3600, step_s=10)
    app.abort("old")
    ended = app.run_until(lambda: migration(app).state in ("rolled_back", "blocked", "done") and migration(app),
                          within_s=600)
    assert ended.state == "blocked", ended.data
    assert "was Canceled (aborted): not sent again" in json.dumps(ended.data)
    old = app.pool("old")
    assert old is not None and old.provisioning_state == "Canceled"
    app.run_until(lambda: True, within_s=120)
    assert app.pool("old") is not None and app.pool("old").provisioning_state == "Canceled", "no second DELETE"


@pytest.fixture
def etagless(storage_connection_string: str, names: Any) -> Iterator[App]:
    with sim_as_the_app(scenario=scenario(pool_etags=False)) as handle:
        yield App(handle, storage_connection_string, names.table("ledger"), REMEDIATION_LADDER="replace",
                  REMEDIATION_SURGE="true")


def test_a_pool_without_an_etag_is_replaced_into_through_fresh_reads(etagless: App) -> None:
    app = etagless
    assert app.pool("gpu").etag is None, "this cluster's pools carry no eTag, as recorded before 2025"
    admit_a_fault(app)
    ended = app.run_until(lambda: remediation(app).state in ("gave_up", "done", "failed") and remediation(app),
                          within_s=1800, step_s=10)
    assert ended.state in ("done", "gave_up"), ended.data
    assert ("put_pool" in json.dumps(ended.history)) or ended.data.get("replace", {}).get("mode") == "surge"


def test_a_pool_without_an_etag_changed_between_the_read_and_the_write_is_not_written(etagless: App) -> None:
    from shared.fleet.pool_writes import precondition
    from shared.kernel.errors import Conflict

    app = etagless
    aks = app.ctx.access.aks()
    read = aks.get_pool(app.cluster_id, "gpu")
    assert read is not None and read.etag is None
    assert precondition(aks, read) is None, "unchanged: written with no precondition, after the fresh read"
    status, current = app.arm("GET", "/agentPools/gpu")
    assert status == 200
    props = {k: v for k, v in current["properties"].items() if k not in ("provisioningState", "powerState")}
    props["nodeLabels"] = {**(props.get("nodeLabels") or {}), "team": "vision"}
    status, body = app.arm("PUT", "/agentPools/gpu", {"properties": props})  # an operator, in between
    assert status in (200, 201), body
    with pytest.raises(Conflict, match="changed since it was read"):
        precondition(aks, read)

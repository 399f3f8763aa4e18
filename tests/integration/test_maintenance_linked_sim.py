"""The app's ARM adapter against the simulator: maintenance windows as AKS serves them, and a write
refused for a linked permission.

One in-process simulator (sim.core.server.SimServer over HTTPS, manual clock) is shared by the module; the
app side is the production code: shared.wiring.FleetAccess -> shared.adapters.aks (azure-mgmt-containerservice)
-> shared.migration.maintenance.window_open.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.errors import Forbidden, LinkedAuthorizationFailed
from shared.migration.maintenance import window_open
from shared.migration.policy import MigrationPolicy
from shared.settings import load

if importlib.util.find_spec("sim.core.server") is None:  # pragma: no cover - only while the simulator is being written
    pytest.skip("the simulator is not in this checkout", allow_module_level=True)

from sim.core.certs import make_certs
from sim.core.server import SimServer
from sim.model import Fleet, SimClock

SUB = "00000000-0000-0000-0000-0000000000c4"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/gpu"
JOIN_SUBNET = "Microsoft.Network/virtualNetworks/subnets/join/action"
SATURDAY_0100_4H = {"schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}, "durationHours": 4,
                    "utcOffset": "+00:00", "startTime": "01:00", "startDate": "2026-01-03"}

pytestmark = pytest.mark.timeout(120)


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


class Sim:
    def __init__(self, fleet: Fleet, server: SimServer, ca: Path) -> None:
        self.fleet = fleet
        self.server = server
        self.ca = str(ca)

    def cluster(self, name: str) -> Any:
        found = self.fleet.cluster(SUB, "rg-gpu", name)
        assert found is not None
        return found


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    from shared.adapters import identity

    state = tmp_path_factory.mktemp("sim-h4a")
    fleet = Fleet(seed=5, clock=SimClock(manual=True))
    fleet.arm_linked_resource_groups = {f"/subscriptions/{SUB}/resourceGroups/rg-net"}  # linkedResourceGroupIds
    for name in ("windowed", "migrated", "vnet"):
        fleet.add_cluster(subscription=SUB, resource_group="rg-gpu", name=name, tags={"gpu-fleet-steward": "enabled"})
    cluster = fleet.cluster(SUB, "rg-gpu", "windowed")
    assert cluster is not None
    cluster.maintenance_configurations["default"] = {"maintenanceWindow": dict(SATURDAY_0100_4H)}
    migrated = fleet.cluster(SUB, "rg-gpu", "migrated")
    assert migrated is not None
    migrated.maintenance_configurations["default"] = {"timeInWeek": [{"day": "Saturday", "hourSlots": [1, 2]}]}
    certs = make_certs(state)
    fleet.ca_pem = certs.ca.read_bytes()
    server = SimServer(fleet, certs)
    server.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IDENTITY_ENDPOINT", f"http://127.0.0.1:{server.http_port}/msi/token")
        mp.setenv("IDENTITY_HEADER", fleet.identity_header)
        mp.delenv("MSI_ENDPOINT", raising=False)
        identity.reset()
        try:
            yield Sim(fleet, server, certs.ca)
        finally:
            identity.reset()
            server.stop()


@pytest.fixture(scope="module")
def aks(sim: Sim) -> Any:
    from shared.wiring import FleetAccess

    settings = load({
        "FLEET_SUBSCRIPTIONS": SUB,
        "ARM_ENDPOINT": sim.server.base_url,
        "STEWARD_CA_BUNDLE": sim.ca,
        "AzureWebJobsStorage": "UseDevelopmentStorage=true",
        "EVENTGRID_TOPIC_ENDPOINT": f"{sim.server.base_url}/eventgrid/api/events",
    })
    return FleetAccess(settings, clock=ManualClock()).aks()


def test_a_default_with_maintenance_window_closes_the_window_outside_it(sim: Sim, aks: Any) -> None:
    configs = aks.list_maintenance_configurations(sim.cluster("windowed").id)
    assert [(c["name"], c["properties"]["maintenanceWindow"]["startTime"]) for c in configs] == [("default", "01:00")]
    is_open, next_open, reason = window_open(configs, now=at("2026-12-02T12:00"), policy=MigrationPolicy())
    assert not is_open, reason
    assert next_open == at("2026-12-05T01:00")
    assert "maintenance configuration 'default'" in reason
    assert window_open(configs, now=at("2026-12-05T04:30"), policy=MigrationPolicy())[0]


def test_a_legacy_default_comes_back_as_written_and_decides_by_its_hour_slots(sim: Sim, aks: Any) -> None:
    # AKS answers a legacy default as it was written, timeInWeek only, no maintenanceWindow (recorded at
    # api-version 2026-07-01: tests/replay/recordings/test_aks_maintenanceconfiguration.json)
    [config] = aks.list_maintenance_configurations(sim.cluster("migrated").id)
    props = config["properties"]
    assert props["timeInWeek"] == [{"day": "Saturday", "hourSlots": [1, 2]}]
    assert not props.get("maintenanceWindow")
    assert window_open([config], now=at("2026-12-05T02:30"), policy=MigrationPolicy())[0]
    is_open, next_open, _ = window_open([config], now=at("2026-12-05T03:30"), policy=MigrationPolicy())
    assert not is_open and next_open == at("2026-12-12T01:00")


def test_a_missing_subnet_join_surfaces_as_linked_authorization_failed(sim: Sim, aks: Any) -> None:
    cluster = sim.cluster("vnet")
    sim.fleet.revoked_arm_actions = {JOIN_SUBNET}
    body = {"properties": {"vmSize": "Standard_NC4as_T4_v3", "count": 1, "mode": "User", "osType": "Linux",
                           "vnetSubnetID": SUBNET, "nodeTaints": ["sku=gpu:NoSchedule"]}}
    try:
        with pytest.raises(LinkedAuthorizationFailed) as raised:
            aks.begin_put_pool(cluster.id, "gpuvnet", body)
    finally:
        sim.fleet.revoked_arm_actions = set()
    assert isinstance(raised.value, Forbidden)  # never retried, a configuration problem
    assert raised.value.code == "LinkedAuthorizationFailed"
    assert JOIN_SUBNET in str(raised.value) and SUBNET in str(raised.value)
    assert "gpuvnet" not in {p.lower() for p in cluster.pools}
    aks.begin_put_pool(cluster.id, "gpuvnet", body)  # granted again: the same write goes through
    assert "gpuvnet" in {p.lower() for p in cluster.pools}

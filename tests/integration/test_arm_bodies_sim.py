"""Every request the app sends to ARM, and every answer it reads, is valid for its api-version's definition.

One test per operation the app calls, fed by the app's own code paths (the bodies its jobs build, sent
by its adapters through the real SDKs): pool creation for a request (managed, managed MIG, driver-only),
the migration's replacement, the old pool's autoscaler-off rewrite and its restore, a remediation's surge,
a request's cleanup, pool deletion, deleteMachines, VM restart and reimage, the maintenance configurations
read and the availability read. The wire is recorded with azure-core's request/response hooks, and each
body is judged by the definition of the api-version on its URL (shared.kernel.definitions for
Microsoft.ContainerService; the installed azure-mgmt-compute and azure-mgmt-resourcehealth models, walked
the same way, for the VM actions and Resource Health): property names at every depth, JSON types, enum
values, read-only properties never sent, required ones present. The simulator's answers are judged the
same way (issue 21, items 4 and 5).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from shared.kernel import definitions
from shared.kernel.clock import ManualClock
from shared.kernel.definitions import Definitions
from shared.kernel.definitions.derive import derive
from shared.kernel.ports import PoolInfo
from shared.settings import Settings

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from pathlib import Path

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app
from tests.waiting import wait_until

SPEED = 60.0


@dataclass
class Exchange:
    method: str
    path: str
    api_version: str
    body: Any
    status: int = 0
    answer: Any = None


class Wire:
    """What the app's SDK clients sent and were answered, in order (azure-core's raw hooks)."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def request(self, request: Any) -> None:
        http = request.http_request
        url = urllib.parse.urlsplit(http.url)
        query = urllib.parse.parse_qs(url.query)
        raw = http.body if http.body is not None else getattr(http, "content", None)
        if isinstance(raw, bytes | bytearray):
            raw = raw.decode()
        body = json.loads(raw) if isinstance(raw, str) and raw.strip() else raw if isinstance(raw, dict) else None
        self.exchanges.append(Exchange(http.method, url.path, (query.get("api-version") or [""])[0], body))

    def response(self, response: Any) -> None:
        http = response.http_response
        exchange = self.exchanges[-1]
        exchange.status = http.status_code
        http.read()  # an LRO's first answer is streamed; reading it keeps the bytes for the SDK too
        text = http.text() if http.status_code != 204 else ""
        exchange.answer = json.loads(text) if text.strip() else None

    def since(self, mark: int) -> list[Exchange]:
        return self.exchanges[mark:]

    def mark(self) -> int:
        return len(self.exchanges)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    scenario = yaml.safe_load(Path("sim/scenarios/default.yaml").read_text())
    with sim_as_the_app(scenario=scenario, speed=SPEED) as handle:
        yield handle


@pytest.fixture(scope="module")
def wire() -> Wire:
    return Wire()


@pytest.fixture(scope="module")
def access(sim: SimHandle, wire: Wire) -> Iterator[Any]:
    from shared.adapters import aks as aks_adapter
    from shared.adapters import compute as compute_adapter
    from shared.adapters.arm import arm_client_options
    from shared.wiring import FleetAccess

    def hooked(settings: Settings) -> dict[str, Any]:
        return {**arm_client_options(settings), "raw_request_hook": wire.request, "raw_response_hook": wire.response}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aks_adapter, "arm_client_options", hooked)
        mp.setattr(compute_adapter, "arm_client_options", hooked)
        yield FleetAccess(app_settings(sim), clock=ManualClock())


def cid(sim: SimHandle, name: str) -> str:
    return str(sim.cluster(name)["id"])


@functools.cache
def sdk_definitions(package: str, *roots: str) -> Definitions:
    """The installed SDK's models of ``roots``, walked like the committed AKS definitions."""
    return Definitions(derive(package, roots))


def containerservice(api_version: str) -> Definitions:
    assert api_version in definitions.API_VERSIONS, f"the app spoke {api_version}, which it has no definition of"
    return definitions.definitions(api_version)


def judged(exchanges: list[Exchange], *, model: str | None, defs: Any = containerservice) -> list[Exchange]:
    """Every exchange: its request body valid for ``model`` (None: no body sent), its 2xx answer valid too."""
    assert exchanges, "the operation sent nothing"
    for ex in exchanges:
        where = f"{ex.method} {ex.path}?api-version={ex.api_version}"
        if ex.method in ("PUT", "POST", "PATCH") and model is not None and ex.body is not None:
            assert defs(ex.api_version).problems(ex.body, model) == [], where
    return exchanges


# The collection each model's answers come from (the write gate's cluster reads are not judged here).
COLLECTION = {"AgentPool": "/agentPools", "Machine": "/machines", "MaintenanceConfiguration": "/maintenanceConfigurations",
              "AvailabilityStatus": "/availabilityStatuses"}


def answers_valid(exchanges: list[Exchange], model: str, *, defs: Any = containerservice) -> None:
    judged_any = False
    for ex in exchanges:
        if not 200 <= ex.status < 300 or ex.answer is None or COLLECTION[model] not in ex.path:
            continue
        judged_any = True
        items = ex.answer.get("value") if isinstance(ex.answer, dict) and "value" in ex.answer else [ex.answer]
        for item in items:
            assert defs(ex.api_version).problems(item, model, request=False) == [], f"{ex.method} {ex.path}: answer"
    assert judged_any, f"no answer of a {model} was read"


def settled(aks: Any, cluster: str, pool: str) -> PoolInfo:
    def look() -> PoolInfo | None:
        info = aks.get_pool(cluster, pool)
        return info if info is not None and info.provisioning_state in ("Succeeded", "Failed") else None

    return wait_until(look, timeout=30, interval=0.2, what=f"{pool} to settle")  # type: ignore[no-any-return]


def puts(exchanges: list[Exchange]) -> list[Exchange]:
    return [e for e in exchanges if e.method == "PUT" and "/agentPools/" in e.path]


def pool_request(**fields: Any) -> Any:
    """A team's request, judged by the app's own intake rules."""
    from shared.pools.policy import PoolRequestPolicy
    from shared.pools.validation import ValidatedRequest, parse_and_validate
    from tests.unit.fakes_pool import message

    validated = parse_and_validate(message(**fields), policy=PoolRequestPolicy(), in_scope=lambda _: True)
    assert isinstance(validated, ValidatedRequest), validated
    return validated.request


# --------------------------------------------------------------------------- pools: create


@pytest.mark.parametrize(("fields", "api_version"), [
    ({"vmSize": "Standard_NC4as_T4_v3"}, definitions.STABLE_API_VERSION),
    ({"vmSize": "Standard_NC24ads_A100_v4", "mig": {"strategy": "Single", "profile": "MIG3g"}},
     definitions.PREVIEW_API_VERSION),
    ({"vmSize": "Standard_NC4as_T4_v3", "installProfile": "driverOnly", "spot": {"maxPrice": 0.5}},
     definitions.STABLE_API_VERSION),
], ids=["managed", "managed MIG", "driver-only spot"])
def test_a_pool_request_creates_its_pool_with_a_valid_body(sim: SimHandle, access: Any, wire: Wire,
                                                           fields: dict[str, Any], api_version: str) -> None:
    from shared.pools import spec as pool_spec

    cluster = cid(sim, "ml-platform")
    name = "bodymig" if "mig" in fields else "bodydrv" if "installProfile" in fields else "bodyman"
    req = pool_request(cluster=cluster, poolName=name, **fields)
    body, version = pool_spec.agent_pool_body(req, created_at=0)
    mark = wire.mark()
    access.aks().begin_put_pool(cluster, name, body, api_version=version, create_only=True)
    (sent,) = puts(judged(wire.since(mark), model="AgentPool"))
    assert sent.api_version == api_version
    answers_valid(wire.since(mark), "AgentPool")
    settled(access.aks(), cluster, name)


def test_the_migration_creates_the_replacement_with_a_valid_body(sim: SimHandle, access: Any, wire: Wire) -> None:
    from shared.fleet import scope
    from shared.migration.plan import plan
    from shared.migration.policy import MigrationPolicy

    aks = access.aks()
    clusters = [c for c in scope.discover(aks, app_settings(sim)) if c.name == "ml-legacy"]
    mark = wire.mark()
    pools = {c.id: aks.list_pools(c.id) for c in clusters}
    answers_valid(wire.since(mark), "AgentPool")
    result = plan(clusters, pools, migrations=[], maintenance_by_cluster={},
                  policy=MigrationPolicy(enabled=True, strategy="surge", max_concurrent=100), now=0)
    item = result.items[0]
    mark = wire.mark()
    aks.begin_put_pool(item.cluster_id, item.replacement, {"properties": item.body}, create_only=True)
    (sent,) = puts(judged(wire.since(mark), model="AgentPool"))
    assert sent.body["properties"]["gpuProfile"]["nvidia"] == {"managementMode": "Managed"}
    answers_valid(wire.since(mark), "AgentPool")
    settled(aks, item.cluster_id, item.replacement)


# --------------------------------------------------------------------------- pools: update


def test_the_old_pools_autoscaler_off_rewrite_and_its_restore_are_valid(sim: SimHandle, access: Any, wire: Wire) -> None:
    from shared.fleet.pool_clone import frozen_old_pool

    aks, cluster = access.aks(), cid(sim, "ml-platform")
    aks.begin_put_pool(cluster, "bodyfrz", {"vmSize": "Standard_NC4as_T4_v3", "count": 1, "enableAutoScaling": True,
                                            "minCount": 1, "maxCount": 3, "gpuProfile": {"driver": "Install"},
                                            "kubeletConfig": {"kubeReserved": {"cpuMillicores": 100}}})
    old = settled(aks, cluster, "bodyfrz")
    mark = wire.mark()
    aks.begin_put_pool(cluster, "bodyfrz", {"properties": frozen_old_pool(old, enable_autoscaling=False)},
                       etag=old.etag)
    frozen = settled(aks, cluster, "bodyfrz")
    aks.begin_put_pool(cluster, "bodyfrz", {"properties": frozen_old_pool(frozen, enable_autoscaling=True, min_count=1,
                                                                           max_count=3)}, etag=frozen.etag)
    settled(aks, cluster, "bodyfrz")
    sent = puts(judged(wire.since(mark), model="AgentPool"))
    assert [e.api_version for e in sent] == [definitions.PREVIEW_API_VERSION] * 2  # kubeReserved needs it
    answers_valid(wire.since(mark), "AgentPool")


def test_a_remediations_surge_and_a_requests_cleanup_are_valid(sim: SimHandle, access: Any, wire: Wire) -> None:
    from shared.fleet.pool_clone import update_properties
    from shared.remediation.replace import pool_body

    aks, cluster = access.aks(), cid(sim, "ml-train")
    pool = aks.get_pool(cluster, "gput4")
    assert pool is not None
    mark = wire.mark()
    aks.begin_put_pool(cluster, "gput4", pool_body(pool, pool.count + 1), etag=pool.etag)
    grown = settled(aks, cluster, "gput4")
    aks.begin_put_pool(cluster, "gput4", {"properties": update_properties(grown, count=pool.count)}, etag=grown.etag)
    settled(aks, cluster, "gput4")
    judged(wire.since(mark), model="AgentPool")
    answers_valid(wire.since(mark), "AgentPool")


# --------------------------------------------------------------------------- pools: delete, machines


def test_deleting_a_pool_sends_no_body_on_the_stable_api_version(sim: SimHandle, access: Any, wire: Wire) -> None:
    aks, cluster = access.aks(), cid(sim, "ml-platform")
    aks.begin_put_pool(cluster, "bodydel", {"vmSize": "Standard_D4s_v5", "count": 1})
    pool = settled(aks, cluster, "bodydel")
    mark = wire.mark()
    aks.begin_delete_pool(cluster, "bodydel", etag=pool.etag, ignore_pdb=True)
    (sent,) = [e for e in wire.since(mark) if e.method == "DELETE"]
    assert sent.body is None and sent.api_version == definitions.STABLE_API_VERSION and sent.status == 202


def test_delete_machines_sends_the_definitions_body(sim: SimHandle, access: Any, wire: Wire) -> None:
    aks, cluster = access.aks(), cid(sim, "ml-train")
    mark = wire.mark()
    machines = aks.list_machines(cluster, "gput4")
    answers_valid(wire.since(mark), "Machine")
    mark = wire.mark()
    aks.begin_delete_machines(cluster, "gput4", [machines[-1].name])
    (sent,) = [e for e in judged(wire.since(mark), model="AgentPoolDeleteMachinesParameter") if e.method == "POST"]
    assert sent.body == {"machineNames": [machines[-1].name]} and sent.status == 202


# --------------------------------------------------------------------------- reads


def test_the_maintenance_configurations_read_is_answered_as_defined(sim: SimHandle, access: Any, wire: Wire) -> None:
    mark = wire.mark()
    configs = access.aks().list_maintenance_configurations(cid(sim, "ml-platform"))
    assert configs
    (sent,) = wire.since(mark)
    assert sent.method == "GET" and sent.body is None and sent.api_version == definitions.STABLE_API_VERSION
    answers_valid([sent], "MaintenanceConfiguration")


def _compute(api_version: str) -> Definitions:
    return sdk_definitions("azure.mgmt.compute", "VirtualMachineScaleSetVMReimageParameters")


def _resource_health(api_version: str) -> Definitions:
    return sdk_definitions("azure.mgmt.resourcehealth", "AvailabilityStatus")


def test_restart_and_reimage_send_what_the_compute_definition_allows(sim: SimHandle, access: Any, wire: Wire) -> None:
    machine = access.aks().list_machines(cid(sim, "ml-train"), "gput4")[0]
    mark = wire.mark()
    access.compute().begin_restart(machine.resource_id)
    access.compute().begin_reimage(machine.resource_id)
    sent = judged(wire.since(mark), model="VirtualMachineScaleSetVMReimageParameters", defs=_compute)
    assert [(e.method, e.path.rsplit("/", 1)[-1], e.status) for e in sent] == [("POST", "restart", 202),
                                                                               ("POST", "reimage", 202)]
    assert sent[0].body is None


def test_the_availability_read_is_answered_as_defined(sim: SimHandle, access: Any, wire: Wire) -> None:
    machine = access.aks().list_machines(cid(sim, "ml-train"), "gput4")[0]
    mark = wire.mark()
    access.compute().get_availability(machine.resource_id)
    (sent,) = wire.since(mark)
    assert sent.method == "GET" and sent.body is None
    assert sent.api_version == _resource_health("").api_version
    answers_valid([sent], "AvailabilityStatus", defs=_resource_health)

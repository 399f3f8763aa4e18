"""Recorded AKS traffic, replayed against the simulator and compared by shape (issue 23).

The Azure CLI records its AKS tests against a live subscription (tests/replay/recordings: which recording, from
which repository and commit). Each exchange the app's operations depend on is sent to the simulator as
recorded (method, path below the cluster, api-version, body), on a scenario with the recording's cluster,
and the answers are compared by shape: the status; the headers that drive a client (``Azure-AsyncOperation``,
``Location``, ``Retry-After``, ``ETag``) present or absent, and an operation URL's api-version; the field
names at every depth (``[]`` for list items); and the values of enum-typed fields (from the api-version's
definition: shared.kernel.definitions) and of ``provisioningState`` and ``status``. Ids, names, times and
other free values are not compared.

:data:`KEPT` is the short list of differences kept on purpose, each with its reason. A difference not in it
fails the test, and so does an entry of it that no longer happens (the list cannot rot).
"""

from __future__ import annotations

import importlib.util
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import sim_as_the_app

RECORDINGS = Path(__file__).resolve().parent / "recordings"
SERVED = ("2025-10-01", "2026-01-02-preview", "2026-07-01", "2026-08-01", "2026-08-02-preview")  # sim.arm.common
STABLE = "2026-08-01"
SUB = "8f2d4c1e-5a3b-4c7d-9e0f-0000000000d3"
RG, CLUSTER, LOCATION = "clitest000001", "cliakstest000002", "westus2"
HEADERS = ("azure-asyncoperation", "location", "retry-after", "etag")
STATE_FIELDS = ("provisioningState", "status")


def recording(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDINGS / name).read_text())
    return data


def exchange(file: str, name: str) -> dict[str, Any]:
    return next(e for e in recording(file)["exchanges"] if e["name"] == name)


# --------------------------------------------------------------------------- shapes


def kind(value: Any) -> str:
    """A JSON value's kind (an int and a float are both numbers in JSON)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", dict: "object", list: "array", type(None): "null"}.get(type(value), type(value).__name__)


def shape(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every path of ``value`` -> its JSON kind, or its value for a state field."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else key
            if key in STATE_FIELDS and isinstance(inner, str):
                out[path] = f"= {inner}"  # the states of a list's items are joined by its caller
            else:
                out[path] = kind(inner)
                out.update(shape(inner, path))
    elif isinstance(value, list):
        for item in value:
            for path, found in shape(item, f"{prefix}[]").items():
                if path in out and str(found).startswith("= ") and str(out[path]).startswith("= "):
                    states = {*str(out[path])[2:].split(", "), str(found)[2:]}
                    found = "= " + ", ".join(sorted(states))
                out[path] = found
    return out


def enum_paths() -> dict[str, str]:
    """Field path (below an AgentPool, Machine or MaintenanceConfiguration body) -> the model it belongs to, for
    every enum-typed property of the stable definition: those values are compared too."""
    from shared.kernel import definitions

    defs = definitions.definitions(definitions.STABLE_API_VERSION)
    found: dict[str, str] = {}
    for root in ("AgentPool", "Machine", "MaintenanceConfiguration"):
        for path, prop in defs.paths(root):
            if prop.type.get("kind") == "enum":
                found[path] = root
    return found


ENUMS = enum_paths()


def enum_values(body: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else k)
        elif isinstance(value, list):
            for v in value:
                walk(v, f"{path}[]")
        elif path.removeprefix("value[].") in ENUMS and isinstance(value, str):
            out.setdefault(path, set()).add(value)

    walk(body, "")
    return out


def header_shape(headers: dict[str, str]) -> dict[str, str]:
    out = {}
    for name in HEADERS:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
        if value is None:
            continue
        if name in ("azure-asyncoperation", "location") and "api-version=" in value:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(value).query)
            out[name] = f"api-version={query.get('api-version', ['?'])[0]}"
        else:
            out[name] = "present"
    return out


def differences(recorded: dict[str, Any], answered: dict[str, Any]) -> set[str]:
    """What differs between a recorded response and the simulator's, as readable strings."""
    out: set[str] = set()
    if recorded["status"] != answered["status"]:
        out.add(f"status {recorded['status']} != {answered['status']}")
    rh, ah = header_shape(recorded["headers"]), header_shape(answered["headers"])
    for name in sorted(set(rh) | set(ah)):
        if rh.get(name) != ah.get(name):
            out.add(f"header {name}: recorded {rh.get(name, 'absent')}, simulator {ah.get(name, 'absent')}")
    rs, as_ = shape(recorded["body"]), shape(answered["body"])
    for path in sorted(set(rs) | set(as_)):
        if path not in as_:
            out.add(f"field {path} only recorded")
        elif path not in rs:
            out.add(f"field {path} only in the simulator")
        elif rs[path] != as_[path]:
            out.add(f"field {path}: recorded {rs[path]}, simulator {as_[path]}")
    re_, ae = enum_values(recorded["body"]), enum_values(answered["body"])
    for path in sorted(set(re_) & set(ae)):
        if re_[path] != ae[path]:
            out.add(f"value {path}: recorded {sorted(re_[path])}, simulator {sorted(ae[path])}")
    return out


#: A managed cluster's answer is compared on the fields the app reads (shared.adapters.aks.cluster_view) and
#: its state: the recorded clusters carry the dozens of profiles ``az aks create`` sets, which the app never
#: reads and the simulator does not model.
CLUSTER_FIELDS = ("id", "name", "location", "properties.provisioningState", "properties.nodeResourceGroup",
                  "properties.agentPoolProfiles[].provisioningState")


def cluster_fields(body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    props = body.get("properties") or {}
    out: dict[str, Any] = {k: body[k] for k in ("id", "name", "location") if k in body}
    kept = {k: props[k] for k in ("provisioningState", "nodeResourceGroup") if k in props}
    if "agentPoolProfiles" in props:
        kept["agentPoolProfiles"] = [{"provisioningState": p.get("provisioningState")}
                                     for p in props["agentPoolProfiles"]]
    return {**out, "properties": kept}


# --------------------------------------------------------------------------- the simulator


def scenario() -> dict[str, Any]:
    legacy = exchange("test_aks_maintenanceconfiguration.json", "put_maintenance_default_legacy_not_allowed_time")
    managed = exchange("test_aks_maintenancewindow.json", "put_maintenance_auto_upgrade_absolute_monthly_no_start_date")
    return {
        "seed": 23, "clock": {"manual": True},
        "timings": {"pool_create_s": 60, "pool_delete_s": 60, "pool_scale_s": 30, "delete_machines_s": 30},
        "subscriptions": [{
            "id": SUB,
            "quotas": [{"location": LOCATION, "family": family, "limit": 1000}
                       for family in ("standardDSv2Family", "standardNCSv3Family", "standardNCASv3_T4Family")],
            "clusters": [
                {"name": CLUSTER, "resource_group": RG, "location": LOCATION, "tags": {"gpu-fleet-steward": "enabled"},
                 "pool_etags": False,  # no pool body of the recordings carries one (2025-05 and before)
                 "maintenance_configurations": {"default": legacy["request"]["body"]["properties"]},
                 "pools": [{"name": "nodepool1", "mode": "System", "vmSize": "Standard_DS2_v2", "count": 3}]},
                {"name": "managedwindows", "resource_group": RG, "location": LOCATION,
                 "maintenance_configurations": {
                     "aksManagedAutoUpgradeSchedule": managed["request"]["body"]["properties"]},
                 "pools": [{"name": "nodepool1", "mode": "System", "vmSize": "Standard_DS2_v2", "count": 1}]},
            ],
        }],
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=scenario()) as handle:
        yield handle


def send(sim: SimHandle, method: str, uri: str, body: Any = None, *, cluster: str = CLUSTER,
         pool: tuple[str, str] | None = None) -> dict[str, Any]:
    """The recorded request, on the simulator's subscription and cluster (and ``pool``: recorded name -> the
    scenario's); its answer as a recording has it."""
    parts = urllib.parse.urlsplit(uri)
    segments = parts.path.split("/")
    for i, segment in enumerate(segments):
        if i and segments[i - 1].lower() == "subscriptions":
            segments[i] = SUB
        elif i and segments[i - 1].lower() == "managedclusters":
            segments[i] = cluster
        elif i and segments[i - 1].lower() == "agentpools" and pool is not None and segment == pool[0]:
            segments[i] = pool[1]
    path = "/".join(segments)
    query = dict(urllib.parse.parse_qsl(parts.query))
    if "/providers/Microsoft.ContainerService/locations/" not in path and query.get("api-version") not in SERVED:
        # A version the simulator does not serve (the CLI's older previews): the app's own stable one instead.
        query["api-version"] = STABLE
    url = f"{sim.endpoints['arm_endpoint'].rstrip('/')}{path}?{urllib.parse.urlencode(query)}"
    token = sim.token("https://management.azure.com/")
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=sim.ca_bundle)
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            status, headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, dict(error.headers), error.read()
    return {"status": status, "headers": headers, "body": json.loads(raw) if raw.strip() else None}


def advance(sim: SimHandle, seconds: float) -> None:
    sim.control("POST", "/advance", {"seconds": seconds})


def operation_url(answer: dict[str, Any], header: str = "azure-asyncoperation") -> str:
    found = next((v for k, v in answer["headers"].items() if k.lower() == header), None)
    assert found is not None, f"no {header} header to follow in {answer['status']} {answer['body']}"
    return found


# --------------------------------------------------------------------------- what is kept on purpose

#: (exchange, difference) -> why it is kept. The simulator creates no cluster (its clusters come from the
#: scenario), so the recorded abort of a cluster *create* is replayed as the abort of a pool create in a running
#: cluster: the cluster itself and its other pool were never busy, and only the pool being created is Canceled.
_ABORTED_CREATE = ("the recording aborts a cluster create (every pool Creating, then Canceled); the simulator creates no "
                   "cluster, so the replay aborts a pool create in a running cluster: only that pool is Canceled")
KEPT: dict[tuple[str, str], str] = {
    ("test_aks_abort:abort_cluster", "field properties.provisioningState: recorded = Creating, simulator = Succeeded"):
        _ABORTED_CREATE,
    ("test_aks_abort:abort_cluster",
     "field properties.agentPoolProfiles[].provisioningState: recorded = Creating, simulator = Creating, Succeeded"):
        _ABORTED_CREATE,
    ("test_aks_abort:get_cluster_canceled",
     "field properties.agentPoolProfiles[].provisioningState: recorded = Canceled, simulator = Canceled, Succeeded"):
        _ABORTED_CREATE,
}


# --------------------------------------------------------------------------- the replay


def replay(sim: SimHandle) -> dict[str, set[str]]:
    """Every exchange the app depends on, in the recordings' order; name -> its differences."""
    found: dict[str, set[str]] = {}

    def check(file: str, name: str, answered: dict[str, Any]) -> None:
        recorded = exchange(file, name)["response"]
        if "_cluster" in name and recorded["status"] < 300:
            recorded = {**recorded, "body": cluster_fields(recorded["body"])}
            answered = {**answered, "body": cluster_fields(answered["body"])}
        found[f"{file.removesuffix('.json')}:{name}"] = differences(recorded, answered)

    def replay_as_recorded(file: str, name: str, *, cluster: str = CLUSTER,
                           pool: tuple[str, str] | None = None) -> dict[str, Any]:
        req = exchange(file, name)["request"]
        answered = send(sim, req["method"], req["uri"], req["body"], cluster=cluster, pool=pool)
        check(file, name, answered)
        return answered

    gpu = "test_aks_create_gpu_driver_flow.json"
    missing = exchange(gpu, "get_cluster_404")["request"]
    check(gpu, "get_cluster_404", send(sim, "GET", missing["uri"], cluster="nosuchcluster"))
    replay_as_recorded(gpu, "get_cluster_succeeded")
    listed = replay_as_recorded(gpu, "list_agentpools")
    next_link = (listed["body"] or {}).get("nextLink")
    if next_link:
        check(gpu, "list_agentpools_next_page_empty", send(sim, "GET", next_link))
    created = replay_as_recorded(gpu, "put_agentpool_create_gpu_driver_none")
    check("test_aks_abort.json", "poll_operation_inprogress", send(sim, "GET", operation_url(created)))
    advance(sim, 120)
    check("test_aks_abort.json", "poll_operation_succeeded", send(sim, "GET", operation_url(created)))
    replay_as_recorded(gpu, "get_agentpool_gpu_driver_none")
    replay_as_recorded(gpu, "list_agentpools_with_gpu_pool")

    machines = "test_aks_nodepool_delete_machines.json"
    replay_as_recorded("test_aks_machine_cmds.json", "list_machines", pool=("c000003", "nodepool1"))
    listing = replay_as_recorded(machines, "list_machines", pool=("c000003", "nodepool1"))
    names = [m["name"] for m in (listing["body"] or {}).get("value", [])][:1]
    deleted = send(sim, "POST", exchange(machines, "delete_machines")["request"]["uri"], {"machineNames": names},
                   pool=("c000003", "nodepool1"))
    check(machines, "delete_machines", deleted)
    advance(sim, 60)
    check(machines, "get_operationresult_204", send(sim, "GET", operation_url(deleted, "location")))

    deleting = replay_as_recorded(gpu, "delete_agentpool")
    advance(sim, 120)
    del deleting

    maintenance = "test_aks_maintenanceconfiguration.json"
    replay_as_recorded(maintenance, "get_maintenance_default_legacy")
    windows = "test_aks_maintenancewindow.json"
    replay_as_recorded(windows, "get_maintenance_auto_upgrade", cluster="managedwindows")

    aborts = "test_aks_abort.json"
    pool = exchange(gpu, "put_agentpool_create_gpu_driver_install")
    replay_as_recorded(gpu, "put_agentpool_create_gpu_driver_install")
    aborted = replay_as_recorded(aborts, "abort_cluster")
    advance(sim, 10)
    check(aborts, "poll_operation_succeeded", send(sim, "GET", operation_url(aborted)))
    check(aborts, "get_cluster_canceled", send(sim, "GET", exchange(aborts, "get_cluster_canceled")["request"]["uri"]))
    del pool
    return found


def test_every_recorded_exchange_the_app_depends_on_is_answered_alike_but_for_the_kept_differences(
        sim: SimHandle) -> None:
    found = replay(sim)
    unexplained = {f"{name}: {d}" for name, diffs in found.items() for d in diffs if (name, d) not in KEPT}
    stale = {f"{name}: {d}" for (name, d) in KEPT if d not in found.get(name, set())}
    assert not unexplained, "differences from recorded AKS traffic:\n" + "\n".join(sorted(unexplained))
    assert not stale, "kept differences that no longer happen (remove them):\n" + "\n".join(sorted(stale))

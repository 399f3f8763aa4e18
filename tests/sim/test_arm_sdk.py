"""The real SDKs work unchanged against the simulator over HTTPS: azure-mgmt-containerservice and
azure-mgmt-compute (with their LRO pollers), ManagedIdentityCredential, EventGridPublisherClient.

One simulator (sim.core.server.SimServer, in-process threads, clock x200) is shared by the module.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError
from azure.core.messaging import CloudEvent
from azure.eventgrid._legacy import EventGridPublisherClient
from azure.identity import ManagedIdentityCredential
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.containerservice import ContainerServiceClient
from azure.mgmt.containerservice import models as m

from sim.arm.api import ArmApi
from sim.core.certs import make_certs
from sim.core.http import Headers, Request
from sim.core.server import SimServer
from sim.model import Fleet, SimClock
from tests.waiting import wait_until

SUB = "00000000-0000-0000-0000-00000000beef"
RG = "rg-gpu"
CLUSTER = "c1"
CLIENT_ID = "11111111-2222-3333-4444-555555555555"
ARM_SCOPE = "https://management.azure.com/.default"
T4 = "Standard_NC4as_T4_v3"
SPEED = 200.0
# AKS sends no Retry-After on its operations (tests/replay/recordings, README finding 4), so neither does the
# simulator by default; without one the SDK poller sleeps its polling_interval (30 s): the clients here poll fast.
POLL_S = 0.05

pytestmark = pytest.mark.timeout(60)


class Sim:
    def __init__(self, fleet: Fleet, server: SimServer, ca: Path) -> None:
        self.fleet = fleet
        self.server = server
        self.ca = str(ca)
        self.cluster = fleet.clusters[next(iter(fleet.clusters))]

    @property
    def arm(self) -> str:
        return self.server.base_url

    def aks(self, credential: Any = None, **options: Any) -> ContainerServiceClient:
        options.setdefault("polling_interval", POLL_S)
        return ContainerServiceClient(credential or self.credential(), SUB, base_url=self.arm,
                                      credential_scopes=[ARM_SCOPE], connection_verify=self.ca, **options)

    def compute(self) -> ComputeManagementClient:
        return ComputeManagementClient(self.credential(), SUB, base_url=self.arm, credential_scopes=[ARM_SCOPE],
                                       connection_verify=self.ca)

    def credential(self) -> ManagedIdentityCredential:
        return ManagedIdentityCredential(client_id=CLIENT_ID)

    def control(self, method: str, path: str, payload: Any = None) -> Any:
        req = urllib.request.Request(f"{self.arm}/_sim{path}", method=method,
                                     data=json.dumps(payload).encode() if payload is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=self.ca)) as resp:
            return json.loads(resp.read() or b"null")

    def add_fault(self, rule: dict[str, Any]) -> None:
        self.fleet.faults.add(rule)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    state = tmp_path_factory.mktemp("sim")
    fleet = Fleet(seed=11, clock=SimClock(speed=SPEED))
    fleet.add_cluster(subscription=SUB, resource_group=RG, name=CLUSTER, tags={"gpu-fleet-steward": "enabled"},
                      node_provisioning_mode="Manual")
    fleet.add_cluster(subscription=SUB, resource_group="rg-other", name="c2")
    cluster = fleet.cluster(SUB, RG, CLUSTER)
    assert cluster is not None
    cluster.maintenance_configurations["default"] = {"timeInWeek": [{"day": "Sunday", "hourSlots": [1, 2]}]}
    # The system pool, created as ARM would (in-process, before the listeners start).
    api = ArmApi(fleet)
    token = fleet.tokens.issue(ARM_SCOPE)[0]
    body = json.dumps({"properties": {"vmSize": "Standard_D4s_v5", "count": 2, "mode": "System"}}).encode()
    resp = api.handle(Request("PUT", f"{cluster.id}/agentPools/sys?api-version=2026-08-01",
                              Headers({"Authorization": f"Bearer {token}", "Host": "x"}), body))
    assert resp.status == 201
    fleet.advance(120)
    certs = make_certs(state)
    fleet.ca_pem = certs.ca.read_bytes()
    server = SimServer(fleet, certs)
    server.start()
    saved = {k: os.environ.get(k) for k in ("IDENTITY_ENDPOINT", "IDENTITY_HEADER", "MSI_ENDPOINT", "MSI_SECRET",
                                             "IDENTITY_SERVER_THUMBPRINT")}
    for k in saved:
        os.environ.pop(k, None)
    os.environ["IDENTITY_ENDPOINT"] = f"http://127.0.0.1:{server.http_port}/msi/token"
    os.environ["IDENTITY_HEADER"] = fleet.identity_header
    try:
        yield Sim(fleet, server, certs.ca)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def managed_t4(count: int = 1) -> m.AgentPool:
    return m.AgentPool(properties=m.ManagedClusterAgentPoolProfileProperties(
        vm_size=T4, count=count, mode="User", os_type="Linux",
        gpu_profile=m.GPUProfile(driver="Install", nvidia=m.NvidiaGPUProfile(management_mode="Managed"))))


def code_of(exc: HttpResponseError) -> str:
    return exc.error.code if exc.error is not None else ""


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize("scope", [ARM_SCOPE, "6dae42f8-4368-4678-94ff-3960e28e3630/.default",
                                   "https://eventgrid.azure.net/.default", "https://storage.azure.com/.default"],
                         ids=["arm", "aks-server-app", "eventgrid", "storage"])
def test_managed_identity_credential_gets_a_token_for_every_audience(sim: Sim, scope: str) -> None:
    token = sim.credential().get_token(scope)
    audience = scope.removesuffix("/.default")
    assert sim.fleet.tokens.verify(token.token, (audience,)).status == 200


def test_a_wrong_identity_secret_fails_the_credential(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDENTITY_HEADER", "wrong")
    with pytest.raises(ClientAuthenticationError):
        ManagedIdentityCredential(client_id=CLIENT_ID).get_token(ARM_SCOPE)


# --------------------------------------------------------------------------- managed clusters


def test_clusters_are_listed_and_read_with_tags_and_node_resource_group(sim: Sim) -> None:
    client = sim.aks()
    assert sorted(c.name for c in client.managed_clusters.list()) == ["c1", "c2"]
    assert [c.name for c in client.managed_clusters.list_by_resource_group(RG)] == ["c1"]
    cluster = client.managed_clusters.get(RG, CLUSTER)
    assert cluster.tags == {"gpu-fleet-steward": "enabled"}
    assert cluster.properties.node_resource_group == sim.cluster.node_resource_group
    assert cluster.properties.node_provisioning_profile.mode == "Manual"


def test_an_unknown_cluster_is_resource_not_found(sim: Sim) -> None:
    # the app's identity may read the resource group (main.bicep accessResourceGroupIds); with its role
    # on the clusters only, ARM would answer 403 AuthorizationFailed before the RP looks (issue 11)
    sim.fleet.arm_access_resource_groups = {f"/subscriptions/{SUB}/resourceGroups/{RG}"}
    try:
        with pytest.raises(ResourceNotFoundError):
            sim.aks().managed_clusters.get(RG, "nope")
    finally:
        sim.fleet.arm_access_resource_groups = set()
    with pytest.raises(HttpResponseError) as caught:
        sim.aks().managed_clusters.get(RG, "nope")
    assert (caught.value.status_code, code_of(caught.value)) == (403, "AuthorizationFailed")


def test_a_token_for_the_wrong_audience_is_refused_by_arm(sim: Sim) -> None:
    client = ContainerServiceClient(sim.credential(), SUB, base_url=sim.arm, connection_verify=sim.ca,
                                    credential_scopes=["https://eventgrid.azure.net/.default"], retry_total=0)
    with pytest.raises(HttpResponseError) as caught:
        client.managed_clusters.get(RG, CLUSTER)
    assert (caught.value.status_code, code_of(caught.value)) == (401, "InvalidAuthenticationTokenAudience")


def test_maintenance_configurations_are_listed_and_read(sim: Sim) -> None:
    client = sim.aks()
    assert [c.name for c in client.maintenance_configurations.list_by_managed_cluster(RG, CLUSTER)] == ["default"]
    assert client.maintenance_configurations.get(RG, CLUSTER, "default").properties.time_in_week[0].day == "Sunday"


def test_the_user_kubeconfig_reaches_the_simulated_api_server_with_an_aks_token(sim: Sim) -> None:
    from kubernetes import client as kclient

    creds = sim.aks().managed_clusters.list_cluster_user_credentials(RG, CLUSTER, format="exec")
    config = yaml.safe_load(base64.b64decode(creds.kubeconfigs[0].value) if isinstance(creds.kubeconfigs[0].value, str)
                            else bytes(creds.kubeconfigs[0].value))
    entry = config["clusters"][0]["cluster"]
    ca_file = Path(sim.ca).parent / "kubeconfig-ca.pem"
    ca_file.write_bytes(base64.b64decode(entry["certificate-authority-data"]))
    configuration = kclient.Configuration()
    configuration.host = entry["server"]
    configuration.ssl_ca_cert = str(ca_file)
    token = sim.credential().get_token("6dae42f8-4368-4678-94ff-3960e28e3630/.default").token
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with kclient.ApiClient(configuration) as api:
        nodes = kclient.CoreV1Api(api).list_node(label_selector="agentpool=sys")
    assert len(nodes.items) == 2


# --------------------------------------------------------------------------- agent pools through the pollers


def test_a_managed_gpu_pool_is_created_scaled_and_deleted_through_the_sdk_pollers(sim: Sim) -> None:
    client = sim.aks()
    created = client.agent_pools.begin_create_or_update(RG, CLUSTER, "gpu1", managed_t4(1)).result()
    assert created.properties.provisioning_state == "Succeeded"
    assert created.properties.gpu_profile.nvidia.management_mode == "Managed"
    assert len(sim.cluster.pool_nodes("gpu1")) == 1

    pool = client.agent_pools.get(RG, CLUSTER, "gpu1")
    pool.properties.count = 2
    scaled = client.agent_pools.begin_create_or_update(RG, CLUSTER, "gpu1", pool).result()
    assert (scaled.properties.count, scaled.properties.provisioning_state) == (2, "Succeeded")
    assert len(sim.cluster.pool_nodes("gpu1")) == 2

    machines = list(client.machines.list(RG, CLUSTER, "gpu1"))
    assert [x.name for x in machines] == [n.name for n in sim.cluster.pool_nodes("gpu1")]
    assert client.machines.get(RG, CLUSTER, "gpu1", machines[0].name).properties.resource_id.endswith("/0")
    client.agent_pools.begin_delete_machines(
        RG, CLUSTER, "gpu1", m.AgentPoolDeleteMachinesParameter(machine_names=[machines[0].name])).result()
    assert [n.name for n in sim.cluster.pool_nodes("gpu1")] == [machines[1].name]
    assert client.agent_pools.get(RG, CLUSTER, "gpu1").properties.count == 1

    client.agent_pools.begin_delete(RG, CLUSTER, "gpu1").result()
    with pytest.raises(ResourceNotFoundError):
        client.agent_pools.get(RG, CLUSTER, "gpu1")
    assert sim.cluster.pool_nodes("gpu1") == []


def test_a_mig_pool_is_created_with_the_preview_api_version_and_a_raw_body(sim: Sim) -> None:
    client = sim.aks(api_version="2026-08-02-preview")
    body = {"properties": {"vmSize": "Standard_ND96asr_v4", "count": 1, "mode": "User", "gpuProfile": {
        "driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single", "migProfiles": ["MIG3g"]}}}}
    pool = client.agent_pools.begin_create_or_update(RG, CLUSTER, "mig", m.AgentPool(body)).result()
    assert pool["properties"]["gpuProfile"]["nvidia"]["migStrategy"] == "Single"
    stable = sim.aks().agent_pools.get(RG, CLUSTER, "mig")
    assert "migStrategy" not in stable["properties"]["gpuProfile"]["nvidia"]
    client.agent_pools.begin_delete(RG, CLUSTER, "mig").result()


@pytest.mark.parametrize(("name", "props", "status", "code"), [
    pytest.param("GPU", {"vmSize": T4, "count": 1}, 400, "InvalidParameter", id="bad-name"),
    pytest.param("cpu", {"vmSize": "Standard_D4s_v5", "count": 1,
                         "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}, 400, "InvalidParameter",
                 id="nvidia-on-cpu"),
    pytest.param("win", {"vmSize": T4, "count": 1, "osType": "Windows",
                         "gpuProfile": {"nvidia": {"managementMode": "Managed"}}}, 400, "InvalidParameter",
                 id="managed-on-windows"),
])
def test_rule_violations_surface_as_http_response_errors_with_the_arm_code(sim: Sim, name: str, props: dict[str, Any],
                                                                           status: int, code: str) -> None:
    with pytest.raises(HttpResponseError) as caught:
        sim.aks().agent_pools.begin_create_or_update(RG, CLUSTER, name, m.AgentPool({"properties": props}))
    assert (caught.value.status_code, code_of(caught.value)) == (status, code)


def test_immutable_changes_and_concurrent_writes_are_refused_through_the_sdk(sim: Sim) -> None:
    client = sim.aks()
    client.agent_pools.begin_create_or_update(RG, CLUSTER, "imm", managed_t4(1), polling=False)
    with pytest.raises(HttpResponseError) as busy:
        client.agent_pools.begin_create_or_update(RG, CLUSTER, "imm", managed_t4(1))
    assert (busy.value.status_code, code_of(busy.value)) == (409, "OperationNotAllowed")
    _wait_state(sim, "imm", "Succeeded")
    pool = client.agent_pools.get(RG, CLUSTER, "imm")
    pool.properties.gpu_profile.nvidia.management_mode = "Unmanaged"
    with pytest.raises(HttpResponseError) as immutable:
        client.agent_pools.begin_create_or_update(RG, CLUSTER, "imm", pool)
    assert (immutable.value.status_code, code_of(immutable.value)) == (400, "PropertyChangeNotAllowed")
    client.agent_pools.begin_delete(RG, CLUSTER, "imm").result()


def test_quota_exceeded_and_allocation_failed_reach_the_caller(sim: Sim) -> None:
    client = sim.aks()
    sim.control("POST", "/quota", {"subscription": SUB, "location": "eastus", "family": "standardNDASv4_A100Family",
                                   "limit": 96})
    big = m.AgentPool({"properties": {"vmSize": "Standard_ND96asr_v4", "count": 2, "mode": "User"}})
    with pytest.raises(HttpResponseError) as quota:
        client.agent_pools.begin_create_or_update(RG, CLUSTER, "a100", big)
    assert code_of(quota.value) == "ErrCode_InsufficientVCPUQuota"  # AKS's pre-flight

    sim.fleet.capacity[("eastus", "Standard_NC8as_T4_v3")] = 0
    none_left = m.AgentPool({"properties": {"vmSize": "Standard_NC8as_T4_v3", "count": 1, "mode": "User"}})
    poller = client.agent_pools.begin_create_or_update(RG, CLUSTER, "nocap", none_left)
    with pytest.raises(HttpResponseError) as allocation:
        poller.result()
    assert "AllocationFailed" in str(allocation.value)
    assert client.agent_pools.get(RG, CLUSTER, "nocap").properties.provisioning_state == "Failed"
    client.agent_pools.begin_delete(RG, CLUSTER, "nocap").result()


def test_an_injected_lro_failure_fails_the_poller(sim: Sim) -> None:
    sim.add_fault({"target": "lro", "path": "agentPools/flaky$", "code": "InternalOperationError",
                   "message": "boom", "count": 1})
    poller = sim.aks().agent_pools.begin_create_or_update(RG, CLUSTER, "flaky", managed_t4(1))
    with pytest.raises(HttpResponseError, match="InternalOperationError"):
        poller.result()
    sim.aks().agent_pools.begin_delete(RG, CLUSTER, "flaky").result()


def test_the_pool_list_pager_follows_the_next_link_and_sees_every_pool_once(sim: Sim) -> None:
    # the first page carries a nextLink whose page is empty (recorded: test_aks_create_gpu_driver_flow.json
    # list_agentpools / list_agentpools_next_page_empty)
    names = [p.name for p in sim.aks().agent_pools.list(RG, CLUSTER)]
    assert names == sorted(sim.cluster.pools) and len(names) == len(set(names))


class OwnerCredential:
    """The subscriptions' owner (a harness token): the app's own role holds no abort action."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        token, expires = self.fleet.tokens.issue(ARM_SCOPE)[:2]
        return AccessToken(token, int(expires))


def test_an_abort_through_the_sdk_poller_leaves_the_pool_canceled_without_its_scale(sim: Sim) -> None:
    client = sim.aks(OwnerCredential(sim.fleet))
    client.agent_pools.begin_create_or_update(RG, CLUSTER, "abrt", managed_t4(1)).result()
    pool = client.agent_pools.get(RG, CLUSTER, "abrt")
    pool.properties.count = 3
    client.agent_pools.begin_create_or_update(RG, CLUSTER, "abrt", pool, polling=False)
    client.agent_pools.begin_abort_latest_operation(RG, CLUSTER, "abrt").result()
    after = client.agent_pools.get(RG, CLUSTER, "abrt")
    assert (after.properties.provisioning_state, after.properties.count) == ("Canceled", 1)
    assert len(sim.cluster.pool_nodes("abrt")) == 1
    client.agent_pools.begin_delete(RG, CLUSTER, "abrt").result()


# --------------------------------------------------------------------------- compute


@pytest.mark.parametrize("action", ["restart", "reimage"])
def test_vmss_vm_restart_and_reimage_complete_through_the_compute_poller(sim: Sim, action: str) -> None:
    pool = sim.cluster.pools["sys"]
    vmss = sim.cluster.vmss_name(pool)
    node = sim.cluster.pool_nodes("sys")[0]
    vms = sim.compute().virtual_machine_scale_set_vms
    poller = getattr(vms, f"begin_{action}")(sim.cluster.node_resource_group, vmss, str(node.instance_id))
    assert not node.ready
    poller.result()
    assert any(r.get("node") == node.name and r.get("rung") == action for r in sim.fleet.oracles.repairs)


def test_a_vm_action_on_an_unknown_instance_is_not_found(sim: Sim) -> None:
    vmss = sim.cluster.vmss_name(sim.cluster.pools["sys"])
    with pytest.raises(ResourceNotFoundError):
        sim.compute().virtual_machine_scale_set_vms.begin_restart(sim.cluster.node_resource_group, vmss, "999")


# --------------------------------------------------------------------------- faults seen by the SDK


@pytest.mark.parametrize("rule", [
    pytest.param({"status": 429, "retry_after": 0.2}, id="throttled"),
    pytest.param({"status": 503}, id="unavailable"),
    pytest.param({"status": 500}, id="internal-error"),
    pytest.param({"drop": True}, id="dropped-connection"),
])
def test_the_sdk_retries_through_transient_faults(sim: Sim, rule: dict[str, Any]) -> None:
    before = len(sim.fleet.faults.fired)
    sim.add_fault({"target": "arm", "method": "GET", "path": "/managedClusters/c2$", "count": 1, **rule})
    cluster = sim.aks(retry_backoff_factor=0.05).managed_clusters.get("rg-other", "c2")
    assert cluster.name == "c2"
    assert len(sim.fleet.faults.fired) == before + 1


def test_a_429_reaches_a_caller_that_does_not_retry_with_its_retry_after(sim: Sim) -> None:
    sim.add_fault({"target": "arm", "method": "GET", "path": "/managedClusters/c2$", "count": 1, "status": 429,
                   "retry_after": 7})
    with pytest.raises(HttpResponseError) as caught:
        sim.aks(retry_total=0).managed_clusters.get("rg-other", "c2")
    assert caught.value.status_code == 429
    assert caught.value.response.headers["Retry-After"] == "7"


# --------------------------------------------------------------------------- Event Grid
# For a basic topic the public EventGridPublisherClient builds its inner (legacy) client without the
# keyword arguments (connection_verify, retry_total). These simulator tests use the inner client
# for brevity; the app uses the public client and passes those per send (shared/adapters/events.py,
# tests/integration/test_events_public_client.py).


def _published_ids(sim: Sim) -> list[str]:
    with sim.fleet.lock:
        return [e["id"] for _, e in sim.fleet.eventgrid_state.events]


def test_the_publisher_sends_cloud_events_with_a_managed_identity_token(sim: Sim) -> None:
    client = EventGridPublisherClient(f"{sim.arm}/eventgrid/api/events", sim.credential(), connection_verify=sim.ca)
    event = CloudEvent(source="/gpu-fleet-steward", type="Steward.Remediation.Admitted", data={"node": "n1"},
                       subject="/clusters/c1")
    client.send([event])
    assert event.id in _published_ids(sim)


def test_the_publisher_sends_with_the_topic_key(sim: Sim) -> None:
    client = EventGridPublisherClient(f"{sim.arm}/eventgrid/api/events", AzureKeyCredential(sim.fleet.eventgrid_key),
                                      connection_verify=sim.ca)
    event = CloudEvent(source="/gpu-fleet-steward", type="Steward.Breaker.Opened", data={})
    client.send(event)
    assert event.id in _published_ids(sim)


def test_the_publisher_sees_401_for_a_wrong_key_and_413_for_a_huge_batch(sim: Sim) -> None:
    wrong = EventGridPublisherClient(f"{sim.arm}/eventgrid/api/events", AzureKeyCredential("nope"),
                                     connection_verify=sim.ca)
    with pytest.raises(ClientAuthenticationError):
        wrong.send(CloudEvent(source="/s", type="t", data={}))
    client = EventGridPublisherClient(f"{sim.arm}/eventgrid/api/events", sim.credential(), connection_verify=sim.ca,
                                      retry_total=0)
    with pytest.raises(HttpResponseError) as caught:
        client.send([CloudEvent(source="/s", type="t", data="x" * 300_000) for _ in range(4)])
    assert caught.value.status_code == 413


def _wait_state(sim: Sim, pool: str, state: str, timeout_s: float = 10.0) -> None:
    def reached() -> bool:
        with sim.fleet.lock:
            p = sim.cluster.pools.get(pool)
            return p is not None and p.provisioning_state == state

    wait_until(reached, timeout=timeout_s, interval=0.02, what=f"pool {pool} to reach {state}")

"""The whole chain through a real ``python -m sim serve`` process, configured only by endpoints.json:
managed identity -> ARM (with a scenario fault) -> pool LRO -> kubeconfig -> the simulated API server."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from azure.identity import ManagedIdentityCredential
from azure.mgmt.containerservice import ContainerServiceClient
from azure.mgmt.containerservice import models as m

from sim.testing import SimHandle, start_sim

SUB = "8f2d4c1e-5a3b-4c7d-9e0f-0000000000aa"
CLIENT_ID = "11111111-2222-3333-4444-555555555555"
SCENARIO: dict[str, Any] = {
    "seed": 3,
    "clock": {"speed": 100.0},
    # AKS sends no Retry-After on its operations; a scenario may ask for one so SDK pollers poll fast (a harness
    # convenience, sim/arm/lro.py): this module's poller relies on it, no polling_interval given.
    "timings": {"lro_retry_after_s": 1},
    "subscriptions": [{
        "id": SUB,
        "quotas": [{"location": "eastus", "family": "standardNCASv3_T4Family", "limit": 8}],
        "clusters": [{"name": "c1", "resource_group": "rg1", "location": "eastus",
                      "tags": {"gpu-fleet-steward": "enabled"},
                      "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 2}]}],
    }],
    "faults": [{"target": "arm", "method": "GET", "path": "/managedClusters$", "status": 429, "retry_after": 1,
                "count": 1}],
}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=3) as handle:
        yield handle


@pytest.fixture(scope="module")
def credential(sim: SimHandle) -> Iterator[ManagedIdentityCredential]:
    saved = {k: os.environ.get(k) for k in ("IDENTITY_ENDPOINT", "IDENTITY_HEADER")}
    os.environ["IDENTITY_ENDPOINT"] = sim.endpoints["identity_endpoint"]
    os.environ["IDENTITY_HEADER"] = sim.endpoints["identity_header"]
    try:
        yield ManagedIdentityCredential(client_id=CLIENT_ID)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def aks(sim: SimHandle, credential: ManagedIdentityCredential) -> ContainerServiceClient:
    return ContainerServiceClient(credential, SUB, base_url=sim.endpoints["arm_endpoint"],
                                  credential_scopes=[sim.endpoints["arm_audience"] + ".default"],
                                  connection_verify=sim.ca_bundle, retry_backoff_factor=0.1)


def test_a_scenario_throttle_is_retried_by_the_sdk_and_recorded(sim: SimHandle, aks: ContainerServiceClient) -> None:
    clusters = list(aks.managed_clusters.list())
    assert [c.name for c in clusters] == ["c1"]
    fired = sim.control("GET", "/faults")["fired"]
    assert [(f["target"], f["status"]) for f in fired] == [("arm", 429)]


def test_a_pool_created_through_the_poller_has_nodes_on_the_simulated_api_server(
        sim: SimHandle, aks: ContainerServiceClient, credential: ManagedIdentityCredential, tmp_path: Path) -> None:
    from kubernetes import client as kclient

    body = m.AgentPool(properties=m.ManagedClusterAgentPoolProfileProperties(
        vm_size="Standard_NC4as_T4_v3", count=2, mode="User",
        gpu_profile=m.GPUProfile(driver="Install", nvidia=m.NvidiaGPUProfile(management_mode="Managed"))))
    pool = aks.agent_pools.begin_create_or_update("rg1", "c1", "gput4", body).result()
    assert pool.properties.provisioning_state == "Succeeded"

    creds = aks.managed_clusters.list_cluster_user_credentials("rg1", "c1", format="exec")
    raw = creds.kubeconfigs[0].value
    config = yaml.safe_load(bytes(raw) if not isinstance(raw, str) else base64.b64decode(raw))
    entry = config["clusters"][0]["cluster"]
    assert entry["server"] == sim.cluster("c1")["kube_server"]
    assert "certificate-authority-data" in entry, "the simulator CA must be in the kubeconfig (fleet.ca_pem)"
    ca = tmp_path / "ca.pem"
    ca.write_bytes(base64.b64decode(entry["certificate-authority-data"]))
    configuration = kclient.Configuration()
    configuration.host = entry["server"]
    configuration.ssl_ca_cert = str(ca)
    token = credential.get_token("6dae42f8-4368-4678-94ff-3960e28e3630/.default").token
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with kclient.ApiClient(configuration) as api:
        nodes = kclient.CoreV1Api(api).list_node(label_selector="kubernetes.azure.com/agentpool=gput4")
    assert len(nodes.items) == 2
    assert all(n.metadata.labels.get("kubernetes.azure.com/dcgm-exporter") == "enabled" for n in nodes.items)


def test_the_scenario_quota_refuses_more_t4_vcpus_than_the_limit(aks: ContainerServiceClient) -> None:
    from azure.core.exceptions import HttpResponseError

    body = m.AgentPool({"properties": {"vmSize": "Standard_NC4as_T4_v3", "count": 3, "mode": "User"}})
    with pytest.raises(HttpResponseError) as caught:
        aks.agent_pools.begin_create_or_update("rg1", "c1", "more", body)
    assert caught.value.error is not None and caught.value.error.code == "ErrCode_InsufficientVCPUQuota"

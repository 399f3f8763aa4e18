"""The real adapters (ARM, Compute, Kubernetes, Event Grid, identity) against the fleet simulator.

The simulator speaks the real protocols over HTTPS, so these tests run the production code paths
unchanged: the azure-mgmt clients, the kubernetes client, azure-eventgrid and
ManagedIdentityCredential against the simulated managed-identity endpoint. They are skipped only
when the simulator module itself is absent; any other failure fails.
"""

from __future__ import annotations

import importlib.util
import json
import ssl
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.errors import Conflict, Forbidden, Invalid, Throttled, Transient
from shared.settings import Settings

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover - only while the simulator is being written
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app

SCENARIO = "sim/scenarios/default.yaml"
OUT_OF_SCOPE = "research-lab"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario=SCENARIO) as handle:
        yield handle


@pytest.fixture(scope="module")
def settings(sim: SimHandle) -> Settings:
    return app_settings(sim)


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    """Retries sleep on this clock: no test waits for real."""
    return ManualClock()


@pytest.fixture(scope="module")
def access(settings: Settings, clock: ManualClock) -> Any:
    from shared.wiring import FleetAccess

    return FleetAccess(settings, clock=clock)


def cluster_id(sim: SimHandle, name: str) -> str:
    return str(sim.cluster(name)["id"])


def requests_for(sim: SimHandle, fragment: str, method: str = "GET") -> int:
    counts: dict[str, int] = sim.oracles()["requests"]
    return sum(n for route, n in counts.items() if route.startswith(method + " ") and route.endswith(fragment))


def published(sim: SimHandle) -> list[dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=sim.ca_bundle)
    url = sim.endpoints["eventgrid_topic_endpoint"].rsplit("/api/events", 1)[0] + "/_published"
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        doc = json.loads(resp.read())
    return [entry["event"] for entry in doc["events"]]


# --------------------------------------------------------------------------- ARM


def test_discovery_finds_the_tagged_clusters_and_never_the_untagged_one(sim: SimHandle, access: Any) -> None:
    names = [c.name for c in access.clusters()]
    assert OUT_OF_SCOPE not in names
    assert {"ml-platform", "ml-train", "ml-legacy", "ml-nap"} <= set(names)
    nap = next(c for c in access.clusters() if c.name == "ml-nap")
    assert nap.node_provisioning_mode == "Auto"


def test_pools_machines_and_maintenance_configurations_read_as_views(sim: SimHandle, access: Any) -> None:
    from shared.adapters.compute import parse_vmss_vm_id

    aks = access.aks()
    train = cluster_id(sim, "ml-train")
    pools = {p.name: p for p in aks.list_pools(train)}
    assert pools["gput4"].management_mode == "Managed" and pools["gput4"].vm_size == "Standard_NC8as_T4_v3"
    assert aks.get_pool(train, "gput4") == pools["gput4"]
    assert aks.get_pool(train, "nosuchpool") is None
    machines = aks.list_machines(train, "gput4")
    assert len(machines) == pools["gput4"].count
    assert all(parse_vmss_vm_id(m.resource_id)[2].startswith("aks-gput4-") for m in machines)
    configs = aks.list_maintenance_configurations(cluster_id(sim, "ml-platform"))
    assert [c["name"] for c in configs] == ["aksManagedNodeOSUpgradeSchedule"]


def test_an_unknown_cluster_is_forbidden_to_the_app_as_arm_answers(sim: SimHandle, access: Any) -> None:
    # The app's role is assigned on each cluster (infra/app/cluster-access.bicep), not on their resource
    # group: ARM authorizes before the resource provider looks, so a cluster that does not exist (or was
    # deleted, with its role assignments) is AuthorizationFailed "... or the scope is invalid", not 404.
    missing = cluster_id(sim, "ml-train").rsplit("/", 1)[0] + "/does-not-exist"
    with pytest.raises(Forbidden, match=r"AuthorizationFailed .*managedClusters/read.* or the scope is invalid"):
        access.aks().get_cluster(missing)


def test_put_pool_returns_once_arm_accepted_and_keeps_preview_fields(sim: SimHandle, access: Any) -> None:
    aks = access.aks()
    platform = cluster_id(sim, "ml-platform")
    body = {"properties": {"vmSize": "Standard_NC4as_T4_v3", "count": 1, "mode": "User", "osType": "Linux",
                           "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}},
                           "nodeTaints": ["sku=gpu:NoSchedule"]}}
    aks.begin_put_pool(platform, "gpunew", body)
    pool = aks.get_pool(platform, "gpunew")
    assert pool is not None and pool.management_mode == "Managed"
    assert pool.provisioning_state in ("Creating", "Succeeded")
    puts = requests_for(sim, "/agentPools/{}", "PUT")
    assert puts >= 1


def test_an_arm_validation_error_keeps_azures_code(sim: SimHandle, access: Any) -> None:
    with pytest.raises(Invalid) as raised:
        access.aks().begin_put_pool(cluster_id(sim, "ml-platform"), "Bad_Name", {"vmSize": "Standard_NC4as_T4_v3",
                                                                                 "count": 1})
    assert raised.value.code


def test_a_quota_error_is_invalid_with_code_quota_exceeded(sim: SimHandle, access: Any) -> None:
    sim.control("POST", "/faults", {"target": "arm", "method": "PUT", "path": "agentPools/quotapool", "status": 400,
                                    "code": "QuotaExceeded", "count": 1})
    with pytest.raises(Invalid) as raised:
        access.aks().begin_put_pool(cluster_id(sim, "ml-platform"), "quotapool",
                                    {"vmSize": "Standard_NC4as_T4_v3", "count": 1})
    assert raised.value.code == "QuotaExceeded"


def test_throttling_is_retried_after_retry_after_on_the_injected_clock(sim: SimHandle, access: Any,
                                                                       clock: ManualClock) -> None:
    before = requests_for(sim, "/agentPools")
    sim.control("POST", "/faults", {"target": "arm", "method": "GET", "path": "ml-legacy/agentPools$", "status": 429,
                                    "retry_after": 3, "count": 2})
    started = clock.now()
    pools = access.aks().list_pools(cluster_id(sim, "ml-legacy"))
    assert pools
    # two throttled answers, one success, and the empty page its recorded nextLink names (AKS's list carries one
    # even when every pool fits the first page: tests/replay/recordings list_agentpools): no storm
    assert requests_for(sim, "/agentPools") - before == 4
    assert clock.now() - started >= 6.0


def test_persistent_server_errors_surface_as_transient_after_bounded_attempts(sim: SimHandle, access: Any) -> None:
    before = requests_for(sim, "/machines")
    sim.control("POST", "/faults", {"target": "arm", "method": "GET", "path": "ml-train/agentPools/system/machines",
                                    "status": 503, "count": 10})
    with pytest.raises(Transient):
        access.aks().list_machines(cluster_id(sim, "ml-train"), "system")
    assert requests_for(sim, "/machines") - before == 4
    sim.control("DELETE", "/faults")


ANSWERS = [
    ("forbidden", 403, "AuthorizationFailed", Forbidden),
    ("unauthorised", 401, "InvalidAuthenticationToken", Forbidden),
    ("conflict", 409, "OperationNotAllowedOnBusyPool", Conflict),
    ("quota-as-conflict", 409, "QuotaExceeded", Invalid),
    ("validation", 400, "InvalidParameter", Invalid),
]


@pytest.mark.parametrize(("status", "code", "expected"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_arm_answers_are_mapped_and_never_retried(sim: SimHandle, access: Any, status: int, code: str,
                                                  expected: type[Exception]) -> None:
    before = requests_for(sim, "/agentPools/{}")
    sim.control("POST", "/faults", {"target": "arm", "method": "GET", "path": "ml-platform/agentPools/system$",
                                    "status": status, "code": code, "count": 1})
    with pytest.raises(expected) as raised:
        access.aks().get_pool(cluster_id(sim, "ml-platform"), "system")
    assert requests_for(sim, "/agentPools/{}") - before == 1
    if isinstance(raised.value, Invalid):
        assert raised.value.code == code


def test_kubernetes_throttling_is_retried_and_persistent_failure_is_transient(sim: SimHandle, access: Any,
                                                                              clock: ManualClock) -> None:
    kube = access.kube(cluster_id(sim, "ml-platform"))
    sim.control("POST", "/faults", {"target": "kube", "cluster": "ml-platform", "method": "GET", "path": "/nodes$",
                                    "status": 429, "retry_after": 2, "count": 1})
    started = clock.now()
    assert list(kube.list_nodes())
    assert clock.now() - started >= 2.0
    sim.control("POST", "/faults", {"target": "kube", "cluster": "ml-platform", "method": "GET", "path": "/pods$",
                                    "status": 500, "count": 10})
    with pytest.raises(Transient):
        kube.list_pods()
    sim.control("DELETE", "/faults")
    sim.control("POST", "/faults", {"target": "kube", "cluster": "ml-platform", "method": "PATCH", "status": 403,
                                    "count": 1})
    node = next(iter(kube.list_nodes()))
    with pytest.raises(Forbidden):
        kube.patch_node(node.name, {"metadata": {"labels": {"x": "y"}}})
    sim.control("POST", "/faults", {"target": "kube", "cluster": "ml-platform", "method": "GET", "path": "/nodes/",
                                    "status": 401, "count": 1})
    fired = len(sim.oracles()["faults_fired"])
    assert kube.get_node(node.name) is not None  # one 401 (a token revoked early): fresh token, one more try
    assert len(sim.oracles()["faults_fired"]) == fired + 1


def test_compute_restart_is_accepted_for_a_pool_vm(sim: SimHandle, access: Any) -> None:
    train = cluster_id(sim, "ml-train")
    machine = access.aks().list_machines(train, "system")[0]
    access.compute().begin_restart(machine.resource_id)
    assert requests_for(sim, "/restart", "POST") == 1


# --------------------------------------------------------------------------- Kubernetes


def test_kube_access_is_refused_outside_the_scope(sim: SimHandle, access: Any) -> None:
    before = requests_for(sim, "/listClusterUserCredential", "POST")
    with pytest.raises(Forbidden):
        access.kube(cluster_id(sim, OUT_OF_SCOPE))
    assert requests_for(sim, "/listClusterUserCredential", "POST") == before


def test_paginated_node_listing_sees_every_node_once(sim: SimHandle, access: Any) -> None:
    kube = access.kube(cluster_id(sim, "ml-legacy"))
    before = requests_for(sim, "/api/v1/nodes")
    small_pages = [n.name for n in kube.list_nodes(page_size=2)]
    pages_used = requests_for(sim, "/api/v1/nodes") - before
    one_page = [n.name for n in kube.list_nodes(page_size=500)]
    assert sorted(small_pages) == sorted(one_page) and len(set(small_pages)) == len(small_pages)
    assert pages_used == -(-len(one_page) // 2)  # ceil: every page was a separate request
    gpu = [n for n in kube.list_nodes(label_selector="kubernetes.azure.com/agentpool=t4old")]
    assert gpu and all(n.pool == "t4old" for n in gpu)


def test_cordon_through_a_patch_and_read_back(sim: SimHandle, access: Any) -> None:
    kube = access.kube(cluster_id(sim, "ml-train"))
    node = next(iter(kube.list_nodes(label_selector="kubernetes.azure.com/agentpool=system")))
    patched = kube.patch_node(node.name, {"spec": {"unschedulable": True}})
    assert patched.unschedulable
    again = kube.get_node(node.name)
    assert again is not None and again.unschedulable
    kube.patch_node(node.name, {"spec": {"unschedulable": None}})
    assert kube.get_node("no-such-node") is None


def test_eviction_respects_the_pdb_and_reports_gone_pods(sim: SimHandle, access: Any) -> None:
    kube = access.kube(cluster_id(sim, "ml-train"))
    trainers = [p for p in kube.list_pods(namespace="ml") if p.name.startswith("trainer") and p.deletion_timestamp is None]
    assert len(trainers) >= 2
    assert kube.list_pdbs("ml")
    first = kube.evict(trainers[0].namespace, trainers[0].name)
    second = kube.evict(trainers[1].namespace, trainers[1].name)
    assert first.outcome == "evicted"
    assert second.outcome == "blocked" and second.message
    assert kube.evict("ml", "no-such-pod").outcome == "gone"
    assert sim.oracles()["pods_killed_without_eviction"] == []


def test_events_are_best_effort_and_leases_are_exclusive(sim: SimHandle, access: Any) -> None:
    kube = access.kube(cluster_id(sim, "ml-train"))
    node = next(iter(kube.list_nodes()))
    kube.create_event(node=node, reason="StewardTest", message="hello", correlation_id="abc")
    kube.create_event(node="no-such-node" * 30, reason="StewardTest", message="x")  # never raises

    # leases live in the app's own namespace (infra/kubernetes/namespace.yaml, granted by its Role)
    assert kube.acquire_lease("gpu-node-a", holder="me", duration_s=60)
    assert kube.acquire_lease("gpu-node-a", holder="me", duration_s=60)  # renewing is fine
    assert not kube.acquire_lease("gpu-node-a", holder="you", duration_s=60)
    kube.release_lease("gpu-node-a", holder="you")  # not the holder: no effect
    assert not kube.acquire_lease("gpu-node-a", holder="you", duration_s=60)
    kube.release_lease("gpu-node-a", holder="me")
    assert kube.acquire_lease("gpu-node-a", holder="you", duration_s=60)


def test_a_lease_outside_the_apps_namespace_is_forbidden(sim: SimHandle, access: Any) -> None:
    # RBAC is checked before the namespace exists or not matters: the app holds leases in its own
    # namespace only (issue 11: no cluster-wide coordination grant)
    kube = access.kube(cluster_id(sim, "ml-train"))
    for namespace in ("kube-node-lease", "no-such-namespace"):
        with pytest.raises(Forbidden, match=f'cannot get resource "leases" in API group "coordination.k8s.io" '
                                            f'in the namespace "{namespace}"'):
            kube.acquire_lease("gpu-node-b", holder="me", duration_s=60, namespace=namespace)


def test_jobs_are_created_applied_read_and_deleted(sim: SimHandle, access: Any) -> None:
    kube = access.kube(cluster_id(sim, "ml-train"))
    ns = "gpu-fleet-steward"  # the app's own namespace: its Role grants Jobs there only
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gpu-smoke", "namespace": ns},
           "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "smoke", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    created = kube.create_object(job)
    assert created["metadata"]["name"] == "gpu-smoke"
    with pytest.raises(Conflict):
        kube.create_object(job)
    with pytest.raises(Invalid, match="apply_object does not handle batch/v1 Job"):
        kube.apply_object(job)  # Jobs are created, never replaced: no `update` on Jobs is declared or granted
    assert kube.get_object("batch/v1", "Job", "gpu-smoke", ns) is not None
    kube.delete_object("batch/v1", "Job", "gpu-smoke", ns)
    kube.delete_object("batch/v1", "Job", "gpu-smoke", ns)  # already gone: fine
    assert kube.get_object("batch/v1", "Job", "gpu-smoke", ns) is None
    with pytest.raises(Forbidden, match=r'jobs\.batch is forbidden: User ".*" cannot create resource "jobs" in API '
                                        r'group "batch" in the namespace "default"'):
        kube.create_object({**job, "metadata": {"name": "gpu-smoke", "namespace": "default"}})


def test_a_job_delete_with_the_uid_it_read_spares_a_job_that_took_the_name_since(sim: SimHandle, access: Any) -> None:
    kube = access.kube(cluster_id(sim, "ml-train"))
    ns = "gpu-fleet-steward"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gpu-smoke-uid", "namespace": ns},
           "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "smoke", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    first = kube.create_object(job)["metadata"]["uid"]
    kube.delete_object("batch/v1", "Job", "gpu-smoke-uid", ns, uid=first)
    second = kube.create_object(job)["metadata"]["uid"]  # someone else's Job now holds the name
    with pytest.raises(Conflict):
        kube.delete_object("batch/v1", "Job", "gpu-smoke-uid", ns, uid=first)
    assert kube.get_object("batch/v1", "Job", "gpu-smoke-uid", ns)["metadata"]["uid"] == second
    kube.delete_object("batch/v1", "Job", "gpu-smoke-uid", ns, uid=second)
    assert kube.get_object("batch/v1", "Job", "gpu-smoke-uid", ns) is None


def test_karpenter_objects_apply_on_a_nap_cluster(sim: SimHandle, access: Any) -> None:
    kube = access.kube(cluster_id(sim, "ml-nap"))
    node_class = {"apiVersion": "karpenter.azure.com/v1beta1", "kind": "AKSNodeClass", "metadata": {"name": "gpu-managed"},
                  "spec": {"imageFamily": "Ubuntu2204", "tags": {"EnableManagedGPUExperience": "true"}}}
    kube.apply_object(node_class)
    kube.apply_object(node_class)
    stored = kube.get_object("karpenter.azure.com/v1beta1", "AKSNodeClass", "gpu-managed")
    assert stored is not None and stored["spec"]["tags"] == {"EnableManagedGPUExperience": "true"}
    with pytest.raises(Invalid):
        kube.get_object("v1", "ConfigMap", "x", "default")


# --------------------------------------------------------------------------- Event Grid


def test_events_are_published_as_cloudevents_with_our_source(sim: SimHandle, settings: Settings) -> None:
    from shared.adapters.events import EventPublisher
    from shared.adapters.identity import get_credential

    publisher = EventPublisher(get_credential(settings), settings, clock=ManualClock())
    publisher.publish(type_="Steward.PoolRequest.Created", subject="/subscriptions/x/agentPools/gpu",
                      data={"request": "r1"}, id_="evt-1")
    events = [e for e in published(sim) if e.get("id") == "evt-1"]
    assert len(events) == 1
    assert events[0]["source"] == "/gpu-fleet-steward" and events[0]["type"] == "Steward.PoolRequest.Created"
    assert events[0]["data"] == {"request": "r1"} and events[0]["specversion"] == "1.0"


def test_a_throttled_topic_surfaces_as_throttled(sim: SimHandle, settings: Settings) -> None:
    from shared.adapters.events import EventPublisher
    from shared.adapters.identity import get_credential

    sim.control("POST", "/faults", {"target": "eventgrid", "status": 429, "retry_after": 120, "count": 1})
    with pytest.raises(Throttled) as raised:
        EventPublisher(get_credential(settings), settings, clock=ManualClock()).publish(
            type_="Steward.Breaker.Opened", subject="/fleet", data={})
    assert raised.value.retry_after == 120


def test_a_preview_put_carries_mig_strategy_that_the_stable_api_cannot_express(sim: SimHandle, access: Any) -> None:
    # Issue 10 (ARM 3, 5): managed MIG is sent as 2026-08-02-preview documents it (nvidia.migProfiles, no
    # top-level gpuInstanceProfile), and pools are read on that api-version, so the app sees every field.
    aks = access.aks()
    platform = cluster_id(sim, "ml-platform")
    body = {"vmSize": "Standard_ND96asr_v4", "count": 1, "mode": "User", "osType": "Linux",
            "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single",
                                                           "migProfiles": ["MIG3g"]}}}
    aks.begin_put_pool(platform, "migpool", body)  # the body's preview-only fields pick the preview api-version
    sub, rg, name = platform.split("/")[2], platform.split("/")[4], platform.split("/")[-1]
    seen_by_stable = aks._client(sub).agent_pools.get(rg, name, "migpool").as_dict()
    assert "migStrategy" not in seen_by_stable["properties"]["gpuProfile"]["nvidia"]  # 2026-08-01 cannot see it
    pool = aks.get_pool(platform, "migpool")
    assert pool is not None and pool.management_mode == "Managed"
    assert pool.properties["gpuProfile"]["nvidia"]["migStrategy"] == "Single"
    assert pool.properties["gpuProfile"]["nvidia"]["migProfiles"] == ["MIG3g"]


# --------------------------------------------------------------------------- wiring


def test_the_context_wires_ledger_adapters_and_events_together(sim: SimHandle, settings: Settings,
                                                               storage_connection_string: str) -> None:
    import dataclasses

    from shared.kernel.ports import Record
    from shared.wiring import FleetAccess, build_context

    wired = dataclasses.replace(settings, storage_connection_string=storage_connection_string,
                                ledger_table="wiring" + str(abs(hash(sim.state_dir)))[:12])
    ctx = build_context(wired, instance="test-1")
    assert ctx.instance == "test-1" and isinstance(ctx.access, FleetAccess)
    created = ctx.ledger.create(Record(kind="dedupe", id="evt-wiring", state="seen"))
    assert ctx.ledger.get("dedupe", "evt-wiring") == created
    nodes = list(ctx.access.kube(cluster_id(sim, "ml-train")).list_nodes())
    assert nodes and ctx.access.kube(cluster_id(sim, "ml-train")) is ctx.access.kube(cluster_id(sim, "ml-train"))
    ctx.events.publish(type_="Steward.Breaker.Reset", subject="/fleet", data={}, id_="evt-wiring")
    assert any(e.get("id") == "evt-wiring" for e in published(sim))
    ctx.telemetry.record("breaker_open", 0)


def test_a_wired_context_logs_with_correlation_ids_and_without_secrets(sim: SimHandle, settings: Settings,
                                                                       storage_connection_string: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    import dataclasses
    import logging

    from shared.kernel import telemetry
    from shared.wiring import build_context

    key = storage_connection_string.split("Account" "Key=", 1)[1].split(";", 1)[0]
    wired = dataclasses.replace(settings, storage_connection_string=storage_connection_string)
    with caplog.at_level(logging.DEBUG):
        ctx = build_context(wired, instance="test-2")
        with telemetry.correlation("corr-42"):
            logging.getLogger("steward.test").info("connecting with %s", storage_connection_string)
            list(ctx.access.kube(cluster_id(sim, "ml-train")).list_nodes())
    formatter = telemetry.JsonFormatter()
    lines = [formatter.format(r) for r in caplog.records]
    assert lines and not any(key in line for line in lines)
    ours = [r for r in caplog.records if r.name == "steward.test"]
    assert ours and ours[0].correlation_id == "corr-42"  # type: ignore[attr-defined]
    assert "Account" "Key=***" in ours[0].getMessage()

"""Pool requests end to end: a team's message on the queue becomes a working GPU pool, or a clear "no".

Azurite, the simulator and a local Functions host process (``python -m devhost run``) run the real
app with its real adapters. Every valid request of the table is submitted at once (as teams would)
and each test then reads its own outcome; rejections likewise. What is checked is what a team and
an auditor can see: the ledger table, the pool in ARM, the nodes in the cluster, the CloudEvents on
the topic, the queues, and the simulator's oracles.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.conftest import (
    AGENTPOOL_LABEL,
    NODEPOOL_LABEL,
    PUT_POOL,
    Fleet,
    assert_no_disruption,
    node_is_ready,
    stack_problems,
)

T4 = "Standard_NC4as_T4_v3"
A100 = "Standard_NC24ads_A100_v4"
REQUEST_ID_TAG = "gpu-fleet-steward-request-id"


@dataclass(frozen=True)
class Wanted:
    """One valid request and what ARM must then hold (``gpu_profile`` compared field by field)."""

    id: str
    pool: str
    fields: dict[str, Any]
    gpu_profile: dict[str, Any]
    cluster: str = "e2e-pools"
    arm: dict[str, Any] = field(default_factory=dict)  # other properties of the pool, exactly
    resource: str = "nvidia.com/gpu"  # what the sample job and the stack check rely on

    @property
    def managed(self) -> bool:
        return self.gpu_profile.get("nvidia", {}).get("managementMode") == "Managed"


MANAGED = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}
WANTED = [
    Wanted("e2e-managed", "gpuman", {"vmSize": T4, "count": 1, "validateWorkload": True}, MANAGED,
           arm={"vmSize": T4, "count": 1, "osSKU": "Ubuntu", "nodeTaints": ["sku=gpu:NoSchedule"]}),
    Wanted("e2e-driver-only", "gpudrv", {"vmSize": T4, "count": 1, "installProfile": "driverOnly"},
           {"driver": "Install"}, arm={"vmSize": T4, "count": 1}),  # no nvidia block off the managed experience
    Wanted("e2e-no-driver", "gpubyo", {"vmSize": T4, "count": 1, "installProfile": "none", "gpuDriver": "None"},
           {"driver": "None"}, arm={"vmSize": T4, "count": 1}),
    Wanted("e2e-mig-single", "migone",
           {"vmSize": A100, "count": 1, "mig": {"strategy": "Single", "profile": "MIG3g"}, "validateWorkload": True},
           {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single", "migProfiles": ["MIG3g"]}},
           arm={"vmSize": A100, "gpuInstanceProfile": None}),  # 2026-08-02-preview: migProfiles, not gpuInstanceProfile
    Wanted("e2e-mig-mixed", "migmix",
           {"vmSize": A100, "count": 1, "mig": {"strategy": "Mixed", "profile": "MIG1g"}, "validateWorkload": True},
           {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Mixed", "migProfiles": ["MIG1g"]}},
           arm={"vmSize": A100, "gpuInstanceProfile": None}, resource="nvidia.com/mig-1g.10gb"),
    Wanted("e2e-azure-linux", "gpual",
           {"vmSize": "Standard_NC8as_T4_v3", "count": 2, "osSku": "AzureLinux", "zones": ["1", "2"],
            "labels": {"team": "vision"}, "tags": {"costCenter": "cv-01"}, "validateWorkload": True},
           MANAGED, arm={"vmSize": "Standard_NC8as_T4_v3", "count": 2, "osSKU": "AzureLinux",
                         "availabilityZones": ["1", "2"], "nodeLabels": {"team": "vision"}}),
]
NAP = Wanted("e2e-nap", "napgpu", {"vmSize": T4, "count": 1, "validateWorkload": True}, MANAGED, cluster="e2e-nap")


@pytest.fixture(scope="module")
def submitted(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """Every valid request of the module, on the queue at once; request id -> message."""
    messages = {w.id: fleet.request(request_id=w.id, pool=w.pool, cluster=w.cluster, **w.fields)
                for w in [*WANTED, NAP]}
    for message in messages.values():
        fleet.submit(message)
    return messages


def _gpu_profile_fields(profile: dict[str, Any]) -> dict[str, Any]:
    """``{"driver": ..., "nvidia": present?, "nvidia.managementMode": ..., "nvidia.migStrategy": ...,
    "nvidia.migProfiles": ...}`` (absent = None)."""
    nvidia = profile.get("nvidia") or {}
    return {"driver": profile.get("driver"), "nvidia": "nvidia" in profile,
            "nvidia.managementMode": nvidia.get("managementMode"),
            "nvidia.migStrategy": nvidia.get("migStrategy") or "None", "nvidia.migProfiles": nvidia.get("migProfiles")}


# ====================================================================== successes


@pytest.mark.parametrize("wanted", WANTED, ids=[w.id for w in WANTED])
def test_a_valid_request_ends_succeeded_with_the_pool_as_requested_in_arm_and_a_working_stack(
        fleet: Fleet, submitted: dict[str, dict[str, Any]], wanted: Wanted) -> None:
    record = fleet.outcome(wanted.id, timeout=60)
    assert record.state == "succeeded", fleet.describe(record)

    props = fleet.arm_pool(wanted.cluster, wanted.pool)
    assert props["provisioningState"] == "Succeeded"
    assert _gpu_profile_fields(props.get("gpuProfile") or {}) == _gpu_profile_fields(wanted.gpu_profile)
    for key, value in wanted.arm.items():
        assert props.get(key) == value, f"{key}: ARM has {props.get(key)!r}, the request asked {value!r}"
    assert (props.get("tags") or {}).get(REQUEST_ID_TAG) == wanted.id
    if wanted.fields.get("tags"):
        assert wanted.fields["tags"].items() <= (props.get("tags") or {}).items()

    nodes = fleet.nodes(wanted.cluster, f"{AGENTPOOL_LABEL}={wanted.pool}")
    assert len(nodes) == wanted.fields["count"]
    assert stack_problems(nodes, managed=wanted.managed, resource=wanted.resource) == []

    outcome = record.data["outcome"]
    assert outcome["sample_job"] == ("succeeded" if wanted.fields.get("validateWorkload") else "not requested")
    events = fleet.events_when(wanted.id, types={"Steward.PoolRequest.Accepted", "Steward.PoolRequest.Created"})
    assert {e["type"] for e in events} == {"Steward.PoolRequest.Accepted", "Steward.PoolRequest.Created"}
    created = [e for e in events if e["type"] == "Steward.PoolRequest.Created"]
    assert len(created) == 1
    assert created[0]["subject"] == f"{submitted[wanted.id]['cluster']}/agentPools/{wanted.pool}"


def test_a_request_with_validate_workload_runs_the_sample_gpu_job_on_the_new_pool_and_cleans_it_up(
        fleet: Fleet, submitted: dict[str, dict[str, Any]]) -> None:
    fleet.outcome("e2e-mig-mixed", timeout=60)
    terminations = fleet.oracles()["terminations"]
    mig_nodes = {n.metadata.name for n in fleet.nodes("e2e-pools", f"{AGENTPOOL_LABEL}=migmix")}
    job_pods = [t for t in terminations if t["pod"].startswith("steward-gpu-check-migmix-")]
    assert job_pods, "the sample job's pod never ran (or was never cleaned up)"
    assert all(t["node"] in mig_nodes and t["phase"] == "Succeeded" for t in job_pods), job_pods


def test_a_request_for_a_node_auto_provisioning_cluster_becomes_a_karpenter_nodepool_that_runs_the_sample_job(
        fleet: Fleet, submitted: dict[str, dict[str, Any]]) -> None:
    record = fleet.outcome(NAP.id, timeout=60)
    assert record.state == "succeeded", fleet.describe(record)
    assert record.data["outcome"]["sample_job"] == "succeeded"

    node_class = fleet.custom_object("e2e-nap", "karpenter.azure.com", "v1beta1", "aksnodeclasses", NAP.pool)
    assert node_class["spec"]["tags"]["EnableManagedGPUExperience"] == "true"
    node_pool = fleet.custom_object("e2e-nap", "karpenter.sh", "v1", "nodepools", NAP.pool)
    requirements = {r["key"]: (r["operator"], r["values"]) for r in node_pool["spec"]["template"]["spec"]["requirements"]}
    assert requirements["karpenter.azure.com/sku-family"] == ("In", ["N"])
    assert requirements["karpenter.azure.com/sku-gpu-manufacturer"] == ("In", ["nvidia"])
    assert requirements["node.kubernetes.io/instance-type"] == ("In", [T4])
    assert node_pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == NAP.pool
    assert {"key": "sku", "value": "gpu", "effect": "NoSchedule"} in node_pool["spec"]["template"]["spec"]["taints"]
    limits = node_pool["spec"]["limits"]  # count x the size's vCPUs and GPUs (NC4as_T4_v3: 4 vCPUs, 1 T4)
    assert (str(limits["cpu"]), str(limits["nvidia.com/gpu"])) == ("4", "1"), limits

    nodes = fleet.nodes("e2e-nap", f"{NODEPOOL_LABEL}={NAP.pool}")
    assert nodes and all(node_is_ready(n) for n in nodes), "Karpenter made no Ready node for the sample job"
    assert stack_problems(nodes, managed=True, resource="nvidia.com/gpu") == []
    assert fleet.arm_pool_names("e2e-nap") == ["system"]  # Karpenter objects, no AgentPool


# ====================================================================== rejections


@dataclass(frozen=True)
class Bad:
    id: str
    message: dict[str, Any] | str
    field: str  # the field the reasons must name


def _bad_messages(fleet: Fleet) -> list[Bad]:
    def req(request_id: str, **fields: Any) -> dict[str, Any]:
        return fleet.request(request_id=request_id, pool="gpubad", **{"vmSize": T4, "count": 1, **fields})

    foreign = fleet.clusters["e2e-pools"].replace("5e2e0000-0000-4000-8000-000000000001",
                                                  "0badc0de-0000-4000-8000-000000000009")
    return [
        Bad("not-json", '{"schemaVersion": "1", "requestId": "oops", this is not JSON', "$"),
        Bad("bad-non-gpu-size", req("bad-non-gpu-size", vmSize="Standard_D4s_v5"), "vmSize"),
        Bad("bad-amd-size", req("bad-amd-size", vmSize="Standard_NV4as_v4"), "vmSize"),
        Bad("bad-mig-on-t4", req("bad-mig-on-t4", mig={"strategy": "Single", "profile": "MIG1g"}), "mig"),
        Bad("bad-driver-none-managed", req("bad-driver-none-managed", gpuDriver="None"), "gpuDriver"),
        Bad("bad-windows", req("bad-windows", osType="Windows"), "osType"),
        Bad("bad-outside-scope", req("bad-outside-scope", cluster=fleet.clusters["e2e-out"]), "cluster"),
        Bad("bad-foreign-subscription", req("bad-foreign-subscription", cluster=foreign), "cluster"),
        Bad("bad-typo-field", {**req("bad-typo-field"), "vmsize": T4}, "vmsize"),
    ]


def _record_id(bad: Bad) -> str:
    if isinstance(bad.message, str):
        return "msg-" + hashlib.sha256(bad.message.encode()).hexdigest()[:40]
    return bad.id


@pytest.fixture(scope="module")
def rejected(fleet: Fleet) -> list[Bad]:
    bad = _bad_messages(fleet)
    for item in bad:
        fleet.submit(item.message if isinstance(item.message, str) else json.dumps(item.message))
    return bad


REJECTION_IDS = ["not-json", "bad-non-gpu-size", "bad-amd-size", "bad-mig-on-t4", "bad-driver-none-managed",
                 "bad-windows", "bad-outside-scope", "bad-foreign-subscription", "bad-typo-field"]


@pytest.mark.parametrize("bad_id", REJECTION_IDS)
def test_a_bad_message_is_rejected_once_with_its_reasons_in_the_ledger_and_a_rejected_event(
        fleet: Fleet, rejected: list[Bad], bad_id: str) -> None:
    bad = next(b for b in rejected if b.id == bad_id)
    record = fleet.outcome(_record_id(bad), timeout=30)
    assert record.state == "rejected"
    reasons = record.data["reasons"]
    assert any(r.startswith(f"{bad.field}:") or f" {bad.field}" in r for r in reasons), reasons
    assert record.data["dequeue_count"] == 1
    assert [h["state"] for h in record.history] == ["rejected"]

    events = fleet.events_when(record.id, types={"Steward.PoolRequest.Rejected"})
    assert [e["type"] for e in events] == ["Steward.PoolRequest.Rejected"]
    assert events[0]["data"]["reasons"] == reasons
    assert events[0]["source"] == fleet.stack.settings.get("STEWARD_EVENT_SOURCE", "/gpu-fleet-steward")
    assert fleet.record("gpubad") is None  # nothing was filed under the pool's name either


def test_rejected_messages_are_not_retried_and_nothing_lands_in_the_poison_queue(
        fleet: Fleet, rejected: list[Bad]) -> None:
    for bad in rejected:
        fleet.outcome(_record_id(bad), timeout=30)
    assert fleet.drained() == 0
    assert fleet.failed_invocations(fleet.pool_request_function) == 0
    assert fleet.poison() == []
    assert "gpubad" not in fleet.arm_pool_names("e2e-pools") + fleet.arm_pool_names("e2e-out")


# ====================================================================== idempotency


def test_the_same_message_delivered_twice_makes_one_pool_with_two_instances_competing_for_it(fleet: Fleet) -> None:
    fleet.quiesce()
    second = fleet.start_host("host-twice")  # a scaled-out instance competing for the two copies
    try:
        before = fleet.requests()
        message = json.dumps(fleet.request(request_id="e2e-twice", pool="gputwice", vmSize=T4, count=1))
        fleet.submit(message)
        fleet.submit(message)

        record = fleet.outcome("e2e-twice", timeout=60)
        assert record.state == "succeeded", fleet.describe(record)
        assert fleet.requests()[PUT_POOL] - before[PUT_POOL] == 1
        assert fleet.drained() == 0
    finally:
        fleet.stack.stop_host(second)
    # Events are at-least-once: both deliveries may announce the acceptance, under one event id,
    # which is how a CloudEvents consumer recognises the repeat.
    events = fleet.events_when("e2e-twice", types={"Steward.PoolRequest.Accepted", "Steward.PoolRequest.Created"})
    assert {e["id"] for e in events} == {"pool-request/platform:e2e-twice/Accepted",
                                         "pool-request/platform:e2e-twice/Created"}
    assert [e["type"] for e in events].count("Steward.PoolRequest.Created") == 1


def test_every_pool_of_this_module_was_put_exactly_once_and_no_pod_was_disrupted(fleet: Fleet) -> None:
    fleet.quiesce()
    records = fleet.ledger.list("pool-request")
    assert [r.id for r in records if r.state == "failed"] == []
    agent_pools = [r for r in records if r.state == "succeeded" and not r.data.get("nap")]
    oracles = fleet.oracles()
    assert oracles["requests"].get(PUT_POOL, 0) == len(agent_pools)
    assert_no_disruption(oracles)

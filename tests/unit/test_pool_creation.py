"""The pool-request state machine: accept once, create once, validate, test, and say what happened.

Driven with the real InMemoryLedger and reconciler, and the fakes of tests/unit/fakes_pool.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.kernel.errors import Conflict, Invalid, Transient
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.pools import intake, validation
from shared.pools import steps as pool_steps
from shared.pools.intake import accept
from shared.pools.policy import PoolRequestPolicy
from shared.pools.records import ACTIVE_STATES, KIND, TERMINAL_STATES
from shared.pools.request import PoolRequest
from shared.pools.sample_job import job_name
from shared.pools.steps import advance
from tests.unit.fakes_pool import (
    CLUSTER,
    NAP_CLUSTER,
    OTHER_SUB,
    World,
    cluster_id,
    make_node,
    make_world,
    materialise,
    message,
)

A100 = "Standard_NC24ads_A100_v4"
MODULES = {"pool-request": pool_steps}


def record(world: World, id_: str = "req-0001") -> Record:
    found = world.ledger.get(KIND, id_)
    assert found is not None
    return found


def step(world: World, id_: str = "req-0001") -> Record:
    """One reconciler-like step: advance the stored record and save what comes back."""
    return world.ledger.save(advance(record(world, id_), world.ctx))


def reconcile(world: World, *, seconds: float = 0.0) -> None:
    world.clock.advance(seconds)
    reconcile_once(world.ctx, modules=MODULES)


def submit(world: World, **overrides: Any) -> intake.AcceptOutcome:
    return accept(message(**overrides), dequeue_count=1, ctx=world.ctx)


def drive_to_success(world: World, *, cluster: str = CLUSTER, pool: str = "gpunp") -> Record:
    reconcile(world)  # accepted -> creating (PUT)
    assert record(world).state == "creating"
    materialise(world.aks, world.kube(cluster), cluster, pool)
    reconcile(world, seconds=world.policy.poll_interval_s)
    return record(world)


def test_states_are_split_into_active_and_terminal() -> None:
    assert set(ACTIVE_STATES) == {"accepted", "creating", "validating", "testing"}
    assert set(TERMINAL_STATES) == {"succeeded", "rejected", "failed", "blocked"}


# ----------------------------------------------------------------------------- accept


def test_a_valid_request_is_recorded_as_accepted_and_announced() -> None:
    world = make_world()
    outcome = submit(world)
    assert (outcome.status, outcome.request_id) == ("accepted", "req-0001")
    stored = record(world)
    assert stored.state == "accepted" and stored.data["cluster"] == CLUSTER and stored.data["announced"] is True
    assert world.events.types() == ["Steward.PoolRequest.Accepted"]
    assert world.events.published[0]["subject"] == f"{CLUSTER}/agentPools/gpunp"
    assert world.aks.puts == []  # accept never touches the cluster


def test_the_same_message_delivered_twice_makes_one_record_one_event_and_one_pool() -> None:
    world = make_world()
    assert submit(world).status == "accepted"
    assert submit(world).status == "duplicate"
    assert len(world.ledger.list(KIND)) == 1
    assert world.events.types() == ["Steward.PoolRequest.Accepted"]
    drive_to_success(world)
    assert submit(world).status == "duplicate"
    assert len(world.aks.puts) == 1 and record(world).state == "succeeded"


def test_a_request_id_reused_for_a_different_request_is_rejected_and_the_first_is_untouched() -> None:
    world = make_world()
    submit(world)
    outcome = submit(world, count=4)
    assert outcome.status == "rejected" and outcome.request_id.startswith("msg-")
    assert "already used for a different request" in outcome.message
    assert record(world).state == "accepted" and record(world).data["request"]["count"] == 1
    assert record(world, outcome.request_id).state == "rejected"


def test_a_bad_message_is_rejected_once_with_its_reasons_and_never_retried() -> None:
    world = make_world()
    outcome = submit(world, vmSize="Standard_D4s_v5", poolName="GPU")
    assert outcome.status == "rejected" and outcome.request_id == "req-0001"
    stored = record(world)
    assert stored.state == "rejected" and stored.state in TERMINAL_STATES
    assert {p["field"] for p in stored.data["problems"]} == {"vmSize", "poolName"}
    [event] = world.events.published
    assert event["type"] == "Steward.PoolRequest.Rejected" and len(event["data"]["reasons"]) == 2
    assert submit(world, vmSize="Standard_D4s_v5", poolName="GPU").status == "rejected"  # redelivered
    assert len(world.events.published) == 1 and len(world.ledger.list(KIND)) == 1
    reconcile(world)
    assert record(world).state == "rejected" and world.aks.puts == []


def test_an_unreadable_message_is_rejected_under_a_hash_of_its_content() -> None:
    world = make_world()
    outcome = accept(b"\x00 not json", dequeue_count=1, ctx=world.ctx)
    assert outcome.status == "rejected" and outcome.request_id.startswith("msg-")
    assert record(world, outcome.request_id).data["problems"][0]["field"] == "$"
    assert world.events.published[0]["subject"] == f"/pool-requests/{outcome.request_id}"


def test_a_corrected_request_may_reuse_the_id_of_a_rejected_one() -> None:
    world = make_world()
    assert submit(world, vmSize="Standard_D4s_v5").status == "rejected"
    assert submit(world).status == "accepted"
    stored = record(world)
    assert stored.state == "accepted" and [h["state"] for h in stored.history] == ["rejected", "accepted"]


@pytest.mark.parametrize(("cluster", "words"), [
    pytest.param(cluster_id("untagged"), "not in the fleet", id="a cluster without the fleet tag"),
    pytest.param(cluster_id("c1", sub=OTHER_SUB), "not in the fleet", id="a cluster in a foreign subscription"),
    pytest.param(cluster_id("ghost"), "not in the fleet", id="a cluster ARM cannot find"),
])
def test_clusters_outside_the_fleet_scope_are_rejected(cluster: str, words: str) -> None:
    world = make_world()
    outcome = submit(world, cluster=cluster)
    assert outcome.status == "rejected" and words in outcome.message


def test_a_foreign_subscription_is_refused_without_asking_arm() -> None:
    world = make_world()
    submit(world, cluster=cluster_id("c1", sub=OTHER_SUB))
    assert world.aks.get_cluster_calls == 0


def test_a_request_that_cannot_be_announced_is_not_recorded_and_the_retry_accepts_it() -> None:
    world = make_world()
    world.events.failures.append(Transient("event grid 503"))
    with pytest.raises(Transient):
        submit(world)
    assert world.ledger.get(KIND, "req-0001") is None  # no reconciler can start what was never announced
    assert submit(world).status == "accepted"
    assert world.events.types() == ["Steward.PoolRequest.Accepted"] and record(world).data["announced"] is True


def test_accepted_is_published_before_the_record_exists_so_no_progress_event_can_precede_it() -> None:
    world = make_world()
    seen_at_publish: list[Record | None] = []
    publish = world.events.publish

    def spying(**kwargs: Any) -> None:
        seen_at_publish.append(world.ledger.get(KIND, "req-0001"))
        publish(**kwargs)

    world.events.publish = spying  # type: ignore[method-assign]
    submit(world)
    assert seen_at_publish == [None]
    assert record(world).data["announced"] is True


def test_a_record_written_unannounced_by_an_older_version_is_announced_on_redelivery() -> None:
    world = make_world()
    legacy = intake.new_record(validation.parse_and_validate(  # what the old code left behind
        message(), policy=world.policy, in_scope=lambda _c: True), now=0.0, dequeue_count=1)
    world.ledger.create(legacy)
    assert submit(world).status == "duplicate"
    assert world.events.types() == ["Steward.PoolRequest.Accepted"] and record(world).data["announced"] is True


# ----------------------------------------------------------------------------- happy paths


@pytest.mark.parametrize(("overrides", "gpu_profile", "preview"), [
    pytest.param({}, {"driver": "Install", "nvidia": {"managementMode": "Managed"}}, False, id="managed"),
    pytest.param({"installProfile": "driverOnly"}, {"driver": "Install"}, False, id="driver only"),
    pytest.param({"installProfile": "none"}, {"driver": "None"}, False, id="bring your own driver"),
    pytest.param({"vmSize": A100, "mig": {"strategy": "Single", "profile": "MIG3g"}},
                 {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Single",
                                                  "migProfiles": ["MIG3g"]}}, True,
                 id="MIG single"),
    pytest.param({"vmSize": A100, "mig": {"strategy": "Mixed", "profile": "MIG1g"}},
                 {"driver": "Install", "nvidia": {"managementMode": "Managed", "migStrategy": "Mixed",
                                                  "migProfiles": ["MIG1g"]}}, True,
                 id="MIG mixed"),
    pytest.param({"osSku": "AzureLinux", "count": 2, "zones": ["1", "2"]},
                 {"driver": "Install", "nvidia": {"managementMode": "Managed"}}, False, id="Azure Linux in two zones"),
    pytest.param({"spot": {"maxPrice": 0.4}}, {"driver": "Install", "nvidia": {"managementMode": "Managed"}}, False,
                 id="spot"),
])
def test_each_install_profile_goes_from_accepted_to_succeeded(overrides: dict[str, Any], gpu_profile: dict[str, Any],
                                                              preview: bool) -> None:
    world = make_world()
    assert submit(world, **overrides).status == "accepted"
    final = drive_to_success(world)
    assert final.state == "succeeded", final.data
    [put] = world.aks.puts
    assert put.body["properties"]["gpuProfile"] == gpu_profile and put.preview is preview
    assert [h["state"] for h in final.history] == ["accepted", "creating", "validating", "succeeded"]
    assert final.data["outcome"]["state"] == "succeeded" and final.data["outcome"]["sample_job"] == "not requested"
    assert world.events.types() == ["Steward.PoolRequest.Accepted", "Steward.PoolRequest.Created"]
    created = world.events.published[-1]
    assert created["id"] == "pool-request/req-0001/Created"
    assert created["data"]["outcome"]["nodes"] == put.body["properties"]["count"]
    assert world.kube().list_selectors[-1] == "kubernetes.azure.com/agentpool=gpunp"


def test_the_pool_is_followed_without_holding_an_invocation_while_azure_works() -> None:
    world = make_world()
    submit(world)
    reconcile(world)
    waiting = record(world)
    assert waiting.state == "creating" and waiting.next_at == world.clock.now() + world.policy.poll_interval_s
    reconcile(world, seconds=world.policy.poll_interval_s)
    again = record(world)
    assert again.state == "creating" and again.data["provisioning_state"] == "Creating"
    assert len(world.aks.puts) == 1


# ----------------------------------------------------------------------------- crash and concurrency


def test_a_crash_after_the_put_but_before_the_save_resumes_without_a_second_put() -> None:
    world = make_world()
    submit(world)
    stored = record(world)
    lost = advance(stored, world.ctx)  # PUT sent, then the process dies before saving
    assert lost.state == "creating" and len(world.aks.puts) == 1
    resumed = advance(stored, world.ctx)  # another instance picks up the same stored record
    assert resumed.state == "creating" and len(world.aks.puts) == 1
    assert "following it" in resumed.history[-1]["note"]
    world.ledger.save(resumed)
    materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    reconcile(world, seconds=world.policy.poll_interval_s)
    assert record(world).state == "succeeded"


def test_running_the_sample_job_step_twice_creates_one_job() -> None:
    world = make_world()
    submit(world, validateWorkload=True)
    drive_to_success(world)
    testing = record(world)
    assert testing.state == "testing"
    first, second = advance(testing, world.ctx), advance(testing, world.ctx)
    assert first.state == second.state == "testing"
    assert len(world.kube().jobs()) == 1


def test_a_pool_that_vanishes_after_its_put_is_requested_again() -> None:
    world = make_world()
    submit(world)
    reconcile(world)
    world.aks.pools.clear()
    reconcile(world, seconds=world.policy.poll_interval_s)
    assert len(world.aks.puts) == 2 and record(world).state == "creating"


# ----------------------------------------------------------------------------- Azure says no


def test_a_failed_provisioning_ends_the_request_with_azures_error() -> None:
    world = make_world()
    submit(world)
    reconcile(world)
    world.aks.set_state(CLUSTER, "gpunp", "Failed",
                        error={"code": "QuotaExceeded", "message": "Operation could not be completed as it results in "
                               "exceeding approved standardNCASv3_T4Family Cores quota."})
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "QuotaExceeded"
    failed = world.events.published[-1]
    assert failed["type"] == "Steward.PoolRequest.Failed" and failed["data"]["error"]["code"] == "QuotaExceeded"
    assert "standardNCASv3_T4Family" in failed["data"]["error"]["message"] and failed["data"]["stage"] == "creating"


def test_a_put_refused_as_invalid_ends_the_request_with_azures_code() -> None:
    world = make_world()
    submit(world)
    world.aks.faults.fail_always["begin_put_pool"] = Invalid("exceeding approved quota", code="QuotaExceeded")
    reconcile(world)
    final = record(world)
    assert final.state == "failed" and final.data["error"] == {"code": "QuotaExceeded",
                                                               "message": "exceeding approved quota"}
    assert world.events.types()[-1] == "Steward.PoolRequest.Failed"


def test_a_busy_cluster_is_asked_again_later() -> None:
    world = make_world()
    submit(world)
    world.aks.faults.fail_always["begin_put_pool"] = Conflict("OperationNotAllowed: another operation is in progress")
    reconcile(world)
    waiting = record(world)
    assert waiting.state == "accepted" and waiting.next_at > world.clock.now()
    world.aks.faults.fail_always.pop("begin_put_pool")
    reconcile(world, seconds=world.policy.poll_interval_s)
    assert record(world).state == "creating" and len(world.aks.puts) == 2


def test_a_pool_name_taken_by_someone_else_fails_without_touching_it() -> None:
    world = make_world()
    world.aks.pools[(CLUSTER.lower(), "gpunp")] = {"vmSize": "Standard_D4s_v5", "provisioningState": "Succeeded"}
    submit(world)
    reconcile(world)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "PoolNameTaken"
    assert world.aks.puts == []


def test_a_pool_made_under_the_name_between_the_read_and_the_put_is_not_overwritten() -> None:
    world = make_world()
    theirs = {"vmSize": "Standard_D4s_v5", "provisioningState": "Succeeded"}
    world.aks.pools[(CLUSTER.lower(), "gpunp")] = dict(theirs)
    reads = world.aks.get_pool
    unseen = iter([True])

    def racing_read(cluster_id: str, pool: str) -> Any:  # our read happened just before theirs was created
        return None if next(unseen, False) else reads(cluster_id, pool)

    world.aks.get_pool = racing_read  # type: ignore[method-assign]
    submit(world)
    reconcile(world)
    assert world.aks.pools[(CLUSTER.lower(), "gpunp")] == theirs  # the PUT said If-None-Match: *
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "PoolNameTaken"
    assert world.aks.pools[(CLUSTER.lower(), "gpunp")] == theirs


def test_creation_that_never_finishes_times_out() -> None:
    world = make_world(policy=PoolRequestPolicy(create_timeout_s=120))
    submit(world)
    reconcile(world)
    for _ in range(10):
        reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "PoolCreateTimeout"


def test_a_paused_steward_writes_nothing() -> None:
    world = make_world(paused=True)
    submit(world)
    reconcile(world)
    assert world.aks.puts == [] and record(world).state == "accepted"


# ----------------------------------------------------------------------------- validation


def test_a_stack_that_never_becomes_healthy_fails_with_the_problems_after_the_timeout() -> None:
    world = make_world(policy=PoolRequestPolicy(validate_timeout_s=60))
    submit(world)
    reconcile(world)
    world.aks.set_state(CLUSTER, "gpunp", "Succeeded")
    world.kube().nodes["n1"] = make_node("n1", allocatable={"nvidia.com/gpu": "1"})  # no DCGM label, no NPD
    reconcile(world, seconds=15)
    assert record(world).state == "validating"
    assert any("dcgm-exporter" in p for p in record(world).data["stack"]["problems"])
    for _ in range(6):
        reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "StackValidationTimeout"
    assert "dcgm-exporter" in final.data["error"]["message"]


def test_validation_waits_for_nodes_that_are_still_joining() -> None:
    world = make_world()
    submit(world, count=2)
    reconcile(world)
    nodes = materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    del world.kube().nodes[nodes[1].name]
    reconcile(world, seconds=15)
    assert record(world).state == "validating"
    world.kube().nodes[nodes[1].name] = nodes[1]
    reconcile(world, seconds=15)
    assert record(world).state == "succeeded"


# ----------------------------------------------------------------------------- sample job


def the_job(world: World, cluster: str = CLUSTER) -> dict[str, Any]:
    [job] = world.kube(cluster).jobs()
    return job


def test_a_sample_job_that_completes_proves_the_pool_and_is_cleaned_up() -> None:
    world = make_world()
    submit(world, validateWorkload=True)
    assert drive_to_success(world).state == "testing"
    job = the_job(world)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.azure.com/agentpool": "gpunp"}
    assert pod["tolerations"] == [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    world.kube().set_job_status(job["metadata"]["name"], job["metadata"]["namespace"], {"succeeded": 1,
                                "conditions": [{"type": "Complete", "status": "True"}]})
    reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "succeeded" and final.data["outcome"]["sample_job"] == "succeeded"
    assert world.kube().jobs() == []


def test_a_sample_job_that_fails_fails_the_request_and_is_cleaned_up() -> None:
    world = make_world()
    submit(world, validateWorkload=True)
    drive_to_success(world)
    job = the_job(world)
    world.kube().set_job_status(job["metadata"]["name"], job["metadata"]["namespace"], {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "CUDA error"}]})
    reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "SampleJobFailed"
    assert "BackoffLimitExceeded" in final.data["error"]["message"] and world.kube().jobs() == []


def test_a_sample_job_that_never_runs_times_out() -> None:
    world = make_world(policy=PoolRequestPolicy(sample_job_timeout_s=60))
    submit(world, validateWorkload=True)
    drive_to_success(world)
    for _ in range(6):
        reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "SampleJobTimeout"
    assert world.kube().jobs() == []


def test_the_sample_job_on_a_mig_mixed_pool_asks_for_one_mig_slice_and_tolerates_spot() -> None:
    world = make_world()
    submit(world, validateWorkload=True, vmSize=A100, mig={"strategy": "Mixed", "profile": "MIG1g"}, spot={})
    drive_to_success(world)
    pod = the_job(world)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot",
            "effect": "NoSchedule"} in pod["tolerations"]


def test_the_job_name_is_a_valid_kubernetes_name_for_the_longest_inputs() -> None:
    req = PoolRequest(schema_version="1", request_id="r" * 64, requester="x", cluster=CLUSTER,
                      pool_name="abcdefghijkl", vm_size="Standard_NC4as_T4_v3", count=1)
    name = job_name(req)
    assert len(name) <= 63 and name == name.lower()


# ----------------------------------------------------------------------------- node auto-provisioning


def test_a_nap_cluster_gets_a_node_pool_and_node_class_instead_of_an_agent_pool() -> None:
    world = make_world()
    assert submit(world, cluster=NAP_CLUSTER).status == "accepted"
    reconcile(world)
    final = record(world)
    assert final.state == "succeeded", final.data
    assert world.aks.puts == []
    kinds = sorted(o["kind"] for o in world.kube(NAP_CLUSTER).created)  # created, never applied over a name
    assert kinds == ["AKSNodeClass", "NodePool"] and world.kube(NAP_CLUSTER).applied == []
    node_class = next(o for o in world.kube(NAP_CLUSTER).created if o["kind"] == "AKSNodeClass")
    assert node_class["spec"]["tags"]["EnableManagedGPUExperience"] == "true"


def test_a_nap_sample_job_selects_karpenters_node_pool() -> None:
    world = make_world()
    submit(world, cluster=NAP_CLUSTER, validateWorkload=True)
    reconcile(world)
    assert record(world).state == "testing"
    pod = the_job(world, NAP_CLUSTER)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "gpunp"}


def test_mig_on_a_nap_cluster_fails_with_the_reason() -> None:
    world = make_world()
    submit(world, cluster=NAP_CLUSTER, vmSize=A100, mig={"strategy": "Single", "profile": "MIG1g"})
    reconcile(world)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "UnsupportedOnNodeAutoProvisioning"


def test_a_failed_nap_request_deletes_only_the_karpenter_objects_it_read_by_uid() -> None:
    world = make_world()
    submit(world, cluster=NAP_CLUSTER, validateWorkload=True)
    reconcile(world)
    kube = world.kube(NAP_CLUSTER)
    uids = {key[1]: obj["metadata"]["uid"] for key, obj in kube.objects.items() if key[1] in ("NodePool", "AKSNodeClass")}
    seen: list[tuple[str, Any]] = []
    plain = kube.delete_object

    def delete(api_version: str, kind: str, name: str, namespace: str | None = None, **kwargs: Any) -> None:
        seen.append((kind, kwargs.get("uid")))
        plain(api_version, kind, name, namespace, **kwargs)

    kube.delete_object = delete  # type: ignore[method-assign]
    job = the_job(world, NAP_CLUSTER)
    kube.set_job_status(job["metadata"]["name"], job["metadata"]["namespace"], {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "CUDA error"}]})
    reconcile(world, seconds=15)
    assert record(world).data["outcome"]["cleanup"]["action"] == "deleted"
    assert sorted((k, u) for k, u in seen if k != "Job") == sorted(uids.items())


def test_a_karpenter_node_pool_of_someone_else_is_not_overwritten() -> None:
    world = make_world()
    world.kube(NAP_CLUSTER).apply_object({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                                          "metadata": {"name": "gpunp"}, "spec": {}})
    submit(world, cluster=NAP_CLUSTER)
    reconcile(world)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "PoolNameTaken"
    assert len(world.kube(NAP_CLUSTER).applied) == 1


def test_the_record_data_survives_the_ledgers_encoding() -> None:
    world = make_world()
    submit(world, labels={"team": "vision"}, tags={"note": "'; DROP TABLE pools; --"})
    stored = record(world)
    assert stored.data["request"]["tags"]["note"] == "'; DROP TABLE pools; --"
    assert json.loads(json.dumps(stored.data)) == stored.data


# ----------------------------------------------------------------------------- stable api-version reads


def test_a_mig_mixed_pool_read_on_the_stable_api_is_still_validated_by_its_mig_resources() -> None:
    world = make_world()
    world.aks.stable_reads = True  # GET shows no migStrategy, as ARM on 2026-08-01
    submit(world, vmSize=A100, mig={"strategy": "Mixed", "profile": "MIG1g"})
    final = drive_to_success(world)
    assert final.state == "succeeded", final.data
    assert final.data["outcome"]["resources"] == {"nvidia.com/mig-1g.10gb": 7}


def test_a_crash_after_a_mig_put_resumes_even_though_the_stable_read_hides_the_strategy() -> None:
    world = make_world()
    world.aks.stable_reads = True
    submit(world, vmSize=A100, mig={"strategy": "Single", "profile": "MIG3g"})
    stored = record(world)
    advance(stored, world.ctx)  # PUT, then lost
    resumed = advance(stored, world.ctx)
    assert resumed.state == "creating" and len(world.aks.puts) == 1


def test_a_record_whose_request_does_not_decode_fails_instead_of_crashing_the_reconciler() -> None:
    world = make_world()
    submit(world)
    stored = record(world)
    broken = world.ledger.save(Record(kind=KIND, id=stored.id, state="accepted", data={"request": {"count": "x"}},
                                      etag=stored.etag, created_at=stored.created_at))
    final = advance(broken, world.ctx)
    assert final.state == "failed" and final.data["error"]["code"] == "CorruptRecord"
    assert world.aks.puts == []

"""Issue 10, AKS/ARM 4 and 7: a failed pool request says why by error type and leaves nothing billing.

- An unregistered ``ManagedGPUExperiencePreview`` ends the request failed, naming the feature and the
  commands that register it.
- A pool this request created whose provisioning fails, or whose validation fails or times out, is
  deleted (default) or scaled to zero (POOL_REQUEST_FAILED_POOL_ACTION=scaleToZero); the outcome says
  which, and a pool that already runs workload pods is left alone, with the reason.
- A failed pool's error is reported by its most specific code (Compute's QuotaExceeded inside AKS's
  deployment error), not the wrapper's.

Driven with the real InMemoryLedger and reconciler and the fakes of tests/unit/fakes_pool.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.env import SettingError
from shared.kernel.errors import FeatureNotRegistered, OperationInProgress
from shared.kernel.ports import OwnerRef, PodView, Record
from shared.kernel.reconciler import reconcile_once
from shared.pools import steps as pool_steps
from shared.pools.intake import accept
from shared.pools.policy import PoolRequestPolicy
from shared.pools.records import KIND
from tests.unit.fakes_pool import CLUSTER, World, make_world, materialise, message

MODULES = {"pool-request": pool_steps}
FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"


def record(world: World) -> Record:
    found = world.ledger.get(KIND, "req-0001")
    assert found is not None
    return found


def reconcile(world: World, *, seconds: float = 0.0) -> None:
    world.clock.advance(seconds)
    reconcile_once(world.ctx, modules=MODULES)


def submit(world: World, **overrides: Any) -> None:
    assert accept(message(**overrides), dequeue_count=1, ctx=world.ctx).status == "accepted"


def pod(name: str, node: str, *, owner: str = "ReplicaSet", namespace: str = "ml") -> PodView:
    return PodView(namespace=namespace, name=name, uid=name, node_name=node, phase="Running",
                   owners=(OwnerRef(kind=owner, name=f"{name}-owner", controller=True),),
                   annotations={}, labels={}, deletion_timestamp=None, grace_period_seconds=30, has_empty_dir=False)


def fail_provisioning(world: World) -> None:
    world.aks.set_state(CLUSTER, "gpunp", "Failed", error={
        "code": "InvalidTemplateDeployment",
        "message": "Provisioning of resource(s) for Agent Pool gpunp failed. Error: The template deployment 'd' is "
                   "not valid according to the validation procedure. See inner errors for details.",
        "details": [{"code": "QuotaExceeded", "message": "Operation could not be completed as it results in "
                                                         "exceeding approved standardNCASv3_T4Family Cores quota."}]})


# ----------------------------------------------------------------------------- the preview feature


def test_an_unregistered_preview_feature_fails_the_request_with_the_commands_that_register_it() -> None:
    world = make_world()
    world.aks.faults.fail_always["begin_put_pool"] = FeatureNotRegistered(f"Preview feature {FEATURE} not registered.",
                                               code="PreviewFeatureNotRegistered", feature=FEATURE)
    submit(world)
    reconcile(world)
    final = record(world)
    assert final.state == "failed"
    assert final.data["error"]["code"] == "PreviewFeatureNotRegistered" and final.data["feature"] == FEATURE
    message_text = final.data["error"]["message"]
    assert "az feature register --namespace Microsoft.ContainerService --name ManagedGPUExperiencePreview" in message_text
    assert "az provider register --namespace Microsoft.ContainerService" in message_text
    assert world.events.published[-1]["type"] == "Steward.PoolRequest.Failed"
    assert world.aks.deletes == []  # nothing was created, nothing to clean


def test_a_driver_only_request_sends_no_nvidia_block_so_it_does_not_need_the_preview_feature() -> None:
    world = make_world()
    submit(world, installProfile="driverOnly")
    reconcile(world)
    [put] = world.aks.puts
    assert put.body["properties"]["gpuProfile"] == {"driver": "Install"}


# ----------------------------------------------------------------------------- the failed pool does not keep billing


def test_a_pool_whose_provisioning_failed_is_deleted_and_reported_by_the_innermost_code() -> None:
    world = make_world()
    submit(world)
    reconcile(world)
    fail_provisioning(world)
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "QuotaExceeded"
    assert world.aks.deletes == [(CLUSTER, "gpunp")]
    assert final.data["outcome"]["cleanup"]["action"] == "deleted"
    assert world.events.published[-1]["data"]["cleanup"]["action"] == "deleted"


def test_a_stack_that_never_becomes_healthy_gets_its_pool_deleted_after_the_timeout() -> None:
    world = make_world(policy=PoolRequestPolicy(validate_timeout_s=60))
    submit(world)
    reconcile(world)
    nodes = materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    for node in nodes:  # the GPUs never show up
        world.kube().nodes[node.name] = node.__class__(**{**{f: getattr(node, f) for f in node.__struct_fields__},
                                                          "allocatable": {"cpu": "4"}})
    for _ in range(8):
        reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "StackValidationTimeout"
    assert world.aks.deletes == [(CLUSTER, "gpunp")]
    assert final.data["outcome"]["cleanup"]["action"] == "deleted"


def test_a_failure_that_waited_for_a_busy_pool_still_reports_what_it_found() -> None:
    world = make_world(policy=PoolRequestPolicy(validate_timeout_s=60))
    submit(world)
    reconcile(world)
    nodes = materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    for node in nodes:  # the GPUs never show up
        world.kube().nodes[node.name] = node.__class__(**{**{f: getattr(node, f) for f in node.__struct_fields__},
                                                          "allocatable": {"cpu": "4"}})
    world.aks.faults.fail_always["begin_delete_pool"] = OperationInProgress(
        "409 OperationNotAllowed: another operation is in progress")
    for _ in range(8):
        reconcile(world, seconds=15)
    assert record(world).data["failing"]["code"] == "StackValidationTimeout"
    world.aks.faults.fail_always.pop("begin_delete_pool")
    reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "StackValidationTimeout"
    assert final.data["outcome"]["cleanup"]["action"] == "deleted"
    assert final.data["stack"]["ok"] is False  # the evidence survives the wait for the pool
    assert world.events.published[-1]["data"]["stack"]["ok"] is False


def test_scale_to_zero_keeps_the_pool_with_every_field_and_says_so() -> None:
    world = make_world(policy=PoolRequestPolicy(failed_pool_action="scaleToZero"))
    submit(world, count=2)
    reconcile(world)
    world.aks.pools[(CLUSTER.lower(), "gpunp")]["nodeInitializationTaints"] = ["boot=wait:NoSchedule"]
    fail_provisioning(world)
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = record(world)
    assert final.state == "failed" and world.aks.deletes == []
    scale = world.aks.puts[-1].body["properties"]
    assert scale["count"] == 0 and scale["enableAutoScaling"] is False
    assert scale["nodeInitializationTaints"] == ["boot=wait:NoSchedule"]  # a field this app does not know, kept
    assert scale["tags"]["gpu-fleet-steward-request-id"] == "req-0001"
    assert "status" not in scale and "provisioningState" not in scale
    assert final.data["outcome"]["cleanup"]["action"] == "scaledToZero"


def test_a_pool_that_already_runs_workload_pods_is_left_alone_and_the_outcome_names_them() -> None:
    world = make_world(policy=PoolRequestPolicy(validate_timeout_s=60, sample_job_timeout_s=60))
    submit(world, validateWorkload=True)
    reconcile(world)
    nodes = materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    reconcile(world, seconds=15)  # validating -> testing
    world.kube().add_pods(pod("trainer-0", nodes[0].name), pod("log-agent", nodes[0].name, owner="DaemonSet"))
    for _ in range(8):
        reconcile(world, seconds=15)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "SampleJobTimeout"
    assert world.aks.deletes == []
    cleanup = final.data["outcome"]["cleanup"]
    assert cleanup["action"] == "kept" and "ml/trainer-0" in cleanup["note"] and "log-agent" not in cleanup["note"]


def test_a_busy_pool_is_cleaned_up_once_its_operation_ends_and_the_failure_is_reported_then() -> None:
    world = make_world(policy=PoolRequestPolicy(failed_pool_action="scaleToZero"))
    submit(world)
    reconcile(world)
    fail_provisioning(world)
    world.aks.faults.fail_always["begin_put_pool"] = OperationInProgress(
        "409 OperationNotAllowed: another operation is in progress")
    reconcile(world, seconds=world.policy.poll_interval_s)
    waiting = record(world)
    assert waiting.state == "creating" and waiting.data["failing"]["code"] == "QuotaExceeded"
    world.aks.faults.fail_always.pop("begin_put_pool")
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = record(world)
    assert final.state == "failed" and final.data["error"]["code"] == "QuotaExceeded"
    assert final.data["outcome"]["cleanup"]["action"] == "scaledToZero" and final.data.get("failing") is None


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param(None, "delete", id="default delete"),
    pytest.param("scaleToZero", "scaleToZero", id="scale to zero"),
    pytest.param("SCALETOZERO", "scaleToZero", id="case-insensitive"),
])
def test_the_failed_pool_action_setting_defaults_to_delete(value: str | None, expected: str) -> None:
    env = {} if value is None else {"POOL_REQUEST_FAILED_POOL_ACTION": value}
    assert PoolRequestPolicy.from_env(env).failed_pool_action == expected


def test_an_unknown_failed_pool_action_is_refused_naming_the_setting() -> None:
    with pytest.raises(SettingError, match="POOL_REQUEST_FAILED_POOL_ACTION"):
        PoolRequestPolicy.from_env({"POOL_REQUEST_FAILED_POOL_ACTION": "keep"})

"""The sample GPU job runs with least privilege, and only the Job this request created is believed.

Issue 11 ("Least privilege, proved while the app runs", the sample GPU job): an image pinned by digest
(a setting, checked at start), no service-account token, a security context that passes Pod Security
``restricted``, the app's own namespace, and a check that the Job read back is the one created (the
request-id annotation plus the uid recorded in the ledger at creation): a same-named Job that is not
ours is never taken for a pass and never deleted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from shared.kernel.env import SettingError
from shared.kernel.ports import Record
from shared.kernel.reconciler import reconcile_once
from shared.pools import intake
from shared.pools import steps as pool_steps
from shared.pools.policy import DEFAULT_SAMPLE_JOB_IMAGE, PoolRequestPolicy
from shared.pools.records import KIND
from shared.pools.request import Mig, PoolRequest
from shared.pools.sample_job import job_name, sample_job
from shared.pools.steps import advance
from sim.kube import psa
from tests.unit.fakes_pool import CLUSTER, World, make_world, materialise, message

MODULES = {"pool-request": pool_steps}
APP_NAMESPACE = "gpu-fleet-steward"
DIGEST = "sha256:" + "4f" * 32


def record(world: World) -> Record:
    found = world.ledger.get(KIND, "req-0001")
    assert found is not None
    return found


def reconcile(world: World, *, seconds: float = 0.0) -> None:
    world.clock.advance(seconds)
    reconcile_once(world.ctx, modules=MODULES)


def to_testing(world: World) -> dict[str, Any]:
    """Submit a request with validateWorkload, bring its pool up, and return the sample Job created."""
    assert intake.accept(message(validateWorkload=True), dequeue_count=1, ctx=world.ctx).status == "accepted"
    reconcile(world)
    materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    reconcile(world, seconds=world.policy.poll_interval_s)
    assert record(world).state == "testing"
    [job] = world.kube().jobs()
    return job


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"])


def complete(world: World, job: dict[str, Any]) -> None:
    world.kube().set_job_status(job["metadata"]["name"], job["metadata"]["namespace"],
                                {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})


def request() -> PoolRequest:
    return PoolRequest(schema_version="1", request_id="req-0001", requester="x", cluster=CLUSTER, pool_name="gpunp",
                       vm_size="Standard_NC4as_T4_v3", count=1)


# ----------------------------------------------------------------------------- image pinned by digest


def test_the_default_sample_job_image_is_pinned_by_digest_and_the_job_runs_it() -> None:
    policy = PoolRequestPolicy()
    assert policy.sample_job_image == DEFAULT_SAMPLE_JOB_IMAGE
    registry_and_repo, _, digest = policy.sample_job_image.partition("@")
    assert "." in registry_and_repo.split("/", 1)[0] and ":" not in registry_and_repo
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    assert int(digest.removeprefix("sha256:"), 16) >= 0  # hex
    policy.check()
    world = make_world()
    assert pod_of(to_testing(world))["containers"][0]["image"] == DEFAULT_SAMPLE_JOB_IMAGE


@pytest.mark.parametrize("image", [
    pytest.param("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", id="a tag, which can be moved"),
    pytest.param("mcr.microsoft.com/azuredocs/samples-tf-mnist-demo:gpu", id="the old default, a tag"),
    pytest.param(f"nvidia/cuda@{DIGEST}", id="no registry host (would resolve to Docker Hub)"),
    pytest.param("nvcr.io/nvidia/cuda@sha256:" + "4F" * 32, id="upper-case hex"),
    pytest.param("nvcr.io/nvidia/cuda@sha256:" + "4f" * 31, id="a short digest"),
    pytest.param(f"nvcr.io/nvidia/cuda@{DIGEST}\n", id="a trailing newline"),
    pytest.param(f"nvcr.io/nvidia/cuda@{DIGEST} --privileged", id="trailing words"),
    pytest.param(f"nvcr.io/nvidia/cuda@md5:{'4f' * 32}", id="another algorithm"),
])
def test_a_sample_job_image_not_pinned_by_digest_is_refused_at_start_naming_the_setting(image: str) -> None:
    with pytest.raises(SettingError, match="POOL_REQUEST_SAMPLE_JOB_IMAGE"):
        PoolRequestPolicy(sample_job_image=image).check()
    if image == image.strip():
        with pytest.raises(SettingError, match="POOL_REQUEST_SAMPLE_JOB_IMAGE"):
            PoolRequestPolicy.from_env({"POOL_REQUEST_SAMPLE_JOB_IMAGE": image})


@pytest.mark.parametrize("image", [
    pytest.param(f"nvcr.io/nvidia/k8s/cuda-sample@{DIGEST}", id="nvcr.io"),
    pytest.param(f"myregistry.azurecr.io/gpu/checks/vector-add@{DIGEST}", id="a private ACR"),
    pytest.param(f"localhost:5000/cuda_sample@{DIGEST}", id="a local registry with a port"),
])
def test_an_image_pinned_by_digest_is_accepted(image: str) -> None:
    assert PoolRequestPolicy.from_env({"POOL_REQUEST_SAMPLE_JOB_IMAGE": image}).sample_job_image == image


# ----------------------------------------------------------------------------- token, security context, namespace


def test_the_sample_job_mounts_no_service_account_token() -> None:
    pod = pod_of(to_testing(make_world()))
    assert pod["automountServiceAccountToken"] is False


def test_the_sample_job_passes_pod_security_restricted() -> None:
    pod = pod_of(to_testing(make_world()))
    assert psa.violations(pod, "restricted") == []
    container = pod["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False and container["capabilities"] == {"drop": ["ALL"]}
    for context in (pod["securityContext"], container):
        assert context["runAsNonRoot"] is True
        assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize(("mig", "nap"), [pytest.param(False, False, id="agent pool"),
                                          pytest.param(True, False, id="MIG Mixed slice"),
                                          pytest.param(False, True, id="node auto-provisioning")])
def test_every_variant_of_the_sample_job_passes_pod_security_restricted(mig: bool, nap: bool) -> None:
    req = request()
    if mig:
        req = PoolRequest(schema_version="1", request_id="req-0001", requester="x", cluster=CLUSTER,
                          pool_name="gpunp", vm_size="Standard_NC24ads_A100_v4", count=1,
                          mig=Mig(strategy="Mixed", profile="MIG1g"))
    job = sample_job(req, policy=PoolRequestPolicy(), nap_cluster=nap, namespace=APP_NAMESPACE)
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert list(limits) == ["nvidia.com/mig-1g.10gb" if mig else "nvidia.com/gpu"]
    assert psa.violations(pod_of(job), "restricted") == []


def test_the_sample_job_runs_in_the_apps_own_namespace() -> None:
    world = make_world()
    job = to_testing(world)
    assert job["metadata"]["namespace"] == APP_NAMESPACE
    assert record(world).data["job"]["namespace"] == APP_NAMESPACE


def test_the_sample_job_follows_the_steward_namespace_setting() -> None:
    world = make_world()
    world.ctx = dataclasses.replace(world.ctx, settings=dataclasses.replace(world.ctx.settings, namespace="ops-steward"))
    job = to_testing(world)
    assert job["metadata"]["namespace"] == "ops-steward"
    assert world.kube().get_object("batch/v1", "Job", job["metadata"]["name"], "ops-steward") is not None


# ----------------------------------------------------------------------------- the Job read is the one created


def test_the_uid_of_the_job_created_is_recorded_in_the_ledger() -> None:
    world = make_world()
    job = to_testing(world)
    assert record(world).data["job"] == {"name": job["metadata"]["name"], "namespace": APP_NAMESPACE,
                                         "uid": job["metadata"]["uid"]}
    assert job["metadata"]["annotations"]["gpu-fleet-steward/request-id"] == "req-0001"


def foreign_job(*, annotated: bool, image: str = DEFAULT_SAMPLE_JOB_IMAGE) -> dict[str, Any]:
    """A Job with the sample job's name that someone else made, already Complete."""
    job = sample_job(request(), policy=PoolRequestPolicy(), nap_cluster=False, namespace=APP_NAMESPACE)
    if not annotated:
        job["metadata"]["annotations"] = {}
    job["spec"]["template"]["spec"]["containers"][0]["image"] = image
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    return job


def refused_and_left_alone(world: World) -> Record:
    final = record(world)
    assert final.state == "failed", final.data
    assert final.data["error"]["code"] == "SampleJobNotOurs"
    assert "neither trusted" in final.data["error"]["message"]
    assert "Steward.PoolRequest.Created" not in world.events.types()
    assert [j["metadata"]["uid"] for j in world.kube().jobs()] == ["f0f0f0f0-0000-4000-8000-000000000000"]
    assert world.kube().deleted == [] or all(k[1] != "Job" for k in world.kube().deleted)
    return final


def test_a_same_named_complete_job_without_our_annotation_is_refused_not_trusted_and_not_deleted() -> None:
    world = make_world()
    world.kube().put_foreign_job(foreign_job(annotated=False))
    assert intake.accept(message(validateWorkload=True), dequeue_count=1, ctx=world.ctx).status == "accepted"
    reconcile(world)
    materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = refused_and_left_alone(world)
    assert "annotation gpu-fleet-steward/request-id=req-0001" in final.data["error"]["message"]


def test_a_replacement_job_with_our_annotation_but_another_uid_is_refused_not_trusted_and_not_deleted() -> None:
    world = make_world()
    ours = to_testing(world)
    kube = world.kube()
    kube.delete_object("batch/v1", "Job", ours["metadata"]["name"], APP_NAMESPACE)  # someone deletes ours
    kube.deleted.clear()
    kube.put_foreign_job(foreign_job(annotated=True))  # ... and creates a Complete look-alike
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = refused_and_left_alone(world)
    assert ours["metadata"]["uid"] in final.data["error"]["message"]


def test_after_a_lost_save_a_same_named_job_with_our_annotation_but_another_image_is_refused() -> None:
    world = make_world()
    assert intake.accept(message(validateWorkload=True), dequeue_count=1, ctx=world.ctx).status == "accepted"
    reconcile(world)
    materialise(world.aks, world.kube(), CLUSTER, "gpunp")
    reconcile(world, seconds=world.policy.poll_interval_s)
    testing = record(world)
    [ours] = world.kube().jobs()
    # the record as it was before the create's uid was saved (a lost save), and an impostor in its place
    lost = Record(kind=testing.kind, id=testing.id, state=testing.state, etag=testing.etag,
                  data={k: v for k, v in testing.data.items() if k != "job"}, created_at=testing.created_at,
                  updated_at=testing.updated_at, next_at=testing.next_at, history=testing.history)
    world.ledger.save(lost)
    world.kube().objects.clear()
    world.kube().put_foreign_job(foreign_job(annotated=True, image=f"docker.io/library/busybox@{DIGEST}"))
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = refused_and_left_alone(world)
    assert "pod template" in final.data["error"]["message"]
    assert ours["metadata"]["uid"] != "f0f0f0f0-0000-4000-8000-000000000000"


def test_after_a_lost_save_our_own_job_is_adopted_by_annotation_and_template_and_then_cleaned_up() -> None:
    world = make_world()
    job = to_testing(world)
    testing = record(world)
    lost = Record(kind=testing.kind, id=testing.id, state=testing.state, etag=testing.etag,
                  data={k: v for k, v in testing.data.items() if k != "job"}, created_at=testing.created_at,
                  updated_at=testing.updated_at, next_at=testing.next_at, history=testing.history)
    world.ledger.save(lost)
    complete(world, job)
    reconcile(world, seconds=world.policy.poll_interval_s)
    final = record(world)
    assert final.state == "succeeded", final.data
    assert world.kube().jobs() == []


def test_our_job_is_deleted_only_when_its_uid_is_the_one_recorded() -> None:
    world = make_world()
    job = to_testing(world)
    complete(world, job)
    reconcile(world, seconds=world.policy.poll_interval_s)
    assert record(world).state == "succeeded"
    assert world.kube().deleted == [("batch/v1", "Job", APP_NAMESPACE, job_name(request()))]


def test_a_failed_foreign_job_is_not_reported_as_our_failure_either() -> None:
    world = make_world()
    ours = to_testing(world)
    world.kube().objects.clear()
    impostor = foreign_job(annotated=False)
    impostor["status"] = {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "Forged"}]}
    world.kube().put_foreign_job(impostor)
    final = advance(record(world), world.ctx)
    assert final.data["error"]["code"] == "SampleJobNotOurs" and "Forged" not in final.data["error"]["message"]
    assert ours["metadata"]["uid"] != impostor["metadata"].get("uid")

"""The sample GPU job: a one-shot Job on the new pool that proves a pod can use a GPU (state ``testing``).

Requested with ``validateWorkload``. The Job runs in the app's own namespace with least privilege
(no token, non-root, Pod Security ``restricted``), and is trusted only when it is provably the one this
request created: the uid the API server gave it, recorded in the ledger, or, when that save was lost,
its annotation and exactly the pod template this request would create. A Job that is not ours is
never read as a pass and never deleted. Job conditions as batch/v1 defines them
(https://kubernetes.io/docs/concepts/workloads/controllers/job/#job-termination-and-cleanup).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import gpu_sizes
from shared.fleet.stack import GPU_RESOURCE
from shared.kernel.errors import Conflict, NotFound
from shared.kernel.ports import Record
from shared.kernel.steps import Transition, stay
from shared.pools import nap
from shared.pools import spec as pool_spec
from shared.pools.cleanup import fail_created
from shared.pools.outcomes import succeed
from shared.pools.policy import PoolRequestPolicy
from shared.pools.records import JobRef, SampleJobResult, builtins, typed
from shared.pools.request import PoolRequest

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.pool_creation")

PAUSED_RETRY_S = 60.0

#: The sample job's numeric user and group. Pod Security ``restricted`` (the app's namespace enforces it)
#: needs runAsNonRoot, and a numeric runAsUser lets the kubelet verify it without trusting the image's
#: USER. NVIDIA's CUDA samples do not need root: the vectorAdd binary is world-executable and the GPU
#: device nodes the device plugin passes in are mode 0666, so any non-root uid can use the GPU (NVIDIA's
#: own OpenShift check of cuda-sample runs it with runAsNonRoot under an arbitrary non-root uid). 65534
#: ("nobody") would do as well; 1000 is the conventional first unprivileged user.
SAMPLE_JOB_UID = 1000
JOB_API = "batch/v1"


def app_namespace(ctx: Context) -> str:
    """Where the sample job runs: the app's own namespace (setting STEWARD_NAMESPACE, default
    gpu-fleet-steward, infra/kubernetes/namespace.yaml), where its Role grants Jobs create/get/delete."""
    return ctx.settings.namespace


def job_name(req: PoolRequest) -> str:
    digest = hashlib.sha256(req.request_id.encode()).hexdigest()[:10]
    return f"steward-gpu-check-{req.pool_name}-{digest}"


def gpu_request_resource(req: PoolRequest) -> str:
    """What the sample job asks for: one MIG instance on Mixed pools, else one ``nvidia.com/gpu``."""
    if req.mig_strategy == "Mixed" and req.mig_profile:
        size = gpu_sizes.lookup(req.vm_size)
        profile = size.mig_profile(req.mig_profile) if size else None
        if profile is not None:
            return profile.resource
    return GPU_RESOURCE


def sample_job(req: PoolRequest, *, policy: PoolRequestPolicy, nap_cluster: bool, namespace: str) -> dict[str, Any]:
    """A one-shot Job pinned to the pool, tolerating its taints, asking for one GPU (or MIG slice).

    Least privilege: it runs in the app's own ``namespace``, from an image pinned by digest, with no
    service-account token mounted (it never calls the API server) and a security context that passes
    Pod Security ``restricted``: non-root numeric user, no privilege escalation, every capability
    dropped, the runtime's default seccomp profile. Its annotation names the request that made it.
    """
    selector = {nap.NODEPOOL_LABEL if nap_cluster else pool_spec.AGENTPOOL_LABEL: req.pool_name}
    tolerations = [{"key": k, "operator": "Equal", "value": v, "effect": e} if v else
                   {"key": k, "operator": "Exists", "effect": e} for k, v, e in pool_spec.pool_taints(req)]
    resource = gpu_request_resource(req)
    container: dict[str, Any] = {
        "name": "gpu-check", "image": policy.sample_job_image, "resources": {"limits": {resource: "1"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "runAsUser": SAMPLE_JOB_UID, "runAsGroup": SAMPLE_JOB_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if policy.sample_job_args:
        container["args"] = list(policy.sample_job_args)
    return {
        "apiVersion": JOB_API,
        "kind": "Job",
        "metadata": {"name": job_name(req), "namespace": namespace,
                     "labels": {nap.LABEL_MANAGED_BY: nap.MANAGED_BY},
                     "annotations": {nap.ANNOTATION_REQUEST_ID: req.request_id}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": policy.sample_job_timeout_s,
            "ttlSecondsAfterFinished": 600,
            "template": {"metadata": {"labels": {nap.LABEL_MANAGED_BY: nap.MANAGED_BY}},
                         "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                                  "securityContext": {"runAsNonRoot": True, "runAsUser": SAMPLE_JOB_UID,
                                                      "runAsGroup": SAMPLE_JOB_UID,
                                                      "seccompProfile": {"type": "RuntimeDefault"}},
                                  "nodeSelector": selector, "tolerations": tolerations,
                                  "containers": [container]}},
        },
    }


class JobOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RUNNING = "running"


def job_outcome(job: Mapping[str, Any]) -> JobOutcome:
    """Whether a Job succeeded, failed or still runs, from its status (batch/v1 JobStatus)."""
    status = job.get("status") or {}
    for cond in status.get("conditions") or ():
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return JobOutcome.SUCCEEDED
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return JobOutcome.FAILED
    if int(status.get("succeeded") or 0) >= 1:
        return JobOutcome.SUCCEEDED
    backoff = int(((job.get("spec") or {}).get("backoffLimit")) or 0)
    if int(status.get("failed") or 0) > backoff:
        return JobOutcome.FAILED
    return JobOutcome.RUNNING


def job_uid(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("uid") or "")


def _pod_essentials(job: Mapping[str, Any]) -> dict[str, Any]:
    """What decides what the sample job's pod runs and as whom (fields the API server does not default)."""
    pod = (((job.get("spec") or {}).get("template") or {}).get("spec")) or {}
    return {"automountServiceAccountToken": pod.get("automountServiceAccountToken"),
            "securityContext": pod.get("securityContext"), "nodeSelector": pod.get("nodeSelector"),
            "containers": [{"name": c.get("name"), "image": c.get("image"), "command": c.get("command"),
                            "args": c.get("args"), "securityContext": c.get("securityContext"),
                            "limits": (c.get("resources") or {}).get("limits")}
                           for c in pod.get("containers") or ()],
            "initContainers": len(pod.get("initContainers") or ())}


def job_not_ours(job: Mapping[str, Any], *, request_id: str, uid: str, expected: Mapping[str, Any]) -> str | None:
    """Why ``job`` is not the sample job this request created, or None when it is.

    It must carry the request's annotation, and have the uid recorded in the ledger when the request
    created it. With no uid recorded (the create went through but saving the record did not), the Job
    is adopted only if it runs exactly the pod this request would create. A Job that is not ours is
    never read as a pass and never deleted: a same-named Job made by someone else could otherwise
    "prove" a broken pool, or be deleted by the steward.
    """
    meta = job.get("metadata") or {}
    claimed = (meta.get("annotations") or {}).get(nap.ANNOTATION_REQUEST_ID)
    if claimed != request_id:
        return (f"it does not carry this request's annotation {nap.ANNOTATION_REQUEST_ID}={request_id}"
                + (f" (it says {str(claimed)[:80]!r})" if claimed else ""))
    if uid:
        if job_uid(job) != uid:
            return f"its uid {job_uid(job) or '(none)'} is not {uid}, the uid of the Job this request created"
        return None
    if _pod_essentials(job) != _pod_essentials(expected):
        return "its pod template is not the one this request creates (image, command, security context or placement)"
    return None


def delete_job(ctx: Context, req: PoolRequest, job: Mapping[str, Any], *, uid: str) -> None:
    """Delete the sample job, only when ``job`` (just read) is the one this request created."""
    meta = job.get("metadata") or {}
    if not uid or job_uid(job) != uid:
        log.warning("pool request %s: not deleting Job %s/%s (uid %s), not the one it created (%s)", req.request_id,
                    meta.get("namespace"), meta.get("name"), job_uid(job), uid or "none recorded")
        return
    try:  # the uid travels as a precondition: a Job that took the name since the read is not deleted
        ctx.access.kube(req.cluster).delete_object(JOB_API, "Job", str(meta.get("name")), str(meta.get("namespace")),
                                                   uid=uid)
    except NotFound:
        return
    except Conflict:
        log.warning("pool request %s: Job %s/%s was replaced by another since it was read; not deleted",
                    req.request_id, meta.get("namespace"), meta.get("name"))


def job_reason(job: Mapping[str, Any]) -> str:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Failed":
            return f"{cond.get('reason', '')} {cond.get('message', '')}".strip() or "failed"
    return "its pod failed"


def step_testing(record: Record, ctx: Context, *, now: float, policy: PoolRequestPolicy) -> Transition:
    """Run the sample job once, judge its outcome, delete it, and end the request."""
    data, req = typed(record)
    kube = ctx.access.kube(req.cluster)
    name, namespace = job_name(req), app_namespace(ctx)
    expected = sample_job(req, policy=policy, nap_cluster=data.nap, namespace=namespace)
    recorded = data.job
    uid = recorded.uid if recorded is not None and recorded.name == name and recorded.namespace == namespace else ""
    deadline = data.deadline if data.deadline is not None else now + policy.sample_job_timeout_s
    poll = now + policy.poll_interval_s
    job = kube.get_object(JOB_API, "Job", name, namespace)
    if job is None:
        if now > deadline:
            return fail_created(record, ctx, now=now, policy=policy, data=data, req=req, code="SampleJobTimeout",
                                message=f"the sample GPU job could not run within {policy.sample_job_timeout_s}s")
        if ctx.settings.paused:
            return stay(record, now=now, until=now + PAUSED_RETRY_S, waiting="STEWARD_PAUSED is set: no writes")
        try:
            created = kube.create_object(expected)
        except Conflict:  # a Job of that name appeared since the read: judged (ours or not) on the next pass
            return stay(record, now=now, until=poll)
        # the uid the API server gave it: the only proof, later, that a Job of this name is ours
        return stay(record, now=now, until=poll, job=builtins(JobRef(name=name, namespace=namespace,
                                                                      uid=job_uid(created))))
    problem = job_not_ours(job, request_id=req.request_id, uid=uid, expected=expected)
    if problem is not None:
        return fail_created(record, ctx, now=now, policy=policy, data=data, req=req, code="SampleJobNotOurs",
                            message=f"refused to use the Job {namespace}/{name}: {problem}. It was neither trusted as "
                                    "a pass nor deleted; find out who created it",
                            job=JobRef(name=name, namespace=namespace, uid=uid, found_uid=job_uid(job)))
    adopted: dict[str, Any] = {}
    if not uid:  # adopted: ours by annotation and template, created by a pass whose save was lost
        uid = job_uid(job)
        adopted = {"job": builtins(JobRef(name=name, namespace=namespace, uid=uid))}
    outcome = job_outcome(job)
    if outcome is JobOutcome.SUCCEEDED:
        delete_job(ctx, req, job, uid=uid)
        return succeed(_with(record, adopted), now=now, stack=data.stack, sample_job=SampleJobResult.SUCCEEDED)
    if outcome is JobOutcome.FAILED:
        delete_job(ctx, req, job, uid=uid)
        return fail_created(_with(record, adopted), ctx, now=now, policy=policy, data=data, req=req,
                            code="SampleJobFailed",
                            message=f"the sample GPU job {namespace}/{name} failed: {job_reason(job)}")
    if now > deadline:
        delete_job(ctx, req, job, uid=uid)
        return fail_created(_with(record, adopted), ctx, now=now, policy=policy, data=data, req=req,
                            code="SampleJobTimeout",
                            message=f"the sample GPU job did not complete within {policy.sample_job_timeout_s}s")
    return stay(record, now=now, until=poll, **adopted)


def _with(record: Record, data: Mapping[str, Any]) -> Record:
    return msgspec.structs.replace(record, data={**record.data, **data}) if data else record

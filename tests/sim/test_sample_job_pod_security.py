"""Pod Security Admission in the simulator, and the app's sample GPU job running under it.

The simulator side (sim/kube/psa.py): a namespace labelled ``pod-security.kubernetes.io/enforce:
restricted`` (the app's own, infra/kubernetes/namespace.yaml) refuses a pod that breaks the level with
the API server's 403 ``violates PodSecurity "restricted:latest": ...``; a Job whose template breaks it
gets no pod, only ``FailedCreate`` events, as the real Job controller does. A pod that passes is stored
with its ``automountServiceAccountToken`` and security contexts as sent.

The app side: a real pool request (real adapters, the simulator's manual clock) creates its pool, runs
the sample job in the app's namespace under ``restricted`` and succeeds; a same-named Job that someone
else created there, already Complete, is refused and left alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.testing import SimHandle

SUB = "00000000-0000-0000-0000-0000000000e5"
T4 = "Standard_NC4as_T4_v3"
APP_NS = "gpu-fleet-steward"
SCENARIO: dict[str, Any] = {
    "seed": 11, "clock": {"manual": True},
    "timings": {"pool_create_s": 30, "node_ready_s": 10, "pod_start_s": 2, "job_run_s": 5},
    "subscriptions": [{"id": SUB, "clusters": [{
        "name": "psa", "resource_group": "rg-psa", "tags": {"gpu-fleet-steward": "enabled"},
        "pools": [{"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}]}],
}
RESTRICTED_OK: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                 "runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.fixture(scope="module")
def wired() -> Iterator[tuple[SimHandle, Any]]:
    from tests.sim.steward_on_sim import steward_on

    with steward_on(SCENARIO) as (sim, ctx):
        sim.control("POST", "/advance", {"seconds": 15})
        yield sim, ctx


@pytest.fixture(scope="module")
def core(wired: tuple[SimHandle, Any]) -> client.CoreV1Api:
    return client.CoreV1Api(wired[0].kube_client("psa"))


@pytest.fixture(scope="module")
def batch(wired: tuple[SimHandle, Any]) -> client.BatchV1Api:
    return client.BatchV1Api(wired[0].kube_client("psa"))


def pod(name: str, *, pod_context: dict[str, Any] | None = None, context: dict[str, Any] | None = None,
        **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "registry.example/app@sha256:" + "0" * 64}
    if context is not None:
        container["securityContext"] = context
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                            "spec": {"containers": [container], **spec}}
    if pod_context is not None:
        body["spec"]["securityContext"] = pod_context
    return body


def refusal(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, body)
    assert refused.value.status == 403
    status = json.loads(refused.value.body)
    assert status["reason"] == "Forbidden" and status["details"]["kind"] == "pods"
    return str(status["message"])


# ----------------------------------------------------------------------------- the simulator


def test_the_apps_namespace_enforces_pod_security_restricted(core: client.CoreV1Api) -> None:
    labels = core.read_namespace(APP_NS).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_a_pod_without_a_security_context_is_refused_with_the_api_servers_message(core: client.CoreV1Api) -> None:
    # the message of kubernetes.io/docs/concepts/security/pod-security-admission for this pod, reason by reason
    assert refusal(core, APP_NS, pod("bare")) == (
        'pods "bare" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or '
        '"Localhost")')


@pytest.mark.parametrize(("change", "reason"), [
    pytest.param({"runAsUser": 0}, 'runAsUser=0 (container "c" must not set runAsUser=0)', id="root user"),
    pytest.param({"allowPrivilegeEscalation": True},
                 'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false)',
                 id="privilege escalation"),
    pytest.param({"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
                 'unrestricted capabilities (container "c" must not include "SYS_ADMIN" in securityContext.capabilities.add)',
                 id="an added capability (the restricted check replaces the baseline one)"),
    pytest.param({"privileged": True}, 'privileged (container "c" must not set securityContext.privileged=true)',
                 id="privileged"),
])
def test_each_restricted_rule_is_enforced_alone(core: client.CoreV1Api, change: dict[str, Any], reason: str) -> None:
    message = refusal(core, APP_NS, pod("one-rule", context={**RESTRICTED_OK, **change}))
    assert message == f'pods "one-rule" is forbidden: violates PodSecurity "restricted:latest": {reason}'


def test_a_restricted_pod_is_admitted_and_keeps_its_token_and_security_fields(core: client.CoreV1Api) -> None:
    body = pod("fine", pod_context={"runAsNonRoot": True, "runAsUser": 1000,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
               context={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
               automountServiceAccountToken=False)
    core.create_namespaced_pod(APP_NS, body)
    stored = core.api_client.sanitize_for_serialization(core.read_namespaced_pod("fine", APP_NS))
    assert stored["spec"]["automountServiceAccountToken"] is False
    assert stored["spec"]["securityContext"] == body["spec"]["securityContext"]
    assert stored["spec"]["containers"][0]["securityContext"] == body["spec"]["containers"][0]["securityContext"]
    core.delete_namespaced_pod("fine", APP_NS, grace_period_seconds=0)


def test_a_namespace_without_the_label_admits_any_pod(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("anything-goes"))
    core.delete_namespaced_pod("anything-goes", "default", grace_period_seconds=0)


def test_baseline_refuses_privileged_pods_but_not_a_missing_seccomp_profile() -> None:
    from sim.kube import psa

    labels = {"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "v1.30"}
    assert psa.admission_error(pod("plain"), labels) is None
    assert psa.admission_error(pod("priv", context={"privileged": True}, hostNetwork=True), labels) == (
        'pods "priv" is forbidden: violates PodSecurity "baseline:v1.30": host namespaces (hostNetwork=true), '
        'privileged (container "c" must not set securityContext.privileged=true)')
    assert psa.admission_error(pod("priv", context={"privileged": True}), {}) is None  # unlabelled: privileged
    assert psa.admission_error(pod("caps", context={"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]},
                                                    "seccompProfile": {"type": "Unconfined"}}), labels) == (
        'pods "caps" is forbidden: violates PodSecurity "baseline:v1.30": non-default capabilities (container "c" '
        'must not include "SYS_ADMIN" in securityContext.capabilities.add), seccompProfile (container "c" must not '
        'set securityContext.seccompProfile.type to "Unconfined")')


def test_a_host_path_volume_is_reported_once_under_restricted_as_a_restricted_volume_type() -> None:
    from sim.kube import psa

    body = pod("host", context=RESTRICTED_OK, hostPID=True, hostNetwork=True,
               volumes=[{"name": "root", "hostPath": {"path": "/"}}, {"name": "scratch", "emptyDir": {}}])
    assert psa.admission_error(body, {"pod-security.kubernetes.io/enforce": "restricted"}) == (
        'pods "host" is forbidden: violates PodSecurity "restricted:latest": host namespaces (hostNetwork=true, '
        'hostPID=true), restricted volume types (volume "root" uses restricted volume type "hostPath")')


def test_a_node_debug_pod_gets_the_same_reasons_in_the_same_order_as_on_a_real_cluster() -> None:
    """The warning a real cluster printed for the pod of `kubectl debug node/...` (IBM Cloud's OpenShift
    docs, "Configuring pod security"): same reasons, same details, same order."""
    from sim.kube import psa

    debug = {"metadata": {"name": "node-debugger"}, "spec": {
        "hostNetwork": True, "hostPID": True, "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        "containers": [{"name": "container-00", "image": "registry.example/debug@sha256:" + "2" * 64,
                        "securityContext": {"privileged": True, "runAsUser": 0}}]}}
    real = ('host namespaces (hostNetwork=true, hostPID=true), privileged (container "container-00" must not set '
            'securityContext.privileged=true), allowPrivilegeEscalation != false (container "container-00" must set '
            'securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "container-00" must '
            'set securityContext.capabilities.drop=["ALL"]), restricted volume types (volume "host" uses restricted '
            'volume type "hostPath"), runAsNonRoot != true (pod or container "container-00" must set '
            'securityContext.runAsNonRoot=true), runAsUser=0 (container "container-00" must not set runAsUser=0), '
            'seccompProfile (pod or container "container-00" must set securityContext.seccompProfile.type to '
            '"RuntimeDefault" or "Localhost")')
    assert ", ".join(psa.violations(debug["spec"], "restricted")) == real


def test_a_job_whose_template_breaks_restricted_gets_no_pod_and_a_failed_create_event(
        wired: tuple[SimHandle, Any], core: client.CoreV1Api, batch: client.BatchV1Api) -> None:
    sim, _ = wired
    template = pod("x")
    batch.create_namespaced_job(APP_NS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "rooty"},
                                         "spec": {"backoffLimit": 0, "template": {
                                             "spec": {**template["spec"], "restartPolicy": "Never"}}}})
    sim.control("POST", "/advance", {"seconds": 30})
    pods = core.list_namespaced_pod(APP_NS, label_selector="job-name=rooty").items
    assert pods == []
    job = batch.read_namespaced_job("rooty", APP_NS)
    assert not job.status.succeeded and not (job.status.conditions or [])
    events = [e for e in core.list_namespaced_event(APP_NS).items
              if e.involved_object.name == "rooty" and e.reason == "FailedCreate"]
    assert len(events) == 1 and events[0].type == "Warning"
    assert events[0].message.startswith('Error creating: pods "rooty-')
    assert 'is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false' in events[0].message
    batch.delete_namespaced_job("rooty", APP_NS, propagation_policy="Background")


# ----------------------------------------------------------------------------- the app on the simulator


def run_request(sim: SimHandle, ctx: Any, request_id: str, pool: str, *, seen: list[dict[str, Any]],
                core: client.CoreV1Api) -> Any:
    """Accept a request with validateWorkload and advance it (and the clock) until it ends; every pod
    seen in the app's namespace meanwhile is appended to ``seen``."""
    from shared.pools.intake import accept
    from shared.pools.records import KIND, TERMINAL_STATES
    from shared.pools.steps import advance

    body = {"schemaVersion": "1", "requestId": request_id, "requester": "team-vision@contoso.com",
            "cluster": sim.cluster("psa")["id"], "poolName": pool, "vmSize": T4, "count": 1, "validateWorkload": True}
    assert accept(json.dumps(body), dequeue_count=1, ctx=ctx).status == "accepted"
    for _ in range(200):
        record = ctx.ledger.get(KIND, request_id)
        if record.state in TERMINAL_STATES:
            return record
        wait = record.next_at - ctx.clock.now()
        if wait > 0:
            sim.control("POST", "/advance", {"seconds": min(wait, 5.0)})
            for p in core.list_namespaced_pod(APP_NS).items:
                if (p.metadata.labels or {}).get("job-name", "").startswith(f"steward-gpu-check-{pool}-"):
                    seen.append(core.api_client.sanitize_for_serialization(p))
            continue
        ctx.ledger.save(advance(record, ctx))
    raise AssertionError(f"request {request_id} did not end: {ctx.ledger.get(KIND, request_id)}")


def test_the_apps_sample_job_runs_under_restricted_in_its_own_namespace_and_proves_the_pool(
        wired: tuple[SimHandle, Any], core: client.CoreV1Api) -> None:
    sim, ctx = wired
    seen: list[dict[str, Any]] = []
    record = run_request(sim, ctx, "psa-sample-ok", "gpuok", seen=seen, core=core)
    assert record.state == "succeeded", record.data
    assert record.data["outcome"]["sample_job"] == "succeeded"
    assert seen, "the sample job's pod never appeared in the app's namespace"
    spec = seen[-1]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    assert spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["containers"][0]["image"].split("@")[1].startswith("sha256:")
    assert [p["metadata"]["name"] for p in seen if p["status"].get("phase") == "Succeeded"]


def test_a_same_named_complete_job_someone_else_made_is_refused_and_left_in_place(
        wired: tuple[SimHandle, Any], core: client.CoreV1Api, batch: client.BatchV1Api) -> None:
    from shared.pools.request import PoolRequest
    from shared.pools.sample_job import job_name

    sim, ctx = wired
    name = job_name(PoolRequest(schema_version="1", request_id="psa-squatted", requester="x",
                                cluster=sim.cluster("psa")["id"], pool_name="gpusq", vm_size=T4, count=1))
    # A Job that passes restricted and completes on a system node: it "succeeds" without any GPU.
    batch.create_namespaced_job(APP_NS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "registry.example/ok@sha256:" + "1" * 64, "securityContext": RESTRICTED_OK}]}}}})
    squatter_uid = batch.read_namespaced_job(name, APP_NS).metadata.uid
    record = run_request(sim, ctx, "psa-squatted", "gpusq", seen=[], core=core)
    assert record.state == "failed", record.data
    assert record.data["error"]["code"] == "SampleJobNotOurs"
    assert record.data["outcome"].get("sample_job") != "succeeded"
    still = batch.read_namespaced_job(name, APP_NS)
    assert still.metadata.uid == squatter_uid and still.metadata.deletion_timestamp is None

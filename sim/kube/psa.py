"""Pod Security Admission, ``enforce`` mode, as the API server runs it on pod creation.

The app's sample GPU job runs in the app's own namespace, which the platform labels
``pod-security.kubernetes.io/enforce: restricted``. On a real cluster a pod that breaks that level is
refused at creation with 403 Forbidden, so a Job whose template breaks it never gets a pod and never
completes. The simulator must refuse the same pods with the same message, or the app's sample job
would pass here and hang in production.

What is modelled (kubernetes/kubernetes staging/src/k8s.io/pod-security-admission):

- the namespace's ``pod-security.kubernetes.io/enforce`` label picks the level (api/helpers.go
  PolicyToEvaluate; no label, or ``privileged``, = nothing is checked); the ``enforce-version`` label
  only changes the level's name in the message: the latest checks are applied whatever it says;
- the checks of ``baseline`` (host namespaces, host ports, privileged, and the "overlapping" ones
  that a restricted check replaces: capabilities beyond the baseline set, hostPath volumes, a seccomp
  type other than RuntimeDefault/Localhost) and, for ``restricted``, the non-overlapping baseline
  checks plus allowPrivilegeEscalation, capabilities drop ALL (add only NET_BIND_SERVICE), volume
  types, runAsNonRoot, runAsUser=0 and seccompProfile RuntimeDefault/Localhost (policy/check_*.go,
  each message copied from its file; the real ``restricted`` message of a 1.33 cluster quoted in
  public docs lists the same reasons in the same order);
- the order of the reasons: baseline checks, then the overlapping baseline checks (baseline) or the
  restricted checks (restricted), each in file-name order, the order ``init()`` registers them in
  (policy/registry.go EvaluatePod);
- the message: ``pods "<name>" is forbidden: violates PodSecurity "restricted:latest": <reason>
  (<detail>), ...`` (admission/admission.go EvaluatePod + forbiddenResponse = apierrors.NewForbidden;
  policy/checks.go AggregateCheckResult.ForbiddenDetail).

Not modelled: exemptions (usernames, runtime classes, namespaces of the AdmissionConfiguration),
``warn``/``audit`` labels (a warning header on workload objects), user-namespace relaxations, and the
rarely used checks (AppArmor, SELinux, /proc mount, sysctls, Windows host process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sim.kube.errors import ApiError
from sim.kube.objects import iso

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")

# policy/check_capabilities_baseline.go: what a baseline pod may add
_BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
# policy/check_restrictedVolumes.go: the volume sources a restricted pod may use
_RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                 "persistentVolumeClaim", "projected", "secret"})

Result = tuple[str, str] | None  # (ForbiddenReason, ForbiddenDetail) or allowed


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """policy/visitor.go visitContainers: init containers, containers, ephemeral containers."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or ()


def _sc(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("securityContext") or {}


def _quoted(items: list[str]) -> str:
    """policy/helpers.go joinQuote: ``"a", "b"``."""
    return ", ".join(f'"{item}"' for item in items)


def _names(kind: str, names: list[str]) -> str:
    """``container "a"`` / ``containers "a", "b"`` (policy/helpers.go pluralize + joinQuote)."""
    return f"{kind if len(names) == 1 else kind + 's'} {_quoted(names)}"


# ----------------------------------------------------------------------------- baseline


def _host_namespaces(spec: Mapping[str, Any]) -> Result:  # check_hostNamespaces.go
    used = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    return ("host namespaces", ", ".join(used)) if used else None


def _host_path_volumes(spec: Mapping[str, Any]) -> Result:  # check_hostPathVolumes.go
    bad = [str(v.get("name", "")) for v in spec.get("volumes") or () if "hostPath" in v]
    return ("hostPath volumes", _names("volume", bad)) if bad else None


def _host_ports(spec: Mapping[str, Any]) -> Result:  # check_hostPorts.go
    bad, ports = [], set()
    for c in _containers(spec):
        used = {str(p["hostPort"]) for p in c.get("ports") or () if p.get("hostPort")}
        if used:
            bad.append(str(c.get("name", "")))
            ports |= used
    if not bad:
        return None
    return "hostPort", f"{_names('container', bad)} {'uses' if len(bad) == 1 else 'use'} " \
                       f"{'hostPort' if len(ports) == 1 else 'hostPorts'} {', '.join(sorted(ports))}"


def _privileged(spec: Mapping[str, Any]) -> Result:  # check_privileged.go
    bad = [str(c.get("name", "")) for c in _containers(spec) if _sc(c).get("privileged") is True]
    return ("privileged", f"{_names('container', bad)} must not set securityContext.privileged=true") if bad else None


def _capabilities_baseline(spec: Mapping[str, Any]) -> Result:  # check_capabilities_baseline.go
    bad, caps = [], set()
    for c in _containers(spec):
        added = {str(a) for a in (_sc(c).get("capabilities") or {}).get("add") or ()} - _BASELINE_CAPABILITIES
        if added:
            bad.append(str(c.get("name", "")))
            caps |= added
    if not bad:
        return None
    return "non-default capabilities", f"{_names('container', bad)} must not include " \
                                       f"{_quoted(sorted(caps))} in securityContext.capabilities.add"


def _seccomp_baseline(spec: Mapping[str, Any]) -> Result:  # check_seccompProfile_baseline.go (1.19+)
    setters: list[str] = []
    values: set[str] = set()
    profile = _sc(spec).get("seccompProfile")
    if profile is not None and not _valid_seccomp(profile.get("type")):
        setters.append("pod")
        values.add(str(profile.get("type", "")))
    bad = []
    for c in _containers(spec):
        profile = _sc(c).get("seccompProfile")
        if profile is not None and not _valid_seccomp(profile.get("type")):
            bad.append(str(c.get("name", "")))
            values.add(str(profile.get("type", "")))
    if bad:
        setters.append(_names("container", bad))
    if not setters:
        return None
    return "seccompProfile", f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to " \
                             f"{_quoted(sorted(values))}"


# ----------------------------------------------------------------------------- restricted


def _allow_privilege_escalation(spec: Mapping[str, Any]) -> Result:  # check_allowPrivilegeEscalation.go
    bad = [str(c.get("name", "")) for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return None
    return "allowPrivilegeEscalation != false", \
        f"{_names('container', bad)} must set securityContext.allowPrivilegeEscalation=false"


def _capabilities_restricted(spec: Mapping[str, Any]) -> Result:  # check_capabilities_restricted.go
    missing, adding, forbidden = [], [], set()
    for c in _containers(spec):
        caps = _sc(c).get("capabilities")
        if caps is None:
            missing.append(str(c.get("name", "")))
            continue
        if "ALL" not in (caps.get("drop") or ()):
            missing.append(str(c.get("name", "")))
        extra = {str(a) for a in caps.get("add") or () if a != "NET_BIND_SERVICE"}
        if extra:
            adding.append(str(c.get("name", "")))
            forbidden |= extra
    details = []
    if missing:
        details.append(f'{_names("container", missing)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_names('container', adding)} must not include "
                       f"{_quoted(sorted(forbidden))} in securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec: Mapping[str, Any]) -> Result:  # check_restrictedVolumes.go
    bad, kinds = [], set()
    for v in spec.get("volumes") or ():
        source = [k for k in v if k != "name"]
        if source and all(k not in _RESTRICTED_VOLUMES for k in source):
            bad.append(str(v.get("name", "")))
            kinds.add(source[0])
    if not bad:
        return None
    return "restricted volume types", f"{_names('volume', bad)} {'uses' if len(bad) == 1 else 'use'} " \
                                      f"{'restricted volume type' if len(kinds) == 1 else 'restricted volume types'} " \
                                      f"{_quoted(sorted(kinds))}"


def _run_as_non_root(spec: Mapping[str, Any]) -> Result:  # check_runAsNonRoot.go
    setters: list[str] = []
    pod_value = _sc(spec).get("runAsNonRoot")
    if pod_value is False:
        setters.append("pod")
    explicit, implicit = [], []
    for c in _containers(spec):
        value = _sc(c).get("runAsNonRoot")
        if value is not None:
            if value is False:
                explicit.append(str(c.get("name", "")))
        elif pod_value is not True:
            implicit.append(str(c.get("name", "")))
    if explicit:
        setters.append(_names("container", explicit))
    if setters:
        return "runAsNonRoot != true", f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false"
    if implicit:
        return "runAsNonRoot != true", f"pod or {_names('container', implicit)} must set securityContext.runAsNonRoot=true"
    return None


def _run_as_user(spec: Mapping[str, Any]) -> Result:  # check_runAsUser.go
    setters = ["pod"] if _sc(spec).get("runAsUser") == 0 else []
    bad = [str(c.get("name", "")) for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if bad:
        setters.append(_names("container", bad))
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


def _valid_seccomp(kind: Any) -> bool:
    return kind in ("RuntimeDefault", "Localhost")


def _seccomp_restricted(spec: Mapping[str, Any]) -> Result:  # check_seccompProfile_restricted.go
    setters: list[str] = []
    values: set[str] = set()
    pod_profile = _sc(spec).get("seccompProfile")
    pod_set = False
    if pod_profile is not None:
        if not _valid_seccomp(pod_profile.get("type")):
            setters.append("pod")
            values.add(str(pod_profile.get("type", "")))
        else:
            pod_set = True
    explicit, implicit = [], []
    for c in _containers(spec):
        profile = _sc(c).get("seccompProfile")
        if profile is not None:
            if not _valid_seccomp(profile.get("type")):
                explicit.append(str(c.get("name", "")))
                values.add(str(profile.get("type", "")))
        elif not pod_set:
            implicit.append(str(c.get("name", "")))
    if explicit:
        setters.append(_names("container", explicit))
    if setters:
        return "seccompProfile", f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to " \
                                 f"{_quoted(sorted(values))}"
    if implicit:
        return "seccompProfile", f'pod or {_names("container", implicit)} must set securityContext.seccompProfile.type ' \
                                 'to "RuntimeDefault" or "Localhost"'
    return None


# registration order = Go file-name order of policy/check_*.go (init() runs per file, sorted).
# policy/registry.go EvaluatePod: baseline checks, then either the "overlapping" baseline checks
# (Overlap: true, replaced by a stricter restricted check) at baseline, or the restricted checks.
# hostPath volumes is replaced by restricted volume types (check_restrictedVolumes.go OverrideCheckIDs).
BASELINE: tuple[Callable[[Mapping[str, Any]], Result], ...] = (_host_namespaces, _host_ports, _privileged)
BASELINE_OVERLAPPING: tuple[Callable[[Mapping[str, Any]], Result], ...] = (
    _capabilities_baseline, _host_path_volumes, _seccomp_baseline)
RESTRICTED: tuple[Callable[[Mapping[str, Any]], Result], ...] = (
    _allow_privilege_escalation, _capabilities_restricted, _restricted_volumes, _run_as_non_root, _run_as_user,
    _seccomp_restricted)


def enforced_level(namespace_labels: Mapping[str, str] | None) -> str:
    """The namespace's enforce level; an unknown value is treated as ``restricted`` (api/helpers.go
    PolicyToEvaluate falls back to the strictest level on a label it cannot parse)."""
    level = (namespace_labels or {}).get(ENFORCE_LABEL, "privileged")
    return level if level in LEVELS else "restricted"


def violations(spec: Mapping[str, Any], level: str) -> list[str]:
    """``reason (detail)`` for each check of ``level`` that the pod spec fails, in the API server's order."""
    if level == "privileged":
        return []
    checks = BASELINE + (RESTRICTED if level == "restricted" else BASELINE_OVERLAPPING)
    found = []
    for check in checks:
        result = check(spec)
        if result is not None:
            reason, detail = result
            found.append(f"{reason} ({detail})" if detail else reason)
    return found


def admission_error(pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None) -> str | None:
    """The 403 message the API server answers for this pod in a namespace with these labels, or None.
    The checks are always the latest ones; the message names the ``enforce-version`` label's value as
    api.LevelVersion.String() does (``restricted:v1.30``), ``latest`` when it is not set."""
    level = enforced_level(namespace_labels)
    found = violations((pod.get("spec") or {}), level)
    if not found:
        return None
    version = (namespace_labels or {}).get(ENFORCE_VERSION_LABEL) or "latest"
    name = str((pod.get("metadata") or {}).get("name") or "Unknown")
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": {", ".join(found)}'


def check_pod(pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None) -> None:
    """Raise the API server's 403 Forbidden when Pod Security Admission refuses this pod."""
    message = admission_error(pod, namespace_labels)
    if message is None:
        return
    name = str((pod.get("metadata") or {}).get("name") or "Unknown")
    raise ApiError(403, "Forbidden", message, {"name": name, "kind": "pods"})


def _namespace_labels(cluster: Any, namespace: str) -> Mapping[str, str]:
    ns = cluster.store["namespaces"].get(("", namespace))
    return dict((ns.obj.get("metadata") or {}).get("labels") or {}) if ns is not None else {}


def admit_pod(cluster: Any, pod: Mapping[str, Any], namespace: str) -> None:
    """Pod creation in ``cluster`` (API or controller): refuse what the namespace's enforce level forbids."""
    check_pod(pod, _namespace_labels(cluster, namespace))


# The event source of each workload controller (kubernetes/kubernetes cmd/kube-controller-manager/app/apps.go,
# batch.go: the names the controllers' event recorders are created with).
_CONTROLLER_COMPONENT = {"Job": "job-controller", "ReplicaSet": "replicaset-controller",
                         "StatefulSet": "statefulset-controller", "DaemonSet": "daemonset-controller"}
_OWNER_API_VERSION = {"Job": "batch/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1"}


def create_controller_pod(cluster: Any, owner: Any, kind: str, pod: dict[str, Any], *,
                          run_s: float | None = None) -> bool:
    """A workload controller (Job, ReplicaSet, StatefulSet, DaemonSet) creating one pod: True when created.
    When admission refuses it (403: Pod Security, a terminating namespace), the controller records a
    ``FailedCreate`` Warning event on its object (``Error creating: <the API's message>``), creates no pod and
    tries again on its next sync; the reconcile of everything else goes on
    (kubernetes/kubernetes pkg/controller/controller_utils.go RealPodControl.createPods: ``FailedCreatePodReason``;
    pkg/controller/replicaset/replica_set.go manageReplicas, pkg/controller/statefulset/stateful_set_control.go,
    pkg/controller/daemon/daemon_controller.go syncNodes, pkg/controller/job/job_controller.go manageJob).
    Repeats update one event per owner (its ``count``, ``lastTimestamp`` and message), as the real event
    recorder aggregates similar events."""
    try:
        cluster.create_pod(pod, run_s=run_s)
        return True
    except ApiError as refused:
        if refused.code != 403:
            raise
        message = f"Error creating: {refused.message}"
        now = _iso(cluster.fleet.now())
        events = cluster.__dict__.setdefault("_psa_failed_create", {})
        event = events.get(owner.meta["uid"])
        if event is not None and cluster.get("events", owner.namespace, event.name) is event:
            event.obj.update(count=int(event.obj.get("count", 1)) + 1, lastTimestamp=now, message=message)
            cluster._modified(event)
            return False
        events[owner.meta["uid"]] = cluster.put("events", {
            "metadata": {"name": f"{owner.name}.{owner.meta['uid'][:8]}", "namespace": owner.namespace},
            "involvedObject": {"kind": kind, "apiVersion": _OWNER_API_VERSION.get(kind, "apps/v1"),
                               "name": owner.name, "namespace": owner.namespace, "uid": owner.meta["uid"]},
            "reason": "FailedCreate", "message": message, "type": "Warning", "count": 1,
            "source": {"component": _CONTROLLER_COMPONENT.get(kind, "kube-controller-manager")},
            "firstTimestamp": now, "lastTimestamp": now})
        return False


def create_job_pod(cluster: Any, job: Any, pod: dict[str, Any], *, run_s: float | None) -> bool:
    """The Job controller creating one pod (``create_controller_pod`` for a Job)."""
    return create_controller_pod(cluster, job, "Job", pod, run_s=run_s)


def _iso(epoch: float) -> str:
    return str(iso(epoch))

"""The workload controllers: Deployment, ReplicaSet, StatefulSet, DaemonSet and Job, each creating
and deleting pods from its template and writing its status.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from sim.kube import psa
from sim.kube.objects import ENCODER, KObj, Node, Pod, controller_of, pod_ready
from sim.kube.scheduler import fits_placement

_DS_TOLERATIONS = [
    {"key": k, "operator": "Exists", "effect": e} for k, e in (
        ("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"), ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule"),
        ("node.kubernetes.io/not-ready", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoSchedule"))]


def _add_daemon_pod_tolerations(spec: dict[str, Any]) -> None:
    """The DaemonSet controller writes these tolerations into every pod it makes (not-ready and
    unreachable NoExecute, the pressure and unschedulable NoSchedule ones, network-unavailable for
    host-network pods), updating a toleration that matches one, else appending
    (pkg/controller/daemon/util/daemonset_util.go ``AddOrUpdateDaemonPodTolerations``;
    pkg/apis/core/v1/helper ``AddOrUpdateTolerationInPodSpec``). Checked against kube-apiserver
    v1.37.2 in tests/realkube, story daemonset_pods."""
    wanted = [("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
              ("node.kubernetes.io/disk-pressure", "NoSchedule"), ("node.kubernetes.io/memory-pressure", "NoSchedule"),
              ("node.kubernetes.io/pid-pressure", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule")]
    if spec.get("hostNetwork"):
        wanted.append(("node.kubernetes.io/network-unavailable", "NoSchedule"))
    tolerations = list(spec.get("tolerations") or [])
    for key, effect in wanted:
        toleration = {"key": key, "operator": "Exists", "effect": effect}
        same = next((i for i, t in enumerate(tolerations) if t.get("key") == key and t.get("effect") == effect
                     and (t.get("operator") or "Equal") == "Exists" and not t.get("value")), None)
        if same is None:
            tolerations.append(toleration)
        else:
            tolerations[same] = toleration
    spec["tolerations"] = tolerations


def _rs_hash(h: str) -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = int(h[:16], 16)
    out = ""
    for _ in range(10):
        n, r = divmod(n, len(alphabet))
        out += alphabet[r]
    return out


class Controllers:
    """Part of :class:`sim.model.Cluster`: the workload controllers, run by ``Cluster.reconcile``.
    """

    def _template_pod(self, owner: KObj, kind: str, name: str, *, node: str | None = None) -> dict[str, Any]:
        tmpl = msgspec.json.decode(ENCODER.encode((owner.obj.get("spec") or {}).get("template") or {}))
        meta = tmpl.get("metadata") or {}
        meta = {"name": name, "namespace": owner.namespace, "labels": dict(meta.get("labels") or {}),
                "annotations": dict(meta.get("annotations") or {}),
                # pkg/controller/controller_utils.go GetPodFromTemplate copies the template's finalizers
                **({"finalizers": list(meta["finalizers"])} if meta.get("finalizers") else {}),
                "ownerReferences": [{"apiVersion": owner.obj.get("apiVersion", "apps/v1"), "kind": kind,
                                     "name": owner.name, "uid": owner.meta["uid"], "controller": True,
                                     "blockOwnerDeletion": True}]}
        if kind == "ReplicaSet" and "pod-template-hash" in (owner.meta.get("labels") or {}):
            meta["labels"]["pod-template-hash"] = owner.meta["labels"]["pod-template-hash"]
        spec = tmpl.get("spec") or {}
        if node:
            spec["nodeName"] = node
        if kind == "DaemonSet":
            _add_daemon_pod_tolerations(spec)
        return {"metadata": meta, "spec": spec}

    def _owned_active(self, owner: KObj) -> list[Pod]:
        keys = self.pods_by_owner.get(owner.meta["uid"], set())
        pods = [self.pods[k] for k in sorted(keys) if k in self.pods]
        return [p for p in pods if not p.terminating and p.phase not in ("Succeeded", "Failed")]

    def _deployments(self) -> None:
        for dep in self.items("deployments.apps"):
            spec = dep.obj.get("spec") or {}
            tmpl_hash = hashlib.sha256(ENCODER.encode(spec.get("template") or {})).hexdigest()
            pth = _rs_hash(tmpl_hash)
            rs_name = f"{dep.name}-{pth}"
            replicas = int(spec.get("replicas", 1))
            owned = [rs for rs in self.items("replicasets.apps", dep.namespace)
                     if (controller_of(rs.obj) or {}).get("uid") == dep.meta["uid"]]
            current = next((rs for rs in owned if rs.name == rs_name), None)
            if current is None:
                tmpl = msgspec.json.decode(ENCODER.encode(spec.get("template") or {}))
                tmpl.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = pth
                sel = msgspec.json.decode(ENCODER.encode(spec.get("selector") or {}))
                sel.setdefault("matchLabels", {})["pod-template-hash"] = pth
                current = self.put("replicasets.apps", {
                    "metadata": {"name": rs_name, "namespace": dep.namespace,
                                 "labels": dict(tmpl["metadata"]["labels"]),
                                 "annotations": {"deployment.kubernetes.io/revision": str(len(owned) + 1)},
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": dep.name,
                                                      "uid": dep.meta["uid"], "controller": True,
                                                      "blockOwnerDeletion": True}]},
                    "spec": {"replicas": replicas, "selector": sel, "template": tmpl}})
            for rs in owned:
                want = replicas if rs is current else 0
                if int(rs.obj["spec"].get("replicas", 0)) != want:
                    rs.obj["spec"]["replicas"] = want
                    self.touch(rs)
            active = self._owned_active(current)
            ready = sum(1 for p in active if pod_ready(p))
            status = {"observedGeneration": dep.meta.get("generation", 1), "replicas": len(active),
                      "updatedReplicas": len(active), "readyReplicas": ready, "availableReplicas": ready,
                      "unavailableReplicas": max(0, replicas - ready)}
            if dep.obj.get("status") != status:
                dep.obj["status"] = status
                self._modified(dep)

    def _replicasets(self) -> None:
        for rs in self.items("replicasets.apps"):
            want = int((rs.obj.get("spec") or {}).get("replicas", 1))
            active = self._owned_active(rs)
            if len(active) < want:
                for _ in range(want - len(active)):
                    pod = self._template_pod(rs, "ReplicaSet", f"{rs.name}-{self.fleet.rand_suffix()}")
                    if not psa.create_controller_pod(self, rs, "ReplicaSet", pod):  # refused: FailedCreate
                        break
            elif len(active) > want:
                for pod in sorted(active, key=lambda p: (bool(p.node_name), p.meta["creationTimestamp"], p.name),
                                  reverse=False)[: len(active) - want]:
                    self.delete_pod(pod, cause="scale_down")
            self._set_status(rs, {"replicas": len(active), "readyReplicas": sum(1 for p in active if pod_ready(p)),
                                  "availableReplicas": sum(1 for p in active if pod_ready(p)),
                                  "observedGeneration": rs.meta.get("generation", 1)})

    def _statefulsets(self) -> None:
        for sts in self.items("statefulsets.apps"):
            want = int((sts.obj.get("spec") or {}).get("replicas", 1))
            for i in range(want):
                name = f"{sts.name}-{i}"
                if (sts.namespace, name) not in self.pods:
                    obj = self._template_pod(sts, "StatefulSet", name)
                    obj["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = name
                    obj["spec"].setdefault("hostname", name)
                    # OrderedReady: a refused ordinal stops the burst (stateful_set_control.go)
                    if not psa.create_controller_pod(self, sts, "StatefulSet", obj):
                        break
            for pod in self._owned_active(sts):
                idx = pod.name.rsplit("-", 1)[-1]
                if idx.isdigit() and int(idx) >= want:
                    self.delete_pod(pod, cause="scale_down")
            active = self._owned_active(sts)
            self._set_status(sts, {"replicas": len(active), "readyReplicas": sum(1 for p in active if pod_ready(p)),
                                   "currentReplicas": len(active), "updatedReplicas": len(active),
                                   "availableReplicas": sum(1 for p in active if pod_ready(p)),
                                   "observedGeneration": sts.meta.get("generation", 1)})

    def _ds_wants(self, ds: KObj, node: Node) -> bool:
        spec = ((ds.obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        tolerations = list(spec.get("tolerations") or []) + _DS_TOLERATIONS
        return fits_placement(spec, node, tolerations)

    def _daemonsets(self) -> None:
        plugin_changed = False
        for ds in self.items("daemonsets.apps"):
            pods = [self.pods[k] for k in sorted(self.pods_by_owner.get(ds.meta["uid"], set())) if k in self.pods]
            by_node: dict[str, list[Pod]] = {}
            for p in pods:
                by_node.setdefault(p.node_name, []).append(p)
            desired = 0
            for name in sorted(self.nodes):
                node = self.nodes[name]
                if not self._ds_wants(ds, node):
                    continue
                desired += 1
                if not any(not p.terminating for p in by_node.get(name, [])):
                    obj = self._template_pod(ds, "DaemonSet", f"{ds.name}-{self.fleet.rand_suffix()}", node=name)
                    if psa.create_controller_pod(self, ds, "DaemonSet", obj):  # refused: FailedCreate
                        plugin_changed = plugin_changed or "nvidia-device-plugin" in ds.name
            active = self._owned_active(ds)
            ready = sum(1 for p in active if pod_ready(p))
            self._set_status(ds, {"desiredNumberScheduled": desired, "currentNumberScheduled": len(active),
                                  "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": len(active),
                                  "numberMisscheduled": 0, "observedGeneration": ds.meta.get("generation", 1)})
        if plugin_changed:
            for name in sorted(self.nodes):
                node = self.nodes[name]
                before = dict(node.obj["status"]["allocatable"])
                self._apply_gpu_resources(node)
                if before != node.obj["status"]["allocatable"]:
                    self.touch(node)

    def _jobs(self) -> None:
        for job in self.items("jobs.batch"):
            spec = job.obj.get("spec") or {}
            completions = int(spec.get("completions", 1))
            parallelism = int(spec.get("parallelism", 1))
            keys = sorted(self.pods_by_owner.get(job.meta["uid"], set()))
            pods = [self.pods[k] for k in keys if k in self.pods]
            done = int((job.obj.get("status") or {}).get("succeeded", 0))
            done = max(done, sum(1 for p in pods if p.phase == "Succeeded"))
            active = [p for p in pods if not p.terminating and p.phase not in ("Succeeded", "Failed")]
            want = min(parallelism, completions - done) - len(active)
            run_s = self.job_run_s.get((job.namespace, job.name))
            if run_s is None:
                ann = (job.meta.get("annotations") or {}).get("sim.fleet/run-seconds")
                run_s = float(ann) if ann else self.fleet.timings["job_run_s"]
            for _ in range(max(0, want)):
                obj = self._template_pod(job, "Job", f"{job.name}-{self.fleet.rand_suffix()}")
                obj["metadata"]["labels"]["job-name"] = job.name
                obj["metadata"]["labels"]["batch.kubernetes.io/job-name"] = job.name
                obj["spec"].setdefault("restartPolicy", "Never")
                if not psa.create_controller_pod(self, job, "Job", obj, run_s=run_s):  # refused: FailedCreate, retried later
                    break
            status: dict[str, Any] = {"active": len(active), "succeeded": done, "ready": sum(1 for p in active if pod_ready(p))}
            if done >= completions:
                status["conditions"] = [{"type": "Complete", "status": "True"}]
            self._set_status(job, status)

    def _set_status(self, kobj: KObj, status: dict[str, Any]) -> None:
        if kobj.obj.get("status") != status:
            kobj.obj["status"] = status
            self._modified(kobj)

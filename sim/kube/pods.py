"""Pods: creation with the API server's defaults, start on their node, graceful deletion as the API
server and the kubelet do it, finalizers that hold a deleted pod, and cascading deletion.
"""

from __future__ import annotations

from typing import Any

from sim.kube import psa
from sim.kube.objects import KObj, Node, Pod, controller_of, iso, never_ready, parse_iso

# simulator only: a pod with this annotation has its finalizers removed this many seconds after its
# final delete, as the controller owning the finalizer would (scenario `pod_finalizers_release_s`)
FINALIZER_RELEASE_ANNOTATION = "sim.fleet/finalizer-release-seconds"


class Pods:
    """Part of :class:`sim.model.Cluster`: the pod lifecycle. State: ``pods``, ``pods_by_node``,
    ``pods_by_owner``, ``pending``, ``finalizing``.
    """

    def create_pod(self, obj: dict[str, Any], *, run_s: float | None = None) -> Pod:
        """Store a new pod (from the API or a controller); the scheduler places it."""
        meta = obj.setdefault("metadata", {})
        ns = meta.setdefault("namespace", "default")
        self.admit_create("pods", ns, str(meta.get("name") or ""))
        psa.admit_pod(self, obj, ns)  # Pod Security Admission (enforce label of the namespace): sim/kube/psa.py
        meta.setdefault("uid", self.fleet.new_uid())
        meta.setdefault("creationTimestamp", iso(self.fleet.now()))
        meta["resourceVersion"] = self.next_rv()
        obj["apiVersion"] = "v1"
        obj["kind"] = "Pod"
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        tolerations = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
        for c in spec.get("containers") or []:
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        pod = Pod(obj, run_s=run_s)
        self.pods[(ns, meta["name"])] = pod
        self.log_change(pod, "ADDED")
        ref = controller_of(obj)
        if ref:
            self.pods_by_owner.setdefault(ref["uid"], set()).add(pod.key)
        node = spec.get("nodeName")
        if node:
            self.pods_by_node.setdefault(node, set()).add(pod.key)
            self._start_pod(pod)
        else:
            self.pending.add(pod.key)
        self.dirty = True
        return pod

    def _start_pod(self, pod: Pod) -> None:
        now = self.fleet.now()
        pod.obj["status"].update(conditions=[
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": iso(now)}],
            hostIP=self._node_ip(pod.node_name))
        self.touch(pod)
        key, uid = pod.key, pod.meta["uid"]

        def running() -> None:
            p = self.pods.get(key)
            if p is None or p.meta["uid"] != uid or p.terminating or p.phase != "Pending":
                return
            t = iso(self.fleet.now())
            p.obj["status"].update(phase="Running", startTime=t)
            p.obj["status"]["podIP"] = f"10.244.{int(p.meta['uid'][:2], 16)}.{int(p.meta['uid'][2:4], 16)}"
            p.obj["status"]["conditions"] = [
                {"type": c, "status": "True", "lastProbeTime": None, "lastTransitionTime": t}
                for c in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
            unready = never_ready(p.obj)
            names = [str(c.get("name", "c")) for c in p.obj["spec"].get("containers") or []]
            if unready:  # running, readiness probe failing (pkg/kubelet/status/generate.go GeneratePodReadyCondition)
                for c in p.obj["status"]["conditions"]:
                    if c["type"] in ("Ready", "ContainersReady"):
                        c.update(status="False", reason="ContainersNotReady",
                                 message=f"containers with unready status: [{' '.join(names)}]")
            p.obj["status"]["containerStatuses"] = [
                {"name": c.get("name", "c"), "image": c.get("image", ""), "imageID": "", "ready": not unready,
                 "restartCount": 0, "started": True, "state": {"running": {"startedAt": t}},
                 "containerID": f"containerd://{uid[:12]}"}
                for c in p.obj["spec"].get("containers") or []]
            self.touch(p)
            if p.run_s is not None:
                self.fleet.after(p.run_s, complete)

        def complete() -> None:
            p = self.pods.get(key)
            if p is None or p.meta["uid"] != uid or p.terminating or p.phase != "Running":
                return
            t = iso(self.fleet.now())
            p.obj["status"]["phase"] = "Succeeded"
            for c in p.obj["status"]["conditions"]:
                if c["type"] in ("Ready", "ContainersReady"):
                    c.update(status="False", reason="PodCompleted", lastTransitionTime=t)
            for cs in p.obj["status"].get("containerStatuses") or []:
                cs.update(ready=False, started=False,
                          state={"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": t}})
            self.touch(p)
            self.fleet.oracles.pod_terminated(self, p, cause="completion")

        self.fleet.after(self.fleet.timings["pod_start_s"], running)

    def _node_ip(self, name: str) -> str:
        """The node's InternalIP (the kubelet's hostIP); "" for a Node posted without addresses, which a
        real API server accepts (a bare ``kubectl create`` of a Node with only a name: issue 20)."""
        node = self.nodes.get(name)
        addresses = ((node.obj.get("status") or {}).get("addresses") or []) if node is not None else []
        internal = [a for a in addresses if isinstance(a, dict) and a.get("type") == "InternalIP"]
        return str((internal or addresses or [{}])[0].get("address") or "")

    def delete_pod(self, pod: Pod, *, grace: int | None = None, cause: str = "delete") -> None:
        """Begin graceful termination: deletionTimestamp = now + grace; the kubelet confirms at the end of
        the grace period and the pod goes (unless finalizers hold it, or its node cannot confirm).

        The grace period: the request's, else the pod's terminationGracePeriodSeconds; 0 for a pod that
        was never scheduled or has finished; a negative one becomes 1 (pkg/registry/core/pod/strategy.go
        CheckGracefulDelete). Deleting a pod that is already terminating may only shorten its grace
        period (staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete); 0 removes it now
        (``--force --grace-period=0``), finalizers permitting.
        """
        if grace is None:
            spec_grace = pod.obj["spec"].get("terminationGracePeriodSeconds")
            grace = 30 if spec_grace is None else int(spec_grace)
        if grace < 0:
            grace = 1
        if not pod.node_name or pod.phase in ("Succeeded", "Failed"):
            grace = 0
        now = self.fleet.now()
        if pod.terminating:
            current = pod.meta.get("deletionGracePeriodSeconds")
            if not current:
                self._drop_pod(pod)  # already final: nothing but finalizers can keep it
                return
            if grace >= int(current):
                return
            due = parse_iso(pod.meta["deletionTimestamp"]) - int(current) + grace
            pod.meta["deletionTimestamp"] = iso(due)
            pod.meta["deletionGracePeriodSeconds"] = grace
            if grace == 0:
                self._drop_pod(pod)
                return
            self.touch(pod)
            self._confirm_later(pod, max(0.0, due - now))
            return
        self.fleet.oracles.pod_terminated(self, pod, cause=cause)
        pod.meta["deletionTimestamp"] = iso(now + grace)
        pod.meta["deletionGracePeriodSeconds"] = grace
        pod.cause = cause
        self.pending.discard(pod.key)
        for c in pod.obj["status"].get("conditions") or []:
            if c["type"] in ("Ready", "ContainersReady"):
                c.update(status="False", lastTransitionTime=iso(now))
        pod.invalidate()
        if grace == 0:
            self._drop_pod(pod)
            return
        self.touch(pod)
        self._confirm_later(pod, grace)

    def _confirm_later(self, pod: Pod, delay: float) -> None:
        key, uid = pod.key, pod.meta["uid"]

        def grace_over() -> None:
            p = self.pods.get(key)
            if p is None or p.meta["uid"] != uid or not p.terminating or not p.meta.get("deletionGracePeriodSeconds"):
                return
            if parse_iso(p.meta["deletionTimestamp"]) > self.fleet.now():
                return  # shortened or re-armed: a later callback finishes it
            self._kubelet_confirm(p)

        self.fleet.after(delay, grace_over)

    def _kubelet_confirm(self, pod: Pod) -> None:
        """The grace period is over: the kubelet stops the containers and deletes the pod for good. A
        kubelet that does not post status (node NotReady or Unknown) cannot: the pod stays Terminating
        until its node comes back (:meth:`_kubelet_confirms_deletions`), the node object is deleted
        (pod GC, :meth:`delete_node`) or someone force-deletes it with gracePeriodSeconds=0.

        kubernetes/kubernetes pkg/kubelet/status/status_manager.go (canBeDeleted, then Delete with
        grace 0) and pkg/controller/podgc/gc_controller.go (gcOrphaned; gcTerminating only for nodes
        tainted node.kubernetes.io/out-of-service).
        """
        node = self.nodes.get(pod.node_name) if pod.node_name else None
        if node is not None and not node.ready:
            return
        self._drop_pod(pod)

    def _kubelet_confirms_deletions(self, node: Node) -> None:
        """A node's kubelet posts status again: it finishes the deletions whose grace period ran out."""
        now = self.fleet.now()
        for key in sorted(self.pods_by_node.get(node.name, set())):
            pod = self.pods.get(key)
            if (pod is not None and pod.terminating and pod.meta.get("deletionGracePeriodSeconds")
                    and parse_iso(pod.meta["deletionTimestamp"]) <= now):
                self._drop_pod(pod)

    def _drop_pod(self, pod: Pod) -> None:
        """The final delete (grace period over, or 0): the pod leaves the store, unless
        ``metadata.finalizers`` hold it: then it stays with deletionGracePeriodSeconds 0 (its
        containers stopped, phase Failed if it had run) until the last finalizer is removed by an
        update, when :meth:`_release_finalized` removes it.

        staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go
        (updateForGracefulDeletionAndFinalizers, deleteWithoutFinalizers on update).
        """
        key = pod.key
        if self.pods.get(key) is not pod:
            return
        if pod.meta.get("finalizers"):
            if key in self.finalizing:
                return
            now = self.fleet.now()
            pod.meta.setdefault("deletionTimestamp", iso(now))
            pod.meta["deletionGracePeriodSeconds"] = 0
            self.pending.discard(key)
            if pod.node_name and pod.phase not in ("Succeeded", "Failed"):
                t = iso(now)
                pod.obj["status"]["phase"] = "Failed"
                for c in pod.obj["status"].get("conditions") or []:
                    if c.get("type") in ("Ready", "ContainersReady") and c.get("status") != "False":
                        c.update(status="False", lastTransitionTime=t)
                for cs in pod.obj["status"].get("containerStatuses") or []:
                    cs.update(ready=False, started=False,
                              state={"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": t}})
            self.finalizing.add(key)
            self.touch(pod)
            release = (pod.meta.get("annotations") or {}).get(FINALIZER_RELEASE_ANNOTATION)
            if release:
                uid = pod.meta["uid"]

                def release_finalizers() -> None:
                    p = self.pods.get(key)
                    if p is not None and p.meta["uid"] == uid and p.meta.get("finalizers"):
                        p.meta["finalizers"] = []
                        self.touch(p)

                self.fleet.after(float(release), release_finalizers)
            return
        self._remove_pod(pod)

    def _release_finalized(self) -> None:
        """Pods held by finalizers go as soon as an update removed the last one."""
        if not self.finalizing:
            return
        for key in sorted(self.finalizing):
            pod = self.pods.get(key)
            if pod is None:
                self.finalizing.discard(key)
            elif not pod.meta.get("finalizers"):
                self.finalizing.discard(key)
                self._remove_pod(pod)

    def _remove_pod(self, pod: Pod) -> None:
        key = pod.key
        if self.pods.get(key) is not pod:
            return
        self.finalizing.discard(key)
        del self.pods[key]
        self.log_change(pod, "DELETED")
        self.pending.discard(key)
        if pod.node_name:
            self.pods_by_node.get(pod.node_name, set()).discard(key)
        ref = controller_of(pod.obj)
        if ref:
            owned = self.pods_by_owner.get(ref["uid"])
            if owned is not None:
                owned.discard(key)
        self.dirty = True

    def _cascade_delete(self, owner: KObj) -> None:
        uid = owner.meta["uid"]
        for key in sorted(self.pods_by_owner.get(uid, set())):
            pod = self.pods.get(key)
            if pod is not None:
                self.delete_pod(pod, cause="owner_deleted")
        for rs in self.items("replicasets.apps"):
            ref = controller_of(rs.obj)
            if ref and ref.get("uid") == uid:
                self.remove("replicasets.apps", rs.namespace, rs.name)

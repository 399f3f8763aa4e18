"""Node lifecycle: the kubelet's readiness (and what a NotReady node does to its pods), repairs by
restart and reimage, node-problem-detector's conditions, node deletion, and nodes registered
through the API.
"""

from __future__ import annotations

from typing import Any

from sim.kube import gpu_faults
from sim.kube.objects import REPAIR_RUNGS, Node, iso, never_ready

NPD_GPU_CONDITIONS = ("UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices", "XIDErrors", "GPUMissing")

NPD_GPU_REASONS = {
    "UnhealthyNvidiaDevicePlugin": ("NvidiaDevicePluginHealthy", "NvidiaDevicePluginUnhealthy"),
    "UnhealthyNvidiaDCGMServices": ("NvidiaDCGMServicesHealthy", "NvidiaDCGMServicesUnhealthy"),
    "XIDErrors": ("NoXIDErrors", "XIDErrorsDetected"),
    "GPUMissing": ("AllGPUsPresent", "GPUMissing"),
}

NPD_BASE_CONDITIONS = ("KernelDeadlock", "ReadonlyFilesystem", "FrequentKubeletRestart", "FrequentContainerdRestart")

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
TTL_ANNOTATION = "node.alpha.kubernetes.io/ttl"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# pkg/controller/nodelifecycle/node_lifecycle_controller.go nodeConditionToTaintKeyStatusMap
CONDITION_TAINTS: dict[tuple[str, str], str] = {
    ("Ready", "False"): NOT_READY_TAINT,
    ("Ready", "Unknown"): "node.kubernetes.io/unreachable",
    ("MemoryPressure", "True"): "node.kubernetes.io/memory-pressure",
    ("DiskPressure", "True"): "node.kubernetes.io/disk-pressure",
    ("NetworkUnavailable", "True"): "node.kubernetes.io/network-unavailable",
    ("PIDPressure", "True"): "node.kubernetes.io/pid-pressure",
}


def node_condition(type_: str, status: str, now: float, reason: str, message: str) -> dict[str, Any]:
    """A node condition as the kubelet and NPD post it, heartbeat and transition both ``now``."""
    return {"type": type_, "status": status, "lastHeartbeatTime": iso(now), "lastTransitionTime": iso(now),
            "reason": reason, "message": message}


class Nodes:
    """Part of :class:`sim.model.Cluster`: nodes after they joined. State: ``nodes``, ``pods_by_node``.
    """

    def _schedule_ready(self, node: Node, delay: float, *, clear: tuple[str, ...] = ()) -> None:
        node.boot += 1
        boot = node.boot
        name = node.name

        def become_ready() -> None:
            n = self.nodes.get(name)
            if n is None or n.boot != boot:
                return
            self._set_ready(n, True)
            for t in clear:
                self._set_condition(n, t, "False")
                n.repair_plan.pop(t, None)

        self.fleet.after(delay, become_ready)

    def _set_ready(self, node: Node, ready: bool) -> None:
        now = self.fleet.now()
        node.ready = ready
        c = node.condition("Ready")
        if c is not None:
            status = "True" if ready else "Unknown" if c["status"] == "True" else "False"
            if c["status"] != status:
                c["lastTransitionTime"] = iso(now)
            c.update(status=status, lastHeartbeatTime=iso(now),
                     reason="KubeletReady" if ready else "NodeStatusUnknown",
                     message="kubelet is posting ready status" if ready else "Kubelet stopped posting node status.")
        taints = [t for t in node.obj["spec"].get("taints") or [] if t.get("key") != "node.kubernetes.io/not-ready"
                  and t.get("key") != "node.kubernetes.io/unreachable"]
        if not ready:
            taints += [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                       {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": iso(now)}]
        node.obj["spec"]["taints"] = taints
        self.touch(node)
        self._node_pods_ready(node, ready)

    def _node_pods_ready(self, node: Node, ready: bool) -> None:
        """Pods on a node that stops posting status turn unready (and back), as the node controller does."""
        t = iso(self.fleet.now())
        if ready:
            self._kubelet_confirms_deletions(node)
        for key in sorted(self.pods_by_node.get(node.name, set())):
            pod = self.pods.get(key)
            if pod is None or pod.terminating or pod.phase != "Running" or (ready and never_ready(pod.obj)):
                continue
            changed = False
            for c in pod.obj["status"].get("conditions") or []:
                if c.get("type") in ("Ready", "ContainersReady") and (c.get("status") == "True") != ready:
                    c.update(status="True" if ready else "False", lastTransitionTime=t)
                    changed = True
            if changed:
                self.touch(pod)

    def sync_node(self, node: Node) -> None:
        """After a write through the API: the node lifecycle controller's NoSchedule taint pass comes
        ``node_taint_s`` later (its informer sees the write after it is answered), so the answer to a
        cordon carries no ``node.kubernetes.io/unschedulable`` taint yet, as kube-apiserver's does not
        (checked against v1.37.2 in tests/realkube, story node_patches)."""
        self.touch(node)
        name, uid = node.name, node.meta.get("uid")

        def taint_pass() -> None:
            current = self.nodes.get(name)
            if current is not None and current.meta.get("uid") == uid:
                self.no_schedule_taint_pass(current)

        self.fleet.after(float(self.fleet.timings.get("node_taint_s", 0.5)), taint_pass)

    def no_schedule_taint_pass(self, node: Node) -> None:
        """The node lifecycle controller's ``doNoScheduleTaintingPass``: the NoSchedule taints that
        mirror the node's conditions (Ready False: not-ready, Unknown: unreachable; memory, disk, PID
        pressure and network unavailable when True) and ``spec.unschedulable``; taints of those keys
        that no longer apply are removed, new ones get ``timeAdded`` (controller_utils.go
        ``SwapNodeControllerTaint``), every other taint is kept as it is.

        kubernetes/kubernetes pkg/controller/nodelifecycle/node_lifecycle_controller.go
        (``nodeConditionToTaintKeyStatusMap``, ``doNoScheduleTaintingPass``).
        """
        wanted: list[str] = []
        for cond in node.obj.get("status", {}).get("conditions") or []:
            key = CONDITION_TAINTS.get((cond.get("type"), cond.get("status")))
            if key:
                wanted.append(key)
        if node.unschedulable:
            wanted.append(UNSCHEDULABLE_TAINT)
        managed = {*(CONDITION_TAINTS.values()), UNSCHEDULABLE_TAINT}
        taints = list(node.obj["spec"].get("taints") or [])
        have = {t.get("key") for t in taints if t.get("effect") == "NoSchedule" and t.get("key") in managed}
        keep = [t for t in taints if not (t.get("effect") == "NoSchedule" and t.get("key") in managed
                                          and t.get("key") not in wanted)]
        added = [{"key": k, "effect": "NoSchedule", "timeAdded": iso(self.fleet.now())}
                 for k in dict.fromkeys(wanted) if k not in have]
        if not added and len(keep) == len(taints):
            return
        if keep or added:
            node.obj["spec"]["taints"] = keep + added
        else:
            node.obj["spec"].pop("taints", None)
        self.touch(node)

    def restart_node(self, name: str) -> None:
        self._repair(name, "restart", self.fleet.timings["restart_s"])

    def reimage_node(self, name: str) -> None:
        self._repair(name, "reimage", self.fleet.timings["reimage_s"])

    def _repair(self, name: str, rung: str, duration: float) -> None:
        with self.fleet.lock:
            node = self.nodes.get(name)
            if node is None:
                return
            self._set_ready(node, False)
            order = REPAIR_RUNGS.index(rung)
            clear = tuple(sorted(t for t, fix in node.repair_plan.items()
                                 if fix in REPAIR_RUNGS and REPAIR_RUNGS.index(fix) <= order))
            node.obj["status"]["nodeInfo"]["bootID"] = self.fleet.new_uid()
            self._schedule_ready(node, duration, clear=clear)
            boot = node.boot
            gpu_faults.on_repair(self, node, rung, duration)  # self is the Cluster this mixin is part of
            self.fleet.after(duration, lambda: self._npd_start(name, boot))
            self.fleet.oracles.record_repair(self, name, rung, unschedulable=bool(node.obj["spec"].get("unschedulable")),
                                             annotations=node.meta.get("annotations") or {})

    def _npd_start(self, name: str, boot: int) -> None:
        """node-problem-detector starts with the boot: every custom-plugin condition is published
        ``False`` with a fresh transition time before any check ran, and a fault that survived the
        reboot turns ``True`` again at the first check, the run of every rule that NPD makes on start.

        kubernetes/node-problem-detector pkg/custompluginmonitor/custom_plugin_monitor.go
        (``monitorLoop`` -> ``initializeStatus`` -> ``initialConditions``: Status False, Transition now,
        unless ``skip_initial_status``); pkg/custompluginmonitor/plugin/plugin.go ``Run`` runs every rule once
        on boot, then each ``invoke_interval``: the first result comes after the rule's run (bounded by its
        ``timeout``) and the condition manager's next sync (``npd_first_check_s``, sim/model.py).
        """
        node = self.nodes.get(name)
        if node is None or node.boot != boot:
            return
        now = self.fleet.now()
        reset = False
        for c in node.obj["status"].get("conditions") or []:
            if c.get("type") in NPD_GPU_CONDITIONS:
                ok, _bad = NPD_GPU_REASONS[c["type"]]
                c.update(status="False", reason=ok, message=f"{c['type']}: healthy", lastTransitionTime=iso(now),
                         lastHeartbeatTime=iso(now))
                reset = True
        if not reset:
            return
        self.touch(node)

        def first_check() -> None:
            n = self.nodes.get(name)
            if n is None or n.boot != boot:
                return
            for type_ in sorted(n.repair_plan):  # faults this boot did not fix
                self._set_condition(n, type_, "True")

        self.fleet.after(self.fleet.timings["npd_first_check_s"], first_check)

    def set_condition(self, node_name: str, type_: str, status: str, *, fixed_by: str = "restart",
                      reason: str = "", message: str = "") -> bool:
        """Flip a node condition now (scenario flips and /_sim/conditions)."""
        with self.fleet.lock:
            node = self.nodes.get(node_name)
            if node is None:
                return False
            self._set_condition(node, type_, status, reason=reason, message=message)
            if status == "True" and type_ in NPD_GPU_CONDITIONS:
                node.repair_plan[type_] = fixed_by if fixed_by in REPAIR_RUNGS else "restart"
            elif status != "True":
                node.repair_plan.pop(type_, None)
            return True

    def _set_condition(self, node: Node, type_: str, status: str, *, reason: str = "", message: str = "") -> None:
        now = self.fleet.now()
        ok, bad = NPD_GPU_REASONS.get(type_, (f"No{type_}", type_))
        reason = reason or (bad if status == "True" else ok)
        message = message or (f"{type_}: unhealthy" if status == "True" else f"{type_}: healthy")
        c = node.condition(type_)
        if c is None:
            node.obj["status"]["conditions"].append(node_condition(type_, status, now, reason, message))
        else:
            if c.get("status") != status:
                c["lastTransitionTime"] = iso(now)
            c.update(status=status, reason=reason, message=message, lastHeartbeatTime=iso(now))
        self.touch(node)

    def delete_node(self, name: str, *, cause: str) -> None:
        """A node (VM) goes away with every pod on it."""
        node = self.nodes.get(name)
        if node is None:
            return
        for key in sorted(self.pods_by_node.get(name, set())):
            pod = self.pods.get(key)
            if pod is not None:
                # A pod already being deleted was counted when its deletion began; one that Azure took
                # with a spot VM was counted then (as ``spot_eviction``, not as the app's loss).
                if not pod.terminating and pod.cause != "spot_eviction":
                    self.fleet.oracles.pod_terminated(self, pod, cause="node_removal", detail=cause)
                # the pod garbage collector force-deletes the pods of a node that is gone
                # (kubernetes/kubernetes pkg/controller/podgc/gc_controller.go gcOrphaned)
                self._drop_pod(pod)
        self.pods_by_node.pop(name, None)
        del self.nodes[name]
        self.log_change(node, "DELETED")
        self.fleet.oracles.node_removed(self, node, cause=cause)
        self.dirty = True

    def register_node(self, obj: dict[str, Any]) -> Node:
        """A Node created through the API (a kubelet registering, or a cluster admin), not by a pool.

        The API server stores a Node as it is posted, status included (kubernetes/kubernetes
        pkg/registry/core/node/strategy.go ``PrepareForCreate``: "Nodes allow *all* fields, including
        status, to be set on create"), so its labels, ``spec.providerID`` and conditions are whatever the
        poster wrote. No VM backs it: it belongs to no pool here (``pool=""``), is no machine of any
        agent pool (``machines``), and no VMSS instance (``node_by_vmss_instance``) is it; ARM keeps
        describing only the VMs it made. Not modelled: the node lifecycle controller marking it
        ``Unknown`` once no kubelet renews its lease (node-monitor-grace-period, 40-50 s), so a forged
        node here stays as Ready as it was posted (harder on the app, not easier).
        """
        with self.fleet.lock:
            meta = obj.setdefault("metadata", {})
            now = iso(self.fleet.now())
            meta.update(uid=self.fleet.new_uid(), resourceVersion=self.next_rv(), creationTimestamp=now)
            meta.setdefault("labels", {})
            meta.setdefault("annotations", {})
            obj.update(kind="Node", apiVersion="v1")
            spec = obj.setdefault("spec", {})
            # The NodeTaint admission plugin: every new Node starts with the not-ready NoSchedule taint,
            # which the node lifecycle controller removes once the node is Ready
            # (plugin/pkg/admission/nodetaint/admission.go ``addNotReadyTaint``).
            if not any(t.get("key") == NOT_READY_TAINT and t.get("effect") == "NoSchedule"
                       for t in spec.get("taints") or []):
                spec["taints"] = [*(spec.get("taints") or []), {"key": NOT_READY_TAINT, "effect": "NoSchedule"}]
            status = obj.setdefault("status", {})
            status.setdefault("conditions", [])
            status.setdefault("allocatable", {})
            status.setdefault("capacity", {})
            info = status.setdefault("nodeInfo", {})
            for key in ("machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
                        "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture"):
                info.setdefault(key, "")  # NodeSystemInfo's fields have no omitempty: "" when not posted
            node = Node(obj, pool="", instance_id=-1, vmss="")
            ready = node.condition("Ready")
            node.ready = bool(ready and ready.get("status") == "True")
            self.nodes[node.name] = node
            self.pods_by_node.setdefault(node.name, set())
            self.log_change(node, "ADDED")
            self.dirty = True
            self.fleet.oracles.node_changed(self, node)
            self.sync_node(node)  # the node lifecycle controller sees the new Node: its taint pass follows
            self.fleet.after(0.0, lambda: self._ttl_annotation(node.name, node.meta["uid"]))
            return node

    def _ttl_annotation(self, name: str, uid: str) -> None:
        """The TTL controller annotates every Node with how long kubelets may cache objects:
        ``node.alpha.kubernetes.io/ttl``, "0" below 100 nodes (pkg/controller/ttl/ttl_controller.go
        ``ttlBoundaries``; AKS nodes carry "0"). It acts as soon as its informer sees the Node, so the
        simulator sets it on the next request after the create."""
        node = self.nodes.get(name)
        if node is None or node.meta.get("uid") != uid:
            return
        annotations = node.meta.setdefault("annotations", {})
        if annotations.get(TTL_ANNOTATION) is None:
            annotations[TTL_ANNOTATION] = "0" if len(self.nodes) <= 100 else "15"
            self.touch(node)

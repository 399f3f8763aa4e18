"""The scheduler: resources, taints and tolerations, node selectors and required node affinity.
"""

from __future__ import annotations

from typing import Any

from sim.kube.objects import Node, Pod, controller_of, iso, parse_quantity
from sim.kube.selectors import match_requirements


def tolerates(tolerations: list[dict[str, Any]], taints: list[dict[str, Any]]) -> bool:
    """Whether the tolerations cover every NoSchedule and NoExecute taint (PreferNoSchedule never blocks)."""
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        ok = False
        for tol in tolerations:
            if tol.get("effect") and tol.get("effect") != taint.get("effect"):
                continue
            op = tol.get("operator", "Equal")
            wildcard = not tol.get("key") and op == "Exists"
            same_key = tol.get("key") == taint.get("key") and (
                op == "Exists" or str(tol.get("value", "")) == str(taint.get("value", "")))
            ok = wildcard or same_key
            if ok:
                break
        if not ok:
            return False
    return True


def fits_placement(spec: dict[str, Any], node: Node, tolerations: list[dict[str, Any]], *,
                    ignore_ready: bool = False) -> bool:
    """Taints, nodeSelector and required node affinity (resources aside); ``ignore_ready`` leaves out the
    node.kubernetes.io/* taints a node has while it is not (yet) Ready."""
    taints = node.obj["spec"].get("taints") or []
    if ignore_ready:
        taints = [t for t in taints if not str(t.get("key", "")).startswith("node.kubernetes.io/")]
    if not tolerates(tolerations, taints):
        return False
    labels = node.labels
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if terms:
        ok = False
        for term in terms:
            reqs = [(e.get("key", ""), e.get("operator", "In"), tuple(e.get("values") or ()))
                    for e in term.get("matchExpressions") or []]
            fields = term.get("matchFields") or []
            if any(f.get("key") == "metadata.name" and node.name not in (f.get("values") or []) for f in fields):
                continue
            if match_requirements(labels, reqs):
                ok = True
                break
        if not ok:
            return False
    return True


class Scheduler:
    """Part of :class:`sim.model.Cluster`: binds pending pods to nodes. State: ``pending``.
    """

    def node_free(self, node: Node) -> dict[str, float]:
        alloc = {k: parse_quantity(v) for k, v in node.obj["status"]["allocatable"].items()}
        used: dict[str, float] = {"pods": 0.0}
        for key in self.pods_by_node.get(node.name, set()):
            p = self.pods.get(key)
            if p is None or p.phase in ("Succeeded", "Failed"):
                continue
            used["pods"] += 1
            for k, v in p.requests.items():
                used[k] = used.get(k, 0.0) + v
        return {k: alloc.get(k, 0.0) - used.get(k, 0.0) for k in set(alloc) | set(used)}

    def fits(self, pod: Pod, node: Node, *, ignore_ready: bool = False,
             free: dict[str, float] | None = None) -> bool:
        if not ignore_ready and (not node.ready or node.unschedulable):
            return False
        if free is None:
            free = self.node_free(node)
        if free.get("pods", 0) < 1:
            return False
        if not all(free.get(k, 0.0) + 1e-9 >= v for k, v in pod.requests.items() if v > 0):
            return False
        return fits_placement(pod.obj.get("spec") or {}, node, pod.obj["spec"].get("tolerations") or [],
                               ignore_ready=ignore_ready)

    def _schedule(self) -> None:
        """Place pending pods (oldest first) on the feasible node with the fewest siblings, then the most
        free CPU. Free resources are computed once per pass and updated as pods are bound."""
        if not self.pending:
            return
        nodes = [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].ready and not self.nodes[n].unschedulable]
        free_of: dict[str, dict[str, float]] = {}
        alloc_cpu: dict[str, float] = {}
        candidates_of: dict[str, list[Node]] = {}
        sibling_count: dict[tuple[str, str], int] = {}
        order = sorted(self.pending, key=lambda k: (self.pods[k].meta["creationTimestamp"], k) if k in self.pods
                       else ("", k))
        for key in order:
            pod = self.pods.get(key)
            if pod is None or pod.terminating or pod.node_name:
                self.pending.discard(key)
                continue
            best, best_score = None, None
            owner_uid = (controller_of(pod.obj) or {}).get("uid")
            # placement (taints, selectors, affinity) is the same for every pod of one owner in a pass
            group = owner_uid or f"pod:{key}"
            if group not in candidates_of:
                spec = pod.obj.get("spec") or {}
                tolerations = spec.get("tolerations") or []
                candidates_of[group] = [n for n in nodes if fits_placement(spec, n, tolerations)]
            for node in candidates_of[group]:
                free = free_of.get(node.name)
                if free is None:
                    free = free_of[node.name] = self.node_free(node)
                    alloc_cpu[node.name] = parse_quantity(node.obj["status"]["allocatable"].get("cpu", "1")) or 1.0
                if free.get("pods", 0) < 1 or not all(free.get(k, 0.0) + 1e-9 >= v
                                                      for k, v in pod.requests.items() if v > 0):
                    continue
                siblings = 0
                if owner_uid:
                    sk = (owner_uid, node.name)
                    siblings = sibling_count.get(sk, -1)
                    if siblings < 0:
                        siblings = sibling_count[sk] = sum(
                            1 for k in self.pods_by_node.get(node.name, ())
                            if (controller_of(self.pods[k].obj) or {}).get("uid") == owner_uid
                            and not self.pods[k].terminating)
                score = (siblings, -(free.get("cpu", 0.0) / alloc_cpu[node.name]), node.name)
                if best_score is None or score < best_score:
                    best, best_score = node, score
            if best is None:
                self._mark_unschedulable(pod)
                continue
            pod.obj["spec"]["nodeName"] = best.name
            self.pending.discard(key)
            self.pods_by_node.setdefault(best.name, set()).add(key)
            self.nap_inflight.pop(pod.meta["uid"], None)
            if owner_uid and (owner_uid, best.name) in sibling_count:
                sibling_count[(owner_uid, best.name)] += 1
            taken = free_of[best.name]
            taken["pods"] = taken.get("pods", 0.0) - 1
            for k, v in pod.requests.items():
                taken[k] = taken.get(k, 0.0) - v
            self._start_pod(pod)

    def _mark_unschedulable(self, pod: Pod) -> None:
        conds = pod.obj["status"].get("conditions") or []
        if any(c.get("reason") == "Unschedulable" for c in conds):
            return
        pod.obj["status"]["conditions"] = [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
            "lastTransitionTime": iso(self.fleet.now()),
            "message": f"0/{len(self.nodes)} nodes are available: no node fits the pod's requirements."}]
        self._modified(pod)

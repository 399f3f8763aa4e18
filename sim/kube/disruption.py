"""PodDisruptionBudgets: which PDBs cover a pod, their status as the disruption controller computes
it, and the write the Eviction API makes on an approved eviction (the Eviction API's own rules
are in sim/kube/eviction.py).
"""

from __future__ import annotations

import functools
from typing import Any

from sim.kube.objects import KObj, Pod, controller_of, iso, parse_iso, pod_ready
from sim.kube.selectors import match_requirements, selector_requirements

# kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go MaxDisruptedPodSize
MAX_DISRUPTED_POD_SIZE = 2000

# kubernetes/kubernetes pkg/controller/disruption/disruption.go DeletionTimeout
PDB_DELETION_TIMEOUT_S = 120.0


def _int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = float(value[:-1])
        exact = pct * total / 100.0
        return int(-(-exact // 1)) if round_up else int(exact)
    return int(value)


class Disruption:
    """Part of :class:`sim.model.Cluster`: the disruption controller. State: ``pdb_synced_rv``,
    ``pdb_observe_due``.
    """

    def pdbs_for(self, pod: Pod) -> list[KObj]:
        labels = pod.meta.get("labels") or {}
        out = []
        for pdb in self.items("poddisruptionbudgets.policy", pod.namespace):
            try:
                reqs = selector_requirements(pdb.obj.get("spec", {}).get("selector"))
            except (TypeError, AttributeError):
                continue
            if reqs and match_requirements(labels, reqs):
                out.append(pdb)
        return out

    def pdb_status(self, pdb: KObj, *, disrupted: dict[str, Any] | None = None) -> dict[str, Any]:
        """currentHealthy, desiredHealthy, disruptionsAllowed, expectedPods, computed from the pods now.

        Without ``disrupted`` this is the truth the oracles judge by. The disruption controller passes
        the PDB's ``status.disruptedPods``: a pod whose eviction was approved less than DeletionTimeout
        ago does not count as healthy (kubernetes/kubernetes pkg/controller/disruption/disruption.go
        countHealthyPods, updatePdbStatus: no disruption is allowed while expectedPods is 0).
        """
        spec = pdb.obj.get("spec") or {}
        reqs = selector_requirements(spec.get("selector"))
        pods = [p for p in self.items("pods", pdb.namespace)
                if reqs and match_requirements(p.meta.get("labels") or {}, reqs) and p.phase not in ("Succeeded", "Failed")]
        now = self.fleet.now()
        healthy = 0
        for p in pods:
            if not pod_ready(p):
                continue
            when = (disrupted or {}).get(p.name)
            if when is not None:
                try:
                    if parse_iso(str(when)) + PDB_DELETION_TIMEOUT_S > now:
                        continue
                except ValueError:
                    pass
            healthy += 1
        # getExpectedPodCount: an integer minAvailable counts the matching pods; a percentage or a
        # maxUnavailable needs the controllers' scale, where pods without a controller count for
        # nothing ("unmanaged pods": the status cannot be calculated, so no disruption is allowed).
        # Checked against kube-apiserver v1.37.2 in tests/realkube, story budget_shapes.
        min_available = spec.get("minAvailable")
        if min_available is not None and not isinstance(min_available, str):
            expected = len(pods)
            desired = int(min_available)
        elif min_available is not None:
            expected = self._expected_pods(pods) if pods else 0
            desired = _int_or_percent(min_available, expected, round_up=True)
        elif spec.get("maxUnavailable") is not None:
            expected = self._expected_pods(pods) if pods else 0
            desired = max(0, expected - _int_or_percent(spec["maxUnavailable"], expected, round_up=True))
        else:
            expected = self._expected_pods(pods) if pods else 0
            desired = expected
        allowed = healthy - desired if expected > 0 else 0
        return {"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                "disruptionsAllowed": max(0, allowed), "observedGeneration": pdb.meta.get("generation", 1)}

    def _expected_pods(self, pods: list[Pod]) -> int:
        """Scale of the controllers owning the pods (as the disruption controller finds it)."""
        total, seen = 0, set()
        for p in pods:
            ref = controller_of(p.obj)
            if not ref:
                continue
            if ref["uid"] in seen:
                continue
            seen.add(ref["uid"])
            owner = self._owner(p.namespace, ref)
            spec = owner.obj.get("spec", {}) if owner else {}
            if ref.get("kind") in ("ReplicaSet", "StatefulSet"):
                total += int(spec.get("replicas", 1)) if owner else 0
            elif ref.get("kind") == "Job":
                total += int(spec.get("parallelism", 1)) if owner else 0
            else:
                total += sum(1 for q in pods if (controller_of(q.obj) or {}).get("uid") == ref["uid"])
        return total  # pods without a controller are unmanaged: getExpectedScale skips them

    def _owner(self, namespace: str, ref: dict[str, Any]) -> KObj | None:
        resource = {"ReplicaSet": "replicasets.apps", "StatefulSet": "statefulsets.apps",
                    "DaemonSet": "daemonsets.apps", "Job": "jobs.batch", "Deployment": "deployments.apps"}.get(
            ref.get("kind", ""))
        if not resource:
            return None
        obj = self.get(resource, namespace, ref.get("name", ""))
        return obj if obj is not None and obj.meta.get("uid") == ref.get("uid") else None

    def disruption_blockers(self, pod: Pod) -> list[tuple[KObj, dict[str, Any]]]:
        """PDBs that would go below desiredHealthy if this pod stopped being healthy now."""
        if not pod_ready(pod):
            return []
        out = []
        for pdb in self.pdbs_for(pod):
            st = self.pdb_status(pdb)
            if st["disruptionsAllowed"] <= 0:
                out.append((pdb, st))
        return out

    def _pdb_statuses(self) -> None:
        """The disruption controller. A PDB that was created or changed by someone else (its spec, or
        its status written by a client) is observed ``pdb_observe_s`` later: until then its status is
        left as it is, so ``status.observedGeneration < metadata.generation`` after a create or a spec
        change. Otherwise the status follows the pods at once; ``disruptedPods`` keeps the evictions
        not yet seen through (pod still there, not deleting, approved less than 2 minutes ago).

        kubernetes/kubernetes pkg/controller/disruption/disruption.go (trySync, buildDisruptedPodMap,
        updatePdbStatus) and staging/src/k8s.io/component-helpers/apps/poddisruptionbudget/helpers.go.
        """
        now = self.fleet.now()
        lag = float(self.fleet.timings.get("pdb_observe_s", 1.0))
        for pdb in self.items("poddisruptionbudgets.policy"):
            key = (pdb.namespace, pdb.name)
            if self.pdb_synced_rv.get(key) != pdb.meta.get("resourceVersion") and lag > 0:
                due = self.pdb_observe_due.get(key)
                if due is None:
                    self.pdb_observe_due[key] = now + lag
                    self.fleet.at(now + lag, functools.partial(self._pdb_observed, key))
                    continue
                if due != float("-inf"):
                    continue  # not observed yet
            self.pdb_observe_due.pop(key, None)
            old = pdb.obj.get("status") or {}
            disrupted = {}
            for name, when in sorted((old.get("disruptedPods") or {}).items()):
                p = self.pods.get((pdb.namespace, name))
                if p is None or p.terminating:
                    continue
                try:
                    if parse_iso(str(when)) + PDB_DELETION_TIMEOUT_S <= now:
                        continue
                except ValueError:
                    continue
                disrupted[name] = when
            try:
                st = self.pdb_status(pdb, disrupted=disrupted)
            except (ValueError, TypeError, AttributeError):
                self.pdb_synced_rv[key] = str(pdb.meta.get("resourceVersion"))
                continue
            if disrupted:
                st["disruptedPods"] = disrupted
            allowed = st["disruptionsAllowed"] > 0
            cond = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
            want = {"type": "DisruptionAllowed", "status": "True" if allowed else "False",
                    "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
                    "observedGeneration": st["observedGeneration"]}
            if cond is not None and all(cond.get(k) == v for k, v in want.items()):
                want["lastTransitionTime"] = cond.get("lastTransitionTime")
            else:
                keep_time = cond is not None and cond.get("status") == want["status"]
                want["lastTransitionTime"] = cond.get("lastTransitionTime") if keep_time and cond else iso(now)
            st["conditions"] = [want]
            if any(old.get(k) != v for k, v in st.items()) or (old.get("disruptedPods") and not disrupted):
                pdb.obj["status"] = st
                self._modified(pdb)
            self.pdb_synced_rv[key] = str(pdb.meta.get("resourceVersion"))

    def _pdb_observed(self, key: tuple[str, str]) -> None:
        """The disruption controller's informer delivers the PDB change: sync it now."""
        if key in self.pdb_observe_due:
            self.pdb_observe_due[key] = float("-inf")
        self.dirty = True

    def record_pdb_eviction(self, pdb: KObj, pod_name: str) -> None:
        """The eviction subresource's write: one disruption fewer, the pod noted in disruptedPods
        (kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go checkAndDecrement)."""
        st = dict(pdb.obj.get("status") or {})
        st["disruptionsAllowed"] = int(st.get("disruptionsAllowed") or 0) - 1
        if st["disruptionsAllowed"] == 0:
            conds = [c for c in st.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
            conds.append({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods", "message": "",
                          "observedGeneration": st.get("observedGeneration", 0),
                          "lastTransitionTime": iso(self.fleet.now())})
            st["conditions"] = conds
        st["disruptedPods"] = {**(st.get("disruptedPods") or {}), pod_name: iso(self.fleet.now())}
        pdb.obj["status"] = st
        self._modified(pdb)
        self.pdb_synced_rv[(pdb.namespace, pdb.name)] = str(pdb.meta.get("resourceVersion"))
        self.dirty = True

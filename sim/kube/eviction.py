"""The Eviction API (``POST .../pods/<name>/eviction``), as kube-apiserver answers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.http import Request, Response
from sim.kube.disruption import MAX_DISRUPTED_POD_SIZE
from sim.kube.errors import ApiError, not_found
from sim.kube.objects import iso
from sim.kube.writes import dry_run

if TYPE_CHECKING:
    from sim.model import Cluster


class Evictions:
    """Part of :class:`sim.kube.api.KubeApi`: the eviction subresource.
    """

    def _evict(self, c: Cluster, req: Request, ns: str, name: str) -> Response:
        """``POST pods/<name>/eviction``, answered as kubernetes/kubernetes
        pkg/registry/core/pod/storage/eviction.go (EvictionREST.Create, checkAndDecrement) does:

        - NamespaceLifecycle admission first: 403 Forbidden with cause ``NamespaceTerminating`` in a
          terminating namespace (an Eviction is a create), whatever the pod's state;
        - a pod that is Pending, Succeeded, Failed or already terminating is deleted without a PDB check;
        - more than one matching PDB: 500 (a Status with no reason);
        - an unready pod: deleted without using the budget when the PDB says
          ``unhealthyPodEvictionPolicy: AlwaysAllow``, or (IfHealthyBudget, the default) when
          ``currentHealthy >= desiredHealthy > 0``; otherwise it goes through checkAndDecrement;
        - checkAndDecrement, on the PDB's *stored* status, in this order: observedGeneration < generation
          -> 429 with Retry-After 10; disruptionsAllowed < 0 -> 403; more than 2000 disruptedPods -> 403;
          disruptionsAllowed == 0 -> 429 (no Retry-After); else one disruption is used and the pod is
          recorded in disruptedPods;
        - ``dryRun=All`` (query or deleteOptions) checks all of that and changes nothing.
        Deleting marks the pod ``DisruptionTarget`` (reason EvictionByEvictionAPI), then deletes it with
        the eviction's deleteOptions.
        """
        body = self._body(req)
        if body.get("kind") not in (None, "Eviction") or body.get("apiVersion") not in (
                None, "policy/v1", "policy/v1beta1"):
            raise ApiError(400, "BadRequest", "the object provided is unrecognized (must be of type Eviction)")
        meta = body.get("metadata") or {}
        # admission (staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go)
        # runs before the eviction storage sees the request
        c.admit_create("pods", ns, str(meta.get("name") or name))
        if meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        opts = body.get("deleteOptions") or {}
        if not isinstance(opts, dict):
            raise ApiError(400, "BadRequest", "deleteOptions must be an object")
        dry_run(req, "CreateOptions")  # the query's CreateOptions are validated first (422 for a bad value)
        if opts.get("dryRun") is not None and not isinstance(opts.get("dryRun"), list):
            raise ApiError(400, "BadRequest", "couldn't decode DeleteOptions: dryRun must be a list of strings")
        query_dry = [v for v in req.query.get("dryRun") or [] if v]
        body_dry = [str(v) for v in opts.get("dryRun") or []]
        if query_dry and body_dry and query_dry != body_dry:  # propagateDryRun: a plain error, so a 500
            return Response.json(500, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": f"Non-matching dry-run options in request and content: "
                                                  f"[{' '.join(query_dry)}] and [{' '.join(body_dry)}]",
                                       "code": 500})
        # dryrun.IsDryRun is len(dryRun) > 0: a bad value in deleteOptions makes the budget check and the
        # DisruptionTarget update dry runs too, and the delete then refuses it (below, in delete())
        dry = bool(query_dry or body_dry)
        pod = c.pods.get((ns, name))
        if pod is None:
            raise not_found("pods", name)
        pre = opts.get("preconditions") or {}
        grace = opts.get("gracePeriodSeconds")
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
            raise ApiError(400, "BadRequest", "deleteOptions.gracePeriodSeconds must be an integer")
        ok = Response.json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                 "code": 201})

        def delete() -> None:
            # the store's Delete validates the (propagated) deleteOptions first: a dryRun other than "All" is a
            # 422 and nothing changes (staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete ->
            # staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go ValidateDeleteOptions)
            dry_run(req, "DeleteOptions", opts)
            # the delete checks the caller's preconditions (after the budget checks, as on the server)
            for field_name, have in (("uid", pod.meta.get("uid")),
                                     ("resourceVersion", pod.meta.get("resourceVersion"))):
                want = pre.get(field_name)
                if not want or str(want) == str(have):
                    continue
                label = "UID" if field_name == "uid" else "ResourceVersion"
                if dry:  # the store's Preconditions.Check, through InterpretDeleteError
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": Precondition '
                                   f"failed: {label} in precondition: {want}, {label} in object meta: {have}",
                                   {"name": name, "kind": "pods"})
                # addConditionAndDeletePod: the pod update that adds DisruptionTarget checks them first
                tail = ("The object might have been deleted and then recreated" if field_name == "uid"
                        else "The object might have been modified")
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on Pod "{name}": the {label} in the '
                               f"precondition ({want}) does not match the {label} in record ({have}). {tail}",
                               {"name": name, "kind": "Pod"})
            if dry:
                return
            now = iso(self.fleet.now())
            conds = [x for x in pod.obj["status"].get("conditions") or [] if x.get("type") != "DisruptionTarget"]
            conds.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now, "reason": "EvictionByEvictionAPI",
                          "message": "Eviction API: evicting"})
            pod.obj["status"]["conditions"] = conds
            pod.invalidate()
            c.delete_pod(pod, grace=grace, cause="eviction")

        # canIgnorePDB: the pod has already stopped or never started, or is already being deleted
        if pod.terminating or pod.phase in ("Pending", "Succeeded", "Failed"):
            delete()
            return ok
        pdbs = c.pdbs_for(pod)
        if len(pdbs) > 1:
            return Response.json(500, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": "This pod has more than one PodDisruptionBudget, which the "
                                                  "eviction subresource does not support.", "code": 500})
        if not pdbs:
            delete()
            return ok
        pdb = pdbs[0]
        st = pdb.obj.get("status") or {}
        ready = any(x.get("type") == "Ready" and x.get("status") == "True"
                    for x in pod.obj["status"].get("conditions") or [])
        if not ready:
            policy = (pdb.obj.get("spec") or {}).get("unhealthyPodEvictionPolicy")
            current, desired = int(st.get("currentHealthy") or 0), int(st.get("desiredHealthy") or 0)
            if policy == "AlwaysAllow" or (current >= desired and desired > 0):
                delete()  # an unready pod does not count as healthy: the budget is not used
                return ok
        budget_cause = "DisruptionBudget"  # policyv1.DisruptionBudgetCause
        if int(st.get("observedGeneration") or 0) < int(pdb.meta.get("generation") or 1):
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": budget_cause, "message": f"The disruption budget {pdb.name} is "
                                                                           "still being processed by the server."}],
                            "retryAfterSeconds": 10}, headers={"Retry-After": "10"})
        allowed = int(st.get("disruptionsAllowed") or 0)
        forbidden = ("pdb disruptions allowed is negative" if allowed < 0 else
                     "DisruptedPods map too big - too many evictions not confirmed by PDB controller"
                     if len(st.get("disruptedPods") or {}) > MAX_DISRUPTED_POD_SIZE else "")
        if forbidden:
            raise ApiError(403, "Forbidden", f'poddisruptionbudget.policy "{pdb.name}" is forbidden: {forbidden}',
                           {"name": pdb.name, "group": "policy", "kind": "poddisruptionbudget"})
        if allowed == 0:
            # retryAfterSeconds 0: no Retry-After, clients retry on their own schedule
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": budget_cause,
                                        "message": f"The disruption budget {pdb.name} needs "
                                                   f"{int(st.get('desiredHealthy') or 0)} healthy pods and has "
                                                   f"{int(st.get('currentHealthy') or 0)} currently"}]})
        if not dry:
            c.record_pdb_eviction(pdb, pod.name)
        delete()
        return ok

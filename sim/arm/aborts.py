"""Aborting the running operation of a managed cluster or an agent pool (ManagedClusters_AbortLatestOperation,
AgentPools_AbortLatestOperation).

Spec (azure-rest-api-specs specification/containerservice/resource-manager/Microsoft.ContainerService/aks/stable/
2025-10-01/managedClusters.json, ``POST .../managedClusters/{resourceName}/abort`` and
``.../agentPools/{agentPoolName}/abort``; examples ManagedClustersAbortOperation.json, AgentPoolsAbortOperation.json):
responses 202 (``location`` + ``Azure-AsyncOperation``) and 204; "The Managed Cluster [Agent Pool] will be moved to a
Canceling state and eventually to a Canceled state when cancellation finishes. If the operation completes before
cancellation can take place, a 409 error code is returned."

Recorded (tests/replay/recordings/test_aks_abort.json): ``abort_cluster`` answers 202 with the full cluster body
(still ``Creating``: no ``Canceling`` was seen) and both operation headers; the abort's own operation goes
``InProgress`` -> ``Succeeded`` in about 5 s (``poll_operation_*``), its ``operationresults`` then answers 204
(``get_operationresult_204``); afterwards the cluster and its pool show ``provisioningState: "Canceled"``
(``get_cluster_canceled``).

Modelled: the aborted operations stay ``InProgress`` until the abort completes (``timings.abort_s``), and their
work never happens (sim.arm.lro: ``Operation.aborting``); then they end ``Canceled`` (status body ``{"name",
"status": "Canceled", "startTime", "endTime", "error"}``: no recording of an aborted operation's status exists,
the shape is the Failed one's) and their pools show ``Canceled``: an aborted create leaves the pool existing
without nodes, a scale or update keeps what the pool had, a delete keeps the pool, a deleteMachines keeps the
machines. The simulated clusters have no cluster-level operations of their own, so a cluster abort aborts the
running operations of all its pools (in the recording the pool's create was part of the cluster's). Nothing
running: 409 ``OperationNotAllowed`` (flat, the AKS RP's; the spec's 409, its code not documented). The pool
abort answers 202 with the pool body, by analogy with the recorded cluster abort.
"""

from __future__ import annotations

from typing import Any

from sim.arm.common import AksError
from sim.arm.lro import AKS_PROVIDER, Operation
from sim.core.http import Request, Response


class Aborts:
    """Part of :class:`sim.arm.api.ArmApi`: the two abort routes."""

    def _running(self, resource_prefix: str, *, exact: bool) -> list[Operation]:
        prefix = resource_prefix.lower()
        found = []
        for op in self.ops.active_for_prefix(prefix):
            rid = op.resource_id.lower()
            if op.kind == "abort" or op.aborting or (exact and rid != prefix):
                continue
            found.append(op)
        return found

    def _pool_of(self, c: Any, op: Operation) -> Any:
        name = op.resource_id.rsplit("/", 1)[-1].lower()
        return next((p for k, p in c.pools.items() if k.lower() == name), None)

    def _abort(self, request: Request, c: Any, targets: list[Operation], *, resource_id: str, cluster: bool,
               what: str) -> Operation:
        if not targets and not (cluster and c.busy_until > self._now()):
            raise AksError(409, "OperationNotAllowed",
                           f"Operation is not allowed: there is no running operation on {what} to abort; it may have "
                           "completed before cancellation could take place.")
        for target in targets:
            target.aborting = True

        def work(_op: Operation) -> None:
            for target in targets:
                self.ops.cancel(target, f"The operation was canceled by an abort of {what}.")
                pool = self._pool_of(c, target)
                if pool is not None:
                    pool.operation_until = 0.0
                    self._set_state(pool, "Canceled")
            if cluster:
                c.busy_until = 0.0
                c.provisioning_state = "Canceled"

        return self.ops.start(subscription=c.subscription, location=c.location, provider=AKS_PROVIDER,
                              api_version=str(request.arg("api-version")), duration_s=self._timing("abort_s", 5.0),
                              work=work, resource_id=resource_id, kind="abort")

    def _r_cluster_abort(self, request: Request, *, sub: str, rg: str, cluster: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        targets = self._running(f"{c.id}/agentPools/", exact=False)
        body = self._cluster_body(c, self._api(request))  # as it is now: still Creating (recorded abort_cluster)
        op = self._abort(request, c, targets, resource_id=c.id, cluster=True, what=f"managed cluster '{c.name}'")
        return Response.json(202, body, self.ops.accepted_headers(op, self._base_url(request), location=True))

    def _r_pool_abort(self, request: Request, *, sub: str, rg: str, cluster: str, pool: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        p = self._pool(c, pool)
        pool_id = f"{c.id}/agentPools/{p.name}"
        targets = self._running(pool_id, exact=True)
        body = self._pool_body(c, p, self._api(request))
        op = self._abort(request, c, targets, resource_id=pool_id, cluster=False, what=f"agent pool '{p.name}'")
        return Response.json(202, body, self.ops.accepted_headers(op, self._base_url(request), location=True))

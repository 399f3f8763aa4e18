"""Agent-pool writes as long-running operations (create, update, delete, deleteMachines) and the VMSS VM
actions (restart, reimage): capacity is taken when an operation completes, and the cluster's nodes
follow (sim/kube/machines.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from sim.arm.common import (
    NODE_IMAGE,
    POOL_NAME,
    AksApiVersion,
    AksError,
    ArmError,
    GatewayError,
    invalid,
    key_adjust,
    key_lookup,
    project,
)
from sim.arm.lro import AKS_PROVIDER, COMPUTE_PROVIDER, Operation, OperationFailure
from sim.arm.validation import check_linked_authorization, check_types
from sim.core import gpu_catalog
from sim.core.http import Request, Response
from sim.identity.tokens import ARM_AUDIENCES


def _put(d: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    cur = d
    for k in path[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = cur[k] = {}
        cur = nxt
    cur[path[-1]] = value


def _merge_unseen(new: dict[str, Any], old: dict[str, Any], api: AksApiVersion) -> dict[str, Any]:
    """Put back the stored GPU fields that ``api`` cannot see (an old api-version must not erase them).

    Only those: every other field the PUT leaves out is reset (create-or-replace). A field that an
    api-version lacks would otherwise be wiped by every client of that version, which is why ARM's
    versioning rules make a new field a new api-version (Azure/azure-resource-manager-rpc
    v1.0/version-change.md, "New property added to response": a GET-PUT through a model without the
    field overwrites it).
    """
    merged = copy.deepcopy(new)
    old_gp = old.get("gpuProfile")
    if not isinstance(old_gp, dict) or not old_gp:
        return merged
    unseen: dict[str, Any] = {}
    if not api.driver_type and "driverType" in old_gp:
        unseen["driverType"] = copy.deepcopy(old_gp["driverType"])
    old_nv = old_gp.get("nvidia")
    unseen_nv: dict[str, Any] = {}
    if isinstance(old_nv, dict):
        if not api.nvidia:
            unseen_nv = copy.deepcopy(old_nv)
        else:
            for flag, key in ((api.mig_strategy, "migStrategy"), (api.driver_mode, "driverMode"),
                              (api.mig_profiles, "migProfiles")):
                if not flag and key in old_nv:
                    unseen_nv[key] = copy.deepcopy(old_nv[key])
    if not unseen and not unseen_nv:
        return merged
    gp = merged.get("gpuProfile")
    if not isinstance(gp, dict):
        gp = merged["gpuProfile"] = {}
    gp.update(unseen)
    if unseen_nv:
        nv = gp.get("nvidia")
        if not isinstance(nv, dict):
            nv = gp["nvidia"] = {}
        nv.update(unseen_nv)
    return merged


class PoolWrites:
    """Part of :class:`sim.arm.api.ArmApi`: the write routes of agent pools and their VMs.
    """

    # ---- agent pools: writes
    def _busy(self, cluster: Any, pool: Any | None) -> None:
        now = self._now()
        if cluster.busy_until > now:
            raise AksError(409, "OperationNotAllowed",
                           "Operation is not allowed: Another operation (Updating) is in progress, please wait for it "
                           "to finish before starting a new operation. See https://aka.ms/aks-pending-operation for "
                           "more details")
        if pool is not None and (pool.operation_until > now or pool.provisioning_state in
                                 ("Creating", "Updating", "Scaling", "Deleting", "Upgrading")):
            raise AksError(409, "OperationNotAllowed",
                           f"Operation is not allowed: Another agentpool operation ({pool.name} - "
                           f"{pool.provisioning_state}) is in progress, please wait for it to finish before starting a "
                           "new operation. See https://aka.ms/aks-pending-operation for more details")

    def _put_pool(self, request: Request, c: Any, name: str) -> Response:
        api = self._api(request)
        raw = self._body_properties(request)
        check_linked_authorization(request, c, raw)  # ARM's linked access check, before the RP sees it
        existing = next((p for k, p in c.pools.items() if k.lower() == name.lower()), None)
        self._check_preconditions(request, existing)
        self._busy(c, existing)
        check_types(raw, api)  # an api-version deserialises only the fields it has
        props = project(raw, api)
        for read_only in ("provisioningState", "currentOrchestratorVersion", "eTag", "nodeImageVersion", "powerState"):
            props.pop(read_only, None)
        if existing is None:
            return self._create_pool(request, c, name, props, api)
        return self._update_pool(request, c, existing, props, api)

    def _new_etag(self, c: Any, props: dict[str, Any]) -> None:
        """A write gives the pool a new ``properties.eTag`` (learn.microsoft.com/azure/aks/use-etags), unless the
        cluster's scenario says ``pool_etags: false``: AKS before its 2025 eTag rollout, whose pool bodies carry
        none (recorded: test_aks_create_gpu_driver_flow.json, test_aks_nodepool_delete_machines.json)."""
        if getattr(c, "pool_etags", True):
            props["eTag"] = self._etag()
        else:
            props.pop("eTag", None)

    def _set_state(self, pool: Any, state: str) -> None:
        pool.provisioning_state = state
        pool.properties["provisioningState"] = state

    def _lro_fault(self, request: Request, c: Any) -> tuple[str, str] | None:
        faults = getattr(self.fleet, "faults", None)
        if faults is None:
            return None
        hit = faults.match(target="lro", method=request.method, path=request.path, cluster=c.name)
        return (hit.code, hit.message) if hit is not None else None

    def _capacity_take(self, c: Any, pool: Any, target: int) -> int:
        """Reserve VMs for growing ``pool`` to ``target`` nodes (raises AllocationFailed)."""
        need = max(0, target - len(c.pool_nodes(pool)))
        capacity = getattr(self.fleet, "capacity", {}) or {}
        key = (c.location, str(pool.properties.get("vmSize")))
        available = key_lookup(capacity, key)
        if need and available is not None:
            if need > available:
                raise OperationFailure(
                    "AllocationFailed",
                    f"Allocation failed. We do not have sufficient capacity for the requested VM size "
                    f"{key[1]} in region {c.location} (requested {need}, available {available}). Read more about "
                    "improving likelihood of allocation success at http://aka.ms/allocation-guidance", http_status=500)
            key_adjust(capacity, key, -need)
        return need

    def _capacity_give(self, c: Any, vm_size: str, count: int) -> None:
        if count > 0:
            key_adjust(getattr(self.fleet, "capacity", {}) or {}, (c.location, vm_size), count)

    def _start(self, request: Request, c: Any, pool: Any, *, kind: str, duration_s: float,
               work: Callable[[Operation], None], on_failed: Callable[[Operation], None] | None = None,
               on_cancel: Callable[[], None] | None = None) -> Operation:
        """Start a pool operation. ``on_cancel`` undoes what the request already changed when the operation is
        canceled (by an abort, sim/arm/aborts.py, or a delete) instead of completing."""
        def finish(op: Operation) -> None:
            pool.operation_until = 0.0
            work(op)
            if getattr(c, "provisioning_state", "Succeeded") == "Canceled":
                c.provisioning_state = "Succeeded"  # a later operation succeeded: the abort is history
            if kind != "delete":
                self._set_state(pool, "Succeeded")
                pool.properties.pop("status", None)

        def failed(op: Operation) -> None:
            pool.operation_until = 0.0
            if kind != "delete" or pool.name in c.pools:
                self._set_state(pool, "Failed")
                # As AKS does: the failed operation's error stays readable on the pool itself.
                err = op.error or {"code": "OperationFailed", "message": "The operation failed."}
                pool.properties["status"] = {"provisioningError": copy.deepcopy(dict(err))}
            if on_failed is not None:
                on_failed(op)

        op = self.ops.start(subscription=c.subscription, location=c.location, provider=AKS_PROVIDER,
                            api_version=str(request.arg("api-version")), duration_s=duration_s, work=finish,
                            resource_id=f"{c.id}/agentPools/{pool.name}", kind=kind,
                            fail=self._lro_fault(request, c), on_failed=failed, on_cancel=on_cancel)
        pool.operation_until = op.due
        return op

    def _create_pool(self, request: Request, c: Any, name: str, props: dict[str, Any], api: AksApiVersion) -> Response:
        if not POOL_NAME.match(name):
            raise invalid("The value of parameter agentPoolProfile.name is invalid. "
                           "Please see https://aka.ms/aks-naming-rules for more details.", "agentPoolProfile.name")
        if props.get("enableAutoScaling") and props.get("count") is None:
            raise invalid("Required parameter properties.count is missing (null).", "properties.count")
        props.setdefault("count", 1)
        size = self._validate_common(c, name, props, api)
        self._check_features(c, props)
        self._check_quota(c, size, extra_vcpus=int(props["count"]) * size.vcpus,
                          priority=str(props.get("scaleSetPriority") or "Regular"))
        from sim.model import Pool  # the model is the other half's; imported late to keep this module light

        pool = Pool(name=name, properties=self._defaults(c, name, props, size))
        self._new_etag(c, pool.properties)
        self._set_state(pool, "Creating")
        c.pools[name] = pool

        def work(op: Operation) -> None:
            self._capacity_take(c, pool, int(pool.properties["count"]))
            c.materialise_pool(pool)

        op = self._start(request, c, pool, kind="create", duration_s=self._timing("pool_create_s", 60.0), work=work)
        headers = self.ops.accepted_headers(op, self._base_url(request), location=False)
        return Response.json(201, self._pool_body(c, pool, api), headers)

    def _update_pool(self, request: Request, c: Any, pool: Any, props: dict[str, Any], api: AksApiVersion) -> Response:
        old = pool.properties
        # Create-or-replace: what the body leaves out is reset to its default, as on create
        # ("count" defaults to 1 in the spec); only fields this api-version cannot express are kept.
        new = _merge_unseen(props, old, api)
        if new.get("count") is None:
            new["count"] = 1
        reset_size = gpu_catalog.lookup(str(new.get("vmSize") or ""))
        self._check_immutable(old, self._defaults(c, pool.name, new, reset_size) if reset_size is not None else new)
        autoscale_old = bool(old.get("enableAutoScaling"))
        autoscale_new = bool(new.get("enableAutoScaling"))  # omitted = the default, off
        count_changed = new.get("count") != old.get("count")
        if count_changed and autoscale_old and autoscale_new:
            raise AksError(400, "OperationNotAllowed",
                           f"Cannot change the count of agent pool '{pool.name}' while enableAutoScaling is true; "
                           "change minCount/maxCount or disable the cluster autoscaler first.", target="properties.count")
        size = self._validate_common(c, pool.name, new, api)
        grow = int(new["count"]) - int(old.get("count") or 0)
        self._check_quota(c, size, extra_vcpus=grow * size.vcpus,
                          priority=str(new.get("scaleSetPriority") or "Regular"))
        merged = self._defaults(c, pool.name, new, size)
        merged["nodeImageVersion"] = old.get("nodeImageVersion", NODE_IMAGE)
        self._new_etag(c, merged)
        old_props = copy.deepcopy(old)
        # a PUT on a pool whose last operation was aborted brings it to the goal it describes (an aborted create
        # left it without nodes): modelled, not recorded (sim/arm/aborts.py)
        reconcile = pool.provisioning_state == "Canceled"
        pool.properties = merged
        kind = "scale" if count_changed else "update"
        self._set_state(pool, "Scaling" if count_changed else "Updating")
        target = int(merged["count"])

        def work(op: Operation) -> None:
            if count_changed or reconcile:
                before = len(c.pool_nodes(pool))
                self._capacity_take(c, pool, target)
                c.scale_nodes(pool, target)
                self._capacity_give(c, str(merged["vmSize"]), before - target)

        def failed(op: Operation) -> None:
            if count_changed:  # the scale did not happen: the pool keeps its old size
                pool.properties["count"] = old_props.get("count")

        def canceled() -> None:  # aborted: the update did not happen, the pool keeps what it had
            pool.properties = copy.deepcopy(old_props)

        op = self._start(request, c, pool, kind=kind,
                         duration_s=self._timing("pool_scale_s" if count_changed else "pool_update_s", 30.0),
                         work=work, on_failed=failed, on_cancel=canceled)
        headers = self.ops.accepted_headers(op, self._base_url(request), location=False)
        return Response.json(200, self._pool_body(c, pool, api), headers)

    def _delete_pool(self, request: Request, c: Any, name: str) -> Response:
        pool = next((p for k, p in c.pools.items() if k.lower() == name.lower()), None)
        if pool is None:
            if (request.headers.get("if-match") or "").strip():
                self._check_preconditions(request, None)  # AKS: 412, "Resource not found but ETag header is provided"
            return Response(status=204)
        self._check_preconditions(request, pool)
        self._busy(c, None)
        if pool.provisioning_state == "Deleting":
            raise AksError(409, "OperationNotAllowed",
                           f"Operation is not allowed: Another agentpool operation ({pool.name} - Deleting) is in "
                           "progress, please wait for it to finish before starting a new operation. "
                           "See https://aka.ms/aks-pending-operation for more details")
        if str(pool.properties.get("mode")) == "System" and not any(
                str(p.properties.get("mode")) == "System" for k, p in c.pools.items() if p is not pool):
            raise AksError(400, "OperationNotAllowed",
                           f"Agent pool '{pool.name}' is the last System agent pool of cluster '{c.name}'; a cluster "
                           "needs at least one System agent pool.", target="agentPoolProfile.mode")
        for running in self.ops.active_for(f"{c.id}/agentPools/{pool.name}"):
            self.ops.cancel(running, f"Canceled by a delete of agent pool '{pool.name}'.")
        self._set_state(pool, "Deleting")

        def work(op: Operation) -> None:
            removed = len(c.pool_nodes(pool))
            c.remove_pool_nodes(pool)
            c.pools.pop(pool.name, None)
            self._capacity_give(c, str(pool.properties.get("vmSize")), removed)

        op = self._start(request, c, pool, kind="delete", duration_s=self._timing("pool_delete_s", 45.0), work=work)
        headers = self.ops.accepted_headers(op, self._base_url(request), location=True)
        return Response(status=202, headers=headers)

    def _r_delete_machines(self, request: Request, *, sub: str, rg: str, cluster: str, pool: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        p = self._pool(c, pool)
        try:
            body = request.json()
        except ValueError as exc:
            raise GatewayError(400, "InvalidRequestContent",
                           f"The request content was invalid and could not be deserialized: {exc}.") from exc
        names = body.get("machineNames") if isinstance(body, dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise invalid("machineNames must be a non-empty list of machine names.", "machineNames")
        self._busy(c, p)
        known = {m["name"].lower(): m["name"] for m in c.machines(p)}
        missing = [n for n in names if n.lower() not in known]
        if missing:
            raise invalid(f"Machine(s) {', '.join(missing)} not found in agent pool '{p.name}'.", "machineNames")
        victims = sorted({known[n.lower()] for n in names})
        self._set_state(p, "Scaling")

        def work(op: Operation) -> None:
            present = {m["name"] for m in c.machines(p)}
            gone = [n for n in victims if n in present]
            c.remove_machines(p, gone)
            p.properties["count"] = max(0, int(p.properties.get("count") or 0) - len(gone))
            self._new_etag(c, p.properties)
            self._capacity_give(c, str(p.properties.get("vmSize")), len(gone))

        op = self._start(request, c, p, kind="deleteMachines", duration_s=self._timing("delete_machines_s", 30.0),
                         work=work)
        headers = self.ops.accepted_headers(op, self._base_url(request), location=True)
        return Response(status=202, headers=headers)

    # ---- Microsoft.Compute: VMSS VM restart / reimage
    def _r_vm_action(self, request: Request, *, sub: str, rg: str, vmss: str, instance: str, action: str) -> Response:
        c = self._cluster_by_node_rg(sub, rg)
        vmss_names = {c.vmss_name(p).lower(): p for p in c.pools.values()} if c is not None else {}
        if c is None or vmss.lower() not in vmss_names:
            raise GatewayError(404, "ResourceNotFound",
                           f"The Resource 'Microsoft.Compute/virtualMachineScaleSets/{vmss}' under resource group "
                           f"'{rg}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix")
        node = c.node_by_vmss_instance(vmss, instance)
        if node is None:  # Microsoft.Compute's own answer: ARM's wrapped shape
            raise ArmError(404, "NotFound",
                           f"The entity was not found in this resource group: virtualMachineScaleSets/{vmss}"
                           f"/virtualMachines/{instance}.")
        if request.body:
            try:
                request.json()
            except ValueError as exc:
                raise GatewayError(400, "InvalidRequestContent",
                               f"The request content was invalid and could not be deserialized: {exc}.") from exc
        action = action.lower()
        if c.node_rg_locked:
            # Node resource group lockdown: a ReadOnly deny assignment on the node resource group
            # (https://learn.microsoft.com/azure/aks/node-resource-group-lockdown). ARM answers 403
            # DenyAssignmentAuthorizationFailed naming the deny assignment (the shape seen in
            # Azure/migAz#266 for another system deny assignment; AKS's exact name is not documented).
            principal = c.fleet.tokens.verify(request.bearer, ARM_AUDIENCES).principal or "unknown"
            scope = f"/subscriptions/{sub}/resourceGroups/{c.node_resource_group}"
            raise GatewayError(403, "DenyAssignmentAuthorizationFailed",
                           f"The client '{principal}' with object id '{principal}' has permission to perform action "
                           f"'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/{action}/action' on scope "
                           f"'{scope}/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/"
                           f"{instance}'; however, the access is denied because of the deny assignment with name "
                           f"'AKS node resource group lockdown' and Id '{c.name}-nrg-lockdown' at scope '{scope}'.")
        vm = c.nodes.get(node)
        if vm is not None and any(t.get("key") == "node.cloudprovider.kubernetes.io/shutdown"
                                  for t in vm.obj["spec"].get("taints") or []):
            # A stopped/deallocated VM (an evicted spot VM under the Deallocate policy): Compute refuses
            # a restart or reimage with 409 OperationNotAllowed until it is started again (Compute's own
            # answer: ARM's wrapped shape).
            raise ArmError(409, "OperationNotAllowed",
                           f"Operation '{action}' is not allowed on VM '{vmss}_{instance}' since the VM is deallocated.")
        duration = self._timing("restart_s" if action == "restart" else "reimage_s", 30.0 if action == "restart" else 90.0)
        fail = self._lro_fault(request, c)
        if fail is None:
            (c.restart_node if action == "restart" else c.reimage_node)(node)
        vm_id = (f"/subscriptions/{sub}/resourceGroups/{c.node_resource_group}/providers/Microsoft.Compute"
                 f"/virtualMachineScaleSets/{vmss}/virtualMachines/{instance}")
        op = self.ops.start(subscription=c.subscription, location=c.location, provider=COMPUTE_PROVIDER,
                            api_version=str(request.arg("api-version")), duration_s=duration,
                            work=lambda _op: None, resource_id=vm_id, kind=action, fail=fail)
        headers = self.ops.accepted_headers(op, self._base_url(request), location=True)
        return Response(status=202, headers=headers)

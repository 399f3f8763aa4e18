"""Azure Resource Manager, Microsoft.ContainerService: the AksPort over azure-mgmt-containerservice.

Why the details matter:

- One ``ContainerServiceClient`` per subscription, built with :func:`shared.adapters.arm.arm_client_options`:
  ARM_ENDPOINT with the token scope of ARM_AUDIENCE (public cloud, sovereign clouds and the simulator
  differ only in settings), STEWARD_CA_BUNDLE when set, and the SDK's own retries off (``retry_total=0``):
  retrying is :mod:`shared.kernel.retry`'s job alone, so a throttled ARM sees one polite client, not two.
- One client per subscription and api-version: the stable one by default, the preview one for reads of
  pools and for the writes whose body needs it; the SDK's models carry unknown keys unchanged, so
  bodies are sent as the raw camelCase dicts the rest of the app builds (the AgentPool resource of
  Azure/azure-rest-api-specs specification/containerservice/resource-manager/Microsoft.ContainerService/aks).
- ``begin_*`` return once ARM accepted the request (``polling=False``): the ledger and the
  reconciler follow the long-running operation by reading the pool, never by holding an invocation.
- Every SDK call goes through :func:`shared.adapters.arm.call_arm`, which translates its exceptions into
  the specific types of shared.kernel.errors by ARM's error *code*: the core never searches message text.
- Pools are *read* with the preview api-version, the one that shows the most of a pool (``nvidia.migStrategy``,
  kubelet eviction thresholds, ``nodeInitializationTaints``... exist only there), so that a write built from
  a read (a PUT is create-or-replace) carries all of them; a PUT is sent on the first api-version whose
  AgentPool definition carries every property of its body (:func:`shared.kernel.definitions.api_version_for`),
  and a body that none carries is not sent at all (:class:`shared.kernel.errors.Unwritable`). An api-version
  that lacks a property does not write it, and a client that does not send a field it read resets it
  (Azure/azure-resource-manager-rpc v1.0/version-change.md: the GET-PUT pipeline).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shared.adapters.arm import arm_client_options, call_arm
from shared.adapters.permissions import requires_arm
from shared.kernel import definitions, retry
from shared.kernel.errors import Invalid, NotFound, Unwritable
from shared.kernel.ports import ClusterInfo, MachineInfo, PoolInfo, parse_cluster_id

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

    from shared.kernel.clock import Clock
    from shared.settings import Settings

T = TypeVar("T")



# --------------------------------------------------------------------------- views


def _raw(model: Any) -> dict[str, Any]:
    if isinstance(model, Mapping) and not hasattr(model, "as_dict"):
        return dict(model)
    return dict(model.as_dict())


def cluster_view(raw: Mapping[str, Any]) -> ClusterInfo:
    sub, rg, name = parse_cluster_id(str(raw.get("id", "")))
    props = raw.get("properties") or {}
    npp = props.get("nodeProvisioningProfile") or {}
    return ClusterInfo(
        id=str(raw["id"]), name=str(raw.get("name") or name), subscription=sub, resource_group=rg,
        location=str(raw.get("location", "")), tags=dict(raw.get("tags") or {}),
        node_resource_group=str(props.get("nodeResourceGroup", "")),
        node_provisioning_mode=str(npp.get("mode") or "Manual"),
        provisioning_state=str(props.get("provisioningState") or ""),
    )


def pool_view(cluster_id: str, raw: Mapping[str, Any]) -> PoolInfo:
    """The pool with its raw ARM ``properties``, every field kept (known to the app or not): a write
    built from it must carry them all, since a PUT is create-or-replace."""
    return PoolInfo(cluster_id=cluster_id, name=str(raw.get("name", "")), properties=dict(raw.get("properties") or {}))


def machine_view(raw: Mapping[str, Any]) -> MachineInfo:
    props = raw.get("properties") or {}
    return MachineInfo(name=str(raw.get("name", "")), resource_id=str(props.get("resourceId", "")),
                       zones=tuple(raw.get("zones") or ()))


def if_match(etag: str | None) -> dict[str, Any]:
    """SDK keywords for ``If-Match: <etag>`` (none without an etag): azure-core's ``MatchConditions``."""
    if not etag:
        return {}
    from azure.core import MatchConditions

    return {"etag": str(etag), "match_condition": MatchConditions.IfNotModified}


def if_none_match() -> dict[str, Any]:
    """SDK keywords for ``If-None-Match: *``: create only, never replace a pool that exists."""
    from azure.core import MatchConditions

    return {"match_condition": MatchConditions.IfMissing}


def pool_etag(pool: PoolInfo | None) -> str | None:
    """The pool's ``properties.eTag`` (:attr:`PoolInfo.etag`), None without a pool or an eTag."""
    return None if pool is None else pool.etag


# --------------------------------------------------------------------------- the adapter


class AksClient:
    """AksPort over azure-mgmt-containerservice (the stable api-version; the preview one where the data needs it)."""

    def __init__(self, credential: TokenCredential, settings: Settings, *, clock: Clock | None = None,
                 retry_attempts: int = 4, retry_max_delay: float = 30.0) -> None:
        self._credential = credential
        self._settings = settings
        self._clock = clock
        self._attempts = retry_attempts
        self._max_delay = retry_max_delay
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    # -- plumbing

    def _client(self, subscription: str, *, api_version: str = definitions.STABLE_API_VERSION) -> Any:
        key = (subscription.lower(), api_version)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                from azure.mgmt.containerservice import ContainerServiceClient

                options = arm_client_options(self._settings)
                options["api_version"] = api_version
                client = ContainerServiceClient(self._credential, subscription, **options)
                self._clients[key] = client
            return client

    def _run(self, fn: Callable[[], T], *, what: str) -> T:
        from shared.kernel import clock as clocks

        return retry.call(call_arm, fn, what=what, clock=self._clock or clocks.current(),
                          attempts=self._attempts, max_delay=self._max_delay)

    # -- clusters

    @requires_arm("Microsoft.ContainerService/managedClusters/read")
    def list_clusters(self, subscription: str) -> list[ClusterInfo]:
        client = self._client(subscription)
        raws = self._run(lambda: [_raw(c) for c in client.managed_clusters.list()],
                         what=f"list clusters in {subscription}")
        return [cluster_view(r) for r in raws]

    @requires_arm("Microsoft.ContainerService/managedClusters/read")
    def get_cluster(self, cluster_id: str) -> ClusterInfo:
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub)
        return cluster_view(self._run(lambda: _raw(client.managed_clusters.get(rg, name)), what=f"get {cluster_id}"))

    @requires_arm("Microsoft.ContainerService/managedClusters/listClusterUserCredential/action")
    def kubeconfig(self, cluster_id: str) -> bytes:
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub)
        result = self._run(lambda: _raw(client.managed_clusters.list_cluster_user_credentials(rg, name, format="exec")),
                           what=f"listClusterUserCredential {cluster_id}")
        configs = result.get("kubeconfigs") or []
        if not configs or not configs[0].get("value"):
            raise NotFound(f"listClusterUserCredential {cluster_id}: no kubeconfig returned")
        value = configs[0]["value"]
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        return base64.b64decode(str(value))

    @requires_arm("Microsoft.ContainerService/managedClusters/maintenanceConfigurations/read")
    def list_maintenance_configurations(self, cluster_id: str) -> list[Mapping[str, Any]]:
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub)
        return self._run(lambda: [_raw(m) for m in client.maintenance_configurations.list_by_managed_cluster(rg, name)],
                         what=f"list maintenance configurations of {cluster_id}")

    # -- agent pools

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/read")
    def list_pools(self, cluster_id: str) -> list[PoolInfo]:
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub, api_version=definitions.PREVIEW_API_VERSION)  # it shows the most of a pool
        raws = self._run(lambda: [_raw(p) for p in client.agent_pools.list(rg, name)], what=f"list pools of {cluster_id}")
        return [pool_view(cluster_id, r) for r in raws]

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/read")
    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub, api_version=definitions.PREVIEW_API_VERSION)  # it shows the most of a pool
        try:
            raw = self._run(lambda: _raw(client.agent_pools.get(rg, name, pool)), what=f"get pool {pool} of {cluster_id}")
        except NotFound:
            return None
        return pool_view(cluster_id, raw)

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/write")
    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], *, api_version: str | None = None,
                       etag: str | None = None, create_only: bool = False) -> None:
        """PUT the pool. ``body`` is either the AgentPool (``{"properties": {...}}``) or its properties.

        The api-version is ``api_version``, or when not given the first one whose AgentPool definition
        carries every property of the body (a MIG pool's ``migStrategy`` or a pool's kubelet eviction
        thresholds, read back by :meth:`get_pool`, need the preview one): sent on a version that lacks a
        property, the property would not be written. A body that no api-version carries is not sent:
        :class:`~shared.kernel.errors.Unwritable` names the properties.
        ``etag`` (the pool's ``properties.eTag`` as read) is sent as ``If-Match``: AKS then refuses
        the write with 412 (raised as Conflict) if the pool changed since it was read. ``create_only``
        sends ``If-None-Match: *`` instead: a PUT is create-or-replace, and a pool someone made under
        the same name between our read and our PUT must not be overwritten (412 -> Conflict).
        """
        sub, rg, name = parse_cluster_id(cluster_id)
        payload = dict(body) if "properties" in body else {"properties": dict(body)}
        props = payload.get("properties") or {}
        version = api_version or definitions.api_version_for(props)
        if version is None:
            lost = definitions.unrepresentable(props)
            raise Unwritable(f"put pool {pool} of {cluster_id} not sent: no api-version the app speaks "
                             f"({', '.join(definitions.API_VERSIONS)}) carries {', '.join(lost)}", fields=lost)
        client = self._client(sub, api_version=version)
        if create_only and etag:
            raise ValueError("create_only and etag exclude each other")
        kwargs = if_none_match() if create_only else if_match(etag)
        self._run(lambda: client.agent_pools.begin_create_or_update(rg, name, pool, payload, polling=False, **kwargs),
                  what=f"put pool {pool} of {cluster_id}")

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/delete")
    def begin_delete_pool(self, cluster_id: str, pool: str, *, ignore_pdb: bool = False, etag: str | None = None) -> None:
        """DELETE the pool (already gone = done). ``etag`` is sent as ``If-Match`` (see :meth:`begin_put_pool`):
        the pool is deleted only if it is still the version the caller read and verified."""
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub)
        kwargs: dict[str, Any] = {"polling": False, **if_match(etag)}
        if ignore_pdb:
            kwargs["ignore_pod_disruption_budget"] = True
        try:
            self._run(lambda: client.agent_pools.begin_delete(rg, name, pool, **kwargs),
                      what=f"delete pool {pool} of {cluster_id}")
        except NotFound:
            return  # already gone

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/deleteMachines/action")
    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Sequence[str]) -> None:
        if not machines:
            return
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub)
        body = {"machineNames": list(machines)}
        try:
            self._run(lambda: client.agent_pools.begin_delete_machines(rg, name, pool, body, polling=False),
                      what=f"delete machines {', '.join(machines)} of pool {pool} of {cluster_id}")
        except (Invalid, NotFound):
            # Deleting machines that are already gone is done, whatever words ARM chose for it: told
            # apart by listing the pool's machines again, not by reading the error message.
            if any(m.name in set(machines) for m in self.list_machines(cluster_id, pool)):
                raise

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/machines/read")
    def list_machines(self, cluster_id: str, pool: str) -> list[MachineInfo]:
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub)
        raws = self._run(lambda: [_raw(m) for m in client.machines.list(rg, name, pool)],
                         what=f"list machines of pool {pool} of {cluster_id}")
        return [machine_view(r) for r in raws]

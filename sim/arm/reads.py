"""Reads of the simulated AKS resource provider: clusters, agent pools and their machines, maintenance
configurations, and the cluster user credential (a kubeconfig).
"""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

import yaml

from sim.arm.common import (
    AKS_SERVER_APP_ID,
    KUBELOGIN_CLIENT_ID,
    POOL_TYPE,
    AksApiVersion,
    AksError,
    invalid,
    present_pool,
    project,
)
from sim.core.http import Request, Response

# --------------------------------------------------------------------------- maintenance configurations
# Azure/azure-rest-api-specs specification/containerservice/resource-manager/Microsoft.ContainerService/
# aks/stable/2025-10-01/managedClusters.json (MaintenanceConfigurationProperties: timeInWeek, notAllowedTime,
# maintenanceWindow). A ``default`` written in the legacy ``timeInWeek`` shape is answered as written, not migrated
# to a ``maintenanceWindow`` (recorded at api-version 2026-07-01: tests/replay/recordings/
# test_aks_maintenanceconfiguration.json put_maintenance_default_legacy, get_maintenance_default_legacy).


def maintenance_start_date(now: float, utc_offset: Any) -> str:
    """Today's date in the window's offset (``+HH:MM``; UTC when absent or unreadable)."""
    import datetime as _dt

    match = re.fullmatch(r"([+-])(\d{2}):(\d{2})", str(utc_offset or "+00:00"))
    seconds = (int(match.group(2)) * 3600 + int(match.group(3)) * 60) * (1 if match.group(1) == "+" else -1) \
        if match else 0
    return _dt.datetime.fromtimestamp(now + seconds, _dt.UTC).date().isoformat()


def _normalised_time(value: Any) -> Any:
    """A date-time as AKS answers it: UTC ``...Z`` without fractional zeros (recorded:
    put_maintenance_default_legacy_not_allowed_time sends ``2021-11-26T03:00:00.000Z`` and gets
    ``2021-11-26T03:00:00Z``). Anything unreadable is left as written."""
    import datetime as _dt

    if not isinstance(value, str):
        return value
    try:
        parsed = _dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return value
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(_dt.UTC)
    text = parsed.strftime("%Y-%m-%dT%H:%M:%S")
    if parsed.microsecond:
        text += f".{parsed.microsecond:06d}".rstrip("0")
    return text + "Z"


def present_maintenance_properties(stored: dict[str, Any]) -> dict[str, Any]:
    """The ``properties`` AKS answers for a stored maintenance configuration: as written, with
    ``notAllowedTime`` only when non-empty and its times normalised (recorded: test_aks_maintenanceconfiguration.json
    put_maintenance_default_legacy answers a request with ``"notAllowedTime": []`` without the field)."""
    props = copy.deepcopy(stored)
    spans = props.get("notAllowedTime")
    if isinstance(spans, list):
        if not spans:
            props.pop("notAllowedTime")
        else:
            props["notAllowedTime"] = [{k: _normalised_time(v) if k in ("start", "end") else v for k, v in span.items()}
                                       if isinstance(span, dict) else span for span in spans]
    return props


# The first api-version whose agentPools list was recorded with a nextLink (see ClusterReads._r_pools).
POOLS_NEXT_LINK_SINCE = "2025-04-02"


def pools_next_link(api_version: str) -> bool:
    """Whether an agentPools list on ``api_version`` carries a ``nextLink`` (from 2025-04-02-preview on)."""
    return api_version[:10] >= POOLS_NEXT_LINK_SINCE


class ClusterReads:
    """Part of :class:`sim.arm.api.ArmApi`: the GET routes of clusters, pools, machines and maintenance
    configurations, and ``listClusterUserCredential``.
    """

    # ---- rendering
    def _pool_body(self, cluster: Any, pool: Any, api: AksApiVersion) -> dict[str, Any]:
        props = present_pool(project(pool.properties, api))
        props["provisioningState"] = pool.provisioning_state
        if not getattr(cluster, "pool_etags", True):
            props.pop("eTag", None)  # scenario pool_etags: false (sim/arm/pools.py _new_etag)
        return {"id": f"{cluster.id}/agentPools/{pool.name}", "name": pool.name, "type": POOL_TYPE,
                "properties": props}

    def _cluster_body(self, c: Any, api: AksApiVersion) -> dict[str, Any]:
        busy = c.busy_until > self._now()
        profiles = []
        for pname in sorted(c.pools):
            pool = c.pools[pname]
            summary = present_pool(project(pool.properties, api))
            summary["provisioningState"] = pool.provisioning_state
            if not getattr(c, "pool_etags", True):
                summary.pop("eTag", None)
            profiles.append({"name": pool.name, **summary})
        location = c.location
        return {
            "id": c.id, "name": c.name, "type": "Microsoft.ContainerService/ManagedClusters", "location": location,
            "tags": dict(c.tags),
            "sku": {"name": "Base", "tier": "Standard"},
            "identity": {"type": "SystemAssigned"},
            "properties": {
                "provisioningState": "Updating" if busy else getattr(c, "provisioning_state", "Succeeded"),
                "powerState": {"code": "Running"},
                "kubernetesVersion": c.kubernetes_version,
                "currentKubernetesVersion": c.kubernetes_version,
                "dnsPrefix": c.name,
                "fqdn": f"{c.name}-dns.hcp.{location}.azmk8s.io",
                "agentPoolProfiles": profiles,
                "nodeResourceGroup": c.node_resource_group,
                "enableRBAC": True,
                "aadProfile": {"managed": True, "enableAzureRBAC": True},
                "disableLocalAccounts": True,
                "nodeProvisioningProfile": {"mode": c.node_provisioning_mode},
                "networkProfile": {"networkPlugin": "azure", "networkPluginMode": "overlay",
                                   "podCidr": "10.244.0.0/16", "serviceCidr": "10.0.0.0/16",
                                   "dnsServiceIP": "10.0.0.10", "loadBalancerSku": "standard"},
                "maxAgentPools": 100,
            },
        }

    # ---- managed clusters
    def _r_clusters_in_sub(self, request: Request, *, sub: str) -> Response:
        api = self._api(request)
        items = [self._cluster_body(self.fleet.clusters[k], api) for k in sorted(self.fleet.clusters)
                 if self.fleet.clusters[k].subscription.lower() == sub.lower()]
        return Response.json(200, {"value": items})

    def _r_clusters_in_rg(self, request: Request, *, sub: str, rg: str) -> Response:
        api = self._api(request)
        items = [self._cluster_body(self.fleet.clusters[k], api) for k in sorted(self.fleet.clusters)
                 if self.fleet.clusters[k].subscription.lower() == sub.lower()
                 and self.fleet.clusters[k].resource_group.lower() == rg.lower()]
        return Response.json(200, {"value": items})

    def _r_cluster(self, request: Request, *, sub: str, rg: str, cluster: str) -> Response:
        return Response.json(200, self._cluster_body(self._cluster(sub, rg, cluster), self._api(request)))

    def _r_maintenance_list(self, request: Request, *, sub: str, rg: str, cluster: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        api = self._api(request)
        return Response.json(200, {"value": [self._maintenance_body(c, n, api)
                                             for n in sorted(c.maintenance_configurations)]})

    def _r_maintenance(self, request: Request, *, sub: str, rg: str, cluster: str, config: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        for name in c.maintenance_configurations:
            if name.lower() == config.lower():
                return Response.json(200, self._maintenance_body(c, name, self._api(request)))
        raise AksError(404, "NotFound", f"Maintenance configuration '{config}' not found in cluster '{c.name}'.")

    def _maintenance_body(self, c: Any, name: str, api: AksApiVersion) -> dict[str, Any]:
        stored = c.maintenance_configurations[name]
        window = stored.get("maintenanceWindow")
        if isinstance(window, dict) and not window.get("startDate"):
            # MaintenanceWindow.startDate defaults to "the current date at creation time"
            # (learn.microsoft.com/azure/aks/planned-maintenance, "Create a maintenance window"): the RP
            # stores it, so every later GET shows the same date. Set once, in the window's own offset.
            window["startDate"] = maintenance_start_date(self._now(), window.get("utcOffset"))
        # id, name, properties and no type (recorded: test_aks_maintenanceconfiguration.json,
        # test_aks_maintenancewindow.json, every maintenance body)
        return {"id": f"{c.id}/maintenanceConfigurations/{name}", "name": name,
                "properties": present_maintenance_properties(stored)}

    def _r_user_credential(self, request: Request, *, sub: str, rg: str, cluster: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        fmt = (request.arg("format") or "azure").lower()
        if fmt not in ("azure", "exec"):
            raise invalid(f"The value '{request.arg('format')}' of parameter format is invalid; use azure or exec.",
                           "format")
        kubeconfig = self._kubeconfig(request, c, exec_format=fmt == "exec")
        value = base64.b64encode(kubeconfig.encode()).decode()
        return Response.json(200, {"kubeconfigs": [{"name": "clusterUser", "value": value}]})

    def _kubeconfig(self, request: Request, c: Any, *, exec_format: bool) -> str:
        server = f"{self._base_url(request)}/k8s/{c.subscription}/{c.resource_group}/{c.name}"
        cluster_entry: dict[str, Any] = {"server": server}
        ca = self._ca_pem()
        if ca:
            ca_bytes = ca.encode() if isinstance(ca, str) else bytes(ca)
            cluster_entry["certificate-authority-data"] = base64.b64encode(ca_bytes).decode()
        user_name = f"clusterUser_{c.resource_group}_{c.name}"
        if exec_format:
            user: dict[str, Any] = {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": "kubelogin",
                "args": ["get-token", "--login", "azurecli", "--server-id", AKS_SERVER_APP_ID],
                "env": None,
                "installHint": "\nkubelogin is not installed which is required to connect to AAD enabled cluster.\n\n"
                               "To learn more, please go to https://aka.ms/aks/kubelogin\n",
                "provideClusterInfo": False,
                "interactiveMode": "IfAvailable",
            }}
        else:
            user = {"auth-provider": {"name": "azure", "config": {
                "apiserver-id": AKS_SERVER_APP_ID, "client-id": KUBELOGIN_CLIENT_ID,
                "config-mode": "1", "environment": "AzurePublicCloud", "tenant-id": "common"}}}
        doc = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": c.name, "cluster": cluster_entry}],
            "contexts": [{"name": c.name, "context": {"cluster": c.name, "user": user_name}}],
            "current-context": c.name,
            "users": [{"name": user_name, "user": user}],
        }
        return yaml.safe_dump(doc, sort_keys=False)

    # ---- agent pools: reads
    def _r_pools(self, request: Request, *, sub: str, rg: str, cluster: str) -> Response:
        """The agent pools, all on the first page. From api-version 2025-04-02-preview on, that page carries a
        ``nextLink`` (``...agentPools?%24skipToken=<t>&api-version=<v>&skipToken=<t>``) whose page is
        ``{"value": []}`` without one (recorded: test_aks_create_gpu_driver_flow.json list_agentpools /
        list_agentpools_next_page_empty at 2026-07-01, test_aks_nodepool_delete_machines.json at
        2025-04-02-preview); older versions have none (test_aks_machine_cmds.json list_agentpools,
        2023-10-02-preview)."""
        c = self._cluster(sub, rg, cluster)
        api = self._api(request)
        if request.arg("$skipToken") is not None or request.arg("skipToken") is not None:
            return Response.json(200, {"value": []})
        page: dict[str, Any] = {"value": [self._pool_body(c, c.pools[n], api) for n in sorted(c.pools)]}
        if pools_next_link(api.name):
            token = str(len(page["value"]))
            page["nextLink"] = (f"{self._base_url(request)}{request.path.rstrip('/')}?%24skipToken={token}"
                                f"&api-version={api.name}&skipToken={token}")
        return Response.json(200, page)

    def _r_machines(self, request: Request, *, sub: str, rg: str, cluster: str, pool: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        p = self._pool(c, pool)
        return Response.json(200, {"value": [self._machine_body(c, p, m) for m in c.machines(p)]})

    def _r_machine(self, request: Request, *, sub: str, rg: str, cluster: str, pool: str, machine: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        p = self._pool(c, pool)
        for m in c.machines(p):
            if m["name"].lower() == machine.lower():
                return Response.json(200, self._machine_body(c, p, m))
        raise AksError(404, "NotFound", f"Machine '{machine}' not found in agent pool '{p.name}'.")

    @staticmethod
    def _machine_body(c: Any, pool: Any, m: dict[str, Any]) -> dict[str, Any]:
        addresses = []
        node = getattr(c, "nodes", {}).get(m["name"])
        if node is not None:
            for a in (node.obj.get("status") or {}).get("addresses") or []:
                if a.get("type") == "InternalIP":
                    addresses.append({"family": "IPv4", "ip": a.get("address")})
        body: dict[str, Any] = {
            "id": f"{c.id}/agentPools/{pool.name}/machines/{m['name']}", "name": m["name"],
            "type": "Microsoft.ContainerService/managedClusters/agentPools/machines",
            "properties": {"resourceId": m["resourceId"], "network": {"ipAddresses": addresses}},
        }
        if m.get("zones"):
            body["zones"] = list(m["zones"])
        return body

    def _r_pool(self, request: Request, *, sub: str, rg: str, cluster: str, pool: str) -> Response:
        c = self._cluster(sub, rg, cluster)
        if request.method == "GET":
            return Response.json(200, self._pool_body(c, self._pool(c, pool), self._api(request)))
        if request.method == "PUT":
            return self._put_pool(request, c, pool)
        return self._delete_pool(request, c, pool)

"""Reads of the simulated AKS resource provider: clusters, agent pools and their machines, maintenance
configurations, and the cluster user credential (a kubeconfig).
"""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

import yaml

from sim.arm.common import AKS_SERVER_APP_ID, KUBELOGIN_CLIENT_ID, POOL_TYPE, AksApiVersion, ArmError, invalid, project
from sim.core.http import Request, Response

# --------------------------------------------------------------------------- maintenance configurations
# Azure/azure-rest-api-specs specification/containerservice/resource-manager/Microsoft.ContainerService/
# aks/stable/2025-10-01/managedClusters.json (MaintenanceConfigurationProperties: timeInWeek, notAllowedTime,
# maintenanceWindow) and learn.microsoft.com/azure/aks/planned-maintenance: "From the 2023-05-01 API
# version onwards, use the properties in the following table for `default` configuration" and "If you
# create a `default` configuration with the following deprecated properties, it migrates automatically
# to the new properties".

MAINTENANCE_WINDOW_FOR_DEFAULT_SINCE = "2023-05-01"

_MIN_DURATION_HOURS = 4  # MaintenanceWindow.durationHours "minimum": 4


def maintenance_start_date(now: float, utc_offset: Any) -> str:
    """Today's date in the window's offset (``+HH:MM``; UTC when absent or unreadable)."""
    import datetime as _dt

    match = re.fullmatch(r"([+-])(\d{2}):(\d{2})", str(utc_offset or "+00:00"))
    seconds = (int(match.group(2)) * 3600 + int(match.group(3)) * 60) * (1 if match.group(1) == "+" else -1) \
        if match else 0
    return _dt.datetime.fromtimestamp(now + seconds, _dt.UTC).date().isoformat()


def migrated_default_window(time_in_week: Any) -> dict[str, Any] | None:
    """The ``maintenanceWindow`` a legacy ``timeInWeek`` default migrates to, or None when one weekly
    window cannot express it.

    AKS does not document the mapping. What the simulator assumes: one day whose hour slots are
    contiguous becomes ``weekly`` on that day, every week (the only schedule a ``default`` may have,
    azure-cli PR #33431: "only Weekly schedule with intervalWeeks=1 is valid for the default config"),
    starting at the first slot, lasting the slots but at least the spec's minimum of 4 hours, in UTC
    (the slots are UTC hours). Several days, or gaps between slots, have no single-window form and are
    presented in the legacy shape only.
    """
    if not isinstance(time_in_week, list) or not time_in_week:
        return None
    days = {str(e.get("day")) for e in time_in_week if isinstance(e, dict)}
    try:
        hours = sorted({int(h) for e in time_in_week if isinstance(e, dict) for h in (e.get("hourSlots") or [])})
    except (TypeError, ValueError):
        return None  # not something AKS could have migrated: shown as written
    if len(days) != 1 or not hours or hours != list(range(hours[0], hours[0] + len(hours))):
        return None
    return {"schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": days.pop()}},
            "durationHours": max(_MIN_DURATION_HOURS, len(hours)), "utcOffset": "+00:00",
            "startTime": f"{hours[0]:02d}:00"}


def present_maintenance_configuration(name: str, stored: dict[str, Any], *, api_version: str) -> dict[str, Any]:
    """The ``properties`` AKS answers for a stored maintenance configuration on ``api_version``.

    A ``default`` written in the deprecated ``timeInWeek`` shape is shown migrated: with the
    ``maintenanceWindow`` it became, next to the legacy fields it was written with (whether AKS still
    returns those after the migration is not documented; keeping both is the reading under which a
    client has to reconcile the two, and api-versions before 2023-05-01 return the legacy fields only).
    """
    props = copy.deepcopy(stored)
    if name.lower() != "default" or props.get("maintenanceWindow") or not props.get("timeInWeek"):
        return props
    if api_version[:10] < MAINTENANCE_WINDOW_FOR_DEFAULT_SINCE:
        return props
    migrated = migrated_default_window(props["timeInWeek"])
    if migrated is not None:
        props["maintenanceWindow"] = migrated
    return props


class ClusterReads:
    """Part of :class:`sim.arm.api.ArmApi`: the GET routes of clusters, pools, machines and maintenance
    configurations, and ``listClusterUserCredential``.
    """

    # ---- rendering
    def _pool_body(self, cluster: Any, pool: Any, api: AksApiVersion) -> dict[str, Any]:
        props = project(pool.properties, api)
        props["provisioningState"] = pool.provisioning_state
        return {"id": f"{cluster.id}/agentPools/{pool.name}", "name": pool.name, "type": POOL_TYPE,
                "properties": props}

    def _cluster_body(self, c: Any, api: AksApiVersion) -> dict[str, Any]:
        busy = c.busy_until > self._now()
        profiles = []
        for pname in sorted(c.pools):
            pool = c.pools[pname]
            summary = project(pool.properties, api)
            summary["provisioningState"] = pool.provisioning_state
            profiles.append({"name": pool.name, **summary})
        location = c.location
        return {
            "id": c.id, "name": c.name, "type": "Microsoft.ContainerService/ManagedClusters", "location": location,
            "tags": dict(c.tags),
            "sku": {"name": "Base", "tier": "Standard"},
            "identity": {"type": "SystemAssigned"},
            "properties": {
                "provisioningState": "Updating" if busy else "Succeeded",
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
        raise ArmError(404, "NotFound", f"Maintenance configuration '{config}' not found in cluster '{c.name}'.")

    def _maintenance_body(self, c: Any, name: str, api: AksApiVersion) -> dict[str, Any]:
        stored = c.maintenance_configurations[name]
        window = stored.get("maintenanceWindow")
        if isinstance(window, dict) and not window.get("startDate"):
            # MaintenanceWindow.startDate defaults to "the current date at creation time"
            # (learn.microsoft.com/azure/aks/planned-maintenance, "Create a maintenance window"): the RP
            # stores it, so every later GET shows the same date. Set once, in the window's own offset.
            window["startDate"] = maintenance_start_date(self._now(), window.get("utcOffset"))
        return {"id": f"{c.id}/maintenanceConfigurations/{name}", "name": name,
                "type": "Microsoft.ContainerService/managedClusters/maintenanceConfigurations",
                "properties": present_maintenance_configuration(name, stored, api_version=api.name)}

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
        c = self._cluster(sub, rg, cluster)
        api = self._api(request)
        return Response.json(200, {"value": [self._pool_body(c, c.pools[n], api) for n in sorted(c.pools)]})

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
        raise ArmError(404, "NotFound", f"Machine '{machine}' not found in agent pool '{p.name}'.")

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

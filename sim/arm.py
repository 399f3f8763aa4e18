"""The AKS resource provider (Microsoft.ContainerService) and the VMSS VM actions of Microsoft.Compute.

The app's ARM adapters (shared/adapters/aks.py, shared/adapters/compute.py) run the real azure-mgmt SDKs against this
handler, so it answers what ARM answers: bearer tokens for ``https://management.azure.com/`` (401
``AuthenticationFailed`` without one, ``InvalidAuthenticationToken`` for a bad one, 403
``InvalidAuthenticationTokenAudience`` for another audience), a required and supported
``api-version``, ARM-shaped errors, 404 for unknown routes and resources, and long-running writes
through :mod:`sim.lro`. Agent-pool writes enforce the rules AKS enforces (naming, GPU profile rules
per VM size and api-version, immutable fields, autoscaler vs count, one operation at a time,
quota; capacity when the operation completes). The model (:mod:`sim.model`) owns nodes and pods;
this module owns the pools' ARM ``properties`` and calls ``Cluster`` methods to make nodes appear
and go.

Api-version decisions (from /work/shared/reference/aks-api.md §1): ARM resource providers
deserialise a request with the model of its api-version, so fields that version does not have are
*ignored*, not refused, and are not returned. Hence ``gpuProfile.nvidia`` is ignored on 2025-10-01
and 2026-07-01; ``nvidia.migStrategy``, ``driverMode``, ``migProfiles`` and ``gpuProfile.driverType``
are ignored on the stable 2026-08-01 (it has ``nvidia.managementMode`` only). Ignored fields keep
their stored value on update (a PUT with an older api-version does not erase them). Clients find
out by reading the pool back, as they must in Azure.

A pool PUT is create-or-replace: a field the request's api-version knows but the body leaves out is
reset to its default (or removed), exactly as on create, and an immutable field reset that way is
refused like any other change. Only fields the api-version cannot express are kept
(Azure/azure-resource-manager-rpc v1.0/version-change.md: a GET-PUT through a model that lacks a
field overwrites it, which is why a new field needs a new api-version). Managed MIG on
2026-08-02-preview is ``nvidia.migProfiles`` (examples/AgentPoolsCreate_SingleMIG.json), mutually
exclusive with ``gpuInstanceProfile``. The managed GPU experience needs the subscription's preview
feature ``Microsoft.ContainerService/ManagedGPUExperiencePreview`` (Microsoft.Features routes below).
"""

from __future__ import annotations

import base64
import copy
import json
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from sim import armrbac, gpu_catalog
from sim.http import Request, Response
from sim.lro import AKS_PROVIDER, COMPUTE_PROVIDER, Operation, OperationFailure, Operations
from sim.tokens import AKS_AUDIENCES, ARM_AUDIENCES

AKS_SERVER_APP_ID = AKS_AUDIENCES[0]
KUBELOGIN_CLIENT_ID = "80faf920-1908-4b52-b5ef-a8e7bedfc67a"
POOL_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
WINDOWS_POOL_NAME_MAX = 6
MAX_COUNT = 1000


@dataclass(frozen=True)
class AksApiVersion:
    """What one Microsoft.ContainerService api-version has in its agent-pool GPU schema."""

    name: str
    nvidia: bool = False  # gpuProfile.nvidia.managementMode
    mig_strategy: bool = False  # nvidia.migStrategy
    driver_mode: bool = False  # nvidia.driverMode
    mig_profiles: bool = False  # nvidia.migProfiles
    driver_type: bool = False  # gpuProfile.driverType

    @property
    def preview(self) -> bool:
        return self.name.endswith("-preview")


AKS_API_VERSIONS: dict[str, AksApiVersion] = {v.name: v for v in (
    AksApiVersion("2025-10-01"),
    AksApiVersion("2026-01-02-preview", nvidia=True, mig_strategy=True, driver_type=True),
    AksApiVersion("2026-07-01"),
    AksApiVersion("2026-08-01", nvidia=True),
    AksApiVersion("2026-08-02-preview", nvidia=True, mig_strategy=True, driver_mode=True, mig_profiles=True,
                  driver_type=True),
)}
# azure-mgmt-compute 39.0.0 sends 2026-04-01 for VMSS VM operations; older ones for other callers.
COMPUTE_API_VERSIONS = ("2024-07-01", "2024-11-01", "2025-04-01", "2026-04-01")
# Microsoft.Features (azure-rest-api-specs specification/resources/resource-manager/Microsoft.Features/stable/);
# `az feature show/register` sends 2021-07-01.
FEATURES_API_VERSIONS = ("2015-12-01", "2021-07-01", "2025-03-01")
MANAGED_GPU_FEATURE = "Microsoft.ContainerService/ManagedGPUExperiencePreview"
# Registered on every subscription unless its scenario says otherwise (subscriptions[].features).
DEFAULT_FEATURES: dict[str, str] = {MANAGED_GPU_FEATURE: "Registered"}

POOL_TYPE = "Microsoft.ContainerService/managedClusters/agentPools"
NODE_IMAGE = "AKSUbuntu-2204gen2containerd-202611.05.0"


class ArmError(Exception):
    def __init__(self, status: int, code: str, message: str, *, target: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.target = target
        self.headers = headers or {}

    def response(self) -> Response:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            err["target"] = self.target
        return Response.json(self.status, {"error": err}, self.headers)


def _bare_etag(tag: str) -> str | None:
    """An entity tag without its quotes (``"x"`` / ``x`` -> ``x``), for If-Match's strong comparison: a weak
    tag (``W/"x"``) is None, because under strong comparison it never matches, not even its own opaque value
    (RFC 9110 §13.1.1 If-Match: "An origin server MUST use the strong comparison function when comparing
    entity tags for If-Match"; §8.8.3.2: two tags are strongly equal only if neither is weak)."""
    tag = tag.strip()
    if tag.startswith("W/"):
        return None
    return tag.strip('"')


def _invalid(message: str, target: str) -> ArmError:
    return ArmError(400, "InvalidParameter", message, target=target)


# --------------------------------------------------------------------------- routes

_SUB = r"/subscriptions/(?P<sub>[^/]+)"
_RG = _SUB + r"/resourcegroups/(?P<rg>[^/]+)"
_MC = _RG + r"/providers/microsoft\.containerservice/managedclusters/(?P<cluster>[^/]+)"
_POOL = _MC + r"/agentpools/(?P<pool>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    (name, re.compile(pattern + "/?$", re.IGNORECASE), methods) for name, pattern, methods in (
        ("clusters_in_sub", _SUB + r"/providers/microsoft\.containerservice/managedclusters", ("GET",)),
        ("clusters_in_rg", _RG + r"/providers/microsoft\.containerservice/managedclusters", ("GET",)),
        ("cluster", _MC, ("GET",)),
        ("pools", _MC + r"/agentpools", ("GET",)),
        ("pool", _POOL, ("GET", "PUT", "DELETE")),
        ("delete_machines", _POOL + r"/deletemachines", ("POST",)),
        ("machines", _POOL + r"/machines", ("GET",)),
        ("machine", _POOL + r"/machines/(?P<machine>[^/]+)", ("GET",)),
        ("user_credential", _MC + r"/listclusterusercredential", ("POST",)),
        ("maintenance_list", _MC + r"/maintenanceconfigurations", ("GET",)),
        ("maintenance", _MC + r"/maintenanceconfigurations/(?P<config>[^/]+)", ("GET",)),
        ("aks_operation", _SUB + r"/providers/microsoft\.containerservice/locations/(?P<loc>[^/]+)"
                                 r"/operations/(?P<op>[^/]+)", ("GET",)),
        ("aks_operation_result", _SUB + r"/providers/microsoft\.containerservice/locations/(?P<loc>[^/]+)"
                                        r"/operationresults/(?P<op>[^/]+)", ("GET",)),
        ("vm_action", _RG + r"/providers/microsoft\.compute/virtualmachinescalesets/(?P<vmss>[^/]+)"
                            r"/virtualmachines/(?P<instance>[^/]+)/(?P<action>restart|reimage)", ("POST",)),
        ("compute_operation", _SUB + r"/providers/microsoft\.compute/locations/(?P<loc>[^/]+)"
                                     r"/operations/(?P<op>[^/]+)", ("GET",)),
        ("features", _SUB + r"/providers/microsoft\.features/providers/(?P<ns>[^/]+)/features", ("GET",)),
        ("feature", _SUB + r"/providers/microsoft\.features/providers/(?P<ns>[^/]+)/features/(?P<feature>[^/]+)",
         ("GET",)),
        ("feature_action", _SUB + r"/providers/microsoft\.features/providers/(?P<ns>[^/]+)/features/(?P<feature>[^/]+)"
                                  r"/(?P<action>register|unregister)", ("POST",)),
    )
]


def _route(path: str) -> tuple[str, dict[str, str], tuple[str, ...]] | None:
    for name, pattern, methods in _ROUTES:
        m = pattern.match(path)
        if m:
            return name, {k: v for k, v in m.groupdict().items() if v is not None}, methods
    return None


# --------------------------------------------------------------------------- helpers


def _get(d: dict[str, Any] | None, *keys: str) -> Any:
    cur: Any = d
    for k in keys:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(k)
    return cur


def _put(d: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    cur = d
    for k in path[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = cur[k] = {}
        cur = nxt
    cur[path[-1]] = value


# Fields AKS refuses to change after creation (vmSize is checked separately for its own message).
_IMMUTABLE: tuple[tuple[str, ...], ...] = (
    ("gpuProfile", "driver"),
    ("gpuProfile", "nvidia", "managementMode"),
    ("gpuProfile", "nvidia", "migStrategy"),
    ("gpuProfile", "nvidia", "migProfiles"),
    ("gpuProfile", "nvidia", "driverMode"),
    ("gpuInstanceProfile",),
    ("osType",),
    ("maxPods",),
    ("osDiskType",),
    # create-node-pools.md / aks-api.md §4: placement, spot and network settings are fixed at creation.
    ("availabilityZones",),
    ("scaleSetPriority",),
    ("scaleSetEvictionPolicy",),
    ("vnetSubnetID",),
    ("podSubnetID",),
    ("hostGroupID",),
    ("kubeletDiskType",),
)
# What an omitted immutable field means, for comparing it with the stored value (spec defaults:
# GPUDriver Install, migStrategy None, driverMode DevicePlugin, scaleSetPriority Regular; an nvidia
# block without managementMode is the unmanaged experience).
_IMMUTABLE_DEFAULTS: dict[tuple[str, ...], Any] = {
    ("gpuProfile", "driver"): "Install",
    ("gpuProfile", "nvidia", "managementMode"): "Unmanaged",
    ("gpuProfile", "nvidia", "migStrategy"): "None",
    ("gpuProfile", "nvidia", "driverMode"): "DevicePlugin",
    ("scaleSetPriority",): "Regular",
    ("availabilityZones",): [],
}


def project(properties: dict[str, Any], api: AksApiVersion) -> dict[str, Any]:
    """``properties`` as ``api`` sees them: GPU fields the version lacks are dropped."""
    props = copy.deepcopy(properties)
    gp = props.get("gpuProfile")
    if isinstance(gp, dict):
        if not api.driver_type:
            gp.pop("driverType", None)
        nvidia = gp.get("nvidia")
        if not api.nvidia:
            gp.pop("nvidia", None)
        elif isinstance(nvidia, dict):
            for flag, key in ((api.mig_strategy, "migStrategy"), (api.driver_mode, "driverMode"),
                              (api.mig_profiles, "migProfiles")):
                if not flag:
                    nvidia.pop(key, None)
    return props


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


# JSON types of the agent-pool properties the rules read; ARM refuses a body it cannot deserialise.
_TYPES: dict[str, type | tuple[type, ...]] = {
    "count": int, "vmSize": str, "osType": str, "osSKU": str, "mode": str, "maxPods": int, "minCount": int,
    "maxCount": int, "enableAutoScaling": bool, "gpuInstanceProfile": str, "nodeLabels": dict, "nodeTaints": list,
    "tags": dict, "availabilityZones": list, "gpuProfile": dict, "scaleSetPriority": str, "orchestratorVersion": str,
}


def _check_types(props: dict[str, Any], api: AksApiVersion | None = None) -> None:
    for key, expected in _TYPES.items():
        value = props.get(key)
        if value is None:
            continue
        wrong_bool = isinstance(value, bool) and expected is int
        if wrong_bool or not isinstance(value, expected):
            raise ArmError(400, "InvalidRequestContent",
                           f"The request content was invalid and could not be deserialized: could not convert "
                           f"{json.dumps(value)[:60]} of 'properties.{key}' to {getattr(expected, '__name__', expected)}.",
                           target=f"properties.{key}")
    gp = props.get("gpuProfile") or {}
    if gp.get("nvidia") is not None and not isinstance(gp["nvidia"], dict):
        raise ArmError(400, "InvalidRequestContent", "'properties.gpuProfile.nvidia' must be an object.",
                       target="properties.gpuProfile.nvidia")
    profiles = (gp.get("nvidia") or {}).get("migProfiles") if api is None or api.mig_profiles else None
    if profiles is not None and not (isinstance(profiles, list) and all(isinstance(p, str) for p in profiles)):
        # The spec's migProfiles is an array of GPUInstanceProfile strings.
        raise ArmError(400, "InvalidRequestContent",
                       "The request content was invalid and could not be deserialized: "
                       "'properties.gpuProfile.nvidia.migProfiles' must be an array of strings.",
                       target="properties.gpuProfile.nvidia.migProfiles")


def _size(props: dict[str, Any]) -> gpu_catalog.SizeInfo:
    size = gpu_catalog.lookup(str(props.get("vmSize") or ""))
    if size is None:
        raise _invalid(f"The VM size '{props.get('vmSize')}' is not supported for agent pools in this region.",
                       "properties.vmSize")
    return size


def _key_lookup(table: dict[Any, int], key: tuple[str, ...]) -> int | None:
    """A quota/capacity entry whatever the case of its key parts."""
    if key in table:
        return table[key]
    low = tuple(k.lower() for k in key)
    for k, v in table.items():
        if tuple(str(x).lower() for x in k) == low:
            return v
    return None


def _key_adjust(table: dict[Any, int], key: tuple[str, ...], delta: int) -> None:
    low = tuple(k.lower() for k in key)
    for k in list(table):
        if tuple(str(x).lower() for x in k) == low:
            table[k] = max(0, int(table[k]) + delta)
            return


# --------------------------------------------------------------------------- handler


class ArmApi:
    """``handle(request) -> Response`` for everything under ``/subscriptions/``."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.ops = Operations.of(fleet)
        self._rng = random.Random(f"arm:{getattr(fleet, 'seed', 0)}")

    # ---- plumbing
    def _now(self) -> float:
        now = getattr(self.fleet, "now", None)
        return float(now() if callable(now) else self.fleet.clock.now())

    def _timing(self, name: str, default: float) -> float:
        return float((getattr(self.fleet, "timings", None) or {}).get(name, default))

    def _base_url(self, request: Request) -> str:
        base = getattr(self.fleet, "public_base_url", None) or getattr(self.fleet, "base_url", None)
        if base:
            return str(base).rstrip("/")
        host = request.headers.get("host") or "127.0.0.1"
        return f"https://{host}"

    def _ca_pem(self) -> bytes | str | None:
        """The simulator CA: ``fleet.ca_pem``, else the file of ``fleet.ca_path`` / ``fleet.certs.ca``."""
        ca = getattr(self.fleet, "ca_pem", None)
        if ca:
            return ca  # type: ignore[no-any-return]
        for path in (getattr(self.fleet, "ca_path", None), getattr(getattr(self.fleet, "certs", None), "ca", None)):
            if path:
                try:
                    with open(path, "rb") as fh:
                        return fh.read()
                except OSError:
                    continue
        return None

    def _etag(self) -> str:
        return f"\"{uuid.UUID(int=self._rng.getrandbits(128), version=4)}\""

    def handle(self, request: Request) -> Response:
        try:
            pump = getattr(self.fleet, "pump", None)
            if callable(pump):
                pump()
            with self.fleet.lock:
                response = self._handle(request)
        except ArmError as exc:
            response = exc.response()
        except Exception as exc:  # the simulator answers 500 rather than dying on its own bug
            response = Response.arm_error(500, "InternalServerError",
                                          f"The simulator failed: {type(exc).__name__}: {exc}")
        # ARM's tracing headers: the SDKs put x-ms-request-id in their error messages.
        request_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        response.headers.setdefault("x-ms-request-id", request_id)
        response.headers.setdefault("x-ms-correlation-request-id", request_id)
        client_id = request.headers.get("x-ms-client-request-id")
        if client_id:
            response.headers.setdefault("x-ms-client-request-id", str(client_id))
        return response

    def _handle(self, request: Request) -> Response:
        verdict = self._authenticate(request)
        found = _route(request.path)
        if found is None:
            raise ArmError(404, "NotFound", f"No HTTP resource was found that matches the request URI "
                                            f"'{request.path}'.")
        name, params, methods = found
        if request.method not in methods:
            raise ArmError(405, "MethodNotAllowed",
                           f"The requested resource does not support http method '{request.method}'.")
        compute = name in ("vm_action", "compute_operation")
        self._check_api_version(request, compute=compute, features=name.startswith("feature"))
        self._authorize(request, verdict, name, params)
        cluster_name = params.get("cluster")
        if name == "vm_action":
            c = self._cluster_by_node_rg(params["sub"], params["rg"])
            cluster_name = c.name if c is not None else None
        faults = getattr(self.fleet, "faults", None)
        hit = faults.match(target="arm", method=request.method, path=request.path, cluster=cluster_name) \
            if faults is not None else None
        if hit:
            return hit
        response = getattr(self, f"_r_{name}")(request, **params)
        if name in armrbac.FILTERED_ROUTES:
            response = self._readable_only(response, verdict)
        if hit is not None:  # delay-only fault: the normal answer, late
            response.delay_s += hit.delay_s
        return response

    # ---- authorization (sim/armrbac.py): the app's identity holds what infra/ assigns it
    def _is_app(self, verdict: Any) -> bool:
        from sim.identity import app_principal_id

        return bool(verdict.principal == app_principal_id(self.fleet))

    def _authorize(self, request: Request, verdict: Any, route: str, params: dict[str, str]) -> None:
        """403 AuthorizationFailed unless the caller holds the route's action over its scope."""
        if verdict.admin or route in armrbac.UNCHECKED_ROUTES or route in armrbac.FILTERED_ROUTES:
            return
        action = armrbac.route_action(route, request.method, params)
        if action is None:
            return
        scope = armrbac.route_scope(route, request.path)
        if self._is_app(verdict) and armrbac.app_may(self.fleet, action, scope):
            return
        status, code, message = armrbac.authorization_failed(client_id=verdict.client_id, object_id=verdict.principal,
                                                             action=action, scope=scope)
        raise ArmError(status, code, message)

    def _readable_only(self, response: Response, verdict: Any) -> Response:
        """A cluster list with only the clusters the caller may read (see armrbac.FILTERED_ROUTES)."""
        if verdict.admin or response.status != 200:
            return response
        doc = json.loads(response.body)
        action = armrbac.ROUTE_ACTIONS[("cluster", "GET")]
        keep = [c for c in doc.get("value") or []
                if self._is_app(verdict) and armrbac.app_may(self.fleet, action, str(c.get("id", "")))]
        return Response.json(200, {**doc, "value": keep}, {k: v for k, v in response.headers.items()
                                                            if k.lower() != "content-type"})

    def _authenticate(self, request: Request) -> Any:
        token = request.bearer
        challenge = {"WWW-Authenticate": 'Bearer authorization_uri="https://login.microsoftonline.com/common", '
                                         'error="invalid_token", error_description="The authentication failed."'}
        if not token:
            raise ArmError(401, "AuthenticationFailed",
                           "Authentication failed. The 'Authorization' header is missing.", headers=challenge)
        verdict = self.fleet.tokens.verify(token, ARM_AUDIENCES)
        if verdict.wrong_audience:
            # ARM: 401 InvalidAuthenticationTokenAudience (an authentication failure, never a 403)
            raise ArmError(401, "InvalidAuthenticationTokenAudience",
                           f"The access token has been obtained for wrong audience or resource '{verdict.audience}'. "
                           "It should exactly match with one of the allowed audiences "
                           "'https://management.core.windows.net/','https://management.core.windows.net',"
                           "'https://management.azure.com/','https://management.azure.com'.", headers=challenge)
        if verdict.status != 200:
            raise ArmError(401, "InvalidAuthenticationToken", f"The access token is invalid: {verdict.reason}.",
                           headers=challenge)
        return verdict

    def _check_api_version(self, request: Request, *, compute: bool, features: bool = False) -> None:
        version = request.arg("api-version")
        if not version:
            raise ArmError(400, "MissingApiVersionParameter",
                           "The api-version query parameter (?api-version=) is required for all requests.")
        supported = FEATURES_API_VERSIONS if features else COMPUTE_API_VERSIONS if compute else tuple(AKS_API_VERSIONS)
        if version not in supported:
            raise ArmError(400, "InvalidApiVersionParameter",
                           f"The api-version '{version}' is invalid. The supported versions are "
                           f"'{','.join(supported)}'.")

    @staticmethod
    def _api(request: Request) -> AksApiVersion:
        return AKS_API_VERSIONS[str(request.arg("api-version"))]

    def _cluster(self, sub: str, rg: str, name: str) -> Any:
        c = self.fleet.cluster(sub, rg, name)
        if c is None:
            raise ArmError(404, "ResourceNotFound",
                           f"The Resource 'Microsoft.ContainerService/managedClusters/{name}' under resource group "
                           f"'{rg}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix")
        return c

    def _pool(self, cluster: Any, name: str) -> Any:
        for key, pool in cluster.pools.items():
            if key.lower() == name.lower():
                return pool
        raise ArmError(404, "NotFound", f"Agent pool '{name}' not found in managed cluster '{cluster.name}'.")

    def _cluster_by_node_rg(self, sub: str, node_rg: str) -> Any:
        for key in sorted(self.fleet.clusters):
            c = self.fleet.clusters[key]
            if c.subscription.lower() == sub.lower() and c.node_resource_group.lower() == node_rg.lower():
                return c
        return None

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
            raise _invalid(f"The value '{request.arg('format')}' of parameter format is invalid; use azure or exec.",
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

    # ---- agent pools: writes
    def _busy(self, cluster: Any, pool: Any | None) -> None:
        now = self._now()
        if cluster.busy_until > now:
            raise ArmError(409, "OperationNotAllowed",
                           "Operation is not allowed: Another operation (Updating) is in progress, please wait for it "
                           "to finish before starting a new operation. See https://aka.ms/aks-pending-operation for "
                           "more details")
        if pool is not None and (pool.operation_until > now or pool.provisioning_state in
                                 ("Creating", "Updating", "Scaling", "Deleting", "Upgrading")):
            raise ArmError(409, "OperationNotAllowed",
                           f"Operation is not allowed: Another agentpool operation ({pool.name} - "
                           f"{pool.provisioning_state}) is in progress, please wait for it to finish before starting a "
                           "new operation. See https://aka.ms/aks-pending-operation for more details")

    def _check_preconditions(self, request: Request, pool: Any | None) -> None:
        """If-Match / If-None-Match on agent pool PUT and DELETE, as AKS answers them.

        AKS compares the header with the pool's ``properties.eTag`` and fails early with 412
        PreconditionFailed when they differ; with If-Match on a pool that does not exist it answers
        412 "Resource not found but ETag header is provided" (learn.microsoft.com/azure/aks/use-etags;
        the AKS answer quoted in Azure/azure-cli#30309; spec parameter ``ifMatch`` of
        AgentPools_CreateOrUpdate / AgentPools_Delete in azure-rest-api-specs
        specification/containerservice/.../aks/stable/*/managedClusters.json). ETags compare as
        opaque strings without their quotes (RFC 9110 §13.1.1 strong comparison, so a weak ``W/"..."`` tag
        never matches; the SDK's ``quote_etag`` adds quotes to a bare value); a list of tags matches if any does.
        """
        if_match = (request.headers.get("if-match") or "").strip()
        if_none = (request.headers.get("if-none-match") or "").strip()
        current = pool.properties.get("eTag") if pool is not None else None
        if if_none == "*" and pool is not None:
            raise ArmError(412, "PreconditionFailed", f"Agent pool '{pool.name}' already exists (If-None-Match: *).")
        if not if_match:
            return
        if pool is None:
            raise ArmError(412, "PreconditionFailed", "Resource not found but ETag header is provided. If this is a "
                                                      "request to create, please do not provide ETag.")
        if if_match == "*":
            return
        wanted = {_bare_etag(t) for t in if_match.split(",") if t.strip()} - {None}
        have = _bare_etag(str(current or ""))
        if have is None or have not in wanted:
            raise ArmError(412, "PreconditionFailed",
                           f"The eTag {if_match} does not match the current eTag {current} of the agent pool "
                           f"'{pool.name}'.")

    def _body_properties(self, request: Request) -> dict[str, Any]:
        try:
            body = request.json()
        except ValueError as exc:
            raise ArmError(400, "InvalidRequestContent",
                           f"The request content was invalid and could not be deserialized: {exc}.") from exc
        if not isinstance(body, dict):
            raise ArmError(400, "InvalidRequestContent", "The request content must be a JSON object.")
        props = body.get("properties", {})
        if not isinstance(props, dict):
            raise ArmError(400, "InvalidRequestContent", "'properties' must be a JSON object.")
        return props

    def _put_pool(self, request: Request, c: Any, name: str) -> Response:
        api = self._api(request)
        raw = self._body_properties(request)
        check_linked_authorization(request, c, raw)  # ARM's linked access check, before the RP sees it
        existing = next((p for k, p in c.pools.items() if k.lower() == name.lower()), None)
        self._check_preconditions(request, existing)
        self._busy(c, existing)
        _check_types(raw, api)  # an api-version deserialises only the fields it has
        props = project(raw, api)
        for read_only in ("provisioningState", "currentOrchestratorVersion", "eTag", "nodeImageVersion", "powerState"):
            props.pop(read_only, None)
        if existing is None:
            return self._create_pool(request, c, name, props, api)
        return self._update_pool(request, c, existing, props, api)

    def _validate_common(self, c: Any, name: str, props: dict[str, Any], api: AksApiVersion) -> gpu_catalog.SizeInfo:
        os_type = str(props.get("osType") or "Linux")
        if os_type not in ("Linux", "Windows"):
            raise _invalid(f"The value '{os_type}' of osType is invalid; use Linux or Windows.", "properties.osType")
        if os_type == "Windows" and len(name) > WINDOWS_POOL_NAME_MAX:
            raise _invalid("Windows agent pool name can not be longer than 6 characters. "
                           "Please see https://aka.ms/aks-naming-rules for more details.", "agentPoolProfile.name")
        size = _size(props)
        count = props.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0 or count > MAX_COUNT:
            raise _invalid(f"The value of parameter properties.count is invalid: {count!r} (0..{MAX_COUNT}).",
                           "properties.count")
        mode = str(props.get("mode") or "User")
        if mode not in ("System", "User", "Gateway"):
            raise _invalid(f"The value '{mode}' of mode is invalid.", "properties.mode")
        if mode == "System" and count < 1:
            raise _invalid("A System agent pool needs at least 1 node.", "properties.count")
        if props.get("enableAutoScaling"):
            lo, hi = props.get("minCount"), props.get("maxCount")
            if not isinstance(lo, int) or not isinstance(hi, int):
                raise _invalid("minCount and maxCount are required when enableAutoScaling is true.",
                               "properties.minCount")
            if not 0 <= lo <= hi or not lo <= count <= hi:
                raise _invalid(f"count ({count}) must be between minCount ({lo}) and maxCount ({hi}), "
                               "and minCount must not exceed maxCount.", "properties.count")
        self._validate_gpu(props, size, api, os_type)
        return size

    def _validate_gpu(self, props: dict[str, Any], size: gpu_catalog.SizeInfo, api: AksApiVersion, os_type: str) -> None:
        gp = props.get("gpuProfile")
        if gp is not None and not isinstance(gp, dict):
            raise _invalid("gpuProfile must be an object.", "properties.gpuProfile")
        gp = gp or {}
        driver = gp.get("driver")
        if driver is not None and driver not in ("Install", "None"):
            raise _invalid(f"The value '{driver}' of gpuProfile.driver is invalid; use Install or None.",
                           "properties.gpuProfile.driver")
        gip = props.get("gpuInstanceProfile")
        if gip is not None:
            if gip not in gpu_catalog.MIG_NAMES:
                raise _invalid(f"The value '{gip}' of gpuInstanceProfile is invalid.", "properties.gpuInstanceProfile")
            if not size.mig_capable:
                raise _invalid(f"GPU instance profile (MIG) is only supported on NVIDIA A100, H100 and H200 VM sizes; "
                               f"'{size.name}' is not one.", "properties.gpuInstanceProfile")
        nvidia = gp.get("nvidia")
        if nvidia is None:
            return
        if not isinstance(nvidia, dict):
            raise _invalid("gpuProfile.nvidia must be an object.", "properties.gpuProfile.nvidia")
        if not size.nvidia:
            raise _invalid(f"gpuProfile.nvidia is only supported on NVIDIA GPU VM sizes; '{size.name}' has "
                           f"{'a non-NVIDIA GPU' if size.gpus else 'no GPU'}.", "properties.gpuProfile.nvidia")
        mode = nvidia.get("managementMode")
        if mode is not None and mode not in ("Managed", "Unmanaged"):
            raise _invalid(f"The value '{mode}' of gpuProfile.nvidia.managementMode is invalid; use Managed or "
                           "Unmanaged.", "properties.gpuProfile.nvidia.managementMode")
        if mode == "Managed":
            if os_type == "Windows":
                raise _invalid("The fully managed GPU experience (managementMode Managed) is not supported on Windows "
                               "agent pools.", "properties.gpuProfile.nvidia.managementMode")
            if props.get("enableAutoScaling"):
                raise _invalid("Cluster autoscaler isn't supported on managed GPU node pools.",
                               "properties.enableAutoScaling")
        driver_mode = nvidia.get("driverMode")
        if driver_mode is not None and driver_mode not in ("DevicePlugin", "DRA"):
            raise _invalid(f"The value '{driver_mode}' of gpuProfile.nvidia.driverMode is invalid.",
                           "properties.gpuProfile.nvidia.driverMode")
        strategy = nvidia.get("migStrategy")
        profiles = nvidia.get("migProfiles")
        if strategy is None or strategy == "None":
            if profiles is not None:
                raise _invalid("migProfiles needs migStrategy Single or Mixed.",
                               "properties.gpuProfile.nvidia.migProfiles")
            if strategy is None:
                return
        if strategy not in ("None", "Single", "Mixed"):
            raise _invalid(f"The value '{strategy}' of gpuProfile.nvidia.migStrategy is invalid; use None, Single or "
                           "Mixed.", "properties.gpuProfile.nvidia.migStrategy")
        if strategy == "None":
            return
        if not size.mig_capable:
            raise _invalid(f"migStrategy {strategy} is only supported on NVIDIA A100, H100 and H200 VM sizes; "
                           f"'{size.name}' is not one.", "properties.gpuProfile.nvidia.migStrategy")
        if mode != "Managed":
            raise _invalid("migStrategy needs gpuProfile.nvidia.managementMode Managed.",
                           "properties.gpuProfile.nvidia.migStrategy")
        if not api.mig_profiles and profiles is None:
            # 2026-01-02-preview: managed MIG takes its profile from the top-level gpuInstanceProfile.
            # (migProfiles stored by a newer api-version and kept by this PUT are checked below.)
            if gip is None:
                raise _invalid(f"migStrategy {strategy} needs a MIG profile (gpuInstanceProfile).",
                               "properties.gpuInstanceProfile")
            return
        # 2026-08-02-preview (managedClusters.json NvidiaGPUProfile.migProfiles, examples/
        # AgentPoolsCreate_SingleMIG.json): "The ordered list of MIG partition profiles ... When migStrategy
        # is Single, exactly one profile must be specified. When migStrategy is Mixed, one or more profiles
        # may be specified and the combination is validated against the supported MIG geometry ... This
        # field is mutually exclusive with the top-level gpuInstanceProfile property." minItems: 1.
        if gip is not None:
            raise _invalid(f"gpuInstanceProfile is mutually exclusive with gpuProfile.nvidia.migProfiles; on "
                           f"api-version {api.name} managed MIG (migStrategy {strategy}) takes its profiles in "
                           "gpuProfile.nvidia.migProfiles.", "properties.gpuInstanceProfile")
        if profiles is None:
            raise _invalid(f"migStrategy {strategy} needs gpuProfile.nvidia.migProfiles (at least one MIG profile).",
                           "properties.gpuProfile.nvidia.migProfiles")
        if not profiles or any(p not in gpu_catalog.MIG_NAMES for p in profiles):
            raise _invalid("migProfiles must be a non-empty list of MIG1g|MIG2g|MIG3g|MIG4g|MIG7g.",
                           "properties.gpuProfile.nvidia.migProfiles")
        if strategy == "Single" and len(profiles) != 1:
            raise _invalid(f"migStrategy Single requires exactly one MIG profile; got {len(profiles)}.",
                           "properties.gpuProfile.nvidia.migProfiles")
        slices = sum(int(p[3]) for p in profiles)  # MIG<n>g uses n of a GPU's 7 compute slices
        if slices > 7:
            raise _invalid(f"The MIG profiles {profiles} need {slices} compute slices; a GPU of {size.name} has 7.",
                           "properties.gpuProfile.nvidia.migProfiles")

    def _check_features(self, c: Any, props: dict[str, Any]) -> None:
        """A new managed GPU pool needs ManagedGPUExperiencePreview registered on its subscription.

        AKS answers 400 PreviewFeatureNotRegistered "Preview feature Microsoft.ContainerService/<name>
        not registered." (the shape reported in hashicorp/terraform-provider-azurerm#13684 and
        Azure/ResourceModules#820 for CustomNodeConfigPreview; aks-managed-gpu-nodes.md lists the flag).
        Checked on create only: whether AKS re-checks it on updates of existing pools is not documented.
        """
        nvidia = (props.get("gpuProfile") or {}).get("nvidia") or {}
        if nvidia.get("managementMode") != "Managed":
            return
        if self._feature_state(c.subscription, MANAGED_GPU_FEATURE) != "Registered":
            raise ArmError(400, "PreviewFeatureNotRegistered", f"Preview feature {MANAGED_GPU_FEATURE} not registered.")

    def _check_quota(self, c: Any, size: gpu_catalog.SizeInfo, *, extra_vcpus: int, priority: str = "Regular") -> None:
        """Refuse growth beyond the vCPU quota the new VMs count against.

        Regular VMs count against their family's quota; spot VMs (``priority`` ``Spot``) against the
        region's one low-priority quota, usage name ``lowPriorityCores`` ("Total Regional
        Low-priority vCPUs"; https://learn.microsoft.com/azure/virtual-machines/spot-vms#quota),
        whatever their family. A scenario names that quota with family ``lowPriorityCores``.
        """
        if extra_vcpus <= 0:
            return
        quotas = getattr(self.fleet, "quotas", {}) or {}
        spot = str(priority or "").lower() == "spot"
        family = "lowPriorityCores" if spot else size.family
        limit = _key_lookup(quotas, (c.subscription, c.location, family))
        if limit is None:
            return
        in_use = int(self.fleet.vcpus_in_use(c.subscription, c.location, family))
        if in_use + extra_vcpus > int(limit):
            # AKS checks quota before it deploys anything and answers with its own code (seen as
            # ``InsufficientVCPUQuota`` / ``ErrCode_InsufficientVCPUQuota`` in public Terraform and CLI
            # output); Compute's own ``QuotaExceeded`` comes only from the deployment, wrapped in the
            # failed operation (an ``lro`` fault with code QuotaExceeded). docs/fidelity.md.
            raise ArmError(400, "InsufficientVCPUQuota",
                           f"Insufficient vcpu quota requested {extra_vcpus}, remaining {max(0, int(limit) - in_use)} "
                           f"for family {family} for region {c.location}.", target="properties.count")

    def _defaults(self, c: Any, name: str, props: dict[str, Any], size: gpu_catalog.SizeInfo) -> dict[str, Any]:
        p = copy.deepcopy(props)
        p.setdefault("count", 1)
        p.setdefault("vmSize", size.name)
        p.setdefault("osType", "Linux")
        p.setdefault("osSKU", "Ubuntu" if p["osType"] == "Linux" else "Windows2022")
        p.setdefault("mode", "User")
        p.setdefault("type", "VirtualMachineScaleSets")
        p.setdefault("maxPods", size.max_pods)
        p.setdefault("osDiskSizeGB", 128)
        p.setdefault("osDiskType", "Managed")
        p.setdefault("kubeletDiskType", "OS")
        p.setdefault("enableAutoScaling", False)
        p.setdefault("scaleSetPriority", "Regular")
        p.setdefault("orchestratorVersion", c.kubernetes_version)
        p["currentOrchestratorVersion"] = p["orchestratorVersion"]
        p.setdefault("enableNodePublicIP", False)
        p.setdefault("upgradeSettings", {"maxSurge": "10%"})
        if size.nvidia and size.gpus:
            gp = p.setdefault("gpuProfile", {})
            if isinstance(gp, dict):
                gp.setdefault("driver", "Install")
        p["nodeImageVersion"] = NODE_IMAGE
        p["powerState"] = {"code": "Running"}
        return p

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
        available = _key_lookup(capacity, key)
        if need and available is not None:
            if need > available:
                raise OperationFailure(
                    "AllocationFailed",
                    f"Allocation failed. We do not have sufficient capacity for the requested VM size "
                    f"{key[1]} in region {c.location} (requested {need}, available {available}). Read more about "
                    "improving likelihood of allocation success at http://aka.ms/allocation-guidance", http_status=500)
            _key_adjust(capacity, key, -need)
        return need

    def _capacity_give(self, c: Any, vm_size: str, count: int) -> None:
        if count > 0:
            _key_adjust(getattr(self.fleet, "capacity", {}) or {}, (c.location, vm_size), count)

    def _start(self, request: Request, c: Any, pool: Any, *, kind: str, duration_s: float,
               work: Callable[[Operation], None], on_failed: Callable[[Operation], None] | None = None) -> Operation:
        def finish(op: Operation) -> None:
            pool.operation_until = 0.0
            work(op)
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
                            fail=self._lro_fault(request, c), on_failed=failed)
        pool.operation_until = op.due
        return op

    def _create_pool(self, request: Request, c: Any, name: str, props: dict[str, Any], api: AksApiVersion) -> Response:
        if not POOL_NAME.match(name):
            raise _invalid("The value of parameter agentPoolProfile.name is invalid. "
                           "Please see https://aka.ms/aks-naming-rules for more details.", "agentPoolProfile.name")
        if props.get("enableAutoScaling") and props.get("count") is None:
            raise _invalid("Required parameter properties.count is missing (null).", "properties.count")
        props.setdefault("count", 1)
        size = self._validate_common(c, name, props, api)
        self._check_features(c, props)
        self._check_quota(c, size, extra_vcpus=int(props["count"]) * size.vcpus,
                          priority=str(props.get("scaleSetPriority") or "Regular"))
        from sim.model import Pool  # the model is the other half's; imported late to keep this module light

        pool = Pool(name=name, properties=self._defaults(c, name, props, size))
        pool.properties["eTag"] = self._etag()
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
            raise ArmError(400, "OperationNotAllowed",
                           f"Cannot change the count of agent pool '{pool.name}' while enableAutoScaling is true; "
                           "change minCount/maxCount or disable the cluster autoscaler first.", target="properties.count")
        size = self._validate_common(c, pool.name, new, api)
        grow = int(new["count"]) - int(old.get("count") or 0)
        self._check_quota(c, size, extra_vcpus=grow * size.vcpus,
                          priority=str(new.get("scaleSetPriority") or "Regular"))
        merged = self._defaults(c, pool.name, new, size)
        merged["nodeImageVersion"] = old.get("nodeImageVersion", NODE_IMAGE)
        merged["eTag"] = self._etag()
        old_props = copy.deepcopy(old)
        pool.properties = merged
        kind = "scale" if count_changed else "update"
        self._set_state(pool, "Scaling" if count_changed else "Updating")
        target = int(merged["count"])

        def work(op: Operation) -> None:
            if count_changed:
                before = len(c.pool_nodes(pool))
                self._capacity_take(c, pool, target)
                c.scale_nodes(pool, target)
                self._capacity_give(c, str(merged["vmSize"]), before - target)

        def failed(op: Operation) -> None:
            if count_changed:  # the scale did not happen: the pool keeps its old size
                pool.properties["count"] = old_props.get("count")

        op = self._start(request, c, pool, kind=kind,
                         duration_s=self._timing("pool_scale_s" if count_changed else "pool_update_s", 30.0),
                         work=work, on_failed=failed)
        headers = self.ops.accepted_headers(op, self._base_url(request), location=False)
        return Response.json(200, self._pool_body(c, pool, api), headers)

    @staticmethod
    def _check_immutable(old: dict[str, Any], new: dict[str, Any]) -> None:
        old_size, new_size = gpu_catalog.lookup(str(old.get("vmSize"))), gpu_catalog.lookup(str(new.get("vmSize")))
        if str(old.get("vmSize", "")).lower() != str(new.get("vmSize", "")).lower():
            if new_size is not None and new_size.is_gpu and (old_size is None or not old_size.is_gpu):
                raise ArmError(400, "PropertyChangeNotAllowed",
                               f"Changing property 'vmSize' is not allowed: a general-purpose agent pool "
                               f"({old.get('vmSize')}) cannot change to the GPU size {new.get('vmSize')}; "
                               "create a new GPU agent pool.", target="properties.vmSize")
            raise ArmError(400, "PropertyChangeNotAllowed", "Changing property 'vmSize' is not allowed.",
                           target="properties.vmSize")
        for path in _IMMUTABLE:
            # An omitted field is reset to its default (create-or-replace), not kept: leaving an
            # immutable field out is a change unless the stored value is that default.
            before, after = _get(old, *path), _get(new, *path)
            if before is None:
                before = _IMMUTABLE_DEFAULTS.get(path)
            if after is None:
                after = _IMMUTABLE_DEFAULTS.get(path)
            if before != after:
                label = ".".join(path)
                raise ArmError(400, "PropertyChangeNotAllowed",
                               f"Changing property '{label}' is not allowed (from {before!r} to {after!r}); "
                               "it is immutable after agent pool creation.", target=f"properties.{label}")

    def _delete_pool(self, request: Request, c: Any, name: str) -> Response:
        pool = next((p for k, p in c.pools.items() if k.lower() == name.lower()), None)
        if pool is None:
            if (request.headers.get("if-match") or "").strip():
                self._check_preconditions(request, None)  # AKS: 412, "Resource not found but ETag header is provided"
            return Response(status=204)
        self._check_preconditions(request, pool)
        self._busy(c, None)
        if pool.provisioning_state == "Deleting":
            raise ArmError(409, "OperationNotAllowed",
                           f"Operation is not allowed: Another agentpool operation ({pool.name} - Deleting) is in "
                           "progress, please wait for it to finish before starting a new operation. "
                           "See https://aka.ms/aks-pending-operation for more details")
        if str(pool.properties.get("mode")) == "System" and not any(
                str(p.properties.get("mode")) == "System" for k, p in c.pools.items() if p is not pool):
            raise ArmError(400, "OperationNotAllowed",
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
            raise ArmError(400, "InvalidRequestContent",
                           f"The request content was invalid and could not be deserialized: {exc}.") from exc
        names = body.get("machineNames") if isinstance(body, dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise _invalid("machineNames must be a non-empty list of machine names.", "machineNames")
        self._busy(c, p)
        known = {m["name"].lower(): m["name"] for m in c.machines(p)}
        missing = [n for n in names if n.lower() not in known]
        if missing:
            raise _invalid(f"Machine(s) {', '.join(missing)} not found in agent pool '{p.name}'.", "machineNames")
        victims = sorted({known[n.lower()] for n in names})
        self._set_state(p, "Scaling")

        def work(op: Operation) -> None:
            present = {m["name"] for m in c.machines(p)}
            gone = [n for n in victims if n in present]
            c.remove_machines(p, gone)
            p.properties["count"] = max(0, int(p.properties.get("count") or 0) - len(gone))
            p.properties["eTag"] = self._etag()
            self._capacity_give(c, str(p.properties.get("vmSize")), len(gone))

        op = self._start(request, c, p, kind="deleteMachines", duration_s=self._timing("delete_machines_s", 30.0),
                         work=work)
        headers = self.ops.accepted_headers(op, self._base_url(request), location=True)
        return Response(status=202, headers=headers)

    # ---- operations
    def _operation(self, op_id: str, provider: str) -> Operation:
        op = self.ops.get(op_id)
        if op is None or op.provider != provider:
            raise ArmError(404, "NotFound", f"The operation '{op_id}' was not found.")
        return op

    def _r_aks_operation(self, request: Request, *, sub: str, loc: str, op: str) -> Response:
        return self.ops.status_response(self._operation(op, AKS_PROVIDER), self._base_url(request))

    def _r_aks_operation_result(self, request: Request, *, sub: str, loc: str, op: str) -> Response:
        return self.ops.result_response(self._operation(op, AKS_PROVIDER), self._base_url(request))

    def _r_compute_operation(self, request: Request, *, sub: str, loc: str, op: str) -> Response:
        operation = self._operation(op, COMPUTE_PROVIDER)
        if (request.arg("monitor") or "").lower() == "true":
            return self.ops.result_response(operation, self._base_url(request))
        return self.ops.status_response(operation, self._base_url(request))

    # ---- Microsoft.Features: subscription preview features (az feature show / list / register)
    # azure-rest-api-specs specification/resources/resource-manager/Microsoft.Features/stable/2021-07-01/
    # features.json (Features_Get / Features_List / Features_Register / Features_Unregister): a
    # FeatureResult {"id", "name": "<namespace>/<feature>", "type": "Microsoft.Features/providers/features",
    # "properties": {"state"}}; registering goes through Registering before Registered.
    def _feature_states(self, sub: str) -> dict[str, list[str]]:
        """Features of one subscription: lower-case ``Namespace/Name`` -> [name as written, state] (kept on
        the fleet; the scenario's ``subscriptions[].features`` maps ``Namespace/Name`` to a state)."""
        table = getattr(self.fleet, "feature_states", None)
        if not isinstance(table, dict):
            table = {}
            for spec in (getattr(self.fleet, "scenario", None) or {}).get("subscriptions") or []:
                if isinstance(spec, dict) and spec.get("id"):
                    states = {k.lower(): [k, v] for k, v in DEFAULT_FEATURES.items()}
                    states.update({str(k).lower(): [str(k), str(v)] for k, v in (spec.get("features") or {}).items()})
                    table[str(spec["id"]).lower()] = states
            self.fleet.feature_states = table
        return table.setdefault(sub.lower(), {k.lower(): [k, v] for k, v in DEFAULT_FEATURES.items()})

    def _feature_state(self, sub: str, feature: str) -> str:
        entry = self._feature_states(sub).get(feature.lower())
        return entry[1] if entry else "NotRegistered"

    @staticmethod
    def _feature_body(sub: str, ns: str, name: str, state: str) -> dict[str, Any]:
        return {"id": f"/subscriptions/{sub}/providers/Microsoft.Features/providers/{ns}/features/{name}",
                "name": f"{ns}/{name}", "type": "Microsoft.Features/providers/features", "properties": {"state": state}}

    def _r_features(self, request: Request, *, sub: str, ns: str) -> Response:
        prefix = ns.lower() + "/"
        items = [self._feature_body(sub, ns, name.split("/", 1)[1], state)
                 for key, (name, state) in sorted(self._feature_states(sub).items()) if key.startswith(prefix)]
        return Response.json(200, {"value": items})

    def _r_feature(self, request: Request, *, sub: str, ns: str, feature: str) -> Response:
        return Response.json(200, self._feature_body(sub, ns, feature, self._feature_state(sub, f"{ns}/{feature}")))

    def _r_feature_action(self, request: Request, *, sub: str, ns: str, feature: str, action: str) -> Response:
        states = self._feature_states(sub)
        key = f"{ns}/{feature}".lower()
        register = action.lower() == "register"
        entry = states.setdefault(key, [f"{ns}/{feature}", "NotRegistered"])
        entry[1] = "Registering" if register else "Unregistering"
        final = "Registered" if register else "Unregistered"

        def settle() -> None:
            if entry[1] in ("Registering", "Unregistering"):
                entry[1] = final

        self.fleet.at(self._now() + self._timing("feature_register_s", 120.0), settle)
        return Response.json(200, self._feature_body(sub, ns, feature, entry[1]))

    # ---- Microsoft.Compute: VMSS VM restart / reimage
    def _r_vm_action(self, request: Request, *, sub: str, rg: str, vmss: str, instance: str, action: str) -> Response:
        c = self._cluster_by_node_rg(sub, rg)
        vmss_names = {c.vmss_name(p).lower(): p for p in c.pools.values()} if c is not None else {}
        if c is None or vmss.lower() not in vmss_names:
            raise ArmError(404, "ResourceNotFound",
                           f"The Resource 'Microsoft.Compute/virtualMachineScaleSets/{vmss}' under resource group "
                           f"'{rg}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix")
        node = c.node_by_vmss_instance(vmss, instance)
        if node is None:
            raise ArmError(404, "NotFound",
                           f"The entity was not found in this resource group: virtualMachineScaleSets/{vmss}"
                           f"/virtualMachines/{instance}.")
        if request.body:
            try:
                request.json()
            except ValueError as exc:
                raise ArmError(400, "InvalidRequestContent",
                               f"The request content was invalid and could not be deserialized: {exc}.") from exc
        action = action.lower()
        if c.node_rg_locked:
            # Node resource group lockdown: a ReadOnly deny assignment on the node resource group
            # (https://learn.microsoft.com/azure/aks/node-resource-group-lockdown). ARM answers 403
            # DenyAssignmentAuthorizationFailed naming the deny assignment (the shape seen in
            # Azure/migAz#266 for another system deny assignment; AKS's exact name is not documented).
            principal = c.fleet.tokens.verify(request.bearer, ARM_AUDIENCES).principal or "unknown"
            scope = f"/subscriptions/{sub}/resourceGroups/{c.node_resource_group}"
            raise ArmError(403, "DenyAssignmentAuthorizationFailed",
                           f"The client '{principal}' with object id '{principal}' has permission to perform action "
                           f"'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/{action}/action' on scope "
                           f"'{scope}/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/"
                           f"{instance}'; however, the access is denied because of the deny assignment with name "
                           f"'AKS node resource group lockdown' and Id '{c.name}-nrg-lockdown' at scope '{scope}'.")
        vm = c.nodes.get(node)
        if vm is not None and any(t.get("key") == "node.cloudprovider.kubernetes.io/shutdown"
                                  for t in vm.obj["spec"].get("taints") or []):
            # A stopped/deallocated VM (an evicted spot VM under the Deallocate policy): Compute refuses
            # a restart or reimage with 409 OperationNotAllowed until it is started again.
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


# --------------------------------------------------------------------------- linked access checks
# ARM authorizes a write twice: the action on the resource written (agentPools/write) and, for every
# property that names another resource, an action on that *linked* resource. Without the second it
# answers 403 LinkedAuthorizationFailed before the resource provider sees the request (the message
# shape is ARM's, e.g. kubernetes-sigs/cloud-provider-azure#1999, Azure/aad-pod-identity#511 and #752:
# the check runs on every write that carries the reference, updates of an existing VMSS included).
# The actions per agent-pool property: https://learn.microsoft.com/azure/aks/aks-service-permissions.
# What the caller holds is the app's own role as the project declares it (shared.adapters.permissions:
# the adapters' @requires_arm actions, which tests/infra keeps equal to infra/app/steward-role.bicep,
# plus the linked-resources role), minus what a test revoked in ``fleet.revoked_arm_actions``.

_AGENT_POOL_WRITE = "Microsoft.ContainerService/managedClusters/agentPools/write"


def granted_arm_actions(fleet: Any) -> set[str]:
    """The Azure actions the app's identity holds in this simulated fleet: the roles of
    infra/app/steward-role.bicep (sim/armrbac.py), minus what a test revoked."""
    return armrbac.granted_actions(fleet)


def check_linked_authorization(request: Request, cluster: Any, props: dict[str, Any]) -> None:
    """Refuse an agent-pool PUT naming a linked resource whose action the caller does not hold."""
    from shared.adapters.permissions import linked_actions_for

    linked = linked_actions_for(props)
    if not linked:
        return
    verdict = cluster.fleet.tokens.verify(request.bearer, ARM_AUDIENCES)
    if verdict.admin:
        return  # the harness acts as the subscriptions' owner
    from sim.identity import app_principal_id

    is_app = verdict.principal == app_principal_id(cluster.fleet)
    missing = [(rid, action) for _, rid, action in linked
               if not (is_app and armrbac.app_may(cluster.fleet, action, rid))]
    if not missing:
        return
    principal, client = verdict.principal or "unknown", verdict.client_id or verdict.principal or "unknown"
    actions = ",".join(dict.fromkeys(action for _, action in missing))
    scopes = ",".join(dict.fromkeys(rid for rid, _ in missing))
    pool_scope = request.path.split("?", 1)[0]
    raise ArmError(403, "LinkedAuthorizationFailed",
                   f"The client '{client}' with object id '{principal}' has permission to perform action "
                   f"'{_AGENT_POOL_WRITE}' on scope '{pool_scope}'; however, it does not have permission to "
                   f"perform action(s) '{actions}' on the linked scope(s) '{scopes}' or the linked scope(s) "
                   "are invalid.")

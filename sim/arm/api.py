"""The AKS resource provider (Microsoft.ContainerService) and the VMSS VM actions of Microsoft.Compute.

The app's ARM adapters (shared/adapters/aks.py, shared/adapters/compute.py) run the real azure-mgmt SDKs against this
handler, so it answers what ARM answers: bearer tokens for ``https://management.azure.com/`` (401
``AuthenticationFailed`` without one, ``InvalidAuthenticationToken`` for a bad one, 403
``InvalidAuthenticationTokenAudience`` for another audience), a required and supported
``api-version``, errors shaped by who answers (ARM's gateway wraps, the AKS RP answers flat: sim.arm.common), 404 for
unknown routes and resources, and long-running writes
through :mod:`sim.arm.lro`. Agent-pool writes enforce the rules AKS enforces (naming, GPU profile rules
per VM size and api-version, immutable fields, autoscaler vs count, one operation at a time,
quota; capacity when the operation completes). The model (:mod:`sim.model`) owns nodes and pods;
this module owns the pools' ARM ``properties`` and calls ``Cluster`` methods to make nodes appear
and go.

Api-version decisions (the agent-pool models per api-version in azure-rest-api-specs
specification/containerservice/resource-manager/Microsoft.ContainerService/aks/): ARM resource providers
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

import json
import random
import re
import uuid
from typing import Any

from sim.arm import rbac as armrbac
from sim.arm.aborts import Aborts
from sim.arm.common import (
    AKS_API_VERSIONS,
    AKS_SERVER_APP_ID,
    COMPUTE_API_VERSIONS,
    DEFAULT_FEATURES,
    FEATURES_API_VERSIONS,
    KUBELOGIN_CLIENT_ID,
    MANAGED_GPU_FEATURE,
    MAX_COUNT,
    NODE_IMAGE,
    POOL_NAME,
    POOL_TYPE,
    WINDOWS_POOL_NAME_MAX,
    AksApiVersion,
    AksError,
    ArmError,
    GatewayError,
    project,
)
from sim.arm.features import Features
from sim.arm.lro import AKS_OPERATION_API_VERSION, AKS_PROVIDER, COMPUTE_PROVIDER, Operation, Operations
from sim.arm.pools import PoolWrites
from sim.arm.reads import ClusterReads, maintenance_start_date, present_maintenance_properties
from sim.arm.resource_health import API_VERSIONS as RESOURCE_HEALTH_API_VERSIONS
from sim.arm.resource_health import ROUTE as HEALTH_ROUTE
from sim.arm.resource_health import ROUTE_PATTERN as HEALTH_ROUTE_PATTERN
from sim.arm.resource_health import ResourceHealthReads
from sim.arm.validation import PoolValidation, check_linked_authorization
from sim.core.http import Request, Response
from sim.identity.tokens import ARM_AUDIENCES

# the names other modules import from here (their homes are the modules above)
__all__ = [
    "AKS_API_VERSIONS", "AKS_SERVER_APP_ID", "COMPUTE_API_VERSIONS", "DEFAULT_FEATURES", "FEATURES_API_VERSIONS",
    "KUBELOGIN_CLIENT_ID", "MANAGED_GPU_FEATURE", "MAX_COUNT", "NODE_IMAGE",
    "POOL_NAME", "POOL_TYPE", "WINDOWS_POOL_NAME_MAX", "AksApiVersion", "AksError", "ArmApi", "ArmError", "GatewayError",
    "check_linked_authorization", "granted_arm_actions", "maintenance_start_date", "present_maintenance_properties",
    "project",
]


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
        ("cluster_abort", _MC + r"/abort", ("POST",)),
        ("pools", _MC + r"/agentpools", ("GET",)),
        ("pool", _POOL, ("GET", "PUT", "DELETE")),
        ("delete_machines", _POOL + r"/deletemachines", ("POST",)),
        ("pool_abort", _POOL + r"/abort", ("POST",)),
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
        (HEALTH_ROUTE, _RG + HEALTH_ROUTE_PATTERN, ("GET",)),
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


# --------------------------------------------------------------------------- handler


class ArmApi(ClusterReads, PoolValidation, PoolWrites, Aborts, Features, ResourceHealthReads):
    """``handle(request) -> Response`` for everything under ``/subscriptions/``: authentication,
    authorization, routing and operations here; the routes themselves in its parts
    (:mod:`sim.arm.reads`, :mod:`sim.arm.validation`, :mod:`sim.arm.pools`, :mod:`sim.arm.features`)."""

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
            raise GatewayError(404, "NotFound", f"No HTTP resource was found that matches the request URI "
                                            f"'{request.path}'.")
        name, params, methods = found
        if request.method not in methods:
            raise GatewayError(405, "MethodNotAllowed",
                           f"The requested resource does not support http method '{request.method}'.")
        compute = name in ("vm_action", "compute_operation")
        self._check_api_version(request, compute=compute, features=name.startswith("feature"),
                                health=name == HEALTH_ROUTE,
                                operation=name in ("aks_operation", "aks_operation_result"))
        self._authorize(request, verdict, name, params)
        cluster_name = params.get("cluster")
        if name in ("vm_action", HEALTH_ROUTE):
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

    # ---- authorization (sim/arm/rbac.py): the app's identity holds what infra/ assigns it
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
        raise GatewayError(status, code, message)

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
            raise GatewayError(401, "AuthenticationFailed",
                           "Authentication failed. The 'Authorization' header is missing.", headers=challenge)
        verdict = self.fleet.tokens.verify(token, ARM_AUDIENCES)
        if verdict.wrong_audience:
            # ARM: 401 InvalidAuthenticationTokenAudience (an authentication failure, never a 403)
            raise GatewayError(401, "InvalidAuthenticationTokenAudience",
                           f"The access token has been obtained for wrong audience or resource '{verdict.audience}'. "
                           "It should exactly match with one of the allowed audiences "
                           "'https://management.core.windows.net/','https://management.core.windows.net',"
                           "'https://management.azure.com/','https://management.azure.com'.", headers=challenge)
        if verdict.status != 200:
            raise GatewayError(401, "InvalidAuthenticationToken", f"The access token is invalid: {verdict.reason}.",
                           headers=challenge)
        return verdict

    def _check_api_version(self, request: Request, *, compute: bool, features: bool = False,
                           health: bool = False, operation: bool = False) -> None:
        version = request.arg("api-version")
        if not version:
            raise GatewayError(400, "MissingApiVersionParameter",
                           "The api-version query parameter (?api-version=) is required for all requests.")
        supported = FEATURES_API_VERSIONS if features else COMPUTE_API_VERSIONS if compute else tuple(AKS_API_VERSIONS)
        if health:
            supported = RESOURCE_HEALTH_API_VERSIONS
        if operation:
            # AKS's operation URLs carry api-version=2016-03-30 (recorded: every poll_operation_* and
            # get_operationresult_204 exchange); the spec's examples show the resource's own api-version
            # (aks/stable/2025-10-01/examples/AgentPoolsAbortOperation.json): both are accepted.
            supported = (AKS_OPERATION_API_VERSION, *AKS_API_VERSIONS)
        if version not in supported:
            raise GatewayError(400, "InvalidApiVersionParameter",
                           f"The api-version '{version}' is invalid. The supported versions are "
                           f"'{','.join(supported)}'.")

    @staticmethod
    def _api(request: Request) -> AksApiVersion:
        return AKS_API_VERSIONS[str(request.arg("api-version"))]

    def _cluster(self, sub: str, rg: str, name: str) -> Any:
        c = self.fleet.cluster(sub, rg, name)
        if c is None:
            raise GatewayError(404, "ResourceNotFound",
                           f"The Resource 'Microsoft.ContainerService/managedClusters/{name}' under resource group "
                           f"'{rg}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix")
        return c

    def _pool(self, cluster: Any, name: str) -> Any:
        for key, pool in cluster.pools.items():
            if key.lower() == name.lower():
                return pool
        raise AksError(404, "NotFound", f"Agent pool '{name}' not found in managed cluster '{cluster.name}'.")

    def _cluster_by_node_rg(self, sub: str, node_rg: str) -> Any:
        for key in sorted(self.fleet.clusters):
            c = self.fleet.clusters[key]
            if c.subscription.lower() == sub.lower() and c.node_resource_group.lower() == node_rg.lower():
                return c
        return None

    # ---- operations
    def _operation(self, op_id: str, provider: str) -> Operation:
        op = self.ops.get(op_id)
        if op is None or op.provider != provider:
            # The status URL is the provider's own (…/providers/<provider>/locations/<loc>/operations/<id>):
            # the AKS RP answers flat (AksError), Microsoft.Compute in ARM's wrapped shape.
            cls = AksError if provider == AKS_PROVIDER else ArmError
            raise cls(404, "NotFound", f"The operation '{op_id}' was not found.")
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


def granted_arm_actions(fleet: Any) -> set[str]:
    """The Azure actions the app's identity holds in this simulated fleet: the roles of
    infra/app/steward-role.bicep (sim/arm/rbac.py), minus what a test revoked."""
    return armrbac.granted_actions(fleet)



"""The App Service managed-identity endpoint (``IDENTITY_ENDPOINT`` / ``IDENTITY_HEADER``).

The function app authenticates with ``ManagedIdentityCredential`` in Azure; locally the same
credential talks to this endpoint, so the app's token code path is the production one. Protocol
(App Service, api-version 2019-08-01): ``GET ?resource=<aud>&api-version=2019-08-01
[&client_id=|principal_id=|mi_res_id=|object_id=]`` with header ``X-IDENTITY-HEADER: <secret>``;
answer ``{"access_token", "expires_on", "resource", "token_type": "Bearer", "client_id"}``.
Errors are App Service's ``{"statusCode": N, "message": ...}``: 401 for a missing or wrong
secret, 400 for a missing resource, a bad api-version or an identity that is not assigned.

Plain HTTP, like the real endpoint (it only listens on loopback).

Every token it issues belongs to the app's managed identity: ``oid`` is the identity's object
(principal) id, what infra/main.bicep outputs as ``STEWARD_PRINCIPAL_ID`` and what the Kubernetes
RoleBindings and ARM role assignments name; ``appid`` is its client id. The simulator's app has one
object id (:func:`app_principal_id`: ``fleet.app_principal_id``, else :data:`APP_PRINCIPAL_ID`).

``expires_on`` is wall-clock epoch seconds: the simulator's tokens expire on the sim clock, so the
remaining lifetime is divided by the clock speed; MSAL then refreshes in time at any speed.
"""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any

from sim.core.http import Request, Response

API_VERSION = "2019-08-01"
SYSTEM_ASSIGNED_CLIENT_ID = "00000000-0000-4000-8000-000000000001"
#: The object id of the app's managed identity in the simulated tenant (a GUID, as Entra's are:
#: scripts/apply-kube-rbac.sh refuses anything else).
APP_PRINCIPAL_ID = "5e1f7a3c-2b4d-4c8e-9f60-a1b2c3d4e5f6"


def app_principal_id(fleet: Any) -> str:
    """The object id the app's tokens carry, which the project's grants are assigned to."""
    return str(getattr(fleet, "app_principal_id", None) or APP_PRINCIPAL_ID)


def identity_secret(fleet: Any) -> str:
    """The X-IDENTITY-HEADER secret (``fleet.identity_header``; generated when the model has none)."""
    secret = getattr(fleet, "identity_header", None)
    if not secret:
        secret = secrets.token_hex(16)
        fleet.identity_header = secret
    return str(secret)


def _error(status: int, message: str) -> Response:
    return Response.json(status, {"statusCode": status, "message": message, "correlationId": str(uuid.uuid4())})


class IdentityApi:
    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.secret = identity_secret(fleet)

    def _assigned_client_ids(self) -> set[str]:
        ids = getattr(self.fleet, "identity_client_ids", None) or ()
        return {str(i).lower() for i in ids}

    def handle(self, request: Request) -> Response:
        faults = getattr(self.fleet, "faults", None)
        hit = faults.match(target="identity", method=request.method, path=request.path) if faults else None
        if hit:
            return hit
        response = self._answer(request)
        if hit is not None:  # a delay-only fault
            response.delay_s += hit.delay_s
        return response

    def _answer(self, request: Request) -> Response:
        if request.method != "GET":
            return _error(405, f"The HTTP method '{request.method}' is not supported.")
        if request.path.rstrip("/") not in ("", "/msi/token") and not request.path.rstrip("/").endswith("/msi/token"):
            return _error(404, f"No managed-identity endpoint at {request.path}; use /msi/token.")
        given = request.headers.get("x-identity-header")
        if not given:
            return _error(401, "Required header 'X-IDENTITY-HEADER' is missing.")
        if not secrets.compare_digest(str(given), self.secret):
            return _error(401, "The X-IDENTITY-HEADER value is not valid.")
        api_version = request.arg("api-version")
        if api_version != API_VERSION:
            return _error(400, f"The api-version '{api_version}' is not supported; use {API_VERSION}.")
        resource = request.arg("resource") or request.arg("scope")
        if not resource:
            return _error(400, "A 'resource' (or 'scope') query parameter is required.")
        client_id = request.arg("client_id") or request.arg("principal_id") or request.arg("object_id") \
            or request.arg("mi_res_id")
        assigned = self._assigned_client_ids()
        if client_id and assigned and client_id.lower() not in assigned:
            return _error(400, f"Unable to load the proper Managed Identity: '{client_id}' is not assigned.")
        principal = client_id or SYSTEM_ASSIGNED_CLIENT_ID
        with self.fleet.lock:
            token, exp = self.fleet.tokens.issue(resource, principal=app_principal_id(self.fleet), client_id=principal,
                                                 groups=())
            sim_now = float(self.fleet.clock.now())
        speed = float(getattr(self.fleet.clock, "speed", 1.0) or 1.0)
        expires_on = int(time.time() + max(0.0, exp - sim_now) / speed)
        return Response.json(200, {
            "access_token": token,
            "expires_on": str(expires_on),
            "resource": resource,
            "token_type": "Bearer",
            "client_id": principal,
        })

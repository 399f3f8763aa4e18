"""Azure Resource Manager, Microsoft.ContainerService: the AksPort over azure-mgmt-containerservice.

Why the details matter:

- One ``ContainerServiceClient`` per subscription, pointed at ARM_ENDPOINT with the token scope of
  ARM_AUDIENCE (public cloud, sovereign clouds and the simulator differ only in settings), trusting
  STEWARD_CA_BUNDLE when set. The SDK's own retries are off (``retry_total=0``): retrying is
  :mod:`shared.kernel.retry`'s job alone, so a throttled ARM sees one polite client, not two stacked ones.
- A second client per subscription speaks the preview api-version, used only for the requests that
  need preview fields (``nvidia.migStrategy``); the stable SDK models carry unknown keys unchanged,
  so bodies are sent as the raw camelCase dicts the rest of the app builds (aks-api.md §2).
- ``begin_*`` return once ARM accepted the request (``polling=False``): the ledger and the
  reconciler follow the long-running operation by reading the pool, never by holding an invocation.
- SDK exceptions are translated here (:func:`map_arm_error`), keeping ARM's error code, so that the
  core sees Throttled / Transient / Conflict / NotFound / Forbidden / Invalid only, refined by ARM's
  error *code* (and the codes of ``details[]``, where AKS puts Compute's error inside a deployment
  error) into QuotaExceeded / AllocationFailed / FeatureNotRegistered / LinkedAuthorizationFailed /
  OperationInProgress: the core catches types, it never searches message text.
- Pools are *read* with the preview api-version, the one that shows every field of a pool
  (``nvidia.migStrategy``/``migProfiles`` exist only there), so that a write built from a read
  (a PUT is create-or-replace) carries all of them; a PUT whose body holds a preview-only field is
  sent with the preview api-version too (:func:`shared.pools.spec.needs_preview`). An api-version
  that lacks a field would not see it, and a client that does not send a field it read resets it
  (Azure/azure-resource-manager-rpc v1.0/version-change.md: the GET-PUT pipeline).
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shared.adapters.permissions import requires_arm
from shared.kernel import retry
from shared.kernel.errors import (
    AllocationFailed,
    Conflict,
    FeatureNotRegistered,
    Forbidden,
    Invalid,
    LinkedAuthorizationFailed,
    NotFound,
    OperationInProgress,
    QuotaExceeded,
    StewardError,
    Throttled,
    Transient,
)
from shared.kernel.ports import ClusterInfo, MachineInfo, PoolInfo

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

    from shared.kernel.clock import Clock
    from shared.settings import Settings

T = TypeVar("T")

PREVIEW_API_VERSION = "2026-08-02-preview"
"""The api-version that has ``gpuProfile.nvidia.migStrategy`` / ``migProfiles`` (aks-api.md §1)."""

QUOTA_CODES = frozenset({"QuotaExceeded", "InsufficientVCPUQuota", "ErrCode_InsufficientVCPUQuota"})
"""vCPU quota: AKS's pre-flight ``InsufficientVCPUQuota`` (surfaced by some clients as
``ErrCode_InsufficientVCPUQuota``) and Compute's ``QuotaExceeded`` (usually inside a deployment error)."""
ALLOCATION_CODES = frozenset({"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                              "OverconstrainedZonalAllocationRequest", "SkuNotAvailable"})
"""No capacity for the size in the region/zone (Compute's allocation errors, passed on by AKS)."""
FEATURE_CODES = frozenset({"PreviewFeatureNotRegistered", "FeatureNotRegistered"})
"""AKS: "Preview feature Microsoft.ContainerService/X not registered." (code PreviewFeatureNotRegistered)."""
LINKED_AUTH_CODES = frozenset({"LinkedAuthorizationFailed", "LinkedInvalidPropertyId"})
"""ARM: the caller may not use a resource the body links to (subnet join, public IP prefix, PPG)."""
INVALID_CODES = frozenset({
    "OperationNotAllowed", "InvalidParameter", "BadRequest", "PropertyChangeNotAllowed",
    "InvalidTemplateDeployment", "DeploymentFailed",
}) | QUOTA_CODES | ALLOCATION_CODES | FEATURE_CODES
"""ARM error codes that are answers about the request itself, whatever the HTTP status says."""
_FEATURE_NAME = re.compile(r"\b(Microsoft\.[A-Za-z]+/[A-Za-z0-9]+)\b")

_CLUSTER_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)"
    r"/providers/microsoft\.containerservice/managedclusters/(?P<name>[^/]+)/?$",
    re.IGNORECASE,
)


def parse_cluster_id(cluster_id: str) -> tuple[str, str, str]:
    """``(subscription, resource group, cluster name)`` of a managed cluster ARM id."""
    match = _CLUSTER_ID.match(cluster_id.strip())
    if not match:
        raise Invalid(f"not a managed cluster id: {cluster_id!r}", code="InvalidResourceId")
    return match["sub"], match["rg"], match["name"]


# --------------------------------------------------------------------------- clients


def arm_client_options(settings: Settings) -> dict[str, Any]:
    """Options every ARM management client gets: our endpoint and audience, our CA bundle, and no
    retries of its own (shared.kernel.retry decides what is worth retrying, honouring Retry-After)."""
    options: dict[str, Any] = {
        "base_url": settings.arm_endpoint,
        "credential_scopes": [settings.arm_scope],
        "retry_total": 0,
        "connection_timeout": 10,
        "read_timeout": 60,
    }
    if settings.ca_bundle:
        options["connection_verify"] = settings.ca_bundle
    return options


# --------------------------------------------------------------------------- error mapping


def retry_after_seconds(response: Any) -> float | None:
    """The server's Retry-After hint in seconds (seconds or an HTTP date), if any."""
    headers = getattr(response, "headers", None) or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        ms = headers.get("retry-after-ms") or headers.get("x-ms-retry-after-ms")
        try:
            return float(ms) / 1000.0 if ms is not None else None
        except ValueError:
            return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        import time
        from email.utils import parsedate_to_datetime

        # An HTTP date is the server's wall clock, so the delay is measured on the wall clock too.
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _error_body(error: Any) -> Mapping[str, Any] | None:
    """ARM's ``{"error": {...}}`` object of an HttpResponseError, from the response body."""
    response = getattr(error, "response", None)
    try:
        body = response.json() if response is not None else None
    except Exception:  # a non-JSON error body (a proxy's HTML page): keep the status only
        return None
    if isinstance(body, Mapping):
        inner = body.get("error")
        return inner if isinstance(inner, Mapping) else body
    return None


def arm_error_code_and_message(error: Any) -> tuple[str | None, str]:
    """ARM's ``error.code`` and ``error.message`` from an HttpResponseError (body or parsed model)."""
    odata = getattr(error, "error", None)
    code = getattr(odata, "code", None)
    message = getattr(odata, "message", None)
    if not code:
        inner = _error_body(error)
        if inner is not None:
            code = inner.get("code") or code
            message = inner.get("message") or message
    text = str(message or getattr(error, "reason", "") or error)
    return (str(code) if code else None), text.strip()[:1000]


def error_codes(detail: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every ``code`` of an ARM ErrorDetail, its own first, then those of its ``details[]`` (depth first).

    AKS reports Compute's refusal inside a deployment error, e.g. ``{"code": "InvalidTemplateDeployment",
    "details": [{"code": "QuotaExceeded", ...}]}`` (MicrosoftDocs/azure-docs#62378, mspnp/aks-baseline#377).
    """
    out: list[str] = []

    def walk(d: Any, depth: int) -> None:
        if not isinstance(d, Mapping) or depth > 5:
            return
        if d.get("code"):
            out.append(str(d["code"]))
        for sub in d.get("details") or ():
            walk(sub, depth + 1)

    walk(detail, 0)
    return tuple(out)


def _sdk_error_codes(error: Any, code: str | None) -> tuple[str, ...]:
    inner = _error_body(error)
    codes = error_codes(inner) if inner is not None else ()
    if not codes:
        odata = getattr(error, "error", None)
        codes = tuple(str(c) for c in [getattr(odata, "code", None)] + [getattr(d, "code", None) for d in
                                                                        (getattr(odata, "details", None) or ())] if c)
    return codes or ((code,) if code else ())


def classify_arm_error(codes: Sequence[str], message: str) -> StewardError | None:
    """The specific error of an ARM refusal whose codes (top level and details) say what it is; None
    when none does. Decided on codes only; the message is carried, and read only to name the feature."""
    for c in codes:
        if c in FEATURE_CODES:
            named = _FEATURE_NAME.search(message)
            return FeatureNotRegistered(message, code=c, feature=named.group(1) if named else None)
    for c in codes:
        if c in LINKED_AUTH_CODES:
            return LinkedAuthorizationFailed(message, code=c)
    for c in codes:
        if c in QUOTA_CODES:
            return QuotaExceeded(message, code=c)
    for c in codes:
        if c in ALLOCATION_CODES:
            return AllocationFailed(message, code=c)
    return None


def error_of_detail(detail: Mapping[str, Any] | None) -> StewardError:
    """An ARM ErrorDetail (a failed operation's ``error``, a pool's ``status.provisioningError``) as
    the specific error its codes name (QuotaExceeded, LinkedAuthorizationFailed...), else
    :class:`Invalid` with its own code."""
    detail = detail or {}
    message = str(detail.get("message") or "")
    codes = error_codes(detail)
    specific = classify_arm_error(codes, message)
    if specific is not None:
        return specific
    code = codes[0] if codes else "ProvisioningFailed"
    return Invalid(message or code, code=code)


def map_arm_error(error: BaseException, *, what: str) -> StewardError | None:
    """Translate an azure-core exception into a shared.kernel.errors one; None when it is not an SDK error."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(error, StewardError):
        return error
    if isinstance(error, (ServiceRequestError, ServiceResponseError)):
        return Transient(f"{what}: connection failed ({type(error).__name__}: {str(error)[:200]})")
    if isinstance(error, HttpResponseError):
        status = error.status_code
        code, message = arm_error_code_and_message(error)
        label = f"{what}: {status} {code or ''} {message}".replace("  ", " ")
        if status is None:
            if isinstance(error, ClientAuthenticationError):
                # The credential could not get a token (identity endpoint down or misconfigured).
                return Transient(f"{what}: no token: {str(error)[:300]}")
            return Transient(label)
        if status == 429:
            return Throttled(label, retry_after=retry_after_seconds(error.response))
        if status == 408 or status >= 500:
            return Transient(label, retry_after=retry_after_seconds(error.response))
        specific = classify_arm_error(_sdk_error_codes(error, code), message or label)
        if specific is not None:
            return specific
        if status == 409:
            # AKS answers 409 OperationNotAllowed while another operation runs on the pool or
            # cluster: that passes by itself (looked at again later), it is not an answer about us.
            return OperationInProgress(label)
        if status == 412:
            return Conflict(label)  # If-Match: someone else wrote first
        if code in INVALID_CODES:
            return Invalid(message or label, code=code)
        if status in (401, 403):
            return Forbidden(label)
        if status == 404:
            return NotFound(label)
        return Invalid(message or label, code=code)
    if isinstance(error, ValueError) and "token" in str(error).lower():
        return Forbidden(f"{what}: {error}")  # e.g. bearer tokens refused over plain http
    return None


def call_arm(fn: Callable[[], T], *, what: str) -> T:
    """Run one SDK call, translating its exceptions."""
    try:
        return fn()
    except Exception as error:
        mapped = map_arm_error(error, what=what)
        if mapped is None or mapped is error:
            raise
        raise mapped from error


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
    """The pool's ``properties.eTag`` as ARM returned it (None when it has none)."""
    if pool is None:
        return None
    value = pool.properties.get("eTag")
    return str(value) if value else None


# --------------------------------------------------------------------------- the adapter


class AksClient:
    """AksPort over azure-mgmt-containerservice (stable api-version; preview on request)."""

    def __init__(self, credential: TokenCredential, settings: Settings, *, clock: Clock | None = None,
                 retry_attempts: int = 4, retry_max_delay: float = 30.0) -> None:
        self._credential = credential
        self._settings = settings
        self._clock = clock
        self._attempts = retry_attempts
        self._max_delay = retry_max_delay
        self._clients: dict[tuple[str, bool], Any] = {}
        self._lock = threading.Lock()

    # -- plumbing

    def _client(self, subscription: str, *, preview: bool = False) -> Any:
        key = (subscription.lower(), preview)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                from azure.mgmt.containerservice import ContainerServiceClient

                options = arm_client_options(self._settings)
                if preview:
                    options["api_version"] = PREVIEW_API_VERSION
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
        client = self._client(sub, preview=True)  # the api-version that shows every field of a pool
        raws = self._run(lambda: [_raw(p) for p in client.agent_pools.list(rg, name)], what=f"list pools of {cluster_id}")
        return [pool_view(cluster_id, r) for r in raws]

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/read")
    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None:
        sub, rg, name = parse_cluster_id(cluster_id)
        client = self._client(sub, preview=True)  # the api-version that shows every field of a pool
        try:
            raw = self._run(lambda: _raw(client.agent_pools.get(rg, name, pool)), what=f"get pool {pool} of {cluster_id}")
        except NotFound:
            return None
        return pool_view(cluster_id, raw)

    @requires_arm("Microsoft.ContainerService/managedClusters/agentPools/write")
    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], *, preview: bool | None = None,
                       etag: str | None = None, create_only: bool = False) -> None:
        """PUT the pool. ``body`` is either the AgentPool (``{"properties": {...}}``) or its properties.

        The api-version is the preview one when ``preview`` is true, or when it is not given and the
        body carries a field only the preview api-version has (a MIG pool's ``migStrategy``, read
        back by :meth:`get_pool`): sent on a version that lacks it, the field would not be written.
        ``etag`` (the pool's ``properties.eTag`` as read) is sent as ``If-Match``: AKS then refuses
        the write with 412 (raised as Conflict) if the pool changed since it was read. ``create_only``
        sends ``If-None-Match: *`` instead: a PUT is create-or-replace, and a pool someone made under
        the same name between our read and our PUT must not be overwritten (412 -> Conflict).
        """
        from shared.pools.spec import needs_preview

        sub, rg, name = parse_cluster_id(cluster_id)
        payload = dict(body) if "properties" in body else {"properties": dict(body)}
        use_preview = needs_preview(payload.get("properties") or {}) if preview is None else bool(preview)
        client = self._client(sub, preview=use_preview)
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

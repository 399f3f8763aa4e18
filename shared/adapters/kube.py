"""One cluster's Kubernetes API (the KubePort), fast where the fleet is large.

Why it is built this way:

- **Connection**: the server URL and CA come from the kubeconfig ARM hands out
  (``listClusterUserCredential``); its exec/kubelogin user is ignored. Requests carry a bearer token
  from the app's own credential for ``AKS_SERVER_APP_ID/.default`` (aks-api.md §6), refreshed before
  it expires, so no kubelogin binary and no static credential are needed.
- **Hot reads** (the health sweep lists every GPU node of the fleet; drains list pods) skip the
  kubernetes client's model classes entirely: the raw JSON (``_preload_content=False``) is decoded
  by msgspec into small structs holding only the fields decisions need, one page (``limit`` /
  ``continue``) at a time, so CPU stays low and memory is bounded by the page size. Node pages go
  further (the sweep reads every GPU node every minute): they are fetched with a plain GET through
  the client's own connection pool, decoded straight into the views' conditions and taints, with
  transition times parsed once per distinct timestamp, and each page is let go before the next.
- **Writes** go through the kubernetes client (strategic-merge patches, the Eviction API, events,
  leases, Jobs and Karpenter custom objects). Pods are only ever removed through the Eviction API.
- Errors are translated at the edge into shared.kernel.errors; each method declares the exact Kubernetes
  verbs it uses (shared.adapters.permissions), per kind for the generic object methods, cluster-wide or in the
  app's own namespace (leases, events, sample Jobs: ``namespace``, setting STEWARD_NAMESPACE), from
  which the ClusterRole and the namespace's Role are checked (tests/infra).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import msgspec

from shared.adapters.permissions import kind_allowed, requires_kube, requires_kube_kinds
from shared.kernel import retry
from shared.kernel.errors import Conflict, Forbidden, Invalid, NotFound, StewardError, Throttled, Transient
from shared.kernel.ports import (
    EVICTED,
    EVICTION_BLOCKED,
    EVICTION_GONE,
    MULTIPLE_PDBS,
    NAMESPACE_TERMINATING,
    Condition,
    Epoch,
    EvictionResult,
    NodeView,
    OwnerRef,
    PodView,
    Taint,
    rfc3339_seconds,
)

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

    from shared.kernel.clock import Clock

T = TypeVar("T")
log = logging.getLogger("steward.kube")

FIELD_MANAGER = "gpu-fleet-steward"
EVENT_COMPONENT = "gpu-fleet-steward"
#: The app's own namespace (setting STEWARD_NAMESPACE): its leases, events and sample Jobs live there,
#: granted by a Role (infra/kubernetes/role.yaml), not cluster-wide.
DEFAULT_APP_NAMESPACE = "gpu-fleet-steward"
_TIMEOUT = (10.0, 60.0)  # (connect, read) seconds per request
_TOKEN_REFRESH_MARGIN_S = 300.0

# --------------------------------------------------------------------------- wire structs (decode only)


class _Owner(msgspec.Struct, gc=False):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class _Meta(msgspec.Struct, rename="camel", gc=False):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    owner_references: list[_Owner] | None = None


class _ListMeta(msgspec.Struct, rename="camel", gc=False):
    continue_: str | None = msgspec.field(default=None, name="continue")
    resource_version: str = ""


# Nodes are decoded in two ways. The fast one (every list page of the sweep) lets msgspec build the
# views' conditions and taints itself: ``ports.Condition`` and ``ports.Taint`` are the wire shapes, and
# ``lastTransitionTime`` stays text until it is read (``Condition.last_transition``). The node's own
# timestamps arrive as an ``Epoch`` through ``_dec_hook`` (a small cache of parsed timestamps). It is strict:
# a null ``reason``, ``message`` or taint ``value`` fails it, and the page is decoded again the
# tolerant way (Optional fields converted in Python), so odd API servers cost time, never a sweep.


class _NodeMeta(msgspec.Struct, rename="camel", gc=False):
    name: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creation_timestamp: Epoch | None = None
    deletion_timestamp: Epoch | None = None


class _NodeSpec(msgspec.Struct, gc=False):
    unschedulable: bool | None = None
    taints: tuple[Taint, ...] | None = None
    provider_id: str | None = msgspec.field(default=None, name="providerID")


class _NodeInfo(msgspec.Struct, gc=False):
    boot_id: str | None = msgspec.field(default=None, name="bootID")


class _NodeStatus(msgspec.Struct, rename="camel", gc=False):
    conditions: tuple[Condition, ...] | None = None
    allocatable: dict[str, str] | None = None
    capacity: dict[str, str] | None = None
    node_info: _NodeInfo | None = None


class _Node(msgspec.Struct, gc=False):
    metadata: _NodeMeta = msgspec.field(default_factory=_NodeMeta)
    spec: _NodeSpec = msgspec.field(default_factory=_NodeSpec)
    status: _NodeStatus = msgspec.field(default_factory=_NodeStatus)


class _NodeList(msgspec.Struct, gc=False):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_Node] | None = None


class _Taint(msgspec.Struct, gc=False):
    key: str = ""
    effect: str = ""
    value: str | None = None


class _Condition(msgspec.Struct, rename="camel", gc=False):
    type: str = ""
    status: str = ""
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class _TolerantNodeSpec(msgspec.Struct, gc=False):
    unschedulable: bool | None = None
    taints: list[_Taint] | None = None
    provider_id: str | None = msgspec.field(default=None, name="providerID")


class _TolerantNodeStatus(msgspec.Struct, rename="camel", gc=False):
    conditions: list[_Condition] | None = None
    allocatable: dict[str, str] | None = None
    capacity: dict[str, str] | None = None
    node_info: _NodeInfo | None = None


class _TolerantNode(msgspec.Struct, gc=False):
    metadata: _NodeMeta = msgspec.field(default_factory=_NodeMeta)
    spec: _TolerantNodeSpec = msgspec.field(default_factory=_TolerantNodeSpec)
    status: _TolerantNodeStatus = msgspec.field(default_factory=_TolerantNodeStatus)


class _TolerantNodeList(msgspec.Struct, gc=False):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_TolerantNode] | None = None


class _Resources(msgspec.Struct, gc=False):
    requests: dict[str, str] | None = None


class _Container(msgspec.Struct, gc=False):
    resources: _Resources | None = None


class _Volume(msgspec.Struct, rename="camel", gc=False):
    empty_dir: dict[str, Any] | None = None


class _PodSpec(msgspec.Struct, rename="camel", gc=False):
    node_name: str | None = None
    termination_grace_period_seconds: int | None = None
    volumes: list[_Volume] | None = None
    tolerations: list[dict[str, Any]] | None = None
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    containers: list[_Container] | None = None
    init_containers: list[_Container] | None = None


class _PodStatus(msgspec.Struct, gc=False):
    phase: str | None = None


class _Pod(msgspec.Struct, gc=False):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _PodSpec = msgspec.field(default_factory=_PodSpec)
    status: _PodStatus = msgspec.field(default_factory=_PodStatus)


class _PodList(msgspec.Struct, gc=False):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_Pod] | None = None


_EPOCH_CACHE_MAX = 4096
_epochs: dict[str, Epoch] = {}


def _parse_epoch(text: str) -> Epoch:
    """``text`` (RFC 3339, read by ``ports.rfc3339_seconds``) as an ``Epoch``, remembered; refused if malformed."""
    if not isinstance(text, str):
        raise NotImplementedError  # msgspec then reports the type error with its path
    seconds = rfc3339_seconds(text)
    if seconds is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")  # msgspec reports it with its path
    value = Epoch(seconds)
    if len(_epochs) >= _EPOCH_CACHE_MAX:
        _epochs.clear()  # a crude bound: the next pages re-fill what they use
    _epochs[text] = value
    return value


def _dec_hook(type_: type, obj: Any, _cached: Callable[[str], Epoch | None] = _epochs.get) -> Any:
    """msgspec's hook for the only custom type of the node decoders (``Epoch``): one lookup when cached.

    This runs for the creation (and deletion) time of every node, so it is as short as it can be.
    """
    return _cached(obj) or _parse_epoch(obj)


_node_decoder = msgspec.json.Decoder(_Node, dec_hook=_dec_hook)
_node_list_decoder = msgspec.json.Decoder(_NodeList, dec_hook=_dec_hook)
_tolerant_node_decoder = msgspec.json.Decoder(_TolerantNode, dec_hook=_dec_hook)
_tolerant_node_list_decoder = msgspec.json.Decoder(_TolerantNodeList, dec_hook=_dec_hook)
_pod_decoder = msgspec.json.Decoder(_Pod)
_pod_list_decoder = msgspec.json.Decoder(_PodList)

_EMPTY: Mapping[str, str] = {}


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _conditions(items: tuple[Condition, ...] | list[_Condition] | None) -> tuple[Condition, ...]:
    if not items:
        return ()
    if type(items) is tuple:
        return items  # decoded as the view's own conditions
    return tuple(Condition(c.type, c.status, c.last_transition_time, c.reason or "", c.message or "")
                 for c in items)  # type: ignore[union-attr]


def _taints(items: tuple[Taint, ...] | list[_Taint] | None) -> tuple[Taint, ...]:
    if not items:
        return ()
    if type(items) is tuple:
        return items  # decoded as the view's own taints
    return tuple(Taint(t.key, t.effect, t.value or "") for t in items)  # type: ignore[union-attr]


def node_view(node: _Node | _TolerantNode) -> NodeView:
    meta, spec, status = node.metadata, node.spec, node.status
    created = meta.creation_timestamp
    return NodeView(
        meta.name, meta.uid, meta.resource_version, meta.labels or {}, meta.annotations or {},
        bool(spec.unschedulable), _taints(spec.taints), _conditions(status.conditions),
        status.allocatable or {}, status.capacity or {}, float(created) if created else 0.0,
        spec.provider_id or "", _float(meta.deletion_timestamp),
        (status.node_info.boot_id or "") if status.node_info is not None else "",
    )


def pod_view(pod: _Pod) -> PodView:
    meta, spec = pod.metadata, pod.spec
    return PodView(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        node_name=spec.node_name or "",
        phase=pod.status.phase or "",
        owners=tuple(OwnerRef(kind=o.kind, name=o.name, controller=bool(o.controller))
                     for o in meta.owner_references or ()),
        annotations=meta.annotations or {},
        labels=meta.labels or {},
        deletion_timestamp=_ts(meta.deletion_timestamp),
        grace_period_seconds=spec.termination_grace_period_seconds,
        has_empty_dir=any(v.empty_dir is not None for v in spec.volumes or ()),
        tolerations=tuple(spec.tolerations or ()),
        node_selector=spec.node_selector or {},
        affinity=spec.affinity or None,
        requests=effective_requests(spec.containers or (), spec.init_containers or ()),
    )


def decode_node(data: bytes) -> NodeView:
    try:
        return node_view(_node_decoder.decode(data))
    except msgspec.ValidationError:
        return node_view(_tolerant_node_decoder.decode(data))


def decode_node_list(data: bytes) -> tuple[list[NodeView], str]:
    """The nodes of one list page and the ``continue`` token ("" on the last page)."""
    try:
        page: _NodeList | _TolerantNodeList = _node_list_decoder.decode(data)
    except msgspec.ValidationError:
        page = _tolerant_node_list_decoder.decode(data)
    return [node_view(n) for n in page.items or ()], page.metadata.continue_ or ""


def decode_pod(data: bytes) -> PodView:
    return pod_view(_pod_decoder.decode(data))


def decode_pod_list(data: bytes) -> tuple[list[PodView], str]:
    page = _pod_list_decoder.decode(data)
    return [pod_view(p) for p in page.items or ()], page.metadata.continue_ or ""


# --------------------------------------------------------------------------- quantities

_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity ("500m", "16Gi", "1e3") as a Decimal."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise Invalid(f"not a resource quantity: {text!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
    except InvalidOperation:
        raise Invalid(f"not a resource quantity: {text!r}") from None


def format_quantity(value: Decimal) -> str:
    """Canonical text for a summed quantity: whole numbers plain, fractions in milli-units."""
    if value == value.to_integral_value():
        return str(int(value))
    millis = (value * 1000).to_integral_value()
    return f"{int(millis)}m"


def effective_requests(containers: Any, init_containers: Any) -> Mapping[str, str]:
    """The pod's effective requests: max(sum over containers, each init container), per resource."""
    total: dict[str, Decimal] = {}
    texts: dict[str, str] = {}
    single = len(containers) == 1 and not init_containers
    for c in containers:
        for name, text in ((c.resources.requests if c.resources else None) or {}).items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(text)
            texts[name] = text
    if single:
        return texts  # the common case: keep the pod's own spelling
    for c in init_containers:
        for name, text in ((c.resources.requests if c.resources else None) or {}).items():
            value = parse_quantity(text)
            if value > total.get(name, Decimal(0)):
                total[name] = value
    return {name: format_quantity(value) for name, value in total.items()}


# --------------------------------------------------------------------------- errors


def _status_message(body: Any) -> tuple[str, str]:
    """``(message, reason)`` of a Kubernetes Status body."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            parsed = json.loads(body)
        except ValueError:
            return body.strip()[:500], ""
        body = parsed
    if isinstance(body, Mapping):
        return str(body.get("message") or "")[:500], str(body.get("reason") or "")
    return "", ""


def _retry_after(headers: Any) -> float | None:
    if not headers:
        return None
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _status_doc(body: Any) -> Mapping[str, Any]:
    """The Kubernetes ``Status`` object of an error body ({} when it is not one)."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {}
    return body if isinstance(body, Mapping) else {}


def _cause_reasons(doc: Mapping[str, Any]) -> set[str]:
    """``details.causes[].reason`` (Go's ``StatusCause.Type``, what ``apierrors.HasStatusCause`` reads)."""
    causes = (doc.get("details") or {}).get("causes") or []
    return {str(c.get("reason") or "") for c in causes if isinstance(c, Mapping)}


# kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go: the only error the Eviction API
# answers with no cause type to tell it apart (errors.NewInternalError), so its fixed text is matched.
_MULTIPLE_PDBS_TEXT = "more than one poddisruptionbudget"


def classify_eviction_error(status: int, body: Any, headers: Any = None) -> EvictionResult | None:
    """What a refused eviction means for a drain, by status, reason and causes; ``None``: a plain error.

    From kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go and the NamespaceLifecycle
    admission plugin (staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle):
    - 429 TooManyRequests: the budget allows no disruption now, or the PDB is not yet observed
      (then with ``Retry-After``) → blocked, retried;
    - 403 with cause ``NamespaceTerminating`` (NamespaceLifecycle refuses creating the Eviction in a
      namespace being deleted) → the namespace controller deletes the pod: wait for it, as kubectl
      drain (staging/src/k8s.io/kubectl/pkg/drain/drain.go evictPods) and Cluster API do;
    - 403 Forbidden on the resource ``poddisruptionbudget`` (``details.kind``; newer servers add a
      ``DisruptionBudget`` cause): ``disruptionsAllowed`` below 0 or ``DisruptedPods`` over its cap →
      blocked by the budget, retried within the drain policy (never "check RBAC");
    - 404 → gone; 500 "more than one PodDisruptionBudget" → multiple_pdbs (not transient).
    Any other 403 (RBAC) and other 5xx are not ours: the caller raises them (Forbidden, Transient).
    """
    doc = _status_doc(body)
    message = str(doc.get("message") or "")
    said = [str(c.get("message") or "") for c in (doc.get("details") or {}).get("causes") or [] if isinstance(c, Mapping)]
    said = [m for m in said if m and m not in message]
    message = (message + (" (" + "; ".join(said) + ")" if said else ""))[:500]
    if not doc and isinstance(body, (str, bytes, bytearray)):
        message = (body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body).strip()[:500]
    details = doc.get("details") or {}
    causes = _cause_reasons(doc)
    if status == 429:
        return EvictionResult(EVICTION_BLOCKED, message or "eviction refused (429)", _retry_after(headers))
    if status == 404:
        return EvictionResult(EVICTION_GONE, message)
    if status == 403:
        if "NamespaceTerminating" in causes:
            return EvictionResult(NAMESPACE_TERMINATING, message)
        if str(details.get("kind") or "") in ("poddisruptionbudget", "poddisruptionbudgets") or "DisruptionBudget" in causes:
            return EvictionResult(EVICTION_BLOCKED, message or "eviction refused by a PodDisruptionBudget (403)",
                                  pdb=str(details.get("name") or ""))
        return None
    if status == 500 and _MULTIPLE_PDBS_TEXT in message.lower():
        return EvictionResult(MULTIPLE_PDBS, message)
    return None


def map_kube_error(error: BaseException, *, what: str) -> StewardError | None:
    """Translate a kubernetes-client / urllib3 exception into a shared.kernel.errors one (None: not ours)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(error, StewardError):
        return error
    if isinstance(error, ApiException):
        status = int(error.status or 0)
        message, reason = _status_message(error.body)
        label = f"{what}: {status} {reason} {message}".strip()
        if status == 429:
            return Throttled(label, retry_after=_retry_after(error.headers))
        if status in (408, 410) or status >= 500 or status == 0:
            return Transient(label, retry_after=_retry_after(error.headers))
        if status == 404:
            return NotFound(label)
        if status == 409:
            return Conflict(label)
        if status in (401, 403):
            return Forbidden(label)
        return Invalid(message or label, code=reason or str(status))
    if isinstance(error, (Urllib3Error, ConnectionError, TimeoutError)):
        return Transient(f"{what}: connection failed ({type(error).__name__})")
    return None


def _escape_field_value(value: str) -> str:
    """A literal as a field selector value (fields.EscapeValue in k8s.io/apimachinery/pkg/fields/selector.go):
    an unescaped ``,`` or ``=`` in a value is a 400 from the server."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


# How often one list call starts again after its continue token expired before it gives up (Transient):
# a list needs to outlast only one compaction interval (5 minutes by default) to finish.
MAX_LIST_RESTARTS = 3


class _ListExpired(Exception):
    """The ``continue`` token of a paginated list expired (410, reason Expired). Not a StewardError, so
    shared.kernel.retry never retries it: the same token can never work again, only a fresh list can."""


def _expiring(fetch: Callable[[], bytes], *, token: str) -> Callable[[], bytes]:
    """``fetch`` with a 410 on a continued page turned into :class:`_ListExpired`. A real API server
    answers 410 Expired once etcd has compacted the list's revision (kubernetes/kubernetes
    staging/src/k8s.io/apiserver/pkg/storage/etcd3/errors.go). Its body may carry an "inconsistent"
    continue token; it is not used: it would mix two revisions silently, and older servers omit it."""
    if not token:
        return fetch

    def run() -> bytes:
        from kubernetes.client.exceptions import ApiException

        try:
            return fetch()
        except ApiException as error:
            if error.status == 410:
                message, reason = _status_message(error.body)
                raise _ListExpired(f"410 {reason} {message}".strip()) from error
            raise

    return run


def _restart_or_give_up(expired: _ListExpired, restarts: int, *, what: str) -> int:
    restarts += 1
    if restarts > MAX_LIST_RESTARTS:
        raise Transient(f"{what}: the list's continue token expired {restarts} times in a row; giving up for now "
                        f"({expired})") from expired
    log.warning("list token expired: listing again from the start", extra={"what": what, "restart": restarts})
    return restarts


def _call(fn: Callable[[], T], *, what: str) -> T:
    try:
        return fn()
    except Exception as error:
        mapped = map_kube_error(error, what=what)
        if mapped is None or mapped is error:
            raise
        raise mapped from error


# --------------------------------------------------------------------------- kubeconfig and tokens


def server_and_ca(kubeconfig: bytes) -> tuple[str, bytes | None, bool]:
    """``(server URL, CA PEM or None, insecure)`` of the current context's cluster; users are ignored.

    The kubeconfig comes from ARM (``listClusterUserCredential``), so it is input, not configuration:
    a kubeconfig that would weaken TLS is refused rather than obeyed (issue 11 §4). The server must be
    an ``https://`` URL with a host; ``insecure-skip-tls-verify`` and ``certificate-authority`` (a file
    path on *this* machine, which ARM has no business naming) are refused; the CA is taken only from
    ``certificate-authority-data`` and must be PEM. Without CA data the connection is still verified,
    against STEWARD_CA_BUNDLE or the system trust store. ``insecure`` is therefore always False; it
    stays in the tuple for KubeClient, which sets ``verify_ssl`` from it.
    """
    import binascii

    import yaml

    try:
        doc = yaml.safe_load(kubeconfig) or {}
    except yaml.YAMLError as error:
        raise Invalid(f"kubeconfig is not YAML: {type(error).__name__}") from None
    if not isinstance(doc, dict):
        raise Invalid("kubeconfig is not a YAML mapping")
    clusters = {c.get("name"): c.get("cluster") or {} for c in doc.get("clusters") or [] if isinstance(c, dict)}
    contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or [] if isinstance(c, dict)}
    context = contexts.get(doc.get("current-context")) or (next(iter(contexts.values())) if contexts else {})
    cluster = clusters.get(context.get("cluster")) or (next(iter(clusters.values())) if clusters else None)
    if not cluster or not cluster.get("server"):
        raise Invalid("kubeconfig has no cluster server")
    server = str(cluster["server"])
    parts = urlsplit(server)
    if parts.scheme.lower() != "https" or not parts.hostname:
        raise Invalid(f"kubeconfig server {server[:100]!r} is not an https:// URL; refusing to send a token to it")
    if parts.username is not None or parts.password is not None:
        raise Invalid("kubeconfig server URL carries credentials; refusing it")
    if cluster.get("insecure-skip-tls-verify") not in (None, False):
        raise Invalid("kubeconfig sets insecure-skip-tls-verify; refusing to connect without verifying the server")
    if cluster.get("certificate-authority") not in (None, ""):
        raise Invalid("kubeconfig names a CA file (certificate-authority); only certificate-authority-data is used")
    ca: bytes | None = None
    if cluster.get("certificate-authority-data"):
        try:
            ca = base64.b64decode(str(cluster["certificate-authority-data"]), validate=True)
        except (binascii.Error, ValueError):
            raise Invalid("kubeconfig certificate-authority-data is not base64") from None
        if b"-----BEGIN CERTIFICATE-----" not in ca:
            raise Invalid("kubeconfig certificate-authority-data is not a PEM certificate")
    return server.rstrip("/"), ca, False


class BearerTokens:
    """A bearer token for one audience, fetched from the credential and refreshed before expiry.

    ``AccessToken.expires_on`` is wall-clock epoch seconds (the simulator scales it for its clock),
    so expiry is judged on the wall clock, not on the fleet clock.
    """

    def __init__(self, credential: TokenCredential, scope: str, *,
                 margin_s: float = _TOKEN_REFRESH_MARGIN_S, wall_clock: Callable[[], float] = time.time) -> None:
        self._credential = credential
        self._scope = scope
        self._margin = margin_s
        self._wall_clock = wall_clock
        self._token: str = ""
        self._expires_on = 0.0
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            if not self._token or self._expires_on - self._margin <= self._wall_clock():
                try:
                    token = self._credential.get_token(self._scope)
                except Exception as error:
                    from shared.adapters.aks import map_arm_error

                    mapped = map_arm_error(error, what=f"token for {self._scope}")
                    raise (mapped or Forbidden(f"token for {self._scope}: {error}")) from error
                self._token, self._expires_on = token.token, float(token.expires_on)
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._token, self._expires_on = "", 0.0


# --------------------------------------------------------------------------- custom objects

# Leases go through the generic object API so that their MicroTime fields are sent exactly as written
# (the typed client re-serialises datetimes without the fraction the API server's MicroTime requires).
_LEASES = ("coordination.k8s.io", "v1", "leases")

# (API group, kind) -> (plural, namespaced): the kinds create/apply/get/delete_object support.
OBJECT_KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("batch", "Job"): ("jobs", True),
    ("karpenter.sh", "NodePool"): ("nodepools", False),
    ("karpenter.azure.com", "AKSNodeClass"): ("aksnodeclasses", False),
}




def _kinds(*keys: tuple[str, str]) -> dict[tuple[str, str], tuple[str, bool]]:
    return {key: OBJECT_KINDS[key] for key in keys}


_JOB, _NODEPOOL, _NODECLASS = ("batch", "Job"), ("karpenter.sh", "NodePool"), ("karpenter.azure.com", "AKSNodeClass")
# Which kinds each generic method handles: the app's calls, per kind (shared.pools.creation: the sample
# Job is created, read and deleted; Karpenter objects are applied, read and, for a failed pool, deleted).
# Each method refuses every other kind, so its declared rules are exactly its calls.
CREATE_KINDS = _kinds(_JOB)
APPLY_KINDS = _kinds(_NODEPOOL, _NODECLASS)
READ_KINDS = _kinds(_JOB, _NODEPOOL, _NODECLASS)
DELETE_KINDS = _kinds(_JOB, _NODEPOOL, _NODECLASS)


def _kind_of(api_version: str, kind: str) -> tuple[str, str, str, bool]:
    group, _, version = api_version.rpartition("/")
    try:
        plural, namespaced = OBJECT_KINDS[(group, kind)]
    except KeyError:
        supported = ", ".join(f"{g}/{k}" for g, k in OBJECT_KINDS)
        raise Invalid(f"unsupported object kind {api_version} {kind} (supported: {supported})") from None
    return group, version, plural, namespaced


def _rfc3339(epoch: float, *, micro: bool = False) -> str:
    moment = datetime.fromtimestamp(epoch, tz=UTC)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# --------------------------------------------------------------------------- the adapter


# Characters a query value keeps as they are: ``/`` and ``=`` of label selectors (``a.b/c=d``) and the
# ``,`` and ``:`` of selector lists; all are legal in an RFC 3986 query and mean nothing to the server's
# parser there. A value needing ``%`` escapes still gets them (and urllib3's slower, careful path).
_QUERY_SAFE = "/=,:"


class KubeClient:
    """KubePort for one cluster."""

    def __init__(self, kubeconfig: bytes, credential: TokenCredential, *, server_app_id: str,
                 ca_bundle: str = "", clock: Clock | None = None, cluster_id: str = "",
                 retry_attempts: int = 4, retry_max_delay: float = 30.0,
                 namespace: str = DEFAULT_APP_NAMESPACE) -> None:
        import urllib3
        from kubernetes import client as k8s

        server, ca, insecure = server_and_ca(kubeconfig)
        self.server = server
        self.namespace = namespace or DEFAULT_APP_NAMESPACE  # the app's own (STEWARD_NAMESPACE)
        self.cluster_id = cluster_id
        self._clock = clock
        self._attempts = retry_attempts
        self._max_delay = retry_max_delay
        self._tokens = BearerTokens(credential, server_app_id + "/.default")

        config = k8s.Configuration(host=server)
        if ca is not None:
            config.ca_cert_data = ca.decode("ascii")
        elif ca_bundle:
            config.ssl_ca_cert = ca_bundle
        config.verify_ssl = not insecure
        config.retries = 0  # shared.kernel.retry decides
        config.api_key = {"authorization": ""}
        config.api_key_prefix = {"authorization": "Bearer"}
        tokens = self._tokens

        def refresh(cfg: Any) -> None:
            cfg.api_key["authorization"] = tokens.get()

        config.refresh_api_key_hook = refresh
        self._api = k8s.ApiClient(config)
        self._api.user_agent = "gpu-fleet-steward"
        self._core = k8s.CoreV1Api(self._api)
        self._policy = k8s.PolicyV1Api(self._api)
        self._custom = k8s.CustomObjectsApi(self._api)
        self._http_timeout = urllib3.Timeout(connect=_TIMEOUT[0], read=_TIMEOUT[1])
        # The server's own connection pool for _get_json; None behind a proxy, which needs absolute URLs.
        manager = self._api.rest_client.pool_manager
        self._pool: Any = None if isinstance(manager, urllib3.ProxyManager) else manager.connection_from_url(server)
        self._path_prefix = urlsplit(server).path.rstrip("/")

    # -- plumbing

    def _now(self) -> float:
        from shared.kernel import clock as clocks

        return (self._clock or clocks.current()).now()

    def _once(self, fn: Callable[[], T], *, what: str) -> T:
        """One call; a 401 gets one fresh token and one more try (a token revoked early)."""
        try:
            return _call(fn, what=what)
        except Forbidden as error:
            if " 401 " not in f" {error} ":
                raise
            self._tokens.invalidate()
            return _call(fn, what=what)

    def _run(self, fn: Callable[[], T], *, what: str) -> T:
        from shared.kernel import clock as clocks

        return retry.call(self._once, fn, what=what, clock=self._clock or clocks.current(),
                          attempts=self._attempts, max_delay=self._max_delay)

    @staticmethod
    def _body(response: Any) -> bytes:
        data = response.data
        return bytes(data) if data is not None else b""

    def close(self) -> None:
        self._api.close()

    def _get_json(self, path: str, query: Mapping[str, str | int | None]) -> bytes:
        """GET a JSON body through the client's own urllib3 pool, skipping its request machinery.

        Same connection pool (TLS settings, proxy, keep-alive), same bearer token, same errors (an
        ``ApiException`` for a non-2xx answer): only the per-call validation and header building of
        the generated API class is skipped, which at small pages costs more than decoding them.
        Without a proxy the request goes straight to the server's connection pool with its target
        already encoded (``/`` and ``=`` of a label selector left as they are, as RFC 3986 allows in
        a query), so urllib3 neither parses the URL nor re-encodes it character by character; no
        urllib3 retries either: shared.kernel.retry decides.
        """
        from kubernetes.client.exceptions import ApiException

        params = urlencode({k: v for k, v in query.items() if v is not None and v != ""},
                           quote_via=quote, safe=_QUERY_SAFE)
        headers = {"Accept": "application/json", "User-Agent": self._api.user_agent,
                   "Authorization": f"Bearer {self._tokens.get()}"}
        target = f"{path}?{params}" if params else path
        if self._pool is not None:
            response = self._pool.urlopen("GET", self._path_prefix + target, headers=headers, retries=False,
                                          timeout=self._http_timeout, preload_content=True)
        else:
            response = self._api.rest_client.pool_manager.request(
                "GET", self.server + target, headers=headers, timeout=self._http_timeout, preload_content=True)
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        return response.data or b""

    # -- nodes

    @requires_kube("", "nodes", "list")
    def list_nodes(self, *, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]:
        """GPU nodes one page at a time; a page is released before the next one is fetched.

        An expired ``continue`` token (410 Expired: etcd was compacted past the list's revision while
        the pages were being read) restarts the list from scratch, at most ``MAX_LIST_RESTARTS`` times
        (then ``Transient``). What a restart means for the consumer: every node is still handed over at
        most once per call (the names already handed over are skipped), but the list is no longer one
        snapshot: the nodes handed over before the restart are as they were then, the rest as they are
        in the new list; a node created meanwhile appears, a node deleted meanwhile may already have
        been handed over. The sweep, which judges each node on its own, is exact under that reading.
        """
        what = f"list nodes of {self.cluster_id or self.server}"
        token = ""
        seen: set[str] = set()
        restarts = 0
        while True:
            query = {"labelSelector": label_selector, "limit": page_size, "continue": token}
            try:
                data = self._run(_expiring(lambda q=query: self._get_json("/api/v1/nodes", q), token=token),
                                 what=what)
            except _ListExpired as expired:
                restarts = _restart_or_give_up(expired, restarts, what=what)
                token = ""
                continue
            nodes, token = decode_node_list(data)
            nodes.reverse()
            while nodes:  # hand each node over and forget it, so that only the consumer keeps the page
                node = nodes.pop()
                if node.name in seen:
                    continue  # handed over before a restart
                seen.add(node.name)
                yield node
            if not token:
                return

    @requires_kube("", "nodes", "get")
    def get_node(self, name: str) -> NodeView | None:
        try:
            data = self._run(lambda: self._body(self._core.read_node(name, _preload_content=False,
                                                                      _request_timeout=_TIMEOUT)),
                             what=f"get node {name}")
        except NotFound:
            return None
        return decode_node(data)

    @requires_kube("", "nodes", "patch")
    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        data = self._run(lambda: self._body(self._core.patch_node(
            name, dict(patch), _content_type="application/strategic-merge-patch+json",
            _preload_content=False, _request_timeout=_TIMEOUT)), what=f"patch node {name}")
        return decode_node(data)

    # -- pods

    @requires_kube("", "pods", "list")
    def list_pods(self, *, node_name: str | None = None, namespace: str | None = None,
                  label_selector: str = "", page_size: int = 500) -> list[PodView]:
        field_selector = f"spec.nodeName={_escape_field_value(node_name)}" if node_name else None
        what = f"list pods ({node_name or namespace or 'all'})"
        pods: list[PodView] = []
        token = ""
        restarts = 0
        while True:
            def fetch(page_token: str = token) -> bytes:
                common: dict[str, Any] = {
                    "field_selector": field_selector, "label_selector": label_selector or None, "limit": page_size,
                    "_continue": page_token or None, "_preload_content": False, "_request_timeout": _TIMEOUT}
                if namespace:
                    return self._body(self._core.list_namespaced_pod(namespace, **common))
                return self._body(self._core.list_pod_for_all_namespaces(**common))

            try:
                data = self._run(_expiring(fetch, token=token), what=what)
            except _ListExpired as expired:  # the list starts again from scratch: one consistent list
                restarts = _restart_or_give_up(expired, restarts, what=what)
                pods, token = [], ""
                continue
            page, token = decode_pod_list(data)
            pods.extend(page)
            if not token:
                return pods

    @requires_kube("", "pods/eviction", "create")
    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        from kubernetes.client.exceptions import ApiException

        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if grace_period_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": int(grace_period_seconds)}

        def post() -> EvictionResult:
            try:
                self._body(self._core.create_namespaced_pod_eviction(
                    name, namespace, body, _preload_content=False, _request_timeout=_TIMEOUT))
            except ApiException as error:
                result = classify_eviction_error(int(error.status or 0), error.body, error.headers)
                if result is None:
                    raise  # an RBAC 403, a 5xx, ...: map_kube_error decides (Forbidden, Transient)
                return result
            return EvictionResult(EVICTED)

        return self._run(post, what=f"evict {namespace}/{name}")

    @requires_kube("policy", "poddisruptionbudgets", "list")
    def list_pdbs(self, namespace: str | None = None) -> list[Mapping[str, Any]]:
        def fetch() -> bytes:
            if namespace:
                return self._body(self._policy.list_namespaced_pod_disruption_budget(
                    namespace, _preload_content=False, _request_timeout=_TIMEOUT))
            return self._body(self._policy.list_pod_disruption_budget_for_all_namespaces(
                _preload_content=False, _request_timeout=_TIMEOUT))

        doc = json.loads(self._run(fetch, what=f"list PDBs ({namespace or 'all'})") or b"{}")
        return list(doc.get("items") or [])

    # -- events

    @requires_kube("", "events", "create", namespaced=True)
    def create_event(self, *, node: NodeView | str, reason: str, message: str, type_: str = "Normal",
                     action: str = "", correlation_id: str = "") -> None:
        name = node if isinstance(node, str) else node.name
        uid = "" if isinstance(node, str) else node.uid
        now = self._now()
        involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "name": name}
        if uid:
            involved["uid"] = uid
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": self.namespace,
                         "annotations": {"gpu-fleet-steward/correlation-id": correlation_id} if correlation_id else {}},
            "involvedObject": involved, "reason": reason, "message": message[:1024], "type": type_,
            "action": action or reason, "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT, "reportingInstance": EVENT_COMPONENT,
            "firstTimestamp": _rfc3339(now), "lastTimestamp": _rfc3339(now), "count": 1,
        }
        try:
            # In the app's namespace: an Event about a cluster-scoped Node may live in any namespace, and
            # `kubectl describe node` searches every namespace for it (kubectl describe.go searchEvents).
            _call(lambda: self._core.create_namespaced_event(self.namespace, body, _preload_content=False,
                                                             _request_timeout=_TIMEOUT).data,
                  what=f"event {reason} on node {name}")
        except Exception as error:  # events are auxiliary: log and carry on
            log.warning("could not record a Kubernetes event", extra={"node": name, "reason": reason,
                                                                      "error": str(error)[:300]})

    # -- leases

    @requires_kube("coordination.k8s.io", "leases", "get", "create", "update", namespaced=True)
    def acquire_lease(self, name: str, *, holder: str, duration_s: int, namespace: str | None = None) -> bool:
        """Take or renew the lease (in the app's namespace unless told); False when someone else holds
        it or won the race."""
        namespace = namespace or self.namespace
        now = self._now()
        spec = {"holderIdentity": holder, "leaseDurationSeconds": int(duration_s),
                "renewTime": _rfc3339(now, micro=True)}
        what = f"lease {namespace}/{name}"
        try:
            current = json.loads(self._run(lambda: self._body(self._custom.get_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, _preload_content=False, _request_timeout=_TIMEOUT)), what=what))
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {**spec, "acquireTime": _rfc3339(now, micro=True), "leaseTransitions": 0}}
            try:
                _call(lambda: self._body(self._custom.create_namespaced_custom_object(
                    *_LEASES[:2], namespace, _LEASES[2], body, _preload_content=False, _request_timeout=_TIMEOUT)), what=what)
            except Conflict:
                return False
            return True
        held = current.get("spec") or {}
        other = held.get("holderIdentity") or ""
        renewed = _parse_time(held.get("renewTime")) or _parse_time(held.get("acquireTime")) or 0.0
        expired = renewed + float(held.get("leaseDurationSeconds") or 0) <= now
        if other and other != holder and not expired:
            return False
        new_spec = dict(held)
        new_spec.update(spec)
        if other != holder:
            new_spec["acquireTime"] = _rfc3339(now, micro=True)
            new_spec["leaseTransitions"] = int(held.get("leaseTransitions") or 0) + 1
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace,
                             "resourceVersion": (current.get("metadata") or {}).get("resourceVersion", "")},
                "spec": new_spec}
        try:
            _call(lambda: self._body(self._custom.replace_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, body, _preload_content=False, _request_timeout=_TIMEOUT)), what=what)
        except (Conflict, NotFound):
            return False
        return True

    @requires_kube("coordination.k8s.io", "leases", "get", "update", namespaced=True)
    def release_lease(self, name: str, *, holder: str, namespace: str | None = None) -> None:
        """Give the lease up if we hold it (clears the holder; the object stays for the next taker)."""
        namespace = namespace or self.namespace
        what = f"lease {namespace}/{name}"
        try:
            current = json.loads(self._run(lambda: self._body(self._custom.get_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, _preload_content=False, _request_timeout=_TIMEOUT)), what=what))
        except NotFound:
            return
        held = dict(current.get("spec") or {})
        if held.get("holderIdentity") != holder:
            return
        held["holderIdentity"] = None
        held["renewTime"] = None
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace,
                             "resourceVersion": (current.get("metadata") or {}).get("resourceVersion", "")},
                "spec": held}
        try:
            _call(lambda: self._body(self._custom.replace_namespaced_custom_object(
                *_LEASES[:2], namespace, _LEASES[2], name, body, _preload_content=False, _request_timeout=_TIMEOUT)), what=what)
        except (Conflict, NotFound):
            return  # someone took it over meanwhile: it is not ours to release any more

    # -- objects (Jobs, Karpenter)

    def _object_args(self, api_version: str, kind: str, namespace: str | None, *,
                     method: Callable[..., Any]) -> tuple[str, str, str, str | None]:
        """The call's (group, version, plural, namespace); a kind ``method`` did not declare (its
        ``requires_kube_kinds`` table) is refused here, before any request: the grants are per kind."""
        group, version, plural, namespaced = _kind_of(api_version, kind)
        if not kind_allowed(method, group, kind):
            raise Invalid(f"{method.__name__} does not handle {api_version} {kind}: the app declares (and is granted) "
                          "it for other kinds only")
        if namespaced and not namespace:
            namespace = self.namespace
        return group, version, plural, namespace if namespaced else None

    def _create(self, obj: Mapping[str, Any], *, method: Callable[..., Any]) -> Mapping[str, Any]:
        meta = obj.get("metadata") or {}
        group, version, plural, ns = self._object_args(str(obj.get("apiVersion", "")), str(obj.get("kind", "")),
                                                       meta.get("namespace"), method=method)
        body = dict(obj)
        if ns is not None:
            response = self._custom.create_namespaced_custom_object(
                group, version, ns, plural, body, field_manager=FIELD_MANAGER,
                _preload_content=False, _request_timeout=_TIMEOUT)
        else:
            response = self._custom.create_cluster_custom_object(
                group, version, plural, body, field_manager=FIELD_MANAGER,
                _preload_content=False, _request_timeout=_TIMEOUT)
        return dict(json.loads(self._body(response) or b"{}"))

    @requires_kube_kinds(CREATE_KINDS, "create")
    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create a sample Job (the only kind the app creates outright)."""
        name = (obj.get("metadata") or {}).get("name", "")
        return self._run(lambda: self._create(obj, method=KubeClient.create_object),
                         what=f"create {obj.get('kind')} {name}")

    @requires_kube_kinds(APPLY_KINDS, "get", "create", "update")
    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create or replace a Karpenter NodePool or AKSNodeClass (node auto-provisioning pools)."""
        meta = dict(obj.get("metadata") or {})
        api_version, kind, name = str(obj.get("apiVersion", "")), str(obj.get("kind", "")), str(meta.get("name", ""))
        method = KubeClient.apply_object
        group, version, plural, ns = self._object_args(api_version, kind, meta.get("namespace"), method=method)
        what = f"apply {kind} {name}"

        def once() -> Mapping[str, Any]:
            existing = self._get(api_version, kind, name, ns, method=method)
            if existing is None:
                try:
                    return self._create(obj, method=method)
                except Exception as error:
                    mapped = map_kube_error(error, what=what)
                    if not isinstance(mapped, Conflict):
                        raise
                    existing = self._get(api_version, kind, name, ns, method=method)
                    if existing is None:
                        raise Transient(f"{what}: created and deleted concurrently") from error
            body = dict(obj)
            body["metadata"] = {**meta, "resourceVersion": (existing.get("metadata") or {}).get("resourceVersion")}
            if ns is not None:
                response = self._custom.replace_namespaced_custom_object(
                    group, version, ns, plural, name, body, field_manager=FIELD_MANAGER,
                    _preload_content=False, _request_timeout=_TIMEOUT)
            else:
                response = self._custom.replace_cluster_custom_object(
                    group, version, plural, name, body, field_manager=FIELD_MANAGER,
                    _preload_content=False, _request_timeout=_TIMEOUT)
            return dict(json.loads(self._body(response) or b"{}"))

        return self._run(once, what=what)

    def _get(self, api_version: str, kind: str, name: str, namespace: str | None, *,
             method: Callable[..., Any]) -> Mapping[str, Any] | None:
        group, version, plural, ns = self._object_args(api_version, kind, namespace, method=method)
        try:
            if ns is not None:
                response = _call(lambda: self._custom.get_namespaced_custom_object(
                    group, version, ns, plural, name, _preload_content=False, _request_timeout=_TIMEOUT),
                    what=f"get {kind} {name}")
            else:
                response = _call(lambda: self._custom.get_cluster_custom_object(
                    group, version, plural, name, _preload_content=False, _request_timeout=_TIMEOUT),
                    what=f"get {kind} {name}")
        except NotFound:
            return None
        return dict(json.loads(self._body(response) or b"{}"))

    @requires_kube_kinds(READ_KINDS, "get")
    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        return self._run(lambda: self._get(api_version, kind, name, namespace, method=KubeClient.get_object),
                         what=f"get {kind} {name}")

    @requires_kube_kinds(DELETE_KINDS, "delete")
    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None:
        """Delete a sample Job, or the NodePool/AKSNodeClass of a failed node auto-provisioning pool.

        ``uid``: delete only the object with this uid (``DeleteOptions.preconditions``); an object that
        took the name since it was read answers 409, which is raised as Conflict and deletes nothing.
        """
        group, version, plural, ns = self._object_args(api_version, kind, namespace, method=KubeClient.delete_object)
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            options["preconditions"] = {"uid": uid}

        def delete() -> None:
            if ns is not None:
                self._body(self._custom.delete_namespaced_custom_object(
                    group, version, ns, plural, name, body=options, _preload_content=False,
                    _request_timeout=_TIMEOUT))
            else:
                self._body(self._custom.delete_cluster_custom_object(
                    group, version, plural, name, body=options, _preload_content=False,
                    _request_timeout=_TIMEOUT))

        try:
            self._run(delete, what=f"delete {kind} {name}")
        except NotFound:
            return

    @requires_kube("karpenter.sh", "nodeclaims", "list", "delete")
    def delete_nodeclaim(self, *, node_name: str, provider_id: str) -> str | None:
        """Delete the Karpenter NodeClaim behind a node; its name, or None when no claim matches.

        The claim is found by ``status.providerID`` (the node's ``spec.providerID``), else by
        ``status.nodeName``. Deleting it is how a node auto-provisioning node is replaced: Karpenter's
        termination controller (finalizer ``karpenter.sh/termination``) drains and deletes the node and
        its VM, and provisions a new node when pods need one (kubernetes-sigs/karpenter
        pkg/controllers/node/termination). Idempotent: a claim already being deleted is deleted again
        harmlessly, and the delete carries the claim's uid as a precondition, so a new claim that took
        the same name is never deleted by mistake.
        """

        def find() -> Mapping[str, Any] | None:
            response = self._custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims",
                                                               _preload_content=False, _request_timeout=_TIMEOUT)
            items = json.loads(self._body(response) or b"{}").get("items") or []
            by_name = None
            for item in items:
                status = item.get("status") or {}
                if provider_id and status.get("providerID") == provider_id:
                    return dict(item)
                if node_name and status.get("nodeName") == node_name:
                    by_name = dict(item)
            return by_name

        claim = self._run(find, what=f"find the NodeClaim of {node_name}")
        if claim is None:
            return None
        meta = claim.get("metadata") or {}
        name = str(meta.get("name", ""))
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
                   "preconditions": {"uid": meta.get("uid")}}
        try:
            self._run(lambda: self._body(self._custom.delete_cluster_custom_object(
                "karpenter.sh", "v1", "nodeclaims", name, body=options, _preload_content=False,
                _request_timeout=_TIMEOUT)), what=f"delete NodeClaim {name}")
        except NotFound:
            return name  # already gone
        return name

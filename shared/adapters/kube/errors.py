"""Kubernetes API answers as shared.kernel.errors types, and the Eviction API's refusals as outcomes.

Decided by the HTTP status and the ``Status`` body's ``reason`` and ``details.causes[].reason``
(k8s.io/apimachinery/pkg/apis/meta/v1/types.go ``Status``, ``StatusCause``), never by message text,
with one documented exception (the multiple-PDB 500, which carries nothing else). 401 is
:class:`Unauthorized` (the client fetches a fresh token once), a 403 caused by ``NamespaceTerminating``
is :class:`NamespaceTerminating`, other 401/403 :class:`Forbidden`; 429 :class:`Throttled` and
408/410/5xx :class:`Transient` carry ``Retry-After``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shared.kernel.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NamespaceTerminating,
    NotFound,
    StewardError,
    Throttled,
    Transient,
    Unauthorized,
)
from shared.kernel.ports import (
    EVICTION_BLOCKED,
    EVICTION_GONE,
    MULTIPLE_PDBS,
    NAMESPACE_TERMINATING,
    EvictionResult,
)

T = TypeVar("T")


def status_message(body: Any) -> tuple[str, str]:
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


def retry_after_header(headers: Any) -> float | None:
    """The server's ``Retry-After`` in seconds (None when absent or not a number of seconds)."""
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
        return EvictionResult(EVICTION_BLOCKED, message or "eviction refused (429)", retry_after_header(headers))
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
        message, reason = status_message(error.body)
        label = f"{what}: {status} {reason} {message}".strip()
        if status == 429:
            return Throttled(label, retry_after=retry_after_header(error.headers))
        if status in (408, 410) or status >= 500 or status == 0:
            return Transient(label, retry_after=retry_after_header(error.headers))
        if status == 404:
            return NotFound(label)
        if status == 409:
            return Conflict(label)
        if status == 401:
            return Unauthorized(label)
        if status == 403:
            if "NamespaceTerminating" in _cause_reasons(_status_doc(error.body)):
                return NamespaceTerminating(label)
            return Forbidden(label)
        return Invalid(message or label, code=reason or str(status))
    if isinstance(error, (Urllib3Error, ConnectionError, TimeoutError)):
        return Transient(f"{what}: connection failed ({type(error).__name__})")
    return None



class ListExpired(Exception):
    """The ``continue`` token of a paginated list expired (410, reason Expired). Not a StewardError, so
    shared.kernel.retry never retries it: the same token can never work again, only a fresh list can."""


def expiring(fetch: Callable[[], bytes], *, token: str) -> Callable[[], bytes]:
    """``fetch`` with a 410 on a continued page turned into :class:`ListExpired`. A real API server
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
                message, reason = status_message(error.body)
                raise ListExpired(f"410 {reason} {message}".strip()) from error
            raise

    return run



def call_kube(fn: Callable[[], T], *, what: str) -> T:
    """Run one kubernetes-client call, raising its failure as a shared.kernel.errors type."""
    try:
        return fn()
    except Exception as error:
        mapped = map_kube_error(error, what=what)
        if mapped is None or mapped is error:
            raise
        raise mapped from error


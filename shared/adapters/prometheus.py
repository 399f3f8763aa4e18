"""One PromQL instant query against an Azure Monitor workspace (or any Prometheus HTTP API).

Why it is built this way:

- **One call, one answer.** ``POST {endpoint}/api/v1/query`` with the form-encoded ``query`` (the
  Prometheus HTTP API, https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries;
  the Azure Monitor workspace accepts GET and POST on the same path, MicrosoftDocs/azure-monitor-docs
  articles/azure-monitor/metrics/prometheus-api-promql.md). POST keeps a long selector out of URLs
  and proxy logs. No urllib3 retries: shared.kernel.retry decides.
- **Auth** is a bearer token from a callable (the app's managed identity for
  ``https://prometheus.monitor.azure.com/.default``; the role is Monitoring Data Reader on the
  workspace), asked for on every call so the credential's own cache and refresh apply.
- **Decoding** uses msgspec Structs for the envelope ``{"status", "data", "errorType", "error",
  "warnings", "infos"}`` and, for ``resultType == "vector"`` only, the samples ``{"metric": {...},
  "value": [<unix ts>, "<value>"]}``.
- **Errors** become shared.kernel.errors, from the HTTP status and Prometheus' ``errorType``
  (prometheus/prometheus web/api/v1/api.go ``respondError``: bad_data→400, execution→422,
  timeout/canceled→503 (499), internal→500): 429 → Throttled (Retry-After), 5xx/499/408, timeouts,
  dropped connections → Transient, 400/422 → Invalid (``code`` = errorType), 401/403 → Forbidden,
  404 → NotFound (a wrong endpoint path).
- **Never "no errors" by accident.** A failed answer raises. So does a *partial* one: ``warnings``
  is where Prometheus-compatible servers report data they could not fetch, so an answer with
  warnings raises Transient rather than being read as the whole truth; ``infos`` (query hints) do
  not. A success with another result type, a malformed body or a sample whose value is not a
  number raises Invalid. Only a well-formed, warning-free vector is returned, and an empty vector
  then really means "no series matched".
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import msgspec

from shared.kernel.errors import Forbidden, Invalid, NotFound, StewardError, Throttled, Transient
from shared.kernel.ports import Sample

__all__ = ["AZURE_MONITOR_PROMETHEUS_RESOURCE", "InstantResult", "PrometheusClient", "PrometheusMetrics", "Sample",
           "decode_instant", "map_prometheus_error"]

#: The Entra resource of every Azure Monitor workspace query endpoint (token scope: ``.../.default``).
AZURE_MONITOR_PROMETHEUS_RESOURCE = "https://prometheus.monitor.azure.com"
QUERY_PATH = "/api/v1/query"
_MAX_ERROR_TEXT = 300


class _Envelope(msgspec.Struct):
    status: str
    data: msgspec.Raw = msgspec.Raw()  # empty when absent (``Raw | None`` does not decode)
    errorType: str | None = None
    error: str | None = None
    warnings: list[str] | None = None
    infos: list[str] | None = None


class _Data(msgspec.Struct):
    resultType: str
    result: msgspec.Raw


class _WireSample(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, str]


_envelope = msgspec.json.Decoder(_Envelope)
_data = msgspec.json.Decoder(_Data)
_vector = msgspec.json.Decoder(list[_WireSample])


@dataclass(frozen=True)
class InstantResult:
    """A complete instant-vector answer; ``infos`` are the server's query hints (never data loss)."""

    samples: tuple[Sample, ...]
    infos: tuple[str, ...] = ()


def _retry_after(headers: Mapping[str, str] | Any) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date (RFC 9110 section 10.2.3)."""
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_ERROR_TEXT else text[:_MAX_ERROR_TEXT] + "..."


def map_prometheus_error(status: int, body: bytes, headers: Mapping[str, str] | Any, *, what: str) -> StewardError:
    """The kernel error for a non-2xx answer (or a 2xx whose envelope says ``"error"``)."""
    error_type, message = "", ""
    try:
        env = _envelope.decode(body)
        error_type, message = env.errorType or "", env.error or ""
    except (msgspec.DecodeError, msgspec.ValidationError):
        message = body.decode("utf-8", "replace")
    label = _short(f"{what}: HTTP {status} {error_type or ''} {message}".replace("  ", " "))
    if status == 429:
        return Throttled(label, retry_after=_retry_after(headers))
    if status in (401, 403):
        return Forbidden(label)
    if status == 404:
        return NotFound(label)
    if status in (400, 422):
        return Invalid(label, code=error_type or ("bad_data" if status == 400 else "execution"))
    if status >= 500 or status in (408, 499):
        return Transient(label, retry_after=_retry_after(headers))
    if error_type in ("timeout", "canceled", "unavailable", "internal"):
        return Transient(label)
    return Invalid(label, code=error_type or None)


def decode_instant(body: bytes, *, what: str = "PromQL query") -> InstantResult:
    """Decode a 2xx answer into samples, or raise (see the module docstring: partial is not complete)."""
    try:
        env = _envelope.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Invalid(_short(f"{what}: the answer is not a Prometheus API envelope ({exc})"), code="decode") from None
    if env.status == "error":
        raise map_prometheus_error(200, body, {}, what=what)
    if env.status != "success":
        raise Invalid(_short(f"{what}: unknown answer status {env.status!r}"), code="decode")
    if env.warnings:
        raise Transient(_short(f"{what}: partial answer, the server warned: {'; '.join(env.warnings)}"))
    if not env.data or bytes(env.data) == b"null":
        raise Invalid(f"{what}: a success without data", code="decode")
    try:
        data = _data.decode(env.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Invalid(_short(f"{what}: malformed data ({exc})"), code="decode") from None
    if data.resultType != "vector":
        raise Invalid(f"{what}: expected an instant vector, got resultType {data.resultType!r}", code="result_type")
    try:
        wire = _vector.decode(data.result)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Invalid(_short(f"{what}: malformed vector ({exc})"), code="decode") from None
    samples = []
    for item in wire:
        try:
            value = float(item.value[1])  # "NaN", "+Inf" and "-Inf" are valid Prometheus values
        except ValueError:
            raise Invalid(_short(f"{what}: sample value {item.value[1]!r} is not a number"), code="decode") from None
        samples.append(Sample(labels=dict(item.metric), value=value, at=float(item.value[0])))
    return InstantResult(tuple(samples), tuple(env.infos or ()))


class PrometheusClient:
    """Instant queries against one query endpoint (``https://<ws>.<region>.prometheus.monitor.azure.com``).

    ``token`` returns a bearer token (called per query); ``timeout_s`` bounds connect and read.
    ``pool`` is a urllib3 PoolManager (one per process is enough; tests pass their own).
    """

    def __init__(self, endpoint: str, token: Callable[[], str], *, timeout_s: float = 30.0, pool: Any = None) -> None:
        endpoint = endpoint.strip().rstrip("/")
        if not endpoint.startswith(("https://", "http://")):
            raise ValueError(f"a Prometheus query endpoint is an http(s) URL, got {endpoint!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        import urllib3

        self.endpoint = endpoint
        self._token = token
        self._timeout = urllib3.Timeout(connect=min(timeout_s, 10.0), read=timeout_s)
        self._pool = pool if pool is not None else urllib3.PoolManager(retries=False)

    def query(self, promql: str, *, at: float | None = None) -> InstantResult:
        """Run one instant query (evaluated at ``at``, unix seconds, or the server's now)."""
        import urllib3

        what = f"PromQL query to {self.endpoint}"
        form: dict[str, str] = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json",
                   "Content-Type": "application/x-www-form-urlencoded"}
        try:
            response = self._pool.request("POST", self.endpoint + QUERY_PATH, body=urlencode(form).encode(),
                                          headers=headers, timeout=self._timeout, retries=False, redirect=False,
                                          preload_content=True)
        except urllib3.exceptions.HTTPError as exc:  # timeouts, refused or dropped connections, bad TLS
            raise Transient(_short(f"{what}: {type(exc).__name__}: {exc}")) from None
        status, body = int(response.status), bytes(response.data or b"")
        if not 200 <= status < 300:
            raise map_prometheus_error(status, body, response.headers, what=what)
        return decode_instant(body, what=what)


class PrometheusMetrics:
    """The MetricsPort (shared.kernel.ports) over one :class:`PrometheusClient`: the samples of a
    complete answer; the query hints (``infos``) are logged by nobody and dropped here."""

    def __init__(self, client: PrometheusClient) -> None:
        self.client = client

    def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        return list(self.client.query(promql, at=at).samples)

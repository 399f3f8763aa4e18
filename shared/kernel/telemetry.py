"""Structured logs with correlation ids, and the app's OpenTelemetry metrics.

Operators follow one pool request or one remediation across invocations by its correlation id
(the queue message id, the CloudEvent id, or a fresh one per timer run), which every log record
of the ``steward`` loggers carries. Secrets never reach a log line: connection strings, keys, SAS
signatures and bearer tokens are scrubbed from every record before it is emitted.

Metrics (the fleet's health in numbers): ``time_to_detect_s``, ``drain_time_s``,
``time_to_repair_s`` (histograms), ``remediations_in_flight``, ``breaker_open`` (gauges),
``pool_requests_total{outcome}``, ``migrations_total{outcome}`` (counters); any other name the
jobs record is created on first use (``*_s`` as a histogram, else a counter). They are exported to
Application Insights only when APPLICATIONINSIGHTS_CONNECTION_STRING is set (the exporter is
imported then, not before); tests read them from an in-memory reader.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from opentelemetry.metrics import Counter, Histogram

class _Gauge(Protocol):
    """What ``Meter.create_gauge`` returns (the synchronous gauge), named by what is used of it: the API names
    its class only privately (opentelemetry-api 1.45 ``opentelemetry.metrics._Gauge``, still experimental)."""

    def set(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None: ...


log = logging.getLogger("steward")

# --------------------------------------------------------------------------- correlation ids

_correlation: contextvars.ContextVar[str] = contextvars.ContextVar("steward_correlation_id", default="")


def correlation_id() -> str:
    """The current correlation id ("" outside any :func:`correlation` block)."""
    return _correlation.get()


@contextlib.contextmanager
def correlation(id_: str | None = None) -> Iterator[str]:
    """Run a block under ``id_`` (a fresh id when None); nested blocks restore the outer id."""
    token = _correlation.set(id_ or uuid.uuid4().hex)
    try:
        yield _correlation.get()
    finally:
        _correlation.reset(token)


# --------------------------------------------------------------------------- scrubbing

_SECRETS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(AccountKey|SharedAccessKey|SharedAccessSignature|InstrumentationKey|Password|ClientSecret)"
                r"\s*=\s*[^;\s\"']+"), r"\1=***"),
    (re.compile(r"(?i)([?&](?:sig|se|sv|sp|skoid|sktid)=)[^&\s\"']+"), r"\1***"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), "***jwt***"),
    (re.compile(r"(?i)(\"?(?:access_token|refresh_token|token|authorization)\"?\s*[:=]\s*\"?)[^\s\",;]{8,}"), r"\1***"),
)


def scrub(text: str) -> str:
    """``text`` with keys, signatures and tokens replaced by ``***``."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime",
                                                                                        "correlation_id"}


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra=`` fields of a record."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


_installed = False
_install_lock = threading.Lock()


def install_log_record_factory() -> None:
    """Give every log record the correlation id and a scrubbed message (idempotent, process-wide)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        previous: Callable[..., logging.LogRecord] = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            record.correlation_id = _correlation.get()
            try:
                message = record.getMessage()
            except Exception:  # a bad format string must not break logging
                return record
            cleaned = scrub(message)
            if cleaned != message or record.args:
                record.msg, record.args = cleaned, None
            return record

        logging.setLogRecordFactory(factory)
        # azure-core logs every request's and response's headers at INFO: about fifteen lines per ARM
        # or Kubernetes call, which would drown the app's own lines (and cost ingestion in Azure).
        logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
        _installed = True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, correlation id and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        cid = getattr(record, "correlation_id", "") or _correlation.get()
        if cid:
            doc["correlation_id"] = cid
        for key, value in extras(record).items():
            doc[key] = scrub(value) if isinstance(value, str) else value
        if record.exc_info:
            doc["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(doc, default=lambda v: scrub(str(v)), ensure_ascii=False)


# --------------------------------------------------------------------------- metrics

HISTOGRAMS: dict[str, tuple[str, str]] = {
    "time_to_detect_s": ("s", "from a GPU condition turning bad to the sweep reporting it"),
    "drain_time_s": ("s", "from the first eviction to an empty node"),
    "time_to_repair_s": ("s", "from detection to a healthy node again"),
}
GAUGES: dict[str, tuple[str, str]] = {
    "remediations_in_flight": ("1", "remediation records not yet finished"),
    "breaker_open": ("1", "1 while the fleet breaker stops new remediations"),
}
COUNTERS: dict[str, tuple[str, str]] = {
    "pool_requests_total": ("1", "pool requests by outcome (an event of shared.pools.outcomes published)"),
    "migrations_total": ("1", "migrations by outcome (started, completed, rolled_back, blocked)"),
    "remediations_total": ("1", "remediations ended, by outcome, condition, signal and rung"),
    "remediation_refusals_total": ("1", "faulty nodes refused, by reason code (once per fault and code)"),
}
ALIASES: dict[str, str] = {
    "remediation.drain_s": "drain_time_s",
    "remediation.time_to_repair_s": "time_to_repair_s",
}
"""Names the jobs already record, mapped onto the canonical instruments."""


def count_safely(telemetry: Any, name: str, **attrs: Any) -> None:
    """Add 1 to the counter ``name``; absent or failing telemetry never fails the caller (a job's step)."""
    fn = getattr(telemetry, "count", None)
    if callable(fn):
        try:
            fn(name, 1, **attrs)
        except Exception as exc:  # metrics never fail a step
            log.debug("metric %s not recorded: %s", name, exc)


def _attrs(attrs: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    out: dict[str, str | int | float | bool] = {}
    for key, value in attrs.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
    return out


class Telemetry:
    """The app's meters; cheap no-ops when nothing reads them."""

    def __init__(self, *, connection_string: str = "", credential: TokenCredential | None = None,
                 in_memory: bool = False, instance: str = "local", export_interval_s: float = 60.0) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource

        readers: list[Any] = []
        self.reader: Any = None
        if in_memory:
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            self.reader = InMemoryMetricReader()
            readers.append(self.reader)
        if connection_string:
            from azure.monitor.opentelemetry.exporter import AzureMonitorMetricExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            exporter = AzureMonitorMetricExporter(connection_string=connection_string, credential=credential)
            readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=int(export_interval_s * 1000)))
        self.exporting = bool(connection_string)
        self._provider = MeterProvider(
            metric_readers=readers,
            resource=Resource.create({"service.name": "gpu-fleet-steward", "service.instance.id": instance}),
        )
        self._meter = self._provider.get_meter("steward")
        self._instruments: dict[str, tuple[str, Any]] = {}
        self._lock = threading.Lock()
        for name, (unit, description) in HISTOGRAMS.items():
            self._instrument(name, "histogram", unit, description)
        for name, (unit, description) in GAUGES.items():
            self._instrument(name, "gauge", unit, description)
        for name, (unit, description) in COUNTERS.items():
            self._instrument(name, "counter", unit, description)

    def _instrument(self, name: str, kind: str, unit: str = "", description: str = "") -> tuple[str, Any]:
        with self._lock:
            existing = self._instruments.get(name)
            if existing is not None:
                return existing
            made: Histogram | _Gauge | Counter
            if kind == "histogram":
                made = self._meter.create_histogram(name, unit=unit or "s", description=description)
            elif kind == "gauge":
                made = self._meter.create_gauge(name, unit=unit or "1", description=description)
            else:
                made = self._meter.create_counter(name, unit=unit or "1", description=description)
            self._instruments[name] = (kind, made)
            return kind, made

    def _kind_for(self, name: str) -> str:
        if name in self._instruments:
            return self._instruments[name][0]
        return "histogram" if name.endswith(("_s", "_seconds")) else "counter"

    # -- the API the jobs use

    def record(self, name: str, value: float, **attrs: Any) -> None:
        """Record ``value`` on the instrument called ``name`` (its kind decides add / observe / set)."""
        name = ALIASES.get(name, name)
        kind, instrument = self._instrument(name, self._kind_for(name))
        clean = _attrs(attrs)
        if kind == "histogram":
            instrument.record(float(value), clean)
        elif kind == "gauge":
            instrument.set(float(value), clean)
        else:
            instrument.add(float(value), clean)

    def count(self, name: str, value: float = 1, **attrs: Any) -> None:
        kind, instrument = self._instrument(name, "counter" if name not in self._instruments else self._kind_for(name))
        if kind != "counter":
            raise ValueError(f"metric {name} is a {kind}, not a counter")
        instrument.add(float(value), _attrs(attrs))

    # -- reading back (tests) and shutting down

    def snapshot(self) -> dict[str, list[tuple[dict[str, Any], float]]]:
        """name -> [(attributes, value)] from the in-memory reader (sum, last value, or histogram sum)."""
        if self.reader is None:
            raise RuntimeError("Telemetry was built without in_memory=True")
        out: dict[str, list[tuple[dict[str, Any], float]]] = {}
        data = self.reader.get_metrics_data()
        for resource_metrics in (data.resource_metrics if data else ()):
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    points = out.setdefault(metric.name, [])
                    for point in metric.data.data_points:
                        # A sum or gauge point has ``value``; a histogram point has ``sum`` instead.
                        value = getattr(point, "value", None)
                        number = float(getattr(point, "sum", 0.0) if value is None else value)
                        points.append((dict(point.attributes or {}), number))
        return out

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._provider.shutdown()

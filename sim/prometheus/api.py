"""An Azure Monitor workspace's PromQL endpoint holding dcgm-exporter series, for the simulator.

What it models, and from where (the query language itself: :mod:`sim.prometheus.promql`):

- **The GPUs' truth.** Each GPU keeps every error counter the fleet can break
  (``ERROR_COUNTERS``) with its history; ``DCGM_FI_DEV_XID_ERRORS`` holds the *last* XID (0 for
  none), as the exporter's help text says (NVIDIA/dcgm-exporter ``etc/default-counters.csv``).
- **What reaches the workspace depends on the node's exporter** (:class:`ExporterShape`):

  - ``managed``: AKS's managed exporter, a systemd unit on the node started with
    ``-f /etc/dcgm-exporter/default-counters.csv`` (Azure/AgentBaker
    ``parts/linux/cloud-init/artifacts/cse_config.sh``). Of the error counters only those that file
    enables are exported (``DEFAULT_CSV_COUNTERS``: ``DCGM_FI_DEV_XID_ERRORS`` and
    ``DCGM_FI_DEV_ROW_REMAP_FAILURE``; the double-bit ECC totals are commented out and
    ``DCGM_FI_DEV_ROW_REMAP_PENDING`` is absent). AKS managed Prometheus scrapes it with the
    ``dcgmexporter`` default target (Azure/prometheus-collector
    ``otelcollector/configmapparser/default-prom-configs/dcgmExporterDefault.yml``): ``job_name:
    dcgm-exporter``, only nodes labelled ``kubernetes.azure.com/dcgm-exporter=enabled``, ``instance``
    set to the node's name, then ``labelkeep: cluster|instance|gpu|job|__name__`` (so ``Hostname``,
    ``UUID``, ``modelName``, the pod mapping... are dropped). The target's ``honor_labels`` is left at
    its default, false.
  - ``custom``: an operator's own dcgm-exporter (a DaemonSet on driver-only pools, the dcgm-exporter
    Helm chart with a ServiceMonitor), scraped by the operator's own job: the exporter's labels
    (``Hostname``, ``gpu``, ``UUID``, ``device``, ``modelName``, ``pci_bus_id``,
    ``DCGM_FI_DRIVER_VERSION``; dcgm-exporter ``internal/pkg/rendermetrics``) plus the target's
    (``job``, ``instance`` = pod IP:port, ``namespace``, ``pod``, ``container``, ``endpoint``), with
    whatever counters its CSV enables.
- **``cluster``**: the ama-metrics collector upserts ``cluster`` on everything it sends, from
  ``AZMON_CLUSTER_LABEL``: the cluster's name, or ``cluster_alias`` when the cluster's admin set one
  in ``ama-metrics-settings-configmap`` (Azure/prometheus-collector
  ``otelcollector/opentelemetry-collector-builder/collector-config-default.yml`` resource processor;
  ``otelcollector/shared/configmap/mp/tomlparser-prometheus-collector-settings.go``). Modelled as
  overriding a series' own ``cluster`` label (not confirmed: docs/fidelity.md).
- **Tenant series** (:meth:`PrometheusModel.add_scraped`): what a tenant pod's ``/metrics`` becomes
  after a scrape: target labels attached; on a clash, ``honor_labels: false`` renames the exposed
  label to ``exported_<name>``, ``true`` keeps the exposed value (prometheus/prometheus
  ``scrape/scrape.go`` ``mutateSampleLabels``; https://prometheus.io/docs/prometheus/latest/configuration/configuration/#scrape_config).
- **API**: ``GET|POST .../api/v1/query`` (form ``query``, optional ``time``), the envelope
  ``{"status","data":{"resultType":"vector","result":[...]}}`` and the error shape
  ``{"status":"error","errorType","error"}`` (https://prometheus.io/docs/prometheus/latest/querying/api/).
- **Auth**: a bearer token for ``https://prometheus.monitor.azure.com``; 401 without one.
- **Faults**: ``outage`` (503), ``query_timeout`` (503 timeout), ``throttle_retry_after`` (429),
  ``slow_s``, ``warning`` (a success that says it is partial).
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from sim.core.http import Request, Response
from sim.identity.tokens import PROMETHEUS_AUDIENCES
from sim.prometheus.promql import PromQLError, Writer, evaluate, format_value, parse

__all__ = ["PROMETHEUS_AUDIENCES", "ExporterShape", "PrometheusApi", "PrometheusModel", "PromQLError", "evaluate",
           "format_value", "parse"]

QUERY_PATH = "/api/v1/query"
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
XID = "DCGM_FI_DEV_XID_ERRORS"
DBE_VOL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DBE_AGG = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
# The XID the driver logs for a double-bit ECC error ("DBE"; NVIDIA's XID catalog,
# https://docs.nvidia.com/deploy/xid-errors/): what an ECC storm leaves on the last-XID gauge.
STORM_XID = 48
ERROR_COUNTERS = (XID, DBE_VOL, DBE_AGG, REMAP_FAILURE, REMAP_PENDING)
#: Of ERROR_COUNTERS, those NVIDIA/dcgm-exporter etc/default-counters.csv enables (the managed exporter's file).
DEFAULT_CSV_COUNTERS = (XID, REMAP_FAILURE)
_RESET_AT_REBOOT = (XID, DBE_VOL, REMAP_PENDING)
MANAGED_JOB = "dcgm-exporter"  # dcgmExporterDefault.yml job_name
MANAGED_LABELKEEP = frozenset({"cluster", "instance", "gpu", "job", "__name__"})
SCRAPE_INTERVAL_S = 30.0  # ama-metrics-settings-configmap.yaml: dcgmexporter = "30s"


@dataclass(frozen=True)
class ExporterShape:
    """How one node's exporter reaches the workspace: ``managed`` (AKS's) or ``custom`` (an operator's)."""

    kind: str = "managed"
    counters: tuple[str, ...] = DEFAULT_CSV_COUNTERS
    job: str = MANAGED_JOB
    node_label: str = "instance"
    namespace: str = "gpu-monitoring"

    @classmethod
    def custom(cls, *, job: str = "gpu-monitoring/dcgm-exporter", node_label: str = "Hostname",
               namespace: str = "gpu-monitoring", counters: tuple[str, ...] = ERROR_COUNTERS) -> ExporterShape:
        return cls("custom", tuple(counters), job, node_label, namespace)


MANAGED = ExporterShape()


@dataclass
class Gpu:
    node: str
    index: int
    uuid: str
    model: str = DEFAULT_MODEL
    cluster: str = ""
    storm: int = 0  # failing memory: this many double-bit errors again after every reset (ecc_storm persist=True)
    history: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def value(self, metric: str) -> float:
        return self.history[metric][-1][1]


def scraped_labels(exposed: Mapping[str, str], target: Mapping[str, str], *, honor: bool) -> dict[str, str]:
    """A scraped sample's labels: target labels attached, clashes settled by ``honor_labels``
    (prometheus/prometheus scrape/scrape.go ``mutateSampleLabels``)."""
    out = {k: v for k, v in exposed.items() if v}
    for name, value in target.items():
        if not value:
            continue
        if name in out and honor:
            continue
        if name in out:
            out[f"exported_{name}"] = out.pop(name)
        out[name] = value
    return out


class PrometheusModel:
    """The workspace's data and its fault switches; every method is thread-safe."""

    def __init__(self, *, now: Callable[[], float] = lambda: 0.0, driver_version: str = "570.172.08",
                 interval_s: float = SCRAPE_INTERVAL_S) -> None:
        self.now = now
        self.driver_version = driver_version
        self.interval_s = interval_s
        self._gpus: dict[tuple[str, str, int], Gpu] = {}  # (cluster, node, index)
        self._shapes: dict[tuple[str, str], ExporterShape] = {}
        self._aliases: dict[str, str] = {}  # cluster -> its cluster_alias
        self._scraped: list[tuple[str, Writer]] = []  # tenant pods' series, with the cluster that sends them
        self._lock = threading.Lock()
        self.outage = False
        self.query_timeout = False
        self.throttle_retry_after: int | None = None
        self.slow_s = 0.0
        self.warning: str | None = None
        self.queries: list[str] = []

    # ------------------------------------------------------------------ nodes and their GPUs
    def add_node(self, node: str, gpus: int = 8, *, model: str = DEFAULT_MODEL, cluster: str = "",
                 shape: ExporterShape = MANAGED, since: float | None = None) -> None:
        """The node's exporter has run since ``since`` (default now): its GPUs' counters start at 0."""
        at = self.now() if since is None else since
        with self._lock:
            self._shapes[(cluster, node)] = shape
            for i in range(gpus):
                uuid = f"GPU-{zlib.crc32(f'{cluster}/{node}'.encode()):08x}-0000-4000-8000-{i:012x}"
                self._gpus[(cluster, node, i)] = Gpu(node, i, uuid, model, cluster=cluster,
                                                     history={m: [(at, 0.0)] for m in ERROR_COUNTERS})

    def set_shape(self, node: str, shape: ExporterShape, *, cluster: str = "") -> None:
        with self._lock:
            self._shapes[(cluster, node)] = shape

    def nodes(self) -> set[tuple[str, str]]:
        """(cluster, node) of every node with GPUs."""
        with self._lock:
            return {(c, n) for c, n, _ in self._gpus}

    def remove_node(self, node: str, *, cluster: str = "") -> None:
        """The node (or its exporter) is gone: its series vanish, which must never read as healthy."""
        with self._lock:
            for key in [k for k in self._gpus if k[:2] == (cluster, node)]:
                del self._gpus[key]
            self._shapes.pop((cluster, node), None)

    def set(self, node: str, gpu: int, metric: str, value: float, *, cluster: str = "") -> None:
        with self._lock:
            self._write(self._gpu(cluster, node, gpu), metric, float(value))

    def _write(self, g: Gpu, metric: str, value: float, at: float | None = None) -> None:
        """Record ``value`` from ``at`` (default now) on; a write dated before later ones is superseded by them."""
        at = self.now() if at is None else at
        hist = g.history[metric]
        if hist[-1][0] == at:
            hist[-1] = (at, value)
        elif hist[-1][0] < at:
            hist.append((at, value))
        else:
            later = [(t, v) for t, v in hist if t > at]
            hist[:] = [(t, v) for t, v in hist if t < at] + [(at, value)] + later

    def value(self, node: str, gpu: int, metric: str, *, cluster: str = "") -> float:
        with self._lock:
            return self._gpu(cluster, node, gpu).value(metric)

    def inject_xid(self, node: str, gpu: int, xid: int, *, cluster: str = "") -> None:
        """The driver logged ``xid`` on that GPU (the gauge keeps the last one)."""
        self.set(node, gpu, XID, xid, cluster=cluster)

    def ecc_storm(self, node: str, gpu: int, dbe: int = 4, *, cluster: str = "", persist: bool = False) -> None:
        """Double-bit ECC errors: volatile and lifetime counters grow, a row remap waits for a reset, the
        driver logs XID 48. ``persist``: failing memory, the errors come back after every reset."""
        with self._lock:
            g = self._gpu(cluster, node, gpu)
            g.storm = dbe if persist else 0
            self._storm(g, dbe)

    def _storm(self, g: Gpu, dbe: int, at: float | None = None) -> None:
        self._write(g, DBE_VOL, g.value(DBE_VOL) + dbe, at)
        self._write(g, DBE_AGG, g.value(DBE_AGG) + dbe, at)
        self._write(g, REMAP_PENDING, 1.0, at)
        self._write(g, XID, float(STORM_XID), at)

    def reboot(self, node: str, *, cluster: str = "", at: float | None = None) -> None:
        """A reboot (at ``at``, default now) reloads the driver: the last XID, volatile counts and pending
        remaps reset (and a failing memory's errors start again)."""
        with self._lock:
            for (c, n, _), g in self._gpus.items():
                if (c, n) == (cluster, node):
                    for metric in _RESET_AT_REBOOT:
                        self._write(g, metric, 0.0, at)
                    if g.storm:
                        self._storm(g, g.storm, at)

    def _gpu(self, cluster: str, node: str, gpu: int) -> Gpu:
        try:
            return self._gpus[(cluster, node, gpu)]
        except KeyError:
            raise KeyError(f"no GPU {gpu} on node {node!r} (add_node first)") from None

    # ------------------------------------------------------------------ clusters and tenants
    def set_alias(self, cluster: str, alias: str) -> None:
        """The cluster admin's ``cluster_alias``: the ``cluster`` label of everything the cluster sends."""
        with self._lock:
            if alias:
                self._aliases[cluster] = alias
            else:
                self._aliases.pop(cluster, None)

    def cluster_value(self, cluster: str) -> str:
        return self._aliases.get(cluster, cluster)

    def add_scraped(self, cluster: str, *, exposed: Mapping[str, str], target: Mapping[str, str], value: float,
                    honor: bool = False, drop: tuple[str, ...] = ()) -> dict[str, str]:
        """A series a tenant pod's scrape produces (see the module docstring); returns its final labels."""
        labels = scraped_labels(exposed, target, honor=honor)
        for name in drop:  # the scrape's metric_relabel_configs: labeldrop
            labels.pop(name, None)
        with self._lock:
            if cluster:  # the collector upserts it on everything the cluster sends, whenever it sends it
                labels["cluster"] = self.cluster_value(cluster)
            writer = Writer(labels=labels, history=[(self.now(), float(value))], phase=self.interval_s / 2,
                            interval=self.interval_s)
            self._scraped.append((cluster, writer))
        return dict(labels)

    def clear_scraped(self) -> int:
        with self._lock:
            n = len(self._scraped)
            self._scraped.clear()
            return n

    # ------------------------------------------------------------------ what the workspace holds
    def _labels(self, g: Gpu, shape: ExporterShape) -> dict[str, str]:
        if shape.kind == "managed":
            base = {"instance": g.node, "gpu": str(g.index), "job": shape.job}
        else:
            pod_ip = f"10.244.{zlib.crc32(g.node.encode()) % 250}.{g.index % 8 + 10}"
            base = {"gpu": str(g.index), "UUID": g.uuid, "pci_bus_id": f"00000000:{g.index + 1:02X}:00.0",
                    "device": f"nvidia{g.index}", "modelName": g.model, shape.node_label: g.node,
                    "DCGM_FI_DRIVER_VERSION": self.driver_version, "job": shape.job, "instance": f"{pod_ip}:9400",
                    "namespace": shape.namespace, "pod": f"dcgm-exporter-{zlib.crc32(g.node.encode()):05x}"[:22],
                    "container": "exporter", "endpoint": "metrics"}
        if g.cluster:
            base["cluster"] = self.cluster_value(g.cluster)
        return base

    def writers(self) -> list[Writer]:
        """Every scrape target's series: the nodes' exporters, then the tenants'."""
        out: list[Writer] = []
        with self._lock:
            for (cluster, node, _), g in self._gpus.items():
                shape = self._shapes.get((cluster, node))
                if shape is None or shape.kind == "none":
                    continue
                base = self._labels(g, shape)
                for metric in shape.counters:
                    out.append(Writer(labels={"__name__": metric, **base}, history=list(g.history[metric]),
                                      interval=self.interval_s))
            for cluster, w in self._scraped:
                labels = dict(w.labels)
                if cluster:  # a cluster_alias set later relabels what the cluster sends from then on
                    labels["cluster"] = self.cluster_value(cluster)
                out.append(Writer(labels, list(w.history), w.phase, w.interval))
        return out

    def series(self, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """Every series' newest value at ``at`` (default: now), as an instant selector sees it."""
        from sim.prometheus.promql import Matcher, Query

        everything = Query((Matcher("__name__", "=~", ".+"),))
        return evaluate(everything, self.writers(), at=self.now() if at is None else at)


# --------------------------------------------------------------------------- the HTTP handler
def _error(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response.json(status, {"status": "error", "errorType": error_type, "error": message}, headers)


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise PromQLError(f'invalid parameter "time": cannot parse {text!r} to a valid timestamp') from None


class PrometheusApi:
    """The workspace's query endpoint (a sim.core.http Handler). ``issuer``: the simulator's TokenIssuer."""

    def __init__(self, model: PrometheusModel, *, now: Callable[[], float], issuer: Any = None) -> None:
        self.model = model
        self.now = now
        self.issuer = issuer

    def _authenticated(self, request: Request) -> bool:
        token = request.bearer
        if self.issuer is None:
            return bool(token)
        return bool(self.issuer.verify(token, PROMETHEUS_AUDIENCES).status == 200)

    def handle(self, request: Request) -> Response:
        if not request.path.endswith(QUERY_PATH):
            return _error(404, "not_found", f"{request.path} is not an API path this endpoint serves")
        if request.method not in ("GET", "POST"):
            return Response(405, b"method not allowed", {"Allow": "GET, POST"})
        if not self._authenticated(request):
            return Response(401, b"missing or invalid bearer token", {"WWW-Authenticate": "Bearer"})
        m = self.model
        if m.throttle_retry_after is not None:
            return _error(429, "unavailable", "too many requests", {"Retry-After": str(m.throttle_retry_after)})
        if m.outage:
            return _error(503, "unavailable", "the query service is unavailable")
        params = dict(request.query)
        if request.method == "POST" and "x-www-form-urlencoded" in (request.headers.get("content-type") or ""):
            for key, values in parse_qs(request.body.decode("utf-8", "replace"), keep_blank_values=True).items():
                params.setdefault(key, values)
        text = (params.get("query") or [""])[0]
        try:
            at = _parse_time(params["time"][0]) if params.get("time") else self.now()
            query = parse(text)
        except PromQLError as exc:
            return _error(400, "bad_data", str(exc))
        with m._lock:
            m.queries.append(text)
        if m.query_timeout:
            return _error(503, "timeout", "query timed out in expression evaluation")
        try:
            answer = evaluate(query, m.writers(), at=at)
        except PromQLError as exc:  # an evaluation error (two series left with one label set): 422 execution
            return _error(422, "execution", str(exc))
        result = [{"metric": labels, "value": [round(at, 3), format_value(v)]} for labels, v in answer]
        payload: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": result}}
        if m.warning:
            payload["warnings"] = [m.warning]
        response = Response.json(200, json.dumps(payload, separators=(",", ":")).encode())
        response.delay_s = m.slow_s
        return response

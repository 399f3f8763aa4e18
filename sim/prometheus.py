"""An Azure Monitor workspace's PromQL endpoint holding dcgm-exporter series, for the simulator.

What it models, and from where:

- **Series**: one per (metric, node, GPU), labelled as dcgm-exporter labels them (``gpu``, ``UUID``,
  ``pci_bus_id``, ``device``, ``modelName``, the node label, ``DCGM_FI_DRIVER_VERSION`` and the
  pod mapping's ``container`` / ``namespace`` / ``pod``; NVIDIA/dcgm-exporter README and
  internal/pkg/rendermetrics/render_metrics.go). The node label is ``Hostname`` unless the scenario
  relabels it. ``DCGM_FI_DEV_XID_ERRORS`` holds the *last* XID (0 for none), as the exporter's help
  text says.
- **API**: ``GET|POST .../api/v1/query`` (form ``query``, optional ``time`` and ``timeout``), the
  envelope ``{"status","data":{"resultType":"vector","result":[{"metric","value":[ts,"v"]}]}}`` and the
  error shape ``{"status":"error","errorType","error"}`` with Prometheus' status codes
  (https://prometheus.io/docs/prometheus/latest/querying/api/; web/api/v1/api.go ``respondError``).
- **PromQL subset**, exactly what the app sends (``signal_policy.dcgm_query``) and nothing else:
  a vector selector ``name{l="v", l=~"re", l!="v", l!~"re"}`` (regexes fully anchored, as in
  Prometheus), optionally inside ``max|min|sum|count`` with ``by (labels)`` before or after the
  parenthesis. Anything else is a parse error: 400 ``bad_data``, like the real server. The Azure
  Monitor rule "one ``__name__`` matcher per query" (prometheus-api-promql.md, API limitations) is
  enforced the same way; Azure's exact error text for it is not documented, the 400 is modelled.
- **Auth**: a bearer token for ``https://prometheus.monitor.azure.com`` (verified by the simulator's
  token issuer when one is given, otherwise any non-empty token): 401 without one.
- **Faults** (switches on :class:`PrometheusModel`): ``outage`` (503 unavailable), ``query_timeout``
  (503 timeout), ``throttle_retry_after`` (429 + Retry-After), ``slow_s`` (answer late),
  ``warning`` (a success that says it is partial, as a server that could not reach all its data does).

Served by the simulator through :mod:`sim.dcgm`, which keeps these series in step with the simulated
nodes (``/prometheus/<workspace>/api/v1/query``). Series of a cluster carry the ``cluster`` label
(the label the Azure Monitor metrics addon adds to what it scrapes) when added with ``cluster=``.
"""

from __future__ import annotations

import json
import math
import re
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from sim.http import Request, Response
from sim.tokens import PROMETHEUS_AUDIENCES

__all__ = ["PROMETHEUS_AUDIENCES", "PrometheusApi", "PrometheusModel", "PromQLError", "format_value", "parse"]

QUERY_PATH = "/api/v1/query"
AGGREGATIONS = ("max", "min", "sum", "count")
DEFAULT_NODE_LABEL = "Hostname"
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
ERROR_COUNTERS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                  "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING")
_RESET_AT_REBOOT = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING")


class PromQLError(ValueError):
    """The query is outside the supported subset (answered 400 bad_data)."""


# --------------------------------------------------------------------------- the series
@dataclass
class Gpu:
    node: str
    index: int
    uuid: str
    model: str = DEFAULT_MODEL
    pod: tuple[str, str, str] = ("", "", "")  # (namespace, pod, container) of the pod mapping
    values: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ERROR_COUNTERS, 0.0))
    cluster: str = ""  # the ``cluster`` label's value ("" : no such label)
    storm: int = 0  # failing memory: this many double-bit errors again after every reset (ecc_storm persist=True)


class PrometheusModel:
    """The workspace's data and its fault switches; every method is thread-safe."""

    def __init__(self, *, node_label: str = DEFAULT_NODE_LABEL, driver_version: str = "570.172.08") -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", node_label):
            raise ValueError(f"{node_label!r} is not a Prometheus label name")
        self.node_label = node_label
        self.driver_version = driver_version
        self._gpus: dict[tuple[str, str, int], Gpu] = {}  # (cluster, node, index)
        self._lock = threading.Lock()
        self.outage = False
        self.query_timeout = False
        self.throttle_retry_after: int | None = None
        self.slow_s = 0.0
        self.warning: str | None = None
        self.queries: list[str] = []

    def add_node(self, node: str, gpus: int = 8, *, model: str = DEFAULT_MODEL, cluster: str = "") -> None:
        with self._lock:
            for i in range(gpus):
                uuid = f"GPU-{zlib.crc32(f'{cluster}/{node}'.encode()):08x}-0000-4000-8000-{i:012x}"
                self._gpus[(cluster, node, i)] = Gpu(node, i, uuid, model, cluster=cluster)

    def nodes(self) -> set[tuple[str, str]]:
        """(cluster, node) of every node with series."""
        with self._lock:
            return {(c, n) for c, n, _ in self._gpus}

    def remove_node(self, node: str, *, cluster: str = "") -> None:
        """The node (or its exporter) is gone: its series vanish, which must never read as healthy."""
        with self._lock:
            for key in [k for k in self._gpus if k[:2] == (cluster, node)]:
                del self._gpus[key]

    def set(self, node: str, gpu: int, metric: str, value: float, *, cluster: str = "") -> None:
        with self._lock:
            self._gpu(cluster, node, gpu).values[metric] = float(value)

    def inject_xid(self, node: str, gpu: int, xid: int, *, cluster: str = "") -> None:
        """The driver logged ``xid`` on that GPU (the gauge keeps the last one)."""
        self.set(node, gpu, "DCGM_FI_DEV_XID_ERRORS", xid, cluster=cluster)

    def ecc_storm(self, node: str, gpu: int, dbe: int = 4, *, cluster: str = "", persist: bool = False) -> None:
        """Double-bit ECC errors: volatile and lifetime counters grow, a row remap waits for a reset.
        ``persist``: the memory is failing, so the errors come back after every reset (reboot)."""
        with self._lock:
            g = self._gpu(cluster, node, gpu)
            g.storm = dbe if persist else 0
            self._storm(g, dbe)

    @staticmethod
    def _storm(g: Gpu, dbe: int) -> None:
        v = g.values
        v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] += dbe
        v["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"] += dbe
        v["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1.0
        v["DCGM_FI_DEV_XID_ERRORS"] = 48.0

    def reboot(self, node: str, *, cluster: str = "") -> None:
        """A reboot reloads the driver: the last XID, volatile counts and pending remaps reset (and a
        failing memory's errors start again)."""
        with self._lock:
            for (c, n, _), gpu in self._gpus.items():
                if (c, n) == (cluster, node):
                    for metric in _RESET_AT_REBOOT:
                        gpu.values[metric] = 0.0
                    if gpu.storm:
                        self._storm(gpu, gpu.storm)

    def _gpu(self, cluster: str, node: str, gpu: int) -> Gpu:
        try:
            return self._gpus[(cluster, node, gpu)]
        except KeyError:
            raise KeyError(f"no GPU {gpu} on node {node!r} (add_node first)") from None

    def series(self) -> list[tuple[dict[str, str], float]]:
        """Every series as (labels, value)."""
        out = []
        with self._lock:
            for gpu in self._gpus.values():
                namespace, pod, container = gpu.pod
                base = {"gpu": str(gpu.index), "UUID": gpu.uuid, "pci_bus_id": f"00000000:{gpu.index + 1:02X}:00.0",
                        "device": f"nvidia{gpu.index}", "modelName": gpu.model, self.node_label: gpu.node,
                        "DCGM_FI_DRIVER_VERSION": self.driver_version, "container": container,
                        "namespace": namespace, "pod": pod, **({"cluster": gpu.cluster} if gpu.cluster else {})}
                for metric, value in gpu.values.items():
                    out.append(({"__name__": metric, **base}, value))
        return out


# --------------------------------------------------------------------------- the PromQL subset
_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<op>=~|!~|!=|=|[{}(),])"""
                    r"""|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*))""")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        have = labels.get(self.label, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = re.fullmatch(self.value, have) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True)
class Query:
    matchers: tuple[Matcher, ...]
    aggregation: str | None = None
    by: tuple[str, ...] = ()


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise PromQLError(f'1:{pos + 1}: parse error: unexpected character {text[pos:].strip()[:1]!r}')
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _unquote(token: str) -> str:
    body = token[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str, value: str | None = None) -> str:
        tok = self.peek()
        if tok is None or tok[0] != kind or (value is not None and tok[1] != value):
            got = "end of input" if tok is None else repr(tok[1])
            raise PromQLError(f"parse error: unexpected {got}, expected {value or kind}")
        self.i += 1
        return tok[1]

    def labels(self) -> tuple[str, ...]:
        self.take("op", "(")
        names: list[str] = []
        while self.peek() != ("op", ")"):
            names.append(self.take("name"))
            if self.peek() == ("op", ","):
                self.take("op", ",")
        self.take("op", ")")
        return tuple(names)

    def selector(self) -> tuple[Matcher, ...]:
        matchers: list[Matcher] = []
        tok = self.peek()
        if tok is not None and tok[0] == "name":
            matchers.append(Matcher("__name__", "=", self.take("name")))
        if self.peek() == ("op", "{"):
            self.take("op", "{")
            while self.peek() != ("op", "}"):
                label = self.take("name")
                op = self.take("op")
                if op not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"parse error: unexpected {op!r} in label matching, expected a match operator")
                value = _unquote(self.take("str"))
                if op in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as exc:
                        raise PromQLError(f"parse error: invalid regular expression {value!r}: {exc}") from None
                matchers.append(Matcher(label, op, value))
                if self.peek() == ("op", ","):
                    self.take("op", ",")
            self.take("op", "}")
        if not matchers:
            raise PromQLError("parse error: unexpected end of input, expected a vector selector")
        if all(m.matches({}) for m in matchers):
            raise PromQLError("vector selector must contain at least one non-empty matcher")
        if sum(1 for m in matchers if m.label == "__name__") != 1:
            raise PromQLError("a query must be scoped to a metric: exactly one __name__ matcher is supported")
        return tuple(matchers)

    def query(self) -> Query:
        tok = self.peek()
        if tok is not None and tok[0] == "name" and tok[1] in AGGREGATIONS and self.toks[self.i + 1:self.i + 2] in (
                [("name", "by")], [("op", "(")]):
            agg = self.take("name")
            by: tuple[str, ...] = ()
            if self.peek() == ("name", "by"):
                self.take("name", "by")
                by = self.labels()
            self.take("op", "(")
            matchers = self.selector()
            self.take("op", ")")
            if not by and self.peek() == ("name", "by"):
                self.take("name", "by")
                by = self.labels()
            q = Query(matchers, agg, by)
        else:
            q = Query(self.selector())
        if self.peek() is not None:
            raise PromQLError(f"parse error: unexpected {self.peek()[1]!r} after the expression")  # type: ignore[index]
        return q


def parse(text: str) -> Query:
    """Parse the supported subset; PromQLError for everything else (the server's 400 bad_data)."""
    if not text.strip():
        raise PromQLError("invalid parameter \"query\": 1:1: parse error: no expression found in input")
    return _Parser(text).query()


def evaluate(query: Query, series: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    selected = [(labels, v) for labels, v in series if all(m.matches(labels) for m in query.matchers)]
    if query.aggregation is None:
        return selected
    groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for labels, v in selected:
        key = tuple((name, labels[name]) for name in query.by if labels.get(name))
        groups.setdefault(key, []).append(v)
    fold: dict[str, Callable[[list[float]], float]] = {"max": max, "min": min, "sum": math.fsum,
                                                      "count": lambda vs: float(len(vs))}
    return [(dict(key), fold[query.aggregation](vs)) for key, vs in sorted(groups.items())]


def format_value(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 64) as Prometheus renders sample values."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v == int(v) and abs(v) < 1e21 else repr(v)


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
    """The workspace's query endpoint (a sim.http Handler). ``issuer``: the simulator's TokenIssuer."""

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
        result = [{"metric": labels, "value": [round(at, 3), format_value(v)]}
                  for labels, v in evaluate(query, m.series())]
        payload: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": result}}
        if m.warning:
            payload["warnings"] = [m.warning]
        response = Response.json(200, json.dumps(payload, separators=(",", ":")).encode())
        response.delay_s = m.slow_s
        return response

"""The PromQL subset the simulated Azure Monitor workspace answers, evaluated over scraped series.

What it models, and from where:

- **Series identity.** A series is its whole label set (``__name__`` included): two scrapes that
  produce the same labels write ONE series, their samples interleaved in time (Prometheus data model,
  https://prometheus.io/docs/concepts/data_model/). That is how a tenant's forged series that copies
  the exporter's labels exactly meets the exporter's own samples.
- **Scrapes.** Each writer (a scrape target producing one series) samples its value every
  ``interval`` seconds at its own ``phase`` (the managed scrape interval of the ``dcgmexporter``
  target is 30 s by default: Azure/prometheus-collector ``otelcollector/configmaps/
  ama-metrics-settings-configmap.yaml``, ``dcgmexporter = "30s"``).
- **Instant vector selector** at time ``t``: for each series, the newest sample at or before ``t``,
  within the 5-minute lookback (``--query.lookback-delta`` default 5m, Prometheus
  ``promql/engine.go`` ``defaultLookbackDelta``); older series are absent.
- **``min_over_time`` / ``max_over_time(selector[range])``**: every sample of the series in
  ``(t - range, t]`` folded; the result drops the metric name, as every ``*_over_time`` function does
  (Prometheus ``promql/functions.go``; https://prometheus.io/docs/prometheus/latest/querying/functions/#aggregation_over_time).
- **Aggregations** ``max|min|sum|count`` with ``by (labels)`` before or after the parenthesis.

Anything else is a parse error: 400 ``bad_data``, like the real server. The Azure Monitor rule "one
``__name__`` matcher per query" (https://learn.microsoft.com/azure/azure-monitor/metrics/prometheus-api-promql,
API limitations) is enforced the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LOOKBACK_S = 300.0
AGGREGATIONS = ("max", "min", "sum", "count")
OVER_TIME = ("min_over_time", "max_over_time")


class PromQLError(ValueError):
    """The query is outside the supported subset (answered 400 bad_data)."""


@dataclass
class Writer:
    """One scrape target's series: its final labels (after relabelling) and its value over time."""

    labels: dict[str, str]
    history: list[tuple[float, float]] = field(default_factory=list)  # (since, value), ascending
    phase: float = 0.0
    interval: float = 30.0

    def value_at(self, t: float) -> float | None:
        value = None
        for since, v in self.history:
            if since > t:
                break
            value = v
        return value

    def last_scrape(self, t: float) -> float:
        return self.phase + math.floor((t - self.phase) / self.interval) * self.interval

    def samples(self, start: float, end: float) -> list[tuple[float, float]]:
        """(time, value) of every scrape in ``(start, end]`` once the series exists."""
        out = []
        s = self.last_scrape(end)
        while s > start:
            v = self.value_at(s)
            if v is None:
                break
            out.append((s, v))
            s -= self.interval
        return out


# --------------------------------------------------------------------------- parsing
_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<dur>\[[0-9]+[smh]\])"""
                    r"""|(?P<op>=~|!~|!=|=|[{}(),])|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*))""")
_UNITS = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
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
    over_time: str | None = None
    range_s: float = 0.0


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
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), token[1:-1])


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, ahead: int = 0) -> tuple[str, str] | None:
        return self.toks[self.i + ahead] if self.i + ahead < len(self.toks) else None

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

    def over_time(self) -> Query:
        fn = self.take("name")
        self.take("op", "(")
        matchers = self.selector()
        tok = self.peek()
        if tok is None or tok[0] != "dur":
            raise PromQLError(f"parse error: expected type range vector in call to function {fn!r}, got instant vector")
        self.i += 1
        range_s = float(tok[1][1:-2]) * _UNITS[tok[1][-2]]
        if range_s <= 0:
            raise PromQLError("parse error: range must be positive")
        self.take("op", ")")
        return Query(matchers, over_time=fn, range_s=range_s)

    def query(self) -> Query:
        tok = self.peek()
        if tok is not None and tok[0] == "name" and tok[1] in OVER_TIME:
            q = self.over_time()
        elif tok is not None and tok[0] == "name" and tok[1] in AGGREGATIONS and self.peek(1) in (
                ("name", "by"), ("op", "(")):
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
        rest = self.peek()
        if rest is not None:
            raise PromQLError(f"parse error: unexpected {rest[1]!r} after the expression")
        return q


def parse(text: str) -> Query:
    """Parse the supported subset; PromQLError for everything else (the server's 400 bad_data)."""
    if not text.strip():
        raise PromQLError("invalid parameter \"query\": 1:1: parse error: no expression found in input")
    return _Parser(text).query()


# --------------------------------------------------------------------------- evaluation
def _grouped(writers: Iterable[Writer], matchers: Sequence[Matcher]) -> dict[tuple[tuple[str, str], ...], list[Writer]]:
    out: dict[tuple[tuple[str, str], ...], list[Writer]] = {}
    for w in writers:
        if all(m.matches(w.labels) for m in matchers):
            out.setdefault(tuple(sorted(w.labels.items())), []).append(w)
    return out


def _instant(writers: list[Writer], at: float) -> float | None:
    """The newest sample of one series (all its writers) at ``at``, within the lookback."""
    best: tuple[float, float] | None = None
    for w in writers:
        s = w.last_scrape(at)
        v = w.value_at(s)
        if v is None or at - s > LOOKBACK_S:
            continue
        if best is None or s >= best[0]:
            best = (s, v)
    return None if best is None else best[1]


def evaluate(query: Query, writers: Iterable[Writer], *, at: float) -> list[tuple[dict[str, str], float]]:
    """The query's instant vector at ``at``: (labels, value) per output series."""
    groups = _grouped(writers, query.matchers)
    if query.over_time is not None:
        fold_t: Callable[[Iterable[float]], float] = min if query.over_time == "min_over_time" else max
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for key, ws in groups.items():
            values = [v for w in ws for _, v in w.samples(at - query.range_s, at)]
            if not values:
                continue
            labels = tuple((k, v) for k, v in key if k != "__name__")
            if labels in out:
                raise PromQLError("vector cannot contain metrics with the same labelset")
            out[labels] = fold_t(values)
        return [(dict(k), v) for k, v in sorted(out.items())]
    selected = []
    for key, ws in sorted(groups.items()):
        v = _instant(ws, at)
        if v is not None:
            selected.append((dict(key), v))
    if query.aggregation is None:
        return selected
    folded: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for labels, v in selected:
        gkey = tuple((name, labels[name]) for name in query.by if labels.get(name))
        folded.setdefault(gkey, []).append(v)
    fold: dict[str, Callable[[list[float]], float]] = {"max": max, "min": min, "sum": math.fsum,
                                                      "count": lambda vs: float(len(vs))}
    return [(dict(k), fold[query.aggregation](vs)) for k, vs in sorted(folded.items())]


def format_value(v: float) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 64) as Prometheus renders sample values."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v == int(v) and abs(v) < 1e21 else repr(v)

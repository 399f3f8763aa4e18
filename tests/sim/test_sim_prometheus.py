"""The simulated PromQL endpoint: the supported subset, the real response shape, auth and faults,
and (over a real socket) the app's own client and query against it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlencode

import pytest

from shared.adapters.prometheus import PrometheusClient
from shared.kernel.errors import Forbidden, Invalid, Throttled, Transient
from shared.remediation import signal_policy as sp
from sim.core.http import Headers, Request, Response
from sim.identity.tokens import TokenIssuer
from sim.prometheus.api import (
    PROMETHEUS_AUDIENCES,
    ExporterShape,
    PrometheusApi,
    PrometheusModel,
    PromQLError,
    format_value,
    parse,
)

NOW = 1_750_000_020.0  # a scrape time (30 s interval, phase 0)
QUERY = '{__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_ROW_REMAP_FAILURE", job="dcgm-exporter"}'


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def model(clock: Clock) -> PrometheusModel:
    m = PrometheusModel(now=clock)
    m.add_node("aks-gpu-0", gpus=2, cluster="c1")
    m.add_node("aks-gpu-1", gpus=2, cluster="c1")
    return m


def _get(api: PrometheusApi, query: str, token: str | None = "t", **params: str) -> Response:
    headers = Headers({"Authorization": f"Bearer {token}"} if token else {})
    return api.handle(Request("GET", "/api/v1/query?" + urlencode({"query": query, **params}), headers))


def _post(api: PrometheusApi, form: dict[str, str], token: str = "t") -> Response:
    headers = Headers({"Authorization": f"Bearer {token}", "Content-Type": "application/x-www-form-urlencoded"})
    return api.handle(Request("POST", "/api/v1/query", headers, urlencode(form).encode()))


def _body(resp: Response) -> dict[str, Any]:
    return json.loads(resp.body)  # type: ignore[no-any-return]


def _result(resp: Response, at: float = NOW) -> dict[tuple[tuple[str, str], ...], str]:
    body = _body(resp)
    assert resp.status == 200 and body["status"] == "success" and body["data"]["resultType"] == "vector", body
    out = {}
    for item in body["data"]["result"]:
        ts, value = item["value"]
        assert ts == at and isinstance(value, str)
        out[tuple(sorted(item["metric"].items()))] = value
    return out


def _api(model: PrometheusModel, clock: Clock) -> PrometheusApi:
    return PrometheusApi(model, now=clock)


def test_the_managed_exporters_series_carry_only_the_labels_aks_keeps(model: PrometheusModel, clock: Clock) -> None:
    model.inject_xid("aks-gpu-1", 1, 79, cluster="c1")
    result = _result(_get(_api(model, clock), QUERY))
    assert len(result) == 2 * 2 * 2  # the default CSV's two error counters, two nodes, two GPUs
    key = (("__name__", "DCGM_FI_DEV_XID_ERRORS"), ("cluster", "c1"), ("gpu", "1"), ("instance", "aks-gpu-1"),
           ("job", "dcgm-exporter"))
    assert result[key] == "79" and {v for k, v in result.items() if k != key} == {"0"}
    assert {name for k in result for name, _ in k} == {"__name__", "cluster", "gpu", "instance", "job"}


def test_counters_the_default_csv_leaves_out_are_not_in_the_workspace(model: PrometheusModel, clock: Clock) -> None:
    model.ecc_storm("aks-gpu-0", 0, dbe=3, cluster="c1")
    api = _api(model, clock)
    assert _result(_get(api, '{__name__=~"DCGM_FI_DEV_ECC_DBE_.*|DCGM_FI_DEV_ROW_REMAP_PENDING"}')) == {}
    assert model.value("aks-gpu-0", 0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", cluster="c1") == 3  # the GPU knows
    model.set_shape("aks-gpu-0", ExporterShape.custom(), cluster="c1")  # an exporter of the operator's own
    result = _result(_get(api, 'sum by (Hostname) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)'))
    assert result == {(("Hostname", "aks-gpu-0"),): "3"}


def test_post_form_and_a_custom_exporters_labels(model: PrometheusModel, clock: Clock) -> None:
    model.set_shape("aks-gpu-0", ExporterShape.custom(job="mon/dcgm"), cluster="c1")
    model.set("aks-gpu-0", 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, cluster="c1")
    query = 'DCGM_FI_DEV_ROW_REMAP_FAILURE{job="mon/dcgm",gpu=~"0|7"}'
    resp = _post(_api(model, clock), {"query": query, "time": str(NOW)})
    [(labels, value)] = _result(resp).items()
    names = dict(labels)
    assert value == "1" and model.queries == [query]
    assert set(names) == {"__name__", "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                          "DCGM_FI_DRIVER_VERSION", "job", "instance", "namespace", "pod", "container", "endpoint",
                          "cluster"}
    assert names["Hostname"] == "aks-gpu-0" and names["UUID"].startswith("GPU-") and names["instance"].endswith(":9400")


def test_a_value_shows_from_the_next_scrape(model: PrometheusModel, clock: Clock) -> None:
    clock.t = NOW + 10
    model.inject_xid("aks-gpu-0", 0, 79, cluster="c1")
    api = _api(model, clock)
    xid = 'DCGM_FI_DEV_XID_ERRORS{instance="aks-gpu-0",gpu="0"}'
    assert list(_result(_get(api, xid), at=NOW + 10).values()) == ["0"]  # last scraped before the XID
    clock.t = NOW + 30
    assert list(_result(_get(api, xid), at=NOW + 30).values()) == ["79"]


def test_aggregations_and_by_after_the_parenthesis(model: PrometheusModel, clock: Clock) -> None:
    model.set_shape("aks-gpu-0", ExporterShape.custom(), cluster="c1")
    model.set_shape("aks-gpu-1", ExporterShape.custom(), cluster="c1")
    model.ecc_storm("aks-gpu-0", 0, dbe=3, cluster="c1")
    model.ecc_storm("aks-gpu-0", 1, dbe=2, cluster="c1")
    api = _api(model, clock)
    assert _result(_get(api, "sum(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) by (Hostname)")) == {
        (("Hostname", "aks-gpu-0"),): "5", (("Hostname", "aks-gpu-1"),): "0"}
    assert _result(_get(api, "count(DCGM_FI_DEV_ROW_REMAP_PENDING)")) == {(): "4"}
    assert _result(_get(api, 'min by (Hostname) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname!~"aks-gpu-1"})')) == {
        (("Hostname", "aks-gpu-0"),): "2"}


def test_reboot_resets_volatile_values_and_removal_leaves_no_series(model: PrometheusModel, clock: Clock) -> None:
    model.set_shape("aks-gpu-0", ExporterShape.custom(), cluster="c1")
    model.ecc_storm("aks-gpu-0", 0, cluster="c1")
    model.reboot("aks-gpu-0", cluster="c1")
    api = _api(model, clock)
    result = _result(_get(api, 'max by (__name__) ({__name__=~"DCGM_FI_DEV_ECC_DBE_.*",Hostname="aks-gpu-0"})'))
    assert result == {(("__name__", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),): "4",
                      (("__name__", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),): "0"}
    model.remove_node("aks-gpu-0", cluster="c1")
    assert _result(_get(api, 'DCGM_FI_DEV_XID_ERRORS{Hostname="aks-gpu-0"}')) == {}


def test_the_gauge_keeps_the_last_xid_and_a_query_at_a_past_time_answers_as_the_workspace_was(
        model: PrometheusModel, clock: Clock) -> None:
    """``DCGM_FI_DEV_XID_ERRORS`` is the "value of the last XID error encountered" (dcgm-exporter
    etc/default-counters.csv): a later XID replaces an earlier one, a reboot reads 0; the query API's ``time``
    parameter evaluates at that moment (Prometheus HTTP API), over samples the workspace keeps (18 months:
    learn.microsoft.com/azure/azure-monitor/metrics/prometheus-metrics-overview)."""
    api = _api(model, clock)
    xid = 'DCGM_FI_DEV_XID_ERRORS{instance="aks-gpu-0",gpu="0"}'
    lowest = 'min_over_time(DCGM_FI_DEV_XID_ERRORS{instance="aks-gpu-0",gpu="0"}[%ds])'
    model.inject_xid("aks-gpu-0", 0, 48, cluster="c1")
    clock.t = NOW + 120
    model.inject_xid("aks-gpu-0", 0, 13, cluster="c1")
    clock.t = NOW + 300
    assert list(_result(_get(api, xid), at=NOW + 300).values()) == ["13"]
    assert list(_result(_get(api, xid, time=str(NOW + 90)), at=NOW + 90).values()) == ["48"]
    assert list(_result(_get(api, lowest % 90, time=str(NOW + 90)), at=NOW + 90).values()) == ["48"]
    assert list(_result(_get(api, lowest % 210), at=NOW + 300).values()) == ["13"]  # never 0 since NOW + 90
    model.reboot("aks-gpu-0", cluster="c1")
    clock.t = NOW + 330
    model.inject_xid("aks-gpu-0", 0, 13, cluster="c1")
    clock.t = NOW + 420
    assert list(_result(_get(api, xid), at=NOW + 420).values()) == ["13"]
    assert list(_result(_get(api, lowest % 330), at=NOW + 420).values()) == ["0"]  # the reset shows


def test_one_label_set_is_one_series_and_min_over_time_sees_every_writer(model: PrometheusModel, clock: Clock) -> None:
    """A forged copy with the exporter's exact labels interleaves with its samples (same labels = same series)."""
    forged = model.add_scraped("", exposed={"__name__": "DCGM_FI_DEV_XID_ERRORS", "job": "dcgm-exporter",
                                            "instance": "aks-gpu-1", "gpu": "0", "cluster": "c1"},
                               target={"job": "team-a/mon", "instance": "10.1.1.1:8080"}, value=79, honor=True)
    assert forged == {"__name__": "DCGM_FI_DEV_XID_ERRORS", "job": "dcgm-exporter", "instance": "aks-gpu-1",
                      "gpu": "0", "cluster": "c1"}
    api = _api(model, clock)
    xid = 'DCGM_FI_DEV_XID_ERRORS{instance="aks-gpu-1",gpu="0"}'
    seen = set()
    for dt in (0, 15, 30, 45):
        clock.t = NOW + dt
        seen |= set(_result(_get(api, xid), at=NOW + dt).values())
    assert seen == {"0", "79"}  # whichever scraped last
    window = 'min_over_time({__name__="DCGM_FI_DEV_XID_ERRORS", instance="aks-gpu-1", gpu="0"}[90s])'
    assert list(_result(_get(api, window), at=NOW + 45).items()) == [
        ((("cluster", "c1"), ("gpu", "0"), ("instance", "aks-gpu-1"), ("job", "dcgm-exporter")), "0")]  # name dropped
    assert list(_result(_get(api, window.replace("min_", "max_")), at=NOW + 45).values()) == ["79"]


@pytest.mark.parametrize(("honor", "expect"), [
    (False, {"job": "team-a/mon", "instance": "10.1.1.1:8080", "exported_job": "dcgm-exporter",
             "exported_instance": "aks-gpu-1"}),
    (True, {"job": "dcgm-exporter", "instance": "aks-gpu-1"})])
def test_honor_labels_decides_who_wins_a_clash(model: PrometheusModel, honor: bool, expect: dict[str, str]) -> None:
    labels = model.add_scraped("c1", exposed={"__name__": "X", "job": "dcgm-exporter", "instance": "aks-gpu-1"},
                               target={"job": "team-a/mon", "instance": "10.1.1.1:8080", "namespace": "team-a"},
                               value=1, honor=honor)
    assert labels == {"__name__": "X", "namespace": "team-a", "cluster": "c1", **expect}


def test_a_cluster_alias_renames_everything_the_cluster_sends(model: PrometheusModel, clock: Clock) -> None:
    model.add_scraped("c1", exposed={"__name__": "DCGM_FI_DEV_XID_ERRORS", "job": "dcgm-exporter",
                                     "instance": "aks-gpu-9", "gpu": "0"}, target={}, value=79, honor=True)
    model.set_alias("c1", "prod-east")  # set after the tenant's series began: it is relabelled too
    assert {dict(k)["cluster"] for k in _result(_get(_api(model, clock), QUERY))} == {"prod-east"}
    clock.t = NOW + 15
    forged = [dict(k) for k in _result(_get(_api(model, clock), 'DCGM_FI_DEV_XID_ERRORS{instance="aks-gpu-9"}'),
                                       at=NOW + 15)]
    assert [f["cluster"] for f in forged] == ["prod-east"]


@pytest.mark.parametrize("query", [
    "",
    "rate(DCGM_FI_DEV_XID_ERRORS[5m])",
    "min_over_time(DCGM_FI_DEV_XID_ERRORS)",  # an instant vector where a range is needed
    "DCGM_FI_DEV_XID_ERRORS[5m]",
    "DCGM_FI_DEV_XID_ERRORS > 0",
    "DCGM_FI_DEV_XID_ERRORS or DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "topk(1, DCGM_FI_DEV_XID_ERRORS)",
    "max without (pod) (DCGM_FI_DEV_XID_ERRORS)",
    'DCGM_FI_DEV_XID_ERRORS{gpu="0"',
    'DCGM_FI_DEV_XID_ERRORS{gpu=~"("}',
    '{gpu="0"}',  # not scoped to a metric
    '{__name__=~".*"}',  # only matchers that match the empty string
    'DCGM_FI_DEV_XID_ERRORS{__name__="DCGM_FI_DEV_ROW_REMAP_FAILURE"}',  # two __name__ matchers
    "max by (Hostname) (DCGM_FI_DEV_XID_ERRORS) by (gpu)",
    "DCGM_FI_DEV_XID_ERRORS offset 5m",
])
def test_anything_outside_the_subset_is_bad_data(model: PrometheusModel, query: str) -> None:
    resp = _get(PrometheusApi(model, now=model.now), query)
    body = _body(resp)
    assert resp.status == 400 and body["status"] == "error" and body["errorType"] == "bad_data" and body["error"]
    with pytest.raises(PromQLError):
        parse(query)


def test_auth_with_the_simulators_token_issuer(model: PrometheusModel) -> None:
    issuer = TokenIssuer(now=lambda: NOW)
    api = PrometheusApi(model, now=lambda: NOW, issuer=issuer)
    good, _ = issuer.issue(PROMETHEUS_AUDIENCES[0] + "/.default", principal="app")
    arm, _ = issuer.issue("https://management.azure.com/", principal="app")
    assert _get(api, QUERY, token=good).status == 200
    for token in (None, arm, "forged"):
        resp = _get(api, QUERY, token=token)
        assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
    assert model.queries == [QUERY]  # refused queries were never evaluated


@pytest.mark.parametrize(("switch", "status", "error_type"), [
    ("outage", 503, "unavailable"), ("query_timeout", 503, "timeout"), ("throttle_retry_after", 429, "unavailable")])
def test_fault_switches(model: PrometheusModel, switch: str, status: int, error_type: str) -> None:
    setattr(model, switch, 30 if switch == "throttle_retry_after" else True)
    resp = _get(PrometheusApi(model, now=model.now), QUERY)
    assert (resp.status, _body(resp)["errorType"]) == (status, error_type)
    if status == 429:
        assert resp.headers["Retry-After"] == "30"


def test_slow_and_partial_answers(model: PrometheusModel) -> None:
    model.slow_s, model.warning = 45.0, "one store unreachable"
    resp = _get(PrometheusApi(model, now=model.now), QUERY)
    assert resp.delay_s == 45.0 and _body(resp)["warnings"] == ["one store unreachable"]


def test_wrong_path_and_method(model: PrometheusModel) -> None:
    api = PrometheusApi(model, now=model.now)
    assert api.handle(Request("GET", "/api/v1/query_range?query=up", Headers({"Authorization": "Bearer t"}))).status == 404
    assert api.handle(Request("DELETE", "/api/v1/query", Headers({"Authorization": "Bearer t"}))).status == 405


@pytest.mark.parametrize(("value", "text"), [(79.0, "79"), (0.5, "0.5"), (float("nan"), "NaN"),
                                             (float("inf"), "+Inf"), (float("-inf"), "-Inf"), (-2.0, "-2")])
def test_values_render_as_prometheus_does(value: float, text: str) -> None:
    assert format_value(value) == text


# --------------------------------------------------------------------------- the app's client, over a socket
class _Bridge(BaseHTTPRequestHandler):
    api: PrometheusApi

    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        resp = self.api.handle(Request(self.command, self.path, Headers(dict(self.headers)), body))
        self.send_response(resp.status)
        for k, v in resp.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(resp.body)))
        self.end_headers()
        self.wfile.write(resp.body)

    do_GET = do_POST = _serve


@pytest.fixture
def served(model: PrometheusModel) -> Iterator[str]:
    handler = type("Bridge", (_Bridge,), {"api": PrometheusApi(model, now=model.now)})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_apps_client_reads_an_xid_79_and_feeds_the_policy(model: PrometheusModel, served: str) -> None:
    model.inject_xid("aks-gpu-1", 0, 79, cluster="c1")
    result = PrometheusClient(served, lambda: "tok").query(QUERY)
    faults = {(s.labels["instance"], s.labels["gpu"]): sp.xid_action(x)
              for s in result.samples if s.labels["__name__"] == sp.XID_METRIC and (x := sp.xid_of(s.value))}
    assert list(faults) == [("aks-gpu-1", "0")]
    assert (faults[("aks-gpu-1", "0")].action, faults[("aks-gpu-1", "0")].row) == (sp.RESTART_THEN_REPLACE, "xid:79")


@pytest.mark.parametrize(("switch", "error"), [("outage", Transient), ("query_timeout", Transient),
                                               ("throttle_retry_after", Throttled), ("warning", Transient)])
def test_the_apps_client_never_reads_a_failed_answer_as_healthy(model: PrometheusModel, served: str, switch: str,
                                                                error: type[Exception]) -> None:
    setattr(model, switch, {"throttle_retry_after": 5, "warning": "partial"}.get(switch, True))
    with pytest.raises(error):
        PrometheusClient(served, lambda: "tok").query(QUERY)


def test_the_apps_client_on_bad_data_and_missing_token(model: PrometheusModel, served: str) -> None:
    with pytest.raises(Invalid) as bad:
        PrometheusClient(served, lambda: "tok").query("rate(DCGM_FI_DEV_XID_ERRORS[5m])")
    assert bad.value.code == "bad_data"
    with pytest.raises(Forbidden):
        PrometheusClient(served, lambda: "").query(QUERY)

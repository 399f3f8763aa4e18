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
from sim.http import Headers, Request, Response
from sim.prometheus import PROMETHEUS_AUDIENCES, PrometheusApi, PrometheusModel, PromQLError, format_value, parse
from sim.tokens import TokenIssuer

NOW = 1_750_000_000.0
QUERY = sp.dcgm_query()


@pytest.fixture
def model() -> PrometheusModel:
    m = PrometheusModel()
    m.add_node("aks-gpu-0", gpus=2)
    m.add_node("aks-gpu-1", gpus=2)
    return m


def _get(api: PrometheusApi, query: str, token: str | None = "t", **params: str) -> Response:
    headers = Headers({"Authorization": f"Bearer {token}"} if token else {})
    return api.handle(Request("GET", "/api/v1/query?" + urlencode({"query": query, **params}), headers))


def _post(api: PrometheusApi, form: dict[str, str], token: str = "t") -> Response:
    headers = Headers({"Authorization": f"Bearer {token}", "Content-Type": "application/x-www-form-urlencoded"})
    return api.handle(Request("POST", "/api/v1/query", headers, urlencode(form).encode()))


def _body(resp: Response) -> dict[str, Any]:
    return json.loads(resp.body)  # type: ignore[no-any-return]


def _result(resp: Response) -> dict[tuple[str, ...], str]:
    body = _body(resp)
    assert resp.status == 200 and body["status"] == "success" and body["data"]["resultType"] == "vector"
    out = {}
    for item in body["data"]["result"]:
        ts, value = item["value"]
        assert ts == NOW and isinstance(value, str)
        out[tuple(sorted(item["metric"].items()))] = value
    return out


def test_the_apps_query_returns_one_sample_per_metric_node_and_gpu(model: PrometheusModel) -> None:
    model.inject_xid("aks-gpu-1", 1, 79)
    result = _result(_get(PrometheusApi(model, now=lambda: NOW), QUERY))
    assert len(result) == len(sp.QUERY_METRICS) * 4
    key = (("Hostname", "aks-gpu-1"), ("__name__", "DCGM_FI_DEV_XID_ERRORS"), ("gpu", "1"))
    assert result[key] == "79"
    assert {v for k, v in result.items() if k != key} == {"0"}


def test_post_form_and_a_relabelled_node_label() -> None:
    m = PrometheusModel(node_label="node")
    m.add_node("n1", gpus=1)
    m.set("n1", 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)
    resp = _post(PrometheusApi(m, now=lambda: NOW), {"query": sp.dcgm_query("node"), "time": str(NOW)})
    result = _result(resp)
    assert result[(("__name__", "DCGM_FI_DEV_ROW_REMAP_FAILURE"), ("gpu", "0"), ("node", "n1"))] == "1"
    assert m.queries == [sp.dcgm_query("node")]


def test_a_plain_selector_keeps_every_exporter_label(model: PrometheusModel) -> None:
    resp = _get(PrometheusApi(model, now=lambda: NOW), 'DCGM_FI_DEV_XID_ERRORS{Hostname="aks-gpu-0",gpu=~"1|7"}')
    [(labels, value)] = _result(resp).items()
    names = dict(labels)
    assert value == "0"
    assert set(names) == {"__name__", "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                          "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod"}
    assert names["gpu"] == "1" and names["device"] == "nvidia1" and names["UUID"].startswith("GPU-")


def test_aggregations_and_by_after_the_parenthesis(model: PrometheusModel) -> None:
    model.ecc_storm("aks-gpu-0", 0, dbe=3)
    model.ecc_storm("aks-gpu-0", 1, dbe=2)
    api = PrometheusApi(model, now=lambda: NOW)
    assert _result(_get(api, "sum(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) by (Hostname)")) == {
        (("Hostname", "aks-gpu-0"),): "5", (("Hostname", "aks-gpu-1"),): "0"}
    assert _result(_get(api, "count(DCGM_FI_DEV_ROW_REMAP_PENDING)")) == {(): "4"}
    assert _result(_get(api, 'min by (Hostname) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname!~"aks-gpu-1"})')) == {
        (("Hostname", "aks-gpu-0"),): "2"}


def test_reboot_resets_volatile_values_and_removal_leaves_no_series(model: PrometheusModel) -> None:
    model.ecc_storm("aks-gpu-0", 0)
    model.reboot("aks-gpu-0")
    api = PrometheusApi(model, now=lambda: NOW)
    result = _result(_get(api, 'max by (__name__) ({__name__=~"DCGM_FI_DEV_ECC_DBE_.*",Hostname="aks-gpu-0"})'))
    assert result == {(("__name__", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),): "4",
                      (("__name__", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),): "0"}
    model.remove_node("aks-gpu-0")
    assert _result(_get(api, 'DCGM_FI_DEV_XID_ERRORS{Hostname="aks-gpu-0"}')) == {}


@pytest.mark.parametrize("query", [
    "",
    "rate(DCGM_FI_DEV_XID_ERRORS[5m])",
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
    resp = _get(PrometheusApi(model, now=lambda: NOW), query)
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
    resp = _get(PrometheusApi(model, now=lambda: NOW), QUERY)
    assert (resp.status, _body(resp)["errorType"]) == (status, error_type)
    if status == 429:
        assert resp.headers["Retry-After"] == "30"


def test_slow_and_partial_answers(model: PrometheusModel) -> None:
    model.slow_s, model.warning = 45.0, "one store unreachable"
    resp = _get(PrometheusApi(model, now=lambda: NOW), QUERY)
    assert resp.delay_s == 45.0 and _body(resp)["warnings"] == ["one store unreachable"]


def test_wrong_path_and_method(model: PrometheusModel) -> None:
    api = PrometheusApi(model, now=lambda: NOW)
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
    handler = type("Bridge", (_Bridge,), {"api": PrometheusApi(model, now=lambda: NOW)})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_apps_client_reads_an_xid_79_and_feeds_the_policy(model: PrometheusModel, served: str) -> None:
    model.inject_xid("aks-gpu-1", 0, 79)
    result = PrometheusClient(served, lambda: "tok").query(QUERY)
    faults = {(s.labels["Hostname"], s.labels["gpu"]): sp.xid_action(x)
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

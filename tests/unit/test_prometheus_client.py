"""The PromQL client against a local HTTP server: the request it sends, the answers it decodes and
every way an answer can fail, which must raise and never read as "no errors"."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

from shared.adapters.prometheus import AZURE_MONITOR_PROMETHEUS_RESOURCE, PrometheusClient, Sample, decode_instant
from shared.kernel.errors import Forbidden, Invalid, NotFound, Throttled, Transient

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "aks-gpu-1", "gpu": "0"}, "value": [1700000000.5, "79"]},
    {"metric": {"__name__": "DCGM_FI_DEV_ROW_REMAP_PENDING", "Hostname": "aks-gpu-2", "gpu": "3"},
     "value": [1700000000.5, "NaN"]},
]}}


@dataclass
class Script:
    """What the server answers next, and what it was asked."""

    status: int = 200
    body: bytes = json.dumps(VECTOR).encode()
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    hold: threading.Event | None = None  # block the answer until set (a slow server)
    requests: list[dict[str, Any]] = field(default_factory=list)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out or a connection we dropped on purpose: expected here


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode()
            script.requests.append({"path": self.path, "headers": dict(self.headers), "form": parse_qs(body)})
            if script.hold is not None:
                script.hold.wait(10)
            if script.drop:
                self.close_connection = True
                self.connection.close()
                return
            self.send_response(script.status)
            for k, v in script.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(script.body)))
            self.end_headers()
            self.wfile.write(script.body)

    httpd = _QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    finally:
        if script.hold is not None:
            script.hold.set()
        httpd.shutdown()
        httpd.server_close()


def _client(url: str, timeout_s: float = 5.0) -> PrometheusClient:
    return PrometheusClient(url + "/", lambda: "tok-123", timeout_s=timeout_s)


def test_success_decodes_the_vector_and_sends_one_authenticated_post(server: tuple[str, Script]) -> None:
    url, script = server
    result = _client(url).query('max by (Hostname) ({__name__=~"A|B"})', at=1700000000.5)
    assert result.samples[0] == Sample({"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "aks-gpu-1", "gpu": "0"},
                                       79.0, 1700000000.5)
    assert result.samples[1].labels["Hostname"] == "aks-gpu-2" and result.samples[1].value != result.samples[1].value
    [req] = script.requests
    assert req["path"] == "/api/v1/query"
    assert req["headers"]["Authorization"] == "Bearer tok-123"
    assert req["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert req["form"] == {"query": ['max by (Hostname) ({__name__=~"A|B"})'], "time": ["1700000000.500"]}
    assert AZURE_MONITOR_PROMETHEUS_RESOURCE == "https://prometheus.monitor.azure.com"


def test_an_empty_vector_is_a_real_empty_answer(server: tuple[str, Script]) -> None:
    url, script = server
    script.body = b'{"status":"success","data":{"resultType":"vector","result":[]},"infos":["hint"]}'
    result = _client(url).query("up")
    assert result.samples == () and result.infos == ("hint",)


@pytest.mark.parametrize(("status", "body", "headers", "error", "check"), [
    (503, {"status": "error", "errorType": "unavailable", "error": "down"}, {}, Transient, "unavailable"),
    (503, {"status": "error", "errorType": "timeout", "error": "query timed out"}, {}, Transient, "timeout"),
    (499, {"status": "error", "errorType": "canceled", "error": "canceled"}, {}, Transient, "canceled"),
    (500, {"status": "error", "errorType": "internal", "error": "boom"}, {}, Transient, "internal"),
    (502, "<html>bad gateway</html>", {}, Transient, "bad gateway"),
    (429, {"status": "error", "errorType": "unavailable", "error": "slow down"}, {"Retry-After": "7"}, Throttled, ""),
    (400, {"status": "error", "errorType": "bad_data", "error": "1:5: parse error"}, {}, Invalid, "bad_data"),
    (422, {"status": "error", "errorType": "execution", "error": "too many samples"}, {}, Invalid, "execution"),
    (401, "", {"WWW-Authenticate": "Bearer"}, Forbidden, "401"),
    (403, {"error": {"code": "AuthorizationFailed"}}, {}, Forbidden, "403"),
    (404, "404 page not found", {}, NotFound, "404"),
])
def test_errors_map_to_kernel_errors(server: tuple[str, Script], status: int, body: Any, headers: dict[str, str],
                                     error: type[Exception], check: str) -> None:
    url, script = server
    script.status, script.headers = status, headers
    script.body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    with pytest.raises(error) as raised:
        _client(url).query("up")
    assert check in str(raised.value)
    if isinstance(raised.value, Throttled):
        assert raised.value.retry_after == 7.0
    if isinstance(raised.value, Invalid):
        assert raised.value.code == check


def test_retry_after_as_an_http_date(server: tuple[str, Script]) -> None:
    url, script = server
    script.status, script.headers, script.body = 429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, b""
    with pytest.raises(Throttled) as raised:
        _client(url).query("up")
    assert raised.value.retry_after == 0.0  # a date in the past: retry now, never a negative wait


@pytest.mark.parametrize(("body", "error", "check"), [
    ({"status": "success", "warnings": ["store 2 unreachable"], "data": {"resultType": "vector", "result": []}},
     Transient, "partial answer"),
    ({"status": "success", "data": {"resultType": "matrix", "result": []}}, Invalid, "resultType 'matrix'"),
    ({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}, Invalid, "resultType 'scalar'"),
    ({"status": "success"}, Invalid, "without data"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}, Invalid, "malformed"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "x"]}]}},
     Invalid, "not a number"),
    ({"status": "error", "errorType": "timeout", "error": "late"}, Transient, "timeout"),
    ({"status": "maybe"}, Invalid, "unknown answer status"),
    ("not json at all", Invalid, "not a Prometheus API envelope"),
])
def test_a_2xx_that_is_not_a_complete_vector_raises(server: tuple[str, Script], body: Any, error: type[Exception],
                                                    check: str) -> None:
    url, script = server
    script.body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    with pytest.raises(error, match=check):
        _client(url).query("up")


def test_a_dropped_connection_is_transient(server: tuple[str, Script]) -> None:
    url, script = server
    script.drop = True
    with pytest.raises(Transient):
        _client(url).query("up")


def test_a_server_slower_than_the_timeout_is_transient(server: tuple[str, Script]) -> None:
    url, script = server
    script.hold = threading.Event()  # the server answers only when released (after the assertion)
    with pytest.raises(Transient, match=r"ReadTimeoutError|TimeoutError"):
        _client(url, timeout_s=0.2).query("up")


def test_nothing_listening_is_transient() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = httpd.server_address[1]
    httpd.server_close()
    with pytest.raises(Transient):
        _client(f"http://127.0.0.1:{port}").query("up")


@pytest.mark.parametrize(("endpoint", "timeout_s"), [("ftp://x", 5.0), ("workspace.prometheus.monitor.azure.com", 5.0),
                                                     ("https://x", 0.0)])
def test_bad_construction(endpoint: str, timeout_s: float) -> None:
    with pytest.raises(ValueError):
        PrometheusClient(endpoint, lambda: "t", timeout_s=timeout_s)


def test_decode_instant_keeps_special_values() -> None:
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"a": "1"}, "value": [5, "+Inf"]}, {"metric": {"a": "2"}, "value": [5, "-Inf"]}]}}).encode()
    assert [s.value for s in decode_instant(body).samples] == [float("inf"), float("-inf")]

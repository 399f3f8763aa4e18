"""Sockets, TLS and dispatch: one HTTPS listener for every simulated service, one plain-HTTP listener
for the managed-identity endpoint (plain HTTP on App Service too).

Handlers (:class:`sim.core.http.Handler`) never see sockets; this module turns bytes into
:class:`sim.core.http.Request`, picks the handler by path prefix, honours the fault fields of the
:class:`sim.core.http.Response` (``delay_s``, ``drop``), counts the request in the oracles and never lets a
handler's exception take the server down: it becomes a 500 with an error body.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sim.core.certs import CertFiles
from sim.core.http import Handler, Headers, Request, Response
from sim.core.oracles import route_template
from sim.model import Fleet

log = logging.getLogger("sim.core.server")
MAX_BODY = 64 * 1024 * 1024


class Unavailable:
    """Stands in for a service whose module is not there (yet): 503 with an ARM-shaped error."""

    def __init__(self, what: str, why: str) -> None:
        self.what, self.why = what, why

    def handle(self, request: Request) -> Response:
        return Response.arm_error(503, "ServiceUnavailable", f"{self.what} is not available in this simulator: {self.why}")


def _load(module: str, cls: str, fleet: Fleet) -> Handler:
    try:
        mod = __import__(module, fromlist=[cls])
        return getattr(mod, cls)(fleet)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as e:
        log.warning("%s.%s unavailable: %s", module, cls, e)
        return Unavailable(f"{module}.{cls}", str(e))


class Routes:
    """Prefix -> (service name, handler)."""

    def __init__(self, fleet: Fleet, routes: list[tuple[str, str, Handler]]) -> None:
        self.fleet = fleet
        self.routes = routes

    def pick(self, path: str) -> tuple[str, Handler] | None:
        for prefix, service, handler in self.routes:
            if path.startswith(prefix):
                return service, handler
        return None


def _make_handler_class(routes: Routes) -> type[BaseHTTPRequestHandler]:
    class SimRequestHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        server_version = "fleet-sim/1.0"
        sys_version = ""
        timeout = 120

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _read_body(self) -> bytes | None:
            if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
                chunks = []
                total = 0
                while True:
                    line = self.rfile.readline(1024)
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    total += size
                    if total > MAX_BODY:
                        return None
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline(1024)
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return None
            return self.rfile.read(length) if length > 0 else b""

        def _serve(self) -> None:
            try:
                body = self._read_body()
            except (ValueError, OSError):
                self._send(Response.json(400, {"error": {"code": "BadRequest", "message": "malformed body"}}))
                self.close_connection = True
                return
            if body is None:
                self._send(Response.json(413, {"error": {"code": "RequestEntityTooLarge", "message": "body too large"}}))
                self.close_connection = True
                return
            request = Request(method=self.command.upper(), target=self.path, headers=Headers(self.headers.items()),
                              body=body)
            try:
                routes.fleet.pump()  # timed callbacks that are due happen before any service answers
            except Exception:
                log.exception("pump failed before %s %s", request.method, request.path)
            picked = routes.pick(request.path)
            if picked is None:
                resp = Response.json(404, {"error": {"code": "NotFound", "message": f"no service at {request.path}"}})
                service, route = "none", request.path
            else:
                service, handler = picked
                try:
                    resp = handler.handle(request)
                except Exception as e:  # a handler bug must not take the listener down
                    log.exception("handler %s failed on %s %s", service, request.method, request.path)
                    resp = Response.json(500, {"error": {"code": "InternalServerError", "message": repr(e)}})
                try:
                    route_fn = getattr(handler, "route", None)
                    route = route_fn(request) if callable(route_fn) else route_template(service, request.path)
                except Exception:
                    route = request.path
            if service != "control":
                routes.fleet.oracles.record_request(service=service, method=request.method, route=route,
                                                    status=resp.status)
            if resp.delay_s and resp.delay_s > 0:
                time.sleep(min(resp.delay_s, 600.0))
            if resp.drop:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if getattr(resp, "stream", None) is not None:
                self._send_stream(resp)
                return
            self._send(resp)

        def _send_stream(self, resp: Response) -> None:
            """Chunked transfer of a body produced while it is sent (watch streams)."""
            stream = resp.stream  # type: ignore[attr-defined]
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in stream:
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True
            finally:
                stream.close()

        def _send(self, resp: Response) -> None:
            body = resp.body or b""
            self.send_response(resp.status)
            sent = {k.lower() for k in resp.headers}
            for k, v in resp.headers.items():
                if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(k, v)
            if "content-type" not in sent and body:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve

    return SimRequestHandler


class _TlsServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 context: ssl.SSLContext | None) -> None:
        self.context = context
        super().__init__(addr, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.context is not None:
            # handshake in the worker thread (do_handshake_on_connect), not in the accept loop
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.settimeout(30)
                request.do_handshake()
                request.settimeout(None)
            except (OSError, ssl.SSLError):
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection error from %s", client_address, exc_info=True)


class SimServer:
    """The listeners of one simulator process."""

    def __init__(self, fleet: Fleet, certs: CertFiles, *, host: str = "127.0.0.1", port: int = 0,
                 identity_port: int = 0, extra: dict[str, Any] | None = None) -> None:
        from sim.core.control import ControlApi
        from sim.kube.api import KubeApi

        self.fleet = fleet
        if not getattr(fleet, "ca_pem", None):
            fleet.ca_pem = certs.ca.read_bytes()  # type: ignore[attr-defined]
        fleet.ca_path = str(certs.ca)  # type: ignore[attr-defined]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(certs.cert), str(certs.key))
        ctx.set_alpn_protocols(["http/1.1"])
        self.control = ControlApi(fleet, extra=extra or {})
        self.kube = KubeApi(fleet)
        self.arm = _load("sim.arm.api", "ArmApi", fleet)
        self.eventgrid = _load("sim.eventgrid.api", "EventGridApi", fleet)
        self.identity = _load("sim.identity.api", "IdentityApi", fleet)
        self.dcgm = _load("sim.prometheus.dcgm", "FleetDcgm", fleet)  # the Azure Monitor workspace's PromQL endpoint
        self.control.handlers = {"arm": self.arm, "eventgrid": self.eventgrid, "identity": self.identity,
                                 "dcgm": self.dcgm}
        https_routes = Routes(fleet, [("/subscriptions/", "arm", self.arm), ("/providers/", "arm", self.arm),
                                      ("/prometheus/", "prometheus", self.dcgm),
                                      ("/k8s/", "kube", self.kube), ("/eventgrid/", "eventgrid", self.eventgrid),
                                      ("/_sim/", "control", self.control), ("/_sim", "control", self.control)])
        http_routes = Routes(fleet, [("/_sim/", "control", self.control), ("/", "identity", self.identity)])
        self.https = _TlsServer((host, port), _make_handler_class(https_routes), ctx)
        self.http = _TlsServer((host, identity_port), _make_handler_class(http_routes), None)
        self.host = host
        self._threads: list[threading.Thread] = []

    @property
    def https_port(self) -> int:
        return int(self.https.server_address[1])

    @property
    def http_port(self) -> int:
        return int(self.http.server_address[1])

    @property
    def base_url(self) -> str:
        return f"https://{self.host}:{self.https_port}"

    def start(self) -> None:
        self.fleet.base_url = self.base_url  # type: ignore[attr-defined]
        self.fleet.identity_url = f"http://{self.host}:{self.http_port}"  # type: ignore[attr-defined]
        for srv, name in ((self.https, "https"), (self.http, "identity")):
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, name=f"sim-{name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        self.fleet.start()

    def stop(self) -> None:
        self.fleet.stop()
        for srv in (self.https, self.http):
            srv.shutdown()
            srv.server_close()

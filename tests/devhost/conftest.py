"""Fixtures for the local host's tests: the fake app, hosts on unique queues, an Event Grid feed.

The feed is the simulator's own Event Grid handler (``sim.eventgrid.api.EventGridApi``) behind a plain
HTTP server, with a minimal fleet (clock, lock, timings), so the host is tested against the real
deliveries protocol before the whole simulator is up.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devhost import indexing
from devhost.host import Host

FAKE_APP = Path(__file__).resolve().parent / "fake_app"


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Hosts put their settings into os.environ (as the real host does); undo that after each test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def fake_app() -> ModuleType:
    module = indexing.import_app_module("function_app", app_dir=FAKE_APP)
    module.CALLS.clear()
    return module


@pytest.fixture
def queues(names: Any) -> dict[str, str]:
    return {"WORK_QUEUE": names.queue("work"), "NUDGE_QUEUE": names.queue("nudge"), "AUDIT_QUEUE": names.queue("audit")}


@pytest.fixture
def make_host(storage_connection_string: str, queues: dict[str, str], fake_app: ModuleType) -> Iterator[Callable[..., Host]]:
    hosts: list[Host] = []

    def make(*, start: bool = True, settings: dict[str, str] | None = None, **kwargs: Any) -> Host:
        values = {"AzureWebJobsStorage": storage_connection_string, "TICK_SCHEDULE": "0 0 0 1 1 *", **queues,
                  **(settings or {})}
        kwargs.setdefault("host_json", FAKE_APP / "host.json")
        kwargs.setdefault("eventgrid_subscriptions", FAKE_APP / "eventgrid_subscriptions.json")
        host = Host("function_app", values, app_dir=FAKE_APP, **kwargs)
        hosts.append(host)
        return host.start() if start else host

    yield make
    for host in hosts:
        host.stop(timeout=10)


class _FakeFleet:
    """What sim.eventgrid needs of the simulator's Fleet."""

    def __init__(self) -> None:
        from shared.kernel.clock import SystemClock

        self.clock = SystemClock()
        self.lock = threading.RLock()
        self.timings = {"eventgrid_backoff_scale": 0.001, "eventgrid_max_attempts": 30}
        self.faults = None
        self.rng = random.Random(7)
        self.tokens = None


class FeedServer:
    def __init__(self) -> None:
        from sim.core.http import Headers, Request
        from sim.eventgrid.api import EventGridApi

        self.api = EventGridApi(_FakeFleet())
        api = self.api

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(method=self.command, target=self.path, headers=Headers(dict(self.headers.items())),
                                  body=self.rfile.read(length) if length else b"")
                response = api.handle(request)
                self.send_response(response.status)
                for key, value in response.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()
                self.wfile.write(response.body)

            do_GET = do_POST = _serve

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/eventgrid/_deliveries"

    def publish(self, *events: dict[str, Any]) -> None:
        with self.api.fleet.lock:
            for event in events:
                self.api.state.events.append((self.api.fleet.clock.now(), json.loads(json.dumps(event))))

    def subscriber(self, name: str) -> Any:
        with self.api.fleet.lock:
            return self.api.state.subscribers.get(name)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def feed() -> Iterator[FeedServer]:
    server = FeedServer()
    yield server
    server.close()

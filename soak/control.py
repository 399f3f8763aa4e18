"""A keep-alive HTTPS client for the simulator's control API and Event Grid feed.

A soak step makes several control calls (advance the clock, sample the state, fetch and settle
deliveries); ``urllib`` opens a new TLS connection for each, which costs more than the call. One
persistent connection per thread (the simulator speaks HTTP/1.1) keeps a step cheap.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from typing import Any


class ControlError(RuntimeError):
    pass


class SimClient:
    """``control``/``state``/``oracles``/``token`` like ``sim.testing.SimHandle``, and the deliveries feed."""

    def __init__(self, endpoints: dict[str, Any]) -> None:
        self.endpoints = endpoints
        control = urllib.parse.urlsplit(str(endpoints["control"]))
        self._host = control.hostname or "127.0.0.1"
        self._port = int(control.port or 443)
        self._control_path = control.path.rstrip("/")
        self._feed_path = urllib.parse.urlsplit(str(endpoints["eventgrid_deliveries"])).path.rstrip("/")
        self._tls = ssl.create_default_context(cafile=str(endpoints["ca_bundle"]))
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self._host, self._port, context=self._tls, timeout=120)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (1, 2):
            conn = self._conn()
            try:
                conn.request(method.upper(), path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                continue
            if response.status >= 400:
                raise ControlError(f"{method} {path}: {response.status} {raw.decode(errors='replace')[:500]}")
            return json.loads(raw) if raw else None
        return None

    def control(self, method: str, path: str, body: Any = None) -> Any:
        return self.request(method, f"{self._control_path}/{path.lstrip('/')}", body)

    def state(self) -> dict[str, Any]:
        return dict(self.control("GET", "/state"))

    def oracles(self) -> dict[str, Any]:
        return dict(self.control("GET", "/oracles"))

    def token(self, audience: str) -> str:
        return str(self.control("POST", "/token", {"audience": audience})["access_token"])

    def published(self) -> list[dict[str, Any]]:
        """Every CloudEvent the simulated topic accepted (``/eventgrid/_published``), oldest first."""
        path = self._feed_path.rsplit("/", 1)[0] + "/_published"
        return [dict(item["event"]) for item in (self.request("GET", path) or {}).get("events") or []]

    # ---- the Event Grid deliveries feed (same calls as devhost.eventgrid.DeliveriesFeed)
    def fetch(self, *, subscriber: str, max_n: int, lock_s: float, types: tuple[str, ...]) -> list[dict[str, Any]]:
        query = {"subscriber": subscriber, "max": str(max_n), "lock_s": f"{lock_s:g}"}
        if types:
            query["types"] = ",".join(types)
        answer = self.request("GET", f"{self._feed_path}?{urllib.parse.urlencode(query)}")
        return list((answer or {}).get("deliveries") or [])

    def backlog(self, *, subscriber: str, types: tuple[str, ...]) -> tuple[int, float | None]:
        """(deliveries queued or locked for ``subscriber``, when the next is due): ``/eventgrid/_backlog``."""
        query = {"subscriber": subscriber, **({"types": ",".join(types)} if types else {})}
        answer = self.request("GET", f"{self._feed_path.rsplit('/', 1)[0]}/_backlog?{urllib.parse.urlencode(query)}") or {}
        next_at = answer.get("next_at")
        return int(answer.get("queued", 0)) + int(answer.get("locked", 0)), None if next_at is None else float(next_at)

    def settle(self, *, subscriber: str, lock_token: str, outcome: str, reason: str = "") -> None:
        result = {"lock_token": lock_token, "outcome": outcome}
        if reason:
            result["reason"] = reason[:1000]
        self.request("POST", f"{self._feed_path}/settle", {"subscriber": subscriber, "results": [result]})

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

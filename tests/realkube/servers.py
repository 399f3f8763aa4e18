"""Two API servers side by side, the simulator's and a real kube-apiserver, spoken to the same way.

A :class:`Server` sends one raw request as the administrator or as the app (the bearer token the
simulated managed-identity endpoint issued; the real server reviews it through the simulator's token
webhook) and answers ``(status, body)``. :func:`normalise` drops what a server generates (uids,
resourceVersions, timestamps, managedFields) so two answers can be compared as data.
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# What every server generates on its own, never compared.
VOLATILE_METADATA = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink", "generation",
                     "deletionTimestamp")


@dataclass
class Server:
    name: str
    base_url: str
    ctx: ssl.SSLContext  # the administrator's (a client certificate on the real server)
    app_ctx: ssl.SSLContext  # trusts the server, presents no client certificate: the bearer token is all
    admin_headers: dict[str, str]
    app_token: str
    pod_node: str = ""  # a Ready node whose kubelet runs pods: a pool's node, or a kwok-managed one
    spare_node: str = ""  # another such node, whose kubelet a story may stop
    stop_kubelet: Any = None  # stop_kubelet(node): the node's kubelet stops posting status
    kubeconfig: str = ""  # an administrator's kubeconfig, for kubectl
    calls: list[tuple[str, str, int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the Warning headers of the last answer

    def call(self, method: str, path: str, body: Any = None, *, as_app: bool = False,
             content_type: str = "application/json", headers: dict[str, str] | None = None) -> tuple[int, Any]:
        url = urlsplit(self.base_url)
        conn = http.client.HTTPSConnection(url.hostname or "", url.port or 443,
                                           context=self.app_ctx if as_app else self.ctx, timeout=30)
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        auth = {"Authorization": f"Bearer {self.app_token}"} if as_app else dict(self.admin_headers)
        conn.request(method, url.path.rstrip("/") + path, body=data,
                     headers={"Content-Type": content_type, "Accept": "application/json", **auth, **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        self.warnings = resp.headers.get_all("Warning") or []
        conn.close()
        self.calls.append((method, path, resp.status))
        try:
            return resp.status, (json.loads(raw) if raw else None)
        except ValueError:
            return resp.status, raw.decode(errors="replace")


def is_ready(obj: Any) -> bool:
    """Whether a Node or Pod has the condition Ready=True."""
    return isinstance(obj, dict) and any(c.get("type") == "Ready" and c.get("status") == "True"
                                         for c in (obj.get("status") or {}).get("conditions") or [])


def status_of(body: Any) -> dict[str, Any]:
    """The parts of a ``Status`` answer a client acts on: code, reason, details (kind, name, causes)."""
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return {}
    details = body.get("details") or {}
    causes = [{k: c.get(k) for k in ("reason", "field") if c.get(k)} for c in details.get("causes") or []]
    return {"status": body.get("status"), "reason": body.get("reason", ""), "code": body.get("code"),
            "details": {k: v for k, v in {"name": details.get("name"), "group": details.get("group"),
                                          "kind": details.get("kind"), "causes": causes or None}.items() if v}}


def normalise(obj: Any) -> Any:
    """An object without what the server generates: volatile metadata, and nested the same way in lists."""
    if isinstance(obj, list):
        return [normalise(o) for o in obj]
    if not isinstance(obj, dict):
        return obj
    out = {k: normalise(v) for k, v in obj.items()}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items() if k not in VOLATILE_METADATA}
    return out


def pick(obj: Any, paths: list[str]) -> dict[str, Any]:
    """The values at dotted ``paths`` (missing ones as ``<absent>``), for comparing what a test is about."""
    out: dict[str, Any] = {}
    for path in paths:
        cur: Any = obj
        for part in path.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
                cur = cur[int(part)]
            else:
                cur = "<absent>"
                break
        out[path] = normalise(cur)
    return out

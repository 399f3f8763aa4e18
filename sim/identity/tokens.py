"""Bearer tokens that only this simulator issues, each for one audience.

A token is ``base64url(claims).base64url(hmac)``; the simulated servers accept only tokens that the
simulator's own identity endpoint issued, unexpired, for their audience. Anything else fails
*authentication* with 401, a good token of another audience included: ARM answers 401
``InvalidAuthenticationTokenAudience`` and kube-apiserver's token authenticators reject a token whose
``aud`` is not theirs (401 Unauthorized), neither gets as far as authorization.

Claims carry who the caller is, as Entra ID tokens do: ``oid`` (the principal's object id, which
Kubernetes RBAC bindings on AKS and ARM role assignments name), ``appid`` (the client id ARM quotes
in its errors) and ``groups``. Tokens the test harness asks for (the control endpoint, the
kubeconfigs the simulator writes, ``issue()`` without a principal) belong to an administrator:
group ``system:masters`` in the clusters (kube-apiserver's privileged group) and owner of every ARM
scope. Tokens of the managed-identity endpoint belong to the app, which gets only what the
project's own ``infra/`` grants (sim/kube/rbac.py, sim/arm/rbac.py).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass

ARM_AUDIENCES = ("https://management.azure.com/", "https://management.azure.com")
AKS_AUDIENCES = ("6dae42f8-4368-4678-94ff-3960e28e3630",)
EVENTGRID_AUDIENCES = ("https://eventgrid.azure.net", "https://eventgrid.azure.net/")
STORAGE_AUDIENCES = ("https://storage.azure.com", "https://storage.azure.com/")
# Azure Monitor workspace query endpoints (PromQL): sim/prometheus/api.py, sim/prometheus/dcgm.py
PROMETHEUS_AUDIENCES = ("https://prometheus.monitor.azure.com", "https://prometheus.monitor.azure.com/")
KNOWN_AUDIENCES = ARM_AUDIENCES + AKS_AUDIENCES + EVENTGRID_AUDIENCES + STORAGE_AUDIENCES + PROMETHEUS_AUDIENCES


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


#: The group of administrators: kube-apiserver's privileged group (k8s.io/apiserver/pkg/authentication/user
#: SystemPrivilegedGroup, allowed everything by the authorizer union's first member) and, in the
#: simulated ARM, owner of every scope.
ADMIN_GROUP = "system:masters"
#: Principals that act for the harness (tests, demo, soak), not for the app.
HARNESS_PRINCIPALS = frozenset({"sim-admin", "sim-control", "kubeconfig-user"})


@dataclass(frozen=True)
class Verdict:
    status: int  # 200 ok, 401 missing, invalid, expired or for another audience
    reason: str = ""
    principal: str = ""  # the object id (``oid``)
    client_id: str = ""  # ``appid``; the object id when the token has none
    groups: tuple[str, ...] = ()
    wrong_audience: bool = False  # a valid token, for another audience (still 401)
    audience: str = ""

    @property
    def admin(self) -> bool:
        return ADMIN_GROUP in self.groups


class TokenIssuer:
    def __init__(self, *, now: Callable[[], float], key: bytes | None = None, lifetime_s: int = 3600) -> None:
        self._now = now
        self._key = key or secrets.token_bytes(32)
        self.lifetime_s = lifetime_s

    @staticmethod
    def normalise_audience(resource: str) -> str:
        """``https://x/.default`` and ``https://x/`` name the same audience as ``https://x``."""
        aud = resource.strip()
        if aud.endswith("/.default"):
            aud = aud[: -len("/.default")]
        return aud.rstrip("/")

    def issue(self, resource: str, *, principal: str = "sim-admin", client_id: str = "",
              groups: Iterable[str] | None = None) -> tuple[str, int]:
        """A token for ``resource`` and its expiry (epoch seconds).

        ``groups`` defaults to the administrators' group for the harness principals, none otherwise.
        """
        exp = int(self._now()) + self.lifetime_s
        if groups is None:
            groups = (ADMIN_GROUP,) if principal in HARNESS_PRINCIPALS else ()
        claims = {"aud": self.normalise_audience(resource), "exp": exp, "oid": principal,
                  "appid": client_id or principal, "groups": list(groups)}
        body = _b64(json.dumps(claims, separators=(",", ":")).encode())
        sig = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
        return f"{body}.{sig}", exp

    def verify(self, token: str | None, audiences: Iterable[str]) -> Verdict:
        if not token:
            return Verdict(401, "missing bearer token")
        try:
            body, sig = token.split(".", 1)
            expected = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
            if not hmac.compare_digest(sig, expected):
                return Verdict(401, "token signature is invalid")
            claims = json.loads(_unb64(body))
        except (ValueError, TypeError):
            return Verdict(401, "token is malformed")
        if claims.get("exp", 0) < self._now():
            return Verdict(401, "token has expired")
        wanted = {self.normalise_audience(a) for a in audiences}
        principal = str(claims.get("oid", ""))
        identity = {"principal": principal, "client_id": str(claims.get("appid") or principal),
                    "groups": tuple(str(g) for g in claims.get("groups") or ())}
        if claims.get("aud") not in wanted:
            return Verdict(401, f"token audience {claims.get('aud')!r} is not accepted here", wrong_audience=True,
                           audience=str(claims.get("aud") or ""), **identity)
        return Verdict(200, **identity)

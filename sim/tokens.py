"""Bearer tokens that only this simulator issues, each for one audience.

A token is ``base64url(claims).base64url(hmac)``; the simulated servers accept only tokens that the
simulator's own identity endpoint issued, unexpired, for their audience (401 without or with a bad
token, 403 for a good token of another audience: what ARM and the API server answer).
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
KNOWN_AUDIENCES = ARM_AUDIENCES + AKS_AUDIENCES + EVENTGRID_AUDIENCES + STORAGE_AUDIENCES


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Verdict:
    status: int  # 200 ok, 401 missing/invalid, 403 wrong audience
    reason: str = ""
    principal: str = ""


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

    def issue(self, resource: str, *, principal: str = "steward-identity") -> tuple[str, int]:
        """A token for ``resource`` and its expiry (epoch seconds)."""
        exp = int(self._now()) + self.lifetime_s
        claims = {"aud": self.normalise_audience(resource), "exp": exp, "oid": principal}
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
        if claims.get("aud") not in wanted:
            return Verdict(403, f"token audience {claims.get('aud')!r} is not accepted here")
        return Verdict(200, principal=str(claims.get("oid", "")))

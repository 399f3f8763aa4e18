"""Who the Kubernetes client talks to, and as whom: the kubeconfig ARM hands out, and bearer tokens.

The server URL and CA come from the kubeconfig ARM returns (``listClusterUserCredential``); its
exec/kubelogin user is ignored. Requests carry a bearer token from the app's own credential for the
AKS Microsoft Entra server application (``AKS_SERVER_APP_ID/.default``, as kubelogin asks for it:
learn.microsoft.com/azure/aks/kubelogin-authentication), refreshed before it expires, so no kubelogin
binary and no static credential are needed.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from shared.adapters.arm import map_arm_error
from shared.kernel.errors import Forbidden, Invalid

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

TOKEN_REFRESH_MARGIN_S = 300.0


def server_and_ca(kubeconfig: bytes) -> tuple[str, bytes | None, bool]:
    """``(server URL, CA PEM or None, insecure)`` of the current context's cluster; users are ignored.

    The kubeconfig comes from ARM (``listClusterUserCredential``), so it is input, not configuration:
    a kubeconfig that would weaken TLS is refused rather than obeyed (issue 11 §4). The server must be
    an ``https://`` URL with a host; ``insecure-skip-tls-verify`` and ``certificate-authority`` (a file
    path on *this* machine, which ARM has no business naming) are refused; the CA is taken only from
    ``certificate-authority-data`` and must be PEM. Without CA data the connection is still verified,
    against STEWARD_CA_BUNDLE or the system trust store. ``insecure`` is therefore always False; it
    stays in the tuple for KubeClient, which sets ``verify_ssl`` from it.
    """
    import binascii

    import yaml

    try:
        doc = yaml.safe_load(kubeconfig) or {}
    except yaml.YAMLError as error:
        raise Invalid(f"kubeconfig is not YAML: {type(error).__name__}") from None
    if not isinstance(doc, dict):
        raise Invalid("kubeconfig is not a YAML mapping")
    clusters = {c.get("name"): c.get("cluster") or {} for c in doc.get("clusters") or [] if isinstance(c, dict)}
    contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or [] if isinstance(c, dict)}
    context = contexts.get(doc.get("current-context")) or (next(iter(contexts.values())) if contexts else {})
    cluster = clusters.get(context.get("cluster")) or (next(iter(clusters.values())) if clusters else None)
    if not cluster or not cluster.get("server"):
        raise Invalid("kubeconfig has no cluster server")
    server = str(cluster["server"])
    parts = urlsplit(server)
    if parts.scheme.lower() != "https" or not parts.hostname:
        raise Invalid(f"kubeconfig server {server[:100]!r} is not an https:// URL; refusing to send a token to it")
    if parts.username is not None or parts.password is not None:
        raise Invalid("kubeconfig server URL carries credentials; refusing it")
    if cluster.get("insecure-skip-tls-verify") not in (None, False):
        raise Invalid("kubeconfig sets insecure-skip-tls-verify; refusing to connect without verifying the server")
    if cluster.get("certificate-authority") not in (None, ""):
        raise Invalid("kubeconfig names a CA file (certificate-authority); only certificate-authority-data is used")
    ca: bytes | None = None
    if cluster.get("certificate-authority-data"):
        try:
            ca = base64.b64decode(str(cluster["certificate-authority-data"]), validate=True)
        except (binascii.Error, ValueError):
            raise Invalid("kubeconfig certificate-authority-data is not base64") from None
        if b"-----BEGIN CERTIFICATE-----" not in ca:
            raise Invalid("kubeconfig certificate-authority-data is not a PEM certificate")
    return server.rstrip("/"), ca, False


class BearerTokens:
    """A bearer token for one audience, fetched from the credential and refreshed before expiry.

    ``AccessToken.expires_on`` is wall-clock epoch seconds (the simulator scales it for its clock),
    so expiry is judged on the wall clock, not on the fleet clock.
    """

    def __init__(self, credential: TokenCredential, scope: str, *,
                 margin_s: float = TOKEN_REFRESH_MARGIN_S, wall_clock: Callable[[], float] = time.time) -> None:
        self._credential = credential
        self._scope = scope
        self._margin = margin_s
        self._wall_clock = wall_clock
        self._token: str = ""
        self._expires_on = 0.0
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            if not self._token or self._expires_on - self._margin <= self._wall_clock():
                try:
                    token = self._credential.get_token(self._scope)
                except Exception as error:
                    mapped = map_arm_error(error, what=f"token for {self._scope}")
                    raise (mapped or Forbidden(f"token for {self._scope}: {error}")) from error
                self._token, self._expires_on = token.token, float(token.expires_on)
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._token, self._expires_on = "", 0.0

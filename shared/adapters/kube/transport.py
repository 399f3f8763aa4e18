"""The Kubernetes client's connection to one cluster: TLS, bearer token, one retry policy, raw GETs.

Shared by every call of the KubePort adapter (:class:`shared.adapters.kube.client.KubeClient`):

- the kubeconfig's server and CA (:func:`shared.adapters.kube.auth.server_and_ca`) and a bearer token
  refreshed before it expires (:class:`shared.adapters.kube.auth.BearerTokens`);
- one call is :meth:`KubeTransport._once` (errors translated by :mod:`shared.adapters.kube.errors`; a 401
  gets one fresh token and one more try), retried by :mod:`shared.kernel.retry` on the injected clock, with
  the client's own urllib3 retries off;
- hot reads go around the generated API classes (:meth:`KubeTransport._get_json`), writes through them
  (strategic-merge patches, the Eviction API, events, leases, Jobs and Karpenter custom objects).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from shared.adapters.kube.auth import BearerTokens, server_and_ca
from shared.adapters.kube.errors import call_kube
from shared.kernel import retry
from shared.kernel.errors import Unauthorized

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from kubernetes.client import Configuration

    from shared.kernel.clock import Clock

T = TypeVar("T")

FIELD_MANAGER = "gpu-fleet-steward"
#: The app's own namespace (setting STEWARD_NAMESPACE): its leases and sample Jobs live there, granted by
#: a Role (infra/kubernetes/role.yaml), not cluster-wide. Its Events about Nodes live in ``default``
#: (shared.adapters.kube.client.NODE_EVENTS_NAMESPACE).
DEFAULT_APP_NAMESPACE = "gpu-fleet-steward"
TIMEOUT = (10.0, 60.0)  # (connect, read) seconds per request

# Characters a query value keeps as they are: ``/`` and ``=`` of label selectors (``a.b/c=d``) and the
# ``,`` and ``:`` of selector lists; all are legal in an RFC 3986 query and mean nothing to the server's
# parser there. A value needing ``%`` escapes still gets them (and urllib3's slower, careful path).
_QUERY_SAFE = "/=,:"


def _bearer_configuration(host: str, tokens: BearerTokens) -> Configuration:
    """A client Configuration whose ``authorization`` key is a fresh bearer token at every request.

    The client reads the key through ``Configuration.get_api_key_with_prefix`` on each request
    (kubernetes-client/python kubernetes/client/configuration.py ``auth_settings``), and calls its
    ``refresh_api_key_hook`` there first; that hook attribute is declared as None only (assigned None,
    unannotated), so a typed hook cannot be set: the same refresh is done by overriding the method instead.
    """
    from kubernetes import client as k8s

    class BearerConfiguration(k8s.Configuration):
        def get_api_key_with_prefix(self, identifier: str, alias: str | None = None) -> str | None:
            self.api_key["authorization"] = tokens.get()
            return super().get_api_key_with_prefix(identifier, alias)

    return BearerConfiguration(host=host)


class KubeTransport:
    """One cluster's API server connection; the KubePort methods are on its subclasses."""

    def __init__(self, kubeconfig: bytes, credential: TokenCredential, *, server_app_id: str,
                 ca_bundle: str = "", clock: Clock | None = None, cluster_id: str = "",
                 retry_attempts: int = 4, retry_max_delay: float = 30.0,
                 namespace: str = DEFAULT_APP_NAMESPACE) -> None:
        import urllib3
        from kubernetes import client as k8s

        server, ca, insecure = server_and_ca(kubeconfig)
        self.server = server
        self.namespace = namespace or DEFAULT_APP_NAMESPACE  # the app's own (STEWARD_NAMESPACE)
        self.cluster_id = cluster_id
        self._clock = clock
        self._attempts = retry_attempts
        self._max_delay = retry_max_delay
        self._tokens = BearerTokens(credential, server_app_id + "/.default")

        config = _bearer_configuration(server, self._tokens)
        if ca is not None:
            config.ca_cert_data = ca.decode("ascii")
        elif ca_bundle:
            config.ssl_ca_cert = ca_bundle
        config.verify_ssl = not insecure
        config.retries = 0  # shared.kernel.retry decides
        config.api_key = {"authorization": ""}
        config.api_key_prefix = {"authorization": "Bearer"}
        self._api = k8s.ApiClient(config)
        self._api.user_agent = "gpu-fleet-steward"
        self._core = k8s.CoreV1Api(self._api)
        self._policy = k8s.PolicyV1Api(self._api)
        self._custom = k8s.CustomObjectsApi(self._api)
        self._http_timeout = urllib3.Timeout(connect=TIMEOUT[0], read=TIMEOUT[1])
        # The server's own connection pool for _get_json; None behind a proxy, which needs absolute URLs.
        manager = self._api.rest_client.pool_manager
        self._pool: Any = None if isinstance(manager, urllib3.ProxyManager) else manager.connection_from_url(server)
        self._path_prefix = urlsplit(server).path.rstrip("/")

    # -- plumbing

    def _now(self) -> float:
        from shared.kernel import clock as clocks

        return (self._clock or clocks.current()).now()

    def _once(self, fn: Callable[[], T], *, what: str) -> T:
        """One call; a 401 gets one fresh token and one more try (a token revoked early)."""
        try:
            return call_kube(fn, what=what)
        except Unauthorized:
            self._tokens.invalidate()
            return call_kube(fn, what=what)

    def _run(self, fn: Callable[[], T], *, what: str) -> T:
        from shared.kernel import clock as clocks

        return retry.call(self._once, fn, what=what, clock=self._clock or clocks.current(),
                          attempts=self._attempts, max_delay=self._max_delay)

    @staticmethod
    def _body(response: Any) -> bytes:
        data = response.data
        return bytes(data) if data is not None else b""

    def close(self) -> None:
        self._api.close()

    def _get_json(self, path: str, query: Mapping[str, str | int | None]) -> bytes:
        """GET a JSON body through the client's own urllib3 pool, skipping its request machinery.

        Same connection pool (TLS settings, proxy, keep-alive), same bearer token, same errors (an
        ``ApiException`` for a non-2xx answer): only the per-call validation and header building of
        the generated API class is skipped, which at small pages costs more than decoding them.
        Without a proxy the request goes straight to the server's connection pool with its target
        already encoded (``/`` and ``=`` of a label selector left as they are, as RFC 3986 allows in
        a query), so urllib3 neither parses the URL nor re-encodes it character by character; no
        urllib3 retries either: shared.kernel.retry decides.
        """
        from kubernetes.client.exceptions import ApiException

        params = urlencode({k: v for k, v in query.items() if v is not None and v != ""},
                           quote_via=quote, safe=_QUERY_SAFE)
        headers = {"Accept": "application/json", "User-Agent": self._api.user_agent,
                   "Authorization": f"Bearer {self._tokens.get()}"}
        target = f"{path}?{params}" if params else path
        if self._pool is not None:
            response = self._pool.urlopen("GET", self._path_prefix + target, headers=headers, retries=False,
                                          timeout=self._http_timeout, preload_content=True)
        else:
            response = self._api.rest_client.pool_manager.request(
                "GET", self.server + target, headers=headers, timeout=self._http_timeout, preload_content=True)
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        return response.data or b""

"""The real Kubernetes adapter with its SDK calls answered in-process, for tests of its error mapping.

``KubeClient`` is built from a kubeconfig pointing nowhere and a credential that refuses to issue a
token, so no request can leave the test; the test puts its fake ``CoreV1Api`` (``core``) or raw-GET
function (``get_json``) in place of the SDK's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

OFFLINE_KUBECONFIG = b"""apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {}}]
"""


class NoTokens:
    """A credential for a client whose calls never reach a server."""

    def get_token(self, *scopes: str, **_: Any) -> Any:
        raise AssertionError("no request leaves this test")


def offline_kube_client(*, core: Any = None, get_json: Callable[[str, Mapping[str, Any]], bytes] | None = None,
                        retry_attempts: int = 4) -> Any:
    """A ``KubeClient`` whose SDK core and raw GETs are the test's (whichever are given)."""
    from shared.adapters.kube.client import KubeClient
    from shared.kernel.clock import ManualClock

    client = KubeClient(OFFLINE_KUBECONFIG, NoTokens(), server_app_id="6dae42f8-4368-4678-94ff-3960e28e3630",
                        clock=ManualClock(0.0), retry_attempts=retry_attempts)
    if core is not None:
        client._core = core
    if get_json is not None:
        client._get_json = get_json
    return client

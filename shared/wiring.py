"""Builds the process's Context: settings, clock, ledger, adapters, telemetry, once and lazily.

A Functions worker process serves many invocations; clients (and the credential's token cache)
are built on the first invocation that needs them and reused after. Nothing heavy is imported at
module level, so importing ``function_app`` stays cheap. :class:`FleetAccess` is also where the
fleet scope is enforced for per-cluster access: a cluster outside the scope never gets a client; and
every adapter it hands out is wrapped in :mod:`shared.fleet.gate`, so that each *write* re-checks scope,
pause and (for a VM) the node resource group at the point of the call, whoever built the client.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from shared.kernel.errors import Forbidden

if TYPE_CHECKING:
    from collections.abc import Callable

    from azure.core.credentials import TokenCredential

    from shared.fleet.gate import Gate
    from shared.kernel.clock import Clock
    from shared.kernel.context import Context
    from shared.kernel.ports import AksPort, ClusterInfo, ComputePort, KubePort, MetricsPort
    from shared.kernel.telemetry import Telemetry
    from shared.settings import Settings

log = logging.getLogger("steward.wiring")

SCOPE_CACHE_S = 300.0
"""How long a cluster's tags are trusted before the scope is checked against ARM again."""


class FleetAccess:
    """ClusterAccess: cached ARM and per-cluster Kubernetes adapters, refusing clusters outside the scope."""

    def __init__(self, settings: Settings, *, credential: TokenCredential | None = None, clock: Clock | None = None,
                 aks: AksPort | None = None, compute: ComputePort | None = None,
                 kube_factory: Callable[[str], KubePort] | None = None,
                 metrics_factory: Callable[[str], MetricsPort] | None = None) -> None:
        """``aks``/``compute``/``kube_factory``/``metrics_factory`` replace the real adapters (tests): they are
        gated all the same."""
        self._settings = settings
        self._credential = credential
        self._clock = clock
        self._aks = aks
        self._compute = compute
        self._kube_factory = kube_factory
        self._kube: dict[str, KubePort] = {}
        self._metrics_factory = metrics_factory
        self._metrics: dict[str, MetricsPort] = {}
        self._scope: dict[str, tuple[float, bool, str]] = {}
        self._lock = threading.RLock()
        self._gate: Gate | None = None
        self._gated_aks: AksPort | None = None
        self._gated_compute: ComputePort | None = None

    @property
    def gate(self) -> Gate:
        """The write gate (shared.fleet.gate) of this process, reading clusters through the ungated adapter."""
        with self._lock:
            if self._gate is None:
                from shared.fleet.gate import Gate

                self._gate = Gate(self._settings, aks=self._raw_aks, clock=self._clock)
            return self._gate

    def _now(self) -> float:
        from shared.kernel import clock as clocks

        return (self._clock or clocks.current()).now()

    def credential(self) -> TokenCredential:
        with self._lock:
            if self._credential is None:
                from shared.adapters.identity import get_credential

                self._credential = get_credential(self._settings)
            return self._credential

    def _raw_aks(self) -> AksPort:
        with self._lock:
            if self._aks is None:
                from shared.adapters.aks import AksClient

                self._aks = AksClient(self.credential(), self._settings, clock=self._clock)
            return self._aks

    def aks(self) -> AksPort:
        """The ARM adapter; its writes pass the gate."""
        gate = self.gate
        with self._lock:
            if self._gated_aks is None:
                from shared.fleet.gate import GatedAks

                self._gated_aks = GatedAks(self._raw_aks(), gate)
            return self._gated_aks

    def compute(self) -> ComputePort:
        """The Compute adapter; a VM action passes the gate (scope, pause, the VM's node resource group)."""
        gate = self.gate
        with self._lock:
            if self._gated_compute is None:
                from shared.fleet.gate import GatedCompute

                if self._compute is None:
                    from shared.adapters.compute import ComputeClient

                    self._compute = ComputeClient(self.credential(), self._settings, clock=self._clock)
                self._gated_compute = GatedCompute(self._compute, gate)
            return self._gated_compute

    def check_scope(self, cluster_id: str) -> None:
        """Raise Forbidden unless ``cluster_id`` is in the fleet scope (tags re-read every few minutes)."""
        from shared.fleet.scope import cluster_in_scope, subscription_of
        from shared.kernel.ports import ClusterInfo

        key = cluster_id.lower()
        now = self._now()
        with self._lock:
            cached = self._scope.get(key)
        if cached is None or now - cached[0] > SCOPE_CACHE_S:
            if self._settings.cluster_ids:
                # The list alone decides: no ARM call, and an unlisted id is refused without being looked up.
                info = ClusterInfo(id=cluster_id, name=cluster_id.rsplit("/", 1)[-1], subscription=subscription_of(cluster_id),
                                   resource_group="", location="", tags={}, node_resource_group="")
            else:
                if subscription_of(cluster_id) not in {s.lower() for s in self._settings.subscriptions}:
                    info = None
                else:
                    info = self._raw_aks().get_cluster(cluster_id)
            if info is None:
                ok, reason = False, "subscription is not in FLEET_SUBSCRIPTIONS"
            else:
                ok, reason = cluster_in_scope(info, self._settings)
            cached = (now, ok, reason)
            with self._lock:
                self._scope[key] = cached
        if not cached[1]:
            raise Forbidden(f"cluster {cluster_id} is outside the fleet scope: {cached[2]}")

    def kube(self, cluster_id: str) -> KubePort:
        self.check_scope(cluster_id)
        key = cluster_id.lower()
        with self._lock:
            client = self._kube.get(key)
        if client is not None:
            return client
        from shared.fleet.gate import GatedKube

        if self._kube_factory is not None:
            raw = self._kube_factory(cluster_id)
        else:
            from shared.adapters.kube.client import KubeClient

            kubeconfig = self._raw_aks().kubeconfig(cluster_id)
            raw = KubeClient(kubeconfig, self.credential(), server_app_id=self._settings.aks_server_app_id,
                             ca_bundle=self._settings.ca_bundle, clock=self._clock, cluster_id=cluster_id,
                             namespace=self._settings.namespace)
        made: KubePort = GatedKube(raw, self.gate, cluster_id)
        with self._lock:
            return self._kube.setdefault(key, made)

    def metrics(self, endpoint: str) -> MetricsPort:
        """The PromQL port of an Azure Monitor workspace that SIGNALS_PROMETHEUS names (Forbidden for any
        other URL: the app never sends its token where the operator did not point it), with a token for
        ``https://prometheus.monitor.azure.com`` from the app's identity (role: Monitoring Data Reader)."""
        key = endpoint.rstrip("/").lower()
        if key not in {t.endpoint.lower() for t in self._settings.signals_prometheus.values()}:
            raise Forbidden(f"{endpoint} is not a workspace query endpoint of SIGNALS_PROMETHEUS")
        with self._lock:
            client = self._metrics.get(key)
        if client is not None:
            return client
        if self._metrics_factory is not None:
            made = self._metrics_factory(endpoint)
        else:
            import urllib3

            from shared.adapters.kube.auth import BearerTokens
            from shared.adapters.prometheus import AZURE_MONITOR_PROMETHEUS_RESOURCE, PrometheusClient, PrometheusMetrics

            tokens = BearerTokens(self.credential(), AZURE_MONITOR_PROMETHEUS_RESOURCE + "/.default")
            pool = urllib3.PoolManager(retries=False, ca_certs=self._settings.ca_bundle or None)
            made = PrometheusMetrics(PrometheusClient(endpoint.rstrip("/"), tokens.get, pool=pool))
        with self._lock:
            return self._metrics.setdefault(key, made)

    def clusters(self) -> list[ClusterInfo]:
        """The clusters in scope now (shared.fleet.scope.discover)."""
        from shared.fleet.scope import discover

        return discover(self._raw_aks(), self._settings)


def instance_name(settings: Settings) -> str:
    """Who owns claims and leases: STEWARD_INSTANCE_NAME, else host name and process id."""
    return settings.instance_name or f"{socket.gethostname()}-{os.getpid()}"


def build_telemetry(settings: Settings, *, instance: str = "local") -> Telemetry:
    """The app's meters, exported to Application Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is set;
    with the app's identity when it has one (Application Insights with local auth off takes Entra tokens)."""
    from shared.kernel.telemetry import Telemetry

    credential = None
    if settings.appinsights_connection_string and (settings.azure_client_id or settings.managed_identity_available):
        from shared.adapters.identity import get_credential

        credential = get_credential(settings)
    return Telemetry(connection_string=settings.appinsights_connection_string, credential=credential, instance=instance)


def build_context(settings: Settings | None = None, **overrides: Any) -> Context:
    """A Context wired to the real adapters (``overrides`` replace any of its fields)."""
    from shared.kernel import clock as clocks
    from shared.kernel import telemetry
    from shared.kernel.context import Context

    telemetry.install_log_record_factory()
    if settings is None:
        from shared.settings import load

        settings = load()
    instance = overrides.pop("instance", None) or instance_name(settings)
    fields: dict[str, Any] = dict(overrides)
    if "access" not in fields:
        fields["access"] = FleetAccess(settings)
    if "ledger" not in fields:
        from shared.adapters.ledger import TableLedger

        fields["ledger"] = TableLedger.from_settings(settings)
    if "events" not in fields:
        from shared.adapters.events import EventPublisher

        credential = fields["access"].credential() if isinstance(fields["access"], FleetAccess) else None
        if credential is None:
            from shared.adapters.identity import get_credential

            credential = get_credential(settings)
        fields["events"] = EventPublisher(credential, settings)
    if "telemetry" not in fields:
        fields["telemetry"] = build_telemetry(settings, instance=instance)
    if "nudge" not in fields and getattr(settings, "reconcile_delayed_nudges", True):
        from shared.adapters.nudge_queue import QueueNudger

        fields["nudge"] = QueueNudger.from_settings(settings, clock=fields.get("clock"))
    fields.setdefault("clock", clocks.current())
    context = Context(settings=settings, instance=instance, **fields)
    log.info("steward context built", extra={"instance": instance, "settings": settings.describe()})
    return context


_context: Context | None = None
_context_lock = threading.Lock()


def get_context() -> Context:
    """The process-wide Context, built on first use."""
    global _context
    with _context_lock:
        if _context is None:
            _context = build_context()
        return _context

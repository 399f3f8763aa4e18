"""Where each cluster's DCGM series are: the SIGNALS_PROMETHEUS setting, parsed and validated.

The setting is a JSON object keyed by managed cluster ARM id::

    {"/subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.ContainerService/managedClusters/<name>":
        {"endpoint": "https://<workspace>.<region>.prometheus.monitor.azure.com",
         "nodeLabel": "Hostname", "clusterLabel": "cluster", "clusterValue": "<name>"}}

- ``endpoint`` (required): the Azure Monitor workspace's query endpoint (its "Query endpoint" in the
  portal, ``properties.metrics.prometheusQueryEndpoint`` in ARM), https only;
- ``nodeLabel`` (default ``Hostname``, the label dcgm-exporter puts the node name in): maps a series to
  its Kubernetes node;
- ``clusterLabel`` (default ``cluster``) and ``clusterValue`` (default the cluster's name): tell apart
  the clusters that send to one workspace. ``clusterLabel`` may be ``""`` only for a workspace that a
  single configured cluster uses.

Clusters sharing a workspace must use the same ``nodeLabel`` and ``clusterLabel`` (the app sends ONE
query per workspace, grouped by those labels) and distinct ``clusterValue``\\ s. A cluster absent from
the setting has no DCGM signal: nothing is read for it, nothing is inferred. Errors name the setting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from shared.kernel.env import SettingError

SETTING = "SIGNALS_PROMETHEUS"
DEFAULT_NODE_LABEL = "Hostname"
DEFAULT_CLUSTER_LABEL = "cluster"
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLUSTER_ID = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/[^/]+"
                         r"/providers/microsoft\.containerservice/managedclusters/(?P<name>[^/]+)$", re.IGNORECASE)
_KEYS = frozenset({"endpoint", "nodeLabel", "clusterLabel", "clusterValue"})


@dataclass(frozen=True)
class PrometheusTarget:
    """Where one cluster's DCGM series are, and how its series are told apart from other clusters'."""

    cluster_id: str
    endpoint: str
    node_label: str = DEFAULT_NODE_LABEL
    cluster_label: str = DEFAULT_CLUSTER_LABEL
    cluster_value: str = ""

    @property
    def group(self) -> tuple[str, str, str]:
        """What one query serves: the workspace and the two labels it groups by."""
        return self.endpoint.lower(), self.node_label, self.cluster_label


def _label(cluster: str, key: str, value: Any, default: str, *, allow_empty: bool = False) -> str:
    if value is None:
        return default
    if not isinstance(value, str) or not (_LABEL.match(value) or (allow_empty and value == "")):
        raise SettingError(f"setting {SETTING}: {key} of {cluster!r} must be a Prometheus label name, got {value!r}")
    return value


def _target(cluster: str, body: Any, subscriptions: tuple[str, ...]) -> PrometheusTarget:
    match = _CLUSTER_ID.match(cluster)
    if not match:
        raise SettingError(f"setting {SETTING}: {cluster!r} is not a managed cluster ARM id "
                           "(/subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.ContainerService/"
                           "managedClusters/<name>)")
    if subscriptions and match["sub"].lower() not in subscriptions:
        raise SettingError(f"setting {SETTING}: cluster {cluster!r} is not in FLEET_SUBSCRIPTIONS")
    if not isinstance(body, Mapping):
        raise SettingError(f"setting {SETTING}: the value for {cluster!r} must be an object with an endpoint")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise SettingError(f"setting {SETTING}: {cluster!r} has unknown keys {unknown} (known: {sorted(_KEYS)})")
    endpoint = body.get("endpoint")
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme.lower() != "https" or not parts.hostname or parts.query or parts.fragment:
        raise SettingError(f"setting {SETTING}: endpoint of {cluster!r} must be the workspace's https:// query "
                           f"endpoint, got {endpoint!r}")
    value = body.get("clusterValue", match["name"])
    if not isinstance(value, str) or not value:
        raise SettingError(f"setting {SETTING}: clusterValue of {cluster!r} must be a non-empty string")
    return PrometheusTarget(cluster_id=cluster, endpoint=str(endpoint).rstrip("/"),
                            node_label=_label(cluster, "nodeLabel", body.get("nodeLabel"), DEFAULT_NODE_LABEL),
                            cluster_label=_label(cluster, "clusterLabel", body.get("clusterLabel"),
                                                 DEFAULT_CLUSTER_LABEL, allow_empty=True),
                            cluster_value=value)


def parse_targets(text: str | None, *, subscriptions: tuple[str, ...] = ()) -> dict[str, PrometheusTarget]:
    """SIGNALS_PROMETHEUS -> {lower-case cluster id: target}; empty or unset -> {} (no DCGM signal)."""
    if not text or not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise SettingError(f"setting {SETTING} must be a JSON object keyed by cluster ARM id: {exc}") from None
    if not isinstance(raw, dict):
        raise SettingError(f"setting {SETTING} must be a JSON object keyed by cluster ARM id")
    subs = tuple(s.lower() for s in subscriptions)
    targets: dict[str, PrometheusTarget] = {}
    for cluster, body in raw.items():
        target = _target(str(cluster), body, subs)
        if cluster.lower() in targets:
            raise SettingError(f"setting {SETTING}: cluster {cluster!r} is given twice")
        targets[cluster.lower()] = target
    by_endpoint: dict[str, list[PrometheusTarget]] = {}
    for target in targets.values():
        by_endpoint.setdefault(target.endpoint.lower(), []).append(target)
    for endpoint, sharing in by_endpoint.items():
        if len(sharing) < 2:
            continue
        if len({(t.node_label, t.cluster_label) for t in sharing}) > 1:
            raise SettingError(f"setting {SETTING}: the clusters on {endpoint} must use the same nodeLabel and "
                               "clusterLabel (one query per workspace)")
        if not sharing[0].cluster_label:
            raise SettingError(f"setting {SETTING}: clusters sharing {endpoint} need a clusterLabel to tell them apart")
        values = [t.cluster_value for t in sharing]
        if len(set(values)) != len(values):
            raise SettingError(f"setting {SETTING}: clusters sharing {endpoint} must have distinct clusterValues, "
                               f"got {sorted(values)}")
    return targets


def describe(targets: Mapping[str, PrometheusTarget]) -> dict[str, str]:
    """For the start-up log line: cluster -> endpoint."""
    return {t.cluster_id: t.endpoint for t in targets.values()}

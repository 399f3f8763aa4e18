"""Where each cluster's DCGM series are, and whose exporter writes them: the SIGNALS_PROMETHEUS setting.

The setting is a JSON object keyed by managed cluster ARM id::

    {"/subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.ContainerService/managedClusters/<name>":
        {"endpoint": "https://<workspace>.<region>.prometheus.monitor.azure.com"}}

- ``endpoint`` (required): the Azure Monitor workspace's query endpoint (its "Query endpoint" in the
  portal, ``properties.metrics.prometheusQueryEndpoint`` in ARM), https only;
- ``exporter`` (default ``managed``): whose dcgm-exporter the series come from.

  - ``managed``: AKS's managed exporter on managed GPU pools, scraped by AKS managed Prometheus's
    ``dcgmexporter`` default target (shared.remediation.dcgm_provenance says what that delivers: job
    ``dcgm-exporter``, the node in ``instance``, only the labels ``cluster|instance|gpu|job|__name__``,
    only the counters of dcgm-exporter's default CSV). ``job`` and ``nodeLabel`` are fixed by that
    scrape config and may not be set.
  - ``custom``: an operator's own dcgm-exporter (a DaemonSet on driver-only pools) scraped by the
    operator's own job. ``job`` (the exact ``job`` label its series carry) and ``counters`` (the error
    counters its CSV enables, of ``DCGM_FI_DEV_XID_ERRORS``, ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``,
    ``DCGM_FI_DEV_ECC_DBE_AGG_TOTAL``, ``DCGM_FI_DEV_ROW_REMAP_FAILURE``, ``DCGM_FI_DEV_ROW_REMAP_PENDING``)
    are required; ``nodeLabel`` defaults to ``Hostname`` (dcgm-exporter's; its main branch renamed it
    ``hostname``); ``namespace``, when given, is the exporter's namespace, which every series must carry.
- ``clusterLabel`` (default ``cluster``) and ``clusterValue`` (default the cluster's name; the
  cluster's ``cluster_alias`` if its admin set one): tell apart the clusters that send to one
  workspace. ``clusterLabel`` may be ``""`` only for a workspace that a single configured cluster uses.
- ``windowSeconds`` (default 90, at least 2 scrapes of the default 30 s interval): how far back a fault
  must hold, in every sample and every copy of its series, before anything is done about it.

A cluster absent from the setting has no DCGM signal: nothing is read for it, nothing is inferred.
Clusters sharing a workspace must have distinct ``clusterValue``\\ s. Errors name the setting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from shared.kernel.env import SettingError
from shared.remediation import dcgm_provenance as prov

SETTING = "SIGNALS_PROMETHEUS"
MANAGED = "managed"
CUSTOM = "custom"
DEFAULT_CLUSTER_LABEL = "cluster"
DEFAULT_CUSTOM_NODE_LABEL = "Hostname"
DEFAULT_WINDOW_S = 90.0
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLUSTER_ID = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/[^/]+"
                         r"/providers/microsoft\.containerservice/managedclusters/(?P<name>[^/]+)$", re.IGNORECASE)
_KEYS = frozenset({"endpoint", "exporter", "job", "nodeLabel", "namespace", "counters", "clusterLabel", "clusterValue",
                   "windowSeconds"})


@dataclass(frozen=True)
class PrometheusTarget:
    """Where one cluster's DCGM series are, whose exporter writes them, and how they are told apart."""

    cluster_id: str
    endpoint: str
    exporter: str = MANAGED
    job: str = prov.MANAGED_JOB
    node_label: str = prov.MANAGED_NODE_LABEL
    namespace: str = ""
    counters: tuple[str, ...] = prov.DEFAULT_CSV_COUNTERS
    cluster_label: str = DEFAULT_CLUSTER_LABEL
    cluster_value: str = ""
    window_s: float = DEFAULT_WINDOW_S

    @property
    def group(self) -> tuple[str, str, str, str, str]:
        """What one query serves: the workspace, the exporter's job and the labels told apart by."""
        return self.endpoint.lower(), self.exporter, self.job, self.node_label, self.cluster_label

    @property
    def inactive(self) -> tuple[str, ...]:
        """The error counters the policy tables read that this exporter does not export."""
        return tuple(m for m in prov.POLICY_METRICS if m not in self.counters)


def _err(cluster: str, text: str) -> SettingError:
    return SettingError(f"setting {SETTING}: {text} (cluster {cluster!r})")


def _label(cluster: str, key: str, value: Any, default: str, *, allow_empty: bool = False) -> str:
    if value is None:
        return default
    if not isinstance(value, str) or not (_LABEL.match(value) or (allow_empty and value == "")):
        raise _err(cluster, f"{key} must be a Prometheus label name, got {value!r}")
    return value


def _exporter(cluster: str, body: Mapping[str, Any]) -> dict[str, Any]:
    kind = body.get("exporter", MANAGED)
    if kind == MANAGED:
        fixed = sorted(k for k in ("job", "nodeLabel", "namespace", "counters") if k in body)
        if fixed:
            raise _err(cluster, f"{fixed} are fixed by AKS's managed exporter and its scrape target (job "
                                f"{prov.MANAGED_JOB!r}, the node in {prov.MANAGED_NODE_LABEL!r}, the default CSV's "
                                f"counters); use exporter 'custom' for an exporter of your own")
        return {}
    if kind != CUSTOM:
        raise _err(cluster, f"exporter must be {MANAGED!r} or {CUSTOM!r}, got {kind!r}")
    job, counters = body.get("job"), body.get("counters")
    if not isinstance(job, str) or not job:
        raise _err(cluster, "a custom exporter needs job: the exact job label its series carry")
    if not isinstance(counters, list) or not counters or not all(isinstance(c, str) for c in counters):
        raise _err(cluster, f"a custom exporter needs counters: the error counters its CSV enables, of "
                            f"{list(prov.POLICY_METRICS)}")
    unknown = sorted(set(counters) - set(prov.POLICY_METRICS))
    if unknown:
        raise _err(cluster, f"counters {unknown} are not read by the policy tables (known: {list(prov.POLICY_METRICS)})")
    namespace = body.get("namespace", "")
    if not isinstance(namespace, str):
        raise _err(cluster, "namespace must be a string")
    return {"exporter": CUSTOM, "job": job, "counters": tuple(dict.fromkeys(counters)), "namespace": namespace,
            "node_label": _label(cluster, "nodeLabel", body.get("nodeLabel"), DEFAULT_CUSTOM_NODE_LABEL)}


def _target(cluster: str, body: Any, subscriptions: tuple[str, ...]) -> PrometheusTarget:
    match = _CLUSTER_ID.match(cluster)
    if not match:
        raise SettingError(f"setting {SETTING}: {cluster!r} is not a managed cluster ARM id "
                           "(/subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.ContainerService/"
                           "managedClusters/<name>)")
    if subscriptions and match["sub"].lower() not in subscriptions:
        raise SettingError(f"setting {SETTING}: cluster {cluster!r} is not in FLEET_SUBSCRIPTIONS")
    if not isinstance(body, Mapping):
        raise _err(cluster, "the value must be an object with an endpoint")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise _err(cluster, f"unknown keys {unknown} (known: {sorted(_KEYS)})")
    endpoint = body.get("endpoint")
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme.lower() != "https" or not parts.hostname or parts.query or parts.fragment:
        raise _err(cluster, f"endpoint must be the workspace's https:// query endpoint, got {endpoint!r}")
    value = body.get("clusterValue", match["name"])
    if not isinstance(value, str) or not value:
        raise _err(cluster, "clusterValue must be a non-empty string")
    window = body.get("windowSeconds", DEFAULT_WINDOW_S)
    if isinstance(window, bool) or not isinstance(window, (int, float)) or not 60 <= window <= 3600:
        raise _err(cluster, f"windowSeconds must be a number of seconds from 60 to 3600, got {window!r}")
    return PrometheusTarget(cluster_id=cluster, endpoint=str(endpoint).rstrip("/"),
                            cluster_label=_label(cluster, "clusterLabel", body.get("clusterLabel"),
                                                 DEFAULT_CLUSTER_LABEL, allow_empty=True),
                            cluster_value=value, window_s=float(window), **_exporter(cluster, body))


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
        if not all(t.cluster_label for t in sharing) or len({t.cluster_label for t in sharing}) > 1:
            raise SettingError(f"setting {SETTING}: clusters sharing {endpoint} need one clusterLabel to tell them apart")
        values = [t.cluster_value for t in sharing]
        if len(set(values)) != len(values):
            raise SettingError(f"setting {SETTING}: clusters sharing {endpoint} must have distinct clusterValues, "
                               f"got {sorted(values)}")
    return targets


def describe(targets: Mapping[str, PrometheusTarget]) -> dict[str, str]:
    """For the start-up log line: cluster -> endpoint (exporter)."""
    return {t.cluster_id: f"{t.endpoint} ({t.exporter})" for t in targets.values()}

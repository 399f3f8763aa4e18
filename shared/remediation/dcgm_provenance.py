"""Whose series is this? The DCGM series an AKS cluster really delivers, and the checks that keep a
tenant's series from posing as them. Pure: labels in, a verdict out; no I/O.

What AKS delivers (each fact cited where it is used):

- AKS runs its managed dcgm-exporter as a systemd unit on managed GPU nodes, started with
  ``-f /etc/dcgm-exporter/default-counters.csv`` (Azure/AgentBaker
  ``parts/linux/cloud-init/artifacts/cse_config.sh``; not a DaemonSet). Of the error counters the
  policy tables read, that file (NVIDIA/dcgm-exporter ``etc/default-counters.csv``) enables
  ``DCGM_FI_DEV_XID_ERRORS`` and ``DCGM_FI_DEV_ROW_REMAP_FAILURE``; ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``
  and ``DCGM_FI_DEV_ECC_DBE_AGG_TOTAL`` are commented out and ``DCGM_FI_DEV_ROW_REMAP_PENDING`` is not
  listed (``DEFAULT_CSV_COUNTERS``).
- AKS managed Prometheus scrapes it with the ``dcgmexporter`` default target (Azure/prometheus-collector
  ``otelcollector/configmapparser/default-prom-configs/dcgmExporterDefault.yml``): ``job_name:
  dcgm-exporter``; only nodes labelled ``kubernetes.azure.com/dcgm-exporter=enabled``; ``instance`` set
  from ``__meta_kubernetes_node_name``; ``metric_relabel_configs: labelkeep cluster|instance|gpu|job|__name__``.
  So a genuine series carries exactly those five labels (``Hostname`` is dropped), the node is in
  ``instance``, and ``honor_labels`` is left at false: the exporter cannot override ``job`` or ``instance``.

Who else can write a series that carries ``job="dcgm-exporter"`` and a node's name in ``instance``:

- a tenant whose pod is scraped through pod annotations: ama-metrics' ``kubernetes-pods`` job
  (``podannotationsDefault.yml``) ``labelmap``\\ s every pod label into target labels, so pod labels
  named ``job`` and ``instance`` set both; but the same job always adds ``kubernetes_namespace`` and
  ``kubernetes_pod_name`` and applies no labelkeep, so such a series has labels the genuine one never has
  (:func:`check` refuses it: ``foreign-labels``);
- a tenant with a PodMonitor: ``honorLabels: true`` keeps the exposed ``job`` and ``instance``
  (prometheus/prometheus ``scrape/scrape.go`` ``mutateSampleLabels``) and ``metricRelabelings`` can drop
  every other label, so the shape alone cannot tell. What can: the node's own exporter keeps writing
  the same series (same labels = same series), so a forged fault on a node whose GPUs are fine is
  contradicted by the exporter's own samples; the steward acts only when every sample of the last
  ``windowSeconds`` (``min_over_time``) and every copy agree (shared.remediation.dcgm).
- a node without AKS's exporter (a driver-only pool's, say) has no genuine series to contradict a
  forged one: for the managed exporter a series naming such a node is refused (``no-exporter``);
- a cluster admin, who can set ``cluster_alias`` (the ``cluster`` label of everything the cluster
  sends) to another cluster's name on a shared workspace: its own nodes then appear under the other
  cluster, where they do not exist (``phantom-node``), and a copy of a real node's series is contradicted
  by that node's exporter as above. The label alone is never the proof: the node must exist in the
  named cluster's API server and pass the ARM check (shared.fleet.node_truth) before anything counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.remediation import signal_policy as sp

if TYPE_CHECKING:
    from shared.remediation.dcgm_config import PrometheusTarget

MANAGED_JOB = "dcgm-exporter"  # dcgmExporterDefault.yml job_name
MANAGED_NODE_LABEL = "instance"  # dcgmExporterDefault.yml: __meta_kubernetes_node_name -> instance
MANAGED_LABELS = frozenset({"cluster", "instance", "gpu", "job", "__name__"})  # its labelkeep
#: The node label AKS sets where its managed exporter runs; the managed target keeps only such nodes.
EXPORTER_NODE_LABEL = "kubernetes.azure.com/dcgm-exporter"
#: Every error counter the policy tables read (signal_policy: the XID table and the counter table).
POLICY_METRICS: tuple[str, ...] = (sp.XID_METRIC, *(r.metric for r in sp.COUNTER_TABLE))
#: Of POLICY_METRICS, those NVIDIA/dcgm-exporter etc/default-counters.csv enables (the managed exporter's file).
DEFAULT_CSV_COUNTERS: tuple[str, ...] = (sp.XID_METRIC, sp.REMAP_FAILURE)

# Refusal codes: stable, in the sweep's report, the SeriesRefused event and docs/security.md.
WRONG_JOB = "wrong-job"
FOREIGN_LABELS = "foreign-labels"
WRONG_NAMESPACE = "wrong-namespace"
NO_NODE = "no-node"
UNKNOWN_CLUSTER = "unknown-cluster"
BAD_GPU = "bad-gpu"
PHANTOM_NODE = "phantom-node"
NO_EXPORTER = "no-exporter"
UNVERIFIED_NODE = "unverified-node"
OVER_CAP = "over-cap"
CONTESTED = "contested"
REFUSAL_CODES = (WRONG_JOB, FOREIGN_LABELS, WRONG_NAMESPACE, NO_NODE, UNKNOWN_CLUSTER, BAD_GPU, PHANTOM_NODE,
                 NO_EXPORTER, UNVERIFIED_NODE, OVER_CAP, CONTESTED)


def runs_managed_exporter(labels: Mapping[str, str]) -> bool:
    """Whether AKS's managed exporter runs on a node with these labels: only such nodes are scraped by the
    managed target (dcgmExporterDefault.yml keeps ``kubernetes.azure.com/dcgm-exporter=enabled``), so a
    series in the managed shape naming any other node has no genuine writer to contradict it: it is forged."""
    return labels.get(EXPORTER_NODE_LABEL) == "enabled"


@dataclass(frozen=True)
class Accepted:
    """A series that has the shape its exporter's scrape gives: its cluster, node, GPU and metric."""

    cluster_id: str
    node: str
    gpu: str
    metric: str


@dataclass(frozen=True)
class Refused:
    code: str
    why: str


def check(labels: Mapping[str, str], targets: Iterable[PrometheusTarget], *, metric: str | None = None
          ) -> Accepted | Refused:
    """Judge one series' labels against the exporter the ``targets`` (one query group) configured.

    ``metric``: the series' metric when the query dropped ``__name__`` (``min_over_time``)."""
    group = list(targets)
    first = group[0]
    name = metric or labels.get("__name__", "")
    if labels.get("job") != first.job:
        return Refused(WRONG_JOB, f"job {labels.get('job')!r} is not the exporter's {first.job!r}")
    if first.exporter == "managed":
        extra = sorted(set(labels) - MANAGED_LABELS)
        if extra:
            return Refused(FOREIGN_LABELS, f"labels {extra[:6]} are not kept by AKS's dcgm-exporter scrape "
                                           f"(labelkeep cluster|instance|gpu|job|__name__): another scrape wrote it")
    else:
        exported = sorted(k for k in labels if k.startswith("exported_") and k not in ("exported_namespace",
                                                                                         "exported_pod",
                                                                                         "exported_container"))
        if exported:
            return Refused(FOREIGN_LABELS, f"labels {exported[:6]} show a scrape that renamed clashing labels")
        if first.namespace and labels.get("namespace") != first.namespace:
            return Refused(WRONG_NAMESPACE, f"namespace {labels.get('namespace')!r} is not the exporter's "
                                            f"{first.namespace!r}")
    node = labels.get(first.node_label, "")
    if not node:
        return Refused(NO_NODE, f"no {first.node_label!r} label")
    if first.cluster_label:
        by_value = {t.cluster_value: t.cluster_id for t in group}
        cluster_id = by_value.get(labels.get(first.cluster_label, ""))
        if cluster_id is None:
            return Refused(UNKNOWN_CLUSTER, f"{first.cluster_label}={labels.get(first.cluster_label)!r} is no "
                                            f"configured cluster of this workspace")
    else:
        cluster_id = first.cluster_id
    gpu = labels.get("gpu", "")
    if not gpu.isdigit():
        return Refused(BAD_GPU, f"gpu {gpu!r} is not a GPU index")
    return Accepted(cluster_id, node, str(int(gpu)), name)


def _quoted(value: str) -> str:
    """A PromQL string literal (double quotes; backslash and quote escaped, as Go's strconv.Quote does)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def sweep_query(target: PrometheusTarget, metrics: Iterable[str]) -> str:
    """The one instant query per (workspace, exporter) a sweep sends: the raw series, every label kept
    (the checks need them), one ``__name__`` matcher (Azure Monitor's API allows only one,
    https://learn.microsoft.com/azure/azure-monitor/metrics/prometheus-api-promql)."""
    names = "|".join(dict.fromkeys(metrics))
    return f'{{__name__=~"{names}", job={_quoted(target.job)}}}'


def window_query(target: PrometheusTarget, metric: str, node: str, *, span_s: float | None = None) -> str:
    """The lowest value of every sample of one node's ``metric`` over the target's window (or the last
    ``span_s`` seconds, whole seconds, at least one): a fault counts only if it held in all of them (a
    forged copy interleaved with the exporter's healthy samples does not). ``*_over_time`` drops the metric
    name, so one query per metric."""
    where = [f"__name__={_quoted(metric)}", f"job={_quoted(target.job)}", f"{target.node_label}={_quoted(node)}"]
    if target.cluster_label:
        where.append(f"{target.cluster_label}={_quoted(target.cluster_value)}")
    seconds = int(target.window_s) if span_s is None else max(1, math.ceil(span_s))
    return f"min_over_time({{{', '.join(where)}}}[{seconds}s])"

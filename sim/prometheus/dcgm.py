"""The fleet's Azure Monitor workspace: dcgm-exporter series of the simulated GPU nodes, over PromQL.

:class:`FleetDcgm` serves ``/prometheus/<workspace>/api/v1/query`` (the path after the workspace is the
Azure Monitor workspace's query API, modelled by :mod:`sim.prometheus.api` and :mod:`sim.prometheus.promql`) and keeps
the series in step with the simulated nodes before each answer:

- a GPU node labelled ``kubernetes.azure.com/dcgm-exporter=enabled`` (AKS puts it on managed GPU
  pools' nodes, and the managed scrape target keeps only those: dcgmExporterDefault.yml) exports
  through AKS's managed exporter, in AKS managed Prometheus's shape (``job="dcgm-exporter"``, the node
  in ``instance``, labelkeep ``cluster|instance|gpu|job|__name__``, the default CSV's counters only);
- a pool given an operator's exporter (``/_sim/dcgm/exporter`` with ``kind: custom``: the
  bring-your-own dcgm-exporter of a driver-only pool) exports in that exporter's shape, with the
  counters its CSV enables; any other GPU node exports nothing (no exporter runs on it);
- a node that is gone has no series (which the app must never read as healthy);
- a reboot (the node's ``bootID`` changes: restart, reimage) reloads the driver: the last XID, the
  volatile double-bit ECC count and a pending row remap reset; the lifetime count and a row-remap
  failure stay (both live in the GPU's InfoROM); a failing memory (``ecc-storm`` with ``persist``)
  errs again after the reset; a replaced node is a new node with fresh GPUs.

Control routes (``/_sim/dcgm/...``, :meth:`FleetDcgm.control`): faults on a GPU (``xid``,
``ecc-storm``, ``row-remap``, ``counter``), the workspace's outages (``outage``), a pool's exporter
(``exporter``), a cluster admin's ``cluster_alias`` (``cluster-alias``) and a tenant pod's scraped
series with any labels (``tenant-series``, ``tenant-series/clear``).
"""

from __future__ import annotations

from typing import Any

from sim.core.http import Request, Response
from sim.prometheus.api import (
    ERROR_COUNTERS,
    MANAGED,
    REMAP_FAILURE,
    REMAP_PENDING,
    XID,
    ExporterShape,
    PrometheusApi,
    PrometheusModel,
)

PREFIX = "/prometheus/"
XID_METRIC = XID
DCGM_LABEL = "kubernetes.azure.com/dcgm-exporter"
POD_ANNOTATIONS_JOB = "kubernetes-pods"  # prometheus-collector podannotationsDefault.yml


def _gpu_count(node: Any) -> int:
    """GPUs of a node: its VM size's, else what the kubelet advertises."""
    from sim.core.sizes import size_info

    size = size_info(node.labels.get("node.kubernetes.io/instance-type", "") or "")
    count = int(getattr(size, "gpus", 0) or 0)
    if count:
        return count
    try:
        return int(str((node.obj["status"].get("capacity") or {}).get("nvidia.com/gpu", "0")))
    except ValueError:
        return 0


def _since(stamp: Any, now: float) -> float:
    """An RFC 3339 time as epoch seconds (``now`` when absent or unreadable)."""
    from datetime import datetime

    try:
        return min(now, datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return now


def _booted_at(node: Any, now: float) -> float:
    """When the node last came up: its Ready condition's last transition (the kubelet reports Ready
    again after a boot), else now."""
    for cond in node.obj["status"].get("conditions") or ():
        if cond.get("type") == "Ready":
            return _since(cond.get("lastTransitionTime"), now)
    return now


def _tenant_target(body: dict[str, Any]) -> tuple[dict[str, str], bool, tuple[str, ...]]:
    """The target labels of a tenant pod's scrape, its honor_labels and its metric relabel labeldrop.

    ``annotations``: ama-metrics' ``kubernetes-pods`` job (prometheus-collector
    ``default-prom-configs/podannotationsDefault.yml``): job ``kubernetes-pods``, instance the pod's
    address, ``labelmap`` of every pod label (so a pod label named ``job`` or ``instance`` sets those),
    ``kubernetes_namespace`` and ``kubernetes_pod_name``; honor_labels false; no metric relabelling.
    ``podmonitor``: a PodMonitor the tenant writes (azmonitoring.coreos.com/v1: ``honorLabels`` and
    ``metricRelabelings`` are the tenant's own; the operator adds ``namespace``, ``pod``, ``container``,
    ``endpoint`` and a job named for the monitor).
    """
    namespace, pod = str(body.get("namespace") or "team-a"), str(body.get("pod") or "exporter-0")
    address = f"{body.get('pod_ip') or '10.244.7.7'}:{int(body.get('port', 9400))}"
    scrape = str(body.get("scrape") or "annotations")
    if scrape == "annotations":
        target = {"job": POD_ANNOTATIONS_JOB, "instance": address}
        target.update({str(k): str(v) for k, v in (body.get("pod_labels") or {}).items()})
        target.update({"kubernetes_namespace": namespace, "kubernetes_pod_name": pod})
        return target, False, ()
    if scrape == "podmonitor":
        monitor = str(body.get("monitor") or "metrics")
        target = {"job": f"{namespace}/{monitor}", "instance": address, "namespace": namespace, "pod": pod,
                  "container": "exporter", "endpoint": "metrics"}
        return target, bool(body.get("honor_labels")), tuple(str(x) for x in body.get("drop_labels") or ())
    raise ValueError("scrape must be annotations or podmonitor")


class FleetDcgm:
    """The workspace's query endpoint and its control switches (a sim.core.http Handler)."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.model = PrometheusModel(now=fleet.now)
        self.api = PrometheusApi(self.model, now=fleet.now, issuer=fleet.tokens)
        self._boots: dict[tuple[str, str], tuple[str, str]] = {}
        self.exporters: dict[tuple[str, str], ExporterShape] = {}  # (cluster, pool) -> an operator's exporter

    def route(self, request: Request) -> str:
        rest = request.path[len(PREFIX):] if request.path.startswith(PREFIX) else request.path
        return PREFIX + "{}/" + rest.partition("/")[2]

    def handle(self, request: Request) -> Response:
        with self.fleet.lock:
            self.sync()
        return self.api.handle(request)

    def shape_of(self, cluster: str, node: Any) -> ExporterShape | None:
        configured = self.exporters.get((cluster, str(getattr(node, "pool", "") or "")))
        if configured is not None:
            return None if configured.kind == "none" else configured
        return MANAGED if node.labels.get(DCGM_LABEL) == "enabled" else None

    def sync(self) -> None:
        """Bring the series in line with the nodes (call under ``fleet.lock``)."""
        present: dict[tuple[str, str], tuple[str, str]] = {}
        have = self.model.nodes()
        for cluster in self.fleet.clusters.values():
            for node in cluster.nodes.values():
                gpus = _gpu_count(node)
                if gpus <= 0:
                    continue
                key = (cluster.name, node.name)
                boot = (str(node.obj["metadata"].get("uid", "")),
                        str((node.obj["status"].get("nodeInfo") or {}).get("bootID", "")))
                present[key] = boot
                shape = self.shape_of(cluster.name, node) or ExporterShape(kind="none")
                if key not in have:
                    self.model.add_node(node.name, gpus, cluster=cluster.name, shape=shape,
                                        since=_since(node.obj["metadata"].get("creationTimestamp"), self.fleet.now()))
                else:
                    self.model.set_shape(node.name, shape, cluster=cluster.name)
                    if self._boots.get(key) != boot:
                        self.model.reboot(node.name, cluster=cluster.name, at=_booted_at(node, self.fleet.now()))
        for cluster_name, node_name in have - set(present):
            self.model.remove_node(node_name, cluster=cluster_name)
        self._boots = present

    # ------------------------------------------------------------------ the control API
    def _cluster(self, body: Any) -> Any:
        from sim.scenario import ScenarioError

        if not isinstance(body, dict) or not body.get("cluster"):
            raise ScenarioError("body must name a cluster")
        cluster = self.fleet.cluster_by_name(str(body["cluster"]))
        if cluster is None:
            raise ScenarioError(f"body.cluster {body['cluster']!r} is not in the scenario")
        return cluster

    def _target(self, body: Any) -> tuple[str, str, int]:
        from sim.scenario import ScenarioError, _flip_target, _resolve_node

        if not isinstance(body, dict):
            raise ScenarioError("body must be {cluster, node | pool+node_index, gpu, ...}")
        cluster, _ = _flip_target(self.fleet, body, "body")
        node = _resolve_node(cluster, body)
        if node is None or node not in cluster.nodes:
            raise ScenarioError(f"body: no such node in {cluster.name}")
        gpu = int(body.get("gpu", 0))
        if not 0 <= gpu < _gpu_count(cluster.nodes[node]):
            raise ScenarioError(f"body: node {node} has no GPU {gpu}")
        return cluster.name, node, gpu

    def status(self) -> dict[str, Any]:
        m = self.model
        faulty = []
        for labels, v in m.series():
            if v:
                node = labels.get("instance") if labels.get("job") == "dcgm-exporter" else labels.get("Hostname")
                faulty.append({"cluster": labels.get("cluster"), "node": node or labels.get("instance"),
                               "gpu": labels.get("gpu"), "metric": labels["__name__"], "value": v,
                               "job": labels.get("job")})
        return {"queries": len(m.queries), "outage": m.outage, "warning": m.warning,
                "throttle_retry_after": m.throttle_retry_after, "faulty": faulty,
                "exporters": {f"{c}/{p}": s.kind for (c, p), s in sorted(self.exporters.items())}}

    def control(self, method: str, sub: str, body: Any) -> Response:
        """``/_sim/dcgm/...`` (called by sim.core.control under ``fleet.lock``)."""
        self.sync()
        m = self.model
        if (method, sub) == ("GET", "/dcgm"):
            return Response.json(200, self.status())
        if method != "POST":
            return Response.json(405, {"error": {"code": "Error", "message": f"{method} {sub} is not supported"}})
        body = body if isinstance(body, dict) else {}
        if sub == "/dcgm/outage":
            # The workspace's query service: down (503), answering in part (a warning), or throttling.
            m.outage = bool(body.get("down", True))
            m.warning = str(body["warning"]) if body.get("warning") else None
            m.throttle_retry_after = int(body["throttle_retry_after"]) if body.get("throttle_retry_after") else None
            return Response.json(200, {"outage": m.outage, "warning": m.warning,
                                       "throttle_retry_after": m.throttle_retry_after, "queries": len(m.queries)})
        if sub == "/dcgm/cluster-alias":
            cluster = self._cluster(body)
            m.set_alias(cluster.name, str(body.get("alias") or ""))
            return Response.json(200, {"cluster": cluster.name, "label": m.cluster_value(cluster.name)})
        if sub == "/dcgm/exporter":
            cluster = self._cluster(body)
            pool = str(body.get("pool") or "")
            if pool not in cluster.pools:
                raise ValueError(f"body.pool {pool!r} is not a pool of {cluster.name}")
            kind = str(body.get("kind") or "custom")
            if kind == "managed":
                self.exporters.pop((cluster.name, pool), None)
            elif kind == "none":
                self.exporters[(cluster.name, pool)] = ExporterShape(kind="none")
            elif kind == "custom":
                counters = tuple(str(c) for c in body.get("counters") or ERROR_COUNTERS)
                unknown = sorted(set(counters) - set(ERROR_COUNTERS))
                if unknown:
                    raise ValueError(f"counters {unknown} are not modelled (known: {list(ERROR_COUNTERS)})")
                self.exporters[(cluster.name, pool)] = ExporterShape.custom(
                    job=str(body.get("job") or "gpu-monitoring/dcgm-exporter"),
                    node_label=str(body.get("node_label") or "Hostname"),
                    namespace=str(body.get("namespace") or "gpu-monitoring"), counters=counters)
            else:
                raise ValueError("kind must be managed, custom or none")
            self.sync()
            return Response.json(200, {"cluster": cluster.name, "pool": pool, "kind": kind})
        if sub == "/dcgm/tenant-series/clear":
            return Response.json(200, {"removed": m.clear_scraped()})
        if sub == "/dcgm/tenant-series":
            cluster = self._cluster(body)
            target, honor, drop = _tenant_target(body)
            metric = str(body.get("metric") or XID)
            exposed = {"__name__": metric, **{str(k): str(v) for k, v in (body.get("labels") or {}).items()}}
            labels = m.add_scraped(cluster.name, exposed=exposed, target=target, value=float(body.get("value", 1)),
                                   honor=honor, drop=drop)
            return Response.json(200, {"cluster": cluster.name, "labels": labels})
        cluster, node, gpu = self._target(body)
        if sub == "/dcgm/xid":
            xid = int(body["xid"])
            if xid <= 0:
                raise ValueError("xid must be a positive number")
            m.inject_xid(node, gpu, xid, cluster=cluster)
        elif sub == "/dcgm/ecc-storm":
            m.ecc_storm(node, gpu, int(body.get("dbe", 4)), cluster=cluster, persist=bool(body.get("persist", True)))
        elif sub == "/dcgm/row-remap":
            if body.get("failure"):
                m.set(node, gpu, REMAP_FAILURE, 1, cluster=cluster)
            if body.get("pending"):
                m.set(node, gpu, REMAP_PENDING, 1, cluster=cluster)
            if not body.get("failure") and not body.get("pending"):
                raise ValueError("body must say failure: true or pending: true")
        elif sub == "/dcgm/counter":
            # One error counter of one GPU set to a value, alone (the other faults move several at once).
            metric, value = str(body.get("metric") or ""), float(body.get("value", 1))
            if metric not in ERROR_COUNTERS or metric == XID_METRIC:
                raise ValueError(f"metric must be one of {', '.join(c for c in ERROR_COUNTERS if c != XID_METRIC)} "
                                 f"(XIDs: /_sim/dcgm/xid), not {metric!r}")
            if not value >= 0:
                raise ValueError("value must be a number >= 0")
            m.set(node, gpu, metric, value, cluster=cluster)
        else:
            return Response.json(404, {"error": {"code": "Error", "message": f"no control endpoint POST /_sim{sub}"}})
        return Response.json(200, {"cluster": cluster, "node": node, "gpu": gpu, "queries": len(m.queries)})

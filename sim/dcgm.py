"""The fleet's Azure Monitor workspace: dcgm-exporter series of the simulated GPU nodes, over PromQL.

:class:`FleetDcgm` serves ``/prometheus/<workspace>/api/v1/query`` (the path after the workspace is the
Azure Monitor workspace's query API, modelled by :mod:`sim.prometheus`) and keeps the series in step
with the simulated nodes before each answer, as the exporter on each node would:

- every GPU node of every cluster has one series per (error counter, GPU), labelled with its node
  (``Hostname``) and its cluster's name (``cluster``); any workspace name serves every cluster, told
  apart by that label;
- a node that is gone has no series (which the app must never read as healthy);
- a reboot (the node's ``bootID`` changes: restart, reimage) reloads the driver: the last XID, the
  volatile double-bit ECC count and a pending row remap reset; the lifetime count and a row-remap
  failure stay (both live in the GPU's InfoROM); a failing memory (``ecc-storm`` with ``persist``)
  errs again after the reset;
- a replaced node is a new node with fresh GPUs.

Faults come through the control API (``/_sim/dcgm/...``, :meth:`FleetDcgm.control`): an XID on a GPU,
an ECC storm, a row-remap failure or pending remap, one error counter set alone (``/_sim/dcgm/counter``
{metric, value}: the fields of NVIDIA/dcgm-exporter etc/default-counters.csv that sim.prometheus models), and a
workspace outage (503), a partial answer (``warning``) or throttling.
"""

from __future__ import annotations

from typing import Any

from sim.http import Request, Response
from sim.prometheus import ERROR_COUNTERS, PrometheusApi, PrometheusModel

PREFIX = "/prometheus/"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"


def _gpu_count(node: Any) -> int:
    """GPUs of a node: its VM size's, else what the kubelet advertises."""
    from sim.sizes import size_info

    size = size_info(node.labels.get("node.kubernetes.io/instance-type", "") or "")
    count = int(getattr(size, "gpus", 0) or 0)
    if count:
        return count
    try:
        return int(str((node.obj["status"].get("capacity") or {}).get("nvidia.com/gpu", "0")))
    except ValueError:
        return 0


class FleetDcgm:
    """The workspace's query endpoint and its control switches (a sim.http Handler)."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.model = PrometheusModel()
        self.api = PrometheusApi(self.model, now=fleet.now, issuer=fleet.tokens)
        self._boots: dict[tuple[str, str], tuple[str, str]] = {}

    def route(self, request: Request) -> str:
        rest = request.path[len(PREFIX):] if request.path.startswith(PREFIX) else request.path
        return PREFIX + "{}/" + rest.partition("/")[2]

    def handle(self, request: Request) -> Response:
        with self.fleet.lock:
            self.sync()
        return self.api.handle(request)

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
                if key not in have:
                    self.model.add_node(node.name, gpus, cluster=cluster.name)
                elif self._boots.get(key) != boot:
                    self.model.reboot(node.name, cluster=cluster.name)
        for cluster_name, node_name in have - set(present):
            self.model.remove_node(node_name, cluster=cluster_name)
        self._boots = present

    # ------------------------------------------------------------------ the control API
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

    def control(self, method: str, sub: str, body: Any) -> Response:
        """``/_sim/dcgm/...`` (called by sim.control under ``fleet.lock``)."""
        self.sync()
        m = self.model
        if (method, sub) == ("GET", "/dcgm"):
            return Response.json(200, {"queries": len(m.queries), "outage": m.outage, "warning": m.warning,
                                       "throttle_retry_after": m.throttle_retry_after,
                                       "faulty": [{"cluster": labels.get("cluster"), "node": labels.get("Hostname"),
                                                   "gpu": labels.get("gpu"), "metric": labels["__name__"], "value": v}
                                                  for labels, v in m.series() if v]})
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
            # One error counter of one GPU set to a value, alone (the other faults move several at once):
            # what the exporter would report for that field (NVIDIA/dcgm-exporter etc/default-counters.csv).
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

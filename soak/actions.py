"""The soak's timed actions: what someone else does to the fleet at a given sim second.

Drawn by :mod:`soak.strict`, performed by the driver (in process, and between polls in host-process
mode) when the simulated clock reaches them, through the same doors a person or a controller would
use: the cluster's real Kubernetes API (``DELETE /api/v1/namespaces/x``; a merge patch that removes
a pod's finalizers) with a token from the simulator, or the simulator's control API for what only
Azure can do (lock a node resource group) and for a GPU fault on a node that exists only once
Karpenter made it. The scenario's fault rules apply to these requests too: an action that meets one
is tried again at the next step, a few times, and what happened is logged with its sim time.

Issue 13's signals (:mod:`soak.signals`) are played through the control API too, as Azure and the GPUs
would: Resource Health scenarios on a node's VM (``/_sim/resource-health``; the node is the
``node_index``-th of its pool when the action is due, as for a NAP flip), forged HealthResources events
(``/_sim/resource-health/forged``), DCGM faults on a node's GPU (``/_sim/dcgm/xid``, ``/ecc-storm``) and
the workspace going down and up again (``/_sim/dcgm/outage``). The node and the events delivered are
kept in the action's log entry, for the invariants (soak/signal_invariants.py). Issue 18's forged DCGM
series (:mod:`soak.forgeries`: tenant series, a cluster alias, phantom names) go through
``/_sim/dcgm/tenant-series`` and ``/cluster-alias``; the nodes they named are kept the same way
(soak/forgery_invariants.py). Issue 19's forged ledger rows (:mod:`soak.forged_rows`) are written straight
into the ledger the hosts share (:attr:`ActionRunner.ledger`, set by the driver once it has one), with the
node's uid and providerID read from the cluster's API; the rows written are kept the same way
(soak/forged_row_invariants.py).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from soak.audit import AKS_SERVER_APP
from soak.forged_row_invariants import acts_on
from soak.forged_rows import FORGE_MIGRATION
from soak.forged_rows import KINDS as FORGED_ROW_KINDS
from soak.forged_rows import perform as write_forged_rows
from soak.forged_rows import perform_migration as write_forged_migration
from soak.forgeries import KINDS as FORGERY_KINDS
from soak.forgeries import perform as perform_forgery
from soak.strict import FINALIZER

MAX_TRIES = 8
#: Actions that put a genuine fault on a node (a forged row prefers a node none of them struck).
GENUINE_NODE_ACTIONS = frozenset({"resource-health", "dcgm-xid", "dcgm-ecc-storm", "nap-flip"})
RETRY_S = 2.0


class ActionRunner:
    """Performs ``scenario.actions`` at ``start + action["at"]``; :attr:`log` is what was done, and when."""

    def __init__(self, actions: list[dict[str, Any]], *, sim: Any, start: float) -> None:
        self.sim = sim
        self.start = start
        self.pending: list[dict[str, Any]] = [dict(a, tries=0, due=start + float(a["at"]))
                                              for a in sorted(actions, key=lambda a: float(a["at"]))]
        self.log: list[dict[str, Any]] = []
        self._tls: ssl.SSLContext | None = None
        self.tenant_series: list[dict[str, Any]] = []  # forged series sent (soak.forgeries sends them again)
        self.ledger: Any = None  # the hosts' shared ledger, where soak.forged_rows writes
        self._now = start

    def next_due(self) -> float | None:
        return min((a["due"] for a in self.pending), default=None)

    def run_due(self, now: float) -> None:
        for action in [a for a in self.pending if a["due"] <= now]:
            action["tries"] += 1
            self._now = now
            try:
                result = self._perform(action)
            except Exception as error:  # an injected fault, a dropped connection: try again shortly
                if action["tries"] < MAX_TRIES:
                    action["due"] = now + RETRY_S
                    continue
                result = f"failed after {action['tries']} tries: {type(error).__name__}: {str(error)[:200]}"
                ok = False
            else:
                ok = not result.startswith("skipped")
                if not ok and action["tries"] < MAX_TRIES:  # e.g. no NAP node yet: Karpenter is still provisioning
                    action["due"] = now + RETRY_S * 5
                    continue
            self.pending.remove(action)
            entry = {k: v for k, v in action.items() if k not in ("tries", "due")}
            self.log.append({**entry, "t": now, "ok": ok, "result": result})

    # ------------------------------------------------------------------ the actions

    def _perform(self, action: dict[str, Any]) -> str:
        kind = action["kind"]
        if kind == "delete-namespace":
            return self._delete_namespace(action["cluster"], action["namespace"])
        if kind == "remove-finalizers":
            return self._remove_finalizers(action["cluster"], action["namespace"])
        if kind == "lock-node-rg":
            self.sim.control("POST", "/lock", {"cluster": action["cluster"], "locked": bool(action["locked"])})
            return "locked" if action["locked"] else "unlocked"
        if kind == "nap-flip":
            return self._nap_flip(action)
        if kind in ("resource-health", "dcgm-xid", "dcgm-ecc-storm"):
            return self._node_signal(action)
        if kind == "resource-health-forged":
            answer = self.sim.control("POST", "/resource-health/forged", {"vm": action["vm"],
                                                                         "scenario": action["scenario"]})
            action["events"] = [str(e["id"]) for e in (answer or {}).get("events") or []]
            return f"forged {action['scenario']} for {action['vm']} ({len(action['events'])} event(s))"
        if kind in FORGERY_KINDS:
            return perform_forgery(self.sim, action, sent=self.tenant_series)
        if kind == FORGE_MIGRATION:
            return write_forged_migration(self.sim, action, ledger=self.ledger, now=self._now)
        if kind in FORGED_ROW_KINDS:
            struck = {(str(a.get("cluster")), str(a["node"])) for a in self.log
                      if a.get("kind") in GENUINE_NODE_ACTIONS and a.get("node") and acts_on(a)}
            return write_forged_rows(self.sim, action, ledger=self.ledger, read_node=self._node, now=self._now,
                                     avoid=struck)
        if kind == "dcgm-outage":
            self.sim.control("POST", "/dcgm/outage", {"down": bool(action["down"])})
            return "workspace down" if action["down"] else "workspace back"
        raise ValueError(f"unknown soak action {kind!r}")

    def _node_signal(self, action: dict[str, Any]) -> str:
        """A Resource Health scenario or a DCGM fault on the ``node_index``-th Ready node of a pool."""
        state = self.sim.state()
        cluster = next((c for c in state.get("clusters") or [] if c["name"] == action["cluster"]), None)
        pool = next((p for p in (cluster or {}).get("pools") or [] if p["name"] == action["pool"]), None)
        ready = {str(n["name"]) for n in (cluster or {}).get("nodes") or [] if n.get("ready")}
        nodes = [str(n) for n in (pool or {}).get("nodes") or [] if str(n) in ready]
        if not nodes:
            return "skipped: no Ready node in the pool"
        node = nodes[int(action.get("node_index", 0)) % len(nodes)]
        target = {"cluster": action["cluster"], "node": node}
        if action["kind"] == "resource-health":
            body = {**target, "scenario": action["scenario"],
                    **({"down_s": action["down_s"]} if "down_s" in action else {})}
            answer = self.sim.control("POST", "/resource-health", body)
            action["events"] = [str(e["id"]) for e in (answer or {}).get("events") or []]
            what = f"{action['scenario']} on {node}"
        elif action["kind"] == "dcgm-xid":
            self.sim.control("POST", "/dcgm/xid", {**target, "gpu": action.get("gpu", 0), "xid": action["xid"]})
            what = f"XID {action['xid']} on {node}"
        else:
            self.sim.control("POST", "/dcgm/ecc-storm", {**target, "gpu": action.get("gpu", 0),
                                                        "persist": bool(action.get("persist"))})
            what = f"ECC storm on {node}"
        action["node"] = node
        return what

    def _node(self, cluster: str, name: str) -> dict[str, Any]:
        status, node = self._kube(cluster, "GET", f"/api/v1/nodes/{name}")
        if status != 200 or not node:
            raise RuntimeError(f"node {cluster}/{name}: {status}")
        return dict(node)

    def _kube(self, cluster: str, method: str, path: str, body: Any = None,
              content_type: str = "application/json") -> tuple[int, Any]:
        server = next(str(c["kube_server"]) for c in self.sim.endpoints["clusters"] if c["name"] == cluster)
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=str(self.sim.endpoints["ca_bundle"]))
        headers = {"Authorization": f"Bearer {self.sim.token(AKS_SERVER_APP)}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        request = urllib.request.Request(f"{server}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self._tls, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            if error.code in (404, 409):  # answers, not failures: gone already, or already terminating
                return error.code, None
            raise

    def _delete_namespace(self, cluster: str, namespace: str) -> str:
        status, _ = self._kube(cluster, "DELETE", f"/api/v1/namespaces/{namespace}")
        return {404: "already gone", 409: "already terminating"}.get(status, f"namespace {namespace} deleted")

    def _remove_finalizers(self, cluster: str, namespace: str) -> str:
        """Remove our finalizer from every pod of ``namespace`` that is being deleted (a cleanup job's work)."""
        status, pods = self._kube(cluster, "GET", f"/api/v1/namespaces/{namespace}/pods")
        released = []
        items = ((pods or {}).get("items") or []) if status == 200 else []
        for pod in items:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") and FINALIZER in (meta.get("finalizers") or []):
                rest = [f for f in meta["finalizers"] if f != FINALIZER]
                self._kube(cluster, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{meta['name']}",
                           {"metadata": {"finalizers": rest or None}}, "application/merge-patch+json")
                released.append(str(meta["name"]))
        return f"finalizers removed from {len(released)} terminating pod(s)"

    def _nap_flip(self, action: dict[str, Any]) -> str:
        """A GPU condition turns True on the ``node_index``-th node (by name) of a Karpenter NodePool."""
        state = self.sim.state()
        cluster = next((c for c in state.get("clusters") or [] if c["name"] == action["cluster"]), None)
        nodes = sorted(str(n["name"]) for n in (cluster or {}).get("nodes") or []
                       if n.get("pool") == action["nodepool"] and n.get("ready") and not n.get("unschedulable"))
        if not nodes:
            return "skipped: no Ready NAP node"
        node = nodes[int(action.get("node_index", 0)) % len(nodes)]
        self.sim.control("POST", "/conditions", {"cluster": action["cluster"], "node": node, "type": action["type"],
                                                 "status": "True", "fixed_by": "never"})
        action["node"] = node
        return f"{action['type']} True on {node}"

"""The simulator's control API (``/_sim/...``): what tests, the demo and drills use to look and poke.

It is not part of any Azure protocol and needs no token. Everything here either reads the oracles
and state, or changes the world the way nature would (a GPU condition flips, quota shrinks, a team
deploys a workload, a fault starts), never the way the app would.
"""

from __future__ import annotations

import json
from typing import Any

from sim.core.http import Request, Response
from sim.identity.tokens import AKS_AUDIENCES, KNOWN_AUDIENCES
from sim.model import Cluster, Fleet
from sim.scenario import ScenarioError, add_workload, flip_now


def _err(status: int, message: str) -> Response:
    return Response.json(status, {"error": {"code": "BadRequest" if status == 400 else "Error", "message": message}})


class _NotFound(Exception):
    """Answered as a 404 with the message (ControlApi.handle)."""


def _cluster(fleet: Fleet, body: dict[str, Any]) -> Cluster:
    """The cluster a request body's ``cluster`` names: by name, or by its (lower-case) id; 404 when none."""
    name = str(body["cluster"])
    cluster = fleet.cluster_by_name(name) or fleet.clusters.get(name.lower())
    if cluster is None:
        raise _NotFound(f"no cluster {body['cluster']!r}")
    return cluster


def token_review(fleet: Fleet, body: Any) -> dict[str, Any]:
    """Answer a kube-apiserver token webhook (``authentication.k8s.io/v1`` TokenReview) for a token
    this simulator's identity endpoint issued for the AKS server application, as AKS's Entra webhook
    (kubeguard/guard) does for a real cluster: the user is the token's object id, its groups the
    token's groups. A real kube-apiserver started with ``--authentication-token-webhook-config-file``
    pointing here (realkube) then authorizes the app with its own RBAC.

    Source: kubernetes/kubernetes ``staging/src/k8s.io/apiserver/plugin/pkg/authenticator/token/webhook/webhook.go``
    (the request and answer shapes); learn.microsoft.com/azure/aks/concepts-identity (the webhook).
    """
    spec = (body or {}).get("spec") or {} if isinstance(body, dict) else {}
    verdict = fleet.tokens.verify(str(spec.get("token") or ""), AKS_AUDIENCES)
    review: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview"}
    if verdict.status != 200:
        review["status"] = {"authenticated": False, "error": verdict.reason}
        return review
    review["status"] = {"authenticated": True,
                        "user": {"username": verdict.principal, "uid": verdict.principal,
                                 "groups": list(verdict.groups)},
                        "audiences": list(spec.get("audiences") or [])}
    return review


class ControlApi:
    def __init__(self, fleet: Fleet, *, extra: dict[str, Any] | None = None) -> None:
        self.fleet = fleet
        self.extra = extra or {}
        self.handlers: dict[str, Any] = {}

    def route(self, request: Request) -> str:
        return request.path

    def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/")
        body: Any = None
        if request.body:
            try:
                body = json.loads(request.body)
            except ValueError as e:
                return _err(400, f"body is not JSON: {e}")
        key = (request.method, path.removeprefix("/_sim"))
        try:
            with self.fleet.lock:
                self.fleet.pump()
                return self._dispatch(key, request, body)
        except _NotFound as e:
            return _err(404, str(e))
        except ScenarioError as e:
            return _err(400, str(e))
        except (ValueError, TypeError, KeyError) as e:
            return _err(400, f"{type(e).__name__}: {e}")

    def _dispatch(self, key: tuple[str, str], request: Request, body: Any) -> Response:
        fleet = self.fleet
        method, sub = key
        if sub in ("", "/") and method == "GET":
            return Response.json(200, {"endpoints": ["/_sim/oracles", "/_sim/state", "/_sim/clock", "/_sim/conditions",
                                                     "/_sim/faults", "/_sim/quota", "/_sim/capacity",
                                                     "/_sim/workloads", "/_sim/advance", "/_sim/token",
                                                     "/_sim/lock", "/_sim/spot-evict", "/_sim/rbac",
                                                     "/_sim/kubelet", "/_sim/resource-health", "/_sim/dcgm",
                                                     "/_sim/gpus", "/_sim/tokenreview"]})
        if key == ("POST", "/tokenreview"):
            return Response.json(200, token_review(fleet, body))
        if key == ("GET", "/oracles"):
            report = fleet.oracles.report()
            faults = getattr(fleet, "faults", None)
            report["faults_fired"] = list(getattr(faults, "fired", []) or [])
            return Response.json(200, report)
        if key == ("GET", "/state"):
            return Response.json(200, fleet.state())
        if key == ("GET", "/clock"):
            return Response.json(200, {"now": fleet.clock.now(), **fleet.clock.published()})
        if key == ("POST", "/advance"):
            if not fleet.clock.manual:
                return _err(409, "the clock is not manual (scenario clock.manual: true)")
            seconds = float((body or {}).get("seconds", 0))
            fleet.advance(seconds)
            return Response.json(200, {"now": fleet.clock.now()})
        if key == ("POST", "/conditions"):
            if not isinstance(body, dict):
                return _err(400, "body must be {cluster, node | pool+node_index, type, status, fixed_by}")
            node = flip_now(fleet, body)
            fleet.settle()
            return Response.json(200, {"node": node})
        if sub == "/faults":
            faults = getattr(fleet, "faults", None)
            if faults is None:
                return _err(503, "sim.core.faults is not available")
            if method == "POST":
                rules = body if isinstance(body, list) else [body]
                added = []
                for rule in rules:
                    try:
                        added.append(faults.add(rule).describe())
                    except ValueError as e:
                        return _err(400, str(e))
                return Response.json(201, {"added": added})
            if method == "GET":
                return Response.json(200, {"rules": faults.describe(), "fired": list(faults.fired)})
            if method == "DELETE":
                faults.clear()
                return Response.json(200, {"rules": []})
        if key == ("POST", "/quota"):
            if not isinstance(body, dict):
                return _err(400, "body must be {subscription, location, family, limit}")
            k = (str(body["subscription"]), str(body["location"]).lower(), str(body["family"]))
            fleet.quotas[k] = int(body["limit"])
            return Response.json(200, {"quota": {"subscription": k[0], "location": k[1], "family": k[2],
                                                 "limit": fleet.quotas[k], "in_use": fleet.vcpus_in_use(*k)}})
        if key == ("GET", "/quota"):
            return Response.json(200, {"quotas": [{"subscription": s, "location": loc, "family": f, "limit": v,
                                                   "in_use": fleet.vcpus_in_use(s, loc, f)}
                                                  for (s, loc, f), v in sorted(fleet.quotas.items())]})
        if key == ("POST", "/capacity"):
            if not isinstance(body, dict):
                return _err(400, "body must be {location, vmSize, available}")
            fleet.capacity[(str(body["location"]).lower(), str(body["vmSize"]))] = int(body["available"])
            return Response.json(200, {"capacity": [{"location": loc, "vmSize": s, "available": v}
                                                    for (loc, s), v in sorted(fleet.capacity.items())]})
        if key == ("POST", "/workloads"):
            if not isinstance(body, dict) or "cluster" not in body or "workload" not in body:
                return _err(400, "body must be {cluster, workload}")
            cluster = _cluster(fleet, body)
            created = add_workload(cluster, body["workload"], "workload")
            fleet.settle()
            return Response.json(201, {"created": created})
        if key == ("POST", "/spot-evict"):
            # Azure takes a spot VM back (sim.model.Cluster.spot_evict): a Preempt notice, then the VM goes.
            if not isinstance(body, dict) or "cluster" not in body or "node" not in body:
                return _err(400, "body must be {cluster, node[, notice_s]}")
            cluster = _cluster(fleet, body)
            if str(body["node"]) not in cluster.nodes:
                return _err(404, f"no node {body['node']!r} in cluster {cluster.name}")
            notice = float(body.get("notice_s", 30.0))
            if notice < 0:
                return _err(400, "notice_s must not be negative")
            evicted = cluster.spot_evict(str(body["node"]), notice_s=notice)
            fleet.settle()
            return Response.json(202, {"eviction": evicted})
        if key == ("POST", "/rbac"):
            # Take ARM actions away from the app's role, or give them back (sim/arm/rbac.py subtracts
            # fleet.revoked_arm_actions from what infra/ grants): a process-mode test or soak shows a
            # path failing with the grant removed. Kubernetes grants live in the clusters' RBAC objects,
            # which an administrator edits through the API as on a real cluster.
            if not isinstance(body, dict) or not all(isinstance(body.get(k, []), list) for k in ("revoke", "restore")):
                return _err(400, "body must be {revoke: [actions], restore: [actions]}")
            fleet.revoked_arm_actions |= {str(a) for a in body.get("revoke", [])}
            fleet.revoked_arm_actions -= {str(a) for a in body.get("restore", [])}
            return Response.json(200, {"revoked": sorted(fleet.revoked_arm_actions)})
        if key == ("POST", "/kubelet"):
            # A node's kubelet stops (or resumes) posting status: the node goes Unknown with the
            # unreachable taints, and pods being deleted there stay Terminating (nothing confirms
            # they stopped) until it is back, the Node object goes, or someone force-deletes them.
            if not isinstance(body, dict) or "cluster" not in body or "node" not in body \
                    or not isinstance(body.get("ready"), bool):
                return _err(400, "body must be {cluster, node, ready: true|false}")
            cluster = _cluster(fleet, body)
            node_obj = cluster.nodes.get(str(body["node"]))
            if node_obj is None:
                return _err(404, f"no node {body['node']!r} in {cluster.name}")
            cluster._set_ready(node_obj, bool(body["ready"]))
            fleet.settle()
            return Response.json(200, {"cluster": cluster.name, "node": node_obj.name, "ready": node_obj.ready})
        if key == ("POST", "/lock"):
            # Node resource group lockdown on or off (restrictionLevel ReadOnly / Unrestricted).
            if not isinstance(body, dict) or "cluster" not in body or not isinstance(body.get("locked"), bool):
                return _err(400, "body must be {cluster, locked: true|false}")
            cluster = _cluster(fleet, body)
            cluster.node_rg_locked = bool(body["locked"])
            return Response.json(200, {"cluster": cluster.name, "node_resource_group": cluster.node_resource_group,
                                       "locked": cluster.node_rg_locked})
        if sub.startswith("/resource-health"):
            # Azure Resource Health on a node's VM: a state change and its HealthResources events (sim/arm/resource_health.py).
            from sim.arm import resource_health

            answered = resource_health.control(fleet, method, sub, body, _cluster)
            if answered is not None:
                return answered
        if sub == "/dcgm" or sub.startswith("/dcgm/"):
            # DCGM faults on a node's GPU and the workspace's outages (sim/prometheus/dcgm.py)
            dcgm = self.handlers.get("dcgm")
            if dcgm is None or not hasattr(dcgm, "control"):
                return _err(503, "sim.prometheus.dcgm is not available")
            answer: Response = dcgm.control(method, sub, body)
            return answer
        if sub.startswith("/gpus/"):
            # GPUs a node's device plugin does not (or no longer) advertise (sim/kube/gpu_faults.py)
            from sim.kube import gpu_faults

            gpu_answer = gpu_faults.control(_cluster, fleet, method, sub, body)
            if gpu_answer is not None:
                return gpu_answer
        if key == ("POST", "/token"):
            audience = str((body or {}).get("audience", ""))
            if fleet.tokens.normalise_audience(audience) not in {fleet.tokens.normalise_audience(a)
                                                                for a in KNOWN_AUDIENCES} and not (body or {}).get("any"):
                return _err(400, f"unknown audience {audience!r}")
            token, exp = fleet.tokens.issue(audience, principal=str((body or {}).get("principal", "sim-control")))
            return Response.json(200, {"access_token": token, "expires_on": exp})
        return _err(404, f"no control endpoint {method} /_sim{sub}")

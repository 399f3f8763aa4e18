"""The live side of ``fleetctl status`` and ``plan``: ARM and the clusters, through the app's own adapters.

fleetctl builds the same :class:`shared.kernel.context.Context` the app builds (``shared.wiring``), so it
reaches ARM and the Kubernetes API servers with the same scope, endpoints and credentials (your
developer identity on a laptop, via DefaultAzureCredential). It only reads: ``breaker --reset``
writes an operator command to the ledger (shared.remediation.commands), which the app validates and applies.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any


class FleetUnavailable(RuntimeError):
    """The app's wiring cannot be built here (missing settings, or shared.wiring not present)."""


def build_context(**overrides: Any) -> Any:
    """The app's Context (``overrides`` replace its fields: fleetctl hands in its own read-only ledger, so a
    read-only command never creates a table)."""
    try:
        from shared import wiring
    except ImportError as error:
        raise FleetUnavailable(f"shared.wiring is not available ({error})") from error
    builder = getattr(wiring, "build_context", None) or getattr(wiring, "get_context", None)
    if builder is None:
        raise FleetUnavailable("shared.wiring has neither build_context() nor get_context()")
    try:
        return builder(**overrides) if overrides else builder()
    except Exception as error:
        raise FleetUnavailable(f"cannot build the app's context: {type(error).__name__}: {error}") from error


def _is_gpu(vm_size: str) -> tuple[bool, str]:
    from shared.fleet import gpu_sizes

    size = gpu_sizes.lookup(vm_size)
    if size is None:
        return False, ""
    return bool(size.is_nvidia), str(size.gpu_model)


def fleet_view(ctx: Any) -> list[dict[str, Any]]:
    """Clusters in scope, each with its GPU pools (managed or not) and their nodes' readiness."""
    from shared.fleet import scope

    aks = ctx.access.aks()
    clusters = []
    for cluster in scope.discover(aks, ctx.settings):
        entry: dict[str, Any] = {"id": cluster.id, "name": cluster.name, "location": cluster.location,
                                 "node_provisioning_mode": cluster.node_provisioning_mode, "pools": [], "error": "",
                                 "paused": scope.paused_reason(cluster.tags)}
        try:
            pools = aks.list_pools(cluster.id)
            gpu_pools = []
            for pool in pools:
                nvidia, model = _is_gpu(pool.vm_size)
                if nvidia:
                    gpu_pools.append((pool, model))
            nodes_by_pool: dict[str, list[Any]] = defaultdict(list)
            if gpu_pools:
                for node in ctx.access.kube(cluster.id).list_nodes():
                    nodes_by_pool[node.pool].append(node)
            gpu_nodes = [n for pool, _ in gpu_pools for n in nodes_by_pool.get(pool.name, [])]
            if gpu_nodes:
                entry["evaluation"] = evaluation(ctx, gpu_nodes)
            for pool, model in gpu_pools:
                nodes = nodes_by_pool.get(pool.name, [])
                entry["pools"].append({
                    "name": pool.name, "vm_size": pool.vm_size, "gpu": model, "count": pool.count,
                    "management": "managed" if pool.management_mode == "Managed" else "unmanaged",
                    "provisioning_state": pool.provisioning_state,
                    "nodes": len(nodes), "ready": sum(1 for n in nodes if n.ready),
                    "cordoned": sum(1 for n in nodes if n.unschedulable),
                })
        except Exception as error:  # one cluster failing must not hide the others
            entry["error"] = f"{type(error).__name__}: {error}"
        clusters.append(entry)
    return clusters


def evaluation(ctx: Any, nodes: list[Any]) -> dict[str, Any]:
    """The GPU nodes as the sweep judges them now (its own function, shared.remediation.health.evaluate): healthy,
    unhealthy, pending, unknown, and the skipped ones by reason (the start-up grace, a node being deleted...)."""
    from shared.remediation import health
    from shared.remediation.policy import RemediationPolicy

    policy = getattr(ctx.settings, "remediation", None) or RemediationPolicy()
    result = health.evaluate(nodes, now=ctx.clock.now(), policy=policy)
    skipped: dict[str, int] = {}
    for _, reason in result.skipped:
        key = reason.split(":", 1)[0]
        skipped[key] = skipped.get(key, 0) + 1
    return {"healthy": len(result.healthy), "unhealthy": len({f.node.name for f in result.unhealthy}),
            "pending": len({f.node.name for f in result.pending}), "unknown": len({n.name for n, _ in result.unknown}),
            "skipped": skipped}


def observe_plan(ctx: Any) -> Any:
    """The migration plan, computed now, changing nothing."""
    from shared.migration import planner as migration

    planner = getattr(migration, "plan_fleet", None) or getattr(migration, "observe_plan", None)
    if planner is None:
        raise FleetUnavailable("shared.migration.planner has neither plan_fleet() nor observe_plan()")
    return planner(ctx)

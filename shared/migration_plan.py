"""Which unmanaged GPU pools to migrate, how, and in what order; and why the others are skipped.

The plan is the promise the job makes before it changes anything: the CLI's ``plan`` prints it
(table or JSON) without writing, and the timer (:func:`shared.migration.run_planner`) records
exactly its items as migration records. It is a pure function of what was observed (clusters,
pools, existing migration records, maintenance configurations, quota headroom) and the policy.

A pool is a candidate when its VM size is a GPU size and its ``gpuProfile.nvidia.managementMode``
is not ``Managed``. Candidates become :class:`PlanItem` or :class:`Skip` (with a code and a reason):

==================  ====================================================================
code                why
==================  ====================================================================
not-nvidia          AMD GPU size: managed GPU pools are NVIDIA only
windows             Windows pools are not supported by managed GPU pools
mig                 MIG pools cannot be migrated (seed); never overridden
system              system pools host cluster services; not migrated by this job
not-succeeded       the pool (or cluster) is not ``Succeeded``; looked at again next run
migrating           a migration record for this pool is active
finished-before     a migration record for this pool ended (done/rolled_back/blocked);
                    an operator removes the record to try again
window              the cluster is outside its maintenance window ("waiting for window")
quota               the configured vCPU headroom cannot hold even one batch
cap                 the fleet-wide cap on concurrent migrations is reached; next run
==================  ====================================================================
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.maintenance import window_open
from shared.migration_policy import MigrationPolicy
from shared.pool_clone import clone_for_managed, replacement_name
from shared.ports import ClusterInfo, NodeView, PoolInfo, Record

KIND = "migration"
TERMINAL_STATES: frozenset[str] = frozenset({"done", "rolled_back", "blocked"})
ACTIVE_STATES: frozenset[str] = frozenset(
    {"planned", "creating", "validating", "cordoning", "draining", "deleting", "rolling_back"})


def migration_id(cluster_id: str, pool: str) -> str:
    """The record id: one per (cluster, pool), so that create-if-absent forbids two migrations."""
    return hashlib.sha256(f"{cluster_id.lower()}/{pool.lower()}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class SizeFacts:
    """What the plan needs to know about a VM size (shared.gpu_sizes.GpuSize satisfies it)."""

    vcpus: int
    gpus: int
    family: str
    is_nvidia: bool
    mig_capable: bool


SizeLookup = Callable[[str], Any]  # returns an object with vcpus, gpus, family, is_nvidia, or None


def _default_lookup(size: str) -> Any:
    from shared import gpu_sizes

    return gpu_sizes.lookup(size)


@dataclass(frozen=True)
class PlanItem:
    order: int
    record_id: str
    cluster_id: str
    cluster_name: str
    location: str
    pool: str
    vm_size: str
    node_count: int
    replacement: str
    strategy: str  # surge | rolling
    strategy_reason: str
    batch_size: int
    family: str
    vcpus_per_node: int
    gpus_per_node: int
    body: dict[str, Any] = field(default_factory=dict)  # the replacement's properties (full count)


@dataclass(frozen=True)
class Skip:
    cluster_id: str
    cluster_name: str
    pool: str
    code: str
    reason: str
    next_open: float | None = None


@dataclass(frozen=True)
class Plan:
    generated_at: float
    items: tuple[PlanItem, ...]
    skipped: tuple[Skip, ...]

    def item(self, cluster_id: str, pool: str) -> PlanItem | None:
        for it in self.items:
            if it.cluster_id.lower() == cluster_id.lower() and it.pool == pool:
                return it
        return None


def _is_mig(props: Mapping[str, Any]) -> bool:
    if props.get("gpuInstanceProfile"):
        return True
    nvidia = (props.get("gpuProfile") or {}).get("nvidia") or {}
    return str(nvidia.get("migStrategy") or "None") != "None" or bool(nvidia.get("migProfiles"))


def _static_skip(cluster: ClusterInfo, pool: PoolInfo, *, size: Any, record: Record | None) -> tuple[str, str] | None:
    """(code, reason) when the pool is not migrated whatever the window, quota or cap; None otherwise."""
    props = pool.properties
    if not getattr(size, "is_nvidia", True):
        return "not-nvidia", f"{pool.vm_size} is not an NVIDIA size; managed GPU pools are NVIDIA only"
    if str(props.get("osType", "Linux")) == "Windows":
        return "windows", "Windows pools are not supported by managed GPU pools"
    if _is_mig(props):
        return "mig", "MIG pool: existing MIG pools cannot be migrated to managed GPU pools"
    if str(props.get("mode", "User")) == "System":
        return "system", "system pool: hosts cluster services; not migrated"
    if record is not None and record.state in ACTIVE_STATES:
        return "migrating", f"migration {record.id} is active ({record.state})"
    if record is not None:
        why = f": {record.data.get('reason')}" if record.data.get("reason") else ""
        return "finished-before", f"migration {record.id} ended {record.state}{why}; remove the record to try again"
    if cluster.provisioning_state != "Succeeded" or pool.provisioning_state != "Succeeded":
        return "not-succeeded", f"cluster {cluster.provisioning_state}, pool {pool.provisioning_state}: next run"
    return None


def _strategy(policy: MigrationPolicy, *, headroom: int | None, full: int, batch: int) -> tuple[str | None, str]:
    """(surge | rolling | None = cannot, reason)."""
    if policy.strategy == "surge":
        return "surge", "MIGRATION_STRATEGY=surge"
    if headroom is not None and headroom < batch:
        return None, f"vCPU headroom {headroom} cannot hold one batch ({batch} vCPUs)"
    if policy.strategy == "rolling":
        return "rolling", "MIGRATION_STRATEGY=rolling"
    if headroom is None:
        return "rolling", "GPU vCPU headroom unknown (MIGRATION_GPU_VCPU_HEADROOM): rolling to be safe"
    if headroom >= full:
        return "surge", f"vCPU headroom {headroom} holds the whole replacement ({full} vCPUs)"
    return "rolling", f"vCPU headroom {headroom} < {full} vCPUs for the whole replacement"


def plan(clusters: Sequence[ClusterInfo], pools_by_cluster: Mapping[str, Sequence[PoolInfo]], *,
         migrations: Sequence[Record], maintenance_by_cluster: Mapping[str, Sequence[Mapping[str, Any]]],
         policy: MigrationPolicy, now: float,
         quotas: Mapping[tuple[str, str], int] | None = None,
         nodes_by_pool: Mapping[tuple[str, str], Sequence[NodeView]] | None = None,
         sizes: SizeLookup | None = None) -> Plan:
    """The plan for these observations (pure; ``migrations`` = every migration record, any state).

    ``quotas`` overrides the policy's headroom per (location, family), lower-cased keys.
    ``nodes_by_pool`` (keyed by (cluster id, pool)) is used for the node count when given.
    """
    lookup = sizes or _default_lookup
    by_pool = {(str(r.data.get("cluster_id", "")).lower(), str(r.data.get("pool", ""))): r for r in migrations}
    taken_names: dict[str, set[str]] = {}
    for r in migrations:
        if r.state in ACTIVE_STATES and r.data.get("replacement"):
            taken_names.setdefault(str(r.data.get("cluster_id", "")).lower(), set()).add(str(r.data["replacement"]))
    active = sum(1 for r in migrations if r.state in ACTIVE_STATES)
    slots = max(0, policy.max_concurrent - active)
    remaining: dict[tuple[str, str], int] = {}

    items: list[PlanItem] = []
    skipped: list[Skip] = []
    for cluster in sorted(clusters, key=lambda c: (c.name, c.id.lower())):
        pools = sorted(pools_by_cluster.get(cluster.id, ()), key=lambda p: p.name)
        names = {p.name for p in pools} | taken_names.get(cluster.id.lower(), set())
        window: tuple[bool, float | None, str] | None = None
        for pool in pools:
            size = lookup(pool.vm_size)
            if size is None or pool.management_mode == "Managed":
                continue  # not a GPU pool, or already managed: not a candidate
            static = _static_skip(cluster, pool, size=size, record=by_pool.get((cluster.id.lower(), pool.name)))
            if static is not None:
                skipped.append(Skip(cluster.id, cluster.name, pool.name, *static))
            else:
                if window is None:
                    window = window_open(maintenance_by_cluster.get(cluster.id, ()), now=now, policy=policy)
                is_open, next_open, why = window
                nodes = (nodes_by_pool or {}).get((cluster.id, pool.name))
                count = len(nodes) if nodes is not None else pool.count
                batch = max(1, min(policy.batch_size, count or 1))
                key = (cluster.location.lower(), str(size.family).lower())
                headroom = (quotas or {}).get(key) if quotas and key in quotas else policy.headroom(*key)
                if headroom is not None:
                    headroom = remaining.setdefault(key, headroom)
                strategy, strategy_reason = _strategy(policy, headroom=headroom, full=size.vcpus * count,
                                                      batch=size.vcpus * batch)
                deferred: tuple[str, str, float | None] | None = None
                if not is_open:
                    deferred = ("window", f"waiting for window: {why}", next_open)
                elif strategy is None:
                    deferred = ("quota", strategy_reason, None)
                elif slots <= 0:
                    deferred = ("cap", f"fleet cap of {policy.max_concurrent} concurrent migrations reached; next run", None)
                if deferred is not None:
                    skipped.append(Skip(cluster.id, cluster.name, pool.name, *deferred))
                else:
                    slots -= 1
                    if headroom is not None:
                        remaining[key] = headroom - size.vcpus * (count if strategy == "surge" else batch)
                    new_name = replacement_name(pool.name, names)
                    names.add(new_name)
                    items.append(PlanItem(
                        order=len(items) + 1, record_id=migration_id(cluster.id, pool.name), cluster_id=cluster.id,
                        cluster_name=cluster.name, location=cluster.location, pool=pool.name, vm_size=pool.vm_size,
                        node_count=count, replacement=new_name, strategy=strategy, strategy_reason=strategy_reason,
                        batch_size=batch, family=str(size.family), vcpus_per_node=int(size.vcpus),
                        gpus_per_node=int(size.gpus), body=clone_for_managed(pool, new_name=new_name)))
    return Plan(generated_at=now, items=tuple(items), skipped=tuple(skipped))


def to_json(p: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data (the CLI's ``plan --json``)."""
    return {
        "generated_at": datetime.fromtimestamp(p.generated_at, UTC).isoformat(),
        "items": [asdict(it) for it in p.items],
        "skipped": [asdict(s) for s in p.skipped],
    }


def render_table(p: Plan) -> str:
    """The plan as a fixed-width text table (the CLI's ``plan``)."""
    rows = [("#", "CLUSTER", "POOL", "SIZE", "NODES", "REPLACEMENT", "STRATEGY", "BATCH", "WHY")]
    rows += [(str(it.order), it.cluster_name, it.pool, it.vm_size, str(it.node_count), it.replacement,
              it.strategy, str(it.batch_size), it.strategy_reason) for it in p.items]
    out = [f"Migration plan at {datetime.fromtimestamp(p.generated_at, UTC).strftime('%Y-%m-%d %H:%M UTC')}: "
           f"{len(p.items)} to migrate, {len(p.skipped)} skipped", ""]
    out += _table(rows)
    if p.skipped:
        out += ["", "Skipped:"]
        out += _table([("CLUSTER", "POOL", "CODE", "REASON")]
                      + [(s.cluster_name, s.pool, s.code, s.reason) for s in p.skipped])
    return "\n".join(out) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def item_from_record(record: Record) -> dict[str, Any]:
    """The plan-item fields a migration record carries (to compare what was planned with what was done)."""
    keys = ("cluster_id", "pool", "replacement", "strategy", "batch_size", "body")
    return {k: json.loads(json.dumps(record.data.get(k))) for k in keys}

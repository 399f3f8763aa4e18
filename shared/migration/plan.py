"""Which unmanaged GPU pools to migrate, how, and in what order; and why the others are skipped.

The plan is the promise the job makes before it changes anything: the CLI's ``plan`` prints it
(table or JSON) without writing, and the timer (:func:`shared.migration.planner.run_planner`) records
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
quota               the configured vCPU headroom cannot hold even one batch (a spot pool's
                    headroom is its region's low-priority quota, ``location:lowPriorityCores``)
cap                 the fleet-wide cap on concurrent migrations is reached; next run
unwritable          the pool carries a property the clone has no rule for, or one no
                    api-version the app speaks can write (shared.fleet.pool_clone.clone_problems):
                    the replacement would silently lack it; the fields are named, nothing is written
==================  ====================================================================

Spot pools count against the region's separate low-priority (Spot) vCPU quota, usage name
``lowPriorityCores`` ("Total Regional Low-priority vCPUs";
https://learn.microsoft.com/azure/virtual-machines/spot-vms#quota), not their VM family's: their
surge-or-rolling choice is made against the headroom of (location, ``lowPriorityCores``).

Each item says what happens to the cluster autoscaler (:func:`autoscaler_note`): the old pool's is
switched off while it drains (``shared.migration.draining`` freezes it, and turns it back on only on a
rollback), and the replacement keeps it only if its body does (``shared.fleet.pool_clone`` turns it off on
managed GPU pools), so the plan's table says when a pool will lose it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.fleet import gpu_sizes
from shared.fleet.pool_clone import (
    MANAGED_GPU_PROFILE,
    TAG_AUTOSCALER,
    TAG_MIGRATED_FROM,
    candidate_name,
    clone_for_managed,
    clone_problems,
    replacement_count,
    replacement_name,
)
from shared.fleet.scope import paused_reason
from shared.kernel.ports import ClusterInfo, PoolInfo, Record
from shared.migration.maintenance import window_open
from shared.migration.policy import MigrationPolicy
from shared.migration.records import ACTIVE_STATES, KIND

LOW_PRIORITY_QUOTA = "lowPriorityCores"  # the regional Spot vCPU quota (Microsoft.Compute usages name)


def migration_id(cluster_id: str, pool: str) -> str:
    """The record id: one per (cluster, pool), so that create-if-absent forbids two migrations."""
    return hashlib.sha256(f"{cluster_id.lower()}/{pool.lower()}".encode()).hexdigest()[:24]


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
    quota: str = ""  # the vCPU quota the replacement counts against: the VM family, or lowPriorityCores (spot)
    autoscaler: str = ""  # what happens to the cluster autoscaler (autoscaler_note); "" = neither pool has one


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


def _is_mig(props: Mapping[str, Any]) -> bool:
    if props.get("gpuInstanceProfile"):
        return True
    nvidia = (props.get("gpuProfile") or {}).get("nvidia") or {}
    return str(nvidia.get("migStrategy") or "None") != "None" or bool(nvidia.get("migProfiles"))


# Codes of :func:`pool_ineligibility` that mean "not a candidate at all" (the plan does not list them).
NOT_CANDIDATE: frozenset[str] = frozenset({"not-gpu", "managed"})


def pool_ineligibility(pool: PoolInfo, *, size: Any) -> tuple[str, str] | None:
    """(code, reason) when ``pool``, as ARM shows it, is not a pool this job migrates; None when it is. Pure.

    The rules that depend on the pool alone, written once: the planner applies them before it plans
    a pool, and every step of a migration applies them again to the pool it reads from ARM before it
    writes anything (shared.migration.checks), so a ledger row (forged, or stale) can never steer the app to
    a pool the planner would not have chosen. ``size`` is the VM size's facts (None: not a GPU size).
    """
    props = pool.properties
    if size is None:
        return "not-gpu", f"{pool.name} is {pool.vm_size or 'of no size'}: not a GPU size"
    if pool.management_mode == "Managed":
        return "managed", f"{pool.name} has a managed GPU profile: it is not an unmanaged pool to migrate"
    if not getattr(size, "is_nvidia", True):
        return "not-nvidia", f"{pool.vm_size} is not an NVIDIA size; managed GPU pools are NVIDIA only"
    if str(props.get("osType", "Linux")) == "Windows":
        return "windows", "Windows pools are not supported by managed GPU pools"
    if _is_mig(props):
        return "mig", "MIG pool: existing MIG pools cannot be migrated to managed GPU pools"
    if str(props.get("mode", "User")) != "User":
        return "system", f"{props.get('mode')} pool, not a User pool: hosts cluster services; not migrated"
    lost = clone_problems(props)
    if lost:
        return "unwritable", lost
    return None


def _static_skip(cluster: ClusterInfo, pool: PoolInfo, *, size: Any, record: Record | None) -> tuple[str, str] | None:
    """(code, reason) when the pool is not migrated whatever the window, quota or cap; None otherwise."""
    intrinsic = pool_ineligibility(pool, size=size)
    if intrinsic is not None:
        return intrinsic
    if record is not None and record.state in ACTIVE_STATES:
        return "migrating", f"migration {record.id} is active ({record.state})"
    if record is not None:
        why = f": {record.data.get('reason')}" if record.data.get("reason") else ""
        return "finished-before", f"migration {record.id} ended {record.state}{why}; remove the record to try again"
    paused = paused_reason(cluster.tags)
    if paused:
        return "paused", f"{paused}: not started"
    if cluster.provisioning_state != "Succeeded" or pool.provisioning_state != "Succeeded":
        return "not-succeeded", f"cluster {cluster.provisioning_state}, pool {pool.provisioning_state}: next run"
    return None


def is_replacement_name(old_name: str, name: str) -> bool:
    """Whether ``name`` is one :func:`shared.fleet.pool_clone.replacement_name` can choose for ``old_name``
    (the old name cut to fit, ``m`` and a number from 1), whatever other pool names were taken."""
    match = re.search(r"m([1-9][0-9]*)$", name)
    if match is None or len(match.group(1)) > 3:
        return False
    return name == candidate_name(old_name, int(match.group(1))) and name != old_name.lower()


def record_problems(record: Record) -> str:
    """Why a migration record's own fields contradict each other ("" = they agree). Pure.

    A row read from the ledger is checked before it is acted on (whoever can write the table can
    write any row): its id must be the one :func:`migration_id` derives from its cluster and pool (so
    one pool has one migration), its replacement a name the clone would choose for that pool (so a
    row cannot point the app at another existing pool), and its replacement body the managed clone
    of its pool (managed GPU profile, the pool's size, tagged ``TAG_MIGRATED_FROM=<pool>``).
    """
    d = record.data
    cluster_id, pool, name = str(d.get("cluster_id") or ""), str(d.get("pool") or ""), str(d.get("replacement") or "")
    if record.kind != KIND:
        return f"the record is a {record.kind!r}, not a migration"
    if not cluster_id or not pool:
        return "the record names no cluster or no pool"
    if record.id != migration_id(cluster_id, pool):
        return f"the record's id {record.id} is not the migration id of {pool} ({migration_id(cluster_id, pool)})"
    if not is_replacement_name(pool, name):
        return f"{name or '(none)'} is not a name the migration of {pool} would give its replacement"
    if str(d.get("strategy") or "") not in ("surge", "rolling"):
        return f"unknown strategy {d.get('strategy')!r}"
    try:
        batch = int(d.get("batch_size") or 0)
    except (TypeError, ValueError):
        batch = 0
    if batch < 1:
        return f"batch size {d.get('batch_size')!r} is not a positive number"
    body = d.get("body")
    if not isinstance(body, Mapping):
        return "the record carries no replacement body"
    if (body.get("tags") or {}).get(TAG_MIGRATED_FROM) != pool:
        return f"the replacement body is not tagged {TAG_MIGRATED_FROM}={pool}"
    if body.get("gpuProfile") != dict(MANAGED_GPU_PROFILE):
        return "the replacement body is not a managed GPU pool"
    if str(body.get("vmSize") or "").lower() != str(d.get("vm_size") or "").lower() or not d.get("vm_size"):
        return f"the replacement body is {body.get('vmSize')}, the record says {d.get('vm_size')}"
    return ""


def body_problems(old: PoolInfo, record: Record) -> str:
    """Why the record's replacement body is not the managed clone of ``old`` as ARM shows it now ("" = it is).

    Pure. The count is left out (it is the step's to choose, within :func:`count_bound`), and so is
    the tag that remembers the old pool's autoscaler (the migration switches that autoscaler off).
    """
    body = dict(record.data.get("body") or {})
    name = str(record.data.get("replacement") or "")
    expected = clone_for_managed(old, new_name=name, count=int(body.get("count") or 0))

    def comparable(props: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in props.items() if k != "count"}
        out["tags"] = {k: v for k, v in (props.get("tags") or {}).items() if k != TAG_AUTOSCALER}
        return out

    want, got = comparable(expected), comparable(body)
    differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    if differ:
        return f"the recorded replacement body is not the managed clone of {old.name} (differs in {', '.join(differ)})"
    return ""


def count_bound(old: PoolInfo) -> int:
    """The most nodes a replacement of ``old`` may have: its nodes now, or its autoscaler's maximum."""
    props = old.properties
    high = int(props.get("maxCount") or 0) if props.get("enableAutoScaling") else 0
    return max(old.count, replacement_count(props), high)


def _strategy(policy: MigrationPolicy, *, headroom: int | None, full: int, batch: int,
              quota: str = "vCPU") -> tuple[str | None, str]:
    """(surge | rolling | None = cannot, reason); ``quota`` names the headroom in the reasons."""
    what = "low-priority (Spot) vCPU headroom" if quota == LOW_PRIORITY_QUOTA else "vCPU headroom"
    if policy.strategy == "surge":
        return "surge", "MIGRATION_STRATEGY=surge"
    if headroom is not None and headroom < batch:
        return None, f"{what} {headroom} cannot hold one batch ({batch} vCPUs)"
    if policy.strategy == "rolling":
        return "rolling", "MIGRATION_STRATEGY=rolling"
    if headroom is None:
        return "rolling", (f"{what} unknown (MIGRATION_GPU_VCPU_HEADROOM"
                           + (f" <location>:{LOW_PRIORITY_QUOTA}" if quota == LOW_PRIORITY_QUOTA else "")
                           + "): rolling to be safe")
    if headroom >= full:
        return "surge", f"{what} {headroom} holds the whole replacement ({full} vCPUs)"
    return "rolling", f"{what} {headroom} < {full} vCPUs for the whole replacement"


def is_spot(props: Mapping[str, Any]) -> bool:
    return str(props.get("scaleSetPriority") or "").lower() == "spot"


def quota_family(props: Mapping[str, Any], family: str) -> str:
    """The vCPU quota a pool's VMs count against: ``lowPriorityCores`` for spot, else the VM family."""
    return LOW_PRIORITY_QUOTA if is_spot(props) else family


def _bounds(props: Mapping[str, Any]) -> str:
    return f"{props.get('minCount', '?')}-{props.get('maxCount', '?')}"


def autoscaler_note(old: Mapping[str, Any], body: Mapping[str, Any]) -> str:
    """What the migration does to the cluster autoscaler of the old pool and of its replacement.

    "" when neither autoscales. The old pool's autoscaler is always switched off while it drains
    (shared.migration.draining freezes it; shared.migration.deleting restores it only on a rollback); the
    replacement has one only if its body enables it.
    """
    old_on, new_on = bool(old.get("enableAutoScaling")), bool(body.get("enableAutoScaling"))
    if not old_on and not new_on:
        return ""
    parts = []
    if old_on:
        parts.append(f"old pool's autoscaler ({_bounds(old)}) off while it drains")
    if new_on:
        parts.append(f"replacement autoscales {_bounds(body)}")
    elif old_on:
        parts.append(f"LOST: the replacement has none, fixed at {body.get('count', '?')} nodes "
                     "(turn it back on by hand once managed GPU pools support it)")
    return "; ".join(parts)


def plan(clusters: Sequence[ClusterInfo], pools_by_cluster: Mapping[str, Sequence[PoolInfo]], *,
         migrations: Sequence[Record], maintenance_by_cluster: Mapping[str, Sequence[Mapping[str, Any]]],
         policy: MigrationPolicy, now: float) -> Plan:
    """The plan for these observations (pure; ``migrations`` = every migration record, any state).
    """
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
            size = gpu_sizes.lookup(pool.vm_size)
            intrinsic = pool_ineligibility(pool, size=size)
            if size is None or (intrinsic is not None and intrinsic[0] in NOT_CANDIDATE):
                continue  # not a GPU pool, or already managed: not a candidate
            static = _static_skip(cluster, pool, size=size, record=by_pool.get((cluster.id.lower(), pool.name)))
            if static is not None:
                skipped.append(Skip(cluster.id, cluster.name, pool.name, *static))
            else:
                if window is None:
                    window = window_open(maintenance_by_cluster.get(cluster.id, ()), now=now, policy=policy)
                is_open, next_open, why = window
                count = pool.count
                batch = max(1, min(policy.batch_size, count or 1))
                quota = quota_family(pool.properties, str(size.family))
                key = (cluster.location.lower(), quota.lower())
                headroom = policy.headroom(*key)
                if headroom is not None:
                    headroom = remaining.setdefault(key, headroom)
                strategy, strategy_reason = _strategy(policy, headroom=headroom, full=size.vcpus * count,
                                                      batch=size.vcpus * batch, quota=quota)
                deferred: tuple[str, str, float | None] | None = None
                if not is_open:
                    deferred = ("window", f"waiting for window: {why}", next_open)
                elif strategy is None:
                    deferred = ("quota", strategy_reason, None)
                elif slots <= 0:
                    deferred = ("cap", f"fleet cap of {policy.max_concurrent} concurrent migrations reached; next run", None)
                if deferred is not None or strategy is None:
                    skipped.append(Skip(cluster.id, cluster.name, pool.name, *(deferred or ("quota", strategy_reason, None))))
                else:
                    slots -= 1
                    if headroom is not None:
                        remaining[key] = headroom - size.vcpus * (count if strategy == "surge" else batch)
                    new_name = replacement_name(pool.name, names)
                    names.add(new_name)
                    body = clone_for_managed(pool, new_name=new_name)
                    items.append(PlanItem(
                        order=len(items) + 1, record_id=migration_id(cluster.id, pool.name), cluster_id=cluster.id,
                        cluster_name=cluster.name, location=cluster.location, pool=pool.name, vm_size=pool.vm_size,
                        node_count=count, replacement=new_name, strategy=strategy, strategy_reason=strategy_reason,
                        batch_size=batch, family=str(size.family), vcpus_per_node=int(size.vcpus),
                        gpus_per_node=int(size.gpus), body=body, quota=quota,
                        autoscaler=autoscaler_note(pool.properties, body)))
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
    rows = [("#", "CLUSTER", "POOL", "SIZE", "NODES", "REPLACEMENT", "STRATEGY", "BATCH", "AUTOSCALER", "WHY")]
    rows += [(str(it.order), it.cluster_name, it.pool, it.vm_size, str(it.node_count), it.replacement,
              it.strategy, str(it.batch_size), _autoscaler_cell(it), it.strategy_reason) for it in p.items]
    out = [f"Migration plan at {datetime.fromtimestamp(p.generated_at, UTC).strftime('%Y-%m-%d %H:%M UTC')}: "
           f"{len(p.items)} to migrate, {len(p.skipped)} skipped", ""]
    out += _table(rows)
    notes = [f"  {it.order}. {it.cluster_name}/{it.pool}: {it.autoscaler}" for it in p.items if it.autoscaler]
    if notes:
        out += ["", "Autoscaler:", *notes]
    if p.skipped:
        out += ["", "Skipped:"]
        out += _table([("CLUSTER", "POOL", "CODE", "REASON")]
                      + [(s.cluster_name, s.pool, s.code, s.reason) for s in p.skipped])
    return "\n".join(out) + "\n"


def _autoscaler_cell(it: PlanItem) -> str:
    """Short: "-" (none), "lost" (the old pool autoscales, the replacement will not), "kept" or "added"."""
    if not it.autoscaler:
        return "-"
    if "LOST" in it.autoscaler:
        return "lost"
    return "kept" if it.autoscaler.startswith("old pool's") else "added"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]

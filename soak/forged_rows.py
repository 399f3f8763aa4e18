"""Issue 19's forged ledger rows in the soak: someone with table write forging the steward's own work.

Drawn from a fifth RNG, ``random.Random(f"forged-rows:{seed}")``, after :mod:`soak.generate`
(``Random(seed)``), :mod:`soak.strict`, :mod:`soak.signals` and :mod:`soak.forgeries` have drawn: every
earlier draw stays exactly as it was, so a seed's fleet, flips, fault rules, crashes and every other layer
are the same with or without this one, which only adds timed actions.

The forger holds Storage Table Data Contributor on the host account (docs/security.md, "Ledger rows")
and nothing in the clusters: it writes ``remediation`` rows straight into the ledger table, each claiming
one of the states a remediation passes through (admitted, cordoned, draining, repairing at the restart,
reimage and replace rungs' start, the replace rung's delete phase, a restart already requested,
verifying) for a **healthy** node: a managed pool's node that no flip or flapping condition was drawn
for, and that is Ready, schedulable and without a GPU condition when the row is written. The rows are
as realistic as a table writer can make them: the cluster's ARM id, the node's ``uid`` and
``providerID`` read from the cluster's API (any earlier row holds them), ``arm_vm_id`` from the
providerID, the pool and its selector, a fault id, an attempt number the node never used.

In half of those scenarios a forged ``migration`` row too, for a managed pool (which the planner never
chooses), in a state that would cordon, drain, delete or create pools, naming a replacement no soak pool is
called (:func:`forged_migration`).

The rows are written at a sim second of the run through the same ledger the hosts share (the in-memory
twin, or the Azurite table in ``--table-every`` and host-process runs); the record ids each action wrote
and the node each named are kept in the action's log entry, the ground truth of
soak/forged_row_invariants.py.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

P_FORGED_ROWS = 0.5
P_MIGRATION_ROW = 0.5  # given forged rows
FORGE_ROWS = "forge-ledger-rows"
FORGE_MIGRATION = "forge-migration-row"
KINDS = frozenset({FORGE_ROWS, FORGE_MIGRATION})
#: The migration states a forged row claims for a managed pool (which the planner never chooses: it is managed).
MIGRATION_STATES = ("creating", "validating", "cordoning", "draining", "deleting", "rolling_back")
#: The replacement a forged migration row names: no soak pool is called this (gpu1, gpu2, old, system, oldm1...).
FORGED_REPLACEMENT = "{pool}fx"
CONDITION = "UnhealthyNvidiaDevicePlugin"
LADDER = ("restart", "reimage", "replace")

#: Each forged state: the record's state and what the row claims beyond it (tests/unit/test_forged_remediation_rows.py
#: FORGED_STATES, in the soak's own words). Offsets are seconds before the row is written.
STATES: dict[str, dict[str, Any]] = {
    "admitted": {"state": "admitted"},
    "cordoned": {"state": "cordoned"},
    "draining": {"state": "draining", "drain_started_at": 40},
    "repairing/restart/start": {"state": "repairing", "rung_index": 0},
    "repairing/reimage/start": {"state": "repairing", "rung_index": 1},
    "repairing/replace/start": {"state": "repairing", "rung_index": 2},
    "repairing/replace/delete": {"state": "repairing", "rung_index": 2, "rung_phase": "delete", "replace": "delete"},
    "repairing/restart/requested": {"state": "repairing", "rung_index": 0, "rung_phase": "requested",
                                    "requested_at": 30, "rung_started_at": 30, "rung_entered_at": 30, "vm_id": True},
    "verifying": {"state": "verifying", "verify_since": 20},
}


@dataclass
class ForgedRowsLayer:
    actions: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


def _struck(flips: Sequence[dict[str, Any]], flapping: Sequence[dict[str, Any]]) -> set[tuple[str, str, int]]:
    return {(str(f["cluster"]), str(f["pool"]), int(f["node_index"])) for f in [*flips, *flapping]}


def add_forged_rows(seed: int, *, pools: Sequence[Any], flips: Sequence[dict[str, Any]],
                    flapping: Sequence[dict[str, Any]], grace: float, span: float) -> ForgedRowsLayer:
    """The forged rows of ``seed``: in a share of scenarios, 1-4 timed writes of 1-3 remediation rows each, and
    in half of those a forged migration row for a managed pool."""
    rng = random.Random(f"forged-rows:{seed}")
    layer = ForgedRowsLayer()
    managed = [p for p in pools if p.managed]
    if not managed or rng.random() >= P_FORGED_ROWS:
        return layer
    struck = _struck(flips, flapping)
    states: list[str] = []
    for _ in range(rng.randint(1, 4)):
        pool = rng.choice(managed)
        healthy = [i for i in range(pool.count) if (pool.cluster, pool.name, i) not in struck]
        if not healthy:
            continue
        rows = [rng.choice(list(STATES)) for _ in range(rng.randint(1, 3))]
        layer.actions.append({"at": round(grace + rng.uniform(0, span), 1), "kind": FORGE_ROWS,
                              "cluster": pool.cluster, "pool": pool.name, "node_index": rng.choice(healthy),
                              "rows": rows, "attempt": rng.randint(3, 9), "tag": rng.randrange(10**8)})
        states += rows
    if states:
        layer.kinds.append(f"{len(states)} forged remediation row(s): {', '.join(sorted(set(states)))}")
    if rng.random() < P_MIGRATION_ROW:
        pool = rng.choice(managed)
        state = rng.choice(MIGRATION_STATES)
        layer.actions.append({"at": round(grace + rng.uniform(0, span), 1), "kind": FORGE_MIGRATION,
                              "cluster": pool.cluster, "pool": pool.name, "state": state})
        layer.kinds.append(f"a forged migration row ({state}) for the managed pool {pool.cluster}/{pool.name}")
    return layer


# --------------------------------------------------------------------------- writing them (soak.actions)


def _healthy_nodes(sim: Any, cluster: str, pool: str) -> list[str]:
    """The pool's Ready, schedulable nodes with no GPU condition True, now (in the pool's order)."""
    state = sim.state()
    found = next((c for c in state.get("clusters") or [] if c["name"] == cluster), None) or {}
    healthy = {str(n["name"]) for n in found.get("nodes") or []
               if n.get("ready") and not n.get("unschedulable") and not n.get("unhealthy")}
    members = next((p.get("nodes") or [] for p in found.get("pools") or [] if p["name"] == pool), [])
    return [str(n) for n in members if str(n) in healthy]


def cluster_id(sim: Any, cluster: str) -> str:
    return next(str(c["id"]) for c in sim.state().get("clusters") or [] if c["name"] == cluster)


def forged_record(*, case: str, cid: str, pool: str, node: dict[str, Any], attempt: int, tag: int, serial: int,
                  now: float) -> Any:
    """The row a table writer would write for ``node`` (a Kubernetes Node object), claiming ``case``."""
    from shared.kernel.ports import Record
    from shared.kernel.timefmt import iso
    from shared.remediation.records import KIND, RemediationData, ReplaceData, ReplaceMode, node_key, to_data

    spec = dict(STATES[case])
    state = spec.pop("state")
    name = str(node["metadata"]["name"])
    provider_id = str((node.get("spec") or {}).get("providerID") or "")
    fields: dict[str, Any] = dict(
        cluster=cid, node=name, node_uid=str(node["metadata"].get("uid") or ""), pool=pool,
        pool_selector=f"kubernetes.azure.com/agentpool={pool}", provider_id=provider_id,
        arm_vm_id=provider_id.removeprefix("azure://"), condition=CONDITION, since=iso(now - 3600),
        since_ts=now - 3600, fault=hashlib.sha256(f"forged|{tag}|{serial}".encode()).hexdigest(),
        attempt=attempt, ladder=list(LADDER), cordoned_by_us=True, cordoned_at=now - 50, drain={},
        admitted_at=now - 60, admitted_by="soak-forger")
    for key in ("drain_started_at", "requested_at", "rung_started_at", "rung_entered_at", "verify_since"):
        if key in spec:
            fields[key] = now - float(spec.pop(key))
    if spec.pop("vm_id", False):
        fields["vm_id"] = fields["arm_vm_id"]
    if spec.pop("replace", None):
        fields["replace"] = ReplaceData(mode=ReplaceMode.DELETE_FIRST, original_count=3, target_count=3)
    fields.update(spec)  # rung_index, rung_phase
    data = RemediationData(**fields)
    return Record(kind=KIND, id=f"{node_key(cid, name)}-{attempt}", state=state, data=to_data(data),
                  created_at=now - 60, updated_at=now - 60, next_at=now)


def perform(sim: Any, action: dict[str, Any], *, ledger: Any, read_node: Any, now: float,
            avoid: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset()) -> str:
    """Write the action's rows into ``ledger``; what they named is kept in ``action`` (``node``, ``records``).

    ``read_node(cluster, name)`` reads a Node object from the cluster's API; a node in ``avoid`` (struck by a
    genuine fault earlier in the run) is named only when the pool has no other healthy node. A retry after an injected fault
    does not write a row twice (progress is kept in ``action``)."""
    from shared.kernel.errors import Conflict

    if ledger is None:
        return "skipped: no ledger to write to"
    if "node" not in action:
        nodes = _healthy_nodes(sim, action["cluster"], action["pool"])
        if not nodes:
            return "skipped: no healthy node in the pool"
        spared = [n for n in nodes if (action["cluster"], n) not in avoid] or nodes
        action["node"] = spared[int(action["node_index"]) % len(spared)]
        action["cluster_id"] = cluster_id(sim, action["cluster"])
        action["records"] = []
        action["states"] = {}
    node = read_node(action["cluster"], action["node"])
    for serial, case in enumerate(action["rows"]):
        if serial < len(action["records"]):
            continue
        record = forged_record(case=case, cid=action["cluster_id"], pool=action["pool"], node=node,
                               attempt=int(action["attempt"]) + serial, tag=int(action["tag"]), serial=serial, now=now)
        try:
            ledger.create(record)
        except Conflict:  # written by an earlier try whose answer was lost, or the app's own record has this id
            existing = ledger.get(record.kind, record.id)
            if existing is None or existing.data.get("fault") != record.data.get("fault"):
                action["records"].append("")  # not ours: not forged, not judged as forged
                continue
        action["records"].append(record.id)
        action["states"][record.id] = case
    action["records"] = [rid for rid in action["records"] if rid]  # the loop is over: no retry follows
    return f"{len(action['records'])} forged remediation row(s) naming {action['node']}: {', '.join(action['rows'])}"


def forged_migration(*, state: str, cid: str, pool: dict[str, Any], now: float) -> Any:
    """A self-consistent migration row (as a careful forger writes it, tests/unit/test_forged_migration_states.py)
    for a managed pool as the simulator shows it: its replacement, and the pool's first node as the batch or as
    drained."""
    from shared.fleet.pool_clone import clone_for_managed
    from shared.kernel.ports import PoolInfo, Record
    from shared.migration.plan import migration_id

    name, count = str(pool["name"]), int(pool.get("count") or 1)
    replacement = FORGED_REPLACEMENT.format(pool=name)
    props = {"vmSize": pool.get("vmSize"), "count": count, "mode": "User", "osType": "Linux",
             "nodeTaints": ["sku=gpu:NoSchedule"]}
    nodes = [str(n) for n in pool.get("nodes") or []][:1]
    data = {"cluster_id": cid, "cluster_name": cid.rsplit("/", 1)[-1], "location": "eastus", "pool": name,
            "replacement": replacement, "vm_size": props["vmSize"], "node_count": count, "strategy": "surge",
            "strategy_reason": "forged", "batch_size": 1, "family": "standardNCASv3_T4Family", "vcpus_per_node": 4,
            "gpus_per_node": 1, "order": 1, "quota": "", "autoscaler": "", "removed": [],
            "body": clone_for_managed(PoolInfo(cluster_id=cid, name=name, properties=props), new_name=replacement),
            "batch": nodes if state == "draining" else [], "drained": nodes if state == "deleting" else [],
            "phase": "drain", "replacement_count": count, "create_deadline": now + 3600,
            "validate_deadline": now + 3600}
    return Record(kind="migration", id=migration_id(cid, name), state=state, data=data, created_at=now - 60,
                  updated_at=now - 60, next_at=now)


def perform_migration(sim: Any, action: dict[str, Any], *, ledger: Any, now: float) -> str:
    """Write a forged migration row for the action's managed pool; its id and replacement are kept in ``action``."""
    from shared.kernel.errors import Conflict

    if ledger is None:
        return "skipped: no ledger to write to"
    found = next((c for c in sim.state().get("clusters") or [] if c["name"] == action["cluster"]), None) or {}
    pool = next((p for p in found.get("pools") or [] if p["name"] == action["pool"]), None)
    if pool is None:
        return "skipped: the pool is gone"
    record = forged_migration(state=action["state"], cid=str(found["id"]), pool=pool, now=now)
    try:
        ledger.create(record)
    except Conflict:
        existing = ledger.get(record.kind, record.id)
        if existing is None or existing.data.get("strategy_reason") != "forged":
            return "skipped: a migration row of the app's own has this id"
    action.update(record=record.id, replacement=record.data["replacement"], batch=record.data["batch"] or
                  record.data["drained"])
    return f"a forged migration row ({action['state']}) for {action['pool']} -> {action['replacement']}"

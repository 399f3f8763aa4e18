"""A forged ledger row is not enough to delete a pool (issue 11, "Confused deputy" 2).

Whoever can write the ledger table can write any row. The migration's delete of the old pool and
the pool request's cleanup derive their target from ARM, right before the call: the old pool must
still be the unmanaged User pool of the recorded size whose managed replacement, carrying
``gpu-fleet-steward-migrated-from=<old>``, exists; a request's cleanup deletes only the pool tagged
with that request's id and still of the request's mode, size and GPU management. Otherwise nothing
is deleted (nor drained) and the record ends blocked / failed with the reason. Driven through the
reconciler with the InMemoryLedger and the fakes of tests/unit (no DELETE reaches them).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from shared.fleet.pool_clone import MANAGED_GPU_PROFILE, TAG_MIGRATED_FROM, clone_for_managed
from shared.kernel.ports import PoolInfo, Record
from shared.kernel.reconciler import reconcile_once
from shared.migration import steps as migration
from shared.migration.plan import migration_id
from shared.pools import steps as pool_steps
from shared.pools.intake import accept
from shared.pools.records import KIND as POOL_REQUEST
from shared.pools.spec import TAG_CREATED_AT, TAG_REQUEST_ID, TAG_REQUESTER
from shared.pools.teams import Team
from tests.unit.fakes_pool import CLUSTER, make_world, message
from tests.unit.test_migration import NOW, World, t4_pool


def _forged_migration(world: World, *, pool: str, replacement: str, vm_size: str = "Standard_NC4as_T4_v3",
                      state: str = "deleting", **extra: Any) -> Record:
    """A row nobody planned, written straight into the ledger (in the state just before the DELETE unless
    told), self-consistent as a careful forger would make it: the id derived from (cluster, pool), a
    replacement name the clone would choose, and the managed clone of a T4 pool named ``pool`` as body."""
    body = clone_for_managed(PoolInfo(cluster_id=world.cid, name=pool, properties=t4_pool(count=1, vmSize=vm_size)),
                             new_name=replacement)
    data = {"cluster_id": world.cid, "cluster_name": "c1", "location": "eastus", "pool": pool,
            "replacement": replacement, "vm_size": vm_size, "node_count": 1, "strategy": "surge",
            "strategy_reason": "forged", "batch_size": 1, "family": "standardNCASv3_T4Family", "vcpus_per_node": 4,
            "gpus_per_node": 1, "order": 1, "body": body, "quota": "", "autoscaler": None, "drained": [],
            "removed": [], "batch": [], "phase": "drain", **extra}
    return world.ledger.create(Record(kind="migration", id=migration_id(world.cid, pool), state=state, data=data,
                                      created_at=NOW, updated_at=NOW, next_at=NOW))


def _reconcile(world: World) -> Record:
    reconcile_once(world.ctx(), modules={"migration": migration})
    found = world.ledger.get("migration", migration_id(world.cid, "bystander"))
    assert found is not None
    return found


CASES = [
    ("never-touched", {}, None, "does not exist"),
    ("untagged-replacement", {}, {"tags": {}}, f"does not carry {TAG_MIGRATED_FROM}=bystander"),
    ("replacement-of-another-pool", {}, {"tags": {TAG_MIGRATED_FROM: "other"}}, "was not created by a migration"),
    ("unmanaged-replacement", {}, {"tags": {TAG_MIGRATED_FROM: "bystander"}, "gpuProfile": {"driver": "Install"}},
     "not managed"),
    ("other-size", {"vmSize": "Standard_NC8as_T4_v3"}, {"tags": {TAG_MIGRATED_FROM: "bystander"}},
     "not the recorded Standard_NC4as_T4_v3"),
    ("managed-pool", {"gpuProfile": MANAGED_GPU_PROFILE}, {"tags": {TAG_MIGRATED_FROM: "bystander"}},
     "has a managed GPU profile"),
    ("system-pool", {"mode": "System"}, {"tags": {TAG_MIGRATED_FROM: "bystander"}}, "not a User pool"),
]


@pytest.mark.parametrize(("old", "replacement", "why"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_forged_migration_row_deletes_nothing_and_ends_blocked_with_the_reason(
        old: dict[str, Any], replacement: dict[str, Any] | None, why: str) -> None:
    world = World(replicas=0)
    world.fleet.add_pool(world.cid, "bystander", t4_pool(count=1, **old))  # a pool the app never touched
    if replacement is not None:
        world.fleet.add_pool(world.cid, "bystanderm1", t4_pool(count=1, gpuProfile=MANAGED_GPU_PROFILE)
                             | replacement)
    _forged_migration(world, pool="bystander", replacement="bystanderm1")
    after = _reconcile(world)
    assert after.state == "blocked" and why in after.data["reason"], after.data.get("reason")
    assert world.fleet.arm_writes == []  # no DELETE, no PUT
    assert world.pool("bystander") is not None
    assert world.events.types()[-1] == "Steward.Migration.Blocked"


def test_a_forged_row_for_a_busy_pool_neither_drains_nor_deletes_it() -> None:
    # Before, a "deleting" row for a pool with workload pods sent the migration back to draining it.
    world = World()  # "gpu" runs the train workload
    _forged_migration(world, pool="gpu", replacement="gpum1")
    reconcile_once(world.ctx(), modules={"migration": migration})
    after = world.ledger.get("migration", migration_id(world.cid, "gpu"))
    assert after is not None and after.state == "blocked" and "does not exist" in after.data["reason"]
    assert world.fleet.arm_writes == [] and world.pods_on("gpu") == 3
    assert not any(n.unschedulable for n in world.fleet.nodes[world.cid].values())


def test_the_old_pool_is_deleted_once_its_tagged_managed_replacement_serves() -> None:
    # The control: the same row, with the replacement a migration creates, does delete (so the tests above can fail).
    world = World(replicas=0)
    world.fleet.add_pool(world.cid, "bystander", t4_pool(count=1))
    world.fleet.add_pool(world.cid, "bystanderm1", t4_pool(count=1, gpuProfile=MANAGED_GPU_PROFILE,
                                                           tags={TAG_MIGRATED_FROM: "bystander"}))
    _forged_migration(world, pool="bystander", replacement="bystanderm1")
    _reconcile(world)
    assert ("DELETE", world.cid, "bystander") in world.fleet.arm_writes


def test_the_delete_waits_while_the_replacement_has_no_ready_node() -> None:
    world = World(replicas=0)
    world.fleet.add_pool(world.cid, "bystander", t4_pool(count=1))
    world.fleet.add_pool(world.cid, "bystanderm1", t4_pool(count=1, gpuProfile=MANAGED_GPU_PROFILE,
                                                           tags={TAG_MIGRATED_FROM: "bystander"}))
    for node in world.fleet.nodes[world.cid].values():
        if node.pool == "bystanderm1":
            world.fleet.kube_of(world.cid).ready_at[node.name] = NOW + 10_000  # still booting
    _forged_migration(world, pool="bystander", replacement="bystanderm1")
    after = _reconcile(world)
    assert after.state == "deleting" and "no Ready node" in after.data["waiting"]
    assert world.fleet.arm_writes == []


# --------------------------------------------------------------------------- pool requests


def _forge_request(world: Any, *, request_id: str, pool: str, **fields: Any) -> None:
    """A pool-request row in ``creating``, written straight into the ledger (as a table writer could)."""
    assert accept(message(requestId=request_id, poolName=pool, **fields), dequeue_count=1, ctx=world.ctx).status \
        == "accepted"
    rec = world.ledger.get(POOL_REQUEST, request_id)
    world.ledger.save(msgspec.structs.replace(rec, state="creating", data={**rec.data, "puts": 1}))


def _failed_pool(world: Any, name: str, **props: Any) -> None:
    world.aks.pools[(CLUSTER.lower(), name)] = {"vmSize": "Standard_NC4as_T4_v3", "count": 1, "mode": "User",
                                                "provisioningState": "Failed", **props}


REQUESTER = "team-vision@contoso.com"  # what message() claims; accept() without a team keeps it
OURS = {TAG_REQUEST_ID: "req-evil", TAG_REQUESTER: REQUESTER}

REQUEST_CASES = [
    ("never-touched", {}, "was not created by request 'req-evil'"),
    ("tagged-by-another-request", {"tags": {**OURS, TAG_REQUEST_ID: "req-other"}}, "was not created by request"),
    ("tagged-by-another-team", {"tags": {**OURS, TAG_REQUESTER: "research"}}, "was not created by request"),
    ("tagged-but-no-creation-mark", {"tags": OURS}, "carries no creation mark"),
    ("tagged-but-made-long-ago", {"tags": {**OURS, TAG_CREATED_AT: "1000"}}, "longer than any request can still"),
]


@pytest.mark.parametrize(("props", "why"), [c[1:] for c in REQUEST_CASES], ids=[c[0] for c in REQUEST_CASES])
def test_a_forged_pool_request_row_never_deletes_a_pool_it_did_not_create(props: dict[str, Any], why: str) -> None:
    world = make_world()
    _forge_request(world, request_id="req-evil", pool="victim", vmSize="Standard_NC4as_T4_v3")
    _failed_pool(world, "victim", **props)
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})
    final = world.ledger.get(POOL_REQUEST, "req-evil")
    assert final is not None and final.state == "blocked", final.data
    assert world.aks.deletes == [] and world.aks.puts == []
    assert why in final.data["reason"] and "nothing was created, changed or deleted" in final.data["reason"]
    assert world.events.types()[-1] == "Steward.PoolRequest.Blocked"


@pytest.mark.parametrize(("props", "why"), [
    ({"vmSize": "Standard_NC8as_T4_v3"}, "is not the pool this request describes"),
    ({"mode": "System", "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}},
     "mode is 'System'"),
], ids=["another-size", "a-system-pool"])
def test_a_young_pool_of_this_request_that_no_longer_matches_it_is_left_alone(props: dict[str, Any], why: str) -> None:
    world = make_world()
    _forge_request(world, request_id="req-evil", pool="victim", vmSize="Standard_NC4as_T4_v3")
    _failed_pool(world, "victim", tags={**OURS, TAG_CREATED_AT: str(int(world.clock.now()))}, **props)
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})
    final = world.ledger.get(POOL_REQUEST, "req-evil")
    assert final is not None and final.state == "failed"
    assert world.aks.deletes == [] and world.aks.puts == []
    cleanup = final.data["outcome"]["cleanup"]
    assert cleanup["action"] == "none" and why in cleanup["note"], final.data


def test_a_pool_request_cleanup_sends_if_match_with_the_etag_it_verified() -> None:
    world = make_world()
    _forge_request(world, request_id="req-evil", pool="victim", vmSize="Standard_NC4as_T4_v3")
    _failed_pool(world, "victim", tags={**OURS, TAG_CREATED_AT: str(int(world.clock.now()))}, eTag='"v1"',
                 gpuProfile={"driver": "Install", "nvidia": {"managementMode": "Managed"}})
    seen: list[dict[str, Any]] = []
    plain = world.aks.begin_delete_pool

    def delete(cluster_id: str, pool: str, **kwargs: Any) -> None:
        seen.append(kwargs)
        plain(cluster_id, pool)

    world.aks.begin_delete_pool = delete  # type: ignore[method-assign]
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})
    assert seen == [{"etag": '"v1"'}]


# --------------------------------------------------------------------------- forged "accepted" rows

VISION = Team(name="vision", queue="gpu-pool-requests-vision", clusters=(CLUSTER,))


def _team_world() -> Any:
    import dataclasses

    world = make_world()
    world.ctx.settings = dataclasses.replace(world.ctx.settings, teams=(VISION,))
    return world


def _rewrite(world: Any, request_id: str, **fields: Any) -> None:
    """Edit the stored request of an ``accepted`` row in place, as a table writer could."""
    rec = world.ledger.get(POOL_REQUEST, request_id)
    request = {**rec.data["request"], **fields}
    world.ledger.save(msgspec.structs.replace(rec, data={**rec.data, "request": request}))


def _advance(world: Any, request_id: str) -> Record:
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})
    final = world.ledger.get(POOL_REQUEST, request_id)
    assert final is not None
    return final


FORGED_REQUESTS = [
    ("a-t4-rewritten-into-125-h100s", {"vmSize": "Standard_ND96isr_H100_v5", "count": 125}, "vmSize"),
    ("more-gpus-than-the-team-may-ask", {"count": 9}, "count"),
    ("another-teams-name", {"requester": "research"}, "not a team"),
    ("a-cluster-outside-the-team", {"cluster": CLUSTER.replace("c1", "c9")}, "cluster"),
    ("a-cluster-outside-the-fleet", {"cluster": CLUSTER.replace("c1", "untagged")}, "cluster"),
    ("a-pool-name-the-seed-forbids", {"poolName": "GPU_Pool"}, "poolName"),
]


@pytest.mark.parametrize(("fields", "why"), [c[1:] for c in FORGED_REQUESTS], ids=[c[0] for c in FORGED_REQUESTS])
def test_an_accepted_row_edited_after_intake_creates_no_pool_and_is_blocked_naming_the_rule(
        fields: dict[str, Any], why: str) -> None:
    world = _team_world()
    assert accept(message(requestId="req-1"), dequeue_count=1, ctx=world.ctx, team=VISION).status == "accepted"
    _rewrite(world, "vision:req-1", **fields)
    final = _advance(world, "vision:req-1")
    assert final.state == "blocked" and final.data["error"]["code"] == "RequestNotAllowed"
    assert why in final.data["reason"], final.data["error"]
    assert world.aks.puts == []


def test_an_accepted_row_left_as_intake_wrote_it_goes_on_to_create_the_pool() -> None:
    world = _team_world()
    assert accept(message(requestId="req-1"), dequeue_count=1, ctx=world.ctx, team=VISION).status == "accepted"
    assert _advance(world, "vision:req-1").state == "creating"
    assert len(world.aks.puts) == 1


def test_a_row_written_from_nothing_is_judged_like_a_message_from_no_queue() -> None:
    world = _team_world()
    rec = Record(kind=POOL_REQUEST, id="req-x", state="accepted", created_at=world.clock.now(),
                 updated_at=world.clock.now(), next_at=world.clock.now(),
                 data={"request": {**json.loads(message(requestId="req-x")), "requester": "mallory"},
                       "fingerprint": "x", "cluster": CLUSTER, "pool": "gpunp", "requester": "mallory",
                       "vmSize": "Standard_NC4as_T4_v3"})
    world.ledger.create(rec)
    final = _advance(world, "req-x")
    assert final.state == "blocked" and "'mallory' is not a team" in final.data["reason"]
    assert world.aks.puts == []

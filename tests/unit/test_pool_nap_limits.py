"""Node auto-provisioning requests: a team's NodePools count at their limits, and Karpenter objects are created,
never taken over (issue 19, item 3).

A NodePool is what Karpenter may grow to (``spec.limits`` ``nvidia.com/gpu``), not the nodes it has now, so a
team capped at 8 GPUs cannot make request after request of 8 on a NAP cluster; a NodePool without a GPU
limit is unbounded and refuses the team's next request. The steward creates its NodePool and AKSNodeClass
with create-only calls: an object of that name someone else made (or made between the read and the create)
is never replaced, and the steward's own is replaced only at the resourceVersion it read and checked.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.kernel.errors import Conflict, NotFound
from shared.kernel.reconciler import reconcile_once
from shared.pools import steps as pool_steps
from shared.pools.intake import accept
from shared.pools.nap import ANNOTATION_REQUEST_ID, ANNOTATION_REQUESTER, NODECLASS_API, NODEPOOL_API
from shared.pools.records import KIND
from shared.pools.teams import Team
from tests.unit.fakes_pool import NAP_CLUSTER, World, make_world, message

T4 = "Standard_NC4as_T4_v3"  # 1 GPU per VM
CAPPED = Team(name="vision", queue="gpu-pool-requests-vision", clusters=(NAP_CLUSTER,), max_gpus_total=8)


def submit(world: World, request_id: str, pool: str, *, count: int = 8, team: Team = CAPPED) -> str:
    return accept(message(requestId=request_id, poolName=pool, cluster=NAP_CLUSTER, vmSize=T4, count=count),
                  dequeue_count=1, ctx=world.ctx, team=team).status


def run(world: World) -> None:
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})


def stored(world: World, row_id: str) -> Any:
    found = world.ledger.get(KIND, row_id)
    assert found is not None
    return found


def nodepool(world: World, name: str) -> dict[str, Any]:
    obj = world.kube(NAP_CLUSTER).objects[(NODEPOOL_API, "NodePool", "", name)]
    return obj


# --------------------------------------------------------------------------- maxGpusTotal


def test_a_nap_team_capped_at_8_gpus_cannot_make_request_after_request_of_8() -> None:
    world = make_world()
    assert submit(world, "a", "poola") == "accepted"
    run(world)
    assert stored(world, "vision:a").state == "succeeded"  # its NodePool, limit 8 GPUs, lives on
    assert nodepool(world, "poola")["spec"]["limits"]["nvidia.com/gpu"] == "8"
    assert submit(world, "b", "poolb", count=1) == "rejected"
    reason = stored(world, "vision:b").data["reasons"][0]
    assert "maxGpusTotal is 8" in reason and "9 GPUs" in reason, reason
    assert [k for k in world.kube(NAP_CLUSTER).objects if k[2:] == ("", "poolb")] == []


def test_a_nodepool_whose_limit_was_raised_counts_at_its_new_limit() -> None:
    world = make_world()
    big = Team(name="vision", queue="q", clusters=(NAP_CLUSTER,), max_gpus_total=64)
    assert submit(world, "a", "poola", team=big) == "accepted"
    run(world)
    nodepool(world, "poola")["spec"]["limits"]["nvidia.com/gpu"] = "60"  # a cluster admin raised it
    assert submit(world, "b", "poolb", count=5, team=big) == "rejected"
    assert "60 in its pools" in stored(world, "vision:b").data["reasons"][0]
    assert submit(world, "c", "poolc", count=4, team=big) == "accepted"  # 60 + 4 fits under 64


@pytest.mark.parametrize("limits", [{"cpu": "32"}, {}], ids=["no-gpu-limit", "no-limits-at-all"])
def test_a_nodepool_without_a_gpu_limit_counts_as_unbounded_and_refuses_the_next_request(limits: dict[str, str]) -> None:
    world = make_world()
    big = Team(name="vision", queue="q", clusters=(NAP_CLUSTER,), max_gpus_total=1000)
    assert submit(world, "a", "poola", team=big) == "accepted"
    run(world)
    nodepool(world, "poola")["spec"]["limits"] = limits
    assert submit(world, "b", "poolb", count=1, team=big) == "rejected"
    reason = stored(world, "vision:b").data["reasons"][0]
    assert "NodePool 'poola' (request 'a') has no nvidia.com/gpu limit, so it may grow without bound" in reason
    assert "maxGpusTotal cannot be checked" in reason


@pytest.mark.parametrize("limit", ["lots", "1.5", "-1"], ids=["text", "fraction", "negative"])
def test_a_gpu_limit_that_is_not_a_whole_number_is_never_read_as_zero(limit: str) -> None:
    world = make_world()
    assert submit(world, "a", "poola") == "accepted"
    run(world)
    nodepool(world, "poola")["spec"]["limits"]["nvidia.com/gpu"] = limit
    assert submit(world, "b", "poolb", count=1) == "rejected"
    assert "cannot be counted" in stored(world, "vision:b").data["reasons"][0]


def test_another_teams_nodepools_and_a_deleted_nodepool_do_not_count() -> None:
    world = make_world()
    other = Team(name="research", queue="q-r", clusters=(NAP_CLUSTER,), max_gpus_total=8)
    assert submit(world, "a", "theirs", team=other) == "accepted"
    run(world)
    assert submit(world, "a", "ours") == "accepted"  # the same request id, another team: its own row
    run(world)
    assert stored(world, "vision:a").state == "succeeded" and stored(world, "research:a").state == "succeeded"
    world.kube(NAP_CLUSTER).remove(NODEPOOL_API, "NodePool", "ours", None)  # vision deleted its NodePool
    assert submit(world, "b", "ours2", count=8) == "accepted"


# --------------------------------------------------------------------------- create-only Karpenter objects


def _foreign(world: World, kind: str, api: str, name: str, annotations: dict[str, str] | None = None) -> None:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "41", "uid": "theirs"}
    if annotations is not None:
        meta["annotations"] = annotations
    world.kube(NAP_CLUSTER).objects[(api, kind, "", name)] = {"apiVersion": api, "kind": kind, "metadata": meta,
                                                             "spec": {"theirs": True}}


@pytest.mark.parametrize("annotations", [
    None, {ANNOTATION_REQUEST_ID: "other"}, {ANNOTATION_REQUEST_ID: "a", ANNOTATION_REQUESTER: "research"},
    {ANNOTATION_REQUEST_ID: "a"}], ids=["unannotated", "another-request", "same-request-id-another-team",
                                        "no-team-annotation"])
def test_a_karpenter_object_of_that_name_someone_else_made_is_never_replaced(annotations: dict[str, str] | None) -> None:
    world = make_world()
    _foreign(world, "NodePool", NODEPOOL_API, "poola", annotations)
    assert submit(world, "a", "poola") == "accepted"
    run(world)
    final = stored(world, "vision:a")
    assert final.state == "failed" and final.data["error"]["code"] == "PoolNameTaken"
    kube = world.kube(NAP_CLUSTER)
    assert kube.applied == [] and kube.created == [] and nodepool(world, "poola")["spec"] == {"theirs": True}


def test_an_object_made_between_the_read_and_the_create_is_not_replaced() -> None:
    world = make_world()
    kube = world.kube(NAP_CLUSTER)
    plain_create = kube.create_object

    def racing_create(obj: Any) -> Any:  # theirs appears just after our read
        if obj["kind"] == "NodePool" and (NODEPOOL_API, "NodePool", "", "poola") not in kube.objects:
            _foreign(world, "NodePool", NODEPOOL_API, "poola")
        return plain_create(obj)

    kube.create_object = racing_create  # type: ignore[method-assign]
    assert submit(world, "a", "poola") == "accepted"
    run(world)
    assert stored(world, "vision:a").state == "accepted"  # waits, judged again from a fresh read
    assert nodepool(world, "poola")["spec"] == {"theirs": True} and kube.applied == []
    world.clock.advance(60)
    run(world)
    final = stored(world, "vision:a")
    assert final.state == "failed" and final.data["error"]["code"] == "PoolNameTaken"
    assert nodepool(world, "poola")["spec"] == {"theirs": True} and kube.applied == []


def test_the_stewards_own_object_is_replaced_only_at_the_resource_version_it_read() -> None:
    world = make_world()
    kube = world.kube(NAP_CLUSTER)
    mine = {ANNOTATION_REQUEST_ID: "a", ANNOTATION_REQUESTER: "vision"}
    _foreign(world, "NodePool", NODEPOOL_API, "poola", mine)  # ours, from a step whose save was lost; edited since
    assert submit(world, "a", "poola") == "accepted"
    run(world)
    [replaced] = kube.applied
    assert replaced["kind"] == "NodePool" and replaced["metadata"]["resourceVersion"] == "41"
    assert [o["kind"] for o in kube.created] == ["AKSNodeClass"]


@pytest.mark.parametrize("answer", [
    Conflict("the object has been modified; please apply your changes to the latest version"),
    NotFound("nodepools.karpenter.sh \"poola\" not found")], ids=["changed-since", "deleted-since"])
def test_a_replace_refused_because_the_object_changed_since_the_read_waits_and_looks_again(answer: Exception) -> None:
    world = make_world()
    kube = world.kube(NAP_CLUSTER)
    _foreign(world, "NodeClass", NODECLASS_API, "poola")  # unrelated kind key: not what is read
    _foreign(world, "NodePool", NODEPOOL_API, "poola", {ANNOTATION_REQUEST_ID: "a", ANNOTATION_REQUESTER: "vision"})

    def stale(obj: Any) -> Any:
        raise answer

    kube.apply_object = stale  # type: ignore[method-assign]
    assert submit(world, "a", "poola") == "accepted"
    run(world)
    final = stored(world, "vision:a")
    assert final.state == "accepted" and "changed since it was read" in final.data["waiting"]

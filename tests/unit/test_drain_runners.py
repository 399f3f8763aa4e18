"""The bounded drain as the two runners use it: remediation's ``draining`` step and the migration's drain.

Faked: the fleets of tests/unit/fakes_remediation.py and fakes_migration.py, whose Eviction API is
made to answer as a real API server does in each case (403 NamespaceTerminating, the multi-PDB 500,
a budget that never frees up). The Kubernetes adapter's own classification is exercised here too,
through ``KubeClient.evict`` with the client's ``ApiException``, so a 403 is judged exactly where the
app judges it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from shared.drain.settings import DrainSettings
from shared.drain.state import REFUSED
from shared.kernel.errors import Forbidden
from shared.kernel.ports import EvictionResult
from shared.remediation import records as remediation
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import State
from tests.fakes.kube_client import offline_kube_client
from tests.unit.fakes_remediation import Fleet, make_pod, run_until_settled, unhealthy_event

NODE = "aks-gpu-1"


def broken(policy: RemediationPolicy | None = None, *pods: Any, drain: DrainSettings | None = None) -> Fleet:
    fleet = Fleet(policy=policy, drain=drain)
    fleet.pool(5, unhealthy=[1])
    fleet.kube.add_pods(make_pod("dcgm", NODE, owner="DaemonSet"), *pods)
    fleet.compute.outcomes["restart"] = "heals"
    fleet.handle(unhealthy_event(NODE, fleet=fleet))
    return fleet


def evictions(fleet: Fleet) -> list[tuple[Any, ...]]:
    return [w for w in fleet.kube.writes if w[0] == "evict"]


def the_record(fleet: Fleet) -> Any:
    (rec,) = fleet.ledger.list(remediation.KIND)
    return rec


def events(fleet: Fleet, reason: str) -> list[dict[str, Any]]:
    return [e for e in fleet.kube.events if e["reason"] == reason]


# --------------------------------------------------------------------------- app 1: 403 on an eviction


class _Core:
    """``CoreV1Api.create_namespaced_pod_eviction`` answering with one API-server error."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        error = ApiException(status=self.status, reason=self.body.get("reason"))
        error.body = json.dumps(self.body).encode()
        error.headers = self.headers
        raise error


def _client(core: _Core) -> Any:
    return offline_kube_client(core=core, retry_attempts=1)


NAMESPACE_TERMINATING_403 = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'pods "web-1" is forbidden: unable to create new content in namespace doomed because it is being '
               "terminated",
    "details": {"name": "web-1", "kind": "pods", "causes": [
        {"reason": "NamespaceTerminating", "message": "namespace doomed is being terminated",
         "field": "metadata.namespace"}]}}
NEGATIVE_BUDGET_403 = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'poddisruptionbudget.policy "web" is forbidden: pdb disruptions allowed is negative',
    "details": {"name": "web", "group": "policy", "kind": "poddisruptionbudget"}}
RBAC_403 = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'pods "web-1" is forbidden: User "steward" cannot create resource "pods/eviction" in API group "" '
               'in the namespace "default"', "details": {"name": "web-1", "kind": "pods"}}


@pytest.mark.parametrize(("body", "outcome"), [(NAMESPACE_TERMINATING_403, "namespace_terminating"),
                                               (NEGATIVE_BUDGET_403, "blocked")],
                         ids=["NamespaceTerminating: wait for the pod", "a budget's 403: retried like a 429"])
def test_the_kube_adapter_turns_a_drain_403_into_an_answer_not_an_rbac_error(body: dict[str, Any], outcome: str) -> None:
    result = _client(_Core(403, body)).evict("doomed", "web-1")
    assert result.outcome == outcome


def test_the_kube_adapter_still_raises_an_rbac_403() -> None:
    with pytest.raises(Forbidden):
        _client(_Core(403, RBAC_403)).evict("default", "web-1")


def test_a_pod_in_a_terminating_namespace_is_waited_for_and_the_repair_goes_on() -> None:
    fleet = broken(None, make_pod("web-1", NODE, namespace="doomed"), make_pod("api-1", NODE))
    answers = {"n": 0}
    plain_evict = fleet.kube.evict

    def evict(namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        if namespace != "doomed":
            return plain_evict(namespace, name, grace_period_seconds=grace_period_seconds)
        fleet.kube.writes.append(("evict", namespace, name))
        answers["n"] += 1
        if answers["n"] == 3:  # meanwhile the namespace controller deletes the pod
            pod = fleet.kube.get_pod(namespace, name)
            assert pod is not None
            fleet.kube.pods[pod.uid] = msgspec.structs.replace(pod, deletion_timestamp=fleet.clock.now() + 30)
        return EvictionResult("namespace_terminating", 'pods "web-1" is forbidden: namespace doomed is being terminated')

    fleet.kube.evict = evict  # type: ignore[method-assign]
    states: list[str] = []
    for _ in range(40):
        states = run_until_settled(fleet, max_rounds=1)
        rec = the_record(fleet)
        if rec.state == State.DRAINING and any(
                p.deletion_timestamp is not None and p.deletion_timestamp <= fleet.clock.now()
                for p in fleet.kube.pods.values()):
            fleet.kube.finish_terminating()  # its grace period is over: the kubelet is done with it
        if states[0] not in remediation.ACTIVE_STATES:
            break
    assert states == [State.DONE], the_record(fleet).data.get("last_note")
    assert answers["n"] == 3, "asked again only until the namespace controller marked the pod deleted"
    assert "check the app's Azure role" not in str(the_record(fleet).history)


# --------------------------------------------------------------------------- app 2: decide before disrupting


@pytest.mark.parametrize(("fallback", "end", "cordoned"), [("hold", State.GAVE_UP, True),
                                                           ("release", State.RELEASED, False)])
def test_a_node_with_an_unmanaged_pod_is_refused_before_any_eviction(fallback: str, end: str, cordoned: bool) -> None:
    fleet = broken(RemediationPolicy(drain_fallback=fallback), make_pod("web-1", NODE), make_pod("train-2", NODE),
                   make_pod("notebook", NODE, owner=None))
    assert run_until_settled(fleet) == [end]
    assert evictions(fleet) == [], "workloads disrupted on a node that was never going to be drained"
    note = the_record(fleet).data["last_note"]
    assert "default/notebook" in note and "REMEDIATION_UNMANAGED_PODS=evict" in note and "before evicting" in note
    assert fleet.kube.nodes[NODE].unschedulable is cordoned
    assert [e["type"] for e in events(fleet, "StewardDrainRefused")] == ["Warning"]
    assert fleet.compute.writes == [], "never repaired (rebooted) under the pods"


def test_a_dry_run_says_the_node_would_be_refused() -> None:
    fleet = broken(RemediationPolicy(dry_run=True), make_pod("web-1", NODE), make_pod("notebook", NODE, owner=None))
    run_until_settled(fleet)
    notes = [h.get("note", "") for h in the_record(fleet).history]
    assert any("would refuse the node" in n and "default/notebook" in n for n in notes), notes


def test_a_migration_refuses_the_pool_before_evicting_on_any_node() -> None:
    from shared.migration.planner import run_planner
    from tests.unit.test_migration import World, assert_safe

    world = World()
    world.fleet.add_workload(world.cid, "bare", 1, controller="", pool="gpu", gpus=0)
    run_planner(world.ctx())
    rec = world.drive()
    assert rec.state == "blocked"
    assert "before evicting anything" in rec.data["reason"] and "REMEDIATION_UNMANAGED_PODS=evict" in rec.data["reason"]
    assert [p.name for p in world.fleet.pods[world.cid] if p.deletion_timestamp is not None] == [], "nothing evicted"
    assert world.pool("gpu") is not None
    assert_safe(world)


# --------------------------------------------------------------------------- app 3: pods stuck terminating


def test_a_pod_the_gpu_fault_leaves_unkillable_does_not_hold_the_repair_for_the_whole_drain_deadline() -> None:
    fleet = broken(None, make_pod("train-1", NODE, grace=30),  # DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S: 300 by default
                   drain=DrainSettings(drain_timeout_s=3600))
    fleet.kube.evict_terminates = True  # evicted, then stuck Terminating: its process hangs in the driver
    started = fleet.clock.now()
    assert run_until_settled(fleet) == [State.DONE]
    assert [w[0] for w in fleet.compute.writes][:1] == ["restart"], "the reboot that frees the pod happened"
    drained_at = next(h["at"] for h in the_record(fleet).history if h["state"] == State.REPAIRING)
    assert drained_at - started < 30 + 300 + 60, "waited past the grace period only DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S"


# --------------------------------------------------------------------------- app 4: a budget that never frees up


def _never_frees(fleet: Fleet) -> None:
    fleet.kube.pdb_blocked.add("default/web-1")
    fleet.kube.list_pdbs = lambda namespace=None: [{  # type: ignore[method-assign]
        "metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}]


def test_a_drain_a_budget_never_lets_through_stops_after_the_timeout_and_names_the_pdb() -> None:
    web = msgspec.structs.replace(make_pod("web-1", NODE), labels={"app": "web"})
    fleet = broken(None, web, drain=DrainSettings(pdb_blocked_timeout_s=1800, drain_timeout_s=3600))
    _never_frees(fleet)
    started = fleet.clock.now()
    assert run_until_settled(fleet) == [State.GAVE_UP]
    rec = the_record(fleet)
    assert rec.data["drain_outcome"] == "stalled"
    assert fleet.clock.now() - started < 1900, "given up after DRAIN_PDB_BLOCKED_TIMEOUT_S, not the drain deadline"
    assert "PodDisruptionBudget default/web (disruptionsAllowed=0, currentHealthy=1, desiredHealthy=1" in rec.data["last_note"]
    assert len(evictions(fleet)) <= 100, f"{len(evictions(fleet))} eviction calls (was ~720 an hour)"
    blocked = events(fleet, "StewardDrainBlocked")
    assert len(blocked) == 1 and "default/web" in blocked[0]["message"] and blocked[0]["type"] == "Warning"
    assert fleet.kube.nodes[NODE].unschedulable, "left cordoned for an operator"
    assert any(p.name == "web-1" for p in fleet.kube.pods.values()), "never forced"
    assert fleet.compute.writes == []


def test_a_budget_refusal_reports_once_not_on_every_retry() -> None:
    web = msgspec.structs.replace(make_pod("web-1", NODE), labels={"app": "web"})
    fleet = broken(None, web, drain=DrainSettings(pdb_blocked_timeout_s=1800))
    _never_frees(fleet)
    run_until_settled(fleet)
    assert len(events(fleet, "StewardDrainWaiting")) <= 2


# --------------------------------------------------------------------------- app 5: the multi-PDB 500


def test_a_pod_under_two_pdbs_stops_the_repair_instead_of_retrying_forever() -> None:
    fleet = broken(None, make_pod("web-1", NODE))

    def evict(namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult:
        fleet.kube.writes.append(("evict", namespace, name))
        return EvictionResult("multiple_pdbs", "Internal error occurred: This pod has more than one "
                                               "PodDisruptionBudget, which the eviction subresource does not support.")

    fleet.kube.evict = evict  # type: ignore[method-assign]
    assert run_until_settled(fleet) == [State.GAVE_UP]
    assert len(evictions(fleet)) == 1
    rec = the_record(fleet)
    assert rec.data["drain_outcome"] == REFUSED and "more than one PodDisruptionBudget" in rec.data["last_note"]


def test_two_pdbs_seen_up_front_refuse_the_node_without_an_eviction() -> None:
    web = msgspec.structs.replace(make_pod("web-1", NODE), labels={"app": "web", "tier": "front"})
    fleet = broken(None, web, make_pod("api-1", NODE))
    fleet.kube.list_pdbs = lambda namespace=None: [  # type: ignore[method-assign]
        {"metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}},
        {"metadata": {"name": "front", "namespace": "default"}, "spec": {"selector": {"matchLabels": {"tier": "front"}}}}]
    assert run_until_settled(fleet) == [State.GAVE_UP]
    assert evictions(fleet) == []
    assert "web, front" in the_record(fleet).data["last_note"]


def test_a_migration_whose_budget_never_frees_up_blocks_after_the_pdb_blocked_timeout() -> None:
    import dataclasses

    from shared.migration.planner import run_planner
    from shared.migration.policy import MigrationPolicy
    from tests.unit.test_migration import World, assert_safe

    world = World(policy=MigrationPolicy(enabled=True, strategy="surge", drain_timeout_s=7200),
                  replicas=3, min_available=3)
    ctx = world.ctx()
    ctx = dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, drain=DrainSettings(pdb_blocked_timeout_s=600)))
    run_planner(ctx)
    rec = world.drive(ctx)
    assert rec.state == "blocked"
    assert "PodDisruptionBudget" in rec.data["reason"] and "DRAIN_PDB_BLOCKED_TIMEOUT_S" in rec.data["reason"]
    drain_started = min(float(s["started_at"]) for s in rec.data["drain"].values() if s.get("started_at"))
    assert float(rec.updated_at) - drain_started < 700, "blocked after the PDB timeout, not the 2-hour deadline"
    assert world.pool("gpu") is not None
    assert_safe(world)

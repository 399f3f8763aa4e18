"""The remediation tests' world: a small fleet that behaves, and records every write.

Faked, by the port fakes of tests/fakes: the Kubernetes API of the cluster (nodes, pods, evictions, events,
leases), ARM (clusters, pools, machines, delete-machines, pool PUTs), VMSS restart/reimage and the Event
Grid publisher. This module only builds the scenario over them (:class:`Fleet`, ``make_node``, ``make_pod``,
the CloudEvent the sweep would publish) and re-exports the fakes under the names the tests import.
Left real: the ledger (``tests.fakes.ledger.InMemoryLedger``), the settings dataclass, the policies
(``Fleet(policy=..., drain=...)``: the remediation policy and the drain's ``Settings.drain``),
the reconciler and every decision. A repair "works" or "fails" per rung as the test says, so a test
reads like the fleet's story: which rung heals, which PDB blocks, which quota is missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from shared.drain.settings import DrainSettings
from shared.kernel.clock import ManualClock
from shared.kernel.context import Context
from shared.kernel.errors import NotFound
from shared.kernel.ports import ClusterInfo, Condition, NodeView, OwnerRef, PodView, Taint
from shared.remediation.policy import DCGM, DEVICE_PLUGIN, RemediationPolicy
from shared.settings import Settings
from tests.fakes.access import FakeAccess
from tests.fakes.aks import FakeAks, vcpus
from tests.fakes.compute import HEALS, HEALS_IN_A_BLINK, FakeCompute
from tests.fakes.events import RecordingEvents
from tests.fakes.kube import FakeKube, with_condition
from tests.fakes.ledger import InMemoryLedger

FakeEvents = RecordingEvents  # the one EventsPort fake, under the name these tests used
__all__ = ["CLUSTER", "DCGM", "DEVICE_PLUGIN", "SOURCE", "SUB", "T0", "T4", "FakeAccess", "FakeAks", "FakeCompute",
           "FakeEvents", "FakeKube", "Fleet", "RecordingEvents", "make_node", "make_pod", "run_until_settled",
           "unhealthy_event", "vm_id", "with_condition"]

SUB = "00000000-0000-0000-0000-000000000001"
CLUSTER = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c1"
T0 = 1_764_684_000.0
SOURCE = "/gpu-fleet-steward"
T4 = "Standard_NC4as_T4_v3"


def vm_id(node: str) -> str:
    return (f"/subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/vmss"
            f"/virtualMachines/{node}")


def make_node(name: str, *, pool: str = "gpu", created: float = T0 - 86400, ready: bool = True,
              conditions: Mapping[str, tuple[str, float]] | None = None, labels: Mapping[str, str] | None = None,
              annotations: Mapping[str, str] | None = None, unschedulable: bool = False,
              taints: Sequence[Taint] = (), gpus: int = 1, uid: str | None = None, boot_id: str = "boot-1") -> NodeView:
    """A GPU node; ``conditions`` maps type -> (status, lastTransitionTime); default both GPU conditions False."""
    conds = {DEVICE_PLUGIN: ("False", created), DCGM: ("False", created)} if conditions is None else dict(conditions)
    all_conds = [Condition(type="Ready", status="True" if ready else "False", transition=created)]
    all_conds += [Condition(type=t, status=s, transition=at) for t, (s, at) in conds.items()]
    return NodeView(
        name=name, uid=uid or f"uid-{name}", resource_version="1",
        labels={"kubernetes.azure.com/agentpool": pool, "kubernetes.azure.com/accelerator": "nvidia", **(labels or {})},
        annotations=dict(annotations or {}), unschedulable=unschedulable, taints=tuple(taints),
        conditions=tuple(all_conds), allocatable={"nvidia.com/gpu": str(gpus), "cpu": "4"},
        capacity={"nvidia.com/gpu": str(gpus), "cpu": "4"}, created=created, provider_id="azure://" + vm_id(name),
        boot_id=boot_id)


def make_pod(name: str, node: str, *, namespace: str = "default", owner: str | None = "ReplicaSet",
             phase: str = "Running", empty_dir: bool = False, grace: int | None = 30, mirror: bool = False,
             uid: str | None = None, deleting: float | None = None) -> PodView:
    owners = (OwnerRef(kind=owner, name=f"{name}-owner", controller=True),) if owner else ()
    return PodView(namespace=namespace, name=name, uid=uid or f"uid-{namespace}-{name}", node_name=node, phase=phase,
                   owners=owners, annotations={"kubernetes.io/config.mirror": "x"} if mirror else {}, labels={},
                   deletion_timestamp=deleting, grace_period_seconds=grace, has_empty_dir=empty_dir)


class Fleet:
    """One cluster with one GPU pool, shared by every context (host) built from it.

    The ports are the fakes of tests/fakes (``fleet.aks``, ``fleet.compute``, ``fleet.kube``), handed out by
    a :class:`FakeAccess` over the fleet (a test may replace one). The fleet is the fakes' :class:`VmHost`:
    what a restart or a reimage does to a node, per ``compute.outcomes``. ARM's operations finish at once;
    a surge's new nodes are healthy unless ``new_nodes_broken``.
    """

    def __init__(self, *, policy: RemediationPolicy | None = None, drain: DrainSettings | None = None,
                 clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock(T0)
        self.policy = policy or RemediationPolicy()
        self.drain = drain or DrainSettings()  # the app's drain rules and pace (Settings.drain)
        self.new_nodes_broken = False
        self._serial = itertools.count(1)
        cluster = ClusterInfo(id=CLUSTER, name="c1", subscription=SUB, resource_group="rg", location="eastus",
                              tags={"gpu-fleet-steward": "enabled"}, node_resource_group="mc_rg")
        self.aks = FakeAks(self.clock, [cluster], op_s=0, kube=self.kube_of, grow=self._grow)
        self.aks.faults.fail_always["begin_delete_pool"] = AssertionError("remediation must never delete a pool")
        self.kube = FakeKube(self.clock)
        self.compute = FakeCompute(self)
        self.events = FakeEvents()
        self.ledger = InMemoryLedger()

    def kube_of(self, cluster_id: str) -> FakeKube:
        if cluster_id.lower() != CLUSTER.lower():
            raise NotFound(cluster_id)
        return self.kube

    # ARM's side
    def cluster(self) -> ClusterInfo:
        return self.aks.get_cluster(CLUSTER)

    def update_cluster(self, **changes: Any) -> None:
        """What ARM says of the cluster from now on (``tags``, ``node_provisioning_mode``...)."""
        self.aks.update_cluster(CLUSTER, **changes)

    def tag(self, key: str, value: str) -> None:
        self.update_cluster(tags={**self.cluster().tags, key: value})

    def pool_props(self, pool: str = "gpu") -> dict[str, Any]:
        """The pool's properties as ARM stores them (``mode``, ``vmSize``, ``enableAutoScaling``...)."""
        return self.aks.pool_props(CLUSTER, pool)

    def count(self, pool: str = "gpu") -> int:
        return int(self.pool_props(pool)["count"])

    def limit_surge(self, nodes: int) -> None:
        """The subscription's GPU quota leaves room for ``nodes`` more nodes of the pools' size."""
        self.aks.quota_vcpus[CLUSTER] = self.aks.vcpus_used(CLUSTER) + nodes * vcpus(T4)

    def _grow(self, cluster_id: str, pool: str, props: Mapping[str, Any]) -> None:
        now = self.clock.now()
        cond = {DEVICE_PLUGIN: ("True" if self.new_nodes_broken else "False", now), DCGM: ("False", now)}
        self.kube.add(make_node(f"aks-{pool}-new{next(self._serial)}", pool=pool, created=now, conditions=cond))

    # Microsoft.Compute's side (VmHost)
    def vm_exists(self, vm_resource_id: str) -> bool:
        return vm_resource_id.rsplit("/", 1)[-1] in self.kube.nodes

    def vm_rebooted(self, vm_resource_id: str, *, rung: str, outcome: str) -> None:
        node = vm_resource_id.rsplit("/", 1)[-1]
        if outcome == HEALS:
            self.heal(node)
        elif outcome == HEALS_IN_A_BLINK:
            self.heal_in_a_blink(node)
        else:
            self.reboot_without_healing(node)

    def heal(self, name: str, *, policy: RemediationPolicy | None = None) -> None:
        """A reboot that fixed the GPU: the policy's conditions False and Ready True, both fresh."""
        now = self.clock.now()
        for type_ in (policy or self.policy).conditions:
            self.kube.set_condition(name, type_, "False", at=now)
        self.kube.set_condition(name, "Ready", "True", at=now)

    def reboot_without_healing(self, name: str) -> None:
        self.kube.set_condition(name, "Ready", "True")

    def heal_in_a_blink(self, name: str, *, policy: RemediationPolicy | None = None) -> None:
        """A reboot too fast for the node controller: Ready keeps its old transition time, bootID changes."""
        for type_ in (policy or self.policy).conditions:
            self.kube.set_condition(name, type_, "False")
        node = self.kube.nodes[name]
        self.kube.nodes[name] = msgspec.structs.replace(node, boot_id=f"{node.boot_id}+")

    def pool(self, size: int, *, pool: str = "gpu", unhealthy: Sequence[int] = (), since: float | None = None,
             condition: str = DEVICE_PLUGIN) -> list[str]:
        """``size`` healthy nodes named ``aks-<pool>-<i>``, those in ``unhealthy`` with ``condition`` True."""
        names = []
        at = self.clock.now() - 3600 if since is None else since
        for i in range(size):
            name = f"aks-{pool}-{i}"
            conds = {DEVICE_PLUGIN: ("False", T0 - 86400), DCGM: ("False", T0 - 86400)}
            if i in unhealthy:
                conds[condition] = ("True", at)
            self.kube.add(make_node(name, pool=pool, conditions=conds))
            names.append(name)
        if (CLUSTER.lower(), pool) in self.aks.pools:
            self.pool_props(pool)["count"] += size
        else:
            self.aks.add_pool(CLUSTER, pool, {"count": size, "mode": "User", "vmSize": T4, "enableAutoScaling": False})
        return names

    def break_node(self, name: str, *, condition: str = DEVICE_PLUGIN, at: float | None = None) -> None:
        self.kube.set_condition(name, condition, "True", at=at)

    def settings(self, *, paused: bool = False) -> Settings:
        return Settings(subscriptions=(SUB,), eventgrid_topic_endpoint="https://topic.example/api/events",
                        event_source=SOURCE, paused=paused, remediation=self.policy, drain=self.drain)

    def ctx(self, instance: str = "host-a", *, paused: bool = False) -> Context:
        return Context(settings=self.settings(paused=paused), clock=self.clock, ledger=self.ledger,
                       access=FakeAccess(self), events=self.events, telemetry=None,  # type: ignore[arg-type]
                       instance=instance)

    def handle(self, event: Mapping[str, Any], ctx: Context | None = None) -> str:
        from shared.remediation import admission

        return admission.handle_event(event, ctx or self.ctx()).detail

    def cluster_writes(self) -> list[tuple[Any, ...]]:
        return [*self.kube.writes, *self.aks.writes, *self.compute.writes]


def unhealthy_event(node: NodeView | str, *, fleet: Fleet, condition: str = DEVICE_PLUGIN, since: float | None = None,
                    observed_at: float | None = None, source: str = SOURCE, cluster: str = CLUSTER) -> dict[str, Any]:
    """The CloudEvent the sweep would publish for ``node`` (taking the transition time from the node)."""
    from shared.kernel import timefmt
    from shared.remediation import records as remediation

    n = fleet.kube.nodes[node] if isinstance(node, str) else node
    cond = n.condition(condition)
    at = since if since is not None else (cond.last_transition if cond and cond.last_transition else fleet.clock.now())
    return {"specversion": "1.0", "id": remediation.fault_id(cluster, n.name, condition, at), "source": source,
            "type": remediation.UNHEALTHY_EVENT, "subject": remediation.subject(cluster, n.pool, n.name),
            "time": timefmt.iso(observed_at if observed_at is not None else fleet.clock.now()),
            "data": {"cluster": cluster, "node": n.name, "pool": n.pool, "condition": condition,
                     "since": timefmt.iso(at),
                     "observed_at": timefmt.iso(observed_at if observed_at is not None else fleet.clock.now())}}


def run_until_settled(fleet: Fleet, ctx: Context | None = None, *, max_rounds: int = 400) -> list[str]:
    """Drive the real reconciler over the fleet's ledger, jumping the clock to the next due record."""
    from shared.kernel import reconciler
    from shared.remediation import steps as remediation

    context = ctx or fleet.ctx()
    modules = {"remediation": remediation}
    for _ in range(max_rounds):
        reconciler.reconcile_once(context, modules=modules)  # type: ignore[dict-item]
        active = fleet.ledger.list(remediation.KIND, states=sorted(remediation.ACTIVE_STATES))
        if not active:
            break
        due = min(r.next_at for r in active)
        fleet.clock.advance(max(1.0, due - fleet.clock.now()))
    return [r.state for r in fleet.ledger.list(remediation.KIND)]

"""What the core needs from the outside world, and the shapes it sees it in.

The state machines (pool creation, remediation, migration) and the sweep are written against these
protocols; ``shared.adapters.aks``, ``shared.adapters.compute``, ``shared.adapters.kube.client``,
``shared.adapters.events``, ``shared.adapters.ledger`` and ``shared.adapters.nudge_queue`` implement them over
the real SDKs, and ``tests/fakes`` in memory. Views are small frozen structs holding only
the fields decisions need, decoded straight from JSON (msgspec) rather than through the SDK models.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from shared.kernel.errors import Invalid
from shared.kernel.timefmt import rfc3339_seconds

# --------------------------------------------------------------------------- Kubernetes views

if TYPE_CHECKING:
    Epoch = float
else:

    class Epoch(float):
        """Epoch seconds parsed from an RFC 3339 timestamp: a float in every respect but its type.

        It exists so that msgspec can decode ``lastTransitionTime`` straight into :class:`Condition`
        (a custom type gets a ``dec_hook``, see shared.adapters.kube.decoding) without a Python loop over every
        condition of every node. msgspec cannot *encode* a float subclass: ``float(x)`` it before
        storing it in a record (shared.remediation.health does so for ``Finding.since``).
        """

        __slots__ = ()


class Condition(msgspec.Struct, frozen=True, gc=False, rename={"transition": "lastTransitionTime"}):
    """A node condition; decoded by msgspec straight from the wire.

    ``transition`` is ``lastTransitionTime`` as it came: RFC 3339 text when decoded, epoch seconds
    when built in code. It is read through :attr:`last_transition`, which parses text on demand: a
    sweep reads the transition times of two or three conditions of a node, not of all of them, so
    parsing each one while decoding (a Python call per condition) was the larger part of the cost.
    """

    type: str
    status: str  # "True" | "False" | "Unknown"
    transition: float | str | None = None
    reason: str = ""
    message: str = ""

    @property
    def last_transition(self) -> float | None:
        """Epoch seconds of ``lastTransitionTime``; None when absent or not a timestamp."""
        value = self.transition
        if value is None or type(value) is float:
            return value
        if isinstance(value, str):
            return rfc3339_seconds(value)
        return float(value)


class Taint(msgspec.Struct, frozen=True, gc=False):
    key: str
    effect: str
    value: str = ""


class NodeView(msgspec.Struct, frozen=True):
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    taints: tuple[Taint, ...]
    conditions: tuple[Condition, ...]
    allocatable: Mapping[str, str]  # e.g. {"nvidia.com/gpu": "1", "cpu": "4"}
    capacity: Mapping[str, str]
    created: float  # creationTimestamp, epoch seconds
    provider_id: str = ""
    deletion_timestamp: float | None = None  # set while the node is being deleted (AKS scale-down, upgrade)
    boot_id: str = ""  # status.nodeInfo.bootID: changes with every boot, even one too fast for Ready to notice

    @property
    def pool(self) -> str:
        return self.labels.get("kubernetes.azure.com/agentpool") or self.labels.get("agentpool", "")

    def condition(self, type_: str) -> Condition | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None

    @property
    def ready(self) -> bool:
        c = self.condition("Ready")
        return c is not None and c.status == "True"


class OwnerRef(msgspec.Struct, frozen=True):
    kind: str
    name: str
    controller: bool = False


class PodView(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str
    owners: tuple[OwnerRef, ...]
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    deletion_timestamp: float | None
    grace_period_seconds: int | None  # spec.terminationGracePeriodSeconds
    has_empty_dir: bool
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = {}
    affinity: Mapping[str, Any] | None = None
    requests: Mapping[str, str] = {}  # summed container resource requests

    @property
    def is_mirror(self) -> bool:
        return "kubernetes.io/config.mirror" in self.annotations

    def controller(self) -> OwnerRef | None:
        for o in self.owners:
            if o.controller:
                return o
        return None


EVICTED, EVICTION_BLOCKED, EVICTION_GONE = "evicted", "blocked", "gone"
NAMESPACE_TERMINATING, MULTIPLE_PDBS = "namespace_terminating", "multiple_pdbs"


class EvictionResult(msgspec.Struct, frozen=True):
    """What the Eviction API answered, classified by the adapter from status, reason and causes.

    ``evicted`` (201); ``gone`` (404); ``blocked``: a disruption budget refused it for now — 429
    (no disruption allowed, or the PDB not yet observed: ``retry_after``) or 403 from the budget
    (``disruptionsAllowed`` below 0, ``DisruptedPods`` over its cap), retried within the drain
    policy; ``namespace_terminating``: 403 with cause ``NamespaceTerminating`` — the namespace
    controller deletes the pod, so the drain waits for it to go (as kubectl drain does);
    ``multiple_pdbs``: 500, the pod is covered by more than one PDB, which the Eviction API never
    supports — not transient, the drain stops and reports it (as kubectl does). ``pdb`` names the
    budget when the answer says which (the 403's ``details.name``). Any other refusal (an RBAC 403)
    is raised by the adapter as an error.
    """

    outcome: str
    message: str = ""
    retry_after: float | None = None
    pdb: str = ""


class KubePort(Protocol):
    """One cluster's Kubernetes API, as the app uses it (see shared/adapters/kube/client.py)."""

    def list_nodes(self, *, label_selector: str = "", page_size: int = 500) -> Iterator[NodeView]: ...
    def get_node(self, name: str) -> NodeView | None: ...
    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeView:
        """Strategic-merge patch of the node (metadata and spec)."""

    def list_pods(self, *, node_name: str | None = None, namespace: str | None = None,
                  label_selector: str = "") -> list[PodView]: ...
    def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> EvictionResult: ...
    def list_pdbs(self, namespace: str | None = None) -> list[Mapping[str, Any]]: ...
    def create_event(self, *, node: NodeView | str, reason: str, message: str, type_: str = "Normal",
                     action: str = "", correlation_id: str = "") -> None:
        """Best effort: never raises (events are auxiliary)."""

    def acquire_lease(self, name: str, *, holder: str, duration_s: int, namespace: str | None = None) -> bool: ...
    def release_lease(self, name: str, *, holder: str, namespace: str | None = None) -> None: ...
    def create_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create any supported object (Job, Karpenter NodePool/AKSNodeClass...); Conflict if it exists."""

    def apply_object(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create, or replace if it exists (server-side desired state)."""

    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None: ...
    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                      uid: str | None = None) -> None: ...
    def delete_nodeclaim(self, *, node_name: str, provider_id: str) -> str | None:
        """Delete the Karpenter NodeClaim behind a node (node auto-provisioning); its name, None if none."""


# --------------------------------------------------------------------------- ARM views


_CLUSTER_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)"
    r"/providers/microsoft\.containerservice/managedclusters/(?P<name>[^/]+)/?$",
    re.IGNORECASE,
)


def parse_cluster_id(cluster_id: str) -> tuple[str, str, str]:
    """``(subscription, resource group, cluster name)`` of a managed cluster ARM id."""
    match = _CLUSTER_ID.match(cluster_id.strip())
    if not match:
        raise Invalid(f"not a managed cluster id: {cluster_id!r}", code="InvalidResourceId")
    return match["sub"], match["rg"], match["name"]


class ClusterInfo(msgspec.Struct, frozen=True):
    id: str  # ARM id, as ARM spells it
    name: str
    subscription: str
    resource_group: str
    location: str
    tags: Mapping[str, str]
    node_resource_group: str
    node_provisioning_mode: str = "Manual"  # "Auto" = node auto-provisioning (Karpenter)
    provisioning_state: str = "Succeeded"


#: A pool's (or cluster's) ``provisioningState`` after an operation that ended without doing its work:
#: ``Failed``, or ``Canceled`` when the operation was aborted (``az aks nodepool operation-abort``,
#: AgentPools_AbortLatestOperation; recorded: Azure/azure-cli acs recordings test_aks_abort.yaml). Every
#: wait treats both alike: the operation is over, and it did not do what was asked.
ENDED_UNDONE: frozenset[str] = frozenset({"Failed", "Canceled"})


class PoolInfo(msgspec.Struct, frozen=True):
    """An agent pool as ARM returns it: ``properties`` is the raw camelCase dict."""

    cluster_id: str
    name: str
    properties: Mapping[str, Any]

    @property
    def vm_size(self) -> str:
        return str(self.properties.get("vmSize", ""))

    @property
    def count(self) -> int:
        return int(self.properties.get("count") or 0)

    @property
    def provisioning_state(self) -> str:
        return str(self.properties.get("provisioningState", ""))

    @property
    def operation_ended_undone(self) -> bool:
        """Its last operation is over and did not do its work (``Failed`` or ``Canceled``: :data:`ENDED_UNDONE`)."""
        return self.provisioning_state in ENDED_UNDONE

    @property
    def provisioning_error(self) -> tuple[str, str]:
        """Azure's error for a Failed pool, ``(code, message)``, from wherever this api-version puts it
        (``status.provisioningError``, AgentPoolStatus in Azure/azure-rest-api-specs .../managedClusters.json;
        older shapes too). The code is the most specific one its ``details[]`` name
        (shared.kernel.arm_codes.error_of_detail): Compute's ``QuotaExceeded`` inside AKS's
        ``InvalidTemplateDeployment``, not the wrapper."""
        from shared.kernel.arm_codes import error_of_detail

        props = self.properties
        for candidate in ((props.get("status") or {}).get("provisioningError"), props.get("provisioningError"),
                          props.get("error")):
            if isinstance(candidate, Mapping) and candidate.get("code"):
                specific = error_of_detail(candidate)
                return str(getattr(specific, "code", None) or candidate["code"]), str(candidate.get("message") or "")
        return "ProvisioningFailed", f"pool {self.name} provisioningState is {self.provisioning_state}"

    @property
    def management_mode(self) -> str:
        gp = self.properties.get("gpuProfile") or {}
        return str(((gp.get("nvidia") or {}).get("managementMode")) or "Unmanaged")

    @property
    def etag(self) -> str | None:
        """``properties.eTag`` as ARM returned it (None when it has none): what a write sends as
        ``If-Match`` (AksPort.begin_put_pool / begin_delete_pool ``etag=``)."""
        value = self.properties.get("eTag")
        return str(value) if value else None


class MachineInfo(msgspec.Struct, frozen=True):
    name: str  # equals the node name for VMSS pools
    resource_id: str  # the VMSS VM id
    zones: tuple[str, ...] = ()


class AksPort(Protocol):
    """Azure Resource Manager, Microsoft.ContainerService (see shared/adapters/aks.py)."""

    def list_clusters(self, subscription: str) -> list[ClusterInfo]: ...
    def get_cluster(self, cluster_id: str) -> ClusterInfo: ...
    def list_pools(self, cluster_id: str) -> list[PoolInfo]: ...
    def get_pool(self, cluster_id: str, pool: str) -> PoolInfo | None: ...
    def begin_put_pool(self, cluster_id: str, pool: str, body: Mapping[str, Any], *, api_version: str | None = None,
                       etag: str | None = None, create_only: bool = False) -> None:
        """Start a create-or-update; returns once ARM accepted it (does not wait for the LRO).

        Sent on ``api_version``, or when not given on the first api-version whose definition carries every
        property of the body (shared.kernel.definitions.api_version_for); a body no api-version carries
        is not sent (shared.kernel.errors.Unwritable, naming the properties).
        ``etag``: send ``If-Match`` with the pool's ``properties.eTag`` as read (412 -> Conflict).
        ``create_only``: send ``If-None-Match: *``, so an existing pool is never replaced (412 -> Conflict)."""

    def begin_delete_pool(self, cluster_id: str, pool: str, *, ignore_pdb: bool = False,
                          etag: str | None = None) -> None: ...
    def begin_delete_machines(self, cluster_id: str, pool: str, machines: Sequence[str]) -> None: ...
    def list_machines(self, cluster_id: str, pool: str) -> list[MachineInfo]: ...
    def list_maintenance_configurations(self, cluster_id: str) -> list[Mapping[str, Any]]: ...
    def kubeconfig(self, cluster_id: str) -> bytes:
        """listClusterUserCredential (format=exec), first kubeconfig, decoded."""


class AvailabilityView(msgspec.Struct, frozen=True):
    """A VM's current availability as Azure Resource Health reports it (``availabilityStatuses/current``,
    the spec's ``AvailabilityStatusProperties``: azure-rest-api-specs specification/resourcehealth/
    resource-manager/Microsoft.ResourceHealth/ResourceHealth/models.tsp).

    ``state`` is ``availabilityState``: Available, Degraded, Unavailable or Unknown. ``occurred`` is the
    spec's ``occuredTime`` (sic) as sent: when the state began. The class of what made it so, as ARM
    reports it: ``context`` ("triggered by a customer or the platform", e.g. ``Platform Initiated``),
    ``category`` (``Planned`` / ``Unplanned`` when the context is the platform), ``reason_type``
    (``Unplanned``, ``Planned``, ``UserInitiated``), and for an availability impacting event
    ``health_event_cause`` / ``health_event_category`` (``PlatformInitiated``, ``Unplanned``);
    empty when ARM sent none. ``summary`` and ``title`` are free text, for the report only (never decided on)."""

    state: str
    summary: str = ""
    reason_type: str = ""
    occurred: str = ""
    context: str = ""
    category: str = ""
    health_event_cause: str = ""
    health_event_category: str = ""
    title: str = ""


class ComputePort(Protocol):
    """Microsoft.Compute VMSS VM operations in a cluster's node resource group (shared/adapters/compute.py)."""

    def get_availability(self, vm_resource_id: str) -> AvailabilityView:
        """Resource Health's current availability of a VM (a read: NotFound when Azure knows no such VM,
        Forbidden without ``Microsoft.ResourceHealth/availabilityStatuses/read``)."""

    def begin_restart(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None:
        """``cluster_id``: the cluster the caller acts for. As handed out by ClusterAccess the port is
        gated (shared.fleet.gate.GatedCompute), which then requires the VM in that cluster's own
        subscription and node resource group; the bare adapter ignores it."""

    def begin_reimage(self, vm_resource_id: str, *, cluster_id: str | None = None) -> None: ...


class EventsPort(Protocol):
    def publish(self, *, type_: str, subject: str, data: Mapping[str, Any], id_: str | None = None) -> None:
        """Publish one CloudEvent. Raises Throttled/Transient; callers decide if it is best effort."""


class NudgePort(Protocol):
    def nudge_at(self, when: float, *, hint: str) -> None:
        """Wake the reconciler at fleet time ``when`` (not before), through a delayed nudge message.

        A wake-up is only a hint: the reconciler looks at every due record whatever woke it, so a
        duplicate or early one is harmless. Raises Transient (or another StewardError) on failure;
        callers treat that as non-fatal, since the safety-net timer still runs.
        """


class Sample(msgspec.Struct, frozen=True):
    """One series of a PromQL instant vector: its labels, its value and the evaluation time (unix seconds)."""

    labels: Mapping[str, str]
    value: float
    at: float


class MetricsPort(Protocol):
    """One Azure Monitor workspace's PromQL query endpoint (shared/adapters/prometheus.py)."""

    def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        """One instant query, evaluated at ``at`` (unix seconds; the server's now when None: the Prometheus
        HTTP API's ``time`` parameter). Only a complete answer returns: an error, an outage or a partial
        answer (the server's ``warnings``) raises, so an empty list really means "no series matched"."""


class ClusterAccess(Protocol):
    """Hands out per-cluster adapters (cached; credentials refreshed by the adapters)."""

    def aks(self) -> AksPort: ...
    def compute(self) -> ComputePort: ...
    def kube(self, cluster_id: str) -> KubePort: ...
    def metrics(self, endpoint: str) -> MetricsPort:
        """The PromQL port of a configured workspace query endpoint (SIGNALS_PROMETHEUS); Forbidden for any other."""


# --------------------------------------------------------------------------- durable records


class Record(msgspec.Struct, kw_only=True):
    """One durable record of long work (see docs/architecture.md, "Durable records").

    ``data`` belongs to the record's kind; everything else is the reconciler's bookkeeping.
    ``etag`` is the storage ETag of the version this copy was read at ("" for a new record).
    """

    kind: str
    id: str
    state: str
    data: dict[str, Any] = {}
    owner: str = ""
    lease_until: float = 0.0
    next_at: float = 0.0
    attempts: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    history: list[dict[str, Any]] = []
    etag: str = ""

    def moved(self, state: str, *, at: float, note: str = "", next_at: float | None = None,
              **data: Any) -> Record:
        """A copy in ``state`` with ``data`` merged and a history line appended (capped at 50)."""
        merged = dict(self.data)
        merged.update(data)
        history = [*self.history, {"at": at, "state": state, "note": note}][-50:]
        return msgspec.structs.replace(
            self, state=state, data=merged, history=history, updated_at=at,
            next_at=at if next_at is None else next_at,
        )


class LedgerPort(Protocol):
    """Azure Table storage, ETag-guarded (shared/adapters/ledger.py; in memory: tests/fakes/ledger.py)."""

    def create(self, record: Record) -> Record:
        """Insert; raises Conflict if a record with this kind and id exists. Returns it with its ETag."""

    def get(self, kind: str, id_: str) -> Record | None: ...
    def scan(self, kind: str, *, states: Sequence[str] | None = None, due_by: float | None = None,
             older_than: float | None = None, limit: int = 1000) -> list[Record]:
        """At most ``limit`` records of ``kind``, in key order, filtered by the store, never the whole kind:
        ``state`` one of ``states``; ``next_at`` and ``lease_until`` at or before ``due_by`` (due, and
        claimed by no one); ``created_at`` and ``updated_at`` before ``older_than``
        (shared.kernel.retention.matches is the same filter, for ledgers that keep rows in memory).
        Declared before ``list``: below it, ``list`` in this class body names the method, not the type."""

    def list(self, kind: str, *, states: Sequence[str] | None = None) -> list[Record]: ...
    def save(self, record: Record) -> Record:
        """Replace if the stored ETag still equals ``record.etag``; raises Conflict otherwise."""

    def delete(self, record: Record) -> None: ...

    #: The most bytes a record's ``data`` may take as stored; :meth:`save` refuses more (Invalid).
    data_limit_bytes: int

    def data_bytes(self, record: Record) -> int:
        """How many bytes ``record.data`` takes as stored (so a job can refuse work it could not record)."""

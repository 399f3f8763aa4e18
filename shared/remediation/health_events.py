"""Azure Resource Health events (the HealthResources system topic): map the VM to its node, re-read, admit.

Event Grid delivers ``Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged`` and
``...ResourceAnnotated`` for the VMs of every subscription we subscribed (docs/signals-resource-health.md).
Schema: "Azure Resource Notifications - Health Resources events"
(https://learn.microsoft.com/azure/event-grid/event-schema-health-resources); annotation names:
"Resource Health virtual machine Health Annotations"
(https://learn.microsoft.com/azure/service-health/resource-health-vm-annotation).

An event is a claim, never a fact: anyone who may publish to an endpoint can forge one, and a real one
may be late, duplicated or already outdated. So :func:`handle`:

1. accepts only the two event types with a well-formed ``data`` (decoded into the structs below), a
   ``source`` naming the target's own subscription, and a target that is a VM (a scale-set VM, or a
   standalone VM of a node auto-provisioning cluster);
2. finds the in-scope cluster whose node resource group holds the VM (``shared.fleet.scope.discover``,
   cached in ``ctx.caches.health_vm_clusters``, then the cluster read again and its scope judged afresh);
3. finds the node through ARM, not through the node: the machine of a GPU User pool whose
   ``properties.resourceId`` is the VM (the AKS machines API), then the Node by that name, whose
   providerID must name the same VM (for NAP, the Karpenter node whose providerID names it, on a cluster
   ARM says provisions nodes automatically);
4. re-reads the VM's availability from Resource Health (``ComputePort.get_availability``) and acts only
   when it confirms the event (:func:`confirmation`): a row that acts needs ARM to say Degraded or
   Unavailable now **and** to class it as the row's annotation is classed (its Context / Category on the
   annotations page: Platform Initiated / Unplanned for every acting row), so a customer-initiated restart
   (Unavailable, Customer Initiated) never confirms a degraded-host annotation;
5. hands a :class:`Signal` to :func:`shared.remediation.admission.admit_signal`: the same checks, budgets,
   breaker, ledger and one-remediation-per-node as a condition fault; record-only rows are recorded once;
6. raises an annotation the table does not name (:data:`UNKNOWN_ANNOTATION_EVENT`, once per name per UTC day,
   and a warning) besides recording it: a name Azure added to the page must get a row, not vanish.

:func:`still_present` is the same confirmation for a step about to disrupt a node: the fault a
remediation was admitted for, re-read from Resource Health now.

Anything that does not resolve is IGNORED (nothing touched, one log line) or, once the node is known,
REFUSED with the usual refusal event. Transport errors (Throttled/Transient) propagate: Event Grid
delivers again later.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import gpu_sizes, node_truth, scope
from shared.kernel.errors import Conflict, Forbidden, NotFound, StewardError
from shared.kernel.ports import AvailabilityView, ClusterInfo, KubePort, NodeView, Record
from shared.kernel.timefmt import iso, parse_time
from shared.remediation import health, pending_faults, signal_policy
from shared.remediation.admission import NODE_BUSY, Handled, Handling, admit_signal, refuse
from shared.remediation.records import DEDUPE_KIND, fault_id, subject
from shared.remediation.signal_policy import HealthRow, class_key
from shared.remediation.signals import Signal, SignalSource

if TYPE_CHECKING:
    from shared.kernel.context import Context

log = logging.getLogger("steward.remediation.health_events")

KEY_PREFIX = "ResourceHealth/"
"""Signal keys: ``ResourceHealth/<availabilityState>`` or ``ResourceHealth/<annotationName>``."""
#: The states a row that acts needs ARM to report now (Degraded or down: the platform still sees trouble).
CONFIRMING_STATES = frozenset({"Degraded", "Unavailable"})
#: Raised (besides the usual SignalRecorded) for an annotation no row names, once per name per UTC day.
UNKNOWN_ANNOTATION_EVENT = "Steward.Signal.UnknownAnnotation"
#: ``reasonType`` (the spec's ReasonTypeValues) as a class, when ARM sends no context / category.
_REASON_CLASSES: Mapping[str, tuple[str, str]] = {
    "unplanned": (signal_policy.PLATFORM_INITIATED, signal_policy.UNPLANNED),
    "planned": (signal_policy.PLATFORM_INITIATED, signal_policy.PLANNED),
    "userinitiated": (signal_policy.CUSTOMER_INITIATED, signal_policy.NOT_APPLICABLE),
}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")

_VMSS_VM = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
                      r"virtualMachineScaleSets/[^/]+/virtualMachines/[^/]+$", re.IGNORECASE)
_VM = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
                 r"virtualMachines/[^/]+$", re.IGNORECASE)


# --------------------------------------------------------------------------- the documented schema
class HealthProperties(msgspec.Struct, frozen=True, rename="camel"):
    """``data.resourceInfo.properties``: the target, when it happened, and the state or annotation."""

    target_resource_id: str
    occurred_time: str
    target_resource_type: str = ""
    availability_state: str | None = None
    previous_availability_state: str | None = None
    annotation_name: str | None = None
    reason: str = ""
    summary: str = ""
    context: str = ""
    category: str = ""


class ResourceInfo(msgspec.Struct, frozen=True):
    id: str
    name: str
    type: str
    properties: HealthProperties


class OperationalInfo(msgspec.Struct, frozen=True, rename="camel"):
    resource_event_time: str = ""


class HealthData(msgspec.Struct, frozen=True, rename="camel"):
    """``data`` of both HealthResources event types."""

    resource_info: ResourceInfo
    operational_info: OperationalInfo = OperationalInfo()
    api_version: str = ""


def _ignored(detail: str) -> Handled:
    log.info("health event ignored: %s", detail)
    return Handled(Handling.IGNORED, f"ignored: {detail}")


def parse(event: Mapping[str, Any]) -> tuple[HealthData, str] | str:
    """``(data, vm id)`` of a well-formed HealthResources event about a VM, or why it is not one."""
    etype = str(event.get("type") or "")
    if etype not in signal_policy.HEALTH_EVENT_TYPES:
        return f"type {etype!r} is not a HealthResources event type"
    raw = event.get("data")
    try:
        data = (msgspec.json.decode(raw, type=HealthData) if isinstance(raw, str | bytes)
                else msgspec.convert(raw, HealthData))
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        return f"malformed HealthResources data ({error})"
    props = data.resource_info.properties
    target = props.target_resource_id.strip()
    if etype == signal_policy.AVAILABILITY_CHANGED and not props.availability_state:
        return "an AvailabilityStatusChanged event without availabilityState"
    if etype == signal_policy.RESOURCE_ANNOTATED and not props.annotation_name:
        return "a ResourceAnnotated event without annotationName"
    if parse_time(props.occurred_time) is None:
        return f"occurredTime {props.occurred_time!r} is not a time"
    match = _VMSS_VM.match(target) or _VM.match(target)
    if match is None:
        return f"target {target!r} is not a VM"
    subject = str(event.get("subject") or "")
    if subject and subject.lower() != target.lower():
        return f"subject {subject!r} is not the target {target!r}"
    if str(event.get("source") or "").lower() != f"/subscriptions/{match['sub']}".lower():
        return f"source {event.get('source')!r} is not the target's subscription"
    return data, target


def handle(event: Mapping[str, Any], ctx: Context, *, observed_at: float | None = None) -> Handled:
    """Admit, record or refuse what one HealthResources event claims (see the module docstring).

    ``observed_at`` is when the fault was last seen by its source; by default the event's own time. A kept
    fault judged again (shared.remediation.pending_faults) passes the time of that judgement: the VM's
    availability is re-read below before anything is admitted."""
    parsed = parse(event)
    if isinstance(parsed, str):
        return _ignored(parsed)
    data, vm = parsed
    props = data.resource_info.properties
    etype = str(event["type"])
    match = _VMSS_VM.match(vm) or _VM.match(vm)
    assert match is not None  # parse() checked it
    sub, rg = match["sub"].lower(), match["rg"].lower()
    if sub not in {s.lower() for s in ctx.settings.subscriptions}:
        return _ignored(f"VM {vm}: subscription {sub} is not in FLEET_SUBSCRIPTIONS")
    cluster = _cluster_of(ctx, sub, rg)
    if cluster is None:
        return _ignored(f"VM {vm} is in no node resource group of a cluster in scope")
    kube = ctx.access.kube(cluster.id)
    found = _node_of(ctx, cluster, kube, vm, standalone=_VM.match(vm) is not None)
    if isinstance(found, str):
        return _ignored(found)
    node = found
    since = float(parse_time(props.occurred_time) or 0.0)
    decision = signal_policy.health_event_action(etype, props.availability_state, props.annotation_name)
    key = KEY_PREFIX + str(props.availability_state if etype == signal_policy.AVAILABILITY_CHANGED
                           else props.annotation_name)
    info = {"cluster": cluster.id, "node": node.name, "fault": fault_id(cluster.id, node.name, key, since),
            "condition": key, "since": iso(since), "event_id": str(event.get("id") or ""),
            "signal": str(SignalSource.RESOURCE_HEALTH), "policy_row": decision.row}
    if not node.provider_id or node_truth.vm_of_provider_id(node.provider_id).lower() != vm.lower():
        return refuse(ctx, info, node_truth.PROVIDER_ID_MISMATCH,
                       f"node {node.name} says its VM is {node.provider_id or '(none)'}, ARM says {vm}", warn=(kube, node))
    if decision.row == signal_policy.UNKNOWN_ANNOTATION_ROW:
        raise_unknown_annotation(ctx, annotation=str(props.annotation_name), info=info, vm=vm, node=node,
                                 claimed=(props.context, props.category))
    try:
        now_state = ctx.access.compute().get_availability(vm)
    except NotFound:
        return _ignored(f"Resource Health knows no VM {vm} (gone since the event)")
    except Forbidden as error:
        log.warning("cannot re-read the availability of %s (%s): not acting on the event alone", vm, error)
        return Handled(Handling.IGNORED, f"ignored: availability of {vm} unreadable ({error}); the event alone is not "
                                         "trusted")
    row = signal_policy.health_row(key[len(KEY_PREFIX):])
    row = row if row is not None and row.id == decision.row else None  # the row that matched, not a namesake
    decision = confirmed(decision, now_state, row=row)
    what = props.availability_state if etype == signal_policy.AVAILABILITY_CHANGED else props.annotation_name
    detail = (f"Resource Health {what} on {vm} at {props.occurred_time}; ARM now says {_shown(now_state)}"
              + (f" ({now_state.summary})" if now_state.summary else "") + f": {decision.note}")
    signal = Signal(source=SignalSource.RESOURCE_HEALTH, key=key, since=since, decision=decision, detail=detail)
    observed = parse_time(data.operational_info.resource_event_time or None) or parse_time(event.get("time") or None)
    handled = admit_signal(ctx, cluster=cluster, node=node, signal=signal, event_id=str(event.get("id") or ""),
                           observed_at=observed_at if observed_at is not None else float(observed or since))
    if handled.outcome == Handling.REFUSED or handled.code == NODE_BUSY:
        # pushed once: a refusal that passes by itself, or another fault's repair holding the node, must not lose
        # the fault (shared.remediation.pending_faults)
        pending_faults.keep(ctx, event=event, info=info, handled=handled)
    log.info("health event %s on %s/%s (%s): %s", key, cluster.name, node.name, decision.row, handled.detail)
    return handled


def arm_class(now: AvailabilityView) -> tuple[str, str]:
    """The ``(context, category)`` ARM reports for the VM's current state, as :func:`class_key` keys.

    Each from ARM's own fields, first present wins: ``context`` / ``category`` (models.tsp: "triggered by
    a customer or the platform"; "planned or unplanned" when the context is the platform), then
    ``healthEventCause`` / ``healthEventCategory`` (an availability impacting event), then ``reasonType``
    (Unplanned, Planned: platform; UserInitiated: customer). Empty when ARM says nothing.
    """
    context, category = _reported_class(now)
    return class_key(context), class_key(category)


def _reported_class(now: AvailabilityView) -> tuple[str, str]:
    from_reason = _REASON_CLASSES.get(class_key(now.reason_type), ("", ""))
    return (now.context or now.health_event_cause or from_reason[0],
            now.category or now.health_event_category or from_reason[1])


def _shown(now: AvailabilityView) -> str:
    context, category = _reported_class(now)
    return f"{now.state} ({context or 'no context'} / {category or 'no category'})"


def confirmation(row: HealthRow, now: AvailabilityView) -> tuple[bool, str]:
    """Whether ARM's current availability confirms ``row``'s fault, and why: the state is Degraded or
    Unavailable and its class is the row's :attr:`HealthRow.confirming_class` (page spellings compared by
    :func:`class_key`). A VM down because someone restarted it is Unavailable, Customer Initiated: no
    degraded-host annotation, forged, late or misrouted, is confirmed by that."""
    want = tuple(class_key(part) for part in row.confirming_class)
    wanted = " / ".join(row.confirming_class)
    if now.state not in CONFIRMING_STATES:
        return False, f"Resource Health says {_shown(now)} now, not Degraded or Unavailable"
    if arm_class(now) != want:
        return False, f"Resource Health says {_shown(now)} now, not {wanted}"
    return True, f"Resource Health says {_shown(now)} now, as {row.id} is classed ({wanted})"


def confirmed(decision: signal_policy.Decision, now: AvailabilityView, *, row: HealthRow | None) -> signal_policy.Decision:
    """The row's decision if ARM's current state confirms it (:func:`confirmation`); a record-only one
    with the reason otherwise. A decision that only records needs no confirmation."""
    if decision.action == signal_policy.RECORD_ONLY:
        return decision
    ok, why = confirmation(row, now) if row is not None else (False, "no policy row to confirm")
    if ok:
        return decision
    return signal_policy.Decision(signal_policy.RECORD_ONLY, decision.row, decision.source,
                                  f"not confirmed: {why} (the row would {decision.action}: {decision.note})")


def still_present(ctx: Context, *, vm_id: str, key: str) -> tuple[bool | None, str]:
    """Is the Resource Health fault ``key`` (a Signal key this module made: ``ResourceHealth/<state or
    annotation>``) still on ``vm_id``, by ARM's current availability, re-read now?

    ``(True, why)``: ARM still confirms it (:func:`confirmation`). ``(False, why)``: it is gone (Available,
    Unknown, another class, the VM gone) or the table no longer acts on the key. ``(None, why)``: ARM cannot
    be read now (throttled, transient, forbidden): neither confirmed nor cleared. ValueError for a key that
    is not a Resource Health key (a caller's mistake).
    """
    if not key.startswith(KEY_PREFIX):
        raise ValueError(f"{key!r} is not a Resource Health signal key ({KEY_PREFIX}...)")
    name = key[len(KEY_PREFIX):]
    row = signal_policy.health_row(name)
    if row is None or row.action == signal_policy.RECORD_ONLY:
        return False, f"the policy table does not act on {name!r} (any more)"
    try:
        now = ctx.access.compute().get_availability(vm_id)
    except NotFound:
        return False, f"Resource Health knows no VM {vm_id} any more"
    except StewardError as error:
        return None, f"availability of {vm_id} unreadable now ({type(error).__name__}: {error})"
    return confirmation(row, now)


def raise_unknown_annotation(ctx: Context, *, annotation: str, info: Mapping[str, Any], vm: str, node: NodeView,
                             claimed: tuple[str, str]) -> None:
    """Publish :data:`UNKNOWN_ANNOTATION_EVENT` for an annotation the table does not name, once per name per UTC
    day, and log a warning (every time).

    The day's marker is a ``dedupe`` row ``unknown-annotation-<day>-<first 2 hex digits of the name's sha256>``:
    at most 256 rows a day whatever a forger sends (only an event that resolved to a fleet node gets here);
    two names sharing a bucket on one day raise once between them (both are still logged and recorded). A
    name that does not look like an annotation (over 128 characters, odd characters) is raised as
    ``(malformed)``. A failed publish leaves no row: the next delivery raises it again.
    """
    name = annotation if _NAME.match(annotation) else "(malformed)"
    day = time.strftime("%Y-%m-%d", time.gmtime(ctx.clock.now()))
    rid = f"unknown-annotation-{day}-{hashlib.sha256(name.encode()).hexdigest()[:2]}"
    log.warning("Resource Health annotation %r on %s (node %s) is in no row of the policy table: recorded only; "
                "add a row (docs/signals-resource-health.md)", annotation[:200], vm, node.name)
    if ctx.ledger.get(DEDUPE_KIND, rid) is not None:
        return
    pool = health.pool_of(node)
    data = {"annotation": name, "cluster": info.get("cluster"), "node": node.name, "pool": pool,
            "vm": vm, "event_id": info.get("event_id"), "since": info.get("since"), "day": day,
            "claimed_context": claimed[0][:100], "claimed_category": claimed[1][:100],
            "policy_row": signal_policy.UNKNOWN_ANNOTATION_ROW, "source": signal_policy.SRC_ANNOTATIONS,
            "note": "an annotation the policy table does not name: recorded only; give it a row"}
    try:
        ctx.events.publish(type_=UNKNOWN_ANNOTATION_EVENT, subject=subject(str(info.get("cluster")), pool, node.name),
                           data=data, id_=hashlib.sha256(f"{UNKNOWN_ANNOTATION_EVENT}|{rid}".encode()).hexdigest())
    except StewardError as error:
        log.warning("could not publish %s for %r: %s", UNKNOWN_ANNOTATION_EVENT, name, error)
        return
    with contextlib.suppress(Conflict):  # another instance raised it too: same event id, consumers de-duplicate
        ctx.ledger.create(Record(kind=DEDUPE_KIND, id=rid, state="seen", data=data, created_at=ctx.clock.now()))


# --------------------------------------------------------------------------- VM -> cluster -> node
def _cluster_of(ctx: Context, sub: str, rg: str) -> ClusterInfo | None:
    """The in-scope cluster whose node resource group is ``sub``/``rg``, read from ARM now."""
    aks = ctx.access.aks()
    now = ctx.clock.now()
    cached = ctx.caches.health_vm_clusters.get((sub, rg), now=now)
    if cached is None:
        cached = ""
        for info in scope.discover(aks, ctx.settings):
            pair = (info.subscription.lower(), (info.node_resource_group or "").lower())
            ctx.caches.health_vm_clusters.put(pair, info.id, now=now)
            if pair == (sub, rg):
                cached = info.id
        ctx.caches.health_vm_clusters.put((sub, rg), cached, now=now)
    if not cached:
        return None
    try:
        cluster = aks.get_cluster(cached)
    except (NotFound, Forbidden) as error:
        log.info("cluster %s unreadable now: %s", cached, error)
        return None
    ok, _why = scope.cluster_in_scope(cluster, ctx.settings)
    same_rg = cluster.subscription.lower() == sub and (cluster.node_resource_group or "").lower() == rg
    return cluster if ok and same_rg else None


def _node_of(ctx: Context, cluster: ClusterInfo, kube: KubePort, vm: str, *, standalone: bool) -> NodeView | str:
    """The Node behind ``vm`` according to ARM (or why there is none we may act on)."""
    if standalone:
        if cluster.node_provisioning_mode.lower() != "auto":
            return f"standalone VM {vm} in {cluster.name}, which does not provision nodes automatically"
        wanted = "azure://" + vm.lower()
        for node in kube.list_nodes():
            if node.provider_id.lower() == wanted and health.is_karpenter_node(node):
                return node
        return f"no Karpenter node of {cluster.name} has VM {vm}"
    aks = ctx.access.aks()
    for pool in aks.list_pools(cluster.id):
        size = gpu_sizes.lookup(pool.vm_size)
        if str(pool.properties.get("mode") or "").lower() != "user" or size is None or not size.is_nvidia:
            continue
        try:
            machines = aks.list_machines(cluster.id, pool.name)
        except NotFound:
            continue
        machine = next((m for m in machines if m.resource_id.lower() == vm.lower()), None)
        if machine is None:
            continue
        found = kube.get_node(machine.name)
        return found if found is not None else f"machine {machine.name} of {cluster.name} has no Node (yet or any more)"
    return f"VM {vm} is no machine of a GPU User pool of {cluster.name}"

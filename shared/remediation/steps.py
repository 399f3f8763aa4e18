"""The remediation kind for the reconciler: ``KIND``, ``ACTIVE_STATES``, :func:`advance` and :func:`give_up`.

Each call of :func:`advance` re-observes the node and takes one short, idempotent step:
``admitted → cordoned → draining → repairing → verifying → done``, or ends in ``gave_up`` (every rung
failed; the node stays cordoned), ``released`` (nothing left to do, or the ``release`` drain fallback),
``refused`` (the node's identity is in doubt, or the platform is taking it away) or ``failed`` (we are
not allowed to act). Every state has one step with the kernel's contract
(:mod:`shared.kernel.steps`): ``step(record, ctx, *, now, policy) -> Transition``. Every write re-reads
first, intent is saved before a non-idempotent call (pool counts are desired-state PUTs of a count
fixed in the record), so a crash before or after any step resumes to the same end state.
docs/remediation.md documents the states, data fields and events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from shared.fleet import node_fate
from shared.kernel.errors import Forbidden, NotFound, StewardError
from shared.kernel.ports import KubePort, NodeView, Record
from shared.kernel.steps import Transition, move, settle, stay
from shared.kernel.timefmt import iso
from shared.remediation import attempts, fault_source, health, preconditions
from shared.remediation.admission import paused_reason, policy_of
from shared.remediation.drain_step import cleared, drain_settings, step_draining, unconfirmed
from shared.remediation.ladder import (
    away_note,
    away_s,
    block,
    end,
    escalate_to_replace,
    give_up_now,
    next_rung,
    uncordon_if_ours,
)
from shared.remediation.notify import annotate, announce, kube_event, publisher
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import (
    ACTIVE_STATES,
    DEDUPE_KIND,
    GOING_AWAY,
    KIND,
    RUNG_EVENTS,
    TERMINAL_STATES,
    Event,
    Refusal,
    RemediationData,
    Rung,
    RungPhase,
    State,
    fields,
    label_value,
    lease_name,
    load,
    op_key,
)
from shared.remediation.replace import step_replace
from shared.remediation.signals import SignalSource
from shared.remediation.vm_actions import booted_since, request

if TYPE_CHECKING:
    from shared.kernel.context import Context

__all__ = ["ACTIVE_STATES", "KIND", "advance", "give_up"]

log = logging.getLogger("steward.remediation")

_LEASELESS: set[str] = set()
# After giving its slot back, a PDB-held drain waits two sweeps, so the faults the sweep re-reports
# meanwhile are admitted into the slot first.
_SLOT_GIVEN_BACK_S = 120.0  # clusters without the lease namespace (warned once per process)
Step = Callable[..., Transition]


def advance(record: Record, ctx: Context) -> Record:
    """One short, idempotent step of the remediation ``record`` (re-observing first)."""
    if record.state not in ACTIVE_STATES:
        return record
    policy = policy_of(ctx)
    now = ctx.clock.now()
    d = load(record)
    kube = ctx.access.kube(d.cluster)
    paused = paused_reason(ctx, _cluster_tags(ctx, d.cluster), None, policy)
    if paused and not d.dry_run:
        return settle(stay(record, now=now, until=now + max(60, policy.poll_s), note=f"waiting: {paused}"),
                      publisher(ctx))
    if not d.dry_run and not _take_lease(kube, record, d, policy):
        return settle(stay(record, now=now, until=now + policy.poll_s,
                           note=f"waiting: another actor holds the node lease {lease_name(d.node)}"), publisher(ctx))
    try:
        stepped = STEPS[State(record.state)](record, ctx, now=now, policy=policy)
    except Forbidden as exc:
        stepped = end(record, ctx, kube, State.FAILED, now=now, event=Event.FAILED,
                      note=f"not allowed: {exc} (check the app's Azure role and Kubernetes RBAC); node left as is")
    after = stepped.record
    if after.state != record.state and not d.dry_run and after.state not in TERMINAL_STATES:
        node = kube.get_node(d.node)
        if node is not None:
            annotate(kube, node, after, str(after.data.get("last_note", "")))
    return settle(stepped, publisher(ctx))


def _take_lease(kube: KubePort, record: Record, d: RemediationData, policy: RemediationPolicy) -> bool:
    """Take or renew the node lease (holder = this remediation, so any host advancing it may renew).

    The lease keeps other actors that honour it off the node. Between steward hosts the ledger claim
    and the one-remediation-per-node admission already guarantee a single writer, so a cluster
    without the lease namespace (``NotFound``) degrades to that guarantee, with a warning.
    """
    try:
        # in the app's own namespace (the adapter's; STEWARD_NAMESPACE), where its Role grants leases
        return kube.acquire_lease(lease_name(d.node), holder=record.id, duration_s=policy.lease_s)
    except NotFound as exc:
        if d.cluster not in _LEASELESS:
            _LEASELESS.add(d.cluster)
            log.warning("node leases unavailable on %s (%s): relying on the ledger claim", d.cluster, exc)
        return True


def _cluster_tags(ctx: Context, cluster_id: str) -> Mapping[str, str]:
    """The cluster's tags (for the pause tag), cached a minute per process."""
    now = ctx.clock.now()
    hit = ctx.caches.cluster_tags.get(cluster_id, now=now)
    if hit is not None:
        return hit
    try:
        tags = dict(ctx.access.aks().get_cluster(cluster_id).tags or {})
    except NotFound:
        tags = {}
    return ctx.caches.cluster_tags.put(cluster_id, tags, now=now)


class _BestEffortKube:
    """The node's cluster for the clean-up of a record that is given up: a call that fails is logged and
    skipped (the permanent error that led here may well be the cluster's own answer)."""

    def __init__(self, ctx: Context, cluster_id: str) -> None:
        self._kube: KubePort | None = None
        try:
            self._kube = ctx.access.kube(cluster_id)
        except StewardError as exc:
            log.info("cluster %s not reachable for the give-up clean-up: %s", cluster_id, exc)

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._kube, name, None) if self._kube is not None else None

        def call(*args: Any, **kwargs: Any) -> Any:
            if target is None:
                return None
            try:
                return target(*args, **kwargs)
            except StewardError as exc:
                log.info("give-up clean-up: %s failed: %s", name, exc)
                return None
        return call


def give_up(record: Record, ctx: Context, *, reason: str) -> Record:
    """The reconciler's hook after RECONCILE_MAX_PERMANENT_TRIES permanent errors in a row: ``gave_up``.

    Same ending as a ladder that ran out: the budget slot, the pool's replace turn and the node lease
    are released, a GaveUp event and a Warning on the node say why. A node the app cordoned stays
    cordoned for an operator (our marker tells them whose cordon it is); a node someone else cordoned,
    or that was never cordoned, is left exactly as it is. Clean-up calls to the cluster are best effort:
    the permanent error may be the cluster's own refusal.
    """
    if record.state not in ACTIVE_STATES:
        return record
    d = load(record)
    kube: Any = _BestEffortKube(ctx, d.cluster)
    held = ("the node stays cordoned (the app cordoned it) for an operator" if d.cordoned_by_us
            else "the node is left as it was")
    return settle(give_up_now(record, ctx, kube, now=ctx.clock.now(), note=f"{reason}; gave up: {held}"), publisher(ctx))


def step_admitted(record: Record, ctx: Context, *, now: float, policy: RemediationPolicy) -> Transition:
    """Cordon the node (with our marker), unless the fault is gone or the platform is taking the node away."""
    d = load(record)
    attempts.note_if_admitted(ctx, record, d)  # its admission's host may have died before noting it
    kube = ctx.access.kube(d.cluster)
    node = kube.get_node(d.node)
    if node is None:
        return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                   note="the node no longer exists: nothing to do")
    known = preconditions.identity(node, d)
    if not known.ok:
        return block(record, ctx, kube, now=now, code=known.code, reason=known.reason, what="the cordon")
    if node.uid != d.node_uid:
        return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                   note="the node was recreated under the same name: this fault is gone")
    shows, why = fault_source.present(ctx, d, node, same_instance=True)  # its own source, not the record
    if shows is False:
        if not preconditions.was_admitted(ctx, record, d):
            return block(record, ctx, kube, now=now, code=preconditions.NOT_ADMITTED, what="the cordon",
                         reason=f"no admission recorded this row on {d.node}, and its fault is not there ({why})")
        return end(record, ctx, kube, State.RELEASED, now=now, event=Event.RECOVERED,
                   note=f"{d.condition} cleared before we touched the node ({why}): released")
    if shows is None:
        return unconfirmed(record, ctx, kube, since=record.created_at or now, why=why, now=now, policy=policy,
                            what="the cordon")
    leaving = node_fate.going_away(node)
    if leaving:  # the platform started taking it away after the admission: not ours to touch
        return end(record, ctx, kube, State.REFUSED, now=now, event=Event.REFUSED,
                   note=f"refused ({GOING_AWAY}): the platform is taking {node.name} away ({leaving}); not cordoned",
                   refusal=Refusal(code=GOING_AWAY, reason=leaving),
                   extra={"reason_code": GOING_AWAY, "reason": leaving})
    if d.dry_run:
        note = f"dry run: would cordon {node.name} (marker {health.CORDONED_BY_LABEL}) and drain it"
        return announce(move(record, State.CORDONED, now=now, note=note, **fields(cordoned_by_us=False)),
                        record, Event.DRY_RUN, note, key="cordon")
    held, why_not = preconditions.reserve(ctx, kube, record, d, now=now, policy=policy)
    if not held:
        return stay(record, now=now, until=now + max(60, policy.poll_s), note=f"waiting to cordon: {why_not}")
    marker = node.annotations.get(health.CORDON_FOR_ANNOTATION, "")
    if health.cordoned_by_us(node) and node.unschedulable and marker == record.id:
        note, by_us = "cordoned (found our marker: resumed after a crash)", True
    elif health.cordoned_by_us(node) and node.unschedulable:
        # Still cordoned by an earlier remediation of ours (it gave up): adopt the cordon, so that this
        # remediation may lift it when the node recovers.
        kube.patch_node(node.name, {"metadata": {"resourceVersion": node.resource_version,
                                                 "annotations": {health.CORDON_FOR_ANNOTATION: record.id}}})
        note, by_us = f"already cordoned by our earlier remediation {marker}: adopted", True
    elif node.unschedulable:
        # Not our cordon, so never ours to lift; but the marker says which remediation works on the node,
        # and every later step checks it (shared.remediation.preconditions).
        kube.patch_node(node.name, {"metadata": {"resourceVersion": node.resource_version,
                                                 "annotations": {health.CORDON_FOR_ANNOTATION: record.id}}})
        note, by_us = "already cordoned by someone else: it will be drained and repaired but never uncordoned by us", False
    else:
        reason = f"{d.condition} True since {d.since}"
        kube.patch_node(node.name, {
            "metadata": {"resourceVersion": node.resource_version,  # fails if anyone changed the node meanwhile
                         "labels": {health.CORDONED_BY_LABEL: label_value(ctx.instance)},
                         "annotations": {health.CORDON_FOR_ANNOTATION: record.id,
                                         health.CORDON_REASON_ANNOTATION: reason,
                                         health.CORDON_AT_ANNOTATION: iso(now)}},
            "spec": {"unschedulable": True},
        })
        note, by_us = f"cordoned: {reason}", True
    kube_event(kube, node, record, "StewardCordoned", note)
    return announce(move(record, State.CORDONED, now=now, note=note, **fields(cordoned_by_us=by_us, cordoned_at=now)),
                    record, Event.CORDONED, note, extra={"cordoned_by_us": by_us})


def step_cordoned(record: Record, ctx: Context, *, now: float, policy: RemediationPolicy) -> Transition:
    """Start the drain, unless someone uncordoned the node or its attempts are used up (cordon only)."""
    d = load(record)
    kube = ctx.access.kube(d.cluster)
    node = kube.get_node(d.node)
    if node is None or node.uid != d.node_uid:
        return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                   note="the node disappeared before the drain")
    if not d.dry_run:
        ours = preconditions.marked(node, record.id)
        if ours.code == preconditions.NOT_OUR_CORDON:
            return block(record, ctx, kube, now=now, code=ours.code, reason=ours.reason, what="the drain")
        if not ours.ok:
            return end(record, ctx, kube, State.RELEASED, now=now, event=Event.FAILED,
                       note="someone uncordoned the node: respecting that and stopping (the fault is not handled)")
    if d.cap_reached:
        return end(record, ctx, kube, State.GAVE_UP, now=now, event=Event.GAVE_UP,
                   note=f"{d.cap_reached}: cordoned and not drained or repaired again; an operator must look "
                        f"(uncordon it or remove the node when done)")
    if not d.dry_run:
        kube_event(kube, node, record, "StewardDraining", "draining through the Eviction API (PDBs respected)")
    return move(record, State.DRAINING, now=now, note="draining", **fields(drain={}, drain_started_at=now))


def step_repairing(record: Record, ctx: Context, *, now: float, policy: RemediationPolicy) -> Transition:
    """One step of the ladder's current rung: restart and reimage (vm_actions), or replace (replace)."""
    d = load(record)
    kube = ctx.access.kube(d.cluster)
    rung = d.rung
    if rung is None:
        return give_up_now(record, ctx, kube, now=now, note="no rung left on the ladder")
    if d.dry_run:
        note = f"dry run: would {rung} {d.node} (ladder {', '.join(d.ladder)}); nothing was changed"
        return end(record, ctx, kube, State.DONE, now=now, event=Event.DRY_RUN, note=note)
    if d.rung_entered_at is None:  # the first step of the ladder's first rung
        record = msgspec.structs.replace(record, data={**record.data, **fields(rung_entered_at=now)})
        d = load(record)
    entered = d.rung_entered_at or now
    timeout = policy.rung_timeout(rung)
    away = away_s(record, now=now, policy=policy, timeout=timeout)
    if away != d.rung_away_s:
        total = d.away_total_s + away - d.rung_away_s
        record = msgspec.structs.replace(record, data={**record.data, **fields(rung_away_s=away, away_total_s=total)})
        d = load(record)
    if d.rung_phase in (RungPhase.START, RungPhase.REQUESTED) and now >= entered + timeout + away:
        # The phases before the rung's action took hold (Azure answering "busy", the pool's replace turn,
        # a request that never showed) are bounded by the rung's timeout from when the ladder reached it;
        # the later phases by the same timeout from the action (checked where they observe the node),
        # so a rung that never completes moves on: nothing is re-issued forever.
        return next_rung(record, ctx, kube, now=now,
                         why=f"not completed within {timeout}s{away_note(away)} (REMEDIATION_RUNG_TIMEOUTS; "
                             f"phase {d.rung_phase}: {d.last_note[:200]})")
    if d.rung_phase == RungPhase.START and ctx.ledger.get(DEDUPE_KIND, op_key(record.id, d.rung_index, rung, 1)) is None:
        # before this rung's VM action (not after a crash that followed its request): its own source again
        current = kube.get_node(d.node)
        if current is None and not preconditions.was_admitted(ctx, record, d):
            # Nothing on the node can prove this row (its marker, its drain), and admission never recorded it:
            # a row written outside the app, for a node that is gone. (A genuine one goes on: a node that
            # stays unregistered after a reimage is what the replace rung is for.)
            return block(record, ctx, kube, now=now, code=preconditions.NOT_ADMITTED, what=f"the {rung}",
                         reason=f"{d.node} is not registered and no admission recorded this row on it")
        if current is not None and (current.uid == d.node_uid or not d.node_uid):  # re-registered: admitted_vm refuses
            proof = preconditions.before_vm_action(ctx, kube, record, d, current, settings=drain_settings(ctx, policy),
                                                   now=now)
            if not proof.ok:
                return block(record, ctx, kube, now=now, code=proof.code, reason=proof.reason, what=f"the {rung}")
            held, why_not = preconditions.reserve(ctx, kube, record, d, now=now, policy=policy)
            if not held:
                return stay(record, now=now, until=now + max(60, policy.poll_s), note=f"waiting to {rung}: {why_not}")
            shows, why = (fault_source.present(ctx, d, current) if d.rung_index == 0
                          else fault_source.justifies_next_rung(ctx, d, current, policy=policy, now=now,
                                                                window_s=verify_window_s(policy)))
            if shows is False:
                return cleared(record, ctx, kube, why=why, now=now, what=f"the {rung}")
            if shows is None:
                return stay(record, now=now, until=now + policy.poll_s,
                            note=f"waiting to re-read the fault before the {rung}: {why}")
    if d.nap and rung != Rung.REPLACE:
        # A node auto-provisioning node is a standalone VM that Karpenter owns (not a VMSS instance):
        # there is no VMSS VM to restart or reimage; Karpenter's way is to delete its NodeClaim.
        return escalate_to_replace(record, ctx, kube, now=now, code="KarpenterNode",
                                   why=f"{d.node} is a Karpenter (node auto-provisioning) node, a standalone VM "
                                       f"({d.provider_id or 'no providerID'}): it is replaced by deleting its NodeClaim")
    if rung == Rung.REPLACE:
        return step_replace(record, ctx, kube, policy=policy, now=now)
    node = kube.get_node(d.node)
    if d.rung_phase in (RungPhase.START, RungPhase.REQUESTED):
        return request(record, ctx, kube, node=node, rung=rung, policy=policy, now=now)
    started = d.rung_started_at or now
    if node is not None:
        # Same VM, same name: a reimage may re-register the Node object (new uid), which counts as rebooted.
        recovered, why = health.is_recovered(node, policy=policy)
        ready = node.condition("Ready")
        rebooted = ((ready is not None and (ready.last_transition or 0.0) >= started) or node.uid != d.node_uid
                    or booted_since(node, d.boot_id_before))
        if recovered and (rebooted or now - started >= policy.settle_s):
            note = f"{rung} repaired the node in {now - started:.0f}s ({why})"
            kube_event(kube, node, record, f"Steward{RUNG_EVENTS[rung]}", note)
            return announce(move(record, State.VERIFYING, now=now, note=note,
                                 **fields(verify_since=now, target=node.name)), record, RUNG_EVENTS[rung], note)
        back = health.fault_back_after_boot(node, policy=policy, since=started) if not recovered else ""
        if back:  # NPD's run on boot found the fault again: this rung did not cure it, and waiting will not
            return next_rung(record, ctx, kube, now=now, why=f"the fault survived the {rung}: {back}")
    else:
        why = "the node is not registered (yet)"
        rebooted = True
    if now >= started + timeout + away:
        if not rebooted:
            # Azure accepted the call but the node never went down: the operation failed or never ran (its
            # long-running operation is not followed; the node is the evidence). Said so, for the operator.
            why = (f"the {rung} never took effect: the node did not reboot after Azure accepted it (Ready unchanged "
                   f"since before the request, same bootID; the operation may have failed in Azure); {why}")
        return next_rung(record, ctx, kube, now=now, why=f"not recovered within {timeout}s{away_note(away)} ({why})")
    return stay(record, now=now, until=now + policy.poll_s, note=f"waiting for {rung}: {why}")


# How soon a fault that survived a reboot is True again: node-problem-detector runs every rule once on
# start (kubernetes/node-problem-detector pkg/custompluginmonitor/plugin/plugin.go ``Run``, before its
# interval tickers), a run bounded by the rule's timeout (5 s by default, pkg/custompluginmonitor/types/
# config.go ``defaultGlobalTimeout``), and its condition manager writes a changed condition within its 1 s
# ``updatePeriod`` (pkg/exporters/k8sexporter/condition/manager.go). AKS does not document its GPU
# plugins' timeout: verification outlasts twice that default bound, or REMEDIATION_SETTLE_S when longer
# (the default, 120 s; raise it if a cluster's NPD rules run longer).
NPD_DEFAULT_TIMEOUT_S = 5.0
NPD_CONDITION_SYNC_S = 1.0
NPD_BOOT_CHECK_S = NPD_DEFAULT_TIMEOUT_S + NPD_CONDITION_SYNC_S
VERIFY_MAX_WINDOWS = 4  # verification is bounded too: a node never stable this long fails the rung


def verify_window_s(policy: RemediationPolicy) -> float:
    """How long a repaired node must stay healthy after its last restart evidence before it is trusted."""
    return max(float(policy.settle_s), 2 * NPD_BOOT_CHECK_S)


def step_verifying(record: Record, ctx: Context, *, now: float, policy: RemediationPolicy) -> Transition:
    """Declare the repair done only once the node has been healthy for longer than NPD needs after a boot.

    A rebooted node's node-problem-detector publishes every GPU condition ``False`` with a fresh
    transition time before its first check (kubernetes/node-problem-detector
    pkg/custompluginmonitor/custom_plugin_monitor.go ``initialConditions``); a fault that survived the
    reboot turns ``True`` again only when the rules' run on boot reports (:data:`NPD_BOOT_CHECK_S`). So the
    start-up ``False`` proves nothing: :func:`health.verify_repair` waits a whole window after the latest of Ready's and the
    conditions' transitions, and only then is the node uncordoned.
    """
    d = load(record)
    kube = ctx.access.kube(d.cluster)
    target = d.target or d.node
    node = kube.get_node(target)
    since = d.verify_since or now
    window = verify_window_s(policy)
    stable_from, since_what = since, "verification began"
    if d.replace.found_at and target == d.replace.replacement and d.replace.found_at < since:
        # A surge node read healthy before the broken one was deleted: its stability counts from then (its
        # own transitions still bound it, so a flap since shows), not only from after the deletion.
        stable_from, since_what = d.replace.found_at, "the replacement was found healthy"
    if node is not None and _uncordoned_by_this_step(node, record):
        # Only this step's own VERIFIED lifts our marker with the cordon (uncordon_if_ours; ``kubectl uncordon``
        # leaves the marker): a host died between that uncordon and the save. The repair was verified then;
        # what the node shows since is a new fault, the sweep's, not a reason to re-cordon a node in service
        # and hand it over as "cordoned" (soak seed 960138).
        return end(record, ctx, kube, State.DONE, now=now, event=Event.RECOVERED,
                   note="recovered: an earlier run of this step verified the repair and uncordoned the node, and its "
                        "save was lost; anything the node shows since is a new fault for the sweep", target=target)
    if node is not None:
        verdict = health.verify_repair(node, policy=policy, since=stable_from, now=now, window_s=window,
                                       since_what=since_what)
        if verdict.state == health.VERIFIED and d.signal == SignalSource.GPU_CAPACITY:
            # healthy by the node's own checks, but is every GPU of its size back? (its source says)
            short, why_short = fault_source.present(ctx, d, node)
            if short is not False:
                verdict = health.Verdict(health.NOT_RECOVERED, f"GPUs not all back: {why_short}")
        if verdict.state == health.VERIFIED:
            uncordoned = uncordon_if_ours(kube, record) if target == d.node else False
            note = f"recovered: {verdict.why}" + ("; uncordoned" if uncordoned else "")
            return end(record, ctx, kube, State.DONE, now=now, event=Event.RECOVERED, note=note, target=target)
        if verdict.state == health.CONFIRMING:
            if now >= since + VERIFY_MAX_WINDOWS * window:
                # Healthy whenever looked at, but a condition or Ready keeps transitioning: never stable.
                return next_rung(record, ctx, kube, now=now,
                                 why=f"never stable for {window:.0f}s within {VERIFY_MAX_WINDOWS * window:.0f}s "
                                     f"({verdict.why})")
            until = float(verdict.until or now + policy.poll_s)
            return stay(record, now=now, until=max(now + 1.0, min(until, now + policy.poll_s)),
                        note=f"verifying: {verdict.why}")
        why = verdict.why
    else:
        why = f"{target} is gone"
    if now >= since + max(window, 2 * policy.poll_s):
        return next_rung(record, ctx, kube, now=now, why=f"did not stay healthy: {why}")
    return stay(record, now=now, until=now + policy.poll_s, note=f"verifying: {why}")


def _uncordoned_by_this_step(node: NodeView, record: Record) -> bool:
    """The node this record cordoned (the same Node object) is schedulable and our cordon marker is gone."""
    d = load(record)
    return (not d.dry_run and d.cordoned_by_us and node.name == d.node and bool(d.node_uid)
            and node.uid == d.node_uid and not node.unschedulable
            and health.CORDON_FOR_ANNOTATION not in node.annotations)


#: Every active state's step, all with the kernel's contract.
STEPS: Mapping[State, Step] = {State.ADMITTED: step_admitted, State.CORDONED: step_cordoned,
                               State.DRAINING: step_draining, State.REPAIRING: step_repairing,
                               State.VERIFYING: step_verifying}

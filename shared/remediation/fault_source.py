"""Is the fault still there? Re-read from its own source before every disruptive step.

A remediation is admitted on a fault its source showed minutes ago; by the time the steward cordons,
starts an eviction round or issues a VM action, the fault may have cleared, or may never have been
what the record says (a record is only a row anyone with the storage role can write). So each of
those steps asks the fault's own source again, never the record:

- ``npd``: the node's condition, read from the API server (written by the node's own
  node-problem-detector through its kubelet identity);
- ``dcgm``: the node's counters over the target's window, every sample and every copy
  (:func:`shared.remediation.dcgm_recheck.still_present`);
- ``resource-health``: ARM's current availability of the VM, state and class
  (:func:`shared.remediation.health_events.still_present`);
- ``gpu-capacity``: the node's allocatable GPUs against its pool's VM size as ARM has it
  (:func:`shared.remediation.gpu_capacity.still_present`).

The answer is True (still there), False (gone) or None (the source cannot answer now: the step waits,
bounded by the step's own timeout, and never acts on a guess). After a rung of the ladder failed its
verification, a later rung may also go on while the node is unhealthy now (the fault's source may
have reset with the reboot, as an XID does, while the node stays broken): :func:`justifies_next_rung`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.kernel.errors import StewardError
from shared.kernel.ports import NodeView
from shared.remediation import health
from shared.remediation.policy import RemediationPolicy
from shared.remediation.records import RemediationData
from shared.remediation.signals import SignalSource

if TYPE_CHECKING:
    from shared.kernel.context import Context


def present(ctx: Context, d: RemediationData, node: NodeView, *, same_instance: bool = False) -> tuple[bool | None, str]:
    """Whether the record's fault still shows in its source, re-read now (see the module docstring).

    ``same_instance``: for a condition, also require it to be the very transition admitted (not one that
    cleared and came back, which is a new fault of its own)."""
    signal = d.signal or str(SignalSource.NPD)
    try:
        if signal == SignalSource.NPD:
            cond = node.condition(d.condition)
            if cond is None or cond.status != "True":
                return False, f"{d.condition} is {cond.status if cond else 'not reported'} on {node.name}"
            if same_instance and (cond.last_transition or 0.0) > d.since_ts + 1.0:
                return False, f"{d.condition} cleared and came back since {d.since}: a new fault, not this one"
            return True, f"{d.condition} True on {node.name}"
        if signal == SignalSource.DCGM:
            from shared.remediation import dcgm_recheck

            return dcgm_recheck.still_present(ctx, cluster_id=d.cluster, node=d.node, key=d.condition,
                                              labels=node.labels, since=d.since_ts or None)
        if signal == SignalSource.RESOURCE_HEALTH:
            from shared.remediation import health_events

            if not d.arm_vm_id:
                return False, "the record names no VM: nothing to re-read Resource Health for"
            return health_events.still_present(ctx, vm_id=d.arm_vm_id, key=d.condition)
        if signal == SignalSource.GPU_CAPACITY:
            from shared.remediation import gpu_capacity

            return gpu_capacity.still_present(ctx, cluster_id=d.cluster, node=node)
    except StewardError as exc:  # the source cannot answer now: never a guess either way
        return None, f"{signal} cannot be re-read now ({type(exc).__name__}: {exc})"
    except ValueError as exc:  # a key this source never made: the record is not one of ours
        return False, f"{signal} does not know the fault {d.condition!r} ({exc})"
    return False, f"unknown signal {signal!r}: nothing to re-read, so nothing is done"


def justifies_next_rung(ctx: Context, d: RemediationData, node: NodeView, *, policy: RemediationPolicy,
                        now: float, window_s: float) -> tuple[bool | None, str]:
    """Before a later rung's action: the fault still shows, or the node is unhealthy now (what the
    previous rung's failed verification saw, re-read from the API server).

    "Healthy" is held to the verification's rule (:func:`health.verify_repair`): a node that turned Ready,
    or whose conditions transitioned, less than ``window_s`` ago is no proof yet, because node-problem-
    detector publishes every condition ``False`` when it starts after a boot and a fault that survived the
    boot is ``True`` again only at its first check. Taking that start-up ``False`` for "cleared" released a
    node whose fault was still there (a fresh-clone e2e run under load: the hopeless node released before
    its reimage). Too fresh to tell is None: the step waits and reads again, within the rung's timeout."""
    shows, why = present(ctx, d, node)
    if shows:
        return True, why
    recovered, health_why = health.is_recovered(node, policy=policy)
    if not recovered:
        return True, f"{why}; but the node is still unhealthy ({health_why})"
    if shows is None:
        return None, why
    verdict = health.verify_repair(node, policy=policy, since=0.0, now=now, window_s=window_s)
    if verdict.state == health.CONFIRMING:
        return None, f"{why}, and the node looks healthy, but {verdict.why}"
    return False, f"{why}, and the node is healthy ({health_why})"

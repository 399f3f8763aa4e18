"""Fault signals beyond the two NPD conditions, and how each enters the one remediation path.

Four sources tell the steward that a GPU node is sick (issue 13):

- ``npd``: node-problem-detector's conditions on the Node (``UnhealthyNvidiaDevicePlugin``,
  ``UnhealthyNvidiaDCGMServices``), read by the sweep; the original path;
- ``resource-health``: Azure Resource Health events about the node's VM, delivered by the
  HealthResources Event Grid system topic (shared.remediation.health_events);
- ``dcgm``: DCGM error counters (XIDs, double-bit ECC, row remapping) read from the cluster's Azure
  Monitor workspace with one PromQL query (shared.remediation.dcgm);
- ``gpu-capacity``: a Ready GPU node that offers fewer ``nvidia.com/gpu`` than its VM size has GPUs,
  past a start-up grace or for a threshold while running (shared.remediation.gpu_capacity).

Whatever the source, a signal becomes a :class:`Signal` that names the policy row that matched
(shared.remediation.signal_policy) and goes through the same admission (scope, trust in ARM, pause,
breaker, budgets, the per-node ledger) as a condition fault: a condition fault and a health event on
the same node are one remediation, because admission allows one active remediation per node.
The row's action chooses where the repair ladder starts (:func:`ladder_for`); ``record_only`` and
``ignore`` never admit anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shared.remediation import signal_policy
from shared.remediation.records import Rung


class SignalSource(StrEnum):
    """Where a fault was seen."""

    NPD = "npd"
    RESOURCE_HEALTH = "resource-health"
    DCGM = "dcgm"
    GPU_CAPACITY = "gpu-capacity"  # fewer allocatable nvidia.com/gpu than the VM size has (shared.remediation.gpu_capacity)


@dataclass(frozen=True)
class Signal:
    """One fault on one node, as a source reported it and a policy row judged it.

    ``key`` takes the place of the NPD condition in the remediation record and in the fault id (so one
    fault is remediated once): ``Xid79``, ``ResourceHealth/Degraded``, ``DCGM_FI_DEV_ROW_REMAP_FAILURE``.
    ``since`` is when the source first saw it; ``detail`` is the sentence the report shows.
    """

    source: SignalSource
    key: str
    since: float
    decision: signal_policy.Decision
    detail: str

    @property
    def acts(self) -> bool:
        """Whether the row asks for a remediation at all (``record_only`` and ``ignore`` do not)."""
        return self.decision.action not in (signal_policy.RECORD_ONLY, signal_policy.IGNORE)


def ladder_for(action: str, configured: tuple[str, ...]) -> tuple[Rung, ...]:
    """The rungs a remediation for ``action`` climbs, within the configured ladder (REMEDIATION_LADDER).

    - ``cordon_drain`` and ``restart``: the configured ladder, from its first rung (restart by default);
    - ``restart_then_replace``: restart, then straight to replace (NVIDIA's catalogue: a GPU that fell off
      the bus again after a reboot is a hardware fault; reimaging the OS disk cannot help);
    - ``replace``: replace only (the host failed: a restart or reimage lands on the same bad host).

    Rungs the operator left out of REMEDIATION_LADDER stay out; when none of the row's rungs is
    configured, the configured ladder is used as it is, so a row never widens what the operator allowed.
    """
    wanted: tuple[str, ...]
    if action == signal_policy.RESTART_THEN_REPLACE:
        wanted = (Rung.RESTART, Rung.REPLACE)
    elif action == signal_policy.REPLACE:
        wanted = (Rung.REPLACE,)
    else:
        wanted = tuple(configured)
    chosen = tuple(Rung(r) for r in wanted if r in configured)
    return chosen or tuple(Rung(r) for r in configured)

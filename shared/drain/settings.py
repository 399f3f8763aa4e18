"""What a drain needs to know: which pods it may evict, how long it waits, and how often it looks.

One frozen value, built once from the app settings (``Settings.drain``, by :meth:`DrainSettings.from_env`)
and handed to the drain as an argument, so the drain reads no environment and tests build it directly.
Its three parts:

- the pod rules (``empty_dir``, ``unmanaged_pods``: ``evict`` | ``refuse``; a pod a rule refuses
  refuses its whole node before anything is evicted, as kubectl's ``GetPodsForDeletion``);
- the bounds (``skip_wait_for_delete_timeout_s``: a pod still there this long past its
  ``deletionTimestamp`` is no longer waited for, kubectl ``--skip-wait-for-delete-timeout`` and
  Cluster API's 300 s, 0 = wait; ``pdb_blocked_timeout_s``: a pod a disruption budget keeps refusing
  this long stops the drain as ``stalled``, AKS's 30-minute upgrade drain timeout, 0 = only the
  deadline);
- the pace (``drain_timeout_s``, the deadline of one drain; ``eviction_retry_s``, the first wait
  after a budget refused an eviction, doubling up to ``poll_s``; ``poll_s``, how soon a drain in
  progress is looked at again).

The settings keep the names remediation has always read (REMEDIATION_EMPTY_DIR,
REMEDIATION_UNMANAGED_PODS, DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S, DRAIN_PDB_BLOCKED_TIMEOUT_S,
REMEDIATION_DRAIN_TIMEOUT_S and REMEDIATION_EVICTION_RETRY_S), so no deployment changes; this is
the only place they are read. The pod rules and bounds hold for every drain; each job derives its
own pace with :func:`dataclasses.replace`: remediation sets ``poll_s`` to its REMEDIATION_POLL_S
(read by its policy, the interval all its waits use), a migration drains against
MIGRATION_DRAIN_TIMEOUT_S and its poll interval. ``poll_s`` is therefore not read here: its
default is only what a drain without a job's pace uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.kernel.env import SettingError, env_choice, env_float, env_int

POD_POLICIES: tuple[str, ...] = ("evict", "refuse")


@dataclass(frozen=True)
class DrainSettings:
    """The pod rules, bounds and pace of a drain (see the module docstring for each one)."""

    empty_dir: str = "evict"
    unmanaged_pods: str = "refuse"
    skip_wait_for_delete_timeout_s: int = 300
    pdb_blocked_timeout_s: int = 1800
    drain_timeout_s: int = 3600
    eviction_retry_s: float = 5.0
    poll_s: int = 20

    def __post_init__(self) -> None:
        for name, value in (("REMEDIATION_EMPTY_DIR", self.empty_dir), ("REMEDIATION_UNMANAGED_PODS", self.unmanaged_pods)):
            if value not in POD_POLICIES:
                raise SettingError(f"setting {name} must be one of {', '.join(POD_POLICIES)}, got {value!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DrainSettings:
        """Read the drain's settings (``env`` defaults to the process environment)."""
        return cls(
            empty_dir=env_choice("REMEDIATION_EMPTY_DIR", "evict", POD_POLICIES, env=env),
            unmanaged_pods=env_choice("REMEDIATION_UNMANAGED_PODS", "refuse", POD_POLICIES, env=env),
            skip_wait_for_delete_timeout_s=env_int("DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S", 300, env=env, minimum=0),
            pdb_blocked_timeout_s=env_int("DRAIN_PDB_BLOCKED_TIMEOUT_S", 1800, env=env, minimum=0),
            drain_timeout_s=env_int("REMEDIATION_DRAIN_TIMEOUT_S", 3600, env=env, minimum=30),
            eviction_retry_s=env_float("REMEDIATION_EVICTION_RETRY_S", 5.0, env=env, minimum=0.1, maximum=600),
        )

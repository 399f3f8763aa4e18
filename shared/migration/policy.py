"""How the fleet migration to managed GPU pools is paced, bounded and timed.

One frozen value built once from the app settings (``Settings.migration``) so that the planner and
the migration state machine take their limits as an argument instead of reading the environment;
tests build it directly. Every setting is read with a literal name through :mod:`shared.kernel.env` (the
infrastructure tests derive the list of settings from those calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.kernel.env import SettingError, count_pairs, env_bool, env_choice, env_int, env_str
from shared.migration.window import WindowSpec, parse_window

STRATEGIES: tuple[str, ...] = ("auto", "surge", "rolling")
PRECEDENCES: tuple[str, ...] = ("cluster", "configured")


def parse_headroom(name: str, text: str) -> dict[str, int]:
    """``location:family=vcpus`` pairs, comma-separated; keys ``location:family`` lower-cased (ARM is
    case-insensitive). ``*`` stands for any location or any family: ``*:*=0`` says "assume no headroom".
    """
    out: dict[str, int] = {}
    for key, vcpus in count_pairs(name, text.split(","), unit="vCPUs").items():
        location, colon, family = key.partition(":")
        if not colon or not location.strip() or not family.strip():
            raise SettingError(f"setting {name} must be location:family=vcpus pairs, got {key!r}")
        out[f"{location.strip().lower()}:{family.strip().lower()}"] = vcpus
    return out


@dataclass(frozen=True)
class MigrationPolicy:
    """Limits and timings of the migration job (every setting is prefixed ``MIGRATION_``).

    - ``enabled`` (MIGRATION_ENABLED, default false): when false the timer still computes and
      reports the plan, but creates no migration records (nothing in the fleet changes).
    - ``max_concurrent`` (MIGRATION_MAX_CONCURRENT, default 2): fleet-wide cap on migrations that
      have started (created a replacement) and not yet finished.
    - ``strategy`` (MIGRATION_STRATEGY, ``auto`` | ``surge`` | ``rolling``, default auto): auto
      picks surge when the configured vCPU headroom holds the whole replacement, rolling otherwise.
    - ``batch_size`` (MIGRATION_BATCH_SIZE, default 1): old nodes drained at once (the pool's
      max-unavailable during the migration) and, with rolling, nodes added to the replacement per step.
    - ``window`` (MIGRATION_WINDOW, e.g. ``Sat 01:00-06:00 UTC``; see shared.migration.window): when
      migrations may take steps, used when the cluster has no maintenance configuration (or always,
      with precedence ``configured``). Empty = no configured window.
    - ``window_precedence`` (MIGRATION_WINDOW_PRECEDENCE, ``cluster`` | ``configured``, default
      cluster): which window wins when both the cluster's maintenance configuration and
      MIGRATION_WINDOW exist.
    - ``capacity_floor_pct`` (MIGRATION_CAPACITY_FLOOR_PCT, default 100): a batch of old nodes is
      drained only if the GPUs on Ready nodes (replacement + old nodes not drained) minus the batch
      stay at or above this share of the old pool's GPUs. Surge only; rolling trades this for quota.
    - ``validate_timeout_s`` (MIGRATION_VALIDATE_TIMEOUT_S, default 1800): how long the replacement
      (or a rolling growth step) may take to pass the stack check; then rollback (or blocked).
    - ``create_timeout_s`` (MIGRATION_CREATE_TIMEOUT_S, default 3600): the replacement's PUT until
      ``provisioningState: Succeeded``.
    - ``drain_timeout_s`` (MIGRATION_DRAIN_TIMEOUT_S, default 3600): one batch's drain; then the
      migration is blocked (nothing is forced; PDBs are never overridden).
    - ``poll_interval_s`` (MIGRATION_POLL_INTERVAL_S, default 15): how soon a waiting step looks again.
    - ``gpu_vcpu_headroom`` (MIGRATION_GPU_VCPU_HEADROOM, ``location:family=vcpus,...``): free vCPU
      quota per (location, quota family). AKS has no quota API in this app, so unknown = rolling.
      Spot pools count against the region's low-priority quota, not their family's: give it as
      ``location:lowPriorityCores=vcpus`` (https://learn.microsoft.com/azure/virtual-machines/spot-vms#quota).
    """

    enabled: bool = False
    max_concurrent: int = 2
    strategy: str = "auto"
    batch_size: int = 1
    window: str = ""
    window_precedence: str = "cluster"
    capacity_floor_pct: int = 100
    validate_timeout_s: int = 1800
    create_timeout_s: int = 3600
    drain_timeout_s: int = 3600
    poll_interval_s: int = 15
    gpu_vcpu_headroom: Mapping[str, int] = field(default_factory=dict)  # "location:family" -> free vCPUs

    @property
    def window_spec(self) -> WindowSpec | None:
        return parse_window(self.window) if self.window else None

    def headroom(self, location: str, family: str) -> int | None:
        """The configured free vCPUs for (location, family); None when unknown."""
        loc, fam = location.lower(), family.lower()
        for key in (f"{loc}:{fam}", f"{loc}:*", f"*:{fam}", "*:*"):
            if key in self.gpu_vcpu_headroom:
                return self.gpu_vcpu_headroom[key]
        return None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MigrationPolicy:
        window = env_str("MIGRATION_WINDOW", "", env=env)
        if window:
            try:
                parse_window(window)
            except ValueError as exc:
                raise SettingError(f"setting MIGRATION_WINDOW: {exc}") from None
        return cls(
            enabled=env_bool("MIGRATION_ENABLED", False, env=env),
            max_concurrent=env_int("MIGRATION_MAX_CONCURRENT", 2, env=env, minimum=1, maximum=100),
            strategy=env_choice("MIGRATION_STRATEGY", "auto", STRATEGIES, env=env),
            batch_size=env_int("MIGRATION_BATCH_SIZE", 1, env=env, minimum=1, maximum=100),
            window=window,
            window_precedence=env_choice("MIGRATION_WINDOW_PRECEDENCE", "cluster", PRECEDENCES, env=env),
            capacity_floor_pct=env_int("MIGRATION_CAPACITY_FLOOR_PCT", 100, env=env, minimum=0, maximum=100),
            validate_timeout_s=env_int("MIGRATION_VALIDATE_TIMEOUT_S", 1800, env=env, minimum=1),
            create_timeout_s=env_int("MIGRATION_CREATE_TIMEOUT_S", 3600, env=env, minimum=1),
            drain_timeout_s=env_int("MIGRATION_DRAIN_TIMEOUT_S", 3600, env=env, minimum=1),
            poll_interval_s=env_int("MIGRATION_POLL_INTERVAL_S", 15, env=env, minimum=1, maximum=3600),
            gpu_vcpu_headroom=parse_headroom(
                "MIGRATION_GPU_VCPU_HEADROOM", env_str("MIGRATION_GPU_VCPU_HEADROOM", "", env=env)),
        )

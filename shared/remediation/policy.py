"""How GPU-node remediation decides, paces and bounds itself.

One frozen value built once from the app settings (``Settings.remediation``) so that the health
evaluation, the budgets and the remediation state machine take their limits as an argument instead
of reading the environment; tests build it directly. The drain's own rules and pace are not here:
they are :class:`shared.drain.settings.DrainSettings` (``Settings.drain``). Every setting is read with a
literal name through :mod:`shared.kernel.env` (the infrastructure tests derive the list of settings from
those calls). Defaults come from the anchors (docs/remediation.md cites each one): NHC/AKS's 300 s
condition threshold, CAPI's 600 s node start-up timeout, EKS's 20 % unhealthy stop, NVSentinel's
manual-reset breaker and AKS's three repair cycles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.fleet.scope import PAUSED_TAG
from shared.kernel.env import SettingError, count_pairs, env_bool, env_choice, env_int, env_list, env_str

DEVICE_PLUGIN = "UnhealthyNvidiaDevicePlugin"
DCGM = "UnhealthyNvidiaDCGMServices"
XID = "XIDErrors"
GPU_MISSING = "GPUMissing"
DEFAULT_CONDITIONS: tuple[str, ...] = (DEVICE_PLUGIN, DCGM)

RUNGS: tuple[str, ...] = ("restart", "reimage", "replace")
DEFAULT_RUNG_TIMEOUTS: Mapping[str, int] = {"restart": 900, "reimage": 1800, "replace": 3600}

DRAIN_FALLBACKS: tuple[str, ...] = ("hold", "release")

# Taints other actors put on nodes they are about to remove or are working on (never ours).
DEFAULT_BUSY_TAINTS: tuple[str, ...] = (
    "ToBeDeletedByClusterAutoscaler",
    "DeletionCandidateOfClusterAutoscaler",
    "node.kubernetes.io/out-of-service",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
)
DEFAULT_BUSY_ANNOTATIONS: tuple[str, ...] = (
    "cluster-autoscaler.kubernetes.io/scale-down-disabled-for-upgrade",
)

OPT_OUT_LABEL = "gpu-fleet-steward/opt-out"
GPU_NODE_SELECTOR = "kubernetes.azure.com/accelerator=nvidia"


def _percent(name: str, text: str) -> int:
    raw = text.strip().rstrip("%").strip()
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"setting {name} must be a percentage like 20 or 20%, got {text!r}") from None
    if not 0 <= value <= 100:
        raise SettingError(f"setting {name} must be between 0 and 100, got {text!r}")
    return value


@dataclass(frozen=True)
class RemediationPolicy:
    """Every knob of GPU-node remediation. See docs/remediation.md for the full table.

    Detection: ``conditions`` (REMEDIATION_CONDITIONS) with ``thresholds_s`` per condition
    (REMEDIATION_THRESHOLDS, ``Cond=seconds`` pairs; others use ``default_threshold_s``,
    REMEDIATION_DEFAULT_THRESHOLD_S = 300), ``startup_grace_s`` (REMEDIATION_STARTUP_GRACE_S = 600),
    ``busy_taints`` / ``busy_annotations`` (REMEDIATION_BUSY_TAINTS / _ANNOTATIONS: nodes carrying
    these keys are someone else's business), ``skip_not_ready`` (REMEDIATION_SKIP_NOT_READY = true:
    NotReady nodes belong to AKS auto-repair).

    GPU capacity (shared.remediation.gpu_capacity): ``gpu_capacity`` (REMEDIATION_GPU_CAPACITY = true)
    judges whether a Ready GPU node offers as many ``nvidia.com/gpu`` as its VM size has GPUs;
    ``gpu_startup_grace_s`` (REMEDIATION_GPU_STARTUP_GRACE_S = 600, CAPI's default ``nodeStartupTimeout``)
    is how long a new node may take to advertise them; ``gpu_lost_threshold_s``
    (REMEDIATION_GPU_LOST_THRESHOLD_S = 300, the conditions' default threshold) is how long a running
    node may stay short before it is a fault.

    Repair: ``ladder`` (REMEDIATION_LADDER = restart,reimage,replace), ``rung_timeouts_s``
    (REMEDIATION_RUNG_TIMEOUTS, ``rung=seconds``), ``settle_s`` (REMEDIATION_SETTLE_S = 120: a rung
    is judged only after the node went through a reboot or this long passed), ``surge``
    (REMEDIATION_SURGE = true: replace scales up by one before deleting).

    Drain: ``drain_fallback`` (REMEDIATION_DRAIN_FALLBACK = hold | release: what happens to a node
    whose drain is refused, stalls or reaches its deadline). The pod rules, bounds and pace of the
    drain itself (REMEDIATION_EMPTY_DIR, REMEDIATION_UNMANAGED_PODS, DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT_S,
    DRAIN_PDB_BLOCKED_TIMEOUT_S, REMEDIATION_DRAIN_TIMEOUT_S, REMEDIATION_EVICTION_RETRY_S) are the
    drain's: :class:`shared.drain.settings.DrainSettings` (``Settings.drain``), which migration drains
    share; remediation drains with them at its own ``poll_s``.

    Budgets: ``pool_max_unavailable`` (BUDGET_POOL_MAX_UNAVAILABLE = 1) and
    ``pool_max_unavailable_percent`` (BUDGET_POOL_MAX_UNAVAILABLE_PERCENT = 20; the stricter wins),
    ``max_in_flight`` (BUDGET_MAX_IN_FLIGHT = 5), ``cooldown_s`` (BUDGET_NODE_COOLDOWN_S = 3600),
    ``max_attempts`` in ``attempt_window_s`` (BUDGET_NODE_MAX_ATTEMPTS = 3, BUDGET_NODE_ATTEMPT_WINDOW_S
    = 86400).

    Breaker: opens when more than ``breaker_percent`` (BREAKER_PERCENT = 30) of the fleet's GPU nodes
    turned unhealthy within ``breaker_window_s`` (BREAKER_WINDOW_S = 600) — once at least
    ``breaker_min_nodes`` (BREAKER_MIN_NODES = 3) did — or when ``breaker_max_nodes``
    (BREAKER_MAX_NODES, 0 = off) did; ``breaker_enabled`` (BREAKER_ENABLED = true).

    Operations: ``dry_run`` (REMEDIATION_DRY_RUN), ``poll_s`` (REMEDIATION_POLL_S = 20, how soon a
    waiting remediation is looked at again), ``lease_s`` (REMEDIATION_NODE_LEASE_S = 300),
    ``page_size`` (REMEDIATION_SWEEP_PAGE_SIZE = 500). The app-wide pause is STEWARD_PAUSED (in
    shared.settings); the cluster tag and node label are fixed names (``PAUSED_TAG``, ``OPT_OUT_LABEL``).
    """

    conditions: tuple[str, ...] = DEFAULT_CONDITIONS
    thresholds_s: Mapping[str, int] = field(default_factory=dict)
    default_threshold_s: int = 300
    startup_grace_s: int = 600
    gpu_capacity: bool = True
    gpu_startup_grace_s: int = 600
    gpu_lost_threshold_s: int = 300
    busy_taints: tuple[str, ...] = DEFAULT_BUSY_TAINTS
    busy_annotations: tuple[str, ...] = DEFAULT_BUSY_ANNOTATIONS
    skip_not_ready: bool = True
    ladder: tuple[str, ...] = RUNGS
    rung_timeouts_s: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_RUNG_TIMEOUTS))
    settle_s: int = 120
    surge: bool = True
    drain_fallback: str = "hold"
    pool_max_unavailable: int = 1
    pool_max_unavailable_percent: int = 20
    max_in_flight: int = 5
    cooldown_s: int = 3600
    max_attempts: int = 3
    attempt_window_s: int = 86400
    breaker_enabled: bool = True
    breaker_percent: int = 30
    breaker_min_nodes: int = 3
    breaker_max_nodes: int = 0
    breaker_window_s: int = 600
    dry_run: bool = False
    poll_s: int = 20
    lease_s: int = 300
    pending_fault_max_age_s: int = 86400  # a kept refused pushed fault is dropped after this (pending_faults)
    page_size: int = 500
    # DCGM (shared.remediation.dcgm): the nodes with a fault verified against their cluster and ARM per
    # workspace per sweep (SIGNALS_DCGM_MAX_NODES), and how long an untouched ``dcgm-node`` row is kept
    # (SIGNALS_DCGM_ROW_RETENTION_S).
    dcgm_max_nodes: int = 64
    dcgm_row_retention_s: int = 7 * 86400
    opt_out_label: str = OPT_OUT_LABEL
    paused_tag: str = PAUSED_TAG
    node_selector: str = GPU_NODE_SELECTOR
    # No tenant holds the fleet (issue 19; docs/remediation.md, "Shares of the fleet"): one cluster's nodes
    # count at most this share of what would open the breaker, when the fleet has more than one cluster
    # (BREAKER_CLUSTER_SHARE_PERCENT, 100 = no cap); the nodes a sweep checks against ARM before the breaker
    # counts them (BREAKER_VERIFY_MAX_NODES); the remediations one cluster may have in flight
    # (BUDGET_CLUSTER_MAX_IN_FLIGHT, 0 admits nothing); and how long a drain a PodDisruptionBudget blocks
    # keeps its fleet slot (BUDGET_BLOCKED_DRAIN_SLOT_S, 0 = until the drain ends).
    breaker_cluster_share_percent: int = 50
    breaker_verify_max_nodes: int = 100
    cluster_max_in_flight: int = 3
    blocked_drain_slot_s: int = 300

    def __post_init__(self) -> None:
        if not self.conditions:
            raise SettingError("setting REMEDIATION_CONDITIONS must name at least one condition")
        if not self.ladder:
            raise SettingError("setting REMEDIATION_LADDER must name at least one rung")
        unknown = [r for r in self.ladder if r not in RUNGS]
        if unknown:
            raise SettingError(f"setting REMEDIATION_LADDER: {', '.join(unknown)} not one of {', '.join(RUNGS)}")
        if len(set(self.ladder)) != len(self.ladder):
            raise SettingError("setting REMEDIATION_LADDER must not repeat a rung")
        if self.drain_fallback not in DRAIN_FALLBACKS:
            raise SettingError(f"setting REMEDIATION_DRAIN_FALLBACK must be one of {', '.join(DRAIN_FALLBACKS)}")

    def threshold_for(self, condition: str) -> int:
        return int(self.thresholds_s.get(condition, self.default_threshold_s))

    def rung_timeout(self, rung: str) -> int:
        return int(self.rung_timeouts_s.get(rung, DEFAULT_RUNG_TIMEOUTS[rung]))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RemediationPolicy:
        """Read the REMEDIATION_*, BUDGET_* and BREAKER_* settings (``env`` defaults to the process)."""
        conditions = env_list("REMEDIATION_CONDITIONS", DEFAULT_CONDITIONS, env=env)
        thresholds = count_pairs("REMEDIATION_THRESHOLDS", env_list("REMEDIATION_THRESHOLDS", (), env=env), unit="seconds")
        ladder = tuple(r.lower() for r in env_list("REMEDIATION_LADDER", RUNGS, env=env))
        timeouts = dict(DEFAULT_RUNG_TIMEOUTS)
        timeouts.update(count_pairs("REMEDIATION_RUNG_TIMEOUTS", env_list("REMEDIATION_RUNG_TIMEOUTS", (), env=env),
                                    unit="seconds", allowed=RUNGS))
        return cls(
            conditions=conditions,
            thresholds_s=thresholds,
            default_threshold_s=env_int("REMEDIATION_DEFAULT_THRESHOLD_S", 300, env=env, minimum=0),
            startup_grace_s=env_int("REMEDIATION_STARTUP_GRACE_S", 600, env=env, minimum=0),
            gpu_capacity=env_bool("REMEDIATION_GPU_CAPACITY", True, env=env),
            gpu_startup_grace_s=env_int("REMEDIATION_GPU_STARTUP_GRACE_S", 600, env=env, minimum=0),
            gpu_lost_threshold_s=env_int("REMEDIATION_GPU_LOST_THRESHOLD_S", 300, env=env, minimum=0),
            busy_taints=env_list("REMEDIATION_BUSY_TAINTS", DEFAULT_BUSY_TAINTS, env=env),
            busy_annotations=env_list("REMEDIATION_BUSY_ANNOTATIONS", DEFAULT_BUSY_ANNOTATIONS, env=env),
            skip_not_ready=env_bool("REMEDIATION_SKIP_NOT_READY", True, env=env),
            ladder=ladder,
            rung_timeouts_s=timeouts,
            settle_s=env_int("REMEDIATION_SETTLE_S", 120, env=env, minimum=0),
            surge=env_bool("REMEDIATION_SURGE", True, env=env),
            drain_fallback=env_choice("REMEDIATION_DRAIN_FALLBACK", "hold", DRAIN_FALLBACKS, env=env),
            pool_max_unavailable=env_int("BUDGET_POOL_MAX_UNAVAILABLE", 1, env=env, minimum=0),
            pool_max_unavailable_percent=_percent(
                "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT", env_str("BUDGET_POOL_MAX_UNAVAILABLE_PERCENT", "20", env=env)),
            max_in_flight=env_int("BUDGET_MAX_IN_FLIGHT", 5, env=env, minimum=0),
            cooldown_s=env_int("BUDGET_NODE_COOLDOWN_S", 3600, env=env, minimum=0),
            max_attempts=env_int("BUDGET_NODE_MAX_ATTEMPTS", 3, env=env, minimum=1),
            attempt_window_s=env_int("BUDGET_NODE_ATTEMPT_WINDOW_S", 86400, env=env, minimum=60),
            breaker_enabled=env_bool("BREAKER_ENABLED", True, env=env),
            breaker_percent=_percent("BREAKER_PERCENT", env_str("BREAKER_PERCENT", "30", env=env)),
            breaker_min_nodes=env_int("BREAKER_MIN_NODES", 3, env=env, minimum=1),
            breaker_max_nodes=env_int("BREAKER_MAX_NODES", 0, env=env, minimum=0),
            breaker_window_s=env_int("BREAKER_WINDOW_S", 600, env=env, minimum=60),
            dry_run=env_bool("REMEDIATION_DRY_RUN", False, env=env),
            poll_s=env_int("REMEDIATION_POLL_S", 20, env=env, minimum=1, maximum=3600),
            lease_s=env_int("REMEDIATION_NODE_LEASE_S", 300, env=env, minimum=30),
            pending_fault_max_age_s=env_int("REMEDIATION_PENDING_FAULT_MAX_AGE_S", 86400, env=env, minimum=60),
            page_size=env_int("REMEDIATION_SWEEP_PAGE_SIZE", 500, env=env, minimum=10, maximum=5000),
            dcgm_max_nodes=env_int("SIGNALS_DCGM_MAX_NODES", 64, env=env, minimum=1, maximum=10000),
            dcgm_row_retention_s=env_int("SIGNALS_DCGM_ROW_RETENTION_S", 7 * 86400, env=env, minimum=3600),
            breaker_cluster_share_percent=env_int("BREAKER_CLUSTER_SHARE_PERCENT", 50, env=env, minimum=1, maximum=100),
            breaker_verify_max_nodes=env_int("BREAKER_VERIFY_MAX_NODES", 100, env=env, minimum=1, maximum=5000),
            cluster_max_in_flight=env_int("BUDGET_CLUSTER_MAX_IN_FLIGHT", 3, env=env, minimum=0),
            blocked_drain_slot_s=env_int("BUDGET_BLOCKED_DRAIN_SLOT_S", 300, env=env, minimum=0),
        )

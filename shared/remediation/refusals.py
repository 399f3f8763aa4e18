"""Why a faulty node was not repaired, rule by rule: the setting behind each refusal code, and what has to change.

Every refusal the admission makes (shared.remediation.admission ``refuse``) carries a code; the steward
records it once per fault and code (a ``dedupe`` ``refused-<fault>-<code>`` row, expiring after
``LEDGER_DEDUPE_RETENTION_DAYS``). :data:`RULES` turns a code into what an operator needs at 3 a.m.: the
rule, the settings that shape it, whether it passes by itself (a budget slot frees, a cooldown ends) or
needs a person (a node that contradicts ARM, an opt-out), and what would have to change for the node to be
repaired. ``fleetctl why NODE`` prints it; tests/unit/test_refusal_rules.py keeps the table equal to the
codes the code can produce.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.fleet import node_truth
from shared.fleet.scope import PAUSED_TAG
from shared.remediation import budget, health
from shared.remediation.policy import OPT_OUT_LABEL
from shared.remediation.records import GOING_AWAY

STALE = "stale"  # an event observed before the breaker's last reset (shared.remediation.admission)


@dataclass(frozen=True)
class RefusalRule:
    """One refusal code: the rule, its settings, whether it passes by itself, and what would have to change."""

    rule: str
    settings: tuple[str, ...]
    passes: bool  # True: the refusal ends by itself (a slot frees, time passes); False: a person must act
    to_repair: str


RULES: dict[str, RefusalRule] = {
    budget.PAUSED: RefusalRule(
        "the steward or the cluster is paused",
        ("STEWARD_PAUSED", f"the cluster tag {PAUSED_TAG}=true"),
        False, "unset STEWARD_PAUSED, or remove the cluster's pause tag"),
    budget.OPTED_OUT: RefusalRule(
        "the node opted out of remediation", (f"the node label {OPT_OUT_LABEL}=true",),
        False, "remove the node's opt-out label"),
    budget.BREAKER: RefusalRule(
        "the fleet circuit breaker is open: too many GPU nodes failed at once",
        ("BREAKER_PERCENT", "BREAKER_MIN_NODES", "BREAKER_MAX_NODES", "BREAKER_WINDOW_S"),
        False, "an operator finds the common cause, then resets the breaker (fleetctl breaker --reset)"),
    budget.COOLDOWN: RefusalRule(
        "the node was remediated recently: a cooldown between two remediations of one node",
        ("BUDGET_NODE_COOLDOWN_S",), True, "the cooldown since its last remediation ends"),
    budget.ATTEMPTS: RefusalRule(
        "the node used up its remediations in the attempt window",
        ("BUDGET_NODE_MAX_ATTEMPTS", "BUDGET_NODE_ATTEMPT_WINDOW_S"),
        False, "a person repairs or replaces the node; the steward tries again once the window has passed"),
    budget.POOL_BUDGET: RefusalRule(
        "the pool's disruption budget: other nodes of the pool are already unavailable",
        ("BUDGET_POOL_MAX_UNAVAILABLE", "BUDGET_POOL_MAX_UNAVAILABLE_PERCENT"),
        True, "another node of the pool comes back into service (its remediation ends)"),
    budget.CLUSTER_BUDGET: RefusalRule(
        "the cluster's limit of remediations in flight",
        ("BUDGET_CLUSTER_MAX_IN_FLIGHT",), True, "a remediation in the same cluster ends"),
    budget.FLEET_BUDGET: RefusalRule(
        "the fleet's limit of remediations in flight",
        ("BUDGET_MAX_IN_FLIGHT",), True, "a remediation anywhere in the fleet ends"),
    STALE: RefusalRule(
        "the fault was observed before the breaker's last reset",
        ("BREAKER_WINDOW_S",), True, "the fault is reported again after the reset (the sweep re-reads the node)"),
    GOING_AWAY: RefusalRule(
        "the platform is taking the node away (spot eviction, scale-down, deletion)",
        (), False, "nothing: the node leaves; its replacement is judged on its own"),
    node_truth.PROVIDER_ID_MISMATCH: RefusalRule(
        "trust check: the node's providerID is not the VM ARM knows for it", (), False,
        "the node object must match ARM (someone changed it, or it is not the machine it claims)"),
    node_truth.NOT_A_MACHINE: RefusalRule(
        "trust check: the node is not a machine of the pool it claims (ARM)", (), False,
        "the node's pool label must name the pool ARM lists it in"),
    node_truth.FOREIGN_VM: RefusalRule(
        "trust check: ARM's VM for the node is outside the cluster's node resource group", (), False,
        "the node must be one of this cluster's own VMs"),
    node_truth.NO_SUCH_POOL: RefusalRule(
        "trust check: the pool the node claims does not exist in ARM", (), False,
        "the node's pool label must name a pool of the cluster"),
    node_truth.NOT_USER_POOL: RefusalRule(
        "a System pool: never remediated, it runs the cluster's own add-ons", (), False,
        "a person repairs it (AKS node auto-repair covers System pools)"),
    node_truth.NOT_GPU_POOL: RefusalRule(
        "the pool's VM size is not an NVIDIA GPU size", (), False, "nothing: the steward repairs GPU nodes only"),
    node_truth.NOT_NAP_CLUSTER: RefusalRule(
        "trust check: the node claims to be Karpenter's on a cluster without node auto-provisioning", (), False,
        "the node's labels must match how the cluster provisions nodes"),
    node_truth.NODE_RECREATED: RefusalRule(
        "the node object was recreated since it was admitted (a new uid): the steward's cordon is gone", (), True,
        "the new node is judged again by the next sweep"),
}

#: The sweep's skips (shared.remediation.health ``_skip``): a faulty node set aside before any admission,
#: recorded as a ``decision`` row (shared.remediation.decisions). tests/unit/test_refusal_rules.py keeps
#: this table equal to health's SKIP_* codes.
SKIP_RULES: dict[str, RefusalRule] = {
    health.SKIP_OPTED_OUT: RefusalRule(
        "the node opted out of remediation", (f"the node label {OPT_OUT_LABEL}=true",), False,
        f"remove the node's label {OPT_OUT_LABEL}"),
    health.SKIP_DELETING: RefusalRule(
        "the node is being deleted (scale-down, upgrade surge, a deleted machine): AKS is taking it away", (),
        True, "nothing: the node leaves; its replacement is judged on its own"),
    health.SKIP_BUSY_TAINT: RefusalRule(
        "the node carries a taint that says someone else is working on it (the reason names the taint)",
        ("REMEDIATION_BUSY_TAINTS",), True, "whoever set the taint finishes and removes it"),
    health.SKIP_BUSY_ANNOTATION: RefusalRule(
        "the node carries an annotation that says someone else is working on it (the reason names it)",
        ("REMEDIATION_BUSY_ANNOTATIONS",), True, "whoever set the annotation finishes and removes it"),
    health.SKIP_CORDONED_BY_OTHER: RefusalRule(
        "the node was cordoned by someone else (an AKS upgrade or node-image update, or a person investigating)",
        (), False, "whoever cordoned it uncordons it (kubectl uncordon): the steward never uncordons a node it did not cordon"),
    health.SKIP_STARTING: RefusalRule(
        "the node is new: its start-up grace has not passed", ("REMEDIATION_STARTUP_GRACE_S",), True,
        "the start-up grace since the node was created passes"),
    health.SKIP_NOT_READY: RefusalRule(
        "the node is NotReady: AKS node auto-repair's job, never raced", ("REMEDIATION_SKIP_NOT_READY",), True,
        "the node becomes Ready again (AKS auto-repair), or REMEDIATION_SKIP_NOT_READY=false"),
}


def explain(code: str) -> RefusalRule:
    """The rule behind ``code``; an unknown code (a newer steward's) says so rather than guessing."""
    return RULES.get(code) or SKIP_RULES.get(code) or RefusalRule(
        f"refusal code {code!r}, which this version does not describe", (), False, "read the reason recorded with it")

"""The liveness oracle (issue 24, item 2): every genuine fault the scenario injected ends somewhere named.

The scenario is the ground truth: :mod:`soak.generate` drew every condition flip (which node, what cures
it: a restart, a reimage, a replace or nothing), :mod:`soak.signals` every Resource Health event and DCGM
fault, :mod:`soak.strict` every obstacle (a locked node resource group, pods held by finalizers, unready
pods under a PDB, a bare pod, an emptyDir refusal, a NAP cluster), :mod:`soak.generate`'s fault rules every
quota, capacity and failed operation. At the end of a run each genuine fault must be

(a) **repaired**: a remediation of its node that was active at or after the onset ended ``done`` (and the
    node does not still show the fault), or the node was replaced;
(b) **released because it cleared**: the condition cleared by itself, the remediation was released, the
    node left the fleet with a migration or a replacement, or a kept fault was dropped because its source
    no longer confirmed it;
(c) **handed to an operator**: a remediation ``gave_up``, ``blocked`` or ``failed``, a refusal a person must
    lift, a skip of a node someone else holds, a kept fault dropped as expired: with a reason that names a
    cause this scenario injected (:data:`CAUSES`);

and every migration ``done``, or ``blocked`` / ``rolled_back`` with a reason naming an injected cause.
Anything else (no remediation, no refusal, no row; or a reason no injected cause explains) is the
``fault-liveness`` / ``migration-liveness`` invariant failing. :func:`outcome_table` is the summary's table
of outcomes by cause.

Pure, like the other checks: it reads the :class:`soak.invariants.Evidence` only.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.prometheus.api import STORM_XID
from soak.generate import GPU_SIZES, T4_FAMILY
from soak.invariants import Evidence, Violation, _cluster_name, reason

RUNGS = ("restart", "reimage", "replace")
GIVEN_UP = ("gave_up", "blocked", "failed", "refused")


@dataclass(frozen=True)
class Cause:
    """Something the scenario injected that may stop a repair, and how a record's reason names it."""

    name: str
    pattern: str

    def names(self, text: str) -> bool:
        return re.search(self.pattern, text, flags=re.IGNORECASE) is not None


@dataclass(frozen=True)
class Fault:
    """One genuine fault: its source, node, onset and (for condition flips) what cures it."""

    source: str  # npd, resource-health, dcgm, nap
    cluster: str
    pool: str
    node: str
    at: float  # absolute sim time of the onset
    what: str  # the condition, the Resource Health scenario, the XID, ...
    cure: str  # restart, reimage, replace, never, or "" when the scenario does not say
    cleared_at: float | None = None

    @property
    def label(self) -> str:
        return f"{self.source} {self.what} on {self.cluster}/{self.node}"


@dataclass(frozen=True)
class Outcome:
    fault: Fault
    kind: str  # repaired, cleared, handed-over, lost
    how: str  # the record state or the row that says so
    why: str  # the reason the record gives
    cause: str  # the injected cause that explains it ("" for repaired; "none" when lost or unexplained)

    @property
    def ok(self) -> bool:
        return self.kind != "lost" and self.cause != "none"


# --------------------------------------------------------------------------- the injected causes

#: Each cause the generator can inject, and the words a reason uses for it, most specific first (a reason is
#: put down to the first injected cause it names). A reason that only says "failed" names nothing: every
#: pattern is specific enough to point an operator at the cause.
CAUSE_PATTERNS: dict[str, str] = {
    "attempts cap": r"attempts in the last \d+s, at most",
    "node resource group locked": r"ScopeLocked|\block|DenyAssignment",
    "Karpenter node": r"Karpenter|NodeClaim",
    "quota": r"quota",
    "capacity": r"AllocationFailed|capacity|SkuNotAvailable",
    "failed operation": r"InternalOperationError|AllocationFailed|operation (?:failed|ended)|never took effect|"
                        r"may have failed in Azure|(?-i:\bFailed\b|Canceled)",
    "drain obstacle": r"PodDisruptionBudget|\bPDB\b|drain|evict|terminat|finalizer|emptyDir|unmanaged|controller",
    "pool migrated": r"migrat|deleting|being deleted|going away|taking .* away",
    "cordoned by someone else": r"cordoned by someone else|not our cordon|someone (?:else )?(?:cordoned|uncordoned)",
    "forged rows": r"forged|no admission recorded|not admitted",
    "breaker": r"breaker",
    "not cured by the ladder": r"every rung failed|still (?:faulty|unhealthy|shows)|not recover|did not (?:stay|clear)|"
                               r"ladder|attempts? (?:used up|cap)|no rung",
    "budget": r"(?<!disruption)budget|in flight|slot",
    "node left": r"no longer exists|disappeared|recreated|not found|gone",
    "platform": r"NotReady|not Ready|unreachable|platform",
}


def injected_causes(evidence: Evidence) -> list[Cause]:
    """The causes this scenario injected (drawn, and for fault rules, fired)."""
    scenario = evidence.scenario
    # Every fleet has budgets, nodes come and go, and a repair may fail: whether the ladder could not cure
    # *this* fault is judged per fault (_uncurable), from what the scenario drew for it and its node.
    names: set[str] = {"node left", "platform", "budget", "not cured by the ladder", "attempts cap"}
    kinds = " ".join([*scenario.strict_faults, *scenario.signal_faults])
    if "locked" in kinds:
        names.add("node resource group locked")
    if re.search(r"finalizers|PDB|emptyDir|namespace", kinds) or any(
            w.get("kind") == "Pod" for c in scenario.sim["subscriptions"][0]["clusters"] for w in c["workloads"]) or \
            any(w.get("pdb") for c in scenario.sim["subscriptions"][0]["clusters"] for w in c["workloads"]):
        names.add("drain obstacle")
    fired = [str(f.get("code") or "") + " " + str(f.get("target") or "") for f in evidence.oracles.get("faults_fired") or []]
    if any("Quota" in f for f in fired):
        names.add("quota")
    if any("AllocationFailed" in f for f in fired) or scenario.sim.get("capacity"):
        names.add("capacity")
    if any(f.strip().endswith("lro") or "InternalOperationError" in f for f in fired) or scenario.sim.get("capacity"):
        # a pool operation the scenario's capacity cannot serve ends Failed (AllocationFailed) in ARM too
        names.add("failed operation")
    if any(p.migrate for p in scenario.pools) or scenario.nap_pools:
        names.add("pool migrated")
    if scenario.nap_pools:
        names.add("Karpenter node")
    if int(scenario.profile.get("BREAKER_MIN_NODES", "3") or 3) > 0:
        names.add("breaker")
    if any(p.migrate for p in scenario.pools):
        names.add("cordoned by someone else")  # the migration's cordon is not the remediation's
    if scenario.forged_rows:
        names.add("forged rows")
    quota = sum(q["limit"] for s in scenario.sim["subscriptions"] for q in s["quotas"] if q["family"] == T4_FAMILY)
    used = sum(GPU_SIZES[p.vm_size] * p.count for p in scenario.pools)  # vCPUs, as soak.generate draws the quota
    if quota - used < 64:
        names.add("quota")
    return [Cause(n, p) for n, p in CAUSE_PATTERNS.items() if n in names]  # most specific first


def _ladder(evidence: Evidence) -> list[str]:
    return [r.strip() for r in str(evidence.scenario.profile.get("REMEDIATION_LADDER", ",".join(RUNGS))).split(",")
            if r.strip()]


def _beyond(cure: str, ladder: list[str]) -> bool:
    """Whether no rung of ``ladder`` is at least ``cure`` (a replace cures what a reimage cures, and so on)."""
    if cure not in RUNGS:
        return False
    return not any(r in RUNGS and RUNGS.index(r) >= RUNGS.index(cure) for r in ladder)


# --------------------------------------------------------------------------- the genuine faults


def genuine_faults(evidence: Evidence) -> list[Fault]:
    scenario = evidence.scenario
    configured = set(str(scenario.profile.get("REMEDIATION_CONDITIONS",
                                             "UnhealthyNvidiaDevicePlugin,UnhealthyNvidiaDCGMServices")).split(","))
    start = evidence.start
    out: list[Fault] = []
    clears = {(f["cluster"], f["pool"], f["node_index"], f["type"]): float(f["at"])
              for f in scenario.flips if f.get("status") == "False"}
    claimed: set[tuple[str, str, str, float]] = set()
    fired = bool(evidence.oracles.get("flips"))
    for flip in scenario.flips:
        if flip.get("status", "True") != "True" or flip["type"] not in configured:
            continue
        node = _flipped_node(evidence, flip, claimed)
        if node is None:
            continue  # already True (the same fault, drawn twice), or no node there: nothing new happened
        claimed.add((flip["cluster"], node, flip["type"], float(flip["at"])))
        cleared = _cleared_at(evidence, flip, node) if fired else \
            clears.get((flip["cluster"], flip["pool"], flip["node_index"], flip["type"]))
        out.append(Fault("npd", flip["cluster"], flip["pool"], node, start + float(flip["at"]),
                         flip["type"], str(flip.get("fixed_by", "")),
                         None if cleared is None else start + cleared))
    from soak.signals import APPLICATION_XIDS, RECORD_ONLY_SCENARIOS

    for action in evidence.actions:
        if not action.get("ok") or not action.get("node"):
            continue
        kind = action.get("kind")
        if kind == "resource-health" and action.get("scenario") not in RECORD_ONLY_SCENARIOS:
            what = str(action["scenario"])
        elif kind == "dcgm-xid" and int(action.get("xid", 0)) not in APPLICATION_XIDS:
            what = f"XID {action['xid']}"
            if _gauge_before(evidence, action) == int(action["xid"]):
                continue  # the node's XID gauge already showed it: nothing new to see, the same fault (seed 961764)
        elif kind == "dcgm-ecc-storm":
            what = "ECC storm" + (" (failing memory)" if action.get("persist") else "")
            if any(a.get("kind") == kind and a.get("ok") and a is not action and float(a["t"]) < float(action["t"])
                   and (a.get("cluster"), a.get("node")) == (action.get("cluster"), action.get("node"))
                   for a in evidence.actions):
                continue  # a second storm on a GPU already storming: the same fault (seed 951270)
        elif kind == "nap-flip":
            what = "NAP condition"
            if any(a.get("kind") == "nap-flip" and a.get("ok") and a is not action and float(a["t"]) < float(action["t"])
                   and (a.get("node"), a.get("type")) == (action.get("node"), action.get("type"))
                   for a in evidence.actions):
                continue  # the same condition on the same node, already True: no new fault (seed 951101)
        else:
            continue
        source = {"resource-health": "resource-health", "nap-flip": "nap"}.get(str(kind), "dcgm")
        out.append(Fault(source, str(action["cluster"]), str(action.get("pool", "")), str(action["node"]),
                         float(action["t"]), what, "", _superseded(evidence, action) if kind == "resource-health"
                         else None))
    return out


def _cleared_at(evidence: Evidence, flip: Mapping[str, Any], node: str) -> float | None:
    """When a False flip struck ``node``'s condition after ``flip`` (scenario seconds; None: none did), by the
    simulator's record of the node each flip struck: a False flip's ``node_index`` is resolved among the pool's
    nodes when it fires, so after a replacement it clears another node than the True flip of the same index
    (soak seed 962068: the index-1 clear struck vmss000003, whose fault came from index 2, and the remediation
    found the condition False before its restart)."""
    at = float(flip["at"])
    later = [float(f["at"]) for f in evidence.oracles.get("flips") or []
             if f.get("status") == "False" and (f.get("cluster"), f.get("node"), f.get("type")) ==
             (flip["cluster"], node, flip["type"]) and float(f["at"]) > at]
    return min(later) if later else None


def _gauge_before(evidence: Evidence, action: Mapping[str, Any]) -> int | None:
    """What the node's last-XID gauge showed just before ``action`` (None: nothing, or reset by a reboot since).

    ``DCGM_FI_DEV_XID_ERRORS`` holds the last XID until the driver reloads (sim/prometheus/api.py: an XID sets it,
    an ECC storm logs 48, a reboot resets it: ``STORM_XID``), so the same XID again on a node already showing it is no new fault.
    """
    node = (action.get("cluster"), action.get("node"))
    t = float(action["t"])
    last: tuple[float, int | None] = (float("-inf"), None)
    for a in evidence.actions:
        if a is action or not a.get("ok") or (a.get("cluster"), a.get("node")) != node or float(a["t"]) >= t:
            continue
        if a.get("kind") in ("dcgm-xid", "dcgm-ecc-storm") and float(a["t"]) >= last[0]:
            last = (float(a["t"]), STORM_XID if a.get("kind") == "dcgm-ecc-storm" else int(a.get("xid", 0)))
    for r in evidence.oracles.get("repairs") or []:
        if (r.get("cluster"), r.get("node")) == node and last[0] <= float(r["t"]) < t:
            # the VM rebooted since: the gauge was reset, or shows 48 again under a failing memory's storm
            failing = any(a.get("kind") == "dcgm-ecc-storm" and a.get("ok") and a.get("persist")
                          and (a.get("cluster"), a.get("node")) == node and float(a["t"]) < t for a in evidence.actions)
            return STORM_XID if failing else None
    return last[1]


def _superseded(evidence: Evidence, action: Mapping[str, Any]) -> float | None:
    """When a later Resource Health injection on the same VM replaced the status this one set (its events set the
    availability and the annotation's class anew: sim/arm/resource_health.py ``_apply``), like a condition's
    False flip: the source itself says something else since (soak seed 961022: a host failure, then a planned
    maintenance 7.5 s later whose reboot ended Available; ARM said Planned when the crash's event arrived).
    "Later" is the order the driver performed them in (``evidence.actions`` is its log): two injections drawn
    for the same instant both happen, one after the other (seed 963818: a host failure and a planned maintenance
    at t+265 s on one VM; ARM said Planned from then on, and the host failure was never confirmed)."""
    mine = next((i for i, a in enumerate(evidence.actions) if a is action), -1)
    later = [float(a["t"]) for i, a in enumerate(evidence.actions)
             if a.get("kind") == "resource-health" and a.get("ok") and a is not action
             and (a.get("cluster"), a.get("node")) == (action.get("cluster"), action.get("node"))
             and (float(a["t"]) > float(action["t"]) or (float(a["t"]) == float(action["t"]) and i > mine >= 0))]
    return min(later) if later else None


def _flipped_node(evidence: Evidence, flip: Mapping[str, Any], claimed: set[tuple[str, str, str, float]]) -> str | None:
    """The node a condition flip turned True, as the auditor saw it (None: it changed nothing).

    The simulator records the node each flip struck (its ``flips`` oracle): that node, when the auditor saw
    the condition turn True on it then. Without that record (older evidence), a guess:

    The simulator resolves ``node_index`` among the pool's nodes when the flip fires (sim/scenario.py
    ``_resolve_node``), so after a replacement the index may name another node than at the start. The
    sampler compares each driver step's conditions with the step before (soak.audit ``turned_true``): the
    candidates are the pool's nodes on which the flip's condition turned True in the step around it;
    the node at that index at the start wins when it is one of them.
    """
    at = evidence.start + float(flip["at"])
    cluster, pool, condition = str(flip["cluster"]), str(flip["pool"]), str(flip["type"])
    fired = [f for f in evidence.oracles.get("flips") or []
             if (f.get("cluster"), f.get("pool"), f.get("type"), f.get("node_index")) ==
             (cluster, pool, condition, flip.get("node_index")) and f.get("at") == flip.get("at")]
    if fired:  # the simulator's own record of the node it struck (seed 959008)
        node = str(fired[0]["node"])
        turned = any(str(t["node"]) == node and t["cluster"] == cluster and condition in t["conditions"]
                     and float(t["prev_t"]) <= at + 1.0 and float(t["t"]) >= at - 1.0
                     for t in evidence.turned_true)
        return node if turned and (cluster, node, condition, float(flip["at"])) not in claimed else None
    candidates = sorted({str(t["node"]) for t in evidence.turned_true
                         if t["cluster"] == cluster and condition in t["conditions"]
                         and float(t["prev_t"]) <= at + 1.0 and float(t["t"]) >= at - 1.0
                         and evidence.node_pools.get((cluster, str(t["node"])), pool) == pool
                         and (cluster, str(t["node"]), condition, float(flip["at"])) not in claimed})
    names = evidence.initial_nodes.get(f"{cluster}/{pool}", [])
    index = int(flip["node_index"])
    if 0 <= index < len(names) and names[index] in candidates:
        return names[index]
    return candidates[0] if len(candidates) == 1 else None


# --------------------------------------------------------------------------- judging one fault

#: What a released remediation says when its fault went away (anything else, e.g. the drain's "release"
#: fallback, leaves the fault for an operator).
CLEARED = r"cleared|recovered|no longer exists|recreated|disappeared|nothing to do|fault is gone"


def _node_conditions(evidence: Evidence) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for cluster, nodes in evidence.nodes.items():
        for node in nodes:
            true = {str(c.get("type")) for c in (node.get("status") or {}).get("conditions") or []
                    if c.get("status") == "True" and c.get("type") != "Ready"}
            out[(cluster, str(node["metadata"]["name"]))] = true
    return out


def _explained(text: str, causes: Iterable[Cause]) -> str:
    return next((c.name for c in causes if c.names(text)), "none")


def _uncurable(evidence: Evidence, fault: Fault, rec: Any, faults: list[Fault]) -> bool:
    """Whether giving up on ``fault`` after remediation ``rec`` is explained by the scenario: the node is in an
    unmanaged pool (no GPU stack to verify); a flapping condition struck its pool while it worked; or this
    fault, or another on the same node (or on its replacement, or the node that came for it unhealthy: the
    record's ``replace.newcomer``, seed 955084) while the remediation worked, is one the
    ladder does not cure (drawn ``never`` or beyond its strongest rung), or has no drawn cure (a Resource
    Health, DCGM or NAP fault: the simulator decides), or struck while the repair was being verified; or this
    fault struck during the verification, after the ladder's last action (:func:`_after_the_last_rung`)."""
    ladder = _ladder(evidence)
    unmanaged = {(p.cluster, p.name) for p in evidence.scenario.pools if not p.managed}
    if (fault.cluster, fault.pool) in unmanaged:
        # An unmanaged pool's GPUs show only under a device plugin the team runs (sim/kube/machines.py
        # ``_apply_gpu_resources``); the soak runs none, so no repair there can verify "GPUs allocatable".
        return True
    for flap in evidence.scenario.flapping:
        # A flapping condition is resolved among the pool's nodes at each flip (sim/scenario.py), so after a
        # replacement it may land on the new node while the repair is verified (seed 950062).
        begin = evidence.start + float(flap["start"])
        end = begin + float(flap["period_s"]) * int(flap["flips"])
        if (flap["cluster"], flap["pool"]) == (fault.cluster, fault.pool) and begin <= rec.updated_at and \
                end >= rec.created_at:
            return True
    if _after_the_last_rung(rec, fault):
        return True
    rep = rec.data.get("replace") if isinstance(rec.data.get("replace"), Mapping) else {}
    nodes = {fault.node, str(rec.data.get("target") or ""), str((rep or {}).get("replacement") or ""),
             str((rep or {}).get("newcomer") or "")} - {""}  # newcomer: the node that came up not healthy
    for other in faults:
        if other.cluster != fault.cluster or other.node not in nodes:
            continue
        if other.source != "npd" or other.cure == "never" or _beyond(other.cure, ladder):
            return True
        if other is not fault and rec.created_at <= other.at <= rec.updated_at:
            return True
    return _cure_drawn_again(evidence, fault, nodes, rec, ladder)


def _cure_drawn_again(evidence: Evidence, fault: Fault, nodes: set[str], rec: Any, ladder: list[str]) -> bool:
    """Whether a flip on a condition already True (no new fault) drew the cure of a node of ``rec`` again: while
    the remediation worked, or before it to a cure its ladder lacks, since that condition last cleared. The
    simulator's ``set_condition`` replaces the node's repair plan at every True flip (sim/kube/nodes.py; soak
    seed 960143: a fault drawn "reimage" came back after the reimage)."""
    flips = sorted((f for f in evidence.oracles.get("flips") or []
                    if f.get("cluster") == fault.cluster and str(f.get("node")) in nodes), key=lambda f: float(f["t"]))
    for i, flip in enumerate(flips):
        t = float(flip["t"])
        if flip.get("status", "True") != "True" or t > rec.updated_at:
            continue
        if (str(flip.get("node")), flip.get("type")) == (fault.node, fault.what) and abs(t - fault.at) < 1.0:
            continue  # the fault's own flip
        if rec.created_at <= t:
            return True
        cleared = any(later.get("status") == "False" and (later.get("node"), later.get("type")) ==
                      (flip.get("node"), flip.get("type")) and float(later["t"]) <= rec.created_at
                      for later in flips[i + 1:])
        cure = str(flip.get("fixed_by") or "")
        if not cleared and (cure == "never" or _beyond(cure, ladder)):
            return True
    return False


def _cured_by_a_repair(evidence: Evidence, fault: Fault, rec: Any, true_now: set[str]) -> bool:
    """Whether a VM repair that cures ``fault`` (the simulator's ``repairs`` oracle: a restart or reimage of its
    node, at least as strong as the fault's drawn cure: sim/kube/nodes.py ``_repair``) came between the onset and
    the release of ``rec``, and the condition is not True on the node now. A remediation whose earlier rung cured
    this condition, and which found the node healthy before its next rung (another condition that failed the
    verification had cleared meanwhile), is released, not done (soak seed 963316).

    A DCGM XID, or an ECC storm on memory that is not failing, is cured by any reboot of its node: the reboot
    reloads the driver and resets the last-XID gauge and the volatile counts (sim/prometheus/api.py ``reboot``;
    sim/prometheus/dcgm.py's docstring), and only a failing memory errs again. Soak seed 966699: a restart for
    XID 79, an NPD fault that struck during its verification sent the remediation on to the replace, and the
    re-read before the replace found the XID gone and the node healthy: released, the XID repaired by the restart."""
    if fault.source == "dcgm":
        if not fault.what.startswith(("XID", "ECC storm")) or fault.what.endswith("(failing memory)"):
            return False
        cure = RUNGS[0]
    elif fault.source != "npd" or fault.cure not in RUNGS or fault.what in true_now:
        return False
    else:
        cure = fault.cure
    return any((r.get("cluster"), r.get("node")) == (fault.cluster, fault.node) and r.get("rung") in RUNGS
               and RUNGS.index(str(r["rung"])) >= RUNGS.index(cure) and fault.at < float(r["t"]) <= rec.updated_at
               for r in evidence.oracles.get("repairs") or [])


def _after_the_last_rung(rec: Any, fault: Fault) -> bool:
    """Whether ``fault`` struck while ``rec`` was verifying a repair, with no rung acting after it: the ladder
    never ran for it (it made the verification fail, and the remediation ended on it; seed 952067: a
    device-plugin repair's verification met a DCGM-services fault that struck 27 s into it)."""
    lines = [(float(h.get("at") or 0.0), str(h.get("state") or "")) for h in rec.history or []]
    verifying = any(state == "verifying" and at <= fault.at for at, state in lines)
    acted_after = any(state == "repairing" and at > fault.at for at, state in lines)
    return rec.created_at < fault.at <= rec.updated_at and verifying and not acted_after


def _handed_back_before(evidence: Evidence, rec: Any, fault: Fault) -> bool:
    """Whether the node was uncordoned after ``rec`` began and before ``fault`` struck: a remediation lifts its
    cordon only as its last act (verified, released, or stopping because someone else uncordoned it:
    shared/remediation/steps.py, drain_step.py), so a fault after that is a new one for the sweep, whatever the
    record's save says later (soak seed 964530: a reimage verified and uncordoned the node at t+153 s, its host
    died before the save, a DCGM-services fault struck at t+240 s, and the record was saved ``done`` by the
    recovering run at t+269 s; the sweep met the new fault and the breaker refused it). The sampler sees an
    uncordon between two of its steps, so it counts only when the step before it came after the record began."""
    return any((str(u["cluster"]), str(u["node"])) == (fault.cluster, fault.node)
               and float(u["prev_t"]) >= rec.created_at and float(u["t"]) <= fault.at for u in evidence.uncordons)


def judge(evidence: Evidence, fault: Fault, *, causes: list[Cause] | None = None,
          conditions: Mapping[tuple[str, str], set[str]] | None = None, faults: list[Fault] | None = None) -> Outcome:
    """Where ``fault`` ended (see the module docstring); ``faults``: every genuine fault of the run."""
    causes = injected_causes(evidence) if causes is None else causes
    conditions = _node_conditions(evidence) if conditions is None else conditions
    key = (fault.cluster, fault.node)
    present = key in conditions
    rems = sorted((r for r in evidence.records.get("remediation", [])
                   if (_cluster_name(str(r.data.get("cluster", ""))), str(r.data.get("node", ""))) == key
                   and r.updated_at >= fault.at and not _handed_back_before(evidence, r, fault)),
                  key=lambda r: (r.created_at, r.id))
    if rems:
        # The remediation of this very condition speaks for it, when there is one: a later one for another
        # condition on the node (released because that one cleared) says nothing of this fault (seed 953189).
        own = [r for r in rems if str(r.data.get("condition") or "") == fault.what]
        last = (own or rems)[-1]
        why = reason(last)
        if last.state == "done":
            again = any(o is not fault and (o.cluster, o.node, o.what) == (fault.cluster, fault.node, fault.what)
                        and o.at > fault.at for o in faults or [])  # a later fault of its own answers for the end
            if fault.source == "npd" and present and fault.what in conditions[key] and not again:
                return Outcome(fault, "lost", "done", f"remediation {last.id} is done but {fault.what} is still "
                                                     "True on the node", "none")
            return Outcome(fault, "repaired", f"remediation {last.state}", why, "")
        if last.state == "released":
            if fault.cleared_at is not None or not present or re.search(CLEARED, why, flags=re.IGNORECASE):
                return Outcome(fault, "cleared", "remediation released", why, "cleared")
            if _cured_by_a_repair(evidence, fault, last, conditions[key]):
                return Outcome(fault, "repaired", "remediation released", why, "")
            return Outcome(fault, "handed-over", "remediation released", why, _explained(why, causes))
        if last.state in GIVEN_UP:
            cause = _explained(why, causes)
            if cause == "not cured by the ladder" and not _uncurable(evidence, fault, last, faults or [fault]):
                return Outcome(fault, "handed-over", f"remediation {last.state}", f"{why} (yet the ladder "
                               f"{','.join(_ladder(evidence))} cures a fault fixed by {fault.cure}, and no other "
                               "fault struck the node meanwhile)", "none")
            return Outcome(fault, "handed-over", f"remediation {last.state}", why, cause)
        return Outcome(fault, "in-progress", f"remediation {last.state}", why, "in progress")
    if fault.cleared_at is not None:
        return Outcome(fault, "cleared", "condition cleared", "", "cleared")
    if _overwritten(evidence, fault):
        return Outcome(fault, "cleared", "XID overwritten before its window confirmed it", "", "overwritten")
    if _contested(evidence, fault):
        return Outcome(fault, "handed-over", "contested by forged series", "a forged copy of the node's series "
                       "disagrees with the exporter's: never acted on, reported as SeriesRefused (contested)",
                       "forged series")
    held = _held_for_an_operator(evidence, fault, causes)
    if held is not None:
        return held
    if not present:
        return Outcome(fault, "cleared", "node left the fleet", "", _left(evidence, fault, causes))
    if fault.source == "npd" and fault.what not in conditions[key]:
        return Outcome(fault, "cleared", "condition no longer True", "", "cleared")
    refusals = sorted((r for r in evidence.records.get("dedupe", []) if r.id.startswith("refused-")
                       and str(r.data.get("node") or "") == fault.node and r.created_at >= fault.at - 1),
                      key=lambda r: r.created_at)
    if refusals:
        return _refused(evidence, fault, refusals[-1], causes)
    for rec in evidence.records.get("pending-fault", []):
        if str(rec.data.get("node") or "") == fault.node:
            return Outcome(fault, "kept", f"pending-fault ({rec.data.get('code')})", str(rec.data.get("reason") or ""),
                           "kept")
    for event in evidence.published:
        data = event.get("data") or {}
        if event.get("type") == "Steward.Remediation.PendingDropped" and str(data.get("node") or "") == fault.node:
            why = str(data.get("reason") or "")
            kind = "cleared" if data.get("reason_code") == "cleared" else "handed-over"
            return Outcome(fault, kind, f"dropped ({data.get('reason_code')})", why,
                           "cleared" if kind == "cleared" else _explained(why, causes))
    from shared.remediation import decisions

    for rec in evidence.records.get(decisions.KIND, []):
        if str(rec.data.get("node") or "") == fault.node and rec.updated_at >= fault.at - 1:
            code = str(rec.data.get("code") or "")
            return Outcome(fault, "handed-over", f"skipped ({code})", code, _explained(code, causes))
    return Outcome(fault, "lost", "nothing", "no remediation, refusal, kept row or drop names it", "none")


def _overwritten(evidence: Evidence, fault: Fault) -> bool:
    """A DCGM XID the exporter's gauge replaced with a later XID before the app's window re-check could confirm
    it: ``DCGM_FI_DEV_XID_ERRORS`` holds the last XID only, and a fault is admitted only once every sample of
    the window shows it (shared/remediation/dcgm_recheck.py; soak seed 950079, XID 79 then XID 31 62 s later).
    The steward's design, resisting forged series, loses such an XID: counted as cleared by its source, and
    shown as ``overwritten`` in the outcome table (a limit, not a repair). An ECC storm is the same: of its
    counters, the managed exporter's default CSV exports only the XID gauge (XID 48; the DBE counters and the
    pending remap are not in it: shared/remediation/dcgm_provenance.py ``DEFAULT_CSV_COUNTERS``), so a later XID
    on the node overwrites the storm's only trace (soak seed 961562: XID 43 55 s after a storm). An XID
    replaced after a window confirmed it is not this: the app still acts on it (shared/remediation/
    dcgm_recheck.py ``masked``; soak seed 964797), and the oracle still asks that it does."""
    from soak.signals import DCGM_CONFIRM_S

    if fault.source != "dcgm" or not fault.what.startswith(("XID", "ECC storm")):
        return False
    return any(a.get("kind") == "dcgm-xid" and a.get("ok") and (str(a.get("cluster")), str(a.get("node"))) ==
               (fault.cluster, fault.node) and fault.at < float(a["t"]) <= fault.at + DCGM_CONFIRM_S
               for a in evidence.actions)


def _contested(evidence: Evidence, fault: Fault) -> bool:
    """A DCGM fault on a node that forged series also name: the copies disagree, so the window re-check holds
    the fault back ("every sample and copy", shared/remediation/dcgm.py ``_confirmed``) and the steward
    reports ``contested`` in a ``Steward.Signal.SeriesRefused`` event (soak seed 950133: an ECC storm on a node
    a tenant's PodMonitor series named). The anti-forgery design lets a forger hold back a genuine DCGM fault
    on a node it names (its NPD conditions still act): shown as a hand-over, for a cause the scenario
    injected, and named in the outcome table."""
    from soak.forgeries import FORGE_ALIAS, FORGE_SERIES

    if fault.source != "dcgm":
        return False
    named = any(a.get("kind") in (FORGE_SERIES, FORGE_ALIAS) and a.get("ok") and str(a.get("node")) == fault.node
                for a in evidence.actions)
    reported = any(e.get("type") == "Steward.Signal.SeriesRefused" and (e.get("data") or {}).get("code") == "contested"
                   for e in evidence.published)
    return named and reported


def _held_for_an_operator(evidence: Evidence, fault: Fault, causes: list[Cause]) -> Outcome | None:
    """A fault on a node an earlier remediation already handed to an operator (it gave up or was blocked and
    left the node cordoned), or that a blocked migration of its pool holds cordoned: the node is out of
    service and the operator's already; nothing is admitted on it until they act (soak seed 2: a second XID
    79 on a node held after a drain the PDBs refused)."""
    node = next((n for n in evidence.nodes.get(fault.cluster, []) if str(n["metadata"]["name"]) == fault.node), None)
    if node is None or not node["spec"].get("unschedulable"):
        return None
    for mig in evidence.records.get("migration", []):
        # The node's pool is being replaced: the migration cordoned it to drain it, the sweep leaves a node
        # cordoned by someone else alone, and a migration blocked (its drain stalled, seed 952125) waits for an
        # operator with the node still cordoned.
        if mig.state == "blocked" and str(mig.data.get("cluster_name") or "") == fault.cluster and \
                fault.node in (mig.data.get("cordoned") or []):
            why = reason(mig)
            return Outcome(fault, "handed-over", f"node held by migration {mig.id} ({mig.state})", why,
                           _explained(why, causes))
    earlier = sorted((r for r in evidence.records.get("remediation", [])
                      if (_cluster_name(str(r.data.get("cluster", ""))), str(r.data.get("node", ""))) ==
                      (fault.cluster, fault.node) and r.state in GIVEN_UP), key=lambda r: r.created_at)
    if not earlier:
        return None
    why = reason(earlier[-1])
    return Outcome(fault, "handed-over", f"node held by remediation {earlier[-1].id} ({earlier[-1].state})", why,
                   _explained(why, causes))


def _refused(evidence: Evidence, fault: Fault, rec: Any, causes: list[Cause]) -> Outcome:
    """The latest refusal is the last word on a fault nothing admitted later.

    A refusal a person must lift (a trust check, an opt-out), the breaker and the pause hand the fault to an
    operator. One that passes by itself (a budget, a cooldown, an attempts window) is a hand-over only while
    what it waits for is held by someone's decision at the end: a node of the same pool (the fleet, for the
    fleet-wide budget) still cordoned; otherwise the limit passed and the fault should have been admitted.
    """
    from shared.remediation import budget
    from shared.remediation.pending_faults import passes

    code = str(rec.data.get("reason_code") or "")
    why = str(rec.data.get("reason") or code)
    how = f"refused ({code})"
    if not passes(code):
        return Outcome(fault, "handed-over", how, why, _explained(f"{code} {why}", causes))
    if code in (budget.BREAKER, budget.PAUSED):
        return Outcome(fault, "handed-over", how, why, "breaker" if code == budget.BREAKER else "paused")
    pool = evidence.node_pools.get((fault.cluster, fault.node), fault.pool)
    held = sorted(f"{c}/{name}" for c, nodes in evidence.nodes.items() for n in nodes
                  if n["spec"].get("unschedulable") and (name := str(n["metadata"]["name"])) != fault.node
                  and (code == budget.FLEET_BUDGET or (c == fault.cluster and (
                      code == budget.CLUSTER_BUDGET or evidence.node_pools.get((c, name)) == pool))))
    if held:
        return Outcome(fault, "handed-over", how, f"{why}; still held by {', '.join(held)}", "budget")
    return Outcome(fault, "lost", how, f"refused ({code}: {why}) and never admitted, though nothing holds that "
                                      "limit at the end", "none")


def _left(evidence: Evidence, fault: Fault, causes: list[Cause]) -> str:
    """Why a node with no remediation of its own is gone: its pool migrated, a NAP node consolidated, or
    another remediation replaced it."""
    for rec in evidence.records.get("migration", []):
        if str(rec.data.get("pool", "")) == fault.pool:
            return "pool migrated"
    if fault.source == "nap":
        return "pool migrated"
    return _explained("no longer exists", causes)


# --------------------------------------------------------------------------- migrations


def judge_migrations(evidence: Evidence, causes: list[Cause]) -> list[tuple[Any, str, str]]:
    """(record, outcome, cause) for every migration record the app wrote."""
    out = []
    for rec in evidence.records.get("migration", []):
        if rec.state == "done":
            out.append((rec, "done", ""))
        elif rec.state in ("blocked", "rolled_back"):
            out.append((rec, rec.state, _explained(reason(rec), causes)))
        else:
            out.append((rec, rec.state, "in progress"))
    return out


# --------------------------------------------------------------------------- the invariant and the table


def outcomes(evidence: Evidence) -> list[Outcome]:
    causes = injected_causes(evidence)
    conditions = _node_conditions(evidence)
    faults = genuine_faults(evidence)
    return [judge(evidence, f, causes=causes, conditions=conditions, faults=faults) for f in faults]


def check_fault_liveness(evidence: Evidence) -> list[Violation]:
    out = []
    for o in outcomes(evidence):
        if o.kind == "lost":
            out.append(Violation("fault-liveness", f"{o.fault.label} at t+{o.fault.at - evidence.start:.0f}s "
                                                   f"(cure: {o.fault.cure or 'as simulated'}): lost: {o.why}"))
        elif o.cause == "none":
            out.append(Violation("fault-liveness", f"{o.fault.label} at t+{o.fault.at - evidence.start:.0f}s ended "
                                                   f"{o.how} with a reason no injected cause explains: {o.why[:240]}"))
    causes = injected_causes(evidence)
    for rec, state, cause in judge_migrations(evidence, causes):
        if cause == "none":
            out.append(Violation("migration-liveness", f"migration {rec.id} ({rec.data.get('pool')}) ended {state} "
                                                       f"with a reason no injected cause explains: "
                                                       f"{reason(rec)[:240]}"))
    return out


def outcome_table(evidence: Evidence) -> Counter[str]:
    """``"<source> fault, cured by <cure>: <outcome> (<cause>)"`` -> count, for the soak's summary."""
    table: Counter[str] = Counter()
    for o in outcomes(evidence):
        cure = o.fault.cure or "as simulated"
        cause = f" ({o.cause})" if o.cause else ""
        table[f"{o.fault.source} fault, cure {cure}: {o.kind}{cause}"] += 1
    for _, state, cause in judge_migrations(evidence, injected_causes(evidence)):
        table[f"migration: {state}{f' ({cause})' if cause else ''}"] += 1
    return table

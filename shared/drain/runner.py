"""The one drain runner: advances a batch of nodes by one step, through the Eviction API only.

Both jobs drain with it: remediation a batch of one node, a migration a batch of a pool's nodes.
One call of :func:`advance_drain`

1. lists each node's pods (or takes them as the caller already listed them), and every
   PodDisruptionBudget when the drain of some node starts or a budget is refusing one of its pods
   (:func:`fetch_pdbs`: a pod under two PDBs is refused up front; a stall report names the budget);
2. runs :func:`shared.drain.state.drain_step` per node: which pods to evict now, or the node's end;
3. when no node is refused or stalled (one node that cannot be drained stops the whole batch:
   nothing more is disrupted for a job that is about to stop), sends the batch's evictions
   together, longest grace period first across the batch (the drain lasts as long as its slowest
   pod), a few at a time (:func:`shared.drain.parallel.bounded_map`). A 404 means the pod is gone;
   a 429 raised as :class:`~shared.kernel.errors.Throttled` is a refusal for now, asked again after
   its Retry-After -- as ``kubectl drain`` does (staging/src/k8s.io/kubectl/pkg/drain/drain.go,
   ``evictPods``: ``IsNotFound`` -> done, ``IsTooManyRequests`` -> wait and retry);
4. folds every answer back in (:func:`shared.drain.state.record_eviction`) and returns a
   :class:`DrainRound`: each node's state before and after, the batch's outcome, when to look again,
   the messages for the operator, and which nodes started or stopped draining in this round, so the
   caller publishes its own events in its own words.

No record is read or written here: the caller stores :meth:`DrainRound.states` in its record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.drain.parallel import WORKERS, bounded_map
from shared.drain.settings import DrainSettings
from shared.drain.state import (
    DRAINED,
    REFUSED,
    STALLED,
    STOPPED,
    TIMED_OUT,
    DrainOutcome,
    DrainState,
    Evict,
    drain_step,
    grace_of,
    record_eviction,
)
from shared.kernel.errors import NotFound, StewardError, Throttled
from shared.kernel.ports import EVICTION_BLOCKED, EVICTION_GONE, EvictionResult, KubePort, PodView

DEADLINE_KEY = "_deadline"  # DrainState.messages: the deadline note, not a pod's


@dataclass(frozen=True)
class NodeDrain:
    """One node of a round: its drain state before and after, and how many evictions were sent."""

    node: str
    previous: DrainState
    state: DrainState
    sent: int = 0

    @property
    def started(self) -> bool:
        """The node's first evictions went out in this round."""
        return self.sent > 0 and self.previous.started_at is None

    @property
    def stopped(self) -> bool:
        """The node's drain was refused or stalled in this round (not in an earlier one)."""
        return self.state.outcome in STOPPED and self.previous.outcome != self.state.outcome

    def new_messages(self) -> list[str]:
        """The operator messages this round added or changed (a budget refusal, a stuck pod...)."""
        return [m for k, m in self.state.messages.items() if k != DEADLINE_KEY and self.previous.messages.get(k) != m]


@dataclass(frozen=True)
class DrainRound:
    """What one :func:`advance_drain` did to a batch of nodes.

    ``outcome``: ``drained`` once every node is; else the first of ``refused``, ``stalled``,
    ``timed_out`` among the nodes; else ``DRAINING``. ``wake_at``: the earliest time a node still
    draining asked to be looked at again (None when none did). ``messages``: what stopped a node
    first (``node: reason``), then every node's pod messages (``ns/name: message``).
    """

    nodes: Mapping[str, NodeDrain]
    outcome: DrainOutcome
    wake_at: float | None
    messages: tuple[str, ...]
    started: tuple[str, ...]
    stopped: tuple[str, ...]

    def states(self) -> dict[str, dict[str, Any]]:
        """Each node's drain state as its record stores it (:meth:`DrainState.to_data`)."""
        return {name: n.state.to_data() for name, n in self.nodes.items()}

    @property
    def reason(self) -> str:
        """What stopped the drain (the first node's reason), "" while it goes on."""
        return next((n.state.reason for n in self.nodes.values() if n.state.reason), "")


def fetch_pdbs(kube: KubePort) -> list[Mapping[str, Any]] | None:
    """Every PodDisruptionBudget of the cluster, or ``None`` when they cannot be read now.

    Best effort: the Eviction API enforces the budgets on its own; the list only lets the drain
    refuse a pod under two PDBs before evicting anything and name the budget when it stalls.
    """
    try:
        return list(kube.list_pdbs())
    except StewardError:
        return None


def send_eviction(kube: KubePort, action: Evict) -> EvictionResult:
    """One Eviction API call, its NotFound (the pod is gone) and Throttled (asked again after its
    Retry-After) answers folded into the :class:`EvictionResult` the drain state understands."""
    try:
        return kube.evict(action.namespace, action.name, grace_period_seconds=action.grace_period_seconds)
    except NotFound:
        return EvictionResult(outcome=EVICTION_GONE)
    except Throttled as exc:
        return EvictionResult(outcome=EVICTION_BLOCKED, message=str(exc), retry_after=exc.retry_after)


def advance_drain(kube: KubePort, nodes: Sequence[str], *, previous: Mapping[str, DrainState], now: float,
                  settings: DrainSettings, pods: Mapping[str, Sequence[PodView]] | None = None,
                  workers: int = WORKERS) -> DrainRound:
    """One step of the drain of ``nodes`` (see the module docstring); ``previous`` holds each node's
    state from the last round (a node missing from it starts now), ``pods`` each node's pods when the
    caller already listed them in this step."""
    names = list(dict.fromkeys(nodes))
    listed = ([list(pods[n]) for n in names] if pods is not None
              else bounded_map(lambda n: kube.list_pods(node_name=n), names, workers=workers, name="drain-list"))
    before = {n: previous.get(n) or DrainState() for n in names}
    # PDBs are read when a drain starts (a pod under two PDBs refuses its node before any eviction)
    # and while a budget refuses a pod (the stall report names the PDB and its status).
    need_pdbs = any(p.started_at is None or p.blocked for p in before.values())
    pdbs = fetch_pdbs(kube) if need_pdbs else None
    after: dict[str, DrainState] = {}
    todo: list[tuple[str, Evict]] = []
    for name, found in zip(names, listed, strict=True):
        state, actions = drain_step(node=name, pods=found, previous=before[name], now=now, settings=settings, pdbs=pdbs)
        after[name] = state
        todo += [(name, a) for a in actions]
    if any(s.outcome in STOPPED for s in after.values()):
        todo = []  # the batch stops as a whole: nothing more is disrupted for a drain that cannot finish
    by_uid = {p.uid: p for found in listed for p in found}
    todo.sort(key=lambda item: -grace_of(by_uid[item[1].uid]) if item[1].uid in by_uid else 0)  # stable: per node too
    answers = bounded_map(lambda item: send_eviction(kube, item[1]), todo, workers=workers, name="evict")
    sent: dict[str, int] = {}
    for (name, action), result in zip(todo, answers, strict=True):
        pod = by_uid.get(action.uid)
        after[name] = record_eviction(after[name], action, result, now=now,
                                      grace=pod.grace_period_seconds if pod else None, settings=settings)
        sent[name] = sent.get(name, 0) + 1
    per_node = {n: NodeDrain(node=n, previous=before[n], state=after[n], sent=sent.get(n, 0)) for n in names}
    return DrainRound(nodes=per_node, outcome=_outcome([s.outcome for s in after.values()]),
                      wake_at=min((s.wake_at for s in after.values() if s.wake_at is not None), default=None),
                      messages=tuple(_messages(per_node.values())),
                      started=tuple(n for n, d in per_node.items() if d.started),
                      stopped=tuple(n for n, d in per_node.items() if d.stopped))


def _outcome(outcomes: Sequence[DrainOutcome]) -> DrainOutcome:
    if all(o == DRAINED for o in outcomes):
        return DRAINED
    return next((o for o in (REFUSED, STALLED, TIMED_OUT) if o in outcomes), DrainOutcome.DRAINING)


def _messages(nodes: Iterable[NodeDrain]) -> list[str]:
    reasons = [f"{n.node}: {n.state.reason}" for n in nodes if n.state.reason]
    pods = [f"{k}: {v}" for n in nodes for k, v in n.state.messages.items() if k != DEADLINE_KEY]
    return reasons + pods

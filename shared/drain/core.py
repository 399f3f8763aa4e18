"""compatibility for the remediation package until it moves to shared.drain.runner; delete then.

The drain now lives in :mod:`shared.drain.settings`, :mod:`shared.drain.filters`,
:mod:`shared.drain.state`, :mod:`shared.drain.parallel` and :mod:`shared.drain.runner`. This module
keeps exactly the names ``shared.remediation.core`` uses, with their old ``policy=`` keyword: any
object with :class:`shared.drain.settings.DrainSettings`' attribute names will do (remediation
passes its RemediationPolicy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.drain import filters, parallel, state
from shared.drain.filters import DrainPlan
from shared.drain.runner import fetch_pdbs
from shared.drain.settings import DrainRules
from shared.drain.state import DRAINED, REFUSED, STALLED, TIMED_OUT, DrainState, Evict
from shared.kernel.ports import EvictionResult, PodView

__all__ = ["DRAINED", "REFUSED", "STALLED", "TIMED_OUT", "DrainPlan", "DrainState", "Evict", "drain_step",
           "evict_all", "fetch_pdbs", "plan_drain", "record_eviction"]


def plan_drain(pods: Sequence[PodView], policy: DrainRules, *, now: float | None = None,
               pdbs: Sequence[Mapping[str, Any]] | None = None) -> DrainPlan:
    return filters.plan_drain(pods, policy, now=now, pdbs=pdbs)


def drain_step(*, node: str, pods: Sequence[PodView], previous: DrainState, now: float, policy: DrainRules,
               pdbs: Sequence[Mapping[str, Any]] | None = None) -> tuple[DrainState, list[Evict]]:
    return state.drain_step(node=node, pods=pods, previous=previous, now=now, settings=policy, pdbs=pdbs)


def record_eviction(drain_state: DrainState, action: Evict, result: EvictionResult, *, now: float,
                    grace: int | None, policy: DrainRules) -> DrainState:
    return state.record_eviction(drain_state, action, result, now=now, grace=grace, settings=policy)


def evict_all(evict: Callable[[Evict], EvictionResult], actions: Sequence[Evict]) -> list[tuple[Evict, EvictionResult]]:
    return list(zip(actions, parallel.bounded_map(evict, actions, name="evict"), strict=True))

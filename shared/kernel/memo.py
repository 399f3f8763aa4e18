"""Small per-process caches with a time-to-live and a size cap.

A worker process serves many invocations; a few reads are worth remembering between them (a
cluster's tags for the pause check, the verdict of :mod:`shared.fleet.node_truth` on a node, the
faults already measured by the sweep). Each lives in :class:`Caches` on the context, typed and
named, rather than in a free-form dictionary; time comes from the context's clock, so tests and the
simulator age these caches as fast as they run the fleet.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class TtlCache(Generic[K, V]):
    """Values remembered for ``ttl_s`` seconds of the caller's clock, at most ``cap`` of them.

    When full, expired entries go first, then the oldest half: a crude bound that keeps the cost of
    one put constant on average and never lets the cache grow with the fleet.
    """

    ttl_s: float
    cap: int = 4096
    _entries: dict[K, tuple[float, V]] = field(default_factory=dict)

    def get(self, key: K, *, now: float) -> V | None:
        hit = self._entries.get(key)
        if hit is None or now - hit[0] >= self.ttl_s:
            return None
        return hit[1]

    def put(self, key: K, value: V, *, now: float) -> V:
        if len(self._entries) >= self.cap and key not in self._entries:
            stale = [k for k, (at, _) in self._entries.items() if now - at >= self.ttl_s]
            for k in stale or list(self._entries)[: self.cap // 2]:
                del self._entries[k]
        self._entries[key] = (now, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class Caches:
    """The caches one worker process keeps between invocations (see each field for why it is safe)."""

    #: cluster id -> its ARM tags, for the pause tag; a minute old at most.
    cluster_tags: TtlCache[str, Mapping[str, str]] = field(default_factory=lambda: TtlCache(ttl_s=60.0))
    #: everything a node_truth verdict depends on -> the verdict. Admission only cordons on it, and
    #: every VM action reads ARM again right before the call.
    node_verdicts: TtlCache[tuple[str, ...], Any] = field(default_factory=lambda: TtlCache(ttl_s=60.0, cap=5000))
    #: (subscription, node resource group), lower-cased -> the id of the in-scope cluster whose node resource
    #: group it is ("" when none is). Only narrows the search for a Resource Health event's VM: the cluster is
    #: read again (and its scope judged afresh) before anything is decided (shared.remediation.health_events).
    health_vm_clusters: TtlCache[tuple[str, str], str] = field(default_factory=lambda: TtlCache(ttl_s=300.0, cap=2000))
    #: fault id -> when the sweep first measured its time to detect (measured once per fault).
    reported_faults: TtlCache[str, float] = field(default_factory=lambda: TtlCache(ttl_s=7 * 86400.0, cap=10_000))
    #: decision row id -> when it was written (or found): a skip already recorded costs no write. A day at
    #: most, shorter than the row's retention, so an expired row is written again while the skip lasts.
    recorded_decisions: TtlCache[str, float] = field(default_factory=lambda: TtlCache(ttl_s=86400.0, cap=10_000))

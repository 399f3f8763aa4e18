"""The one bounded parallel map: per-node and per-pod API calls, a few at a time.

A step's length is what a drain's critical path pays for: with 100 pods on a node, evicting one
after another would add the round trips of all of them to the longest grace period, and listing
the pods of a batch of nodes one node at a time adds up the same way. Each call is still one
idempotent request, so a step cut short by a crash is simply taken again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

WORKERS = 8
"""Calls in flight at once: below the Kubernetes client's connection pool (urllib3's default of 5 per
CPU, kubernetes-client/python ``Configuration.connection_pool_maxsize``), so no call queues for a socket."""

_T = TypeVar("_T")
_R = TypeVar("_R")


def bounded_map(fn: Callable[[_T], _R], items: Sequence[_T], *, workers: int = WORKERS,
                name: str = "steward") -> list[_R]:
    """``[fn(i) for i in items]`` with at most ``workers`` calls in flight; the answers in the items' order.

    Every call finishes before this returns (no request outlives the step). When calls raised, the
    first error in the items' order is raised once all are done: the step is retried from what it
    re-observes, so a pod already evicted is then seen terminating and waited for, never evicted
    twice by mistake.
    """
    if len(items) <= 1 or workers <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix=name) as pool:
        futures = [pool.submit(fn, i) for i in items]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [f.result() for f in futures]

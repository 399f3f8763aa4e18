"""The adapters, the write gate wrapped around them, and the in-memory fakes accept every argument their ports declare.

A port method that gains a keyword (``uid=`` on ``delete_object``) must gain it in the real adapter
and in the gate's wrapper too: the unit fakes would accept it and the first real call would be a
TypeError at 3 a.m. Checked with ``inspect.signature``: every parameter of the port is accepted by
the implementation (same name and position, or a ``**kwargs`` that forwards it), and the
implementation requires nothing more. A method the gate does not wrap must be one it passes through
as a read. The fakes of tests/fakes are held to the same ports, so a test that passes against a fake
cannot be calling it in a way the real adapter refuses.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from shared.adapters.aks import AksClient
from shared.adapters.compute import ComputeClient
from shared.adapters.events import EventPublisher
from shared.adapters.kube.client import KubeClient
from shared.adapters.ledger import TableLedger
from shared.adapters.nudge_queue import QueueNudger
from shared.fleet import gate
from shared.kernel.ports import AksPort, ComputePort, EventsPort, KubePort, LedgerPort, NudgePort
from tests.fakes.events import RecordingEvents
from tests.fakes.ledger import InMemoryLedger
from tests.fakes.nudge import RecordingNudger

PAIRS = [(KubePort, KubeClient), (KubePort, gate.GatedKube), (AksPort, AksClient), (AksPort, gate.GatedAks),
         (ComputePort, ComputeClient), (ComputePort, gate.GatedCompute),
         (LedgerPort, TableLedger), (LedgerPort, InMemoryLedger), (EventsPort, EventPublisher),
         (EventsPort, RecordingEvents), (NudgePort, QueueNudger), (NudgePort, RecordingNudger)]
P = inspect.Parameter


def _methods(port: type) -> list[str]:
    return sorted(n for n, v in vars(port).items() if callable(v) and not n.startswith("_"))


def refusals(port_fn: Any, impl_fn: Any) -> list[str]:
    """What a call valid for ``port_fn`` could not pass to ``impl_fn``."""
    want = list(inspect.signature(port_fn).parameters.values())
    have = list(inspect.signature(inspect.unwrap(impl_fn)).parameters.values())
    by_name = {p.name: p for p in have}
    var_kw = any(p.kind is P.VAR_KEYWORD for p in have)
    out = []
    for index, p in enumerate(want):
        mine = by_name.get(p.name)
        if p.kind is P.POSITIONAL_OR_KEYWORD:
            if index >= len(have) or have[index].name != p.name:
                out.append(f"positional {p.name!r} is not at position {index}")
        elif mine is None and not var_kw:
            out.append(f"keyword {p.name!r} is not accepted")
    declared = {p.name for p in want}
    out += [f"{p.name!r} is required but the port does not declare it" for p in have
            if p.name not in declared and p.default is P.empty and p.kind not in (P.VAR_KEYWORD, P.VAR_POSITIONAL)]
    return out


@pytest.mark.parametrize(("port", "impl"), PAIRS, ids=[f"{p.__name__}-{i.__name__}" for p, i in PAIRS])
def test_every_port_method_is_callable_the_same_way_on_the_adapter_and_through_the_gate(port: type, impl: type) -> None:
    problems = []
    for name in _methods(port):
        mine = vars(impl).get(name) or getattr(impl, name, None)
        if mine is None:
            if issubclass(impl, gate._Delegating) and (name.startswith(gate._READ_PREFIXES) or name in gate._PASSED):
                continue  # a read: the gate hands the adapter's own method out
            problems.append(f"{impl.__name__}.{name} is missing")
            continue
        problems += [f"{impl.__name__}.{name}: {why}" for why in refusals(getattr(port, name), mine)]
    assert problems == []


def test_the_check_notices_a_wrapper_that_drops_a_keyword() -> None:
    class Port:
        def delete_object(self, kind: str, *, uid: str | None = None) -> None: ...

    class Wrapper:
        def delete_object(self, kind: str) -> None: ...

    class Forwarder:
        def delete_object(self, kind: str, **kwargs: Any) -> None: ...

    assert refusals(Port.delete_object, Wrapper.delete_object) == ["keyword 'uid' is not accepted"]
    assert refusals(Port.delete_object, Forwarder.delete_object) == []

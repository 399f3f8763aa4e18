"""The adapters, the write gate wrapped around them, and the in-memory fakes accept every argument their ports declare.

A port method that gains a keyword (``uid=`` on ``delete_object``) must gain it in the real adapter
and in the gate's wrapper too: the unit fakes would accept it and the first real call would be a
TypeError at 3 a.m. Checked with ``inspect.signature``: every parameter of the port is accepted by
the implementation (same name and position, or a ``**kwargs`` that forwards it), and the
implementation requires nothing more. A method the gate does not wrap must be one it passes through
as a read. The fakes of tests/fakes are held to the same ports, and more strictly (every method, the
port's own parameters and defaults), so a test that passes against a fake cannot be calling it in a way
the real adapter refuses; the job fakes of tests/unit build scenarios over them and implement no port.
"""

from __future__ import annotations

import importlib
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
from shared.kernel.ports import (
    AksPort,
    ClusterAccess,
    ComputePort,
    EventsPort,
    KubePort,
    LedgerPort,
    MetricsPort,
    NudgePort,
)
from tests.fakes.access import FakeAccess
from tests.fakes.aks import FakeAks
from tests.fakes.compute import FakeCompute
from tests.fakes.events import RecordingEvents
from tests.fakes.kube import FakeKube
from tests.fakes.ledger import InMemoryLedger
from tests.fakes.metrics import FakeWorkspace
from tests.fakes.nudge import RecordingNudger

FAKES = [(KubePort, FakeKube), (AksPort, FakeAks), (ComputePort, FakeCompute), (EventsPort, RecordingEvents),
         (LedgerPort, InMemoryLedger), (NudgePort, RecordingNudger), (ClusterAccess, FakeAccess),
         (MetricsPort, FakeWorkspace)]
"""One fake per port (tests/fakes): held to its port's exact signatures, not only to accepting its calls."""
PAIRS = [(KubePort, KubeClient), (KubePort, gate.GatedKube), (AksPort, AksClient), (AksPort, gate.GatedAks),
         (ComputePort, ComputeClient), (ComputePort, gate.GatedCompute),
         (LedgerPort, TableLedger), (EventsPort, EventPublisher), (NudgePort, QueueNudger), *FAKES]
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


def drift(port_fn: Any, fake_fn: Any) -> list[str]:
    """How ``fake_fn``'s parameters differ from ``port_fn``'s: names, order, kinds and defaults (annotations may
    name the fake's own types)."""
    want = [(p.name, p.kind, p.default) for p in inspect.signature(port_fn).parameters.values()]
    have = [(p.name, p.kind, p.default) for p in inspect.signature(inspect.unwrap(fake_fn)).parameters.values()]
    return [] if want == have else [f"{want} != {have}"]


@pytest.mark.parametrize(("port", "fake"), FAKES, ids=[f"{p.__name__}-{f.__name__}" for p, f in FAKES])
def test_each_fake_implements_every_method_of_its_port_with_the_ports_signature(port: type, fake: type) -> None:
    problems = []
    for name in _methods(port):
        mine = getattr(fake, name, None)
        if mine is None or not callable(mine):
            problems.append(f"{fake.__name__}.{name} is missing")
            continue
        problems += [f"{fake.__name__}.{name}: {why}" for why in drift(getattr(port, name), mine)]
    assert problems == []


def test_the_check_notices_a_fake_that_drifts_from_its_port() -> None:
    class Port:
        def acquire_lease(self, name: str, *, holder: str, namespace: str | None = None) -> bool: ...

    class Drifted:
        def acquire_lease(self, name: str, *, holder: str, namespace: str = "kube-node-lease") -> bool: ...

    class Extra:
        def acquire_lease(self, name: str, *, holder: str, namespace: str | None = None, ttl: int = 0) -> bool: ...

    assert drift(Port.acquire_lease, Drifted.acquire_lease) != []
    assert drift(Port.acquire_lease, Extra.acquire_lease) != []
    assert drift(Port.acquire_lease, Port.acquire_lease) == []


@pytest.mark.parametrize("module", ["tests.unit.fakes_remediation", "tests.unit.fakes_migration", "tests.unit.fakes_pool"])
def test_the_job_fakes_only_build_scenarios_over_the_port_fakes(module: str) -> None:
    """A job's fake module defines no class that implements a port method: those live once, in tests/fakes."""
    loaded = importlib.import_module(module)
    port_methods = {name for port, _ in FAKES if port is not ClusterAccess for name in _methods(port)}
    own = [c for c in vars(loaded).values() if inspect.isclass(c) and c.__module__ == module]
    assert [f"{c.__name__}.{n}" for c in own for n in sorted(port_methods & set(vars(c)))] == []
    # a world may offer ``kube(cluster)`` for its tests; handing out every port is the access's job
    assert [c.__name__ for c in own if set(_methods(ClusterAccess)) <= set(vars(c))] == []

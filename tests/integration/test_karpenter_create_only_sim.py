"""Karpenter objects through the real Kubernetes adapter: created create-only, replaced only at a version read
(issue 19, item 3).

Against the fleet simulator's API server (which keeps resourceVersions and answers 409 as Kubernetes
does): ``create_object`` of a NodePool whose name is taken is a Conflict and changes nothing;
``apply_object`` given the ``resourceVersion`` the caller read replaces exactly that version, and a
stale one is a Conflict that leaves the newer object as it is.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from shared.kernel.clock import ManualClock
from shared.kernel.errors import Conflict
from shared.settings import Settings

if importlib.util.find_spec("sim.testing") is None:  # pragma: no cover - only while the simulator is being written
    pytest.skip("the simulator (sim.testing) is not in this checkout", allow_module_level=True)

from sim.testing import SimHandle
from tests.integration.simenv import app_settings, sim_as_the_app

API, KIND = "karpenter.sh/v1", "NodePool"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with sim_as_the_app(scenario="sim/scenarios/default.yaml") as handle:
        yield handle


@pytest.fixture(scope="module")
def kube(sim: SimHandle) -> Any:
    from shared.wiring import FleetAccess

    settings: Settings = app_settings(sim)
    return FleetAccess(settings, clock=ManualClock()).kube(str(sim.cluster("ml-nap")["id"]))


def _nodepool(name: str, owner: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": KIND, "metadata": {"name": name, "annotations": {"owner": owner}},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.azure.com", "kind": "AKSNodeClass",
                                                            "name": name}, "requirements": []}},
                     "limits": {"nvidia.com/gpu": "1"}}}


def _owner(kube: Any, name: str) -> str:
    return str(kube.get_object(API, KIND, name)["metadata"]["annotations"]["owner"])


def test_creating_a_nodepool_whose_name_is_taken_is_a_conflict_and_changes_nothing(kube: Any) -> None:
    kube.create_object(_nodepool("create-only", "someone-else"))
    with pytest.raises(Conflict):
        kube.create_object(_nodepool("create-only", "steward"))
    assert _owner(kube, "create-only") == "someone-else"


def test_a_replace_carries_the_version_read_and_a_stale_one_changes_nothing(kube: Any) -> None:
    kube.create_object(_nodepool("pinned", "steward"))
    read = kube.get_object(API, KIND, "pinned")["metadata"]["resourceVersion"]
    newer = _nodepool("pinned", "someone-else")
    newer["metadata"]["resourceVersion"] = read
    kube.apply_object(newer)  # someone else's change lands first (at the version they read)
    stale = _nodepool("pinned", "steward")
    stale["metadata"]["resourceVersion"] = read
    with pytest.raises(Conflict):
        kube.apply_object(stale)
    assert _owner(kube, "pinned") == "someone-else"
    current = kube.get_object(API, KIND, "pinned")["metadata"]["resourceVersion"]
    fresh = _nodepool("pinned", "steward")
    fresh["metadata"]["resourceVersion"] = current
    kube.apply_object(fresh)
    assert _owner(kube, "pinned") == "steward"

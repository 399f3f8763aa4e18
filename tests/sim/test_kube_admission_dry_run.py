"""Dry runs are admitted and validated like the real request: Pod Security admission refuses a dry-run pod
create as it refuses the real one (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go runs the
admission chain whatever dryRun says), and an Eviction's ``deleteOptions.dryRun`` is validated by the
store's delete (staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete ->
ValidateDeleteOptions). In-process, manual clock."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim.test_kube_eviction_strict import BASE, Sim


@pytest.fixture
def sim() -> Sim:
    return Sim()


def bare_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}}


def test_a_dry_run_pod_create_is_refused_by_pod_security_as_the_real_create_is(sim: Sim) -> None:
    status, _, _ = sim.call("POST", f"{BASE}/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "locked", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    assert status == 201
    path = f"{BASE}/api/v1/namespaces/locked/pods"
    dry_status, dry_body, _ = sim.call("POST", f"{path}?dryRun=All", bare_pod("rooty"))
    real_status, real_body, _ = sim.call("POST", path, bare_pod("rooty"))
    assert real_status == 403
    assert (dry_status, dry_body["reason"], dry_body["message"]) == (403, "Forbidden", real_body["message"])
    assert 'violates PodSecurity "restricted:latest"' in dry_body["message"]
    assert sim.c.get("pods", "locked", "rooty") is None


def test_a_dry_run_pod_create_that_pod_security_admits_is_still_a_201(sim: Sim) -> None:
    status, _, _ = sim.call("POST", f"{BASE}/api/v1/namespaces/default/pods?dryRun=All", bare_pod("loose"))
    assert status == 201 and sim.c.get("pods", "default", "loose") is None


def test_an_eviction_with_an_unsupported_dry_run_in_its_delete_options_is_a_422_and_deletes_nothing(
        sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=3, pdb={"minAvailable": 1})
    before = sim.pdb_status("web")
    victim = sim.live("web")[0]
    rv = victim.meta["resourceVersion"]
    status, body, _ = sim.evict(victim.name, delete_options={"dryRun": ["Foo"]})
    assert status == 422
    assert body["reason"] == "Invalid" and body["details"]["kind"] == "DeleteOptions"
    assert body["message"] == ('DeleteOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: '
                               '[]string{"Foo"}: supported values: "All"')
    assert not victim.terminating and victim.meta["resourceVersion"] == rv
    assert not any(c["type"] == "DisruptionTarget" for c in victim.obj["status"]["conditions"])
    assert sim.pdb_status("web") == before
    assert sim.live("web") and victim in sim.live("web")


def test_an_eviction_with_dry_run_all_in_its_delete_options_still_changes_nothing(sim: Sim) -> None:
    sim.workload(kind="Deployment", name="web", replicas=2)
    victim = sim.live("web")[0]
    status, _, _ = sim.evict(victim.name, delete_options={"dryRun": ["All"]})
    assert status == 201 and not victim.terminating

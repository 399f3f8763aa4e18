"""Nodes through the kubernetes Python client: AKS's node shape, selectors, pagination, patches."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sim.testing import SimHandle, start_sim
from tests.waiting import wait_until

SCENARIO: dict[str, Any] = {
    "seed": 11,
    "clock": {"speed": 20},
    "timings": {"node_ready_s": 2, "pod_start_s": 1},
    "subscriptions": [{"id": "00000000-0000-0000-0000-0000000000n1", "clusters": [{
        "name": "nodes", "resource_group": "rg-nodes", "location": "westus3",
        "tags": {"gpu-fleet-steward": "enabled"},
        "pools": [
            {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 2},
            {"name": "gpu", "vmSize": "Standard_NC8as_T4_v3", "count": 3, "availabilityZones": ["1", "2"],
             "nodeTaints": ["sku=gpu:NoSchedule"], "nodeLabels": {"team": "vision"},
             "gpuProfile": {"driver": "Install", "nvidia": {"managementMode": "Managed"}}},
            {"name": "legacy", "vmSize": "Standard_NC4as_T4_v3", "count": 2, "device_plugin": False},
            {"name": "spot", "vmSize": "Standard_D4s_v5", "count": 1, "scaleSetPriority": "Spot"},
        ]}]}],
}
NAME_RE = re.compile(r"^aks-[a-z][a-z0-9]*-\d{8}-vmss[0-9a-z]{6}$")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(scenario=SCENARIO, seed=11) as handle:
        yield handle


@pytest.fixture(scope="module")
def core(sim: SimHandle) -> client.CoreV1Api:
    return client.CoreV1Api(sim.kube_client("nodes"))


def pool_nodes(core: client.CoreV1Api, pool: str) -> list[Any]:
    return core.list_node(label_selector=f"agentpool={pool}").items


def test_every_node_has_the_aks_name_and_provider_id(core: client.CoreV1Api) -> None:
    nodes = core.list_node().items
    assert len(nodes) == 8
    for n in nodes:
        assert NAME_RE.match(n.metadata.name), n.metadata.name
        vmss, instance = n.metadata.name[:-6], int(n.metadata.name[-6:], 36)
        assert n.spec.provider_id.startswith("azure:///subscriptions/00000000-0000-0000-0000-0000000000n1/"
                                             "resourceGroups/MC_rg-nodes_nodes_westus3/providers/Microsoft.Compute/")
        assert n.spec.provider_id.endswith(f"/virtualMachineScaleSets/{vmss}/virtualMachines/{instance}")


def test_managed_gpu_nodes_carry_labels_taints_gpus_and_npd_conditions(core: client.CoreV1Api) -> None:
    for n in pool_nodes(core, "gpu"):
        labels = n.metadata.labels
        assert labels["kubernetes.azure.com/agentpool"] == "gpu"
        assert labels["kubernetes.azure.com/mode"] == "user"
        assert labels["node.kubernetes.io/instance-type"] == "Standard_NC8as_T4_v3"
        assert labels["kubernetes.azure.com/accelerator"] == "nvidia"
        assert labels["kubernetes.azure.com/dcgm-exporter"] == "enabled"
        assert labels["team"] == "vision"
        assert labels["topology.kubernetes.io/zone"] in ("westus3-1", "westus3-2")
        assert {"key": "sku", "value": "gpu", "effect": "NoSchedule"} in [
            {"key": t.key, "value": t.value, "effect": t.effect} for t in n.spec.taints]
        assert n.status.allocatable["nvidia.com/gpu"] == "1"
        conditions = {c.type: c.status for c in n.status.conditions}
        for t in ("UnhealthyNvidiaDevicePlugin", "UnhealthyNvidiaDCGMServices", "XIDErrors", "GPUMissing"):
            assert conditions[t] == "False"
        assert conditions["Ready"] == "True"


def test_unmanaged_gpu_nodes_without_a_device_plugin_advertise_no_gpus_and_no_npd(core: client.CoreV1Api) -> None:
    for n in pool_nodes(core, "legacy"):
        assert n.metadata.labels["kubernetes.azure.com/accelerator"] == "nvidia"
        assert "kubernetes.azure.com/dcgm-exporter" not in n.metadata.labels
        assert "nvidia.com/gpu" not in n.status.allocatable
        assert "UnhealthyNvidiaDevicePlugin" not in {c.type for c in n.status.conditions}


def test_spot_nodes_are_labelled_and_tainted(core: client.CoreV1Api) -> None:
    (n,) = pool_nodes(core, "spot")
    assert n.metadata.labels["kubernetes.azure.com/scalesetpriority"] == "spot"
    assert any(t.key == "kubernetes.azure.com/scalesetpriority" and t.effect == "NoSchedule" for t in n.spec.taints)


@pytest.mark.parametrize(("selector", "pools"), [
    ("agentpool=gpu", {"gpu"}),
    ("agentpool!=gpu", {"system", "legacy", "spot"}),
    ("agentpool in (gpu, legacy)", {"gpu", "legacy"}),
    ("agentpool notin (gpu,legacy,spot)", {"system"}),
    ("kubernetes.azure.com/dcgm-exporter", {"gpu"}),
    ("!kubernetes.azure.com/accelerator", {"system", "spot"}),
    ("kubernetes.azure.com/accelerator=nvidia,!kubernetes.azure.com/dcgm-exporter", {"legacy"}),
], ids=["equals", "not-equals", "set-in", "set-notin", "exists", "does-not-exist", "combined"])
def test_label_selectors_select_the_right_pools(core: client.CoreV1Api, selector: str, pools: set[str]) -> None:
    nodes = core.list_node(label_selector=selector).items
    assert {n.metadata.labels["agentpool"] for n in nodes} == pools


def test_pagination_returns_every_node_once_from_a_stable_snapshot(core: client.CoreV1Api) -> None:
    first = core.list_node(limit=3)
    assert len(first.items) == 3 and first.metadata._continue
    assert first.metadata.remaining_item_count == 5
    seen = [n.metadata.name for n in first.items]
    core.patch_node(seen[0], {"metadata": {"labels": {"touched": "during-pagination"}}})
    token = first.metadata._continue
    while token:
        page = core.list_node(limit=3, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        seen += [n.metadata.name for n in page.items]
        token = page.metadata._continue
    assert len(seen) == len(set(seen)) == 8
    assert seen == sorted(seen)


def test_a_garbled_continue_token_is_a_400_and_an_unknown_one_is_410(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as bad:
        core.list_node(limit=1, _continue="%%%not-base64")
    assert bad.value.status == 400
    import base64
    import json

    stale = base64.urlsafe_b64encode(json.dumps({"s": "gone", "o": 1}).encode()).decode()
    with pytest.raises(ApiException) as gone:
        core.list_node(limit=1, _continue=stale)
    assert gone.value.status == 410
    assert json.loads(gone.value.body)["reason"] == "Expired"


def test_resource_version_grows_with_every_change(core: client.CoreV1Api) -> None:
    node = pool_nodes(core, "spot")[0]
    before = int(node.metadata.resource_version)
    after = core.patch_node(node.metadata.name, {"metadata": {"annotations": {"sim/test": "rv"}}})
    assert int(after.metadata.resource_version) > before
    assert int(core.list_node().metadata.resource_version) >= int(after.metadata.resource_version)


def test_a_strategic_merge_patch_of_taints_replaces_the_whole_list(core: client.CoreV1Api) -> None:
    # NodeSpec.Taints has no patchMergeKey (k8s.io/api/core/v1/types.go): a strategic merge patch replaces
    # the list, so adding a taint means sending the old ones too (as kubectl taint does).
    name = pool_nodes(core, "gpu")[0].metadata.name
    before = [{"key": t.key, "value": t.value, "effect": t.effect} for t in core.read_node(name).spec.taints or []]
    assert before
    added = core.patch_node(name, {"spec": {"taints": [
        *before, {"key": "steward/remediating", "value": "yes", "effect": "NoSchedule"}]}})
    keys = [(t.key, t.effect) for t in added.spec.taints]
    assert ("steward/remediating", "NoSchedule") in keys
    assert all((t["key"], t["effect"]) in keys for t in before)
    only = core.patch_node(name, {"spec": {"taints": [{"key": "steward/remediating", "effect": "NoSchedule"}]}})
    assert [(t.key, t.effect) for t in only.spec.taints] == [("steward/remediating", "NoSchedule")]
    restored = core.patch_node(name, {"spec": {"taints": before}})
    assert [(t.key, t.effect) for t in restored.spec.taints] == [(t["key"], t["effect"]) for t in before]


def taint_keys(core: client.CoreV1Api, name: str) -> set[str]:
    return {t.key for t in core.read_node(name).spec.taints or []}


def test_cordon_by_patch_sets_unschedulable_and_the_controller_adds_the_taint_after_the_answer(
        core: client.CoreV1Api) -> None:
    """As kube-apiserver v1.37 answers (tests/realkube, story node_patches): the patch's answer has no
    unschedulable taint; the node lifecycle controller's taint pass adds it a moment later."""
    name = pool_nodes(core, "gpu")[1].metadata.name
    cordoned = core.patch_node(name, {"spec": {"unschedulable": True}})
    assert cordoned.spec.unschedulable is True
    assert not any(t.key == "node.kubernetes.io/unschedulable" for t in cordoned.spec.taints or [])
    wait_until(lambda: "node.kubernetes.io/unschedulable" in taint_keys(core, name), timeout=10,
               what="the node lifecycle controller tainting the cordoned node")
    uncordoned = core.patch_node(name, {"spec": {"unschedulable": False}})
    assert not uncordoned.spec.unschedulable
    wait_until(lambda: "node.kubernetes.io/unschedulable" not in taint_keys(core, name), timeout=10,
               what="the node lifecycle controller removing the taint of the uncordoned node")


def test_merge_patch_and_json_patch_change_labels_and_annotations(core: client.CoreV1Api) -> None:
    name = pool_nodes(core, "system")[0].metadata.name
    merge = core.patch_node(name, {"metadata": {"labels": {"merge": "yes"}}},
                            _content_type="application/merge-patch+json")
    assert merge.metadata.labels["merge"] == "yes"
    jp = core.patch_node(name, [{"op": "add", "path": "/metadata/annotations/steward~1owner", "value": "me"}])
    assert jp.metadata.annotations["steward/owner"] == "me"
    dropped = core.patch_node(name, {"metadata": {"labels": {"merge": None}}},
                              _content_type="application/merge-patch+json")
    assert "merge" not in dropped.metadata.labels


def test_status_patch_sets_a_condition_by_type_without_touching_the_others(core: client.CoreV1Api) -> None:
    name = pool_nodes(core, "gpu")[2].metadata.name
    before = {c.type for c in core.read_node_status(name).status.conditions}
    patched = core.patch_node_status(name, {"status": {"conditions": [
        {"type": "StewardRemediation", "status": "True", "reason": "Draining", "message": "draining"}]}})
    after = {c.type: c.status for c in patched.status.conditions}
    assert after["StewardRemediation"] == "True"
    assert before <= set(after)


def test_a_json_patch_that_tests_a_wrong_value_is_refused_with_422(core: client.CoreV1Api) -> None:
    name = pool_nodes(core, "system")[1].metadata.name
    with pytest.raises(ApiException) as e:
        core.patch_node(name, [{"op": "test", "path": "/metadata/name", "value": "someone-else"}])
    assert e.value.status == 422


def test_a_taint_with_a_bad_effect_is_invalid(core: client.CoreV1Api) -> None:
    name = pool_nodes(core, "system")[1].metadata.name
    with pytest.raises(ApiException) as e:
        core.patch_node(name, {"spec": {"taints": [{"key": "x", "effect": "Sometimes"}]}})
    assert e.value.status == 422
    import json

    assert json.loads(e.value.body)["reason"] == "Invalid"


def test_condition_flips_from_the_control_api_show_on_the_node(core: client.CoreV1Api, sim: SimHandle) -> None:
    name = pool_nodes(core, "gpu")[0].metadata.name
    sim.control("POST", "/conditions", {"cluster": "nodes", "node": name, "type": "XIDErrors", "status": "True",
                                        "fixed_by": "reimage"})
    cond = {c.type: c for c in core.read_node(name).status.conditions}["XIDErrors"]
    assert cond.status == "True" and cond.reason == "XIDErrorsDetected"

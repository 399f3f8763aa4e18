"""The msgspec decoding of nodes and pods says exactly what the kubernetes client's models say.

The sweep and the drain read Kubernetes JSON with msgspec instead of the client's model classes
(for speed); these tests pin that shortcut to the reference: the same JSON through
``ApiClient.deserialize`` gives the same facts, and the shortcut is at least 20 times cheaper.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from shared.adapters.kube.auth import server_and_ca
from shared.adapters.kube.decoding import decode_node, decode_node_list, decode_pod, decode_pod_list
from shared.adapters.kube.objects import OBJECT_KINDS
from shared.kernel.errors import Invalid
from shared.kernel.ports import NodeView
from shared.kernel.quantity import format_quantity, parse_quantity

kubernetes = pytest.importorskip("kubernetes")


def node_json(i: int, *, pool: str = "gpu", bare: bool = False) -> dict[str, Any]:
    """A node as an AKS API server returns it (including the bulky parts decisions never read)."""
    name = f"aks-{pool}-12345678-vmss{i:06x}"
    if bare:
        return {"metadata": {"name": name, "uid": f"uid-{i}", "resourceVersion": str(i),
                             "creationTimestamp": "2026-11-30T08:00:00Z", "labels": None}}
    return {
        "metadata": {
            "name": name, "uid": f"3f0c1a2e-0000-4000-8000-{i:012d}", "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-11-30T08:00:00Z",
            "labels": {"kubernetes.azure.com/agentpool": pool, "agentpool": pool, "kubernetes.io/os": "linux",
                       "node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4",
                       "topology.kubernetes.io/zone": f"eastus-{i % 3 + 1}", "accelerator": "nvidia",
                       **{f"kubernetes.azure.com/label-{k}": f"value-{k}" for k in range(12)}},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {f"f:c{k}": {} for k in range(40)}}}],
        },
        "spec": {
            "providerID": f"azure:///subscriptions/s/resourceGroups/mc_rg/providers/Microsoft.Compute/"
                          f"virtualMachineScaleSets/aks-{pool}-12345678-vmss/virtualMachines/{i}",
            "podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"],
            "unschedulable": i % 7 == 0 or None,
            "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"},
                       *([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
                           "timeAdded": "2026-12-01T00:00:00Z"}] if i % 7 == 0 else [])],
        },
        "status": {
            "capacity": {"cpu": "24", "memory": "226764160Ki", "nvidia.com/gpu": "1", "pods": "110",
                         "ephemeral-storage": "129886128Ki"},
            "allocatable": {"cpu": "23660m", "memory": "209260416Ki", "nvidia.com/gpu": "1", "pods": "110"},
            "conditions": [
                {"type": "UnhealthyNvidiaDevicePlugin", "status": "True" if i % 11 == 0 else "False",
                 "lastHeartbeatTime": "2026-12-02T13:59:00Z", "lastTransitionTime": "2026-12-02T10:00:00Z",
                 "reason": "NvidiaDevicePluginIsUp", "message": "device plugin is up"},
                {"type": "UnhealthyNvidiaDCGMServices", "status": "False",
                 "lastHeartbeatTime": "2026-12-02T13:59:00Z", "lastTransitionTime": "2026-12-01T09:30:15Z"},
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "2026-12-02T13:59:00Z",
                 "lastTransitionTime": "2026-11-30T08:01:00Z", "reason": "KubeletHasSufficientMemory",
                 "message": "kubelet has sufficient memory available"},
                {"type": "Ready", "status": "False" if i % 13 == 0 else "True",
                 "lastHeartbeatTime": "2026-12-02T13:59:00Z", "lastTransitionTime": "2026-11-30T08:02:00.5Z",
                 "reason": "KubeletReady", "message": "kubelet is posting ready status"},
            ],
            "addresses": [{"type": "InternalIP", "address": f"10.224.0.{i % 250}"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m" * 32, "systemUUID": "u" * 36, "bootID": "b" * 36,
                         "kernelVersion": "5.15.0-1073-azure", "osImage": "Ubuntu 22.04.5 LTS",
                         "containerRuntimeVersion": "containerd://1.7.25-1", "kubeletVersion": "v1.33.2",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": [{"names": [f"mcr.microsoft.com/oss/kubernetes/image-{k}@sha256:{'a' * 64}",
                                  f"mcr.microsoft.com/oss/kubernetes/image-{k}:v1.{k}.0"], "sizeBytes": 10_000_000 + k}
                       for k in range(30)],
        },
    }


def pod_json(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"train-{i}", "namespace": "ml" if i % 2 else "default", "uid": f"pod-uid-{i}",
            "resourceVersion": str(i), "labels": {"app": "train"} if i % 3 else None,
            "annotations": {"kubernetes.io/config.mirror": "x"} if i == 4 else None,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"train-{i}-rs",
                                 "uid": "rs", "controller": True, "blockOwnerDeletion": True}] if i % 5 else None,
            "deletionTimestamp": "2026-12-02T12:00:00Z" if i == 3 else None,
            "creationTimestamp": "2026-12-01T00:00:00Z",
        },
        "spec": {
            "nodeName": f"aks-gpu-12345678-vmss{i:06x}",
            "terminationGracePeriodSeconds": 30 if i % 2 else None,
            "volumes": [{"name": "scratch", "emptyDir": {}}] if i % 4 == 1 else [{"name": "cfg", "configMap": {"name": "c"}}],
            "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            "nodeSelector": {"accelerator": "nvidia"} if i % 2 else None,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "agentpool", "operator": "In", "values": ["gpu"]}]}]}}}
            if i % 3 == 0 else None,
            "containers": [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "500m", "nvidia.com/gpu": "1",
                                                                                   "memory": "1Gi"}}},
                           *([{"name": "side", "image": "y", "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}}]
                             if i % 2 else [])],
            "initContainers": [{"name": "init", "image": "z", "resources": {"requests": {"cpu": "2"}}}] if i % 6 == 0 else None,
        },
        "status": {"phase": "Running" if i % 8 else "Succeeded", "podIP": "10.0.0.1"},
    }


def _ts(value: Any) -> float | None:
    return None if value is None else value.timestamp()


def expected_node(model: Any) -> NodeView:
    """What the kubernetes client's V1Node model says, in the shape of a NodeView."""
    from shared.kernel.ports import Condition, Taint

    meta, spec, status = model.metadata, model.spec, model.status
    return NodeView(
        name=meta.name, uid=meta.uid or "", resource_version=meta.resource_version or "",
        labels=meta.labels or {}, annotations=meta.annotations or {},
        unschedulable=bool(spec and spec.unschedulable),
        taints=tuple(Taint(key=t.key, effect=t.effect, value=t.value or "") for t in (spec and spec.taints) or ()),
        conditions=tuple(Condition(type=c.type, status=c.status, transition=_ts(c.last_transition_time),
                                   reason=c.reason or "", message=c.message or "")
                         for c in (status and status.conditions) or ()),
        allocatable=(status and status.allocatable) or {}, capacity=(status and status.capacity) or {},
        created=_ts(meta.creation_timestamp) or 0.0, provider_id=(spec and spec.provider_id) or "",
        boot_id=(status and status.node_info and status.node_info.boot_id) or "",
    )


def plain(view: NodeView) -> NodeView:
    """``view`` with every condition's transition time as epoch seconds, however it was decoded.

    A decoded condition keeps ``lastTransitionTime`` as text until it is read; views compare by what
    they say, so both sides are put in the one spelling before ``==``.
    """
    import msgspec

    return msgspec.structs.replace(view, conditions=tuple(
        msgspec.structs.replace(c, transition=c.last_transition) for c in view.conditions))


def plain_all(views: list[NodeView]) -> list[NodeView]:
    return [plain(v) for v in views]


def _client_models(doc: dict[str, Any], type_name: str) -> Any:
    api = kubernetes.client.ApiClient()
    return api.deserialize(json.dumps(doc), type_name, "application/json")


def _node_list(nodes: list[dict[str, Any]], token: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "99", "continue": token},
            "items": nodes}


def test_decoded_nodes_equal_the_client_models() -> None:
    nodes = [node_json(i) for i in range(30)] + [node_json(99, bare=True)]
    doc = _node_list(nodes, token="next-page")
    views, token = decode_node_list(json.dumps(doc).encode())
    reference = _client_models(doc, "V1NodeList")
    assert token == "next-page" == reference.metadata.var_continue
    assert plain_all(views) == [expected_node(n) for n in reference.items]
    assert any(v.unschedulable for v in views) and any(not v.ready for v in views)
    assert views[0].pool == "gpu" and views[0].condition("Ready") is not None
    assert views[-1].labels == {} and views[-1].conditions == () and views[-1].pool == ""


def test_a_single_node_decodes_like_a_list_item() -> None:
    doc = node_json(14)
    assert plain(decode_node(json.dumps(doc).encode())) == expected_node(_client_models(doc, "V1Node"))


def test_the_last_page_has_no_continue_token() -> None:
    for meta in ({}, {"continue": ""}, {"continue": None}):
        views, token = decode_node_list(json.dumps({"metadata": meta, "items": None}).encode())
        assert views == [] and token == ""


def test_condition_times_keep_fractions_and_zones() -> None:
    doc = node_json(1)
    doc["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-02T10:00:00.25+01:00"
    view = decode_node(json.dumps(doc).encode())
    expected = datetime(2026, 12, 2, 9, 0, 0, 250000, tzinfo=UTC).timestamp()
    assert view.condition("UnhealthyNvidiaDevicePlugin").last_transition == expected  # type: ignore[union-attr]


def expected_requests(spec: Any) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for c in spec.containers or ():
        for k, v in ((c.resources and c.resources.requests) or {}).items():
            total[k] = total.get(k, Decimal(0)) + parse_quantity(v)
    for c in spec.init_containers or ():
        for k, v in ((c.resources and c.resources.requests) or {}).items():
            total[k] = max(total.get(k, Decimal(0)), parse_quantity(v))
    return total


def test_decoded_pods_equal_the_client_models() -> None:
    doc = {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod_json(i) for i in range(13)]}
    views, token = decode_pod_list(json.dumps(doc).encode())
    reference = _client_models(doc, "V1PodList").items
    assert token == "" and len(views) == len(reference) == 13
    api = kubernetes.client.ApiClient()
    for view, model in zip(views, reference, strict=True):
        meta, spec = model.metadata, model.spec
        assert (view.namespace, view.name, view.uid, view.node_name, view.phase) == (
            meta.namespace, meta.name, meta.uid, spec.node_name, model.status.phase)
        assert [(o.kind, o.name, o.controller) for o in view.owners] == [
            (o.kind, o.name, bool(o.controller)) for o in meta.owner_references or ()]
        assert dict(view.labels) == (meta.labels or {}) and dict(view.annotations) == (meta.annotations or {})
        assert view.deletion_timestamp == _ts(meta.deletion_timestamp)
        assert view.grace_period_seconds == spec.termination_grace_period_seconds
        assert view.has_empty_dir == any(v.empty_dir is not None for v in spec.volumes or ())
        assert list(view.tolerations) == api.sanitize_for_serialization(spec.tolerations)
        assert dict(view.node_selector) == (spec.node_selector or {})
        assert view.affinity == (api.sanitize_for_serialization(spec.affinity) if spec.affinity else None)
        assert {k: parse_quantity(v) for k, v in view.requests.items()} == expected_requests(spec)
    assert views[4].is_mirror and views[1].controller() is not None and views[5].controller() is None


def test_a_single_pod_keeps_its_own_spelling_of_requests() -> None:
    view = decode_pod(json.dumps(pod_json(2)).encode())
    assert dict(view.requests) == {"cpu": "500m", "nvidia.com/gpu": "1", "memory": "1Gi"}


QUANTITIES = [("500m", Decimal("0.5")), ("1", Decimal(1)), ("1.5", Decimal("1.5")), ("2k", Decimal(2000)),
              ("1Ki", Decimal(1024)), ("16Gi", Decimal(16 * 2**30)), ("1e3", Decimal(1000)), ("100n", Decimal("1e-7"))]


@pytest.mark.parametrize(("text", "value"), QUANTITIES, ids=[q[0] for q in QUANTITIES])
def test_quantities_parse_like_kubernetes(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_summed_quantities_format_whole_numbers_plainly_and_fractions_in_millis() -> None:
    assert format_quantity(Decimal("1.5")) == "1500m" and format_quantity(Decimal(3)) == "3"
    with pytest.raises(Invalid):
        parse_quantity("lots")


def test_the_kubeconfig_user_is_ignored_and_server_and_ca_are_taken() -> None:
    kubeconfig = b"""
apiVersion: v1
kind: Config
current-context: c1
clusters:
- name: other
  cluster: {server: "https://wrong"}
- name: c1
  cluster:
    server: https://127.0.0.1:8443/k8s/sub/rg/c1/
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
contexts:
- name: c1
  context: {cluster: c1, user: clusterUser_rg_c1}
users:
- name: clusterUser_rg_c1
  user:
    exec: {command: kubelogin, args: [get-token, --server-id, 6dae42f8-4368-4678-94ff-3960e28e3630]}
"""
    server, ca, insecure = server_and_ca(kubeconfig)
    assert server == "https://127.0.0.1:8443/k8s/sub/rg/c1"
    assert ca == b"-----BEGIN CERTIFICATE-----\n" and insecure is False


def test_supported_object_kinds_are_declared_with_their_permissions() -> None:
    from shared.adapters.kube import client
    from shared.adapters.permissions import collect_kube_rules

    rules = collect_kube_rules(client)
    # per kind, only what the app does with it (issue 11): Jobs are created, read and deleted, never
    # replaced; Karpenter objects are applied (get, create, update), read and deleted
    for (group, _kind), (plural, _namespaced) in OBJECT_KINDS.items():
        assert {(group, plural, verb) for verb in ("create", "get", "delete")} <= rules
    assert ("batch", "jobs", "update") not in rules
    assert ("karpenter.sh", "nodepools", "update") in rules
    assert {("", "nodes", "list"), ("", "nodes", "patch"), ("", "pods", "list"), ("", "pods/eviction", "create"),
            ("", "events", "create"), ("coordination.k8s.io", "leases", "update"),
            ("policy", "poddisruptionbudgets", "list")} <= rules


def test_decoding_a_node_list_never_builds_the_clients_model_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    # How much cheaper this is, is measured by `make bench` (sweep_cost), never by a timed test.
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the sweep's decoding built a kubernetes client model")

    for model in ("V1Node", "V1NodeList", "V1NodeCondition", "V1ObjectMeta", "V1Taint"):
        monkeypatch.setattr(getattr(kubernetes.client, model), "__init__", refuse)
    nodes, _ = decode_node_list(json.dumps(_node_list([node_json(i) for i in range(3)])).encode())
    assert [type(n) for n in nodes] == [NodeView] * 3

"""Kubernetes JSON as the views decisions read (``NodeView``, ``PodView``), decoded by msgspec.

The sweep lists every GPU node of the fleet every minute and the drains list pods, so these reads
skip the kubernetes client's model classes entirely: the raw JSON is decoded into small structs that
hold only the fields decisions need (the wire structs below, decode only), and then into the views.
A pod's requests are its *effective* requests, as the scheduler computes them: the larger of the sum
over its containers and each init container, per resource (kubernetes.io/docs/concepts/workloads/pods/
init-containers/#resource-sharing-within-containers), summed with the one quantity parser
(:mod:`shared.kernel.quantity`). Timestamps are read by :mod:`shared.kernel.timefmt`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import msgspec

from shared.kernel.ports import Condition, Epoch, NodeView, OwnerRef, PodView, Taint
from shared.kernel.quantity import format_quantity, parse_quantity
from shared.kernel.timefmt import rfc3339_seconds

# --------------------------------------------------------------------------- wire structs (decode only)


class _Owner(msgspec.Struct, gc=False):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class _Meta(msgspec.Struct, rename="camel", gc=False):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    owner_references: list[_Owner] | None = None


class _ListMeta(msgspec.Struct, rename="camel", gc=False):
    continue_: str | None = msgspec.field(default=None, name="continue")
    resource_version: str = ""


# Nodes are decoded in two ways. The fast one (every list page of the sweep) lets msgspec build the
# views' conditions and taints itself: ``ports.Condition`` and ``ports.Taint`` are the wire shapes, and
# ``lastTransitionTime`` stays text until it is read (``Condition.last_transition``). The node's own
# timestamps arrive as an ``Epoch`` through ``_dec_hook`` (a small cache of parsed timestamps). It is strict:
# a null ``reason``, ``message`` or taint ``value`` fails it, and the page is decoded again the
# tolerant way (Optional fields converted in Python), so odd API servers cost time, never a sweep.


class _NodeMeta(msgspec.Struct, rename="camel", gc=False):
    name: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creation_timestamp: Epoch | None = None
    deletion_timestamp: Epoch | None = None


class _NodeSpec(msgspec.Struct, gc=False):
    unschedulable: bool | None = None
    taints: tuple[Taint, ...] | None = None
    provider_id: str | None = msgspec.field(default=None, name="providerID")


class _NodeInfo(msgspec.Struct, gc=False):
    boot_id: str | None = msgspec.field(default=None, name="bootID")


class _NodeStatus(msgspec.Struct, rename="camel", gc=False):
    conditions: tuple[Condition, ...] | None = None
    allocatable: dict[str, str] | None = None
    capacity: dict[str, str] | None = None
    node_info: _NodeInfo | None = None


class _Node(msgspec.Struct, gc=False):
    metadata: _NodeMeta = msgspec.field(default_factory=_NodeMeta)
    spec: _NodeSpec = msgspec.field(default_factory=_NodeSpec)
    status: _NodeStatus = msgspec.field(default_factory=_NodeStatus)


class _NodeList(msgspec.Struct, gc=False):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_Node] | None = None


class _Taint(msgspec.Struct, gc=False):
    key: str = ""
    effect: str = ""
    value: str | None = None


class _Condition(msgspec.Struct, rename="camel", gc=False):
    type: str = ""
    status: str = ""
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class _TolerantNodeSpec(msgspec.Struct, gc=False):
    unschedulable: bool | None = None
    taints: list[_Taint] | None = None
    provider_id: str | None = msgspec.field(default=None, name="providerID")


class _TolerantNodeStatus(msgspec.Struct, rename="camel", gc=False):
    conditions: list[_Condition] | None = None
    allocatable: dict[str, str] | None = None
    capacity: dict[str, str] | None = None
    node_info: _NodeInfo | None = None


class _TolerantNode(msgspec.Struct, gc=False):
    metadata: _NodeMeta = msgspec.field(default_factory=_NodeMeta)
    spec: _TolerantNodeSpec = msgspec.field(default_factory=_TolerantNodeSpec)
    status: _TolerantNodeStatus = msgspec.field(default_factory=_TolerantNodeStatus)


class _TolerantNodeList(msgspec.Struct, gc=False):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_TolerantNode] | None = None


class _Resources(msgspec.Struct, gc=False):
    requests: dict[str, str] | None = None


class _Container(msgspec.Struct, gc=False):
    resources: _Resources | None = None


class _Volume(msgspec.Struct, rename="camel", gc=False):
    empty_dir: dict[str, Any] | None = None


class _PodSpec(msgspec.Struct, rename="camel", gc=False):
    node_name: str | None = None
    termination_grace_period_seconds: int | None = None
    volumes: list[_Volume] | None = None
    tolerations: list[dict[str, Any]] | None = None
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    containers: list[_Container] | None = None
    init_containers: list[_Container] | None = None


class _PodStatus(msgspec.Struct, gc=False):
    phase: str | None = None


class _Pod(msgspec.Struct, gc=False):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _PodSpec = msgspec.field(default_factory=_PodSpec)
    status: _PodStatus = msgspec.field(default_factory=_PodStatus)


class _PodList(msgspec.Struct, gc=False):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_Pod] | None = None


_EPOCH_CACHE_MAX = 4096
_epochs: dict[str, Epoch] = {}


def _parse_epoch(text: str) -> Epoch:
    """``text`` (RFC 3339, read by ``timefmt.rfc3339_seconds``) as an ``Epoch``, remembered; refused if malformed."""
    if not isinstance(text, str):
        raise NotImplementedError  # msgspec then reports the type error with its path
    seconds = rfc3339_seconds(text)
    if seconds is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")  # msgspec reports it with its path
    value = Epoch(seconds)
    if len(_epochs) >= _EPOCH_CACHE_MAX:
        _epochs.clear()  # a crude bound: the next pages re-fill what they use
    _epochs[text] = value
    return value


def _dec_hook(type_: type, obj: Any, _cached: Callable[[str], Epoch | None] = _epochs.get) -> Any:
    """msgspec's hook for the only custom type of the node decoders (``Epoch``): one lookup when cached.

    This runs for the creation (and deletion) time of every node, so it is as short as it can be.
    """
    return _cached(obj) or _parse_epoch(obj)


_node_decoder = msgspec.json.Decoder(_Node, dec_hook=_dec_hook)
_node_list_decoder = msgspec.json.Decoder(_NodeList, dec_hook=_dec_hook)
_tolerant_node_decoder = msgspec.json.Decoder(_TolerantNode, dec_hook=_dec_hook)
_tolerant_node_list_decoder = msgspec.json.Decoder(_TolerantNodeList, dec_hook=_dec_hook)
_pod_decoder = msgspec.json.Decoder(_Pod)
_pod_list_decoder = msgspec.json.Decoder(_PodList)


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _conditions(items: tuple[Condition, ...] | list[_Condition] | None) -> tuple[Condition, ...]:
    if not items:
        return ()
    if isinstance(items, tuple):
        return items  # decoded as the view's own conditions
    return tuple(Condition(c.type, c.status, c.last_transition_time, c.reason or "", c.message or "")
                 for c in items)


def _taints(items: tuple[Taint, ...] | list[_Taint] | None) -> tuple[Taint, ...]:
    if not items:
        return ()
    if isinstance(items, tuple):
        return items  # decoded as the view's own taints
    return tuple(Taint(t.key, t.effect, t.value or "") for t in items)


def node_view(node: _Node | _TolerantNode) -> NodeView:
    meta, spec, status = node.metadata, node.spec, node.status
    created = meta.creation_timestamp
    return NodeView(
        meta.name, meta.uid, meta.resource_version, meta.labels or {}, meta.annotations or {},
        bool(spec.unschedulable), _taints(spec.taints), _conditions(status.conditions),
        status.allocatable or {}, status.capacity or {}, float(created) if created else 0.0,
        spec.provider_id or "", _float(meta.deletion_timestamp),
        (status.node_info.boot_id or "") if status.node_info is not None else "",
    )


def pod_view(pod: _Pod) -> PodView:
    meta, spec = pod.metadata, pod.spec
    return PodView(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        node_name=spec.node_name or "",
        phase=pod.status.phase or "",
        owners=tuple(OwnerRef(kind=o.kind, name=o.name, controller=bool(o.controller))
                     for o in meta.owner_references or ()),
        annotations=meta.annotations or {},
        labels=meta.labels or {},
        deletion_timestamp=_ts(meta.deletion_timestamp),
        grace_period_seconds=spec.termination_grace_period_seconds,
        has_empty_dir=any(v.empty_dir is not None for v in spec.volumes or ()),
        tolerations=tuple(spec.tolerations or ()),
        node_selector=spec.node_selector or {},
        affinity=spec.affinity or None,
        requests=effective_requests(spec.containers or (), spec.init_containers or ()),
    )


def decode_node(data: bytes) -> NodeView:
    try:
        return node_view(_node_decoder.decode(data))
    except msgspec.ValidationError:
        return node_view(_tolerant_node_decoder.decode(data))


def decode_node_list(data: bytes) -> tuple[list[NodeView], str]:
    """The nodes of one list page and the ``continue`` token ("" on the last page)."""
    try:
        page: _NodeList | _TolerantNodeList = _node_list_decoder.decode(data)
    except msgspec.ValidationError:
        page = _tolerant_node_list_decoder.decode(data)
    return [node_view(n) for n in page.items or ()], page.metadata.continue_ or ""


def decode_pod(data: bytes) -> PodView:
    return pod_view(_pod_decoder.decode(data))


def decode_pod_list(data: bytes) -> tuple[list[PodView], str]:
    page = _pod_list_decoder.decode(data)
    return [pod_view(p) for p in page.items or ()], page.metadata.continue_ or ""


def effective_requests(containers: Any, init_containers: Any) -> Mapping[str, str]:
    """The pod's effective requests: max(sum over containers, each init container), per resource."""
    total: dict[str, Decimal] = {}
    texts: dict[str, str] = {}
    single = len(containers) == 1 and not init_containers
    for c in containers:
        for name, text in ((c.resources.requests if c.resources else None) or {}).items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(text)
            texts[name] = text
    if single:
        return texts  # the common case: keep the pod's own spelling
    for c in init_containers:
        for name, text in ((c.resources.requests if c.resources else None) or {}).items():
            value = parse_quantity(text)
            if value > total.get(name, Decimal(0)):
                total[name] = value
    return {name: format_quantity(value) for name, value in total.items()}

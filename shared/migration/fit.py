"""Would the old pool's pods run on the replacement? A check before a GPU is bought, and again after.

A pod fits when at least one of the replacement's node shapes (nodes differ by zone) takes it, as
the scheduler's filters would (kubernetes/kubernetes pkg/scheduler/framework/plugins:
``tainttoleration``, ``nodeaffinity`` for nodeSelector and required node affinity, ``noderesources``
for requests), and together the pods' GPU requests fit the replacement's GPUs. Before the
replacement exists its nodes are predicted from the old ones (:func:`predicted_labels`) and from the
replacement's body (its taints). Pure: the caller lists the pods and nodes.

Quantities are read with the app's one parser (:mod:`shared.kernel.quantity`). A quantity that is not
one is a misfit, never a zero: a pod whose request cannot be read cannot be shown to fit, so the
migration stops and names it rather than buying a replacement the pod may not run on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.kernel.errors import Invalid
from shared.kernel.ports import NodeView, PodView, Taint
from shared.kernel.quantity import quantity
from shared.migration.reads import POOL_LABEL

GPU = "nvidia.com/gpu"


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key, op = tol.get("key") or "", tol.get("operator") or "Equal"
        if not key and op == "Exists":
            return True
        if key != taint.key:
            continue
        if op == "Exists" or (tol.get("value") or "") == taint.value:
            return True
    return False


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            left, right = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _affinity_matches(affinity: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    required = (((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_expression_matches(e, labels) for e in (term.get("matchExpressions") or [])) for term in terms)


@dataclass(frozen=True)
class NodeShape:
    """What a pod's scheduling constraints are checked against: one (real or predicted) node."""

    labels: Mapping[str, str]
    taints: Sequence[Taint]
    allocatable: Mapping[str, str]


def _pod_misfit(pod: PodView, shape: NodeShape) -> str:
    """Why ``pod`` cannot run on a node shaped like ``shape`` ("" = it can)."""
    hard = [t for t in shape.taints if t.effect in ("NoSchedule", "NoExecute") and not t.key.startswith("node.kubernetes.io/")]
    untolerated = [t.key for t in hard if not _tolerates(pod.tolerations, t)]
    if untolerated:
        return f"does not tolerate the replacement's taint(s) {', '.join(untolerated)}"
    wrong = sorted(k for k, v in pod.node_selector.items() if shape.labels.get(k) != v)
    if wrong:
        return "selects node labels the replacement does not carry: " + ", ".join(f"{k}={pod.node_selector[k]}" for k in wrong)
    if not _affinity_matches(pod.affinity, shape.labels):
        return "has a required node affinity the replacement's nodes do not match"
    for resource, amount in sorted(pod.requests.items()):
        if resource not in shape.allocatable:
            continue
        try:
            wanted = quantity(amount)
        except Invalid:
            return f"requests {resource}={amount!r}, which is not a resource quantity"
        try:
            offered = quantity(shape.allocatable[resource])
        except Invalid:
            return f"cannot be placed: a node's allocatable {resource}={shape.allocatable[resource]!r} is not a quantity"
        if wanted > offered:
            return f"requests {resource}={amount}, more than one node offers ({shape.allocatable[resource]})"
    return ""


def fit_problems(pods: Sequence[PodView], *, shapes: Sequence[NodeShape], node_count: int) -> list[str]:
    """Why these pods would not run on the replacement's nodes (empty = they fit).

    A pod fits when at least one of the replacement's node ``shapes`` (nodes differ by zone) takes
    it: every NoSchedule/NoExecute taint tolerated, nodeSelector and required node affinity matched,
    each request within one node's allocatable. Together, the pods' GPU requests must fit the
    replacement's GPUs (``node_count`` nodes of the size of ``shapes``).
    """
    problems: list[str] = []
    if not shapes:
        return problems if not pods else [f"the replacement has no node to check {len(pods)} pods against"]
    gpu_total = max(_gpus(s.allocatable, problems, "a replacement node offers") for s in shapes) * node_count
    gpu_wanted = 0.0
    for pod in pods:
        misfits = [_pod_misfit(pod, shape) for shape in shapes]
        if all(misfits):
            problems.append(f"pod {pod.namespace}/{pod.name} {misfits[0]}")
        gpu_wanted += _gpus(pod.requests, problems, f"pod {pod.namespace}/{pod.name} requests")
    if gpu_wanted > gpu_total:
        problems.append(f"the pods request {gpu_wanted:g} GPUs; the replacement offers {gpu_total:g}")
    return problems


def _gpus(resources: Mapping[str, str], problems: list[str], whose: str) -> float:
    """The GPUs in ``resources`` (0 when it names none); a malformed count is a problem, counted as none."""
    try:
        return quantity(resources.get(GPU, "0"))
    except Invalid:
        problem = f"{whose} {GPU}={resources[GPU]!r}, which is not a resource quantity"
        if problem not in problems:
            problems.append(problem)
        return 0.0


def predicted_labels(old_node: NodeView, *, old_pool: str, new_pool: str) -> dict[str, str]:
    """The labels a replacement node will carry, from an old node's (before the replacement exists)."""
    out = {k: v for k, v in old_node.labels.items() if k not in ("kubernetes.io/hostname",)}
    for key in (POOL_LABEL, "agentpool"):
        if out.get(key) == old_pool:
            out[key] = new_pool
    out["kubernetes.azure.com/dcgm-exporter"] = "enabled"
    return out


def parse_taints(texts: Sequence[str]) -> list[Taint]:
    out = []
    for text in texts:
        kv, _, effect = str(text).rpartition(":")
        key, _, value = kv.partition("=")
        out.append(Taint(key=key, value=value, effect=effect))
    return out


def body_taints(body: Mapping[str, Any]) -> list[Taint]:
    taints = parse_taints(body.get("nodeTaints") or [])
    if body.get("scaleSetPriority") == "Spot" and not any(t.key == "kubernetes.azure.com/scalesetpriority" for t in taints):
        taints.append(Taint(key="kubernetes.azure.com/scalesetpriority", value="spot", effect="NoSchedule"))
    return taints

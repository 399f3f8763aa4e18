"""Every label and field selector the app sends parses on a real API server.

The simulator's selector parsers are ports of the real ones (labels.Parse and fields.ParseSelector of
k8s.io/apimachinery), so a selector they accept is one a real kube-apiserver accepts, and the 400 a
malformed one would get never happens in production. The selectors come from the app's own builders:
the sweep's GPU selectors, pool selectors from pool names (agent pools, Karpenter NodePools) and from
node labels, and the pod list's ``spec.nodeName`` field selector.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.migration import reads as migration
from shared.pools import nap
from shared.pools import spec as pool_spec
from shared.pools.rules import POOL_NAME
from shared.remediation import health
from shared.remediation import records as remediation
from shared.remediation.policy import GPU_NODE_SELECTOR, RemediationPolicy
from sim.kube.reads import _parse_field_selector
from sim.model import match_requirements, parse_label_selector

POOL_NAMES = st.from_regex(POOL_NAME, fullmatch=True)
# a non-empty label value as the API server stores it on a node (IsValidLabelValue): what pool labels carry
LABEL_VALUES = st.from_regex(r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z", fullmatch=True)
NODE_NAMES = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?){0,3}\Z",
                           fullmatch=True)


def _node(labels: dict[str, str]) -> Any:
    from shared.kernel.ports import NodeView

    return NodeView(name="n", uid="u", resource_version="1", labels=labels, annotations={}, unschedulable=False,
                    taints=(), conditions=(), allocatable={}, capacity={}, created=0.0)


@pytest.mark.parametrize("selector", [GPU_NODE_SELECTOR, health.NAP_GPU_SELECTOR, RemediationPolicy().node_selector],
                         ids=["gpu", "nap-gpu", "policy-default"])
def test_the_sweeps_gpu_selectors_parse_and_select_what_they_mean(selector: str) -> None:
    reqs = parse_label_selector(selector)
    key, _, value = selector.partition("=")
    assert match_requirements({key: value}, reqs) and not match_requirements({key: value + "x"}, reqs)


@settings(max_examples=200, deadline=None)
@given(POOL_NAMES)
def test_pool_selectors_built_from_any_valid_pool_name_parse(pool: str) -> None:
    for label in (migration.POOL_LABEL, remediation.POOL_LABEL, pool_spec.AGENTPOOL_LABEL, nap.NODEPOOL_LABEL):
        reqs = parse_label_selector(f"{label}={pool}")
        assert match_requirements({label: pool}, reqs)


@settings(max_examples=200, deadline=None)
@given(LABEL_VALUES, st.booleans())
def test_a_nodes_pool_selector_parses_whatever_valid_label_value_its_pool_label_has(value: str, karpenter: bool) -> None:
    labels = {health.NODEPOOL_LABEL: value, "karpenter.sh/registered": "true"} if karpenter else \
        {health.AGENTPOOL_LABEL: value}
    node = _node(labels)
    reqs = parse_label_selector(health.pool_selector(node))
    assert match_requirements(labels, reqs)


@settings(max_examples=200, deadline=None)
@given(NODE_NAMES)
def test_the_pod_lists_node_field_selector_parses_for_any_node_name(name: str) -> None:
    from shared.adapters.kube.client import _escape_field_value

    assert _parse_field_selector(f"spec.nodeName={_escape_field_value(name)}", "pods") == [("spec.nodeName", "=", name)]


def test_a_node_name_with_selector_characters_is_escaped_not_refused() -> None:
    from shared.adapters.kube.client import _escape_field_value

    odd = "a,b=c\\d"
    assert _parse_field_selector(f"spec.nodeName={_escape_field_value(odd)}", "pods") == [("spec.nodeName", "=", odd)]

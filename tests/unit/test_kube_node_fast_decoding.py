"""The sweep's fast node decoding says what the kubernetes client's models say, timestamps included.

shared.adapters.kube.decoding decodes list pages straight into ``ports.Condition`` / ``ports.Taint``; a condition keeps
``lastTransitionTime`` as text and parses it (through a small bounded cache) only when it is read. A
page the strict shapes refuse (a null ``reason``, ``message`` or taint ``value``) is decoded again the
tolerant way. These tests pin both paths and the cache to the reference: ``ApiClient.deserialize``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from shared.adapters.kube import decoding
from shared.adapters.kube.decoding import decode_node, decode_node_list
from shared.kernel import timefmt
from shared.kernel.ports import NodeView
from shared.remediation import health
from shared.remediation.policy import RemediationPolicy
from tests.unit.test_kube_decoding import _client_models, _node_list, expected_node, node_json, plain, plain_all

kubernetes = pytest.importorskip("kubernetes")

T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)


def _stamp(moment: datetime, *, style: int) -> str:
    """The spellings an API server (or a proxy re-encoding it) may use for one instant."""
    if style == 0:
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    if style == 1:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat() + "+00:00"


def _distinct_times(doc: dict[str, Any], i: int) -> dict[str, Any]:
    """Every condition of node ``i`` gets its own transition time, and the node its own creation time."""
    doc["metadata"]["creationTimestamp"] = _stamp(T0 - timedelta(days=1, seconds=i), style=0)
    for k, cond in enumerate(doc["status"]["conditions"]):
        moment = T0 + timedelta(seconds=97 * i + k, microseconds=1000 * (i % 7) * (k % 2))
        cond["lastTransitionTime"] = _stamp(moment, style=(i + k) % 3)
    return doc


def _views_and_reference(nodes: list[dict[str, Any]]) -> tuple[list[NodeView], list[NodeView]]:
    doc = _node_list(nodes, token="t")
    views, token = decode_node_list(json.dumps(doc).encode())
    assert token == "t"
    return plain_all(views), [expected_node(n) for n in _client_models(doc, "V1NodeList").items]


def test_nodes_with_distinct_transition_times_equal_the_client_models() -> None:
    views, reference = _views_and_reference([_distinct_times(node_json(i), i) for i in range(40)])
    assert views == reference
    times = [c.last_transition for v in views for c in v.conditions]
    assert len(set(times)) == len(times)  # nothing was shared through the cache by mistake


def test_the_timestamp_caches_stay_bounded_and_right_when_they_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoding, "_EPOCH_CACHE_MAX", 8)
    monkeypatch.setattr(timefmt, "_CACHE_MAX", 8)
    decoding._epochs.clear()  # the hook reads this very dict (bound once, for speed): empty it, never replace it
    timefmt._cache.clear()
    views, reference = _views_and_reference([_distinct_times(node_json(i), i) for i in range(12)])
    assert views == reference
    again, _ = _views_and_reference([_distinct_times(node_json(i), i) for i in range(12)])
    assert again == reference
    assert len(decoding._epochs) <= 8 and len(timefmt._cache) <= 8


def test_null_reasons_messages_and_taint_values_take_the_tolerant_path_to_the_same_view() -> None:
    nodes = [node_json(i) for i in range(6)]
    nodes[2]["status"]["conditions"][0]["reason"] = None
    nodes[3]["status"]["conditions"][1]["message"] = None
    nodes[4]["spec"]["taints"][0]["value"] = None
    nodes[5]["status"]["conditions"][2]["lastTransitionTime"] = None
    views, reference = _views_and_reference(nodes)
    assert views == reference
    assert views[2].conditions[0].reason == "" and views[4].taints[0].value == ""
    assert views[5].conditions[2].last_transition is None
    assert plain(decode_node(json.dumps(nodes[2]).encode())) == reference[2]


def test_a_malformed_transition_time_is_never_guessed_and_the_node_is_not_called_healthy() -> None:
    doc = _distinct_times(node_json(11), 11)  # the device plugin condition is True
    cond_doc = next(c for c in doc["status"]["conditions"] if c["type"] == "UnhealthyNvidiaDevicePlugin")
    cond_doc["lastTransitionTime"] = "yesterday"
    view = decode_node(json.dumps(doc).encode())
    cond = view.condition("UnhealthyNvidiaDevicePlugin")
    assert cond is not None and cond.status == "True" and cond.last_transition is None
    policy = RemediationPolicy(startup_grace_s=0, skip_not_ready=False)
    evaluation = health.evaluate([view], now=T0.timestamp() + 86_400, policy=policy)
    assert evaluation.unknown == [(view, "UnhealthyNvidiaDevicePlugin")]
    assert evaluation.healthy == [] and evaluation.unhealthy == []


def test_a_malformed_creation_time_is_refused_not_guessed() -> None:
    doc = node_json(1)
    doc["metadata"]["creationTimestamp"] = "yesterday"
    with pytest.raises(msgspec.ValidationError):
        decode_node(json.dumps(doc).encode())


def test_decoded_times_are_floats_and_findings_carry_plain_storable_floats() -> None:
    doc = _distinct_times(node_json(11), 11)  # i % 11 == 0: the device plugin condition is True
    view = decode_node(json.dumps(doc).encode())
    cond = view.condition("UnhealthyNvidiaDevicePlugin")
    assert cond is not None and cond.status == "True"
    assert type(cond.last_transition) is float
    assert type(view.created) is float and view.deletion_timestamp is None
    policy = RemediationPolicy(startup_grace_s=0, skip_not_ready=False)
    evaluation = health.evaluate([view], now=cond.last_transition + 3600, policy=policy)
    since = evaluation.unhealthy[0].since
    assert type(since) is float and since == cond.last_transition
    assert msgspec.json.decode(msgspec.json.encode({"since_ts": since})) == {"since_ts": since}

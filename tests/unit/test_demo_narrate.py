"""The demo tells every step from the published events, in sentences, never cut mid-word (issue 22, item 6)."""

from __future__ import annotations

from typing import Any

import pytest

from demo.narrate import Narrator, sentence, wrapped

CLUSTER = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/ml-train"


def event(type_: str, id_: str = "", **data: Any) -> dict[str, Any]:
    return {"type": type_, "id": id_ or type_, "time": "2025-12-02T14:03:07Z", "data": {"cluster": CLUSTER, **data}}


CASES = [
    (event("Steward.PoolRequest.Rejected", requestId="req-2", requester="ml-platform", poolName="x",
           problems=[{"field": "vmSize", "problem": "Standard_D4s_v5 is not a GPU size", "fix": "use an NC size"}]),
     "request req-2 (ml-platform, pool x on ml-train) rejected: vmSize: Standard_D4s_v5 is not a GPU size "
     "(fix: use an NC size)"),
    (event("Steward.Remediation.Admitted", node="aks-gput4-0", pool="gput4", condition="XID79", note="admitted"),
     "node aks-gput4-0 (ml-train/gput4, XID79) admitted: admitted"),
    (event("Steward.Remediation.Restarted", node="aks-gput4-0", pool="gput4", condition="XID79",
           note="restart started"), "node aks-gput4-0 (ml-train/gput4, XID79) restarted: restart started"),
    (event("Steward.Remediation.Refused", node="aks-gput4-2", pool="gput4", condition="XID79", reason_code="budget-pool",
           reason="pool gput4: 1 of 3 nodes already unavailable"),
     "node aks-gput4-2 (ml-train/gput4, XID79) refused [budget-pool]: pool gput4: 1 of 3 nodes already unavailable"),
    (event("Steward.Remediation.GaveUp", node="n", pool="p", condition="c", note="every rung failed"),
     "node n (ml-train/p, c) gave up: every rung failed"),
    (event("Steward.Migration.Step", pool="t4", previous="draining", state="deleting", note="old pool empty"),
     "pool ml-train/t4 draining -> deleting: old pool empty"),
    (event("Steward.Breaker.Opened", reason="7 of 20 GPU nodes unhealthy"),
     "the fleet breaker opened: 7 of 20 GPU nodes unhealthy"),
]


@pytest.mark.parametrize(("given", "told"), CASES, ids=[c[0]["type"] for c in CASES])
def test_each_event_is_one_sentence_with_its_reason(given: dict[str, Any], told: str) -> None:
    assert sentence(given) == told


def test_the_sweeps_own_fault_reports_are_left_to_the_remediation_events() -> None:
    assert sentence(event("Steward.GpuNode.Unhealthy", node="n")) is None


def test_each_event_is_told_once_in_the_order_received() -> None:
    narrator = Narrator()
    first = [event("Steward.Breaker.Opened", "e1", reason="a"), event("Steward.Breaker.Reset", "e2", reason="b")]
    assert [t for _, t in narrator.new_lines(first)] == ["the fleet breaker opened: a", "the fleet breaker reset: b"]
    assert narrator.new_lines([*first, event("Steward.Breaker.Opened", "e3", reason="c")])[0][1] == \
        "the fleet breaker opened: c"


def test_long_lines_wrap_at_words_and_nothing_is_cut() -> None:
    text = "node aks-gput4-2 refused: " + " ".join(f"word{i}" for i in range(60))
    lines = wrapped("14:03:07 fleet time", text, width=80)
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines)
    assert " ".join(" ".join(lines).split()[3:]) == text  # every word kept, whole


def test_signal_reports_say_what_was_refused_and_what_cannot_fire() -> None:
    refused = sentence(event("Steward.Signal.SeriesRefused", workspace="ws1", code="NotTheExporter", count=2,
                             examples=["Hostname=aks-vision-0"]))
    assert refused == ("2 DCGM series from workspace ws1 refused [NotTheExporter], never acted on; "
                       "e.g. Hostname=aks-vision-0")
    inactive = sentence(event("Steward.Signal.CountersInactive", exporter="managed", inactive=["ROW_REMAP"]))
    assert inactive == "DCGM on ml-train: the managed exporter does not export ROW_REMAP: those policy rows cannot fire there"


def test_a_request_without_a_valid_pool_name_is_still_a_sentence() -> None:
    told = sentence(event("Steward.PoolRequest.Rejected", requestId="r", requester="t", poolName=None,
                          reasons=["poolName: bad"]))
    assert told == "request r (t, on ml-train) rejected: poolName: bad"

"""Intake hardening (issue 11 §5): whole-string patterns, records that fit, evidence of what was sent.

- A pattern that ends in ``$`` also matches before a final newline, so ``"gpu\\n"`` passed as a
  pool name; every field checked by a pattern must now match as a whole string.
- A *valid* request can be too large to record: the ledger keeps the request in one Azure Table
  string property (64 KiB as UTF-16). It must be rejected before Accepted is published, instead of
  being announced and then failing its write into the poison queue.
- Every rejection records the message's sha256, size and first bytes (escaped), in the ledger row
  and in the Rejected event, so an operator can see what was sent.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from shared.adapters.ledger import PROPERTY_LIMIT_BYTES, to_entity
from shared.pools.intake import RECORD_GROWTH_RESERVE_BYTES, accept
from shared.pools.policy import PoolRequestPolicy
from shared.pools.records import KIND
from shared.pools.validation import HEAD_BYTES, Rejection, ValidatedRequest, escape_head, parse_and_validate
from tests.unit.fakes_pool import CLUSTER, make_world, message, request

RECORD_START_BUDGET_BYTES = PROPERTY_LIMIT_BYTES - RECORD_GROWTH_RESERVE_BYTES
POLICY = PoolRequestPolicy()


def validate(raw: str | bytes) -> ValidatedRequest | Rejection:
    return parse_and_validate(raw, policy=POLICY, in_scope=lambda _cluster: True)


# ------------------------------------------------------------------------------- whole strings


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"poolName": "gpu\n"}, "poolName"),
        ({"requestId": "req-0001\n"}, "requestId"),
        ({"requester": "team-vision@contoso.com\n"}, "requester"),
        ({"cluster": CLUSTER + "\n"}, "cluster"),
        ({"vmSize": "Standard_NC4as_T4_v3\n"}, "vmSize"),
        ({"vmSize": " Standard_NC4as_T4_v3"}, "vmSize"),
        ({"taints": ["sku=gpu:NoSchedule\n"]}, "taints[0]"),
        ({"labels": {"team": "vision\n"}}, 'labels[\'team\']'),
        ({"labels": {"team\n": "vision"}}, "labels['team\\n']"),
        ({"labels": {"example.com\n/team": "vision"}}, "labels['example.com\\n/team']"),
    ],
    ids=["pool name", "request id", "requester", "cluster id", "vm size with a newline", "vm size with a blank",
         "taint", "label value", "label key", "label key prefix"],
)
def test_a_trailing_newline_does_not_pass_a_pattern(overrides: dict[str, Any], field: str) -> None:
    result = validate(message(**overrides))
    assert isinstance(result, Rejection), f"{overrides} was accepted"
    assert any(p.field == field for p in result.problems), [str(p) for p in result.problems]


def test_a_newline_in_an_identifier_does_not_become_the_id_a_rejection_is_filed_under() -> None:
    result = validate(message(requestId="req-0001\n", poolName="GPU"))
    assert isinstance(result, Rejection) and result.request_id is None


def test_the_same_fields_without_the_newline_are_accepted() -> None:
    assert isinstance(validate(message(taints=["sku=gpu:NoSchedule"], labels={"example.com/team": "vision"})),
                      ValidatedRequest)


# ------------------------------------------------------------------------------- too large to record


def largest_valid_request() -> dict[str, Any]:
    """47 tags of 512-character names and 256-character values: valid field by field, ~36 KB."""
    tags = {f"k{i:02d}" + "x" * 509: "v" * 256 for i in range(47)}
    return request(tags=tags)


def test_the_largest_valid_request_is_about_36_kb_and_passes_validation() -> None:
    raw = json.dumps(largest_valid_request())
    assert 35_000 < len(raw) < 38_000
    assert isinstance(validate(raw), ValidatedRequest)


def test_a_valid_request_too_large_to_record_is_rejected_before_anything_is_published() -> None:
    world = make_world()
    raw = json.dumps(largest_valid_request())
    outcome = accept(raw, dequeue_count=1, ctx=world.ctx)  # used to raise Invalid after Accepted went out
    assert outcome.status == "rejected"
    assert world.events.types() == ["Steward.PoolRequest.Rejected"]
    [event] = world.events.published
    assert "too large to record" in event["data"]["reasons"][0]
    stored = world.ledger.get(KIND, "req-0001")
    assert stored is not None and stored.state == "rejected"
    assert stored.data["digest"] == hashlib.sha256(raw.encode()).hexdigest()
    assert world.aks.puts == []


def test_a_corrected_smaller_request_may_then_reuse_the_id() -> None:
    world = make_world()
    assert accept(json.dumps(largest_valid_request()), dequeue_count=1, ctx=world.ctx).status == "rejected"
    assert accept(message(), dequeue_count=1, ctx=world.ctx).status == "accepted"
    assert world.events.types() == ["Steward.PoolRequest.Rejected", "Steward.PoolRequest.Accepted"]


def test_a_request_just_inside_the_budget_is_accepted_and_leaves_room_for_its_progress() -> None:
    world = make_world()
    tags = {f"k{i:02d}" + "x" * 200: "v" * 150 for i in range(26)}  # ~9.3 K characters: ~19 KB stored
    assert accept(message(tags=tags), dequeue_count=1, ctx=world.ctx).status == "accepted"
    stored = world.ledger.get(KIND, "req-0001")
    assert stored is not None
    size = len(to_entity(stored)["data"].encode("utf-16-le"))
    assert size <= RECORD_START_BUDGET_BYTES < PROPERTY_LIMIT_BYTES


def test_non_ascii_tag_values_count_at_their_escaped_size() -> None:
    world = make_world()
    tags = {f"k{i:02d}": "é" * 100 for i in range(47)}  # a ~10 KB message, ~57 KB as escaped UTF-16 JSON
    raw = json.dumps(request(tags=tags), ensure_ascii=False)
    assert len(raw.encode()) < 11_000
    outcome = accept(raw, dequeue_count=1, ctx=world.ctx)
    assert outcome.status == "rejected" and "too large to record" in outcome.message
    assert "Steward.PoolRequest.Accepted" not in world.events.types()


# ------------------------------------------------------------------------------- evidence


def test_the_head_of_a_message_is_escaped_to_printable_ascii_and_can_be_read_back() -> None:
    data = b'{"a":"\x00\n\\\xff\xe9"}' + b"z" * 400
    head = escape_head(data)
    assert head.startswith('{"a":"\\x00\\x0a\\x5c\\xff\\xe9"}')
    assert all(0x20 <= ord(c) < 0x7F for c in head)
    assert head.count("z") == HEAD_BYTES - len(b'{"a":"\x00\n\\\xff\xe9"}')
    unescaped = head.encode("ascii").decode("unicode_escape").encode("latin-1")
    assert unescaped == data[:HEAD_BYTES]


@pytest.mark.parametrize(
    "raw",
    [b"\x00\x01 not json \xff", "make me a pool\n<script>", message(vmSize="Standard_D4s_v5"),
     message(requestId="a\n")],
    ids=["binary", "text", "a valid json request with a bad size", "a bad request id"],
)
def test_every_rejection_records_and_announces_the_digest_size_and_head_of_the_message(raw: str | bytes) -> None:
    world = make_world()
    outcome = accept(raw, dequeue_count=1, ctx=world.ctx)
    assert outcome.status == "rejected"
    data = raw.encode() if isinstance(raw, str) else raw
    expected = {"digest": hashlib.sha256(data).hexdigest(), "messageBytes": len(data),
                "messageHead": escape_head(data)}  # the event's wire names; the record keeps them in snake_case
    stored = world.ledger.get(KIND, outcome.request_id)
    assert stored is not None
    assert {k: stored.data[k] for k in ("digest", "message_bytes", "message_head")} == {
        "digest": expected["digest"], "message_bytes": len(data), "message_head": escape_head(data)}
    [event] = world.events.published
    assert {k: event["data"][k] for k in expected} == expected


def test_a_reused_request_id_rejection_carries_the_evidence_too() -> None:
    world = make_world()
    assert accept(message(), dequeue_count=1, ctx=world.ctx).status == "accepted"
    second = message(count=2)
    outcome = accept(second, dequeue_count=1, ctx=world.ctx)
    assert outcome.status == "rejected"
    rejected = world.events.published[-1]
    assert rejected["type"] == "Steward.PoolRequest.Rejected"
    assert rejected["data"]["digest"] == hashlib.sha256(second.encode()).hexdigest()
    assert rejected["data"]["messageHead"] == escape_head(second.encode())


def test_a_message_with_hundreds_of_problems_is_still_recorded_and_says_how_many_there_were() -> None:
    world = make_world()
    tags = {f"bad<{i}>" + "x" * 60: "v" for i in range(400)}  # every tag name invalid, ~30 KB
    raw = message(tags=tags)
    assert len(raw) < POLICY.max_payload_bytes
    outcome = accept(raw, dequeue_count=1, ctx=world.ctx)  # used to fail the ledger write, retried to poison
    assert outcome.status == "rejected"
    stored = world.ledger.get(KIND, outcome.request_id)
    assert stored is not None and stored.data["problem_count"] > 400
    assert 0 < len(stored.data["problems"]) <= 20
    assert "more" in stored.data["message"].splitlines()[-1]
    [event] = world.events.published
    assert event["data"]["problemCount"] == stored.data["problem_count"]


def test_a_request_accepted_at_the_edge_of_the_budget_can_still_record_a_long_failure() -> None:
    from shared.kernel.errors import Invalid
    from shared.kernel.reconciler import reconcile_once
    from shared.pools import steps as pool_steps

    world = make_world()
    # Grow the tags until the request is as large as accept() still takes.
    tags: dict[str, str] = {}
    for i in range(47):
        candidate = {**tags, f"k{i:02d}" + "x" * 300: "v" * 256}
        stored = accept(message(tags=candidate, requestId=f"probe-{i}"), dequeue_count=1, ctx=make_world().ctx)
        if stored.status != "accepted":
            break
        tags = candidate
    assert accept(message(tags=tags), dequeue_count=1, ctx=world.ctx).status == "accepted"
    first = world.ledger.get(KIND, "req-0001")
    assert first is not None
    start = len(to_entity(first)["data"].encode("utf-16-le"))
    assert RECORD_START_BUDGET_BYTES - 2_000 < start <= RECORD_START_BUDGET_BYTES
    # Azure's error is kept (up to 2,000 characters) in the failed record twice (error, outcome).
    world.aks.faults.fail_always["begin_put_pool"] = Invalid("x" * 3_000, code="InvalidParameter")
    reconcile_once(world.ctx, modules={"pool-request": pool_steps})
    final = world.ledger.get(KIND, "req-0001")
    assert final is not None and final.state == "failed", final.state if final else None
    assert len(to_entity(final)["data"].encode("utf-16-le")) <= PROPERTY_LIMIT_BYTES

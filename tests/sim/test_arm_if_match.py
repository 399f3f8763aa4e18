"""Agent pool PUT and DELETE honour If-Match as AKS does (issue 11, "Confused deputy" 2).

AKS compares ``If-Match`` with the pool's ``properties.eTag`` and fails early with 412
``PreconditionFailed`` when the pool changed (learn.microsoft.com/azure/aks/use-etags; the spec's
``ifMatch`` parameter of AgentPools_CreateOrUpdate / AgentPools_Delete); with If-Match on a pool that
does not exist it answers 412 "Resource not found but ETag header is provided" (Azure/azure-cli#30309);
``If-None-Match: *`` (the spec's ``ifNoneMatch``) refuses to replace a pool that exists, with 412.
In-process on a manual sim clock, like test_arm_pool_writes_strict.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.core.http import Headers, Request, Response
from tests.sim.test_arm_pool_writes_strict import HOST, T4, Arm, arm_error, error

MANAGED = {"driver": "Install", "nvidia": {"managementMode": "Managed"}}


def call(arm: Arm, method: str, name: str, props: dict[str, Any] | None = None, **headers: str) -> Response:
    h = Headers({"Host": HOST, "Authorization": f"Bearer {arm.token}", **headers})
    payload = json.dumps({"properties": props}).encode() if props is not None else b""
    return arm.api.handle(Request(method, f"{arm.pool_path(name)}?api-version=2026-08-01", h, payload))


@pytest.fixture
def arm() -> Arm:
    return Arm()


def _pool(arm: Arm, name: str = "gpu") -> str:
    props = arm.created(name, {"vmSize": T4, "count": 1, "mode": "User", "osType": "Linux", "gpuProfile": MANAGED})
    return str(props["eTag"])


def test_every_write_to_a_pool_gives_it_a_new_etag(arm: Arm) -> None:
    first = _pool(arm)
    resp = call(arm, "PUT", "gpu", {**_writable(arm), "count": 2}, **{"If-Match": first})
    assert resp.status == 200, resp.body
    arm.fleet.advance(120)
    assert arm.props("gpu")["eTag"] != first


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_a_write_with_a_stale_etag_is_refused_with_412_and_changes_nothing(arm: Arm, method: str) -> None:
    stale = _pool(arm)
    assert call(arm, "PUT", "gpu", {**_writable(arm), "count": 2}).status == 200
    arm.fleet.advance(120)
    resp = call(arm, method, "gpu", {**_writable(arm), "count": 3} if method == "PUT" else None,
                **{"If-Match": stale})
    assert error(resp)[:2] == (412, "PreconditionFailed")
    props = arm.props("gpu")
    assert props["count"] == 2 and props["provisioningState"] == "Succeeded"


@pytest.mark.parametrize("form", ["quoted", "bare", "star", "one-of-a-list"])
def test_the_current_etag_in_any_form_lets_the_delete_through(arm: Arm, form: str) -> None:
    tag = _pool(arm)
    header = {"quoted": tag, "bare": tag.strip('"'), "star": "*", "one-of-a-list": f'"other", {tag}'}[form]
    resp = call(arm, "DELETE", "gpu", **{"If-Match": header})
    assert resp.status == 202, resp.body


def test_if_match_on_a_pool_that_does_not_exist_is_412_and_without_it_the_delete_is_204(arm: Arm) -> None:
    resp = call(arm, "DELETE", "nosuch", **{"If-Match": '"abc"'})
    assert error(resp)[:2] == (412, "PreconditionFailed")
    assert "Resource not found but ETag header is provided" in arm_error(resp)["message"]
    assert call(arm, "DELETE", "nosuch").status == 204


def test_if_none_match_star_creates_a_new_pool_and_refuses_to_replace_an_existing_one(arm: Arm) -> None:
    props = {"vmSize": T4, "count": 1, "mode": "User", "osType": "Linux", "gpuProfile": MANAGED}
    assert call(arm, "PUT", "fresh", props, **{"If-None-Match": "*"}).status in (200, 201)
    arm.fleet.advance(300)
    resp = call(arm, "PUT", "fresh", {**props, "count": 3}, **{"If-None-Match": "*"})
    assert error(resp)[:2] == (412, "PreconditionFailed")
    assert arm.props("fresh")["count"] == 1


def _writable(arm: Arm) -> dict[str, Any]:
    return {k: v for k, v in arm.props("gpu").items()
            if k not in ("provisioningState", "eTag", "nodeImageVersion", "currentOrchestratorVersion", "powerState")}


@pytest.mark.parametrize("form", ["weak", "weak-in-a-list"])
def test_a_weak_etag_never_matches_if_match_even_with_the_current_value(arm: Arm, form: str) -> None:
    # RFC 9110 §13.1.1: If-Match uses the strong comparison function, under which a weak tag matches nothing
    tag = _pool(arm)
    weak = f'W/"{tag.strip(chr(34))}"'
    header = {"weak": weak, "weak-in-a-list": f'"other", {weak}'}[form]
    resp = call(arm, "DELETE", "gpu", **{"If-Match": header})
    assert error(resp)[:2] == (412, "PreconditionFailed")
    assert arm.props("gpu")["provisioningState"] == "Succeeded"

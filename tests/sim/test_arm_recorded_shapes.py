"""The simulated AKS resource provider answers as the recorded AKS traffic does (tests/replay/recordings/*.json,
read its README first): who shapes an error (ARM's gateway wraps, the AKS RP answers flat), the operations'
status bodies and headers, abort -> Canceled, pools without an eTag, GPU pool defaults, and the agentPools
list's ``nextLink``. In-process on a manual sim clock (no sleeps); the SDK's view is in test_arm_sdk.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from sim.arm import rbac as armrbac
from sim.arm.api import ArmApi
from sim.arm.reads import pools_next_link
from sim.core.http import Headers, Request, Response
from sim.identity import APP_PRINCIPAL_ID
from sim.scenario import ScenarioError, build_fleet
from tests.sim.test_arm_handler import ARM, HOST, SUB, T4, Arm, body

RECORDINGS = Path(__file__).resolve().parents[1] / "replay" / "recordings"
FLAT_KEYS = {"code", "message", "subcode", "details"}


def recorded(file: str, name: str) -> dict[str, Any]:
    doc = json.loads((RECORDINGS / file).read_text())
    return dict(next(e for e in doc["exchanges"] if e["name"] == name))


def is_flat(resp: Response) -> bool:
    """The AKS RP's shape: ``{"code", "message", "target"?, "subcode": "", "details": null}``, never wrapped."""
    b = body(resp)
    return FLAT_KEYS <= set(b) <= FLAT_KEYS | {"target"} and b["subcode"] == "" and b["details"] is None


def is_wrapped(resp: Response) -> bool:
    """ARM's gateway shape: ``{"error": {"code", "message", ...}}`` and nothing else."""
    b = body(resp)
    return set(b) == {"error"} and {"code", "message"} <= set(b["error"])


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlparse(url).query)


@pytest.fixture
def arm() -> Arm:
    return Arm()


# --------------------------------------------------------------------------- 1. error bodies


def test_a_cluster_that_does_not_exist_is_the_gateways_wrapped_resource_not_found_as_recorded(arm: Arm) -> None:
    rec = recorded("test_aks_abort.json", "get_cluster_404")["response"]
    path = f"/subscriptions/{SUB}/resourceGroups/clitest000001/providers/Microsoft.ContainerService/managedClusters/" \
           "cliakstest000002"
    resp = arm.call("GET", path)
    assert (resp.status, body(resp)) == (rec["status"], rec["body"])


@pytest.mark.parametrize(("call", "status", "code"), [
    pytest.param(lambda a: a.call("GET", a.cluster.id, token=None), 401, "AuthenticationFailed", id="no-token"),
    pytest.param(lambda a: a.call("GET", a.cluster.id, token="abc.def"), 401, "InvalidAuthenticationToken",
                 id="bad-token"),
    pytest.param(lambda a: a.call("GET", a.cluster.id, api_version="2019-04-01"), 400, "InvalidApiVersionParameter",
                 id="bad-api-version"),
    pytest.param(lambda a: a.call("GET", f"{a.cluster.id}/nothingHere"), 404, "NotFound", id="unknown-route"),
    pytest.param(lambda a: a.call("PATCH", a.pool_path("sys")), 405, "MethodNotAllowed", id="method"),
    pytest.param(lambda a: a.call("PUT", a.pool_path("gpu"), raw=b"{not json"), 400, "InvalidRequestContent",
                 id="unreadable-body"),
    pytest.param(lambda a: a.call("GET", a.cluster.id.replace("/c1", "/zz") + "/agentPools"), 404, "ResourceNotFound",
                 id="pools-of-a-missing-cluster"),
])
def test_errors_of_arms_gateway_stay_wrapped(arm: Arm, call: Any, status: int, code: str) -> None:
    resp = call(arm)
    assert (resp.status, body(resp)["error"]["code"]) == (status, code)
    assert is_wrapped(resp)


def test_an_authorization_failure_is_the_gateways_wrapped_403() -> None:
    arm = Arm()
    app = arm.fleet.tokens.issue(ARM, principal=APP_PRINCIPAL_ID, client_id="c", groups=())[0]
    arm.fleet.revoked_arm_actions = {"Microsoft.ContainerService/managedClusters/agentPools/read"}
    resp = arm.call("GET", arm.pool_path("sys"), token=app)
    assert (resp.status, body(resp)["error"]["code"]) == (403, "AuthorizationFailed") and is_wrapped(resp)


def test_a_throttled_request_is_the_gateways_wrapped_429() -> None:
    arm = Arm(faults=[{"target": "arm", "method": "GET", "path": "/agentPools/sys$", "status": 429, "count": 1}])
    resp = arm.call("GET", arm.pool_path("sys"))
    assert resp.status == 429 and is_wrapped(resp)


def _busy(arm: Arm) -> Response:
    arm.create("gpu", {"vmSize": T4, "count": 1})
    return arm.create("gpu", {"vmSize": T4, "count": 1})


@pytest.mark.parametrize(("call", "status", "code"), [
    pytest.param(lambda a: a.call("GET", a.pool_path("nope")), 404, "NotFound", id="pool-not-found"),
    pytest.param(lambda a: a.call("GET", f"{a.pool_path('sys')}/machines/nope"), 404, "NotFound",
                 id="machine-not-found"),
    pytest.param(lambda a: a.call("GET", f"{a.cluster.id}/maintenanceConfigurations/nope"), 404, "NotFound",
                 id="maintenance-not-found"),
    pytest.param(lambda a: a.create("GPU", {"vmSize": T4, "count": 1}), 400, "InvalidParameter", id="invalid-parameter"),
    pytest.param(_busy, 409, "OperationNotAllowed", id="operation-not-allowed"),
    pytest.param(lambda a: a.call("PUT", a.pool_path("sys"), {"properties": {"vmSize": "Standard_D8s_v5", "count": 2,
                                                                            "mode": "System"}}),
                 400, "PropertyChangeNotAllowed", id="property-change"),
    pytest.param(lambda a: a.call("DELETE", a.pool_path("sys"), headers={"If-Match": '"stale"'}), 412,
                 "PreconditionFailed", id="if-match"),
    pytest.param(lambda a: a.call("GET", f"/subscriptions/{SUB}/providers/Microsoft.ContainerService/locations/eastus"
                                         "/operations/x", api_version="2016-03-30"), 404, "NotFound",
                 id="operation-not-found"),
])
def test_errors_of_the_aks_resource_provider_are_flat(arm: Arm, call: Any, status: int, code: str) -> None:
    resp = call(arm)
    assert (resp.status, body(resp).get("code")) == (status, code), resp.body
    assert is_flat(resp)


def test_the_synchronous_quota_refusal_is_exactly_the_logged_flat_body() -> None:
    arm = Arm(quotas={(SUB, "eastus", "standardNCASv3_T4Family"): 4})
    resp = arm.create("gpu", {"vmSize": T4, "count": 2})
    assert resp.status == 400
    assert body(resp) == {"code": "ErrCode_InsufficientVCPUQuota", "message": body(resp)["message"], "subcode": "",
                          "details": None}


def test_a_failed_operation_keeps_its_error_inside_the_status_body() -> None:
    arm = Arm(capacity={("eastus", T4): 0})
    resp = arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(arm.fleet.timings["pool_create_s"])
    status = body(arm.follow(resp.headers["Azure-AsyncOperation"]))
    assert (status["status"], status["error"]["code"]) == ("Failed", "AllocationFailed")


# --------------------------------------------------------------------------- 2. long-running operations


def test_a_pool_create_answers_201_with_only_the_async_operation_header_at_api_version_2016_03_30(arm: Arm) -> None:
    resp = arm.create("gpu", {"vmSize": T4, "count": 1})
    rec = recorded("test_aks_create_gpu_driver_flow.json", "put_agentpool_create_gpu_driver_none")["response"]
    assert resp.status == rec["status"] == 201
    assert {k.lower() for k in resp.headers if k.lower() in ("azure-asyncoperation", "location", "retry-after")} == \
        {k for k in rec["headers"] if k in ("azure-asyncoperation", "location", "retry-after")}
    assert query(resp.headers["Azure-AsyncOperation"])["api-version"] == ["2016-03-30"]


@pytest.mark.parametrize("action", ["delete", "deleteMachines"])
def test_a_delete_or_an_action_answers_202_with_both_headers_at_api_version_2016_03_30(arm: Arm, action: str) -> None:
    arm.create("gpu", {"vmSize": T4, "count": 2})
    arm.advance(120)
    if action == "delete":
        resp = arm.call("DELETE", arm.pool_path("gpu"))
    else:
        victim = arm.cluster.pool_nodes("gpu")[0].name
        resp = arm.call("POST", f"{arm.pool_path('gpu')}/deleteMachines", {"machineNames": [victim]})
    assert resp.status == 202 and not resp.body
    for header in ("Azure-AsyncOperation", "Location"):
        assert query(resp.headers[header])["api-version"] == ["2016-03-30"]
    assert "/operationresults/" in resp.headers["Location"]


def test_the_operation_status_body_is_exactly_the_recorded_fields(arm: Arm) -> None:
    resp = arm.create("gpu", {"vmSize": T4, "count": 1})
    running = body(arm.follow(resp.headers["Azure-AsyncOperation"]))
    rec_running = recorded("test_aks_abort.json", "poll_operation_inprogress")["response"]["body"]
    assert set(running) == set(rec_running) == {"name", "status", "startTime"}
    assert running["status"] == "InProgress" and resp.headers["Azure-AsyncOperation"].split("?")[0].endswith(
        running["name"])
    arm.advance(arm.fleet.timings["pool_create_s"])
    done = body(arm.follow(resp.headers["Azure-AsyncOperation"]))
    rec_done = recorded("test_aks_abort.json", "poll_operation_succeeded")["response"]["body"]
    assert set(done) == set(rec_done) == {"name", "status", "startTime", "endTime"}
    assert done["status"] == "Succeeded"


def test_operation_results_answer_202_while_running_then_204_with_a_location(arm: Arm) -> None:
    arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    resp = arm.call("DELETE", arm.pool_path("gpu"))
    assert arm.follow(resp.headers["Location"]).status == 202
    arm.advance(arm.fleet.timings["pool_delete_s"])
    done = arm.follow(resp.headers["Location"])
    rec = recorded("test_aks_nodepool_delete_machines.json", "get_operationresult_204")["response"]
    assert (done.status, done.body) == (rec["status"], b"")
    assert "/operationresults/" in done.headers["Location"]
    assert query(done.headers["Location"])["api-version"] == ["2016-03-30"]


def test_no_aks_answer_carries_retry_after_by_default(arm: Arm) -> None:
    create = arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    delete = arm.call("DELETE", arm.pool_path("gpu"))
    answers = [create, delete, arm.follow(delete.headers["Azure-AsyncOperation"]), arm.follow(delete.headers["Location"])]
    assert all(not {"retry-after", "retry-after-ms"} & {k.lower() for k in r.headers} for r in answers)


def test_a_scenario_that_sets_lro_retry_after_s_gets_retry_after_as_a_harness_convenience() -> None:
    arm = Arm()
    arm.fleet.timings["lro_retry_after_s"] = 2
    resp = arm.create("gpu", {"vmSize": T4, "count": 1})
    assert resp.headers["Retry-After"] == "2"
    assert arm.follow(resp.headers["Azure-AsyncOperation"]).headers["Retry-After"] == "2"
    fleet = build_fleet({"clock": {"manual": True}, "timings": {"lro_retry_after_s": 1}}, seed=1)
    assert fleet.timings["lro_retry_after_s"] == 1.0
    assert "lro_retry_after_s" not in build_fleet({"clock": {"manual": True}}, seed=1).timings


@pytest.mark.parametrize("api_version", ["2016-03-30", "2026-08-01"])
def test_the_operation_routes_accept_the_recorded_and_the_resource_api_versions(arm: Arm, api_version: str) -> None:
    resp = arm.create("gpu", {"vmSize": T4, "count": 1})
    url = resp.headers["Azure-AsyncOperation"].split("?")[0][len(f"https://{HOST}"):]
    assert arm.call("GET", url, api_version=api_version).status == 200
    assert arm.call("GET", url, api_version="2019-04-01").status == 400


# --------------------------------------------------------------------------- 3. abort


def _abort(arm: Arm, pool: str | None = None) -> Response:
    target = arm.pool_path(pool) if pool else arm.cluster.id
    return arm.call("POST", f"{target}/abort")


def test_a_cluster_abort_answers_202_with_the_cluster_and_cancels_its_running_pool_create(arm: Arm) -> None:
    create = arm.create("gpu", {"vmSize": T4, "count": 2})
    resp = _abort(arm)
    rec = recorded("test_aks_abort.json", "abort_cluster")["response"]
    assert resp.status == rec["status"] == 202
    assert {"Azure-AsyncOperation", "Location"} <= set(resp.headers)
    assert query(resp.headers["Location"])["api-version"] == ["2016-03-30"]
    assert {"id", "name", "type", "location", "properties"} <= set(body(resp)) <= set(rec["body"]) | {"tags"}
    pools = {p["name"]: p["provisioningState"] for p in body(resp)["properties"]["agentPoolProfiles"]}
    assert pools["gpu"] == "Creating", "still Creating in the 202, as recorded"
    # the abort's own operation: InProgress, then Succeeded; its result 204
    assert body(arm.follow(resp.headers["Azure-AsyncOperation"]))["status"] == "InProgress"
    assert body(arm.follow(create.headers["Azure-AsyncOperation"]))["status"] == "InProgress"
    arm.advance(arm.fleet.timings["abort_s"])
    assert body(arm.follow(resp.headers["Azure-AsyncOperation"]))["status"] == "Succeeded"
    assert arm.follow(resp.headers["Location"]).status == 204
    # afterwards: cluster and pool Canceled (recorded get_cluster_canceled)
    cluster = body(arm.call("GET", arm.cluster.id))
    assert cluster["properties"]["provisioningState"] == "Canceled"
    assert {p["name"]: p["provisioningState"] for p in cluster["properties"]["agentPoolProfiles"]}["gpu"] == "Canceled"
    canceled = body(arm.follow(create.headers["Azure-AsyncOperation"]))
    assert set(canceled) == {"name", "status", "startTime", "endTime", "error"} and canceled["status"] == "Canceled"
    arm.advance(arm.fleet.timings["pool_create_s"] * 2)
    assert arm.pool("gpu")["properties"]["provisioningState"] == "Canceled"
    assert arm.cluster.pool_nodes("gpu") == [], "the aborted create's work never happens"


def test_an_aborted_scale_keeps_the_old_count_and_nodes(arm: Arm) -> None:
    current = arm.pool("sys")
    current["properties"]["count"] = 4
    assert arm.call("PUT", arm.pool_path("sys"), current).status == 200
    resp = _abort(arm, "sys")
    assert resp.status == 202 and body(resp)["name"] == "sys"
    arm.advance(arm.fleet.timings["pool_scale_s"] * 2)
    after = arm.pool("sys")["properties"]
    assert (after["count"], after["provisioningState"]) == (2, "Canceled")
    assert len(arm.cluster.pool_nodes("sys")) == 2


def test_an_aborted_delete_keeps_the_pool(arm: Arm) -> None:
    arm.create("gpu", {"vmSize": T4, "count": 1})
    arm.advance(120)
    delete = arm.call("DELETE", arm.pool_path("gpu"))
    assert _abort(arm, "gpu").status == 202
    arm.advance(arm.fleet.timings["pool_delete_s"] * 2)
    assert arm.pool("gpu")["properties"]["provisioningState"] == "Canceled"
    assert len(arm.cluster.pool_nodes("gpu")) == 1
    assert body(arm.follow(delete.headers["Azure-AsyncOperation"]))["status"] == "Canceled"


def test_an_aborted_delete_machines_keeps_the_machines(arm: Arm) -> None:
    victim = arm.cluster.pool_nodes("sys")[0].name
    assert arm.call("POST", f"{arm.pool_path('sys')}/deleteMachines", {"machineNames": [victim]}).status == 202
    assert _abort(arm, "sys").status == 202
    arm.advance(arm.fleet.timings["delete_machines_s"] * 2)
    assert victim in [n.name for n in arm.cluster.pool_nodes("sys")]
    assert arm.pool("sys")["properties"]["count"] == 2


def test_a_canceled_pool_accepts_the_next_write(arm: Arm) -> None:
    arm.create("gpu", {"vmSize": T4, "count": 1})
    _abort(arm, "gpu")
    arm.advance(arm.fleet.timings["abort_s"])
    assert arm.create("gpu", {"vmSize": T4, "count": 1}).status == 200
    arm.advance(arm.fleet.timings["pool_create_s"])
    assert arm.pool("gpu")["properties"]["provisioningState"] == "Succeeded"
    assert len(arm.cluster.pool_nodes("gpu")) == 1


@pytest.mark.parametrize("pool", [None, "sys"], ids=["cluster", "pool"])
def test_an_abort_with_nothing_running_is_a_flat_409(arm: Arm, pool: str | None) -> None:
    resp = _abort(arm, pool)
    assert (resp.status, body(resp)["code"]) == (409, "OperationNotAllowed") and is_flat(resp)


@pytest.mark.parametrize(("route", "action"), [
    ("cluster_abort", "Microsoft.ContainerService/managedClusters/abort/action"),
    ("pool_abort", "Microsoft.ContainerService/managedClusters/agentPools/abort/action"),
])
def test_an_abort_needs_its_rbac_action(route: str, action: str) -> None:
    assert armrbac.route_action(route, "POST", {}) == action
    arm = Arm()
    arm.create("gpu", {"vmSize": T4, "count": 1})
    app = arm.fleet.tokens.issue(ARM, principal=APP_PRINCIPAL_ID, client_id="c", groups=())[0]
    arm.fleet.revoked_arm_actions = {action}
    resp = arm.call("POST", f"{arm.pool_path('gpu') if route == 'pool_abort' else arm.cluster.id}/abort", token=app)
    assert (resp.status, body(resp)["error"]["code"]) == (403, "AuthorizationFailed")
    assert f"'{action}'" in body(resp)["error"]["message"]


# --------------------------------------------------------------------------- 4. pools without an eTag


def _scenario_arm(pool_etags: bool | None) -> tuple[ArmApi, Any, str]:
    cluster: dict[str, Any] = {"name": "c1", "resource_group": "rg1",
                               "pools": [{"name": "sys", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1}]}
    if pool_etags is not None:
        cluster["pool_etags"] = pool_etags
    fleet = build_fleet({"clock": {"manual": True}, "subscriptions": [{"id": SUB, "clusters": [cluster]}]}, seed=1)
    return ArmApi(fleet), fleet.clusters[next(iter(fleet.clusters))], fleet.tokens.issue(ARM)[0]


def _send(api: ArmApi, token: str, method: str, path: str, props: dict[str, Any] | None = None,
          **headers: str) -> Response:
    h = Headers({"Host": HOST, "Authorization": f"Bearer {token}", **headers})
    payload = json.dumps({"properties": props}).encode() if props is not None else b""
    return api.handle(Request(method, f"{path}?api-version=2026-08-01", h, payload))


def test_a_cluster_with_pool_etags_false_shows_no_etag_anywhere() -> None:
    api, c, token = _scenario_arm(False)
    created = _send(api, token, "PUT", f"{c.id}/agentPools/gpu", {"vmSize": T4, "count": 1})
    assert created.status == 201 and "eTag" not in body(created)["properties"]
    c.fleet.advance(120)
    got = _send(api, token, "GET", f"{c.id}/agentPools/gpu")
    listed = _send(api, token, "GET", f"{c.id}/agentPools")
    cluster = _send(api, token, "GET", c.id)
    assert "eTag" not in body(got)["properties"]
    assert all("eTag" not in p["properties"] for p in body(listed)["value"])
    assert all("eTag" not in p for p in body(cluster)["properties"]["agentPoolProfiles"])
    updated = _send(api, token, "PUT", f"{c.id}/agentPools/gpu", {"vmSize": T4, "count": 2})
    assert updated.status == 200 and "eTag" not in body(updated)["properties"]


def test_an_if_match_on_a_pool_without_an_etag_is_a_flat_412_and_star_still_matches() -> None:
    api, c, token = _scenario_arm(False)
    refused = _send(api, token, "PUT", f"{c.id}/agentPools/sys", {"vmSize": "Standard_D4s_v5", "count": 2,
                                                                  "mode": "System"}, **{"If-Match": '"abc"'})
    assert (refused.status, body(refused)["code"]) == (412, "PreconditionFailed") and is_flat(refused)
    assert c.pools["sys"].properties["count"] == 1
    star = _send(api, token, "PUT", f"{c.id}/agentPools/sys", {"vmSize": "Standard_D4s_v5", "count": 2,
                                                               "mode": "System"}, **{"If-Match": "*"})
    assert star.status == 200


def test_by_default_pools_written_through_arm_carry_an_etag() -> None:
    api, c, token = _scenario_arm(None)
    created = _send(api, token, "PUT", f"{c.id}/agentPools/gpu", {"vmSize": T4, "count": 1})
    assert body(created)["properties"]["eTag"]


def test_pool_etags_must_be_a_boolean() -> None:
    with pytest.raises(ScenarioError, match="pool_etags"):
        build_fleet({"subscriptions": [{"id": SUB, "clusters": [{"name": "c1", "resource_group": "rg1",
                                                                  "pool_etags": "no"}]}]}, seed=1)


# --------------------------------------------------------------------------- 6. GPU pool defaults


def test_a_nc6s_v3_pool_without_disk_settings_gets_the_recorded_defaults(arm: Arm) -> None:
    rec = recorded("test_aks_create_gpu_driver_flow.json", "put_agentpool_create_gpu_driver_none")
    sent = rec["request"]["body"]["properties"]
    resp = arm.create("c000002", sent, api_version="2026-07-01")
    assert resp.status == 201, resp.body
    props, want = body(resp)["properties"], rec["response"]["body"]["properties"]
    for key in ("vmSize", "osDiskSizeGB", "osDiskType", "kubeletDiskType", "maxPods", "osSKU", "gpuProfile"):
        assert props[key] == want[key], key


@pytest.mark.parametrize(("given", "disk"), [
    pytest.param({"osDiskType": "Managed"}, ("Managed", 128), id="explicit-managed"),
    pytest.param({"osDiskSizeGB": 512}, ("Managed", 512), id="too-big-for-the-cache"),
    pytest.param({"osDiskSizeGB": 200}, ("Ephemeral", 200), id="fits-the-cache"),
])
def test_an_explicit_disk_setting_is_honoured(arm: Arm, given: dict[str, Any], disk: tuple[str, int]) -> None:
    props = body(arm.create("v100", {"vmSize": "Standard_NC6s_v3", "count": 1, **given}))["properties"]
    assert (props["osDiskType"], props["osDiskSizeGB"]) == disk


def test_sizes_without_a_recorded_ephemeral_default_keep_a_managed_128_gb_disk(arm: Arm) -> None:
    props = body(arm.create("gpu", {"vmSize": T4, "count": 1}))["properties"]
    assert (props["osDiskType"], props["osDiskSizeGB"], props["maxPods"]) == ("Managed", 128, 250)


def test_a_scenario_pool_gets_the_same_defaults_so_a_put_leaving_them_out_changes_nothing() -> None:
    fleet = build_fleet({"clock": {"manual": True}, "subscriptions": [{"id": SUB, "clusters": [{
        "name": "c1", "resource_group": "rg1", "pools": [
            {"name": "sys", "mode": "System", "vmSize": "Standard_D4s_v5", "count": 1},
            {"name": "v100", "vmSize": "Standard_NC6s_v3", "count": 1},
            {"name": "v100m", "vmSize": "Standard_NC6s_v3", "count": 1, "osDiskType": "Managed"}]}]}]}, seed=1)
    c = fleet.clusters[next(iter(fleet.clusters))]
    assert (c.pools["v100"].properties["osDiskType"], c.pools["v100"].properties["osDiskSizeGB"]) == ("Ephemeral", 320)
    assert (c.pools["v100m"].properties["osDiskType"], c.pools["v100m"].properties["osDiskSizeGB"]) == ("Managed", 128)
    api, token = ArmApi(fleet), fleet.tokens.issue(ARM)[0]
    resp = _send(api, token, "PUT", f"{c.id}/agentPools/v100", {"vmSize": "Standard_NC6s_v3", "count": 2})
    assert resp.status == 200, resp.body


# --------------------------------------------------------------------------- 7. agentPools nextLink


def test_the_pool_list_has_a_next_link_whose_page_is_empty_as_recorded(arm: Arm) -> None:
    first = body(arm.call("GET", f"{arm.cluster.id}/agentPools"))
    assert [p["name"] for p in first["value"]] == ["sys"]
    link = first["nextLink"]
    rec_link = recorded("test_aks_create_gpu_driver_flow.json", "list_agentpools")["response"]["body"]["nextLink"]
    assert urlparse(link).path == f"{arm.cluster.id}/agentPools"
    assert set(query(link)) == set(query(rec_link)) == {"$skipToken", "api-version", "skipToken"}
    assert query(link)["api-version"] == ["2026-08-01"]
    page = arm.follow(link)
    rec_page = recorded("test_aks_create_gpu_driver_flow.json", "list_agentpools_next_page_empty")["response"]["body"]
    assert body(page) == rec_page == {"value": []}


@pytest.mark.parametrize(("api_version", "has_link"), [
    ("2023-10-02-preview", False), ("2025-04-02-preview", True), ("2025-10-01", True), ("2026-08-02-preview", True)])
def test_the_next_link_starts_with_api_version_2025_04_02_preview(api_version: str, has_link: bool) -> None:
    assert pools_next_link(api_version) is has_link

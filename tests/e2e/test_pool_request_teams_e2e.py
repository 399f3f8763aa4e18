"""Two teams, two queues, through the local Functions host: the queue decides who asked and what is allowed.

``vision`` may use only e2e-pools, the default sizes (T4, A10) and 8 GPUs per request; ``research``
may use every cluster in scope, A100s and 64 GPUs. Both send with the claimed requester of the
other team. Results are read from the ledger, ARM and the published events.
"""

from __future__ import annotations

import json

from tests.e2e.conftest import Fleet

SUB = "5e2e0000-0000-4000-8000-000000000001"
POOLS = f"/subscriptions/{SUB}/resourceGroups/rg-e2e/providers/Microsoft.ContainerService/managedClusters/e2e-pools"
T4 = "Standard_NC4as_T4_v3"
A100 = "Standard_NC24ads_A100_v4"
H100 = "Standard_ND96isr_H100_v5"

E2E_SETTINGS = {"POOL_REQUEST_TEAMS": json.dumps({
    "vision": {"clusters": [POOLS]},
    "research": {"clusters": "*", "sizes": [A100, T4], "maxGpusPerRequest": 64, "queue": "research-pool-requests"},
})}


def test_each_teams_queue_has_its_own_trigger_and_records_the_team_as_requester(fleet: Fleet) -> None:
    fleet.submit(fleet.request(request_id="teams-vision-ok", pool="visnt4", vmSize=T4, count=1, requester="research"),
                 team="vision")
    fleet.submit(fleet.request(request_id="teams-research-ok", pool="resa100", cluster="e2e-nap", vmSize=A100, count=1,
                               requester="vision"), team="research")
    vision = fleet.outcome("teams-vision-ok")
    research = fleet.outcome("teams-research-ok")
    assert (vision.state, research.state) == ("succeeded", "succeeded"), fleet.describe(vision) + fleet.describe(research)
    assert (vision.data["requester"], vision.data["claimed_requester"]) == ("vision", "research")
    assert (research.data["requester"], research.data["claimed_requester"]) == ("research", "vision")
    assert fleet.arm_pool("e2e-pools", "visnt4")["tags"]["gpu-fleet-steward-requester"] == "vision"
    logs = fleet.host_logs()
    assert "Executed 'Functions.pool_requests_vision' (Succeeded" in logs
    assert "Executed 'Functions.pool_requests_research' (Succeeded" in logs


def test_a_request_outside_the_teams_mapping_is_rejected_naming_the_rule_and_touches_nothing(fleet: Fleet) -> None:
    before = fleet.requests()
    fleet.submit(fleet.request(request_id="teams-vision-h100", pool="vish100", cluster="e2e-nap", vmSize=H100,
                               count=125, requester="research"), team="vision")
    record = fleet.outcome("teams-vision-h100")
    assert record.state == "rejected" and record.data["requester"] == "vision"
    assert [p["field"] for p in record.data["problems"]] == ["cluster", "vmSize", "count"]
    assert all("team 'vision'" in r and "POOL_REQUEST_TEAMS" in r for r in record.data["reasons"])
    events = fleet.events_when("teams-vision-h100", types={"Steward.PoolRequest.Rejected"})
    assert [e["type"] for e in events] == ["Steward.PoolRequest.Rejected"]
    assert "vish100" not in fleet.arm_pool_names("e2e-nap")
    new_puts = fleet.requests() - before
    assert not [k for k in new_puts if k.startswith("PUT ") and "/agentPools/" in k]

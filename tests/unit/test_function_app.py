"""The function app registers one thin trigger per job, each handing its input to one entry point."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any
from unittest import mock

import azure.functions as func
import pytest
from azure.functions.queue import QueueMessage
from azure.functions.timer import TimerRequest

import function_app
from functions import pool_requests
from shared import entrypoints
from shared.pools import teams

FUNCTIONS = {f.get_function_name(): f for f in function_app.app.get_functions()}


def bindings(name: str) -> dict[str, dict[str, Any]]:
    return {b["name"]: b for b in json.loads(FUNCTIONS[name].get_function_json())["bindings"]}


# The pool-request functions are one per team of POOL_REQUEST_TEAMS (tests/unit/test_function_app_teams.py);
# this process sets no team, so the app has the six functions of the other jobs.
APP_FUNCTIONS = set(FUNCTIONS)
TEAM = teams.Team(name="vision", queue="gpu-pool-requests-vision", clusters=None)
_team_bp = func.Blueprint()
_TEAMS_SETTING = json.dumps({TEAM.name: {"clusters": "*", "queue": TEAM.queue}})
pool_requests.register(_team_bp, entrypoints.pool_request_queues({"POOL_REQUEST_TEAMS": _TEAMS_SETTING}))
_team_app = func.FunctionApp()
_team_app.register_functions(_team_bp)
FUNCTIONS.update({f.get_function_name(): f for f in _team_app.get_functions()})


def test_the_app_registers_exactly_the_six_functions_of_the_other_jobs_when_no_team_is_set() -> None:
    assert set(APP_FUNCTIONS) == {"reconcile_timer", "reconcile_nudge", "health_sweep", "remediation_events", "health_events",
                                  "migration_planner"}


@pytest.mark.parametrize(
    ("function", "trigger", "setting"),
    [("reconcile_nudge", "queueTrigger", "%NUDGE_QUEUE%"),
     ("reconcile_timer", "timerTrigger", "%RECONCILE_SCHEDULE%"), ("health_sweep", "timerTrigger", "%SWEEP_SCHEDULE%"),
     ("migration_planner", "timerTrigger", "%MIGRATION_SCHEDULE%"), ("remediation_events", "eventGridTrigger", None),
     ("health_events", "eventGridTrigger", None)],
    ids=lambda v: str(v),
)
def test_every_trigger_takes_its_queue_or_schedule_from_an_app_setting(function: str, trigger: str,
                                                                        setting: str | None) -> None:
    triggers = [b for b in bindings(function).values() if b["type"] == trigger]
    assert len(triggers) == 1
    if setting:
        assert setting in (triggers[0].get("queueName"), triggers[0].get("schedule"))


def test_a_pool_request_message_is_handed_over_with_its_dequeue_count_and_nudges_the_reconciler() -> None:
    out = mock.Mock()
    result = entrypoints.PoolRequestResult(status="accepted", request_id="r1", nudge="pool-request:r1")
    with mock.patch.object(entrypoints, "handle_pool_request", return_value=result) as handle:
        FUNCTIONS["pool_requests_vision"].get_user_function()(
            QueueMessage(id="m1", body=b'{"requestId": "r1"}', dequeue_count=3), out)
    handle.assert_called_once_with(b'{"requestId": "r1"}', team="vision", message_id="m1", dequeue_count=3)
    out.set.assert_called_once_with("pool-request:r1")


def test_a_rejected_pool_request_does_not_nudge() -> None:
    out = mock.Mock()
    result = entrypoints.PoolRequestResult(status="rejected", request_id="r1")
    with mock.patch.object(entrypoints, "handle_pool_request", return_value=result):
        FUNCTIONS["pool_requests_vision"].get_user_function()(QueueMessage(id="m1", body=b"{}", dequeue_count=1), out)
    out.set.assert_not_called()


def test_an_unhealthy_node_cloudevent_is_handed_over_whole_and_an_admission_nudges() -> None:
    out = mock.Mock()
    event = func.CloudEvent(id="e1", source="/gpu-fleet-steward", type="Steward.GpuNode.Unhealthy", specversion="1.0",
                            subject="/subscriptions/s/x", time=dt.datetime(2026, 12, 2, tzinfo=dt.UTC),
                            data={"node": "aks-gpu-1"})
    with mock.patch.object(entrypoints, "handle_gpu_event",
                           return_value=entrypoints.GpuEventResult("admitted: x", nudge="remediation:e1")) as handle:
        FUNCTIONS["remediation_events"].get_user_function()(event, out)
    sent = handle.call_args.args[0]
    assert sent["id"] == "e1" and sent["source"] == "/gpu-fleet-steward" and sent["data"] == {"node": "aks-gpu-1"}
    assert sent["type"] == "Steward.GpuNode.Unhealthy" and sent["time"].startswith("2026-12-02")
    out.set.assert_called_once_with("remediation:e1")


@pytest.mark.parametrize(
    ("function", "entry"),
    [("reconcile_timer", "run_reconcile"), ("health_sweep", "run_health_sweep"),
     ("migration_planner", "run_migration_planner")],
)
def test_each_timer_calls_its_one_entry_point(function: str, entry: str) -> None:
    with mock.patch.object(entrypoints, entry) as called:
        FUNCTIONS[function].get_user_function()(TimerRequest(past_due=False))
    called.assert_called_once()

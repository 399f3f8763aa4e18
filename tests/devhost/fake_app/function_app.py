"""A tiny app with the binding kinds of the real one, for testing the local host.

Each function records what it was given in ``CALLS``; the message or event says whether to fail,
sleep or set an output, so the tests drive the host's retry, poison and output paths.
"""

import json
import threading
import time

import azure.functions as func

from shared.kernel import clock

app = func.FunctionApp()

CALLS: list[dict] = []
_lock = threading.Lock()


def _record(function: str, **fields: object) -> None:
    with _lock:
        CALLS.append({"function": function, "at": clock.current().now(), **fields})


@app.function_name("work")
@app.queue_trigger(arg_name="msg", queue_name="%WORK_QUEUE%", connection="AzureWebJobsStorage")
@app.queue_output(arg_name="nudge", queue_name="%NUDGE_QUEUE%", connection="AzureWebJobsStorage")
@app.queue_output(arg_name="audit", queue_name="%AUDIT_QUEUE%", connection="AzureWebJobsStorage")
def work(msg: func.QueueMessage, nudge: func.Out[str], audit: func.Out[str]) -> None:
    raw = msg.get_body()
    try:
        body = json.loads(raw)
    except ValueError:
        body = {"raw": raw.decode("utf-8", "replace")}
    _record("work", id=msg.id, dequeue_count=msg.dequeue_count, body=body, pop_receipt=msg.pop_receipt,
            insertion_time=msg.insertion_time, message_type=type(msg).__name__)
    if body.get("sleep"):
        time.sleep(float(body["sleep"]))
    if body.get("sleep_on_first_delivery") and msg.dequeue_count == 1:
        time.sleep(float(body["sleep_on_first_delivery"]))
    if body.get("fail"):
        raise RuntimeError(f"asked to fail ({body.get('tag')})")
    if body.get("nudge"):
        nudge.set(body["nudge"])
    if body.get("audit"):
        audit.set(body["audit"])


@app.function_name("nudged")
@app.queue_trigger(arg_name="msg", queue_name="%NUDGE_QUEUE%", connection="AzureWebJobsStorage")
def nudged(msg: func.QueueMessage) -> None:
    _record("nudged", body=msg.get_body().decode("utf-8"), dequeue_count=msg.dequeue_count)


@app.function_name("tick")
@app.timer_trigger(arg_name="timer", schedule="%TICK_SCHEDULE%")
def tick(timer: func.TimerRequest) -> None:
    _record("tick", past_due=timer.past_due, schedule_status=timer.schedule_status)


@app.function_name("startup")
@app.timer_trigger(arg_name="timer", schedule="0 0 0 1 1 *", run_on_startup=True, use_monitor=False)
def startup(timer: func.TimerRequest) -> None:
    _record("startup", past_due=timer.past_due)


@app.function_name("events")
@app.event_grid_trigger(arg_name="event")
def events(event: func.CloudEvent) -> None:
    data = event.get_json() or {}
    _record("events", id=event.id, type=event.type, source=event.source, subject=event.subject, time=event.time,
            data=data, event_class=type(event).__name__)
    if data.get("fail"):
        raise RuntimeError(f"event {event.id} asked to fail")
